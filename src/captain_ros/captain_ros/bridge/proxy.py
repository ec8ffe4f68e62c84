"""The recording proxy: an HTTP service between the agent and any OpenAI-compatible server (vLLM) that stores
every chat completion as one `model_call` record in the episode store.

Why a proxy rather than recording in the agent: the record must hold exactly what the model was given and what
it sampled (the rendered prompt's token ids, the sampled ids, one logprob per sampled token), and only the hop
that talks to the server sees all of it. The agent stays an ordinary OpenAI client; the proxy is the one place
that decides what a training sample is.

Routes
  POST /v1/chat/completions  recorded (streaming and non-streaming); everything else under /v1 and /health is
                             passed through unrecorded
  GET  /captain/status       counters, the policy version and the upstream
  POST /captain/policy_version {"version": N}  the trainer bumps it after a weight update (never down); every
                             later record carries it

Attribution: the agent sends `X-Captain-Episode: <episode_id>` and `X-Captain-Request: <t>` (t from 1). A request
without them is served and recorded as request 1 of its own episode `unattributed-<uuid>` (so a plain OpenAI
client works through the proxy; the trainer never reads those, as they have no episode_start), or refused with
HTTP 400 when the proxy runs with `--require-episode` (what rollouts should use: a forgotten header is a bug).

What the record holds (payload fields, captain_ros.bridge.schema): messages (image_url parts with base64 data URLs
become `image_ref` parts whose images are stored once as blobs by SHA-256; a part is replaced only if restoring
it reproduces it exactly, else it stays inline), tools, sampling (every request key except messages and tools, as
the client sent them), prompt_token_ids, token_ids, logprobs, response {content, tool_calls, finish_reason, usage,
model}, policy_version, timing {received_unix_s, upstream_s, total_s, proxy_s}, status "ok", and the reply as the
client got it (`reply` or `reply_chunks`, with the long id lists elided) so a retry can be answered from it.
The store keeps every payload's key order (chat templates write tool schemas with `tojson` in their key order),
so rendering the restored messages with the stored tools gives prompt_token_ids back.

What training needs is asked for, and hidden again: if the client did not ask for `return_token_ids`, `logprobs`
(or, streaming, `stream_options.include_usage`), the proxy adds them to the upstream request and removes them
from the reply (sets those fields back to null, drops the usage chunk), so the client sees what it would have
seen without the proxy; when it asked for all of them the upstream's bytes pass through untouched. A reply
without prompt token ids, sampled token ids or logprobs, or whose counts disagree with its usage, cannot be
trained on: the client gets HTTP 502 naming the missing field (`--allow-missing-token-ids` records such replies
with nulls instead, for servers that are not language models, such as the scripted expert).

Never a silent loss: a non-streamed reply goes to the client only after its record committed; a streamed
reply's chunks pass through as they arrive but its final `data: [DONE]` is held until the record committed. If
the store fails the client gets HTTP 503 (an SSE error event instead of [DONE] when streaming); if the upstream is
down, times out, answers 5xx or garbage, the client gets HTTP 502 and nothing is recorded (the status counts it).
Upstream 4xx answers (a bad request) pass through unchanged and unrecorded.

Exactly once per request: a request (episode, t) whose record exists is a retry; if its messages, tools and
sampling are those recorded it is answered from the record (header `X-Captain-Replayed: 1`), without sampling
again; different content for a recorded (episode, t) is refused with HTTP 409. Concurrent attempts of one
(episode, t) are serialized, so a retry racing its first attempt gets the first attempt's reply.

  python -m captain_ros.bridge.proxy --upstream http://127.0.0.1:8000/v1 --store episodes.sqlite --port 0
  # prints "READY http://127.0.0.1:<port>/v1", then one log line per request
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import copy
import json
import logging
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import httpx

from captain_ros.bridge.schema import Record, SchemaError, canonical, sha256
from captain_ros.bridge.store import IMAGE_REF, EpisodeStore, RecordConflict, StoreError

log = logging.getLogger("captain_ros.bridge.proxy")

EPISODE_HEADER = "X-Captain-Episode"
REQUEST_HEADER = "X-Captain-Request"
REPLAYED_HEADER = "X-Captain-Replayed"
RECORD_HEADER = "X-Captain-Record"
CHAT_PATH = "/v1/chat/completions"
DONE_EVENT = b"data: [DONE]"
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+\Z")
# hop-by-hop and framing headers the proxy sets itself
_SKIP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


@dataclass(frozen=True)
class ProxyConfig:
    """Where the proxy listens, where it forwards to and where it records."""

    upstream_url: str = "http://127.0.0.1:8000/v1"  # the upstream's OpenAI API root (ending in /v1)
    store_path: str = "episodes.sqlite"  # the EpisodeStore file records go to
    host: str = "127.0.0.1"  # address to listen on
    port: int = 0  # 0 = any free port
    policy_version: int = 0  # recorded in every record until POST /captain/policy_version changes it
    require_episode: bool = False  # refuse (400) requests without the X-Captain-* headers
    require_token_ids: bool = True  # a reply without prompt/sampled token ids or logprobs is an upstream error
    upstream_timeout_s: float = 600.0  # a whole non-streamed reply, or the gap between two streamed chunks
    connect_timeout_s: float = 10.0  # connecting to the upstream
    max_body_bytes: int = 256 * 1024 * 1024  # largest request body accepted (a long episode with images)


class ProxyError(Exception):
    """A request the proxy answers with an OpenAI-style JSON error: HTTP `status`, this message and `kind`."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.kind = kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


def _upstream_error(message: str) -> ProxyError:
    return ProxyError(HTTPStatus.BAD_GATEWAY, message, "upstream_error")


def _json_bytes(obj: Any) -> bytes:
    """JSON as vLLM (Starlette's JSONResponse) writes it: compact, UTF-8, no NaN."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


# ------------------------------------------------------------------------------------------------ requests
def attribution(headers: Any, require: bool) -> tuple[str, int, bool]:
    """(episode_id, t, attributed) from the X-Captain-* headers; ProxyError(400) when malformed or required."""
    episode, request = headers.get(EPISODE_HEADER), headers.get(REQUEST_HEADER)
    if episode is None and request is None:
        if require:
            raise ProxyError(
                HTTPStatus.BAD_REQUEST,
                f"this recording proxy runs with --require-episode: send headers {EPISODE_HEADER}: <episode_id> "
                f"and {REQUEST_HEADER}: <request number from 1> with every chat completion",
                "invalid_request_error",
            )
        return f"unattributed-{uuid.uuid4().hex}", 1, False
    if episode is None or request is None:
        missing = EPISODE_HEADER if episode is None else REQUEST_HEADER
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"header {missing} is missing: send both X-Captain headers or neither",
            "invalid_request_error",
        )
    episode = episode.strip()
    if not episode or "/" in episode:
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"{EPISODE_HEADER} must be a non-empty id without '/', got {episode!r}",
            "invalid_request_error",
        )
    try:
        t = int(request.strip())
    except ValueError:
        t = 0
    if t < 1:
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"{REQUEST_HEADER} must be the request number, an integer from 1; got {request!r}",
            "invalid_request_error",
        )
    return episode, t, True


def parse_request(data: bytes) -> dict:
    """The chat-completion request body; ProxyError(400) when it cannot be recorded."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProxyError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}", "invalid_request_error") from None
    if not isinstance(body, dict):
        raise ProxyError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object", "invalid_request_error")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ProxyError(HTTPStatus.BAD_REQUEST, "'messages' must be a non-empty list", "invalid_request_error")
    if not isinstance(body.get("tools", []), list | type(None)):
        raise ProxyError(HTTPStatus.BAD_REQUEST, "'tools' must be a list", "invalid_request_error")
    if body.get("n", 1) not in (1, None):
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            "the recording proxy records one sample per request: send n = 1 (or leave it out)",
            "invalid_request_error",
        )
    return body


def split_images(
    messages: list, stored_media_type: Callable[[str], str | None] = lambda _digest: None
) -> tuple[list, dict[str, tuple[bytes, str]]]:
    """The messages with every base64 `image_url` part replaced by an `image_ref` part, and the images
    {sha256: (bytes, media_type)}. A part is replaced only if EpisodeReader.restore_messages gives it back
    exactly (same data URL, same other image_url keys, no other part keys); otherwise it stays inline. The
    reader restores an image with its blob's media type, so bytes already stored (`stored_media_type`) or seen
    in this request under another media type stay inline too."""
    blobs: dict[str, tuple[bytes, str]] = {}
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            ref = _image_ref(part, blobs, stored_media_type)
            parts.append(part if ref is None else ref)
        out.append({**message, "content": parts})
    return out, blobs


def _image_ref(
    part: Any, blobs: dict[str, tuple[bytes, str]], stored_media_type: Callable[[str], str | None]
) -> dict | None:
    if not isinstance(part, dict) or part.get("type") != "image_url" or set(part) != {"type", "image_url"}:
        return None
    image = part["image_url"]
    url = image.get("url") if isinstance(image, dict) else None
    head, sep, text = url.partition(";base64,") if isinstance(url, str) and url.startswith("data:") else ("", "", "")
    media_type = head.removeprefix("data:")
    if not sep or not _MEDIA_TYPE.match(media_type):
        return None
    try:
        data = base64.b64decode(text)  # lenient; the re-encoding below must give `text` back exactly
    except (binascii.Error, ValueError):
        return None
    extra = {k: v for k, v in image.items() if k != "url"}
    restored = {
        "type": "image_url",
        "image_url": {"url": f"data:{media_type};base64,{base64.b64encode(data).decode()}", **extra},
    }
    if restored != part:  # not the canonical encoding: keep it inline rather than store something else
        return None
    digest = sha256(data)
    known = blobs[digest][1] if digest in blobs else stored_media_type(digest)
    if known is not None and known != media_type:
        return None
    blobs[digest] = (data, media_type)
    ref: dict[str, Any] = {"type": IMAGE_REF, "sha256": digest, "media_type": media_type}
    if extra:
        ref["extra"] = extra
    return ref


def upstream_request(body: dict, raw: bytes) -> tuple[bytes, list[str]]:
    """The body sent upstream and the names of what the proxy added to it for training; `raw` (the client's
    bytes, unchanged) when the client already asked for everything."""
    out = dict(body)
    added = []
    if out.get("return_token_ids") is not True:
        out["return_token_ids"] = True
        added.append("return_token_ids")
    if out.get("logprobs") is not True:
        out["logprobs"] = True
        out["top_logprobs"] = 0
        added.append("logprobs")
    if out.get("stream"):
        options = out.get("stream_options") if isinstance(out.get("stream_options"), dict) else {}
        if options.get("include_usage") is not True:
            out["stream_options"] = {**options, "include_usage": True}
            added.append("include_usage")
    return (_json_bytes(out) if added else raw), added


# ------------------------------------------------------------------------------------------------ replies
def strip_added(obj: dict, added: list[str]) -> dict | None:
    """A reply (or stream chunk) as the client would have got it without the fields the proxy added; None for a
    stream chunk the client would not have got at all (the usage chunk it did not ask for)."""
    if not added:
        return obj
    if "include_usage" in added and obj.get("choices") == [] and obj.get("usage") is not None:
        return None
    obj = copy.deepcopy(obj)
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if "return_token_ids" in added and "token_ids" in choice:
            choice["token_ids"] = None
        if "logprobs" in added and "logprobs" in choice:
            choice["logprobs"] = None
    if "return_token_ids" in added and "prompt_token_ids" in obj:
        obj["prompt_token_ids"] = None
    return obj


def _int_list(value: Any, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _upstream_error(f"the upstream's {what} is not a list of integers")
    return value


def _logprob_list(value: Any, what: str) -> list[float]:
    try:
        return [float(entry["logprob"]) for entry in (value["content"] or [])]
    except (KeyError, TypeError, ValueError):
        raise _upstream_error(f"the upstream's {what} is not a logprobs object with content[].logprob") from None


def _tool_call(call: Any) -> dict:
    try:
        fn = call["function"]
        arguments = fn.get("arguments") or ""
        return {
            "id": str(call.get("id") or ""),
            "type": str(call.get("type") or "function"),
            "function": {
                "name": str(fn["name"]),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            },
        }
    except (KeyError, TypeError, AttributeError):
        raise _upstream_error(f"the upstream returned a malformed tool call {str(call)[:200]}") from None


def _usage(usage: Any) -> dict:
    if usage is None:
        return {}
    if not isinstance(usage, dict):
        raise _upstream_error("the upstream's usage is not an object")
    return {k: v for k, v in usage.items() if v is not None}


def extract(data: Any) -> dict:
    """The recorded fields of a non-streamed chat completion (missing ids/logprobs are None)."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not isinstance(content, str) or not isinstance(calls, list):
            raise TypeError("content or tool_calls")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise _upstream_error(
            f"the upstream's reply is not a chat completion (no {exc}); it starts with {str(data)[:300]!r}"
        ) from None
    response = {
        "content": content,
        "tool_calls": [_tool_call(c) for c in calls],
        "finish_reason": choice.get("finish_reason"),
        "usage": _usage(data.get("usage")),
        "model": data.get("model"),
    }
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        response["reasoning"] = reasoning
    logprobs = choice.get("logprobs")
    return {
        "prompt_token_ids": _int_list(data.get("prompt_token_ids"), "prompt_token_ids"),
        "token_ids": _int_list(choice.get("token_ids"), "choices[0].token_ids"),
        "logprobs": None if logprobs is None else _logprob_list(logprobs, "choices[0].logprobs"),
        "response": response,
    }


class StreamAccumulator:
    """The recorded fields of a streamed chat completion, built chunk by chunk as vLLM 0.32 sends them: the first
    chunk carries `prompt_token_ids`, each later one `choices[0].token_ids` and `logprobs.content` for the tokens
    it adds, text and tool-call deltas; the usage chunk (empty choices) comes last."""

    def __init__(self) -> None:
        self.prompt_token_ids: list[int] | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.model: str | None = None
        self.chunks = 0

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise _upstream_error(f"a stream chunk is not a JSON object: {str(chunk)[:200]}")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise _upstream_error(f"the upstream sent an error in the stream: {str(message)[:1000]}")
        self.chunks += 1
        self.model = chunk.get("model", self.model)
        prompt = _int_list(chunk.get("prompt_token_ids"), "prompt_token_ids")
        if prompt is not None:
            self.prompt_token_ids = prompt
        if chunk.get("usage") is not None:
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise _upstream_error("a stream chunk's choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                raise _upstream_error("a stream chunk has a choice other than index 0 (send n = 1)")
            self._add_choice(choice)

    def _add_choice(self, choice: dict) -> None:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise _upstream_error("a stream chunk's delta is not an object")
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            self.reasoning.append(reasoning)
        for call in delta.get("tool_calls") or []:
            self._add_call(call)
        ids = _int_list(choice.get("token_ids"), "choices[0].token_ids")
        if ids is not None:
            self.token_ids = (self.token_ids or []) + ids
        if choice.get("logprobs") is not None:
            self.logprobs = (self.logprobs or []) + _logprob_list(choice["logprobs"], "choices[0].logprobs")
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def _add_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            raise _upstream_error(f"a streamed tool call is not an object: {str(call)[:200]}")
        index = call.get("index", 0)
        slot = self.tool_calls.setdefault(index, {"id": "", "type": "function", "name": "", "arguments": []})
        if call.get("id"):
            slot["id"] = str(call["id"])
        if call.get("type"):
            slot["type"] = str(call["type"])
        fn = call.get("function") or {}
        if fn.get("name"):
            slot["name"] += str(fn["name"])
        if fn.get("arguments"):
            slot["arguments"].append(str(fn["arguments"]))

    def result(self) -> dict:
        calls = [
            {"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
            for _, c in sorted(self.tool_calls.items())
        ]
        response = {
            "content": "".join(self.content),
            "tool_calls": calls,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "model": self.model,
        }
        if self.reasoning:
            response["reasoning"] = "".join(self.reasoning)
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "response": response,
        }


def check_trainable(fields: dict, require_token_ids: bool) -> None:
    """ProxyError(502) naming what a reply lacks for training, or where its counts disagree."""
    if fields["response"]["finish_reason"] is None:
        raise _upstream_error("the upstream's reply has no finish_reason: it was cut short")
    names = {
        "prompt_token_ids": "prompt_token_ids",
        "token_ids": "choices[0].token_ids",
        "logprobs": "choices[0].logprobs",
    }
    missing = [wire for name, wire in names.items() if fields[name] is None]
    if missing and require_token_ids:
        raise _upstream_error(
            f"the upstream's reply has no {', '.join(missing)}: it cannot be recorded for training. Is the upstream "
            "a vLLM server recent enough to honour return_token_ids? Start the proxy with --allow-missing-token-ids "
            "for servers that are not language models"
        )
    ids, lps, usage = fields["token_ids"], fields["logprobs"], fields["response"]["usage"]
    if ids is not None and lps is not None and len(ids) != len(lps):
        raise _upstream_error(f"the upstream's reply has {len(ids)} sampled token ids but {len(lps)} logprobs")
    for counted, key in ((fields["prompt_token_ids"], "prompt_tokens"), (ids, "completion_tokens")):
        if counted is not None and isinstance(usage.get(key), int) and usage[key] != len(counted):
            raise _upstream_error(f"the upstream's reply has {len(counted)} token ids but usage.{key} = {usage[key]}")


def elide(reply: Any, paths: list[list], values: dict[str, Any]) -> tuple[Any, list[list]]:
    """`reply` with the id lists that the record holds anyway replaced by null, and the paths replaced."""
    out, elided = copy.deepcopy(reply), []
    for path in paths:
        *head, last = path
        node = out
        try:
            for key in head:
                node = node[key]
            value = node[last]
        except (KeyError, IndexError, TypeError):
            continue
        if value is not None and value == values[path[-1]]:
            node[last] = None
            elided.append(path)
    return out, elided


def unelide(reply: Any, elided: list[list], values: dict[str, Any]) -> Any:
    out = copy.deepcopy(reply)
    for path in elided:
        *head, last = path
        node = out
        for key in head:
            node = node[key]
        node[last] = values[last]
    return out


# ------------------------------------------------------------------------------------------------ the proxy
@dataclass
class _Reply:
    """What the handler writes for a non-streamed request."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, answer: httpx.Response, headers: dict[str, str] | None = None) -> _Reply:
        """The upstream's answer as it was (status, body, content type)."""
        return cls(
            answer.status_code, answer.content, answer.headers.get("content-type", "application/json"), headers or {}
        )


class _SseSplitter:
    """Whole SSE events (each with its blank-line terminator, bytes unchanged) out of arbitrary byte chunks."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        events = []
        while True:
            ends = [(i, n) for sep, n in ((b"\n\n", 2), (b"\r\n\r\n", 4)) if (i := self._buffer.find(sep)) >= 0]
            if not ends:
                return events
            i, n = min(ends)
            events.append(self._buffer[: i + n])
            self._buffer = self._buffer[i + n :]

    def rest(self) -> bytes:
        return self._buffer


def _event_data(event: bytes) -> bytes:
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines)


def sse_error(error: ProxyError) -> bytes:
    return b"data: " + _json_bytes(error.body()) + b"\n\n"


class StreamOut(Protocol):
    """Where a streamed reply goes (the HTTP handler's connection)."""

    started: bool

    def start(self, status: int, content_type: str, headers: dict[str, str]) -> None: ...

    def write(self, data: bytes) -> None: ...


class RecordingProxy:
    """The proxy's core: forwards, checks and records; the HTTP handler around it only moves bytes."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.upstream = config.upstream_url.rstrip("/")
        self.upstream_root = self.upstream.removesuffix("/v1")
        self.store = EpisodeStore(config.store_path)
        self._store_lock = threading.Lock()  # one SQLite connection: one transaction at a time
        self._http = httpx.Client(
            timeout=httpx.Timeout(config.upstream_timeout_s, connect=config.connect_timeout_s), trust_env=False
        )
        self._policy_version = int(config.policy_version)
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int], list] = {}  # (episode, t) -> [lock, users]
        self._known_blobs: dict[str, str] = {}  # sha256 -> media type of blobs in the store
        self._commit_s = 0.0  # summed over records: the time the record itself is not timed by
        self._proxy_s = 0.0
        self.started_unix_s = time.time()
        self.counters = dict.fromkeys(
            (
                "requests",  # chat completions received
                "recorded",
                "replayed",  # retries answered from the record
                "refused",  # 400 / 409 from the proxy itself
                "upstream_rejected",  # upstream 4xx passed through
                "upstream_errors",  # 502: down, timeout, 5xx, garbage, missing token ids
                "store_errors",  # 503
                "passthrough",  # other routes
                "stream_client_gone",  # a streaming client hung up before the end (still recorded)
                "internal_errors",  # 500: a bug in the proxy
            ),
            0,
        )

    def close(self) -> None:
        self._http.close()
        with self._store_lock:
            self.store.close()

    # -------------------------------------------------------------------------------- state
    @property
    def policy_version(self) -> int:
        return self._policy_version

    def set_policy_version(self, version: Any) -> int:
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ProxyError(
                HTTPStatus.BAD_REQUEST, f"'version' must be an integer >= 0, got {version!r}", "invalid_request_error"
            )
        with self._lock:
            if version < self._policy_version:
                raise ProxyError(
                    HTTPStatus.CONFLICT,
                    f"policy version {version} is older than the current {self._policy_version}: versions only grow",
                    "conflict_error",
                )
            self._policy_version = version
        log.info("policy version is now %d", version)
        return version

    def count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

    def status(self) -> dict:
        with self._lock:
            counters = dict(self.counters)
            recorded = max(1, counters["recorded"])
            overhead = {"mean_proxy_s": self._proxy_s / recorded, "mean_commit_s": self._commit_s / recorded}
        return {
            "upstream": self.upstream,
            "store": str(self.config.store_path),
            "policy_version": self._policy_version,
            "require_episode": self.config.require_episode,
            "require_token_ids": self.config.require_token_ids,
            "uptime_s": round(time.time() - self.started_unix_s, 3),
            "counters": counters,
            **overhead,  # proxy_s of a record excludes its own commit; mean_commit_s is that (fsync) time
        }

    # -------------------------------------------------------------------------------- locking
    @contextlib.contextmanager
    def _request_lock(self, key: tuple[str, int]) -> Iterator[None]:
        """Serialize attempts of one (episode, t): a retry racing its first attempt waits for its record."""
        with self._lock:
            slot = self._inflight.setdefault(key, [threading.Lock(), 0])
            slot[1] += 1
        try:
            with slot[0]:
                yield
        finally:
            with self._lock:
                slot[1] -= 1
                if slot[1] == 0:
                    del self._inflight[key]

    # -------------------------------------------------------------------------------- recording
    def _existing(self, episode: str, t: int) -> Record | None:
        with self._store_lock:
            try:
                return self.store.record(episode, "model_call", t)
            except StoreError as exc:
                raise ProxyError(
                    HTTPStatus.SERVICE_UNAVAILABLE, f"the recording proxy cannot read its store: {exc}", "store_error"
                ) from exc

    def _commit(self, record: Record, blobs: dict[str, tuple[bytes, str]]) -> None:
        """Store the images, then the record; ProxyError(503/409/502) if that fails."""
        t0 = time.monotonic()
        try:
            with self._store_lock:
                for digest, (data, media_type) in blobs.items():
                    if digest not in self._known_blobs:
                        if not self.store.has_blob(digest):
                            self.store.put_blob(data, media_type, digest)
                        self._known_blobs[digest] = media_type
                self.store.append(record)
            with self._lock:
                self._commit_s += time.monotonic() - t0
                self._proxy_s += record.payload["timing"]["proxy_s"]
        except RecordConflict as exc:
            raise ProxyError(
                HTTPStatus.CONFLICT,
                f"request {record.index} of episode {record.episode_id} is already recorded with "
                f"different content (another proxy on this store?): {exc}",
                "conflict_error",
            ) from exc
        except SchemaError as exc:
            raise _upstream_error(f"the upstream's reply cannot be recorded: {exc}") from exc
        except StoreError as exc:
            raise ProxyError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"the recording proxy could not store the record of request {record.index} of episode "
                f"{record.episode_id}, so the reply was not passed on: {exc}. Free disk space or fix the store "
                f"({self.config.store_path}), then retry the request",
                "store_error",
            ) from exc

    def _stored_media_type(self, digest: str) -> str | None:
        """The media type an image's blob is stored with (None if it is not stored yet)."""
        with self._store_lock:
            if digest not in self._known_blobs:
                try:
                    if not self.store.has_blob(digest):
                        return None
                    self._known_blobs[digest] = self.store.blob(digest)[1]
                except StoreError as exc:
                    raise ProxyError(
                        HTTPStatus.SERVICE_UNAVAILABLE,
                        f"the recording proxy cannot read its store: {exc}",
                        "store_error",
                    ) from exc
            return self._known_blobs[digest]

    @staticmethod
    def _replay_check(existing: Record, req: dict) -> None:
        p = existing.payload
        different = [
            name
            for name, mine, theirs in (
                ("messages", req["messages"], p["messages"]),
                ("tools", req["tools"], p["tools"]),
                ("sampling", req["sampling"], p["sampling"]),
            )
            if canonical({"v": mine}) != canonical({"v": theirs})
        ]
        if different:
            raise ProxyError(
                HTTPStatus.CONFLICT,
                f"request {existing.index} of episode {existing.episode_id} is already recorded with different "
                f"{' and '.join(different)}: a retry must resend the same request; a new request needs the next "
                f"{REQUEST_HEADER} number",
                "conflict_error",
            )

    def _prepare(self, body: dict, headers: Any) -> dict:
        episode, t, attributed = attribution(headers, self.config.require_episode)
        messages, blobs = split_images(body["messages"], self._stored_media_type)
        return {
            "episode": episode,
            "t": t,
            "attributed": attributed,
            "messages": messages,
            "blobs": blobs,
            "tools": body.get("tools") or [],
            "sampling": {k: v for k, v in body.items() if k not in ("messages", "tools")},
        }

    def _record(self, req: dict, fields: dict, timing: dict, version: int, reply: dict) -> Record:
        payload = {
            "messages": req["messages"],
            "tools": req["tools"],
            "sampling": req["sampling"],
            **fields,
            "policy_version": version,
            "timing": timing,
            "status": "ok",
            "upstream": self.upstream,
            "upstream_added": req["added"],
            "attributed": req["attributed"],
            **reply,
        }
        if self._policy_version != version:
            payload["policy_version_at_reply"] = self._policy_version
        return Record(req["episode"], "model_call", req["t"], payload)

    @staticmethod
    def _timing(received_unix_s: float, t0: float, upstream_s: float) -> dict:
        total = time.monotonic() - t0
        return {
            "received_unix_s": received_unix_s,
            "upstream_s": upstream_s,
            "total_s": total,
            "proxy_s": max(0.0, total - upstream_s),
        }

    # -------------------------------------------------------------------------------- non-streamed
    def complete(self, body: dict, raw: bytes, headers: Any, received_unix_s: float, t0: float) -> _Reply:
        """Answer a non-streamed chat completion (`body`, parsed from `raw`): from the record (a retry) or from the
        upstream, recorded."""
        req = self._prepare(body, headers)
        key = (req["episode"], req["t"])
        with self._request_lock(key):
            existing = self._existing(*key)
            if existing is not None:
                self._replay_check(existing, req)
                p = existing.payload
                reply = unelide(p["reply"], p.get("reply_elided", []), _elided_values(p))
                self.count("replayed")
                log.info("%s/%d replayed from the record", *key)
                return _Reply(
                    HTTPStatus.OK, _json_bytes(reply), headers={REPLAYED_HEADER: "1", RECORD_HEADER: existing.id}
                )
            version = self._policy_version
            sent, req["added"] = upstream_request(body, raw)
            t_up = time.monotonic()
            try:
                answer = self._http.post(f"{self.upstream}/chat/completions", content=sent, headers=_forward(headers))
            except httpx.HTTPError as exc:
                raise _upstream_error(_describe(exc, self.upstream)) from exc
            upstream_s = time.monotonic() - t_up
            if 400 <= answer.status_code < 500:
                self.count("upstream_rejected")
                return _Reply.of(answer)
            if answer.status_code != 200:
                raise _upstream_error(
                    f"the upstream {self.upstream} answered HTTP {answer.status_code}: {answer.text[:500]!r}"
                )
            try:
                data = answer.json()
            except ValueError:
                raise _upstream_error(
                    f"the upstream {self.upstream} answered with a body that is not JSON (starts with "
                    f"{answer.text[:200]!r}); is --upstream an OpenAI-compatible server's /v1?"
                ) from None
            fields = extract(data)
            check_trainable(fields, self.config.require_token_ids)
            client_view = strip_added(data, req["added"])
            out = answer.content if client_view is data else _json_bytes(client_view)
            stored, elided = elide(client_view, [["prompt_token_ids"], ["choices", 0, "token_ids"]], fields)
            record = self._record(
                req,
                fields,
                self._timing(received_unix_s, t0, upstream_s),
                version,
                {"reply": stored, "reply_elided": elided},
            )
            self._commit(record, req["blobs"])
            self.count("recorded")
            _log_record(record)
            reply = _Reply.of(answer, {RECORD_HEADER: record.id})
            reply.body = out
            return reply

    # -------------------------------------------------------------------------------- streamed
    def stream(
        self, body: dict, raw: bytes, headers: Any, received_unix_s: float, t0: float, *, out: StreamOut
    ) -> _Reply | None:
        """Answer a streamed chat completion. Returns a _Reply when nothing was streamed yet (an error before
        the upstream's first byte, an upstream 4xx), else None after `out.start(...)` and `out.write(bytes)` for
        every event, the last being [DONE] (only after the record committed) or an error event."""
        req = self._prepare(body, headers)
        key = (req["episode"], req["t"])
        with self._request_lock(key):
            existing = self._existing(*key)
            if existing is not None:
                self._replay_stream(existing, req, out)
                return None
            version = self._policy_version
            sent, req["added"] = upstream_request(body, raw)
            t_up = time.monotonic()
            try:
                relayed = self._relay(sent, headers, req, out)
                if isinstance(relayed, _Reply):
                    return relayed
                fields, chunks, done = relayed
                upstream_s = time.monotonic() - t_up
                stored, elided = elide(chunks, [[0, "prompt_token_ids"]], fields)
                timing = self._timing(received_unix_s, t0, upstream_s)
                record = self._record(req, fields, timing, version, {"reply_chunks": stored, "reply_elided": elided})
                self._commit(record, req["blobs"])
            except ProxyError as error:
                if not out.started:
                    raise
                self._stream_failed(out.write, error)
                return None
            out.write(done)
            self.count("recorded")
            _log_record(record)
            return None

    def _replay_stream(self, existing: Record, req: dict, out: StreamOut) -> None:
        self._replay_check(existing, req)
        p = existing.payload
        chunks = unelide(p["reply_chunks"], p.get("reply_elided", []), _elided_values(p))
        out.start(HTTPStatus.OK, "text/event-stream", {REPLAYED_HEADER: "1", RECORD_HEADER: existing.id})
        for chunk in chunks:
            out.write(b"data: " + _json_bytes(chunk) + b"\n\n")
        out.write(DONE_EVENT + b"\n\n")
        self.count("replayed")
        log.info("%s/%d replayed from the record (stream)", existing.episode_id, existing.index)

    def _relay(self, sent: bytes, headers: Any, req: dict, out: StreamOut) -> _Reply | tuple[dict, list, bytes]:
        """Stream from the upstream, passing its events on as they come but holding back [DONE]: (recorded
        fields, the chunks as the client got them, the [DONE] event), or the upstream's 4xx answer as it was."""
        try:
            with self._http.stream(
                "POST", f"{self.upstream}/chat/completions", content=sent, headers=_forward(headers)
            ) as answer:
                if answer.status_code != 200:
                    content = answer.read()
                    if 400 <= answer.status_code < 500:
                        self.count("upstream_rejected")
                        return _Reply.of(answer)
                    raise _upstream_error(
                        f"the upstream {self.upstream} answered HTTP {answer.status_code}: {content[:500]!r}"
                    )
                out.start(HTTPStatus.OK, answer.headers.get("content-type", "text/event-stream"), {})
                return self._events(answer, req, out.write)
        except httpx.HTTPError as exc:
            raise _upstream_error(_describe(exc, self.upstream)) from exc

    def _events(self, answer: httpx.Response, req: dict, write: Callable[[bytes], None]) -> tuple[dict, list, bytes]:
        splitter, acc = _SseSplitter(), StreamAccumulator()
        chunks: list[dict] = []
        done: bytes | None = None
        for data in answer.iter_raw():
            for event in splitter.feed(data):
                payload = _event_data(event)
                if not payload:  # a comment or keep-alive
                    write(event)
                    continue
                if payload == b"[DONE]":
                    done = event
                    continue
                if done is not None:
                    raise _upstream_error("the upstream sent data after [DONE]")
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    raise _upstream_error(
                        f"the upstream sent a stream event that is not JSON: {payload[:200]!r}"
                    ) from None
                try:
                    acc.add(chunk)
                except ProxyError:
                    write(event)  # the upstream's own error event: the client sees it as it was sent
                    raise
                view = strip_added(chunk, req["added"])
                if view is None:
                    continue
                chunks.append(view)
                write(event if view is chunk else b"data: " + _json_bytes(view) + b"\n\n")
        if splitter.rest().strip():
            raise _upstream_error(f"the upstream's stream ended mid-event: {splitter.rest()[:200]!r}")
        if done is None:
            raise _upstream_error("the upstream's stream ended without data: [DONE]: it was cut short")
        fields = acc.result()
        check_trainable(fields, self.config.require_token_ids)
        return fields, chunks, done

    def _stream_failed(self, write: Callable[[bytes], None], error: ProxyError) -> None:
        self.count("store_errors" if error.kind == "store_error" else "upstream_errors")
        log.warning("stream failed: %s", error.message)
        write(sse_error(error))

    # -------------------------------------------------------------------------------- other routes
    def passthrough(self, method: str, path: str, headers: Any, body: bytes) -> _Reply:
        """Any other route, forwarded unrecorded; 502 when the upstream cannot be reached."""
        self.count("passthrough")
        url = f"{self.upstream_root}{path}"
        try:
            answer = self._http.request(
                method, url, content=body or None, headers=_forward(headers, headers.get("Content-Type"))
            )
        except httpx.HTTPError as exc:
            raise _upstream_error(_describe(exc, url)) from exc
        extra = {k: v for k, v in answer.headers.items() if k.lower() not in _SKIP_HEADERS | {"content-type"}}
        return _Reply.of(answer, extra)


def _elided_values(payload: dict) -> dict:
    return {"prompt_token_ids": payload["prompt_token_ids"], "token_ids": payload["token_ids"]}


def _forward(headers: Any, content_type: str | None = "application/json") -> dict[str, str]:
    """The client's headers worth passing upstream (credentials, tracing), not the proxy's own."""
    out = {"Content-Type": content_type} if content_type else {}
    for name in ("Authorization", "X-Request-Id", "traceparent"):
        if headers.get(name):
            out[name] = headers[name]
    return out


def _describe(exc: httpx.HTTPError, where: str) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"the upstream {where} timed out ({type(exc).__name__}); it is overloaded or stuck: read its log"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot reach the upstream {where} ({exc}); is it running? Check --upstream"
    return f"the upstream {where} failed mid-request ({type(exc).__name__}: {exc}); it may have crashed: read its log"


def _log_record(record: Record) -> None:
    p = record.payload
    timing = p["timing"]
    log.info(
        "%s recorded: %s prompt + %s sampled tokens, finish %s, upstream %.3f s, proxy %.4f s",
        record.id,
        len(p["prompt_token_ids"] or []),
        len(p["token_ids"] or []),
        p["response"]["finish_reason"],
        timing["upstream_s"],
        timing["proxy_s"],
    )


# ------------------------------------------------------------------------------------------------ HTTP shell
class ProxyHandler(BaseHTTPRequestHandler):
    """Moves bytes between the client and RecordingProxy (set as the class attribute `proxy` per server)."""

    server_version = "captain-recording-proxy/1.0"
    proxy: RecordingProxy

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _send(self, reply: _Reply) -> None:
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            log.warning("%s %s: the client hung up before the reply was written", self.command, self._path())

    def _error(self, error: ProxyError) -> None:
        self._send(_Reply(error.status, _json_bytes(error.body())))

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise ProxyError(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length", "invalid_request_error")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ProxyError(
                HTTPStatus.BAD_REQUEST, "Content-Length is not a number", "invalid_request_error"
            ) from None
        if length < 0 or length > self.proxy.config.max_body_bytes:
            raise ProxyError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the body must be at most {self.proxy.config.max_body_bytes} bytes (ProxyConfig.max_body_bytes)",
                "invalid_request_error",
            )
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        received, t0 = time.time(), time.monotonic()
        path = self._path()
        try:
            body = self._body()
            if path.rstrip("/") == CHAT_PATH and self.command == "POST":
                self._chat(body, received, t0)
            elif path.startswith("/captain/"):
                self._captain(path.rstrip("/"), body)
            else:
                self._send(self.proxy.passthrough(self.command, self.path, self.headers, body))
        except ProxyError as error:
            if error.kind == "upstream_error":
                self.proxy.count("upstream_errors")
            elif error.kind == "store_error":
                self.proxy.count("store_errors")
            elif path.rstrip("/") == CHAT_PATH:
                self.proxy.count("refused")
            log.warning("%s %s -> %d: %s", self.command, path, error.status, error.message)
            self._error(error)
        except Exception as exc:  # a bug here must not leave the client without an answer
            log.exception("%s %s failed", self.command, path)
            self.proxy.count("internal_errors")
            self._error(ProxyError(500, f"the recording proxy failed: {type(exc).__name__}: {exc}", "server_error"))

    def _chat(self, data: bytes, received: float, t0: float) -> None:
        self.proxy.count("requests")
        body = parse_request(data)
        if not body.get("stream"):
            self._send(self.proxy.complete(body, data, self.headers, received, t0))
            return
        writer = _StreamWriter(self)
        reply = self.proxy.stream(body, data, self.headers, received, t0, out=writer)
        if reply is not None:
            self._send(reply)
        elif writer.gone:
            self.proxy.count("stream_client_gone")

    def _captain(self, path: str, body: bytes) -> None:
        if path == "/captain/status" and self.command == "GET":
            self._send(_Reply(HTTPStatus.OK, _json_bytes(self.proxy.status())))
        elif path == "/captain/policy_version" and self.command == "POST":
            try:
                request = json.loads(body or b"null")
            except ValueError:
                request = None
            if not isinstance(request, dict) or "version" not in request:
                raise ProxyError(HTTPStatus.BAD_REQUEST, 'send {"version": <int>}', "invalid_request_error")
            version = self.proxy.set_policy_version(request["version"])
            self._send(_Reply(HTTPStatus.OK, _json_bytes({"policy_version": version})))
        else:
            raise ProxyError(
                HTTPStatus.NOT_FOUND,
                f"no such endpoint: {self.command} {path} (GET /captain/status, POST /captain/policy_version)",
                "not_found_error",
            )

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle  # noqa: N815 - BaseHTTPRequestHandler's names


class _StreamWriter:
    """Writes a streamed reply (HTTP/1.0: the body ends when the connection closes). A client that hangs up
    does not stop the relay: the upstream's reply is still read and recorded, so a retry can be answered."""

    def __init__(self, handler: ProxyHandler) -> None:
        self.handler = handler
        self.started = False
        self.gone = False

    def start(self, status: int, content_type: str, headers: dict) -> None:
        self.started = True
        try:
            self.handler.send_response(status)
            self.handler.send_header("Content-Type", content_type)
            self.handler.send_header("Cache-Control", "no-cache")
            for name, value in headers.items():
                self.handler.send_header(name, value)
            self.handler.end_headers()
            self.handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True

    def write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            self.handler.wfile.write(data)
            self.handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True


@dataclass
class ProxyHandle:
    """A proxy serving in a background thread of this process (tests, benchmarks)."""

    proxy: RecordingProxy
    server: ThreadingHTTPServer
    thread: threading.Thread

    @property
    def root(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)
        self.proxy.close()

    def __enter__(self) -> ProxyHandle:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def serve(config: ProxyConfig) -> tuple[RecordingProxy, ThreadingHTTPServer]:
    """A listening (not yet serving) proxy server; call serve_forever()."""
    proxy = RecordingProxy(config)
    handler = type("BoundProxyHandler", (ProxyHandler,), {"proxy": proxy})
    try:
        server = ThreadingHTTPServer((config.host, config.port), handler)
    except OSError:
        proxy.close()
        raise
    server.daemon_threads = True
    return proxy, server


def start_proxy(config: ProxyConfig) -> ProxyHandle:
    """Start a proxy in a daemon thread; `.base_url` is its /v1 root; `.close()` stops it."""
    proxy, server = serve(config)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="recording-proxy", daemon=True)
    thread.start()
    return ProxyHandle(proxy, server, thread)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Record every chat completion between the agent and an OpenAI-compatible server."
    )
    defaults = ProxyConfig()
    parser.add_argument("--upstream", required=True, help="the upstream's OpenAI API root, e.g. http://host:8000/v1")
    parser.add_argument("--store", required=True, type=Path, help="the episode store file (created if missing)")
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on (0: any free port)")
    parser.add_argument("--policy-version", type=int, default=0, help="policy version recorded until changed")
    parser.add_argument("--require-episode", action="store_true", help="refuse requests without X-Captain headers")
    parser.add_argument(
        "--allow-missing-token-ids",
        action="store_true",
        help="record replies without token ids/logprobs (servers that are not language models) instead of a 502",
    )
    parser.add_argument("--upstream-timeout-s", type=float, default=defaults.upstream_timeout_s)
    parser.add_argument("--connect-timeout-s", type=float, default=defaults.connect_timeout_s)
    parser.add_argument("--verbose", action="store_true", help="also log every HTTP request line")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.policy_version < 0:
        parser.error("--policy-version must be >= 0")
    config = ProxyConfig(
        upstream_url=args.upstream,
        store_path=str(args.store),
        host=args.host,
        port=args.port,
        policy_version=args.policy_version,
        require_episode=args.require_episode,
        require_token_ids=not args.allow_missing_token_ids,
        upstream_timeout_s=args.upstream_timeout_s,
        connect_timeout_s=args.connect_timeout_s,
    )
    try:
        proxy, server = serve(config)
    except (OSError, StoreError) as exc:
        print(f"cannot start the recording proxy: {exc}", file=sys.stderr)
        return 1
    host, port = server.server_address[:2]

    def _terminate(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops serving the same way as Ctrl-C: the store is closed cleanly

    signal.signal(signal.SIGTERM, _terminate)
    log.info("recording %s into %s (config %s)", config.upstream_url, config.store_path, asdict(config))
    print(f"READY http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        proxy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

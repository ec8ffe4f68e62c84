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

Attribution (captain_ros.bridge.attribution): the agent names the episode and the request number in
X-Captain-* headers; without them a request is recorded unattributed, or refused with `--require-episode`.

What the record holds (payload fields, captain_ros.bridge.schema): messages (image_url parts with base64 data URLs
become `image_ref` parts whose images are stored once as blobs by SHA-256; a part is replaced only if restoring
it reproduces it exactly, else it stays inline), tools, sampling (every request key except messages and tools, as
the client sent them), prompt_token_ids, token_ids, logprobs, response {content, tool_calls, finish_reason, usage,
model}, policy_version, timing {received_unix_s, upstream_s, total_s, proxy_s}, status "ok", and the reply as the
client got it (`reply` or `reply_chunks`, with the long id lists elided) so a retry can be answered from it.
The store keeps every payload's key order (chat templates write tool schemas with `tojson` in their key order),
so rendering the restored messages with the stored tools gives prompt_token_ids back.

What training needs is asked for, and hidden again (captain_ros.bridge.completions): the proxy adds
token ids and logprobs to the upstream request and removes them from the reply the client sees; a reply that
lacks them is an HTTP 502 unless `--allow-missing-token-ids`. Images are stored once (captain_ros.bridge.images);
a stream is relayed event by event and accumulated into the same record (captain_ros.bridge.sse).

Never a silent loss: a non-streamed reply goes to the client only after its record committed; a streamed
reply's chunks pass through as they arrive but its final `data: [DONE]` is held until the record committed. If
the store fails the client gets HTTP 503 (an SSE error event instead of [DONE] when streaming); if the upstream is
down, times out, answers 5xx or garbage, the client gets HTTP 502 and nothing is recorded (the status counts it).
Upstream 4xx answers (a bad request) pass through unchanged and unrecorded.

Exactly once per request: a request (episode, t) whose record exists is a retry; if its messages, tools and
sampling are those recorded it is answered from the record (header `X-Captain-Replayed: 1`), without sampling
again; different content for a recorded (episode, t) is refused with HTTP 409. Concurrent attempts of one
(episode, t) are serialized, so a retry racing its first attempt gets the first attempt's reply.

  captain-ros proxy --upstream http://127.0.0.1:8000/v1 --store episodes.sqlite --port 0
  # prints "READY http://127.0.0.1:<port>/v1", then one log line per request
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import httpx

from captain_ros.bridge.attribution import REQUEST_HEADER, attribution
from captain_ros.bridge.completions import (
    ProxyError,
    check_trainable,
    elide,
    extract,
    json_bytes,
    parse_request,
    strip_added,
    unelide,
    upstream_error,
    upstream_request,
)
from captain_ros.bridge.images import split_images
from captain_ros.bridge.schema import Record, SchemaError, canonical
from captain_ros.bridge.sse import DONE_EVENT, SseSplitter, StreamAccumulator, event_data, sse_error
from captain_ros.bridge.store import EpisodeStore, RecordConflict, StoreError

log = logging.getLogger("captain_ros.bridge.proxy")

REPLAYED_HEADER = "X-Captain-Replayed"
RECORD_HEADER = "X-Captain-Record"
CHAT_PATH = "/v1/chat/completions"
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
            raise upstream_error(f"the upstream's reply cannot be recorded: {exc}") from exc
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
                    HTTPStatus.OK, json_bytes(reply), headers={REPLAYED_HEADER: "1", RECORD_HEADER: existing.id}
                )
            version = self._policy_version
            sent, req["added"] = upstream_request(body, raw)
            t_up = time.monotonic()
            try:
                answer = self._http.post(f"{self.upstream}/chat/completions", content=sent, headers=_forward(headers))
            except httpx.HTTPError as exc:
                raise upstream_error(_describe(exc, self.upstream)) from exc
            upstream_s = time.monotonic() - t_up
            if 400 <= answer.status_code < 500:
                self.count("upstream_rejected")
                return _Reply.of(answer)
            if answer.status_code != 200:
                raise upstream_error(
                    f"the upstream {self.upstream} answered HTTP {answer.status_code}: {answer.text[:500]!r}"
                )
            try:
                data = answer.json()
            except ValueError:
                raise upstream_error(
                    f"the upstream {self.upstream} answered with a body that is not JSON (starts with "
                    f"{answer.text[:200]!r}); is --upstream an OpenAI-compatible server's /v1?"
                ) from None
            fields = extract(data)
            check_trainable(fields, self.config.require_token_ids)
            client_view = strip_added(data, req["added"])
            out = answer.content if client_view is data else json_bytes(client_view)
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
            out.write(b"data: " + json_bytes(chunk) + b"\n\n")
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
                    raise upstream_error(
                        f"the upstream {self.upstream} answered HTTP {answer.status_code}: {content[:500]!r}"
                    )
                out.start(HTTPStatus.OK, answer.headers.get("content-type", "text/event-stream"), {})
                return self._events(answer, req, out.write)
        except httpx.HTTPError as exc:
            raise upstream_error(_describe(exc, self.upstream)) from exc

    def _events(self, answer: httpx.Response, req: dict, write: Callable[[bytes], None]) -> tuple[dict, list, bytes]:
        splitter, acc = SseSplitter(), StreamAccumulator()
        chunks: list[dict] = []
        done: bytes | None = None
        for data in answer.iter_raw():
            for event in splitter.feed(data):
                payload = event_data(event)
                if not payload:  # a comment or keep-alive
                    write(event)
                    continue
                if payload == b"[DONE]":
                    done = event
                    continue
                if done is not None:
                    raise upstream_error("the upstream sent data after [DONE]")
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    raise upstream_error(
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
                write(event if view is chunk else b"data: " + json_bytes(view) + b"\n\n")
        if splitter.rest().strip():
            raise upstream_error(f"the upstream's stream ended mid-event: {splitter.rest()[:200]!r}")
        if done is None:
            raise upstream_error("the upstream's stream ended without data: [DONE]: it was cut short")
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
            raise upstream_error(_describe(exc, url)) from exc
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
        self._send(_Reply(error.status, json_bytes(error.body())))

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
            self._send(_Reply(HTTPStatus.OK, json_bytes(self.proxy.status())))
        elif path == "/captain/policy_version" and self.command == "POST":
            try:
                request = json.loads(body or b"null")
            except ValueError:
                request = None
            if not isinstance(request, dict) or "version" not in request:
                raise ProxyError(HTTPStatus.BAD_REQUEST, 'send {"version": <int>}', "invalid_request_error")
            version = self.proxy.set_policy_version(request["version"])
            self._send(_Reply(HTTPStatus.OK, json_bytes({"policy_version": version})))
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


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `captain-ros proxy`")

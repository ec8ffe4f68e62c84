"""The recording proxy: what it records, what the client sees, and how it fails.

Fast tests run the proxy in-process against `FakeVllm`, a small upstream that answers the way vLLM 0.32 does
(token ids, logprobs and SSE chunks in vLLM's shapes; null fields when not asked), so every upstream misbehaviour
can be produced on demand, and against the in-repo scripted expert server. The slow test at the end runs the real
vLLM server and checks what training relies on: every recorded prompt_token_ids is the chat template's rendering of
the recorded messages.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from captain_ros.agent import expert_server
from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
from captain_ros.bridge.proxy import ProxyConfig, start_proxy
from captain_ros.bridge.store import EpisodeReader
from tests.vllm_server import render

DEADLINE_S = 120.0  # for waits on a condition; never a timing assertion
MODEL = "fake-model"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run one Python cell against the robot API.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]
PNG_A = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PNG_B = b"\x89PNG\r\n\x1a\n" + bytes(reversed(range(256))) * 3


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def conversation(turns: int = 1) -> list[dict]:
    """A system + developer prompt, an image, and `turns - 1` earlier tool calls with their replies."""
    messages = [
        {"role": "system", "content": "You control a Franka arm through Python."},
        {"role": "developer", "content": "# TASK.md\nput the red cube in the bowl"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "The scene:"},
                {"type": "image_url", "image_url": {"url": data_url(PNG_A), "detail": "high"}},
            ],
        },
    ]
    for i in range(1, turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "run_python", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"ran {i}"},
        ]
    return messages


def training_body(messages: list[dict], **extra) -> dict:
    """A request asking for everything training needs, as PolicyClient sends it."""
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "auto",
        "max_tokens": 16,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": 7,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
    }
    return {**body, **extra}


def episode_headers(episode: str, t: int) -> dict[str, str]:
    return {"X-Captain-Episode": episode, "X-Captain-Request": str(t)}


# ------------------------------------------------------------------------------------------------ fake vLLM
class FakeVllm:
    """An upstream answering like vLLM 0.32 (its reply and chunk shapes, copied from a real server), with a
    deterministic reply per request so the proxy's output can be compared byte for byte with a direct call.
    `mode` makes it misbehave; `gate`, when set, holds every chat completion until it is opened."""

    TOKENS: ClassVar = [("I", 40), (" move", 3271), (" it", 432), ("<tool_call>", 151657), ("</tool_call>", 151658)]
    LOGPROBS: ClassVar = [-0.25, -1.5, -0.125, -0.0625, -2.0]

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls: list[dict] = []
        self.gate: threading.Event | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                fake.get(self)

            def do_POST(self) -> None:
                fake.post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _send(handler, status: int, data: bytes, content_type: str = "application/json") -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def get(self, handler) -> None:
        if handler.path == "/v1/models":
            self._send(handler, 200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())
        elif handler.path == "/health":
            self._send(handler, 200, b"")
        else:
            self._send(handler, 404, b'{"error": {"message": "not found"}}')

    def post(self, handler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        self.calls.append(body)
        if self.gate is not None:
            self.gate.wait(DEADLINE_S)
        if self.mode == "garbage":
            return self._send(handler, 200, b"<html>502 Bad Gateway from some balancer</html>", "text/html")
        if self.mode == "error_500":
            return self._send(handler, 500, b'{"error": {"message": "EngineCore died", "code": 500}}')
        if self.mode == "bad_request":
            return self._send(handler, 400, b'{"error": {"message": "max_tokens is too large", "code": 400}}')
        if not body.get("stream"):
            return self._send(handler, 200, self.reply_bytes(body))
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.end_headers()
        for event in self.stream_events(body):
            handler.wfile.write(event)
            handler.wfile.flush()

    # what vLLM would answer --------------------------------------------------------------------
    @staticmethod
    def prompt_ids(body: dict) -> list[int]:
        digest = hashlib.sha256(json.dumps([body["messages"], body.get("tools")], sort_keys=True).encode()).digest()
        return list(digest[:12])

    def _logprobs(self, tokens) -> dict:
        return {
            "content": [
                {"token": text, "logprob": self.LOGPROBS[i], "bytes": list(text.encode()), "top_logprobs": []}
                for i, (text, _) in tokens
            ]
        }

    def reply(self, body: dict) -> dict:
        ids = body.get("return_token_ids") is True and self.mode != "no_token_ids"
        lps = body.get("logprobs") is True
        prompt = self.prompt_ids(body)
        call = {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "run_python", "arguments": '{"code": "robot.observe()"}'},
        }
        return {
            "id": "chatcmpl-fixed",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "I move it", "tool_calls": [call], "reasoning": None},
                    "logprobs": self._logprobs(enumerate(self.TOKENS)) if lps else None,
                    "finish_reason": "tool_calls",
                    "stop_reason": None,
                    "token_ids": [t for _, t in self.TOKENS] if ids else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "total_tokens": len(prompt) + len(self.TOKENS),
                "completion_tokens": len(self.TOKENS),
                "prompt_tokens_details": None,
            },
            "prompt_token_ids": prompt if ids else None,
        }

    def reply_bytes(self, body: dict) -> bytes:
        return json.dumps(self.reply(body), separators=(",", ":"), ensure_ascii=False).encode()

    def stream_events(self, body: dict) -> list[bytes]:
        """vLLM's chunks: a role chunk carrying prompt_token_ids, one chunk per token with its id and logprob
        (the last two carry a streamed tool call), a finish chunk, the usage chunk if asked, [DONE]."""
        ids = body.get("return_token_ids") is True and self.mode != "no_token_ids"
        lps = body.get("logprobs") is True
        prompt = self.prompt_ids(body)
        head = {"id": "chatcmpl-fixed", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        chunks = [{**head, "choices": [first], "prompt_token_ids": prompt if ids else None, "prompt_text": None}]
        deltas = [
            {"content": "I"},
            {"content": " move"},
            {"content": " it"},
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "chatcmpl-tool-1",
                        "type": "function",
                        "function": {"name": "run_python", "arguments": '{"code": '},
                    }
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"arguments": '"robot.observe()"}'}}]},
        ]
        for i, ((text, token), delta) in enumerate(zip(self.TOKENS, deltas, strict=True)):
            last = i == len(self.TOKENS) - 1
            choice = {
                "index": 0,
                "delta": delta,
                "logprobs": self._logprobs([(i, (text, token))]) if lps else None,
                "finish_reason": "tool_calls" if last else None,
                "token_ids": [token] if ids else None,
            }
            chunks.append({**head, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + 5, "completion_tokens": 5}
            chunks.append({**head, "choices": [], "usage": usage})
        events = [b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks]
        if self.mode == "cut_stream":
            return events[:3]
        return [*events, b"data: [DONE]\n\n"]


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture
def fake():
    upstream = FakeVllm()
    try:
        yield upstream
    finally:
        upstream.close()


@pytest.fixture
def store_path(tmp_path) -> Path:
    return tmp_path / "episodes.sqlite"


@pytest.fixture
def proxy(fake, store_path):
    handle = start_proxy(ProxyConfig(upstream_url=fake.base_url, store_path=str(store_path), policy_version=2))
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
def http():
    with httpx.Client(trust_env=False, timeout=DEADLINE_S) as client:
        yield client


@pytest.fixture
def reader(store_path):
    def open_reader() -> EpisodeReader:
        opened.append(EpisodeReader(store_path))
        return opened[-1]

    opened: list[EpisodeReader] = []
    yield open_reader
    for r in opened:
        r.close()


def model_calls(reader, episode: str) -> dict[int, dict]:
    return {r.index: r.payload for r in reader().store.records(episode) if r.kind == "model_call"}


def post(http, proxy, body: dict, headers: dict | None = None) -> httpx.Response:
    return http.post(f"{proxy.base_url}/chat/completions", json=body, headers=headers or {})


# ------------------------------------------------------------------------------------------------ recording
def test_a_completion_is_recorded_with_every_field_and_passed_through_byte_for_byte(http, proxy, fake, reader):
    body = training_body(conversation(turns=2))
    reply = post(http, proxy, body, episode_headers("ep1", 1))

    assert reply.status_code == 200, reply.text
    assert reply.content == fake.reply_bytes(body)  # the client asked for everything: the upstream's bytes
    assert reply.headers["X-Captain-Record"] == "ep1/model_call/1"
    assert fake.calls == [body]  # nothing added: the client already asked for what training needs

    call = model_calls(reader, "ep1")[1]
    assert call["messages"][2]["content"][1] == {
        "type": "image_ref",
        "sha256": hashlib.sha256(PNG_A).hexdigest(),
        "media_type": "image/png",
        "extra": {"detail": "high"},
    }
    assert call["messages"][:2] == body["messages"][:2] and call["messages"][3:] == body["messages"][3:]
    assert call["tools"] == TOOLS
    assert list(call["tools"][0]["function"]) == [  # key order kept: the chat template renders it
        "name",
        "description",
        "parameters",
    ]
    assert call["sampling"] == {k: v for k, v in body.items() if k not in ("messages", "tools")}
    assert call["prompt_token_ids"] == FakeVllm.prompt_ids(body)
    assert call["token_ids"] == [t for _, t in FakeVllm.TOKENS]
    assert call["logprobs"] == FakeVllm.LOGPROBS
    assert call["response"] == {
        "content": "I move it",
        "tool_calls": [
            {
                "id": "chatcmpl-tool-1",
                "type": "function",
                "function": {"name": "run_python", "arguments": '{"code": "robot.observe()"}'},
            }
        ],
        "finish_reason": "tool_calls",
        "usage": {"prompt_tokens": 12, "total_tokens": 17, "completion_tokens": 5},
        "model": MODEL,
    }
    assert call["policy_version"] == 2 and call["status"] == "ok" and call["attributed"] is True
    timing = call["timing"]
    assert set(timing) == {"received_unix_s", "upstream_s", "total_s", "proxy_s"}
    assert 0 <= timing["upstream_s"] <= timing["total_s"]
    assert timing["proxy_s"] == pytest.approx(timing["total_s"] - timing["upstream_s"])
    assert abs(timing["received_unix_s"] - time.time()) < 3600  # a wall-clock stamp, not a monotonic one


def test_images_are_stored_once_and_restore_to_the_exact_messages(http, proxy, reader):
    first = conversation()
    second = conversation(turns=3)
    second[-1] = {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": [
            {"type": "text", "text": "after the move:"},
            {"type": "image_url", "image_url": {"url": data_url(PNG_B, "image/jpeg")}},
            {"type": "image_url", "image_url": {"url": data_url(PNG_A), "detail": "high"}},
            # not restorable exactly (an extra part key; base64 with a line break): kept inline
            {"type": "image_url", "image_url": {"url": data_url(PNG_B)}, "uuid": "cam-1"},
            {"type": "image_url", "image_url": {"url": data_url(PNG_B)[:40] + "\n" + data_url(PNG_B)[40:]}},
            {"type": "image_url", "image_url": {"url": "https://example.com/scene.png"}},
            # bytes stored as image/png: the reader would restore this part as image/png, so it stays inline
            {"type": "image_url", "image_url": {"url": data_url(PNG_A, "image/webp")}},
        ],
    }
    for t, messages in enumerate((first, second), start=1):
        assert post(http, proxy, training_body(messages), episode_headers("ep-img", t)).status_code == 200

    r = reader()
    assert r.store.counts()["blobs"] == 2  # PNG_A once (sent three times), PNG_B once
    assert r.store.blob(hashlib.sha256(PNG_B).hexdigest()) == (PNG_B, "image/jpeg")
    calls = model_calls(reader, "ep-img")
    parts = calls[2]["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_ref", "image_ref", *["image_url"] * 4]
    assert r.restore_messages(calls[1]["messages"]) == first
    assert r.restore_messages(calls[2]["messages"]) == second


def test_a_client_that_did_not_ask_for_token_ids_sees_what_the_upstream_would_have_sent_it(http, proxy, fake, reader):
    for t, stream in ((1, False), (2, True)):
        body = {"model": MODEL, "messages": conversation(), "tools": TOOLS, "stream": stream, "max_tokens": 16}
        reply = post(http, proxy, body, episode_headers("ep-plain", t))
        assert reply.status_code == 200, reply.text
        direct = http.post(f"{fake.base_url}/chat/completions", json=body)
        assert reply.content == direct.content  # nulls where the client did not ask, no usage chunk
        asked = fake.calls[-2]
        assert asked["return_token_ids"] is True and asked["logprobs"] is True and asked["top_logprobs"] == 0
        assert asked.get("stream_options") == ({"include_usage": True} if stream else None)
    calls = model_calls(reader, "ep-plain")
    for t in (1, 2):
        assert calls[t]["token_ids"] == [t for _, t in FakeVllm.TOKENS] and calls[t]["logprobs"] == FakeVllm.LOGPROBS
        assert calls[t]["sampling"]["max_tokens"] == 16 and "return_token_ids" not in calls[t]["sampling"]
    assert calls[1]["upstream_added"] == ["return_token_ids", "logprobs"]
    assert calls[2]["upstream_added"] == ["return_token_ids", "logprobs", "include_usage"]
    assert calls[2]["response"]["usage"] == {"prompt_tokens": 12, "total_tokens": 17, "completion_tokens": 5}


def test_a_stream_passes_through_unchanged_and_is_recorded_like_a_plain_completion(http, proxy, fake, reader):
    plain = training_body(conversation())
    streamed = training_body(conversation(), stream=True, stream_options={"include_usage": True})
    assert post(http, proxy, plain, episode_headers("ep-s", 1)).status_code == 200
    with http.stream(
        "POST", f"{proxy.base_url}/chat/completions", json=streamed, headers=episode_headers("ep-s", 2)
    ) as r:
        assert r.status_code == 200
        received = b"".join(r.iter_raw())
    assert received == b"".join(fake.stream_events(streamed))
    assert received.endswith(b"data: [DONE]\n\n")

    calls = model_calls(reader, "ep-s")
    a, b = calls[1], calls[2]
    for name in ("messages", "tools", "prompt_token_ids", "token_ids", "logprobs", "response", "policy_version"):
        assert a[name] == b[name], name
    assert set(a) - {"reply"} == set(b) - {"reply_chunks"}
    assert {k: v for k, v in b["sampling"].items() if k not in ("stream", "stream_options")} == {
        k: v for k, v in a["sampling"].items()
    }


# ------------------------------------------------------------------------------------------------ failures
def test_an_unreachable_upstream_is_a_502_and_nothing_is_recorded(http, store_path, reader):
    with socket.socket() as sock:  # a port nothing listens on: bind, note it, close
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = ProxyConfig(upstream_url=f"http://127.0.0.1:{port}/v1", store_path=str(store_path))
    with start_proxy(config) as handle:
        for stream in (False, True):
            reply = post(http, handle, training_body(conversation(), stream=stream), episode_headers("ep-down", 1))
            assert reply.status_code == 502
            assert "cannot reach the upstream" in reply.json()["error"]["message"]
        status = http.get(f"{handle.root}/captain/status").json()
    assert status["counters"]["upstream_errors"] == 2 and status["counters"]["recorded"] == 0
    assert reader().store.counts()["records"] == 0


@pytest.mark.parametrize(
    "case",
    [
        ("garbage", False, "not JSON"),
        ("error_500", False, "HTTP 500"),
        ("error_500", True, "HTTP 500"),
        ("no_token_ids", False, "no prompt_token_ids, choices[0].token_ids"),
    ],
)
def test_an_upstream_that_misbehaves_is_a_502_naming_what_went_wrong(http, proxy, fake, reader, case):
    mode, stream, says = case
    fake.mode = mode
    reply = post(http, proxy, training_body(conversation(), stream=stream), episode_headers("ep-bad", 1))
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert says in error["message"] and error["type"] == "upstream_error"
    assert reader().store.counts()["records"] == 0


@pytest.mark.parametrize("case", [("cut_stream", "without data: [DONE]"), ("no_token_ids", "no prompt")])
def test_a_stream_that_cannot_be_recorded_ends_with_an_error_event_instead_of_done(http, proxy, fake, reader, case):
    mode, says = case
    fake.mode = mode
    body = training_body(conversation(), stream=True)
    reply = post(http, proxy, body, episode_headers("ep-cut", 1))
    events = [e for e in reply.content.split(b"\n\n") if e]
    assert b"data: [DONE]\n\n" not in reply.content
    error = json.loads(events[-1].removeprefix(b"data: "))["error"]
    assert says in error["message"] and error["code"] == 502
    assert reader().store.counts()["records"] == 0


def test_an_upstream_4xx_passes_through_unrecorded(http, proxy, fake, reader):
    fake.mode = "bad_request"
    reply = post(http, proxy, training_body(conversation()), episode_headers("ep-4xx", 1))
    assert reply.status_code == 400 and reply.json()["error"]["message"] == "max_tokens is too large"
    assert reader().store.counts()["records"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_store_is_a_503_and_the_client_never_gets_the_unrecorded_reply(http, proxy, fake, reader, stream):
    with proxy.proxy._store_lock:  # the real store, capped at its current size: the next write finds it full
        db = proxy.proxy.store._db
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        db.execute(f"PRAGMA max_page_count={pages}")
    messages = conversation()
    big = random.Random(0).randbytes(200_000)  # an image the capped file has no room for
    messages[2]["content"][1]["image_url"]["url"] = data_url(big)
    body = training_body(messages, stream=stream)
    reply = post(http, proxy, body, episode_headers("ep-full", 1))
    if stream:
        assert reply.status_code == 200  # the stream had started; it ends with an error event, not [DONE]
        assert b"data: [DONE]\n\n" not in reply.content
        error = json.loads(reply.content.rstrip().rsplit(b"\n\n", 1)[-1].removeprefix(b"data: "))["error"]
    else:
        assert reply.status_code == 503
        assert b"I move it" not in reply.content
        error = reply.json()["error"]
    assert error["code"] == 503 and "could not store the record" in error["message"] and "full" in error["message"]
    assert reader().store.counts()["records"] == 0
    assert http.get(f"{proxy.root}/captain/status").json()["counters"]["store_errors"] == 1


# ------------------------------------------------------------------------------------------------ retries
@pytest.mark.parametrize("stream", [False, True])
def test_a_retried_request_is_answered_from_the_record_without_sampling_again(http, proxy, fake, reader, stream):
    body = training_body(conversation(turns=2), stream=stream)
    first = post(http, proxy, body, episode_headers("ep-r", 1))
    again = post(http, proxy, copy.deepcopy(body), episode_headers("ep-r", 1))
    assert first.status_code == again.status_code == 200
    assert len(fake.calls) == 1
    assert again.headers["X-Captain-Replayed"] == "1"
    if stream:
        parse = lambda raw: [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]  # noqa: E731
        assert parse(again.content) == parse(first.content) and again.content.endswith(b"data: [DONE]\n\n")
    else:
        assert again.json() == first.json()
    assert http.get(f"{proxy.root}/captain/status").json()["counters"]["replayed"] == 1


def test_a_streaming_client_that_hangs_up_still_gets_its_record_and_its_retry_is_replayed(http, proxy, fake):
    body = training_body(conversation(), stream=True)
    url = f"{proxy.base_url}/chat/completions"
    with http.stream("POST", url, json=body, headers=episode_headers("ep-gone", 1)) as r:
        first = next(r.iter_raw())  # one read, then the connection is dropped
    assert first.startswith(b"data: ")
    retry = post(http, proxy, body, episode_headers("ep-gone", 1))  # waits for the first attempt's record
    assert retry.headers["X-Captain-Replayed"] == "1" and retry.content.endswith(b"data: [DONE]\n\n")
    assert len(fake.calls) == 1


def test_a_retry_racing_its_first_attempt_waits_for_it_and_gets_the_same_reply(http, proxy, fake):
    fake.gate = threading.Event()
    body = training_body(conversation())
    replies: list[httpx.Response] = []
    senders = [
        threading.Thread(target=lambda: replies.append(post(http, proxy, body, episode_headers("ep-race", 1))))
        for _ in range(2)
    ]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + DEADLINE_S
    while proxy.proxy.counters["requests"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # poll until both attempts reached the proxy
    fake.gate.set()
    for sender in senders:
        sender.join(DEADLINE_S)
    assert len(fake.calls) == 1
    assert [r.status_code for r in replies] == [200, 200] and replies[0].json() == replies[1].json()


def test_a_different_request_under_a_recorded_number_is_a_409(http, proxy, fake):
    body = training_body(conversation())
    assert post(http, proxy, body, episode_headers("ep-c", 1)).status_code == 200
    changed = training_body(conversation(turns=2))
    reply = post(http, proxy, changed, episode_headers("ep-c", 1))
    assert reply.status_code == 409
    assert "already recorded with different messages" in reply.json()["error"]["message"]
    reply = post(http, proxy, {**body, "temperature": 0.5}, episode_headers("ep-c", 1))
    assert reply.status_code == 409 and "different sampling" in reply.json()["error"]["message"]
    reordered = [{"function": tool["function"], "type": tool["type"]} for tool in TOOLS]  # equal, rendered differently
    reply = post(http, proxy, {**body, "tools": reordered}, episode_headers("ep-c", 1))
    assert reply.status_code == 409 and "different tools" in reply.json()["error"]["message"]
    assert len(fake.calls) == 1


# ------------------------------------------------------------------------------------------------ control
def test_requests_without_episode_headers_are_recorded_unattributed_or_refused(http, fake, store_path, reader):
    with start_proxy(ProxyConfig(upstream_url=fake.base_url, store_path=str(store_path))) as loose:
        assert post(http, loose, training_body(conversation())).status_code == 200
        half = post(http, loose, training_body(conversation()), {"X-Captain-Episode": "e"})
        assert half.status_code == 400 and "X-Captain-Request is missing" in half.json()["error"]["message"]
        zero = post(http, loose, training_body(conversation()), episode_headers("e", 0))
        assert zero.status_code == 400 and "integer from 1" in zero.json()["error"]["message"]
    (episode,) = [e["episode_id"] for e in reader().store.episodes()]
    assert episode.startswith("unattributed-")
    assert model_calls(reader, episode)[1]["attributed"] is False
    strict = ProxyConfig(upstream_url=fake.base_url, store_path=str(store_path), require_episode=True)
    with start_proxy(strict) as handle:
        reply = post(http, handle, training_body(conversation()))
        assert reply.status_code == 400 and "--require-episode" in reply.json()["error"]["message"]
    assert len(fake.calls) == 1


def test_the_policy_version_goes_into_every_later_record_and_never_down(http, proxy, reader):
    assert post(http, proxy, training_body(conversation()), episode_headers("ep-v", 1)).status_code == 200
    bump = http.post(f"{proxy.root}/captain/policy_version", json={"version": 5})
    assert bump.status_code == 200 and bump.json() == {"policy_version": 5}
    assert post(http, proxy, training_body(conversation(2)), episode_headers("ep-v", 2)).status_code == 200
    down = http.post(f"{proxy.root}/captain/policy_version", json={"version": 4})
    assert down.status_code == 409 and "versions only grow" in down.json()["error"]["message"]
    bad = http.post(f"{proxy.root}/captain/policy_version", json={"version": "6"})
    assert bad.status_code == 400
    calls = model_calls(reader, "ep-v")
    assert (calls[1]["policy_version"], calls[2]["policy_version"]) == (2, 5)
    status = http.get(f"{proxy.root}/captain/status").json()
    assert status["policy_version"] == 5 and status["counters"]["recorded"] == 2


def test_other_routes_pass_through_unrecorded(http, proxy, reader):
    assert http.get(f"{proxy.base_url}/models").json() == {"object": "list", "data": [{"id": MODEL}]}
    assert http.get(f"{proxy.root}/health").status_code == 200
    assert http.get(f"{proxy.base_url}/nothing").status_code == 404
    assert http.get(f"{proxy.root}/captain/nothing").status_code == 404
    assert reader().store.counts()["records"] == 0


def test_the_scripted_expert_is_refused_for_training_unless_missing_token_ids_are_allowed(http, store_path, reader):
    """The expert server is not a language model: its replies carry no token ids."""
    server = expert_server.serve("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}/v1"
    messages = [{"role": "system", "content": "go"}, {"role": "user", "content": "Put the cube in the bowl."}]
    try:
        with start_proxy(ProxyConfig(upstream_url=upstream, store_path=str(store_path))) as strict:
            reply = post(http, strict, {"model": "captain-expert", "messages": messages}, episode_headers("x", 1))
            assert reply.status_code == 502 and "no prompt_token_ids" in reply.json()["error"]["message"]
        loose = ProxyConfig(upstream_url=upstream, store_path=str(store_path), require_token_ids=False)
        with start_proxy(loose) as handle, PolicyClient(PolicyConfig(base_url=handle.base_url)) as client:
            completion = client.complete(messages, [], headers=episode_headers("x", 1))
    finally:
        server.shutdown()
        server.server_close()
    call = model_calls(reader, "x")[1]
    assert call["token_ids"] is None and call["prompt_token_ids"] is None
    assert call["response"]["content"] == completion.content and completion.model == "captain-expert"


def test_the_command_line_prints_ready_and_records(http, fake, store_path, reader):
    cmd = [sys.executable, "-m", "captain_ros.bridge.proxy", "--upstream", fake.base_url, "--store", str(store_path)]
    proc = subprocess.Popen([*cmd, "--port", "0", "--policy-version", "3"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("READY http://127.0.0.1:") and line.endswith("/v1"), line
        base = line.removeprefix("READY ")
        reply = http.post(
            f"{base}/chat/completions", json=training_body(conversation()), headers=episode_headers("c", 1)
        )
        assert reply.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)
    assert proc.returncode == 0
    assert model_calls(reader, "c")[1]["policy_version"] == 3


# ------------------------------------------------------------------------------------------------ real vLLM
@pytest.mark.slow
def test_real_vllm_every_recorded_prompt_is_the_chat_template_rendering_of_the_recorded_messages(
    vllm_server, store_path, http, reader
):
    tools = [
        *TOOLS,
        {
            "type": "function",
            "function": {"name": "finish", "description": "End the episode.", "parameters": {"type": "object"}},
        },
    ]
    base = [
        {"role": "system", "content": "You control a Franka arm through Python. Call run_python with code."},
        {"role": "developer", "content": "# TASK.md\nput the red cube in the black bowl"},
        {"role": "user", "content": "Begin."},
    ]
    config = ProxyConfig(upstream_url=vllm_server.base_url, store_path=str(store_path), require_episode=True)
    with start_proxy(config) as handle:
        policy = PolicyConfig(base_url=handle.base_url, max_tokens=8, seed=0)
        messages = list(base)
        with PolicyClient(policy) as client:
            for t in range(1, 4):
                completion = client.complete(messages, tools, headers=episode_headers("vllm-ep", t))
                assert completion.token_ids and len(completion.logprobs) == len(completion.token_ids)
                args = json.dumps({"code": f"print({t})"})
                call = {"id": f"call_{t}", "type": "function", "function": {"name": "run_python", "arguments": args}}
                messages += [
                    {"role": "assistant", "content": completion.content, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{t}", "content": f"[run_python] ok: {t}"},
                    {"role": "user", "content": f"Turn {t} done. Continue."},
                ]
            last = client.complete(messages, tools, headers=episode_headers("vllm-ep", 4))
        # the same last request, streamed (sampling is seeded, so it samples the same tokens)
        body = {
            "model": str(vllm_server.model_dir),
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
            "max_tokens": 8,
            "temperature": 1.0,
            "top_p": 1.0,
            "seed": 0,
            "stream": True,
        }
        with http.stream(
            "POST", f"{handle.base_url}/chat/completions", json=body, headers=episode_headers("vllm-ep", 5)
        ) as r:
            assert r.status_code == 200
            events = b"".join(r.iter_raw())
        assert events.endswith(b"data: [DONE]\n\n") and b'"prompt_token_ids":null' in events
        assert handle.proxy.counters["recorded"] == 5

    r = reader()
    calls = model_calls(reader, "vllm-ep")
    assert sorted(calls) == [1, 2, 3, 4, 5]
    texts = {}
    for t, call in calls.items():
        expected = render(vllm_server, r.restore_messages(call["messages"]), call["tools"])
        assert call["prompt_token_ids"] == expected["ids"], (t, expected["text"])
        texts[t] = expected["text"]
        assert len(call["token_ids"]) == len(call["logprobs"]) == call["response"]["usage"]["completion_tokens"]
        assert call["response"]["usage"]["prompt_tokens"] == len(call["prompt_token_ids"])
    assert "<tool_response>" in texts[4] and "<|im_start|>developer\n# TASK.md" in texts[4]
    # the key order matters: the template writes tool schemas as they are ordered, which the store keeps
    resorted = json.loads(json.dumps(calls[1]["tools"], sort_keys=True))
    assert render(vllm_server, calls[1]["messages"], resorted)["ids"] != calls[1]["prompt_token_ids"]
    assert calls[4]["token_ids"] == last.token_ids and calls[4]["prompt_token_ids"] == last.prompt_token_ids
    plain, streamed = calls[4], calls[5]
    for name in ("messages", "tools", "prompt_token_ids", "token_ids", "logprobs", "response", "policy_version"):
        assert plain[name] == streamed[name], name
    assert set(plain) - {"reply"} == set(streamed) - {"reply_chunks"}

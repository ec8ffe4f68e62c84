"""The recording proxy's tests' upstream and requests: `FakeVllm`, a small upstream that answers the way vLLM 0.32
does (token ids, logprobs and SSE chunks in vLLM's shapes; null fields when not asked), so every upstream
misbehaviour can be produced on demand, and the requests an agent sends through the proxy. The fixtures that
start them are in conftest.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx

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


def model_calls(reader, episode: str) -> dict[int, dict]:
    return {r.index: r.payload for r in reader().store.records(episode) if r.kind == "model_call"}


def post(http, proxy, body: dict, headers: dict | None = None) -> httpx.Response:
    return http.post(f"{proxy.base_url}/chat/completions", json=body, headers=headers or {})

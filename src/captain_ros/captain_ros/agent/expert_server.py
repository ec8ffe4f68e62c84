"""The scripted expert behind an OpenAI-compatible chat-completions endpoint, so the agent loop (and anything else
that talks to a vLLM server) can run it as its policy: `GET /health`, `GET /v1/models` (one model,
`captain-expert`) and `POST /v1/chat/completions`.

Each completion is the expert's cell as one call of the `python` tool, its reasoning line a comment in the cell
(`expert.narrated`; `content` null, `finish_reason: "tool_calls"`); when the expert has nothing more to do (finish()
was accepted, or it gave up) the reply is its reasoning as `content` with no tool call and `finish_reason: "stop"`,
which ends the episode. It is not a language model: `usage`
counts are approximate (about 4 characters per token) and `prompt_token_ids` / `token_ids` are null. Requests are
independent (the expert is stateless), so one server serves any number of episodes at once.

  captain-ros expert-server --host 127.0.0.1 --port 8001   # prints "READY <url>" when listening
  expert_server --port 8001                                # the same, as the package's script
"""

from __future__ import annotations

import json
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from captain_ros.agent.expert import ScriptedExpert, narrated

MODEL_ID = "captain-expert"
CHARS_PER_TOKEN = 4.0  # for the approximate usage counts
MAX_BODY_BYTES = 64 * 1024 * 1024  # a long episode with images is a few MB


class RequestError(ValueError):
    """A malformed request: answered with HTTP 400 and this message."""


def approx_tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN)) if text else 0


def _message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = json.dumps(message.get("tool_calls") or [])
    return f"{content or ''} {calls if message.get('tool_calls') else ''}"


def validate(body: Any) -> list[dict]:
    """The request's messages; raises RequestError when the body is not a usable chat-completion request."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object with 'messages'")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of chat messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestError(f"messages[{i}].content must be a string, a list of parts or null")
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RequestError(f"messages[{i}].tool_calls must be a list")
    if body.get("stream"):
        raise RequestError("streaming is not supported by the scripted expert; send stream: false")
    n = body.get("n", 1)
    if n != 1:
        raise RequestError("only n = 1 is supported")
    return messages


def completion(expert: ScriptedExpert, messages: list[dict]) -> dict:
    """The chat.completion answering `messages`."""
    reasoning, code = expert.reply(messages)
    message: dict[str, Any] = {"role": "assistant", "content": reasoning if code is None else None}
    if code is not None:
        code = narrated(reasoning, code)
        call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": "python", "arguments": json.dumps({"code": code})},
        }
        message["tool_calls"] = [call]
    prompt = approx_tokens(" ".join(_message_text(m) for m in messages))
    produced = approx_tokens(reasoning + (code or ""))
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if code is not None else "stop",
                "logprobs": None,
                "token_ids": None,  # not a language model: no tokens were sampled
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": prompt + produced},
        "prompt_token_ids": None,
        "system_fingerprint": "scripted-expert",
    }


def models() -> dict:
    return {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "captain_ros", "max_model_len": None}],
    }


class ExpertHandler(BaseHTTPRequestHandler):
    server_version = "captain-expert/1.0"
    expert = ScriptedExpert()  # stateless: shared by every request thread

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request would flood an episode's log."""

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send(HTTPStatus.OK, {"status": "ok", "model": MODEL_ID})
        elif path == "/v1/models":
            self._send(HTTPStatus.OK, models())
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint: GET {path}", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path != "/v1/chat/completions":
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {path}", "not_found_error")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, "Content-Length is not a number")
            return
        if length <= 0 or length > MAX_BODY_BYTES:
            self._error(HTTPStatus.BAD_REQUEST, f"the body must be 1 to {MAX_BODY_BYTES} bytes of JSON")
            return
        try:
            body = json.loads(self.rfile.read(length))
            messages = validate(body)
        except (ValueError, UnicodeDecodeError) as exc:  # RequestError and JSONDecodeError are ValueErrors
            self._error(HTTPStatus.BAD_REQUEST, f"malformed request: {exc}")
            return
        try:
            self._send(HTTPStatus.OK, completion(self.expert, messages))
        except Exception as exc:  # the expert failed on a well-formed request: a server error, not the caller's
            self._error(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"the expert failed: {type(exc).__name__}: {exc}", "server_error"
            )


def serve(host: str = "127.0.0.1", port: int = 8001) -> ThreadingHTTPServer:
    """A started-but-not-serving server (call serve_forever()); port 0 picks a free port."""
    server = ThreadingHTTPServer((host, port), ExpertHandler)
    server.daemon_threads = True
    return server

"""Server-sent events of a streamed chat completion: whole events out of a byte stream, the recorded fields
accumulated chunk by chunk, and the error event that ends a stream which cannot be recorded.
"""

from __future__ import annotations

from typing import Any

from captain_ros.bridge.completions import ProxyError, int_list, json_bytes, logprob_list, upstream_error, usage_fields

DONE_EVENT = b"data: [DONE]"


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
            raise upstream_error(f"a stream chunk is not a JSON object: {str(chunk)[:200]}")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise upstream_error(f"the upstream sent an error in the stream: {str(message)[:1000]}")
        self.chunks += 1
        self.model = chunk.get("model", self.model)
        prompt = int_list(chunk.get("prompt_token_ids"), "prompt_token_ids")
        if prompt is not None:
            self.prompt_token_ids = prompt
        if chunk.get("usage") is not None:
            self.usage = usage_fields(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise upstream_error("a stream chunk's choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                raise upstream_error("a stream chunk has a choice other than index 0 (send n = 1)")
            self._add_choice(choice)

    def _add_choice(self, choice: dict) -> None:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise upstream_error("a stream chunk's delta is not an object")
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            self.reasoning.append(reasoning)
        for call in delta.get("tool_calls") or []:
            self._add_call(call)
        ids = int_list(choice.get("token_ids"), "choices[0].token_ids")
        if ids is not None:
            self.token_ids = (self.token_ids or []) + ids
        if choice.get("logprobs") is not None:
            self.logprobs = (self.logprobs or []) + logprob_list(choice["logprobs"], "choices[0].logprobs")
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def _add_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            raise upstream_error(f"a streamed tool call is not an object: {str(call)[:200]}")
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


class SseSplitter:
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


def event_data(event: bytes) -> bytes:
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines)


def sse_error(error: ProxyError) -> bytes:
    return b"data: " + json_bytes(error.body()) + b"\n\n"

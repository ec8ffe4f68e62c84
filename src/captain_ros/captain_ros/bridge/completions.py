"""The chat-completion messages as the recording proxy (captain_ros.bridge.proxy) reads and rewrites them: the
request it records, what it adds to the request it sends upstream, the reply as the client would have got it,
and the fields a record holds.

What training needs is asked for, and hidden again: if the client did not ask for `return_token_ids`, `logprobs`
(or, streaming, `stream_options.include_usage`), the proxy adds them to the upstream request and removes them
from the reply (sets those fields back to null, drops the usage chunk), so the client sees what it would have
seen without the proxy; when it asked for all of them the upstream's bytes pass through untouched. A reply
without prompt token ids, sampled token ids or logprobs, or whose counts disagree with its usage, cannot be
trained on: the client gets HTTP 502 naming the missing field (`--allow-missing-token-ids` records such replies
with nulls instead, for servers that are not language models, such as the scripted expert).
"""

from __future__ import annotations

import copy
import json
from http import HTTPStatus
from typing import Any


class ProxyError(Exception):
    """A request the proxy answers with an OpenAI-style JSON error: HTTP `status`, this message and `kind`."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.kind = kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


def upstream_error(message: str) -> ProxyError:
    return ProxyError(HTTPStatus.BAD_GATEWAY, message, "upstream_error")


def json_bytes(obj: Any) -> bytes:
    """JSON as vLLM (Starlette's JSONResponse) writes it: compact, UTF-8, no NaN."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


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
    return (json_bytes(out) if added else raw), added


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


def int_list(value: Any, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise upstream_error(f"the upstream's {what} is not a list of integers")
    return value


def logprob_list(value: Any, what: str) -> list[float]:
    try:
        return [float(entry["logprob"]) for entry in (value["content"] or [])]
    except (KeyError, TypeError, ValueError):
        raise upstream_error(f"the upstream's {what} is not a logprobs object with content[].logprob") from None


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
        raise upstream_error(f"the upstream returned a malformed tool call {str(call)[:200]}") from None


def usage_fields(usage: Any) -> dict:
    if usage is None:
        return {}
    if not isinstance(usage, dict):
        raise upstream_error("the upstream's usage is not an object")
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
        raise upstream_error(
            f"the upstream's reply is not a chat completion (no {exc}); it starts with {str(data)[:300]!r}"
        ) from None
    response = {
        "content": content,
        "tool_calls": [_tool_call(c) for c in calls],
        "finish_reason": choice.get("finish_reason"),
        "usage": usage_fields(data.get("usage")),
        "model": data.get("model"),
    }
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        response["reasoning"] = reasoning
    logprobs = choice.get("logprobs")
    return {
        "prompt_token_ids": int_list(data.get("prompt_token_ids"), "prompt_token_ids"),
        "token_ids": int_list(choice.get("token_ids"), "choices[0].token_ids"),
        "logprobs": None if logprobs is None else logprob_list(logprobs, "choices[0].logprobs"),
        "response": response,
    }


def check_trainable(fields: dict, require_token_ids: bool) -> None:
    """ProxyError(502) naming what a reply lacks for training, or where its counts disagree."""
    if fields["response"]["finish_reason"] is None:
        raise upstream_error("the upstream's reply has no finish_reason: it was cut short")
    names = {
        "prompt_token_ids": "prompt_token_ids",
        "token_ids": "choices[0].token_ids",
        "logprobs": "choices[0].logprobs",
    }
    missing = [wire for name, wire in names.items() if fields[name] is None]
    if missing and require_token_ids:
        raise upstream_error(
            f"the upstream's reply has no {', '.join(missing)}: it cannot be recorded for training. Is the upstream "
            "a vLLM server recent enough to honour return_token_ids? Start the proxy with --allow-missing-token-ids "
            "for servers that are not language models"
        )
    ids, lps, usage = fields["token_ids"], fields["logprobs"], fields["response"]["usage"]
    if ids is not None and lps is not None and len(ids) != len(lps):
        raise upstream_error(f"the upstream's reply has {len(ids)} sampled token ids but {len(lps)} logprobs")
    for counted, key in ((fields["prompt_token_ids"], "prompt_tokens"), (ids, "completion_tokens")):
        if counted is not None and isinstance(usage.get(key), int) and usage[key] != len(counted):
            raise upstream_error(f"the upstream's reply has {len(counted)} token ids but usage.{key} = {usage[key]}")


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

"""The policy client: one chat completion from a vLLM OpenAI-compatible server, with token ids and logprobs.

ROS-free and without the `openai` package: plain HTTP (httpx) against the server's `/v1/chat/completions`.
Each completion asks for what training needs besides the text: the prompt's token ids, the sampled token
ids and one logprob per sampled token (vLLM's `return_token_ids` and `logprobs` fields).

The server the stack expects (tools/make_tiny_model.py builds a tiny model for tests; `make setup` builds
.venv-vllm):

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \\
        --model DIR --dtype bfloat16 --max-model-len 2048 --enforce-eager \\
        --enable-auto-tool-choice --tool-call-parser hermes \\
        --logprobs-mode processed_logprobs --max-logprobs 5

- `--enable-auto-tool-choice --tool-call-parser hermes`: the policy answers with tool calls in Qwen's
  `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks; the server parses them into OpenAI
  `tool_calls` (the request sends `tool_choice: "auto"`).
- `--logprobs-mode processed_logprobs`: logprobs of the distribution the tokens were actually sampled
  from (after temperature and top-p). vLLM's default, raw logprobs, is the model's distribution before
  temperature; the RL importance ratio pi_new/pi_old needs the sampling policy's probability, so a
  trainer that recomputes logprobs at the same temperature compares like with like.
- `--max-logprobs`: the largest `top_logprobs` a request may ask for; the client asks for 0 (only the
  sampled token's logprob), so any value >= 0 works; 5 leaves room for debugging.
- No reasoning parser with `include_reasoning: false`: with it, token ids and logprobs come back null.

Retries: connection errors, timeouts, a connection cut mid-response, HTTP 5xx and 429 and a body that is
not JSON are retried `max_retries` times with exponential backoff (`backoff_s`, doubled each time); an
HTTP 4xx other than 429 and a JSON reply of the wrong shape are not (the same request would fail again).
Every failure is a `PolicyError` whose message says what happened and what to do.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

_sleep = time.sleep  # the backoff wait; tests record it instead

SERVER_HINT = (
    "start it with `.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model DIR "
    "--enable-auto-tool-choice --tool-call-parser hermes --logprobs-mode processed_logprobs --max-logprobs 5` "
    "(captain_ros.agent.policy_client's docstring has the full command line) or fix PolicyConfig.base_url"
)


@dataclass(frozen=True)
class PolicyConfig:
    """Where the policy server is and how to sample from it."""

    base_url: str = "http://127.0.0.1:8000/v1"  # the OpenAI API root of the server
    model: str = ""  # "" = the server's only model (GET /v1/models)
    max_tokens: int = 4096  # sampled tokens per completion at most
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None  # per-request sampling seed; None = the server's choice
    request_timeout_s: float = 600.0  # a whole completion (reading the reply) at most
    connect_timeout_s: float = 10.0  # connecting, and each health-check request
    max_retries: int = 3  # retries after the first attempt, for transient failures only
    backoff_s: float = 1.0  # wait before the first retry; doubled per retry
    logprobs: bool = True  # ask for one logprob per sampled token
    extra_body: dict = field(default_factory=dict)  # merged into the request body last (vLLM extras)


@dataclass
class Completion:
    """One assistant turn as the server sampled it, with what training needs to replay it."""

    content: str  # assistant text (reasoning) — "" if none
    tool_calls: list[dict]  # OpenAI form: [{"id", "type": "function", "function": {"name", "arguments": <str>}}]
    finish_reason: str  # "stop", "length", "tool_calls", ...
    prompt_token_ids: list[int] | None  # the rendered prompt as the model saw it
    token_ids: list[int] | None  # the sampled tokens
    logprobs: list[float] | None  # per sampled token
    model: str
    usage: dict
    raw: dict  # the full response JSON
    latency_s: float  # wall time of the successful attempt


class PolicyError(RuntimeError):
    """The server is down, timed out, cut the connection, rejected the request or returned garbage (after the
    retries, where retrying can help); the message says which and what to do."""


class _Retryable(Exception):
    """A failed attempt that another attempt may fix; `message` is the PolicyError text if none does."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PolicyClient:
    """Chat completions from one vLLM server. Not thread-safe; one client per agent loop."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        # the server root: vLLM's /health lives beside /v1, not under it
        self.root = self.base_url.removesuffix("/v1")
        self._http = httpx.Client(
            timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
            headers={"Content-Type": "application/json"},
            trust_env=False,  # no HTTP(S)_PROXY: the policy server is on this machine or the robot's network
        )
        self._model = config.model

    # -------------------------------------------------------------------------------- public API
    def health(self) -> str:
        """Check the server once (no retries: poll this to wait for a starting server); return the model name."""
        quick = httpx.Timeout(self.config.connect_timeout_s)
        try:
            reply = self._http.get(f"{self.root}/health", timeout=quick)
        except httpx.HTTPError as exc:
            raise PolicyError(f"policy server at {self.root} is not healthy: {_describe(exc)}; {SERVER_HINT}") from exc
        if reply.status_code != 404 and reply.status_code >= 400:  # 404: not vLLM, fall back to /v1/models
            raise PolicyError(
                f"policy server at {self.root} is not healthy: GET /health answered HTTP {reply.status_code}"
                f" ({_server_message(reply)}); its engine may have died: read the server's log and restart it"
            )
        try:
            models = self._models(timeout=quick)
        except _Retryable as exc:
            raise PolicyError(exc.message) from exc
        return self._pick_model(models)

    def complete(self, messages: list[dict], tools: list[dict], headers: dict[str, str] | None = None) -> Completion:
        """One assistant turn for `messages` with `tools` offered (tool_choice "auto"). `headers` go with the
        request (the recording proxy's X-Captain-Episode / X-Captain-Request attribution)."""
        model = self._resolve_model()
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
            "return_token_ids": True,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.config.seed is not None:
            body["seed"] = self.config.seed
        if self.config.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0
        body.update(self.config.extra_body)
        payload = json.dumps(body)
        url = f"{self.base_url}/chat/completions"

        def attempt() -> Completion:
            t0 = time.monotonic()
            reply = self._send("POST", url, content=payload, headers=headers)
            data = _json_of(reply, url)
            try:
                return _parse_completion(data, model, time.monotonic() - t0)
            except (KeyError, TypeError, ValueError) as exc:
                raise PolicyError(
                    f"policy server at {url} returned a reply that is not a chat completion ({exc}); body starts "
                    f"with {reply.text[:300]!r}. Is PolicyConfig.base_url a vLLM OpenAI server?"
                ) from exc

        return self._with_retries(attempt)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------- internals
    def _resolve_model(self) -> str:
        if not self._model:
            self._model = self._pick_model(self._with_retries(self._models))
        return self._model

    def _pick_model(self, models: list[str]) -> str:
        if self.config.model:
            if self.config.model not in models:
                raise PolicyError(
                    f"policy server at {self.root} does not serve model {self.config.model!r} (it serves {models}); "
                    "set PolicyConfig.model to one of those, or '' for the server's only model"
                )
            return self.config.model
        if len(models) != 1:
            raise PolicyError(
                f"policy server at {self.root} serves {len(models)} models {models}: set PolicyConfig.model to one"
            )
        self._model = models[0]
        return models[0]

    def _models(self, timeout: httpx.Timeout | None = None) -> list[str]:
        url = f"{self.base_url}/models"
        reply = self._send("GET", url, timeout=timeout)
        data = _json_of(reply, url)
        try:
            models = [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError) as exc:
            raise PolicyError(
                f"policy server at {url} returned no model list ({exc}); body starts with {reply.text[:300]!r}. "
                "Is PolicyConfig.base_url an OpenAI-compatible server (ending in /v1)?"
            ) from exc
        return models

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request; transient failures raise _Retryable, a client error raises PolicyError."""
        if kwargs.get("timeout") is None:
            kwargs.pop("timeout", None)
        try:
            reply = self._http.request(method, url, **kwargs)
        except httpx.TimeoutException as exc:
            what = "connect" if isinstance(exc, httpx.ConnectTimeout) else "read"
            limit = self.config.connect_timeout_s if what == "connect" else self.config.request_timeout_s
            raise _Retryable(
                f"policy server at {url} timed out ({what} timeout of {limit:g} s): it is overloaded or stuck. "
                "Check its log; raise PolicyConfig.request_timeout_s or lower max_tokens for long completions"
            ) from exc
        except httpx.ConnectError as exc:
            raise _Retryable(f"cannot reach the policy server at {url} ({_describe(exc)}); {SERVER_HINT}") from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise _Retryable(
                f"policy server at {url} cut the connection mid-request ({_describe(exc)}): it may have crashed "
                "or restarted; read its log"
            ) from exc
        except httpx.HTTPError as exc:
            raise _Retryable(f"request to the policy server at {url} failed: {_describe(exc)}") from exc
        if reply.status_code >= 500 or reply.status_code == 429:
            raise _Retryable(
                f"policy server at {url} answered HTTP {reply.status_code} ({_server_message(reply)}); "
                "read the server's log"
            )
        if reply.status_code >= 400:
            raise PolicyError(
                f"policy server at {url} rejected the request with HTTP {reply.status_code}: "
                f"{_server_message(reply)}. Fix the request (messages, tools, model, max_tokens against the "
                "server's --max-model-len); retrying would not help"
            )
        return reply

    def _with_retries(self, attempt):
        attempts = 1 + max(0, self.config.max_retries)
        t0 = time.monotonic()
        for i in range(attempts):
            try:
                return attempt()
            except _Retryable as exc:
                if i == attempts - 1:
                    raise PolicyError(
                        f"{exc.message} (gave up after {attempts} attempts in {time.monotonic() - t0:.1f} s)"
                    ) from exc
                _sleep(self.config.backoff_s * 2**i)
        raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------------ parsing
def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused: nothing listens there"
    return f"{type(exc).__name__}: {text}"


def _server_message(reply: httpx.Response) -> str:
    """The error text of an OpenAI-style error body ({"error": {"message"}} or {"message"}), else the body."""
    try:
        data = reply.json()
    except ValueError:
        return reply.text[:500] or "empty body"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:1000]
        if isinstance(err, str):
            return err[:1000]
        if data.get("message"):
            return str(data["message"])[:1000]
    return reply.text[:500]


def _json_of(reply: httpx.Response, url: str) -> Any:
    try:
        return reply.json()
    except ValueError as exc:  # also a body cut short by a proxy: worth another attempt
        raise _Retryable(
            f"policy server at {url} returned a body that is not JSON (starts with {reply.text[:200]!r}); "
            "is PolicyConfig.base_url a vLLM OpenAI server?"
        ) from exc


def _int_list(value: Any, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} is not a list of integers")
    return value


def _tool_call(call: Any) -> dict:
    fn = call["function"]
    name, arguments = fn["name"], fn.get("arguments", "")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call has no function name")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": str(call.get("id") or ""), "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def unread_tool_call(content: str, finish_reason: str = "") -> str | None:
    """Why a reply's `<tool_call>` block did not become a tool call; None when the reply holds no such block.

    The hermes parser hands a reply back as plain content when any of its blocks is not JSON of the form
    {"name": ..., "arguments": ...} (a slip such as `\\'` inside a string, or a reply cut at max_tokens). Such a reply
    tried to call a tool, so the harness tells the policy what was wrong rather than taking it for a reply that
    ended the episode. The reason names the first bad block's fault and the text around it, never the markers
    themselves: the template reads them as special tokens, and a student echoing a reason that held them opened a
    new, unreadable block (22 of the 113 unreadable replies of the first fine-tuned student's evaluation)."""
    rest = content
    while (start := rest.find(TOOL_CALL_OPEN)) >= 0:
        rest = rest[start + len(TOOL_CALL_OPEN) :]
        end = rest.find(TOOL_CALL_CLOSE)
        body, rest = (rest[:end], rest[end + len(TOOL_CALL_CLOSE) :]) if end >= 0 else (rest, "")
        if end < 0 and finish_reason == "length":
            return "the reply reached its token limit inside its tool call; write a shorter cell"
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            near = body[max(0, exc.pos - 40) : exc.pos + 20].replace(TOOL_CALL_OPEN, "").replace(TOOL_CALL_CLOSE, "")
            hint = (
                '; a JSON string knows only the escapes \\\\ \\" \\/ \\b \\f \\n \\r \\t \\uXXXX'
                if "escape" in exc.msg
                else ""
            )
            where = f"line {exc.lineno} column {exc.colno}"
            return f"the tool call is not JSON: {exc.msg} at {where}, here: `{near}`{hint}"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
            return 'the tool call is not {"name": "python", "arguments": {"code": "..."}}'
    if TOOL_CALL_OPEN in content:
        return "the server did not read the tool call"
    return None


def unread_feedback(reason: str, budget_line: str) -> str:
    """The user message that answers a reply whose tool call could not be read (`reason`: `unread_tool_call`'s),
    ending with the episode's budget line; the SFT's recovery examples (captain_ros_training.data) show the same
    text."""
    return (
        f"Your tool call could not be read, so nothing ran: {reason}. Reply with one call of the `python` tool holding "
        f"a cell of code.\n{budget_line}"
    )


def _parse_completion(data: Any, model: str, latency_s: float) -> Completion:
    """`data` as a Completion; KeyError, TypeError or ValueError when it is not a chat completion."""
    if not isinstance(data, dict):
        raise TypeError("the reply is not a JSON object")
    choices = data["choices"]
    if not isinstance(choices, list) or not choices:
        raise ValueError("no choices")
    choice = choices[0]
    message = choice["message"]
    if not isinstance(message, dict):
        raise TypeError("choices[0].message is not an object")
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TypeError("message.content is not a string")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise TypeError("message.tool_calls is not a list")
    token_ids = _int_list(choice.get("token_ids"), "choices[0].token_ids")
    logprobs = None
    if choice.get("logprobs") is not None:
        entries = choice["logprobs"]["content"] or []
        logprobs = [float(entry["logprob"]) for entry in entries]
        if token_ids is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} sampled tokens")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise TypeError("usage is not an object")
    return Completion(
        content=content,
        tool_calls=[_tool_call(call) for call in calls],
        finish_reason=str(choice.get("finish_reason") or ""),
        prompt_token_ids=_int_list(data.get("prompt_token_ids"), "prompt_token_ids"),
        token_ids=token_ids,
        logprobs=logprobs,
        model=str(data.get("model") or model),
        usage=usage,
        raw=data,
        latency_s=latency_s,
    )

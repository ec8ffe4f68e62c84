"""The policy client against fake HTTP servers: what it sends, what it parses, and how it fails.

The fake servers run in a thread on 127.0.0.1; a test waits on events and counts requests, never on timing
windows. Backoff sleeps are recorded instead of slept. Short timeouts appear only where the server never
answers.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from captain_ros.agent import policy_client
from captain_ros.agent.policy_client import Completion, PolicyClient, PolicyConfig, PolicyError

MODEL = "tiny-qwen2"
MESSAGES = [{"role": "system", "content": "You control a robot arm."}, {"role": "user", "content": "Pick up the cube."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run one Python cell on the robot API",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]
ARGUMENTS = json.dumps({"code": "obs = robot.observe()"})
VALID = {  # the shape vLLM 0.32 answers with (return_token_ids, logprobs, a parsed hermes tool call)
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": MODEL,
    "prompt_token_ids": [1, 8, 9, 2, 10],
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "I look first.",
                "reasoning": None,
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-7",
                        "type": "function",
                        "function": {"name": "run_python", "arguments": ARGUMENTS},
                    }
                ],
            },
            "logprobs": {
                "content": [
                    {"token": "I", "logprob": -0.5, "bytes": [73], "top_logprobs": []},
                    {"token": " look", "logprob": -1.25, "bytes": [32], "top_logprobs": []},
                    {"token": "<|im_end|>", "logprob": -0.0, "bytes": [], "top_logprobs": []},
                ]
            },
            "finish_reason": "tool_calls",
            "token_ids": [40, 1200, 2],
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
}
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

Reply = Callable[[BaseHTTPRequestHandler], None]


def json_reply(body: object, status: int = 200) -> Reply:
    def reply(handler: BaseHTTPRequestHandler) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return reply


def raw_reply(data: bytes, status: int = 200) -> Reply:
    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return reply


def cut_mid_body(handler: BaseHTTPRequestHandler) -> None:
    """Promise 1,000 bytes, send 13, close the connection: a server that died while answering."""
    handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    handler.wfile.write(b'{"choices": [')
    handler.wfile.flush()
    handler.request.shutdown(socket.SHUT_RDWR)
    handler.close_connection = True


class FakeServer:
    """An HTTP server in a thread. `/v1/models` lists MODEL unless routed; every other request takes the next
    reply of its path's script (the last one repeats). Requests are recorded as (method, path, json body)."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply]] = {"/v1/models": [json_reply(MODELS)]}
        self.requests: list[tuple[str, str, object]] = []
        self.release = threading.Event()  # set at teardown: frees handlers that never answer
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with fake._lock:
                    fake.requests.append((self.command, self.path, body))
                    script = fake.routes.get(self.path) or [json_reply({"error": "no such route"}, 404)]
                    reply = script.pop(0) if len(script) > 1 else script[0]
                reply(self)

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)  # quick shutdown
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def paths(self, method: str | None = None) -> list[str]:
        return [path for m, path, _ in self.requests if method in (None, m)]

    def never_answer(self, handler: BaseHTTPRequestHandler) -> None:
        self.release.wait()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.close()


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Backoff waits, recorded instead of slept."""
    waited: list[float] = []
    monkeypatch.setattr(policy_client, "_sleep", waited.append)
    return waited


def client_for(url: str, **overrides) -> PolicyClient:
    config = PolicyConfig(**{"base_url": url, "max_retries": 3, "backoff_s": 0.5, **overrides})
    return PolicyClient(config)


def closed_port() -> int:
    """A port on loopback that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------------------ success
def test_a_valid_reply_parses_content_tool_calls_token_ids_and_logprobs(server, sleeps):
    server.routes["/v1/chat/completions"] = [json_reply(VALID)]
    with client_for(server.base_url, max_tokens=64, temperature=0.7, seed=3) as client:
        result = client.complete(MESSAGES, TOOLS)
    assert isinstance(result, Completion)
    assert result.content == "I look first."
    assert result.tool_calls == [
        {"id": "chatcmpl-tool-7", "type": "function", "function": {"name": "run_python", "arguments": ARGUMENTS}}
    ]
    assert json.loads(result.tool_calls[0]["function"]["arguments"]) == {"code": "obs = robot.observe()"}
    assert result.finish_reason == "tool_calls"
    assert result.prompt_token_ids == [1, 8, 9, 2, 10]
    assert result.token_ids == [40, 1200, 2]
    assert result.logprobs == [-0.5, -1.25, 0.0]
    assert result.model == MODEL and result.usage["completion_tokens"] == 3
    assert result.raw == VALID and result.latency_s >= 0
    assert sleeps == []


def test_the_request_asks_for_tools_token_ids_and_sampled_logprobs_of_the_only_model(server, sleeps):
    server.routes["/v1/chat/completions"] = [json_reply(VALID)]
    config = {"max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "seed": 3, "extra_body": {"top_k": 20}}
    with client_for(server.base_url, **config) as client:
        client.complete(MESSAGES, TOOLS)
        client.complete(MESSAGES, TOOLS)
    assert server.paths() == ["/v1/models", "/v1/chat/completions", "/v1/chat/completions"], "model looked up once"
    body = server.requests[1][2]
    assert body["model"] == MODEL and body["messages"] == MESSAGES and body["tools"] == TOOLS
    assert body["tool_choice"] == "auto" and body["return_token_ids"] is True
    assert body["logprobs"] is True and body["top_logprobs"] == 0
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (64, 0.7, 0.9, 3)
    assert body["top_k"] == 20, "extra_body is merged into the request"


def test_a_named_model_is_used_without_a_lookup_and_no_tools_sends_no_tool_choice(server, sleeps):
    server.routes["/v1/chat/completions"] = [json_reply(VALID)]
    with client_for(server.base_url, model="other", logprobs=False) as client:
        client.complete(MESSAGES, [])
    assert server.paths() == ["/v1/chat/completions"]
    body = server.requests[0][2]
    assert body["model"] == "other" and "seed" not in body
    assert not {"tools", "tool_choice", "logprobs", "top_logprobs"} & set(body)


def test_a_reply_without_token_ids_or_logprobs_leaves_them_none(server, sleeps):
    reply = json.loads(json.dumps(VALID))
    del reply["prompt_token_ids"]
    choice = reply["choices"][0]
    choice.update(token_ids=None, logprobs=None)
    choice["message"].update(content=None, tool_calls=[])
    server.routes["/v1/chat/completions"] = [json_reply(reply)]
    with client_for(server.base_url) as client:
        result = client.complete(MESSAGES, TOOLS)
    assert (result.prompt_token_ids, result.token_ids, result.logprobs) == (None, None, None)
    assert result.content == "" and result.tool_calls == []


# ------------------------------------------------------------------------------------------------ retries
@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_transient_server_error_is_retried_and_then_succeeds(server, sleeps, status):
    server.routes["/v1/chat/completions"] = [
        json_reply({"error": {"message": "engine busy"}}, status),
        json_reply(VALID),
    ]
    with client_for(server.base_url) as client:
        result = client.complete(MESSAGES, TOOLS)
    assert result.token_ids == [40, 1200, 2]
    assert server.paths("POST") == ["/v1/chat/completions"] * 2
    assert sleeps == [0.5]


def test_server_errors_that_persist_give_up_after_the_retries_with_doubling_backoff(server, sleeps):
    server.routes["/v1/chat/completions"] = [json_reply({"error": {"message": "EngineDeadError"}}, 500)]
    with client_for(server.base_url) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert len(server.paths("POST")) == 4, "one attempt and three retries"
    assert sleeps == [0.5, 1.0, 2.0]
    text = str(err.value)
    assert "HTTP 500" in text and "EngineDeadError" in text and "4 attempts" in text and "log" in text


def test_a_client_error_is_not_retried_and_carries_the_server_message(server, sleeps):
    message = "This model's maximum context length is 2048 tokens. However, you requested 4196 tokens."
    server.routes["/v1/chat/completions"] = [
        json_reply({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)
    ]
    with client_for(server.base_url) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert len(server.paths("POST")) == 1 and sleeps == []
    text = str(err.value)
    assert "HTTP 400" in text and message in text and "retrying would not help" in text


def test_a_server_that_is_down_fails_after_the_retries_with_what_to_do(sleeps):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with client_for(url, model=MODEL) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert sleeps == [0.5, 1.0, 2.0]
    text = str(err.value)
    assert "cannot reach the policy server" in text and "connection refused" in text
    assert "vllm.entrypoints.openai.api_server" in text and "4 attempts" in text


def test_a_server_that_never_answers_times_out_after_the_retries(server, sleeps):
    server.routes["/v1/chat/completions"] = [server.never_answer]
    client = client_for(server.base_url, model=MODEL, request_timeout_s=0.2, max_retries=1)
    with client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert len(server.paths("POST")) == 2 and sleeps == [0.5]
    text = str(err.value)
    assert "timed out" in text and "read timeout of 0.2 s" in text and "request_timeout_s" in text


def test_a_connection_cut_mid_reply_is_retried_then_reported(server, sleeps):
    server.routes["/v1/chat/completions"] = [cut_mid_body]
    with client_for(server.base_url, model=MODEL, max_retries=2) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert len(server.paths("POST")) == 3 and sleeps == [0.5, 1.0]
    assert "cut the connection" in str(err.value) and "3 attempts" in str(err.value)


def test_a_connection_cut_once_is_survived(server, sleeps):
    server.routes["/v1/chat/completions"] = [cut_mid_body, json_reply(VALID)]
    with client_for(server.base_url, model=MODEL) as client:
        assert client.complete(MESSAGES, TOOLS).logprobs == [-0.5, -1.25, 0.0]
    assert len(server.paths("POST")) == 2


# ------------------------------------------------------------------------------------------------ garbage
def test_a_body_that_is_not_json_is_retried_then_reported(server, sleeps):
    server.routes["/v1/chat/completions"] = [raw_reply(b"<html>502 Bad Gateway</html>")]
    with client_for(server.base_url, model=MODEL, max_retries=1) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert len(server.paths("POST")) == 2
    assert "not JSON" in str(err.value) and "Bad Gateway" in str(err.value)


@pytest.mark.parametrize(
    "body",
    [
        {"foo": 1},
        [1, 2, 3],
        {"choices": []},
        {"choices": [{"message": "hi"}]},
        {"choices": [{"message": {"content": 3}}]},
        {"choices": [{"message": {"content": "x", "tool_calls": [{"function": {"arguments": "{}"}}]}}]},
        {"choices": [{"message": {"content": "x"}, "token_ids": ["a"]}]},
        {"choices": [{"message": {"content": "x"}, "token_ids": [1, 2], "logprobs": {"content": [{"logprob": -1}]}}]},
        {"choices": [{"message": {"content": "x"}}], "prompt_token_ids": "1 2 3"},
    ],
    ids=[
        "no-choices",
        "a-list",
        "empty-choices",
        "message-not-object",
        "content-not-text",
        "tool-call-without-name",
        "token-ids-not-ints",
        "logprobs-not-one-per-token",
        "prompt-ids-not-a-list",
    ],
)
def test_json_of_the_wrong_shape_is_reported_without_retry(server, sleeps, body):
    server.routes["/v1/chat/completions"] = [json_reply(body)]
    with client_for(server.base_url, model=MODEL) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert len(server.paths("POST")) == 1 and sleeps == []
    assert "not a chat completion" in str(err.value)


# ------------------------------------------------------------------------------------------------ health
def test_health_returns_the_served_model(server):
    server.routes["/health"] = [raw_reply(b"")]
    with client_for(server.base_url) as client:
        assert client.health() == MODEL
    assert server.paths() == ["/health", "/v1/models"]


def test_health_falls_back_to_the_model_list_on_a_server_without_health(server):
    with client_for(server.base_url) as client:  # /health is not routed: 404
        assert client.health() == MODEL


def test_health_of_a_dead_engine_says_to_read_the_log(server):
    server.routes["/health"] = [raw_reply(b"", 503)]
    with client_for(server.base_url) as client, pytest.raises(PolicyError) as err:
        client.health()
    assert "HTTP 503" in str(err.value) and "log" in str(err.value)


def test_health_of_a_server_that_is_down_says_how_to_start_it(sleeps):
    with client_for(f"http://127.0.0.1:{closed_port()}/v1") as client, pytest.raises(PolicyError) as err:
        client.health()
    assert sleeps == [], "a health check is one try: poll it to wait for a starting server"
    assert "not healthy" in str(err.value) and "connection refused" in str(err.value)
    assert "--tool-call-parser hermes" in str(err.value)


def test_a_model_the_server_does_not_serve_is_named_with_the_ones_it_does(server):
    with client_for(server.base_url, model="qwen-7b") as client, pytest.raises(PolicyError) as err:
        client.health()
    assert "'qwen-7b'" in str(err.value) and MODEL in str(err.value)


def test_a_server_with_several_models_needs_one_named(server, sleeps):
    server.routes["/v1/models"] = [json_reply({"data": [{"id": "a"}, {"id": "b"}]})]
    with client_for(server.base_url) as client, pytest.raises(PolicyError) as err:
        client.complete(MESSAGES, TOOLS)
    assert "serves 2 models" in str(err.value) and "PolicyConfig.model" in str(err.value)
    assert server.paths("POST") == []

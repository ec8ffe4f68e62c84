"""captain_ros_training.hf_serve, the policy server without vLLM: its hermes parser, its vLLM-style message preparation
and its sampler by hand; then the real server on the tiny Qwen2 on CPU, through the stack's own PolicyClient and raw
HTTP: the prompt ids are the trainer's rendering, the logprobs are a plain forward pass's, greedy and seeded sampling
repeat, limits give finish_reason "length" or HTTP 400, concurrent requests are answered each with its own tokens,
and a dead engine answers 500 instead of hanging."""

from __future__ import annotations

import json
import logging
import math
import threading

import httpx
import pytest

from captain_ros.agent.policy_client import PolicyClient, PolicyConfig, PolicyError
from captain_ros.agent.prompt import TOOLS  # the stack's one tool, as every request offers it
from captain_ros_training import hf_serve
from captain_ros_training.cli import hf_serve_cli
from captain_ros_training.gate import render_prompt_ids
from captain_ros_training.hf_serve import SamplingParams, parse_hermes, sample_rows, template_ready

MAX_LEN = 1024  # the test server's --max-model-len
START_LIMIT_S = 300.0  # about 8 s on 2 idle cores
HEAD = [
    {"role": "system", "content": "You control a Franka arm through Python."},
    {"role": "developer", "content": "# TASK.md\nrobot.mark_point(handle, camera, u, v) marks a pixel."},
    {"role": "user", "content": "Put the red cube in the bowl."},
]


def call(code: str, arguments: str | None = None) -> dict:
    args = json.dumps({"code": code}, ensure_ascii=False) if arguments is None else arguments
    return {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": args}}


# the arguments as the server writes them (json.dumps, ensure_ascii=False) and the agent sends them back
HISTORY = [
    *HEAD,
    {"role": "assistant", "content": "Looking first.", "tool_calls": [call("obs = robot.observe()  # café")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
]


# ------------------------------------------------------------------------------------------------ by hand
def test_hermes_blocks_become_tool_calls_with_the_text_before_as_content():
    text = 'I look.\n<tool_call>\n{"name": "python", "arguments": {"code": "x = 1  # é"}}\n</tool_call>'
    content, calls = parse_hermes(text + '\n<tool_call>{"name": "python", "arguments": {}}</tool_call>')
    assert content == "I look.\n"
    assert [c["function"] for c in calls] == [
        {"name": "python", "arguments": '{"code": "x = 1  # é"}'},  # ensure_ascii=False, as vLLM
        {"name": "python", "arguments": "{}"},
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]
    # no text before the first block: content None; an unclosed last block that parses still counts (vLLM)
    content, calls = parse_hermes('<tool_call>\n{"name": "python", "arguments": {"code": "y"}}\n')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"code": "y"}


@pytest.mark.parametrize(
    "text",
    [
        'Thinking.\n<tool_call>\n{"name": "python", "arguments": {"code": "x"}\n</tool_call>',  # a brace short
        '<tool_call>{"name": "python"}</tool_call>',  # no arguments
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["python", {}]</tool_call>',  # not an object
        '<tool_call>{"name": "python", "arguments": {}}</tool_call><tool_call>oops</tool_call>',  # one bad block
    ],
)
def test_a_block_that_does_not_parse_leaves_the_whole_text_as_content(text):
    assert parse_hermes(text) == (text, [])


def test_plain_text_is_content():
    assert parse_hermes("Done.") == ("Done.", [])
    assert parse_hermes("") == ("", [])


def test_tool_call_arguments_reach_the_template_as_dicts_as_vllm_passes_them():
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", '{"code":"a"}'), call("b", "not json")]},
        {"role": "assistant", "content": "x", "tool_calls": [call("c", "[1, 2]")]},
        {"role": "assistant", "content": "y", "tool_calls": []},
    ]
    before = json.dumps(messages)
    out = template_ready(messages)
    assert json.dumps(messages) == before  # the caller's messages are not changed
    assert [c["function"]["arguments"] for c in out[1]["tool_calls"]] == [{"code": "a"}, {}]  # not JSON: {}
    assert out[2]["tool_calls"][0]["function"]["arguments"] == {}  # JSON but not an object: {}
    assert "tool_calls" not in out[3] and out[0] is messages[0]
    with pytest.raises(hf_serve.RequestError):
        template_ready([{"role": "assistant", "tool_calls": ["python"]}])


def test_the_sampler_draws_from_the_processed_distribution_and_reports_its_logprob():
    import torch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 12, generator=g) * 2
    draws = 20000
    rows = logits.expand(draws, -1).contiguous()

    def run(params: SamplingParams, seed: int = 1):
        gen = torch.Generator().manual_seed(seed)
        return sample_rows(rows, [params] * draws, [None] * draws, gen)

    for params in (SamplingParams(0.7), SamplingParams(1.3, top_k=3), SamplingParams(1.0, top_p=0.8)):  # nucleus of 3
        expected = torch.log_softmax(logits[0] / params.temperature, -1)
        if params.top_k:
            expected[expected < expected.topk(params.top_k).values[-1]] = -math.inf
        if params.top_p < 1:
            order = expected.argsort()  # ascending: drop the tail while the mass below stays <= 1 - top_p
            keep = expected.exp()[order].cumsum(0) > 1 - params.top_p
            keep[-1] = True
            expected[order[~keep]] = -math.inf
        expected = torch.log_softmax(expected, -1)
        tokens, logprobs = run(params)
        assert torch.allclose(logprobs, expected[tokens], atol=1e-5)  # the processed distribution's logprob
        frequency = torch.bincount(tokens, minlength=12).float() / draws
        assert torch.allclose(frequency, expected.exp(), atol=0.015), (params, frequency, expected.exp())
        assert torch.equal(run(params)[0], tokens) and not torch.equal(run(params, seed=2)[0], tokens)

    tokens, logprobs = sample_rows(logits, [SamplingParams(0.0, top_k=1, top_p=0.1)], [None], g)
    assert tokens.item() == logits.argmax().item()  # greedy ignores top-k / top-p and reports temperature 1
    assert logprobs.item() == pytest.approx(torch.log_softmax(logits[0], -1).max().item(), abs=1e-6)


def test_a_seeded_row_draws_from_its_own_generator_whatever_its_neighbours():
    import torch

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(1.0, seed=5), SamplingParams(0.9), SamplingParams(0.0)]

    def own(seed: int = 5):
        return torch.Generator().manual_seed(seed)

    first = [sample_rows(logits, params, [own(), None, None], torch.Generator().manual_seed(s))[0] for s in (1, 2)]
    alone = sample_rows(logits[:1], params[:1], [own()], torch.Generator().manual_seed(3))[0]
    assert first[0][0] == first[1][0] == alone[0]  # the seeded row: the same token whatever the server generator
    assert first[0][2] == first[1][2] == logits[2].argmax()


# ------------------------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from captain_ros_training.tiny import tiny_model, tiny_tokenizer

    out = tmp_path_factory.mktemp("hf_serve") / "tiny"
    tiny_model().save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=hf_serve.ENGINES)
def server(folder, request):
    """The server in its own process, on each engine: the slot engine (default) and transformers' continuous
    batching answer every request of these tests the same way."""
    server = hf_serve.start_hf_server(
        folder, folder.parent / f"server-{request.param}.log", device="cpu", dtype="float32", max_model_len=MAX_LEN,
        extra_args=("--engine", request.param),
    )  # fmt: skip
    try:
        server.wait_healthy(START_LIMIT_S)
    except Exception as exc:
        server.stop()
        pytest.fail(f"{exc}\n{server.tail()}")
    except BaseException:  # the test's timeout or an interrupt: the server must not outlive the test
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(folder):
    """The folder's tokenizer and fp32 model in this process, to check the server against."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return tokenizer, model


def forward_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """log p(completion[i] | prompt + completion[:i]) at `temperature`, by one plain forward pass."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


def client(server, **config) -> PolicyClient:
    return PolicyClient(PolicyConfig(base_url=server.base_url, max_retries=0, **config))


def post(server, body) -> httpx.Response:
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    return httpx.post(f"{server.base_url}/chat/completions", content=content, timeout=120.0, trust_env=False)


@pytest.mark.slow
def test_a_folder_given_relative_to_the_callers_directory_serves(folder, monkeypatch):
    """The server runs in its log's folder: a relative --model of the caller's must still name the folder."""
    monkeypatch.chdir(folder.parent)
    server = hf_serve.start_hf_server(
        folder.name, "logs/relative.log", device="cpu", dtype="float32", max_model_len=MAX_LEN
    )
    try:
        server.wait_healthy(START_LIMIT_S)
        with client(server) as policy:
            assert policy.health() == str(folder)
    finally:
        server.stop()


@pytest.mark.slow
def test_health_and_models_name_the_folder(server, folder):
    with client(server) as policy:
        assert policy.health() == str(folder)
    models = httpx.get(f"{server.base_url}/models", trust_env=False).json()
    assert models["object"] == "list"
    assert models["data"] == [{"id": str(folder), "object": "model", "owned_by": "hf_serve", "max_model_len": MAX_LEN,
                               "root": str(folder.resolve())}]  # fmt: skip


@pytest.mark.slow
def test_a_tool_request_is_served_on_the_trainers_rendering_with_forward_pass_logprobs(server, reference):
    tokenizer, model = reference
    with client(server, max_tokens=12, temperature=0.7, seed=11) as policy:
        done = policy.complete(HISTORY, TOOLS)
    rendered = tokenizer.apply_chat_template(
        HISTORY, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert done.prompt_token_ids == list(rendered) == render_prompt_ids(tokenizer, HISTORY, TOOLS)  # the gate's
    assert len(done.token_ids) == len(done.logprobs) == done.usage["completion_tokens"]
    assert done.usage["prompt_tokens"] == len(rendered)
    assert done.finish_reason in {"length", "stop", "tool_calls"}
    if done.finish_reason == "length":
        assert len(done.token_ids) == 12
    expected = forward_logprobs(model, done.prompt_token_ids, done.token_ids, 0.7)
    assert done.logprobs == pytest.approx(expected, abs=2e-4)  # processed logprobs: the T=0.7 distribution
    entries = done.raw["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [tokenizer.decode([t]) for t in done.token_ids]
    with client(server, max_tokens=12, temperature=0.7, seed=11) as policy:
        again = policy.complete(HISTORY, TOOLS)
    assert again.token_ids == done.token_ids  # the same seed, the same sample


@pytest.mark.slow
def test_arguments_not_in_the_servers_own_format_render_as_vllm_renders_them(server, reference):
    tokenizer, _ = reference
    compact = [*HEAD, {"role": "assistant", "content": "", "tool_calls": [call("x", '{"code":"x"}')]}]
    body = {"messages": compact, "tools": TOOLS, "max_tokens": 1, "return_token_ids": True}
    served = post(server, body).json()["prompt_token_ids"]
    as_dict = [*HEAD, {"role": "assistant", "content": "", "tool_calls": [call("x", {"code": "x"})]}]
    assert served == render_prompt_ids(tokenizer, as_dict, TOOLS)  # re-dumped: {"code": "x"}
    assert served != render_prompt_ids(tokenizer, compact, TOOLS)


@pytest.mark.slow
def test_greedy_repeats_takes_the_argmax_and_stops_at_max_tokens(server, reference):
    _, model = reference
    with client(server, max_tokens=6, temperature=0.0) as policy:
        first, second = policy.complete(HEAD, TOOLS), policy.complete(HEAD, TOOLS)
    assert first.token_ids == second.token_ids and first.logprobs == pytest.approx(second.logprobs, abs=1e-5)
    assert first.finish_reason == "length" and len(first.token_ids) == 6
    expected = forward_logprobs(model, first.prompt_token_ids, first.token_ids, 1.0)
    assert first.logprobs == pytest.approx(expected, abs=2e-4)  # greedy reports the temperature-1 logprob
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([first.prompt_token_ids + first.token_ids])).logits[0]
    argmax = logits[len(first.prompt_token_ids) - 1 : -1].argmax(-1).tolist()
    assert first.token_ids == argmax


@pytest.mark.slow
def test_the_context_limit_cuts_the_completion_and_refuses_a_prompt_with_no_room(server, reference):
    tokenizer, _ = reference

    def prompt_of(words: int) -> tuple[list[dict], int]:
        messages = [{"role": "user", "content": "cube " * words}]
        return messages, len(render_prompt_ids(tokenizer, messages, None))

    words = 1
    while prompt_of(words)[1] < MAX_LEN - 40:
        words *= 2
    while prompt_of(words)[1] > MAX_LEN - 5:
        words -= 1
    messages, length = prompt_of(words)
    assert MAX_LEN - 40 <= length <= MAX_LEN - 5
    reply = post(server, {"messages": messages, "max_tokens": 50, "temperature": 0, "return_token_ids": True}).json()
    assert reply["usage"]["completion_tokens"] == MAX_LEN - length
    assert reply["choices"][0]["finish_reason"] == "length"
    too_long, length = prompt_of(words * 2)
    assert length > MAX_LEN
    refused = post(server, {"messages": too_long})
    assert refused.status_code == 400
    assert f"maximum context length is {MAX_LEN} tokens" in refused.json()["error"]["message"]
    with client(server) as policy, pytest.raises(PolicyError, match="rejected the request with HTTP 400"):
        policy.complete(too_long, [])


@pytest.mark.slow
def test_concurrent_requests_each_get_their_own_answer(server, reference):
    """Six episodes' requests at once, sharing a cached prefix: each answer is its own request's forward pass (the
    default varlen attention: each request's new tokens attend to its own cache only)."""
    prompts = [[*HEAD[:2], {"role": "user", "content": f"Task {i}: put cube {i} in bowl {i % 3}."}] for i in range(6)]
    with client(server, max_tokens=8, temperature=0.0) as policy:
        alone = [policy.complete(p, TOOLS) for p in prompts]
    together: list = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def worker(i: int) -> None:
        with client(server, max_tokens=8, temperature=0.0) as policy:
            barrier.wait()
            together[i] = policy.complete(prompts[i], TOOLS)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120.0)
    assert all(not t.is_alive() for t in threads)
    for one, many in zip(alone, together, strict=True):
        assert many.prompt_token_ids == one.prompt_token_ids
        assert many.token_ids == one.token_ids
        assert many.logprobs == pytest.approx(one.logprobs, abs=2e-4)
        expected = forward_logprobs(reference[1], many.prompt_token_ids, many.token_ids, 1.0)
        assert many.logprobs == pytest.approx(expected, abs=2e-4)
    assert len({tuple(c.prompt_token_ids) for c in together}) == len(prompts)


@pytest.mark.slow
def test_transformers_sdpa_attention_serves_the_same_answers(folder, server):
    """--attn-implementation sdpa (transformers' masked attention over the whole batch) against the default."""
    config = hf_serve.ServeConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=256, port=0,
                                  attn_implementation="sdpa")  # fmt: skip
    model, _, eos, _ = hf_serve.load(config)
    assert model.config._attn_implementation == "sdpa"
    engine = hf_serve.Engine(model, eos, config)
    try:
        with client(server, max_tokens=6, temperature=0.0) as policy:
            served = policy.complete(HEAD, TOOLS)
        got = engine.generate(served.prompt_token_ids, 6, hf_serve.SamplingParams(temperature=0.0))
    finally:
        engine.close()
    assert got.token_ids == served.token_ids
    assert got.logprobs == pytest.approx(served.logprobs, abs=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ("{not json", 400, "not JSON"),
        ({"max_tokens": 3}, 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"content": "hi"}]}, 400, "role"),
        ({"messages": HEAD, "stream": True}, 400, "stream"),
        ({"messages": HEAD, "tool_choice": "required", "tools": TOOLS}, 400, "tool_choice"),
        ({"messages": HEAD, "top_logprobs": 2, "logprobs": True}, 400, "top_logprobs"),
        ({"messages": HEAD, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": HEAD, "temperature": -1}, 400, "temperature"),
        ({"messages": HEAD, "top_p": 0}, 400, "top_p"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "chat template"),
        ({"messages": HEAD, "model": "other"}, 404, "does not exist"),
    ],
)
def test_a_bad_request_is_answered_with_an_error_object(server, body, status, says):
    reply = post(server, body)
    assert reply.status_code == status
    assert says in reply.json()["error"]["message"]


@pytest.mark.slow
def test_unknown_routes_are_404(server):
    assert httpx.get(f"{server.root}/v1/completions", trust_env=False).status_code == 404
    assert httpx.post(f"{server.root}/v1/embeddings", content="{}", trust_env=False).status_code == 404


@pytest.fixture(params=hf_serve.ENGINES)
def in_process(folder, request):
    """The engine and HTTP server in this process (the engine's insides reachable), stopped after the test."""
    config = hf_serve.ServeConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=256, port=0,
                                  engine=request.param, kv_cache_tokens=8 * 256)  # fmt: skip
    model, tokenizer, eos, defaults = hf_serve.load(config)
    if request.param == "cb":
        assert model.config._attn_implementation == hf_serve.VARLEN_ATTENTION  # its default
        engine = hf_serve.Engine(model, eos, config)
    else:
        from captain_ros_training.slot_engine import SlotEngine

        engine = SlotEngine(model, eos, config)
    httpd = hf_serve.HFServer(("127.0.0.1", 0), hf_serve.ChatAPI(config.model, tokenizer, engine, 256, defaults))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield engine, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()


@pytest.mark.slow
def test_requests_queued_together_share_forward_passes(in_process, monkeypatch, caplog):
    """Six requests queued while the generation loop is paused: its next step takes them all in one batch."""
    engine, root = in_process
    monkeypatch.setattr(hf_serve, "THROUGHPUT_LOG_S", math.inf)
    replies: list = [None] * 6

    def worker(i: int) -> None:
        # seeded: an unseeded draw of the tiny model can end on its eos token before 5 tokens (seen once in CI)
        body = {"messages": [{"role": "user", "content": f"Put cube {i} in the bowl."}], "max_tokens": 5, "seed": i}
        replies[i] = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=120.0, trust_env=False)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    if isinstance(engine, hf_serve.Engine):  # transformers' manager: count what reaches it while it is paused
        queued = threading.Semaphore(0)
        add_request = engine.manager.add_request

        def counted(*args, **kwargs):
            request_id = add_request(*args, **kwargs)
            queued.release()
            return request_id

        monkeypatch.setattr(engine.manager, "add_request", counted)
        with engine.manager.pause():
            for t in threads:
                t.start()
            assert all(queued.acquire(timeout=60.0) for _ in threads)
    else:
        with engine.pause() as changed:
            for t in threads:
                t.start()
            with changed:
                assert changed.wait_for(lambda: engine.queued() == 6, timeout=60.0)
    for t in threads:
        t.join(timeout=120.0)
    assert [r.status_code for r in replies] == [200] * 6
    assert [r.json()["usage"]["completion_tokens"] for r in replies] == [5] * 6
    assert engine.largest_batch == 6
    with caplog.at_level(logging.INFO, logger="hf_serve"):
        engine._log_throughput(every_s=0.0)  # the dispatcher's own calls never log here (THROUGHPUT_LOG_S: inf)
    assert "sampled 30 tokens" in caplog.text
    assert "6 requests finished, at most 6 requests per forward pass" in caplog.text


@pytest.mark.slow
def test_a_dead_engine_answers_500_and_health_says_so(in_process, monkeypatch):
    """The engine's sampling step made to fail: the waiting request gets 500, not a hang; so do later ones;
    /health answers 500."""
    _, root = in_process
    body = json.dumps({"messages": HEAD[2:], "max_tokens": 4})
    url = f"{root}/v1/chat/completions"
    assert httpx.post(url, content=body, timeout=60.0, trust_env=False).status_code == 200
    assert httpx.get(f"{root}/health", trust_env=False).status_code == 200

    def broken(*_args, **_kwargs):
        raise RuntimeError("injected sampler failure")

    monkeypatch.setattr(hf_serve, "sample_rows", broken)
    reply = httpx.post(url, content=body, timeout=60.0, trust_env=False)
    assert reply.status_code == 500 and "injected sampler failure" in reply.json()["error"]["message"]
    again = httpx.post(url, content=body, timeout=60.0, trust_env=False)
    assert again.status_code == 500 and "engine" in again.json()["error"]["message"]
    health = httpx.get(f"{root}/health", trust_env=False)
    assert health.status_code == 500 and "dead" in health.json()["error"]["message"]


def test_varlen_attention_refuses_what_it_does_not_compute():
    """A scaling other than 1/sqrt(d), a sliding window or dropout: refused with the way out, never computed wrong."""
    import torch

    q = torch.zeros(1, 4, 3, 8)
    kv = torch.zeros(1, 2, 3, 8)
    cu = {"cu_seq_lens_q": torch.tensor([0, 3]), "cu_seq_lens_k": torch.tensor([0, 3]), "max_length_q": 3}
    cu["max_length_k"] = 3
    with pytest.raises(ValueError, match=r"softmax\(q.k / sqrt\(d\)\), this model scales by 0.5"):
        hf_serve.varlen_attention(None, q, kv, kv, None, scaling=0.5, **cu)
    for bad in ({"sliding_window": 4}, {"dropout": 0.1}):
        with pytest.raises(ValueError, match="no sliding window or dropout: serve with --attn-implementation sdpa"):
            hf_serve.varlen_attention(None, q, kv, kv, None, **bad, **cu)
    out, _ = hf_serve.varlen_attention(None, q, kv, kv, None, scaling=8**-0.5, **cu)
    assert out.shape == (1, 3, 4, 8)  # [1, T, H, D], as transformers' flash attention returns


# ------------------------------------------------------------------------------------------------ the slot engine
def test_the_slot_engine_refuses_a_model_it_does_not_compute():
    """A Llama-shaped model (no q/k/v biases, another model type): refused at start with the way out."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from captain_ros_training.slot_engine import SlotEngine

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()  # fmt: skip
    config = hf_serve.ServeConfig(model="llama", device="cpu", max_model_len=128)
    with pytest.raises(RuntimeError, match=r"model type 'llama'.*--engine cb"):
        SlotEngine(model, [0], config)


def test_the_slot_engine_refuses_to_serve_what_its_self_check_rejects(folder, monkeypatch):
    """Its start-up comparison with the transformers forward decides: past the tolerance it does not start."""
    import torch

    from captain_ros_training import slot_engine

    config = hf_serve.ServeConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=128)
    model, _, eos, _ = hf_serve.load(config)
    monkeypatch.setattr(slot_engine, "SELF_CHECK_TOLERANCE", {torch.float32: -1.0})
    with pytest.raises(RuntimeError, match=r"differ from the transformers forward.*--engine cb"):
        slot_engine.SlotEngine(model, eos, config)


@pytest.mark.parametrize(
    "device, graphs",
    [("cpu", False), pytest.param("cuda", True, marks=pytest.mark.gpu, id="cuda-graphs")],
)
def test_the_slot_engine_decodes_each_slot_as_the_forward_pass_of_its_own_request(folder, device, graphs):
    """Prompts of different lengths in scattered slots, decoded together with free slots between them: each row's
    log-probabilities are those of one transformers forward over that request alone; on CUDA also when the steps
    are replayed from CUDA graphs (rows padded to a bucket of 8, lengths to one of 512)."""
    import torch

    from captain_ros_training.slot_engine import SlotEngine

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    config = hf_serve.ServeConfig(model=str(folder), device=device, dtype="float32", max_model_len=256,
                                  kv_cache_tokens=8 * 256, cuda_graphs=graphs)  # fmt: skip
    model, _, eos, _ = hf_serve.load(config)
    engine = SlotEngine(model, eos, config)
    assert (engine._graphs is not None) == graphs
    try:
        gen = torch.Generator().manual_seed(1)
        prompts = {0: 5, 2: 70, 5: 130}  # slot: prompt length (slots 1, 3, 4 free)
        seqs = {s: torch.randint(3, 200, (n + 3,), generator=gen).tolist() for s, n in prompts.items()}
        with torch.inference_mode():
            first = engine.prefill(list(prompts), [seqs[s][: prompts[s]] for s in prompts])
            got = {s: [row] for s, row in zip(prompts, first, strict=True)}
            for t in range(3):
                tokens, positions = torch.zeros(6, dtype=torch.long), torch.zeros(6, dtype=torch.long)
                for s, n in prompts.items():
                    tokens[s], positions[s] = seqs[s][n + t], n + t
                logits = engine.decode(tokens.to(device), positions.to(device))
                for s in prompts:
                    got[s].append(logits[s].clone())  # a graph's output is overwritten by the next step
            for s, n in prompts.items():
                want = model(torch.tensor([seqs[s]], device=device)).logits[0, n - 1 :].float().log_softmax(-1)
                assert torch.stack(got[s]).log_softmax(-1) == pytest.approx(want, abs=1e-4)
    finally:
        engine.close()


def test_decode_graph_buckets_hold_the_step_and_stay_within_the_engine():
    from captain_ros_training.slot_engine import graph_bucket

    assert [graph_bucket(n, 1, 24) for n in (1, 2, 3, 5, 9, 17, 24)] == [1, 2, 4, 8, 16, 24, 24]
    assert [graph_bucket(n, 512, 32768) for n in (64, 512, 576, 20000, 32768)] == [512, 512, 1024, 32768, 32768]
    assert graph_bucket(640, 512, 600) == 640  # never less than the step needs


def test_cuda_graphs_asked_for_on_a_cpu_decode_eagerly_and_say_so(folder, caplog):
    from captain_ros_training.slot_engine import SlotEngine

    config = hf_serve.ServeConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=128,
                                  kv_cache_tokens=2 * 128, cuda_graphs=True)  # fmt: skip
    model, _, eos, _ = hf_serve.load(config)
    with caplog.at_level("INFO", logger="hf_serve"):
        engine = SlotEngine(model, eos, config)
    engine.close()
    assert engine._graphs is None and "--cuda-graphs is for CUDA devices" in caplog.text
    assert "decode eager" in caplog.text
    assert hf_serve_cli.parse_args(["--model", str(folder), "--cuda-graphs"]).cuda_graphs


def test_an_unknown_engine_is_refused_with_the_choices(folder, capsys):
    with pytest.raises(SystemExit):
        hf_serve_cli.parse_args(["--model", str(folder), "--engine", "paged"])
    err = capsys.readouterr().err
    assert "--engine" in err and "'slots'" in err and "'cb'" in err
    with pytest.raises(SystemExit, match="--engine must be one of slots, cb, not 'paged'"):
        hf_serve.load(hf_serve.ServeConfig(model=str(folder), engine="paged", device="cpu"))


# ------------------------------------------------------------------------------------------------ weight reloading
def reload_server(folder, *, weight_reload: bool = True):
    """A slot-engine server in this process on `folder` (a copy the test may overwrite), weight routes on or off."""
    config = hf_serve.ServeConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=MAX_LEN, port=0,
                                  kv_cache_tokens=2 * MAX_LEN, weight_reload=weight_reload)  # fmt: skip
    model, tokenizer, eos, defaults = hf_serve.load(config)
    from captain_ros_training.slot_engine import SlotEngine

    engine = SlotEngine(model, eos, config)
    api = hf_serve.ChatAPI(config.model, tokenizer, engine, MAX_LEN, defaults, weight_reload=weight_reload)
    httpd = hf_serve.HFServer(("127.0.0.1", 0), api)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return engine, httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def test_weight_sync_gives_the_running_server_new_weights_without_a_restart(folder, tmp_path):
    """captain_ros_training.weight_sync, as RL rounds drive vLLM, on this server: after the sync its greedy answer
    has the new model's forward-pass logprobs (not the old one's), the version is the round's, and the same server
    (the same engine object) answers throughout."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from captain_ros_training.weight_sync import WeightSync

    served = tmp_path / "served"
    shutil.copytree(folder, served)
    engine, httpd, root = reload_server(served)
    try:
        old = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()
        new = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()
        with torch.no_grad():
            for i, p in enumerate(new.parameters()):
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
        server = type("S", (), {"base_url": f"{root}/v1"})()
        with client(server, max_tokens=6, temperature=0.0) as policy:
            before = policy.complete(HEAD, TOOLS)
        assert before.logprobs == pytest.approx(forward_logprobs(old, before.prompt_token_ids, before.token_ids, 1.0),
                                                abs=2e-4)  # fmt: skip
        with WeightSync(f"{root}/v1", served) as sync:
            result = sync.sync(new, version=1)
        assert result.weight_version == "1" and result.paused
        assert httpx.get(f"{root}/weight_info", trust_env=False).json() == {"weight_version": "1"}
        with client(server, max_tokens=6, temperature=0.0) as policy:
            after = policy.complete(HEAD, TOOLS)
        expected = forward_logprobs(new, after.prompt_token_ids, after.token_ids, 1.0)
        assert after.logprobs == pytest.approx(expected, abs=2e-4)  # the new weights, through the engine's own layers
        stale = forward_logprobs(old, after.prompt_token_ids, after.token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(after.logprobs, stale, strict=True)) > 1e-2
        assert httpd.server_address[1] == int(root.rsplit(":", 1)[1]) and engine.failure() is None  # not restarted
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()


def test_without_the_flag_the_weight_routes_are_404_and_weight_sync_says_how_to_turn_them_on(folder):
    from captain_ros_training.weight_sync import DevModeMissing, WeightSync

    engine, httpd, root = reload_server(folder, weight_reload=False)
    try:
        answer = httpx.get(f"{root}/weight_info", trust_env=False)
        assert answer.status_code == 404 and "--weight-reload" in answer.json()["error"]["message"]
        with WeightSync(f"{root}/v1", folder) as sync, pytest.raises(DevModeMissing):
            sync.check()
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()


def test_weights_reload_only_while_held_and_only_a_checkpoint_that_fits(folder, tmp_path):
    """Bad input leaves the served weights as they were: a reload outside a hold, a checkpoint with a missing or a
    foreign tensor, a pause mode this server does not do, an RPC other than reload_weights."""
    engine, httpd, root = reload_server(folder)
    try:
        state = {k: v.clone() for k, v in engine.model.state_dict().items()}
        with pytest.raises(hf_serve.EngineError, match="only while paused"):
            engine.reload_weights(state)
        engine.hold(10.0)
        missing = dict(state)
        missing.pop("model.norm.weight")
        with pytest.raises(hf_serve.EngineError, match="missing"):
            engine.reload_weights(missing)
        with pytest.raises(hf_serve.EngineError, match="unexpected"):
            engine.reload_weights({**state, "extra.weight": state["model.norm.weight"]})
        assert engine.reload_weights(state) <= 1e-3  # the same weights: the self-check passes
        engine.resume()
        bad = [("/pause?mode=abort", None, 400), ("/collective_rpc", {"method": "shutdown"}, 400),
               ("/update_weight_version", {"version": 2}, 400)]  # fmt: skip
        for path, body, status in bad:
            assert httpx.post(f"{root}{path}", json=body, trust_env=False).status_code == status, path
        reply = httpx.post(f"{root}/v1/chat/completions", json={"messages": HEAD, "max_tokens": 2}, trust_env=False)
        assert reply.status_code == 200  # resumed: requests are admitted again
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()


def test_a_pause_lets_the_running_request_finish_and_holds_new_ones_until_resumed(folder):
    """vLLM's /pause?mode=wait: no request is decoded with two weight versions. The running one ends before the
    pause returns; one sent during the pause waits in the queue until /resume."""
    engine, httpd, root = reload_server(folder)
    replies: dict[str, httpx.Response] = {}

    def send(name: str, max_tokens: int) -> None:
        body = {"messages": HEAD, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        replies[name] = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=300.0, trust_env=False)

    try:
        first = threading.Thread(target=send, args=("running", 200))
        first.start()
        with engine._cv:  # wait (on the engine's own condition) until it holds a slot
            while not engine._running and "running" not in replies:
                engine._cv.wait(timeout=1.0)
        assert httpx.post(f"{root}/pause?mode=wait", timeout=300.0, trust_env=False).status_code == 200
        assert "running" in replies and replies["running"].status_code == 200  # it ended before the pause returned
        second = threading.Thread(target=send, args=("held", 2))
        second.start()
        with engine._cv:
            while engine.queued() == 0:
                engine._cv.wait(timeout=1.0)
        assert engine.queued() == 1 and "held" not in replies and not engine._running  # queued, not admitted
        assert httpx.post(f"{root}/resume", trust_env=False).status_code == 200
        second.join(timeout=300.0)
        assert replies["held"].status_code == 200
        first.join()
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()

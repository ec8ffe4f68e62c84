"""The recording proxy: what it records, what the client sees, and how it fails.

Fast tests run the proxy in-process against `FakeVllm` (fake_vllm.py), a small upstream that answers the way vLLM
0.32 does (token ids, logprobs and SSE chunks in vLLM's shapes; null fields when not asked), so every upstream
misbehaviour can be produced on demand. The slow test at the end runs the real vLLM server and checks what training
relies on: every recorded prompt_token_ids is the chat template's rendering of the recorded messages. The proxy's
parts have their own tests: test_completions, test_sse, test_images, test_attribution.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
from captain_ros.bridge.proxy import ProxyConfig, start_proxy
from tests.captain_ros.bridge.fake_vllm import (
    DEADLINE_S,
    MODEL,
    PNG_A,
    TOOLS,
    FakeVllm,
    conversation,
    data_url,
    episode_headers,
    model_calls,
    post,
    training_body,
)
from tests.vllm_server import render


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


def test_the_command_line_prints_ready_and_records(http, fake, store_path, reader):
    cmd = [sys.executable, "-m", "captain_ros.cli", "proxy", "--upstream", fake.base_url, "--store", str(store_path)]
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

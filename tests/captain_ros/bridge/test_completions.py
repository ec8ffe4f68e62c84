"""What the recording proxy asks the upstream for and what the client sees (captain_ros.bridge.completions):
the fields training needs are added and hidden again; a reply without them is refused unless allowed."""

from __future__ import annotations

import threading

from captain_ros.agent import expert_server
from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
from captain_ros.bridge.proxy import ProxyConfig, start_proxy
from tests.captain_ros.bridge.fake_vllm import (
    MODEL,
    TOOLS,
    FakeVllm,
    conversation,
    episode_headers,
    model_calls,
    post,
)


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

"""Streamed chat completions through the recording proxy (captain_ros.bridge.sse): passed through unchanged,
recorded like a plain completion, ended with an error event when they cannot be recorded."""

from __future__ import annotations

import json

import pytest

from tests.captain_ros.bridge.fake_vllm import (
    conversation,
    episode_headers,
    model_calls,
    post,
    training_body,
)


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

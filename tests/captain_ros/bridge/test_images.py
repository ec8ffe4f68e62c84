"""Images through the recording proxy (captain_ros.bridge.images): stored once, restored exactly."""

from __future__ import annotations

import hashlib

from tests.captain_ros.bridge.fake_vllm import (
    PNG_A,
    PNG_B,
    conversation,
    data_url,
    episode_headers,
    model_calls,
    post,
    training_body,
)


def test_images_are_stored_once_and_restore_to_the_exact_messages(http, proxy, reader):
    first = conversation()
    second = conversation(turns=3)
    second[-1] = {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": [
            {"type": "text", "text": "after the move:"},
            {"type": "image_url", "image_url": {"url": data_url(PNG_B, "image/jpeg")}},
            {"type": "image_url", "image_url": {"url": data_url(PNG_A), "detail": "high"}},
            # not restorable exactly (an extra part key; base64 with a line break): kept inline
            {"type": "image_url", "image_url": {"url": data_url(PNG_B)}, "uuid": "cam-1"},
            {"type": "image_url", "image_url": {"url": data_url(PNG_B)[:40] + "\n" + data_url(PNG_B)[40:]}},
            {"type": "image_url", "image_url": {"url": "https://example.com/scene.png"}},
            # bytes stored as image/png: the reader would restore this part as image/png, so it stays inline
            {"type": "image_url", "image_url": {"url": data_url(PNG_A, "image/webp")}},
        ],
    }
    for t, messages in enumerate((first, second), start=1):
        assert post(http, proxy, training_body(messages), episode_headers("ep-img", t)).status_code == 200

    r = reader()
    assert r.store.counts()["blobs"] == 2  # PNG_A once (sent three times), PNG_B once
    assert r.store.blob(hashlib.sha256(PNG_B).hexdigest()) == (PNG_B, "image/jpeg")
    calls = model_calls(reader, "ep-img")
    parts = calls[2]["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_ref", "image_ref", *["image_url"] * 4]
    assert r.restore_messages(calls[1]["messages"]) == first
    assert r.restore_messages(calls[2]["messages"]) == second

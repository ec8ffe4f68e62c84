"""Attribution of requests to episodes by the X-Captain-* headers (captain_ros.bridge.attribution)."""

from __future__ import annotations

from captain_ros.bridge.proxy import ProxyConfig, start_proxy
from tests.captain_ros.bridge.fake_vllm import (
    conversation,
    episode_headers,
    model_calls,
    post,
    training_body,
)


def test_requests_without_episode_headers_are_recorded_unattributed_or_refused(http, fake, store_path, reader):
    with start_proxy(ProxyConfig(upstream_url=fake.base_url, store_path=str(store_path))) as loose:
        assert post(http, loose, training_body(conversation())).status_code == 200
        half = post(http, loose, training_body(conversation()), {"X-Captain-Episode": "e"})
        assert half.status_code == 400 and "X-Captain-Request is missing" in half.json()["error"]["message"]
        zero = post(http, loose, training_body(conversation()), episode_headers("e", 0))
        assert zero.status_code == 400 and "integer from 1" in zero.json()["error"]["message"]
    (episode,) = [e["episode_id"] for e in reader().store.episodes()]
    assert episode.startswith("unattributed-")
    assert model_calls(reader, episode)[1]["attributed"] is False
    strict = ProxyConfig(upstream_url=fake.base_url, store_path=str(store_path), require_episode=True)
    with start_proxy(strict) as handle:
        reply = post(http, handle, training_body(conversation()))
        assert reply.status_code == 400 and "--require-episode" in reply.json()["error"]["message"]
    assert len(fake.calls) == 1

"""The shipper (captain_ros.bridge.shipper): a record the receiver refuses for good is parked and the rest
delivered; a trainer on a fresh store is sent again the images it lacks."""

from __future__ import annotations

import random
from pathlib import Path

from captain_ros.bridge.schema import Record
from captain_ros.bridge.services import free_port
from captain_ros.bridge.shipper import Shipper
from captain_ros.bridge.store import EpisodeReader, EpisodeStore
from tests.captain_ros.bridge.transport_helpers import (
    DEADLINE_S,
    ReceiverThread,
    all_records,
    config,
    write_episode,
    write_outbox,
)


def test_shipper_parks_a_conflicting_record_and_delivers_the_rest(tmp_path: Path):
    outbox, inbox = tmp_path / "outbox.sqlite", tmp_path / "inbox.sqlite"
    n = write_outbox(outbox, range(2))
    with EpisodeStore(inbox) as store:  # the trainer already holds a different record under one of these ids
        theirs = all_records(outbox)["ep001/episode_end/0"]
        store.append(Record(theirs.episode_id, theirs.kind, 0, {**theirs.payload, "reward": 0.5}))
    r = ReceiverThread(inbox, config(free_port()))
    try:
        with Shipper(outbox, r.receiver.config) as shipper:
            stats = shipper.ship_until_idle(timeout_s=DEADLINE_S)
    finally:
        r.close()
    assert stats["idle"] and stats["conflict"] == 1 and stats["records_acked"] == n - 1
    assert list(stats["parked_items"]) == ["ep001/episode_end/0"]
    assert "conflict" in stats["parked_items"]["ep001/episode_end/0"]
    with EpisodeStore(outbox) as store:
        assert [rec.id for _, rec, _ in store.unacked()] == ["ep001/episode_end/0"]  # kept, not acknowledged
    with EpisodeStore(inbox) as store:
        assert store.record("ep001", "episode_end").payload["reward"] == 0.5


def test_a_trainer_on_a_fresh_store_is_sent_again_the_images_it_lacks(tmp_path: Path):
    outbox = tmp_path / "outbox.sqlite"
    with EpisodeStore(outbox) as store:  # same seed: epB shows byte-identical images (content-addressed, stored once)
        write_episode(store, "epA", 3, random.Random(7))
    cfg = config(free_port())
    first = ReceiverThread(tmp_path / "inbox1.sqlite", cfg)
    try:
        with Shipper(outbox, cfg) as shipper:
            assert shipper.ship_until_idle(timeout_s=DEADLINE_S)["blobs_acked"] == 4
    finally:
        first.close()

    with EpisodeStore(outbox) as store:
        n = write_episode(store, "epB", 3, random.Random(7))
    second = ReceiverThread(tmp_path / "inbox2.sqlite", cfg)  # the trainer moved to a new, empty store
    try:
        with Shipper(outbox, cfg) as shipper:
            stats = shipper.ship_until_idle(timeout_s=DEADLINE_S)
    finally:
        second.close()
    assert stats["idle"] and stats["records_acked"] == n and stats["parked"] == 0
    assert stats["missing_blob"] >= 1 and stats["blobs_acked"] == 4  # the outbox thought they were delivered
    assert second.receiver.stats()["missing_blob"] == stats["missing_blob"]
    reader = EpisodeReader(tmp_path / "inbox2.sqlite")
    try:
        assert reader.episode_ids() == ["epB"]
        for request in reader.load("epB").requests:
            assert reader.restore_messages(request.model_call["messages"])[1]["content"][1]["type"] == "image_url"
    finally:
        reader.close()

"""The receiver (captain_ros.bridge.receiver): what it refuses and why, duplicates and conflicts, where it binds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from captain_ros.bridge.receiver import Receiver
from captain_ros.bridge.schema import Record, sha256
from captain_ros.bridge.store import EpisodeStore
from captain_ros.bridge.wire import (
    ACK,
    BLOB,
    NACK,
    PROTOCOL,
    RECORD,
    TransportConfig,
    blob_frames,
)
from captain_ros.cli.transport_cli import main
from tests.captain_ros.bridge.transport_helpers import (
    Client,
    ReceiverThread,
    frames_of,
    image,
    start_record,
)


# ------------------------------------------------------------------------------------------------ bad input
def test_malformed_messages_are_refused_with_a_reason_and_never_stored(
    tmp_path: Path, receiver: ReceiverThread, client: Client
):
    good = start_record()
    data, _ = good.encode()
    header = json.loads(frames_of(good)[2])
    bogus = json.dumps({"task": "t"}).encode()
    cases = {
        "wrong frame count": ([PROTOCOL, RECORD, frames_of(good)[2]], "expected 4 frames"),
        "protocol version": ([b"captain/9", RECORD, frames_of(good)[2], data], "protocol"),
        "unknown message kind": ([PROTOCOL, b"frobnicate", frames_of(good)[2], data], "unknown message kind"),
        "header not JSON": ([PROTOCOL, RECORD, b'{"episode_id": "raw0", ', data], "header is not valid JSON"),
        "header not an object": ([PROTOCOL, RECORD, b"[1, 2]", data], "header must be a JSON object"),
        "truncated payload": ([PROTOCOL, RECORD, frames_of(good)[2], data[:-7]], "truncated"),
        "altered payload": ([PROTOCOL, RECORD, frames_of(good)[2], data.replace(b'"t"', b'"x"')], "digest mismatch"),
        "digest mismatch": (
            [PROTOCOL, RECORD, json.dumps({**header, "sha256": sha256(b"other")}).encode(), data],
            "digest mismatch",
        ),
        "payload not JSON": (
            [PROTOCOL, RECORD, json.dumps({**header, "sha256": sha256(b"{oops"), "size": 5}).encode(), b"{oops"],
            "not valid JSON",
        ),
        "unknown record kind": (
            [
                PROTOCOL,
                RECORD,
                json.dumps({**header, "kind": "bogus", "sha256": sha256(bogus), "size": len(bogus)}).encode(),
                bogus,
            ],
            "unknown record kind",
        ),
        "missing field": (
            [PROTOCOL, RECORD, json.dumps({**header, "sha256": sha256(bogus), "size": len(bogus)}).encode(), bogus],
            "missing field 'start_id'",
        ),
        "blob digest mismatch": (
            [PROTOCOL, BLOB, json.dumps({"sha256": sha256(b"a"), "media_type": "image/png", "size": 1}).encode(), b"b"],
            "digest mismatch",
        ),
        "blob truncated": (
            [
                PROTOCOL,
                BLOB,
                json.dumps({"sha256": sha256(b"abc"), "media_type": "image/png", "size": 3}).encode(),
                b"ab",
            ],
            "truncated",
        ),
    }
    for name, (frames, expected) in cases.items():
        kind, body = client.ask(frames)
        assert kind == NACK, name
        assert body["code"] == "malformed", (name, body)
        assert expected in body["reason"], (name, body["reason"])

    stats = receiver.receiver.stats()
    assert stats["malformed"] == len(cases) and stats["records_stored"] == stats["blobs_stored"] == 0
    with EpisodeStore(tmp_path / "inbox.sqlite") as store:
        assert store.counts()["records"] == store.counts()["blobs"] == 0
    assert client.ask(frames_of(good)) == (ACK, {"items": [good.id], "code": "", "reason": "", "missing": []})


def test_replayed_duplicate_is_acked_and_stored_once_and_a_conflict_is_refused(
    tmp_path: Path, receiver: ReceiverThread, client: Client
):
    record = start_record()
    for _ in range(3):
        kind, body = client.ask(frames_of(record))
        assert kind == ACK and body["items"] == [record.id]
    kind, body = client.ask(frames_of(start_record(task="a different task")))  # same id, other content
    assert kind == NACK and body["code"] == "conflict" and "different content" in body["reason"]
    stats = receiver.receiver.stats()
    assert (stats["records_stored"], stats["records_duplicate"], stats["conflict"]) == (1, 2, 1)
    with EpisodeStore(tmp_path / "inbox.sqlite") as store:
        assert store.counts()["records"] == 1
        assert store.record("raw0", "episode_start").payload["task"] == "t"

    png = image(random.Random(0), 100)  # a record whose image has not arrived is refused until it has
    step = Record(
        "raw0",
        "step",
        1,
        {
            "snapshot": {},
            "calls": [],
            "timing": {},
            "costs": {},
            "solved_before": False,
            "images": [{"label": "front", "sha256": sha256(png), "media_type": "image/png"}],
        },
    )
    kind, body = client.ask(frames_of(step))
    assert kind == NACK and body["code"] == "missing_blob" and body["missing"] == [sha256(png)]
    assert client.ask(blob_frames(sha256(png), png, "image/png"))[0] == ACK
    assert client.ask(blob_frames(sha256(png), png, "image/png"))[0] == ACK  # a replayed blob too
    assert client.ask(frames_of(step))[0] == ACK
    assert receiver.receiver.stats()["blobs_duplicate"] == 1


def test_receiver_binds_loopback_unless_remote_is_allowed(tmp_path: Path, capsys):
    with pytest.raises(ValueError, match="allow-remote"):
        Receiver(tmp_path / "a.sqlite", TransportConfig(endpoint="tcp://0.0.0.0:5557"))
    Receiver(tmp_path / "a.sqlite", TransportConfig(endpoint="tcp://0.0.0.0:5557", allow_remote=True)).close()
    assert main(["receive", "--store", str(tmp_path / "a.sqlite"), "--bind", "tcp://0.0.0.0:5557"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["receive", "--store", str(tmp_path / "a.sqlite"), "--bind", "udp://x"]) == 2
    assert "is not tcp://HOST:PORT" in capsys.readouterr().err

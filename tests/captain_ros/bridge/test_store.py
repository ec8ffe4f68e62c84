"""The episode store: crash safety under kill -9, duplicates and conflicts, schema checks, the reader."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from captain_ros.bridge.schema import Record, SchemaError, from_wire, record_id
from captain_ros.bridge.store import EpisodeReader, EpisodeStore, RecordConflict, StoreError

START = {"task": "put_red_cube_in_bowl", "start_id": "s/1", "attempt": 0, "group_id": "g", "policy_version": 3,
         "worker": "w1"}  # fmt: skip


def _step(t: int, solved: bool = False) -> Record:
    payload = {
        "snapshot": {"features": {"ee_x_m": 0.1 * t}, "success": solved},
        "calls": [{"capability": "observe", "success": True, "receipt": f"observe #{t}"}],
        "timing": {"total_s": 1.0},
        "costs": {"total": 0.0},
        "solved_before": solved,
    }
    return Record("ep", "step", t, payload)


def _end(valid: bool = True) -> Record:
    return Record("ep", "episode_end", 0, {"outcome": "success", "reward": 1.0, "valid": valid, "requests": 2,
                                           "actions": 3, "reason": "finish() accepted"})  # fmt: skip


def test_records_are_stored_once_and_read_back_verified(tmp_path):
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        assert store.append(Record("ep", "episode_start", 0, START))
        assert store.append(_step(1)) and store.append(_step(2, solved=True))
        assert not store.append(_step(1))  # an exact duplicate: acknowledged, not stored again
        assert store.episodes()[0]["status"] == "open"
        assert store.append(_end())
        assert store.counts() == {"records": 4, "blobs": 0, "episodes": 1, "complete": 1}
    reader = EpisodeReader(tmp_path / "s.sqlite")
    assert reader.episode_ids() == ["ep"]
    episode = reader.load("ep")
    assert [r.index for r in episode.requests] == [1, 2]
    assert [r.post_success for r in episode.requests] == [False, True]
    assert episode.start["policy_version"] == 3 and episode.valid and episode.complete


def test_a_conflicting_record_is_refused_and_the_stored_one_kept(tmp_path):
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        store.append(_step(1))
        changed = Record("ep", "step", 1, {**_step(1).payload, "solved_before": True})
        with pytest.raises(RecordConflict, match="ep/step/1 already stored with different content"):
            store.append(changed)
        assert store.record("ep", "step", 1).payload["solved_before"] is False


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (Record("ep", "stepp", 1, {}), "unknown record kind"),
        (Record("ep", "step", 0, _step(1).payload), "request number, from 1"),
        (Record("e/p", "step", 1, _step(1).payload), "without '/'"),
        (Record("ep", "step", 1, {"calls": []}), "missing field 'snapshot'"),
        (Record("ep", "episode_end", 0, {**_end().payload, "reward": float("nan")}), "not finite"),
        (Record("ep", "episode_end", 0, {**_end().payload, "valid": "yes"}), "'valid' has type str"),
        (Record("ep", "episode_start", 0, {**START, "attempt": True}), "'attempt' has type bool"),
    ],
)
def test_malformed_records_are_refused_with_a_reason(tmp_path, record, message):
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        with pytest.raises(SchemaError, match=message):
            store.append(record)
        assert store.counts()["records"] == 0


def test_the_wire_form_checks_the_digest():
    _, digest = _step(1).encode()
    envelope = {"episode_id": "ep", "kind": "step", "index": 1, "payload": _step(1).payload, "sha256": digest}
    assert from_wire(envelope)[0] == _step(1)
    with pytest.raises(SchemaError, match="digest mismatch"):
        from_wire({**envelope, "payload": {**_step(1).payload, "solved_before": True}})
    with pytest.raises(SchemaError, match="missing 'sha256'"):
        from_wire({k: v for k, v in envelope.items() if k != "sha256"})


def test_images_are_stored_once_and_messages_restored_exactly(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        first, second = store.put_blob(png, "image/png"), store.put_blob(png, "image/png")
        assert first == second and store.counts()["blobs"] == 1
        with pytest.raises(SchemaError, match="blob digest mismatch"):
            store.put_blob(png + b"x", "image/png", digest=first)
    reader = EpisodeReader(tmp_path / "s.sqlite")
    text = {"type": "text", "text": "look"}
    stored = [{"role": "user", "content": [text, {"type": "image_ref", "sha256": first, "media_type": "image/png"}]}]
    sent = [{"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": url}}]}]
    assert reader.restore_messages(stored) == sent


def test_an_abandoned_episode_is_complete_invalid_and_says_why(tmp_path):
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        store.append(Record("ep", "episode_start", 0, START))
        store.append(_step(1))
        assert store.abandon("ep", "worker w1 died (exit code -9)")
        assert not store.abandon("ep", "twice")
        row = store.episodes()[0]
        assert (row["status"], row["valid"], row["outcome"]) == ("complete", 0, "infrastructure_failure")
        assert "worker w1 died" in store.record("ep", "episode_end").payload["reason"]
    assert EpisodeReader(tmp_path / "s.sqlite").episode_ids() == []  # the trainer never sees it


def test_another_schema_version_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    EpisodeStore(path).close()
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        EpisodeStore(path)


WRITER = textwrap.dedent(
    """
    import sys
    from captain_ros.bridge.schema import Record
    from captain_ros.bridge.store import EpisodeStore
    store = EpisodeStore(sys.argv[1])
    store.append(Record("ep", "episode_start", 0, {"task": "t", "start_id": "s", "attempt": 0, "group_id": "g",
                                                  "policy_version": 0, "worker": "w"}))
    for t in range(1, 100000):
        payload = {"snapshot": {"x": [t] * 500}, "calls": [], "timing": {}, "costs": {}, "solved_before": False}
        store.append(Record("ep", "step", t, payload))
        print(t, flush=True)  # acknowledged: the transaction committed
    """
)


@pytest.mark.parametrize("kill_after", [1, 9, 40])
def test_kill_9_mid_write_leaves_every_acknowledged_record_and_the_episode_open(tmp_path, kill_after):
    path = tmp_path / "s.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    acknowledged = []
    try:
        for line in proc.stdout:
            acknowledged.append(int(line))
            if len(acknowledged) == kill_after:
                os.kill(proc.pid, signal.SIGKILL)  # the writer is somewhere inside its next append
                break
    finally:
        proc.kill()
        proc.wait()
    with EpisodeStore(path) as store:
        stored = store.record_ids("ep", "step")
        assert set(acknowledged) <= stored  # nothing acknowledged is lost
        # a prefix without holes: whatever committed after the last line this test read (the writer runs on while
        # its lines wait in the pipe) is whole, and nothing half-written is there
        assert stored == set(range(1, max(stored) + 1))
        for t in stored:
            assert store.record("ep", "step", t).payload["snapshot"]["x"] == [t] * 500  # digest verified
        assert store.episodes()[0]["status"] == "open"  # incomplete: no episode_end
        assert record_id("ep", "step", 1) == "ep/step/1"

"""The transport under faults, end to end through its command line: real processes, real sockets, real SQLite
stores.

Each test builds episodes the way the rollout host writes them (episode_start, model_call with image_ref parts
whose blobs are in the store, step with its images, episode_end), ships them, and checks the trainer-side store
record by record. Waits are on conditions (the receiver's store holds N records), never on timing windows.
The shipper's and the receiver's own cases are in test_shipper.py and test_receiver.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from captain_ros.bridge.services import free_port
from captain_ros.bridge.shipper import Shipper
from captain_ros.bridge.store import EpisodeStore
from tests.captain_ros.bridge.transport_helpers import (
    DEADLINE_S,
    Processes,
    ReceiverThread,
    ShipperThread,
    all_records,
    assert_delivered_exactly_once,
    config,
    record_count,
    unacked,
    wait_until,
    write_outbox,
)


# ------------------------------------------------------------------------------------------------ streaming
def test_streams_episodes_with_their_images_exactly_once(tmp_path: Path, procs: Processes):
    outbox, inbox = tmp_path / "outbox.sqlite", tmp_path / "inbox.sqlite"
    n = write_outbox(outbox, range(12))
    assert n == 264
    port = free_port()
    recv = procs.transport("receiver", "receive", "--store", str(inbox), "--bind", f"tcp://127.0.0.1:{port}")

    with Shipper(outbox, config(port)) as shipper:
        stats = shipper.ship_until_idle(timeout_s=DEADLINE_S)

    assert stats["idle"], stats
    assert stats["records_acked"] == n
    assert stats["blobs_acked"] == 12 * 11  # each image once, though model_call t+1 and step t both reference it
    assert stats["nacks"] == 0 and stats["parked"] == 0
    assert unacked(outbox) == 0
    assert_delivered_exactly_once(outbox, inbox)
    summary = procs.stop(recv)
    assert summary["records_stored"] == n and summary["blobs_stored"] == 12 * 11
    assert summary["malformed"] == 0 and summary["records_duplicate"] == 0
    assert "receiving on tcp://127.0.0.1" in procs.stderr(recv)

    # a shipper started again finds nothing to resend, and stops cleanly on SIGTERM
    again = procs.transport("shipper", "ship", "--store", str(outbox), "--connect", f"tcp://127.0.0.1:{port}")
    wait_until(lambda: "shipping" in procs.stderr(again), "the shipper started")
    summary = procs.stop(again)
    assert summary["sent"] == 0 and summary["records_acked"] == 0 and summary["in_flight"] == 0


def test_receiver_killed_mid_stream_loses_and_duplicates_nothing(tmp_path: Path, procs: Processes):
    outbox, inbox = tmp_path / "outbox.sqlite", tmp_path / "inbox.sqlite"
    n = write_outbox(outbox, range(8))
    port = free_port()
    bind = ["receive", "--store", str(inbox), "--bind", f"tcp://127.0.0.1:{port}"]
    first = procs.transport("receiver1", *bind)
    shipper = ShipperThread(outbox, config(port, window=4))
    count = record_count(inbox)
    try:
        wait_until(lambda: count() >= 40, "the receiver stored 40 records")
        os.kill(first.pid, signal.SIGSTOP)  # frozen: whatever the shipper sends now stays unacknowledged
        n += write_outbox(outbox, range(8, 12))  # and there is more to send
        wait_until(lambda: shipper.shipper.stats()["in_flight"] > 0, "the shipper has messages in flight")
        procs.kill9(first)  # kill -9 with messages in flight
        stored_before_kill = count()
        wait_until(lambda: shipper.shipper.stats()["disconnects"] >= 1, "the shipper noticed the receiver is gone")

        second = procs.transport("receiver2", *bind)  # same store, same port
        wait_until(lambda: count() == n, f"all {n} records arrived")
        wait_until(lambda: unacked(outbox) == 0, "the outbox is fully acknowledged")
        stats = shipper.close()
    finally:
        count.close()
        if shipper.thread.is_alive():
            shipper.close()

    assert 40 <= stored_before_kill < n
    assert stats["connects"] >= 2 and stats["records_acked"] == n and stats["parked"] == 0
    assert_delivered_exactly_once(outbox, inbox)
    summary = procs.stop(second)
    assert summary["records_stored"] + stored_before_kill == n  # none stored twice
    assert summary["malformed"] == summary["conflict"] == 0


def test_shipper_killed_mid_stream_resends_only_what_was_not_acknowledged(
    tmp_path: Path, procs: Processes, receiver: ReceiverThread
):
    outbox, inbox = tmp_path / "outbox.sqlite", tmp_path / "inbox.sqlite"
    n = write_outbox(outbox, range(8))
    endpoint = receiver.receiver.endpoint
    first = procs.transport("shipper1", "ship", "--store", str(outbox), "--connect", endpoint, "--window", "4")
    count = record_count(inbox)
    lock = sqlite3.connect(inbox, timeout=DEADLINE_S, isolation_level=None)
    try:
        wait_until(lambda: count() >= 40, "the receiver stored 40 records")
        # Stall the trainer's disk (hold its write lock) so that the receiver sits on a message it has not
        # yet stored or acknowledged, then kill -9 the shipper: that message is in flight for certain.
        lock.execute("BEGIN IMMEDIATE")
        n += write_outbox(outbox, range(8, 12))  # more to send, so the receiver does get another message
        progress = receiver.receiver.stats
        wait_until(lambda: progress()["messages"] > progress()["answered"], "the receiver is stuck on a message")
        procs.kill9(first)
        lock.execute("ROLLBACK")  # the disk is back; the dead shipper never hears about that message
        with EpisodeStore(outbox) as store:
            acked = [rid for rid in all_records(outbox) if store.is_acked(rid)]
        assert set(acked) <= set(all_records(inbox))  # all the outbox counts as delivered is on the trainer's disk
        assert len(acked) < n

        second = procs.transport(
            "shipper2", "ship", "--store", str(outbox), "--connect", endpoint, "--until-idle", "--timeout-s", "120"
        )
        assert second.wait(DEADLINE_S) == 0, procs.stderr(second)
        assert count() == n
    finally:
        lock.close()
        count.close()

    summary = json.loads((tmp_path / "shipper2.out").read_text())
    assert summary["idle"] and summary["records_acked"] == n - len(acked)  # acknowledged ones are not resent
    assert unacked(outbox) == 0
    assert_delivered_exactly_once(outbox, inbox)
    stats = receiver.receiver.stats()
    assert stats["records_stored"] == n
    # the message stored while the shipper was dead came again from the restarted shipper: acked, not stored
    assert stats["records_duplicate"] + stats["blobs_duplicate"] >= 1
    assert stats["malformed"] == stats["conflict"] == 0


# ------------------------------------------------------------------------------------------------ disk quota
QUOTA_SCRIPT = """
set -e
mount -t tmpfs -o size=8m tmpfs "$1"
head -c 7800000 /dev/zero > "$1/ballast"
"$2" -m captain_ros.cli transport receive --store "$1/inbox.sqlite" --bind "$3" \
    > "$4/receiver.out" 2> "$4/receiver.err" &
pid=$!
until [ -e "$4/free" ]; do sleep 0.02; done
rm "$1/ballast"
until [ -e "$4/stop" ]; do sleep 0.02; done
kill -TERM $pid
wait $pid
cp "$1"/inbox.sqlite* "$4/"
"""


def can_mount_tmpfs(directory: Path) -> bool:
    """Whether an unprivileged user namespace may mount a tmpfs here (a disk with a quota, without root)."""
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs '{directory}'"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_full_trainer_disk_is_refused_kept_and_delivered_once_space_is_freed(tmp_path: Path, procs: Processes, caplog):
    outbox, quota, out = tmp_path / "outbox.sqlite", tmp_path / "quota", tmp_path / "out"
    quota.mkdir()
    if not can_mount_tmpfs(quota):
        pytest.skip("unprivileged user namespaces are unavailable, so a small tmpfs cannot be mounted")
    out.mkdir()
    n = write_outbox(outbox, range(6), requests=6, image_bytes=30_000)  # ~1.3 MB of images, ~0.5 MB free
    port = free_port()
    wrapper = procs.start(
        "quota",
        [
            "unshare",
            "-Urm",
            "sh",
            "-c",
            QUOTA_SCRIPT,
            "sh",
            str(quota),
            sys.executable,
            f"tcp://127.0.0.1:{port}",
            str(out),
        ],
    )
    shipper = ShipperThread(outbox, config(port))
    try:
        wait_until(lambda: shipper.shipper.stats()["store_full"] >= 1, "the receiver refused a message: store full")
        stats = shipper.shipper.stats()
        refused = stats["last_nack_by_code"]["store_full"]
        assert refused["code"] == "store_full" and "full" in refused["reason"], refused
        with EpisodeStore(outbox) as store:
            assert not store.is_acked(refused["item"])  # the refused item is kept for a retry
        wait_until(lambda: unacked(outbox) < n, "what did fit is acknowledged")
        assert unacked(outbox) > 0
        assert stats["parked"] == 0
        assert any("store_full" in r.message and "Kept in the outbox" in r.message for r in caplog.records)

        (out / "free").touch()  # space comes back: the retries get through, nothing is resent from scratch
        wait_until(lambda: unacked(outbox) == 0, "everything was delivered after the disk was freed")
        stats = shipper.close()
    finally:
        if shipper.thread.is_alive():
            shipper.close()
        (out / "stop").touch()
    assert wrapper.wait(DEADLINE_S) == 0, (out / "receiver.err").read_text()

    assert stats["records_acked"] == n and stats["parked"] == 0
    summary = json.loads((out / "receiver.out").read_text())
    assert summary["store_full"] >= 1 and summary["records_stored"] == n
    assert "is full" in (out / "receiver.err").read_text()
    assert_delivered_exactly_once(outbox, out / "inbox.sqlite")

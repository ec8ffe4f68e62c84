"""The transport under faults: real processes, real sockets, real SQLite stores.

Each test builds episodes the way the rollout host writes them (episode_start, model_call with image_ref parts
whose blobs are in the store, step with its images, episode_end), ships them, and checks the trainer-side store
record by record. Waits are on conditions (the receiver's store holds N records), never on timing windows.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from captain_ros.bridge.schema import Record, sha256
from captain_ros.bridge.services import free_port
from captain_ros.bridge.store import EpisodeReader, EpisodeStore
from captain_ros.bridge.transport import (
    ACK,
    BLOB,
    NACK,
    PROTOCOL,
    RECORD,
    Receiver,
    Shipper,
    TransportConfig,
    blob_frames,
    main,
    record_frames,
)

DEADLINE_S = 120.0


# ------------------------------------------------------------------------------------------------ episodes
def image(rng: random.Random, size: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + rng.randbytes(size)


def write_episode(store: EpisodeStore, eid: str, requests: int, rng: random.Random, image_bytes: int = 4000) -> int:
    """One episode as the proxy and the rollout worker write it; returns how many records it has."""
    start = {
        "task": "put the red cube in the bowl",
        "family": "pick_place",
        "start_id": f"s{rng.randrange(100)}",
        "split": "train",
        "attempt": 0,
        "group_id": f"g-{eid}",
        "policy_version": 3,
        "policy": "expert",
        "worker": "w0",
        "host": "rollout-0",
        "instruction": "Put the red cube in the bowl.",
        "budgets": {"requests": 12, "physical_actions": 30, "wall_time_s": 600.0},
    }
    store.append(Record(eid, "episode_start", 0, start))
    shown = store.put_blob(image(rng, image_bytes), "image/png")
    for t in range(1, requests + 1):
        tokens = [rng.randrange(50_000) for _ in range(24)]
        call = {
            "messages": [
                {"role": "system", "content": "You control a robot arm through Python."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"Request {t}: the scene now."},
                        {"type": "image_ref", "sha256": shown, "media_type": "image/png"},
                    ],
                },
            ],
            "tools": [{"type": "function", "function": {"name": "run_code", "parameters": {"type": "object"}}}],
            "sampling": {"model": "policy", "temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "seed": t},
            "prompt_token_ids": [rng.randrange(50_000) for _ in range(64)],
            "token_ids": tokens,
            "logprobs": [-rng.random() for _ in tokens],
            "response": {"content": "pick('red_cube')", "tool_calls": [], "finish_reason": "stop", "model": "policy"},
            "policy_version": 3,
            "timing": {"received_unix_s": 1.7e9 + t, "upstream_s": 0.2, "total_s": 0.21, "proxy_s": 0.01},
            "status": "ok",
        }
        store.append(Record(eid, "model_call", t, call))
        shown = store.put_blob(image(rng, image_bytes), "image/png")
        step = {
            "snapshot": {
                "sim_time_s": 0.5 * t,
                "features": {f"f{i}": rng.random() for i in range(36)},
                "object_poses": {"red_cube": {"position_m": [0.4, 0.0, 0.02], "quat_wxyz": [1.0, 0.0, 0.0, 0.0]}},
                "joint_positions": {f"joint{i}": rng.random() for i in range(7)},
                "goals_satisfied": [t == requests],
                "success": t == requests,
                "subgoals_reached": [],
                "robot": {
                    "arm_joint_names": [f"joint{i}" for i in range(7)],
                    "arm_q_rad": [0.0] * 7,
                    "jaw_opening_m": 0.04,
                },
            },
            "calls": [{"capability": "pick", "arguments": {"object": "red_cube"}, "success": True, "executed": True}],
            "images": [{"label": "front", "sha256": shown, "media_type": "image/png"}],
            "timing": {"started_unix_s": 1.7e9 + t, "total_s": 1.0, "generation_s": 0.2, "physical_s": 0.7},
            "costs": {"excess_actions": 0, "failed_actions": 0, "post_success": 0, "total": 0},
            "solved_before": False,
        }
        store.append(Record(eid, "step", t, step))
    end = {
        "outcome": "success",
        "host_success": True,
        "finished": True,
        "requests": requests,
        "actions": requests,
        "wall_time_s": 12.0,
        "reason": "finished",
        "reward": 1.0,
        "valid": True,
    }
    store.append(Record(eid, "episode_end", 0, end))
    return 2 + 2 * requests


def write_outbox(path: Path, episodes: range, requests: int = 10, image_bytes: int = 4000) -> int:
    with EpisodeStore(path) as store:
        return sum(write_episode(store, f"ep{i:03d}", requests, random.Random(i), image_bytes) for i in episodes)


def all_records(path: Path) -> dict[str, Record]:
    with EpisodeStore(path) as store:
        return {r.id: r for row in store.episodes() for r in store.records(row["episode_id"])}


def assert_delivered_exactly_once(outbox: Path, inbox: Path) -> None:
    sent, got = all_records(outbox), all_records(inbox)
    assert sorted(got) == sorted(sent)
    assert all(got[rid].payload == sent[rid].payload for rid in sent)
    with EpisodeStore(inbox) as store:
        assert store.counts()["records"] == len(sent)  # ids are unique keys; this counts rows, not ids
    reader = EpisodeReader(inbox)
    try:
        for eid in reader.episode_ids():  # every image the trainer needs is there
            for request in reader.load(eid).requests:
                restored = reader.restore_messages(request.model_call["messages"])
                assert restored[1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
                for img in request.step["images"]:
                    assert reader.store.has_blob(img["sha256"])
    finally:
        reader.close()


def unacked(outbox: Path) -> int:
    with EpisodeStore(outbox) as store:
        return len(store.unacked(limit=1_000_000))


# ------------------------------------------------------------------------------------------------ helpers
def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting until {what}")
        time.sleep(0.01)


def record_count(path: Path) -> Callable[[], int]:
    store = EpisodeStore(path)  # one reader connection, kept open while polling

    def count() -> int:
        return store.counts()["records"]

    count.close = store.close  # type: ignore[attr-defined]
    return count


def config(port: int, **overrides) -> TransportConfig:
    fast = {"ack_timeout_s": 2.0, "backoff_initial_s": 0.1, "backoff_max_s": 1.0, "poll_interval_s": 0.05}
    return TransportConfig(endpoint=f"tcp://127.0.0.1:{port}", **{**fast, **overrides})


class Processes:
    """Child processes started by a test, each in its own session so the whole group can be killed."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        out, err = (open(self.tmp / f"{name}.{s}", "w") for s in ("out", "err"))  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True)
        proc.name, proc.files = name, (out, err)  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def transport(self, name: str, *args: str) -> subprocess.Popen:
        return self.start(name, [sys.executable, "-m", "captain_ros.bridge.transport", *args])

    def kill9(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)

    def stop(self, proc: subprocess.Popen) -> dict:
        """SIGTERM, wait for a clean exit, return the JSON summary it printed."""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, self.stderr(proc)
        return json.loads((self.tmp / f"{proc.name}.out").read_text().strip().splitlines()[-1])  # type: ignore[attr-defined]

    def stderr(self, proc: subprocess.Popen) -> str:
        return (self.tmp / f"{proc.name}.err").read_text()  # type: ignore[attr-defined]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(60)
            for f in proc.files:  # type: ignore[attr-defined]
                f.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.close()


class ShipperThread:
    """A Shipper running `run(stop)` in a thread of the test process (its stats readable while it runs)."""

    def __init__(self, outbox: Path, cfg: TransportConfig):
        self.shipper = Shipper(outbox, cfg)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.shipper.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> dict:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.shipper.close()
        return self.shipper.stats()


class ReceiverThread:
    def __init__(self, inbox: Path, cfg: TransportConfig):
        self.receiver = Receiver(inbox, cfg)
        self.stop, ready = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.receiver.serve, args=(self.stop, ready), daemon=True)
        self.thread.start()
        assert ready.wait(60), "the receiver did not bind"

    def close(self) -> dict:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.receiver.close()
        return self.receiver.stats()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[ReceiverThread]:
    r = ReceiverThread(tmp_path / "inbox.sqlite", config(free_port()))
    try:
        yield r
    finally:
        r.close()


class Client:
    """A bare DEALER speaking the wire protocol, for sending what a real shipper never would."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def ask(self, frames: list[bytes]) -> tuple[bytes, dict]:
        self.sock.send_multipart(frames)
        assert self.sock.poll(int(DEADLINE_S * 1000)), "no reply from the receiver"
        version, kind, body = self.sock.recv_multipart()
        assert version == PROTOCOL
        return kind, json.loads(body)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def client(receiver: ReceiverThread) -> Iterator[Client]:
    c = Client(receiver.receiver.endpoint)
    try:
        yield c
    finally:
        c.close()


def start_record(eid: str = "raw0", **extra) -> Record:
    payload = {"task": "t", "start_id": "s0", "attempt": 0, "group_id": "g", "policy_version": 0, "worker": "w0"}
    return Record(eid, "episode_start", 0, {**payload, **extra})


def frames_of(record: Record) -> list[bytes]:
    data, digest = record.encode()
    return record_frames(record, data, digest)


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
"$2" -m captain_ros.bridge.transport receive --store "$1/inbox.sqlite" --bind "$3" \
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


def test_receiver_binds_loopback_unless_remote_is_allowed(tmp_path: Path, capsys):
    with pytest.raises(ValueError, match="allow-remote"):
        Receiver(tmp_path / "a.sqlite", TransportConfig(endpoint="tcp://0.0.0.0:5557"))
    Receiver(tmp_path / "a.sqlite", TransportConfig(endpoint="tcp://0.0.0.0:5557", allow_remote=True)).close()
    assert main(["receive", "--store", str(tmp_path / "a.sqlite"), "--bind", "tcp://0.0.0.0:5557"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["receive", "--store", str(tmp_path / "a.sqlite"), "--bind", "udp://x"]) == 2
    assert "is not tcp://HOST:PORT" in capsys.readouterr().err


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

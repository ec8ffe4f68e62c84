"""The transport tests' episodes and peers: outboxes written the way the rollout host writes them, a shipper and a
receiver in threads of the test process, transport processes started and killed by a test, and a bare client
speaking the wire protocol. The fixtures that start them are in conftest.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from captain_ros.bridge.receiver import Receiver
from captain_ros.bridge.schema import Record
from captain_ros.bridge.shipper import Shipper
from captain_ros.bridge.store import EpisodeReader, EpisodeStore
from captain_ros.bridge.wire import (
    PROTOCOL,
    TransportConfig,
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
        return self.start(name, [sys.executable, "-m", "captain_ros.cli", "transport", *args])

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


def start_record(eid: str = "raw0", **extra) -> Record:
    payload = {"task": "t", "start_id": "s0", "attempt": 0, "group_id": "g", "policy_version": 0, "worker": "w0"}
    return Record(eid, "episode_start", 0, {**payload, **extra})


def frames_of(record: Record) -> list[bytes]:
    data, digest = record.encode()
    return record_frames(record, data, digest)

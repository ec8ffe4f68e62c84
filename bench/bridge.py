"""The sim bridge (issue 11): recorded rollouts, transport throughput, and loss under kill -9.

Three phases, all on this machine:

  1. a clean rollout: the scripted expert behind the recording proxy, N twin workers, every request's
     model call and privileged snapshot stored, the store streamed over pyzmq to a local trainer-side
     receiver.
       episodes_per_hour_per_core   episodes / hour / CPU core of this machine
       recording_overhead_share     (proxy's own time + the recorder's snapshots and durable writes) /
                                    request time; target <= 0.02. With the expert, requests are short
                                    (no generation), so this is an upper bound of the share under an LLM.
  2. transport throughput: shipper -> receiver over loopback TCP, both stores on disk, realistic records.
       zmq_records_per_s, zmq_mb_per_s
  3. the same pipeline for several hundred episodes while 20 kill -9 injections hit a random rollout worker
     (its twin runs in it), the proxy, the shipper or the receiver, each at a random point of the rollout
     (triggered by episode completions, never by a timer); killed services restart on the same port and
     store.
       records_lost_under_kill      records stored on the rollout host that never reached the trainer
                                    intact, plus trainer records missing or differing from the host's, plus
                                    valid episodes missing a request's record; target 0

  python bench/bridge.py                      # 52 clean + 260 faulted episodes, about 17 minutes here
  python bench/bridge.py --clean-starts 1 --fault-starts 1 --kills 4   # a quick look
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("MUJOCO_GL", "egl")

from _common import print_table, write_results

from captain_ros.bridge.host import HostOptions, RolloutHost, Watchdog
from captain_ros.bridge.receiver import serve_receiver
from captain_ros.bridge.rollout import RolloutReport, plan_groups
from captain_ros.bridge.schema import Record
from captain_ros.bridge.services import free_port
from captain_ros.bridge.shipper import Shipper
from captain_ros.bridge.store import EpisodeStore
from captain_ros.bridge.wire import TransportConfig, TransportError
from captain_ros.twin.tasks import default_suite

GROUP = 4  # attempts per start state (CaPtain's G)
OVERHEAD_TARGET = 0.02
SEED = 11


def rollout(run_dir: Path, starts: int, workers: int, kills: int = 0) -> tuple[RolloutHost, RolloutReport, dict]:
    jobs = plan_groups(list(default_suite()), starts, GROUP, "train", SEED)
    host = RolloutHost(HostOptions(run_dir, workers=workers))
    injected: Counter = Counter()
    host.start()
    watchdog = Watchdog(host)
    watchdog.start()
    rng = random.Random(SEED)
    kill_at = sorted(rng.sample(range(2, len(jobs) - 2), kills)) if kills else []
    lock = threading.Lock()

    def inject(report: RolloutReport) -> None:
        with lock:
            while kill_at and report.episodes >= kill_at[0]:
                kill_at.pop(0)
                target = rng.choice(["worker", "worker", "proxy", "shipper", "receiver"])
                if target == "worker":
                    pids = host.engine.pids()
                    if pids:
                        os.kill(rng.choice(list(pids.values())), 9)
                else:
                    host.services[target].kill()
                injected[target] += 1

    try:
        report = host.run(jobs, on_progress=inject if kills else None)
        left = host.drain()
    finally:
        watchdog.stopping.set()
        host.stop()
    return host, report, {"unshipped": left, "injected": dict(injected), "service_restarts": watchdog.restarts}


def measure_throughput(n_records: int, payload_bytes: int, tmp_dir: str | Path) -> dict[str, float]:
    """Records/s and payload MB/s from a real shipper to a receiver process over loopback TCP, both stores on
    disk under `tmp_dir` (timed from the first send until the last record is acknowledged)."""
    tmp = Path(tmp_dir)
    outbox, inbox = tmp / "outbox.sqlite", tmp / "inbox.sqlite"
    rng = random.Random(0)
    total = 0
    with EpisodeStore(outbox) as store:
        for i in range(n_records):
            filler = rng.randbytes((payload_bytes + 1) // 2).hex()[:payload_bytes]  # compresses about 2:1
            step = {"snapshot": {"filler": filler}, "calls": [], "timing": {}, "costs": {}, "solved_before": False}
            record = Record(f"bench{i // 100}", "step", 1 + i % 100, step)
            total += len(record.encode()[0])
            store.append(record)
    config = TransportConfig(endpoint=f"tcp://127.0.0.1:{free_port()}")
    mp = multiprocessing.get_context("spawn")
    stop, ready = mp.Event(), mp.Event()
    proc = mp.Process(target=serve_receiver, args=(str(inbox), config, stop, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(120):
            raise TransportError("the receiver process did not start within 120 s")
        with Shipper(outbox, config) as shipper:
            t0 = time.perf_counter()
            stats = shipper.ship_until_idle(timeout_s=3600)
            elapsed = time.perf_counter() - t0
        if not stats["idle"] or stats["records_acked"] != n_records:
            raise TransportError(f"throughput run did not deliver all {n_records} records: {stats}")
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {
        "records_per_s": n_records / elapsed,
        "mb_per_s": total / elapsed / 1e6,
        "seconds": elapsed,
        "records": n_records,
        "payload_bytes": payload_bytes,
    }


def overhead_share(store_path: Path, report: RolloutReport) -> float:
    with EpisodeStore(store_path) as store:
        proxy_s = 0.0
        for row in store.episodes(status="complete"):
            for rec in store.records(row["episode_id"], verify=False):
                if rec.kind == "model_call":
                    proxy_s += rec.payload["timing"]["proxy_s"]
    return (proxy_s + report.record_s) / (report.request_s + report.record_s)


def losses(host_store: Path, trainer_store: Path) -> dict[str, int]:
    """Compare the two stores record by record (ids and digests), and check valid episodes are whole."""
    import sqlite3

    def digests(path: Path) -> dict[str, str]:
        with sqlite3.connect(path) as db:
            return dict(db.execute("SELECT id, sha256 FROM records").fetchall())

    here, there = digests(host_store), digests(trainer_store)
    missing = sum(1 for k in here if k not in there)
    differing = sum(1 for k, v in here.items() if k in there and there[k] != v)
    unknown = sum(1 for k in there if k not in here)
    holes = 0
    with EpisodeStore(trainer_store) as store:
        for row in store.episodes(status="complete", valid=True):
            eid, n = row["episode_id"], row["requests"]
            for kind in ("model_call", "step"):
                holes += len(set(range(1, n + 1)) - store.record_ids(eid, kind))
            store.records(eid, verify=True)  # every stored record's digest checked
    return {"missing": missing, "differing": differing, "unknown": unknown, "holes_in_valid_episodes": holes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clean-starts", type=int, default=1, help="start states per task in the clean rollout")
    parser.add_argument("--fault-starts", type=int, default=5, help="start states per task in the faulted rollout")
    parser.add_argument("--kills", type=int, default=20, help="kill -9 injections in the faulted rollout")
    parser.add_argument("--workers", type=int, default=2, help="twin workers")
    parser.add_argument("--keep", default="", help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-bridge-"))
    cores = os.cpu_count() or 1

    print("phase 1: clean rollout")
    host, clean, info = rollout(root / "clean", args.clean_starts, args.workers)
    per_hour_core = 3600.0 * clean.episodes / clean.seconds / cores
    share = overhead_share(host.store_path, clean)
    clean_loss = losses(host.store_path, host.trainer_store)

    print("phase 2: transport throughput")
    zmq = measure_throughput(20_000, 4096, root / "zmq")

    print(f"phase 3: faulted rollout with {args.kills} kill -9 injections")
    fhost, faulted, finfo = rollout(root / "faulted", args.fault_starts, args.workers, kills=args.kills)
    loss = losses(fhost.store_path, fhost.trainer_store)
    lost = sum(loss.values()) + finfo["unshipped"]

    print_table(
        "sim bridge",
        ["metric", "value", "target", "ratio"],
        [
            ["episodes per hour per core (clean)", per_hour_core, "", ""],
            ["recording overhead share", share, OVERHEAD_TARGET, share / OVERHEAD_TARGET],
            ["zmq records per s", zmq["records_per_s"], "", ""],
            ["zmq MB per s", zmq["mb_per_s"], "", ""],
            [f"records lost under {args.kills} kills", lost, 0, ""],
        ],
    )
    print_table(
        "rollouts",
        ["run", "episodes", "valid", "strict", "invalid", "worker restarts", "seconds"],
        [
            [name, r.episodes, r.valid, r.strict, r.episodes - r.valid, r.restarts, r.seconds]
            for name, r in (("clean", clean), ("faulted", faulted))
        ],
    )
    print("injected:", finfo["injected"], "| service restarts:", Counter(finfo["service_restarts"]))
    print("loss check (faulted):", loss, "| unshipped:", finfo["unshipped"])
    write_results(
        "bridge",
        {
            "episodes_per_hour_per_core": per_hour_core,
            "recording_overhead_share": share,
            "zmq_records_per_s": zmq["records_per_s"],
            "zmq_mb_per_s": zmq["mb_per_s"],
            "records_lost_under_kill": lost,
        },
        {
            "cores": cores,
            "workers": args.workers,
            "group_size": GROUP,
            "clean": {**clean.as_dict(), "loss": clean_loss, **info},
            "faulted": {**faulted.as_dict(), "loss": loss, **finfo},
            "kills": args.kills,
            "zmq": zmq,
            "overhead_target": OVERHEAD_TARGET,
        },
    )


if __name__ == "__main__":
    main()

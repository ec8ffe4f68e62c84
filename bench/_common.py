"""Shared helpers for bench/ scripts: machine description, tables, and result files."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def run_to_end(command: list[str]) -> int:
    """Run `command` and return its exit code. On Ctrl-C (or a SIGINT to this process alone) the command is sent
    SIGINT too and waited for, so that it stops what it started (captain-ros stops its workers and services) before
    this raises: subprocess.run would SIGKILL it a quarter of a second later, leaving them running."""
    proc = subprocess.Popen(command)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # a second Ctrl-C stops waiting (and leaves it to finish on its own)
        proc.wait()
        raise


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = ""
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": gpu or None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def percentiles_ms(samples_s: list[float]) -> dict[str, float]:
    a = np.asarray(samples_s) * 1e3
    return {
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "n": len(a),
    }


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header, *[[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, row in enumerate(cells):
        padded = [c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))]
        print("  " + "  ".join(padded))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def write_results(script: str, metrics: dict[str, float], extra: dict[str, object] | None = None) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{script}.json"
    payload = {**metrics, "machine": machine(), **(extra or {})}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(RESULTS.parent.parent)}")
    return path


def wait_future(future, timeout_s: float, what: str = "no answer from motion_node"):
    """An rclpy future's result once it is done (the executor spins elsewhere); RuntimeError(`what`) after
    `timeout_s`."""
    import threading

    done = threading.Event()
    future.add_done_callback(lambda _f: done.set())
    if not done.wait(timeout_s):
        raise RuntimeError(what)
    return future.result()


def move_to_goal(target: np.ndarray, speed_mps: float = 0.0):
    """A captain_interfaces MoveTo goal to TCP position `target` (m), fingers down; speed 0: the harness default."""
    from captain_interfaces.action import MoveTo

    goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE, speed_mps=speed_mps)
    goal.pose.pose.position.x, goal.pose.pose.position.y, goal.pose.pose.position.z = map(float, target)
    goal.pose.pose.orientation.x, goal.pose.pose.orientation.w = 1.0, 0.0
    return goal

"""Shared helpers for bench/ scripts: machine description, tables, and result files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


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

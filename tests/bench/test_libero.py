"""bench/libero.py's figures: the protocol's pooled keys cover its four suites only; LIBERO-PRO's suites pool apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def libero_bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_libero", BENCH / "libero.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def episode(suite: str, outcome: str, host: bool, wall_s: float, variant: str = "appearance") -> dict:
    return {
        "variant": variant,
        "suite": suite,
        "task": f"{suite}/0",
        "start_id": "11",
        "outcome": outcome,
        "host_success": host,
        "requests": 10,
        "actions": 5,
        "wall_time_s": wall_s,
    }


def test_protocol_and_pro_suites_pool_apart(libero_bench):
    results = [
        episode("libero_goal", "success", True, 10.0),
        episode("libero_goal", "missed_finish", True, 20.0),
        episode("libero_10", "failure", False, 30.0),
        episode("libero_object_swap", "success", True, 500.0),  # LIBERO-PRO: its own keys, not the protocol's
        episode("libero_goal", "failure", False, 1.0, variant="oracle_segmentation"),
    ]
    rows, metrics = libero_bench.figures(results, {"appearance": "d", "oracle_segmentation": "d"})
    assert metrics["libero_goal_strict"] == 0.5 and metrics["libero_goal_host"] == 1.0
    assert metrics["libero_strict"] == pytest.approx(1 / 3) and metrics["libero_host"] == pytest.approx(2 / 3)
    assert metrics["libero_episode_s_p50"] == 20.0  # the protocol's episodes only
    assert metrics["libero_pro_strict"] == 1.0 and metrics["libero_object_swap_host"] == 1.0
    assert (
        metrics["libero_strict_oracle_segmentation"] == 0.0 and "libero_pro_strict_oracle_segmentation" not in metrics
    )
    assert [r[0] for r in rows] == ["libero_goal", "libero_10", "libero_object_swap", "libero_goal"]


def test_each_episode_records_the_commit_it_ran_at(libero_bench):
    """A results file keeps the suites earlier runs wrote, so each episode carries the commit of its run."""
    import subprocess

    head = subprocess.run(
        ["git", "-C", str(BENCH), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert libero_bench.code_version().startswith(head)

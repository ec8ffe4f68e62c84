"""Guarding that does not depend on the motion node staying alive: motion_node is SIGKILLed mid-sweep while it
drives twin_node (the arm) through the ros2_control backend, and the arm stops by itself, because the controller
is only ever given the sweep a short horizon ahead. With sweeps sent whole (sweep_horizon_s:=0) the same kill lets
the controller finish the sweep: what the horizon prevents. The measurement is bench/real_arm.py's (one kill each),
from /joint_states through the arm's kinematics, on the twin's clock (a busy host changes the wall time only).
The same run lets an e-stop button's bridge die mid-sweep once (motion_node with real_arm.launch.py's 0.5 s deadline
on /safety/estop): the node engages the e-stop in the topic's name and the arm holds. Its timings are reported, not
judged here (a busy host would move them)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow]
BENCH = Path(__file__).resolve().parents[3] / "bench" / "real_arm.py"


def test_a_motion_node_killed_mid_sweep_leaves_the_arm_stopped_within_its_horizon(tmp_path):
    out = tmp_path / "real_arm.json"
    one_each = ["--kills", "1", "--whole-kills", "1", "--lapses", "1", "--configs", "20", "--moveit-checks", "3"]
    one_each += ["--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(BENCH), *one_each],
        cwd=BENCH.parent,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    (kill,) = result["runs"]["horizon"]
    (whole,) = result["runs"]["whole"]
    assert kill["speed_mps"] > 0.04 and whole["speed_mps"] > 0.04  # both killed while the arm moved
    assert kill["distance_mm"] <= 20.0  # the bound at 0.1 m/s
    assert kill["commanded_rest_ms"] <= 200.0  # the bound: horizon 50 ms + renewal + the stop ramp
    assert whole["distance_mm"] >= 100.0  # sent whole, the controller finished the sweep (up to 35 cm of it)
    assert result["self_collision_configs"] == 20 and result["self_collision_pairs_checked"] > 0  # timed on meshes
    (lapse,) = result["runs"]["lapse"]  # the bridge died mid-sweep: the e-stop latched in the topic's name
    assert lapse["engaged_by"] == "the /safety/estop topic" and "past its 0.5 s deadline" in lapse["estop_reason"]
    assert lapse["result_category"] == "safety_stop" and not lapse["result_success"]  # the sweep was stopped
    assert lapse["held"] and result["estop_lapse_all_held"]  # still latched once the arm rested
    assert result["estop_lapse_trials"] == 1
    for key in ("to_hold_ms_p50", "to_hold_ms_p95", "to_result_ms_p95", "to_rest_ms_p95", "stop_distance_mm_p95"):
        assert math.isfinite(result[f"estop_lapse_{key}"]), key
    assert math.isfinite(result["estop_hold_to_rest_ms_p95"])
    assert result["not_measured_yet"] == []
    assert result["moveit_scene_checks"] == 3 and math.isfinite(result["moveit_scene_check_ms_p50"])  # fake move_group

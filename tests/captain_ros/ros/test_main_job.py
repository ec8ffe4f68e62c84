"""The main job (`captain-ros run`, what `make run` runs) on a busy machine, the way it once failed: while two busy
loops take both cores, every episode must end as a task outcome, never as an infrastructure failure. Against the twin
in lockstep a busy host slows sim time down; it does not lose the link (the production limits, nothing loosened)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.serial]  # its busy loops would starve other tests

CLI = Path(sys.executable).with_name("captain-ros")
EPISODES = 1


def test_the_main_job_finishes_its_episodes_while_other_work_takes_every_core(tmp_path):
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        done = subprocess.run(
            [str(CLI), "run", "--task", "put_red_cube_in_bowl", "--episodes", str(EPISODES), "--split", "train",
             "--runs-dir", str(tmp_path), "--no-images"],
            capture_output=True,
            text=True,
            timeout=1800,
        )  # fmt: skip
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    logs = "\n".join(f"== {log.name}\n{log.read_text()[-2000:]}" for log in sorted((runs[0] / "logs").glob("*.log")))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{logs}"
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert len(summary) == EPISODES
    assert [episode["outcome"] for episode in summary if episode["outcome"] == "infrastructure_failure"] == [], logs

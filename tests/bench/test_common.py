"""bench/_common.py: a bench stopped with Ctrl-C waits for the command it runs to stop what it started."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.captain_ros.ros.helpers import wait_for

BENCH = Path(__file__).resolve().parents[2] / "bench"

# a command that, once interrupted, needs a while to stop its services (longer than subprocess.run would give it)
CHILD = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
try:
    (out / "ready").touch()
    time.sleep(600)
except KeyboardInterrupt:
    time.sleep(1.0)
    (out / "stopped its services").touch()
    sys.exit(130)
"""

BENCH_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from _common import run_to_end
try:
    run_to_end([sys.executable, "-c", sys.argv[2], sys.argv[3]])
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_an_interrupted_bench_waits_for_its_command_to_clean_up(tmp_path):
    bench = subprocess.Popen([sys.executable, "-c", BENCH_SCRIPT, str(BENCH), CHILD, str(tmp_path)])
    try:
        wait_for((tmp_path / "ready").exists, 120, "the command to start")
        bench.send_signal(signal.SIGINT)  # to the bench alone, as `kill -INT` would
        assert bench.wait(timeout=120) == 130
    finally:
        bench.kill()
    assert (tmp_path / "stopped its services").exists()

"""CI on a fresh clone, timed: what a CI machine does with this repository, on this machine (issue 24).

Clones the committed HEAD into a new folder under /tmp (CI checks out in a folder it chooses, often there), runs
`.ci/run` (the README's test command: setup, ruff, pytest, the Jazzy start-up suite) with pytest's durations report,
and parses what it printed. Nothing is shared with this checkout: the clone sets up its own environments.

  fresh_clone_ci_s        wall time of `.ci/run` on the fresh clone (setup included); target <= 1500 s
  setup_s, pytest_s       the setup step, and the pytest runs within it (parallel, serial, Jazzy) together
  setup_again_s, venv_gb  `make setup` once more on the clone with nothing changed; each environment's size
  tests_passed, tests_skipped, tests_failed
  slowest_tests           the 20 slowest test phases, as pytest reports them
  stress_runs_passed / stress_runs   from bench/results/stress_dds.json (tools/stress_dds_tests.py)

  python bench/ci.py                      # about 25 minutes on 2 cores
  python bench/ci.py --before LOG         # also keep an earlier run's slowest tests and times (LOG: its output,
                                          # ending with `rc=N wall=S`) beside; without it, the last results' stay
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1500.0
SUMMARY = re.compile(r"=+ (.*?) in ([\d.]+)s")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)", re.MULTILINE)
SETUP_READY = re.compile(r"\[setup\] ready in ([\d.]+) s")
WALL = re.compile(r"wall=([\d.]+)")  # what the --before log ends with: `rc=N wall=S` (.ci/run's exit and seconds)
WORKERS = re.compile(r"^TEST_WORKERS \?= (\d+)", re.MULTILINE)


VENVS = (".venv", ".venv-jazzy", ".venv-vllm", ".venv-libero")


def _gigabytes(path: Path) -> float | None:
    du = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return round(int(du.stdout.split()[0]) / 1e9, 2) if du.returncode == 0 else None


def slowest(output: str, n: int = 20) -> list[dict]:
    rows = [{"s": float(s), "phase": phase, "test": test} for s, phase, test in DURATION.findall(output)]
    return sorted(rows, key=lambda r: -r["s"])[:n]


def counts(output: str) -> tuple[dict[str, int], float]:
    """Outcome counts and seconds of every pytest run in the output together (the parallel run, the serial one, the
    Jazzy start-up suite)."""
    total: dict[str, int] = {}
    seconds = 0.0
    for line, took in SUMMARY.findall(output):
        for k, word in COUNT.findall(line):
            kind = "error" if word.startswith("error") else word
            total[kind] = total.get(kind, 0) + int(k)
        seconds += float(took)
    return total, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="an earlier .ci/run output with --durations, to compare")
    parser.add_argument("--keep", action="store_true", help="keep the clone (default: removed at the end)")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    commit = head.stdout.strip()
    clone = Path(tempfile.mkdtemp(prefix="captain-ci-", dir="/tmp"))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone / "repo")], check=True)
        subprocess.run(["git", "checkout", "-q", commit], cwd=clone / "repo", check=True)
        # nothing of this venv reaches the clone: its ROS wheels' bootstrap (LD_LIBRARY_PATH and the flag that it ran)
        # would make the clone's Jazzy Python load this venv's Kilted libraries
        leaks = ("VIRTUAL_ENV", "PYTHON", "ROS_", "_ROS_", "LD_LIBRARY_PATH")
        env = {k: v for k, v in os.environ.items() if not k.startswith(leaks)}
        env["PYTEST_ADDOPTS"] = "--durations=20 --durations-min=1"
        print(f"running .ci/run on a fresh clone of {commit[:10]} in {clone / 'repo'} (output: {clone / 'ci.log'})")
        t0 = time.monotonic()
        with (clone / "ci.log").open("w") as log:
            done = subprocess.run(["./.ci/run"], cwd=clone / "repo", env=env, stdout=log, stderr=subprocess.STDOUT)
        wall = time.monotonic() - t0
        output = (clone / "ci.log").read_text(errors="replace")
        t0 = time.monotonic()  # the setup again with nothing changed: every step finds its stamp
        again = subprocess.run(["make", "setup"], cwd=clone / "repo", env=env, capture_output=True, text=True)
        setup_again_s = time.monotonic() - t0 if again.returncode == 0 else None
        sizes = {venv: _gigabytes(clone / "repo" / venv) for venv in VENVS}
    finally:
        if not args.keep:
            shutil.rmtree(clone / "repo", ignore_errors=True)
    found, pytest_s = counts(output)
    setup = SETUP_READY.search(output)
    stress = {}
    if (RESULTS / "stress_dds.json").is_file():
        stress = json.loads((RESULTS / "stress_dds.json").read_text())
    metrics = {
        "fresh_clone_ci_s": round(wall, 1),
        "fresh_clone_ci_min": round(wall / 60, 2),
        "ci_exit_code": done.returncode,
        "setup_s": float(setup.group(1)) if setup else None,
        "pytest_s": pytest_s,
        "tests_passed": found.get("passed", 0),
        "tests_skipped": found.get("skipped", 0),
        "tests_failed": found.get("failed", 0) + found.get("error", 0),
        "target_s": TARGET_S,
        "test_workers": int(WORKERS.search((ROOT / "Makefile").read_text()).group(1)),
        "setup_again_s": None if setup_again_s is None else round(setup_again_s, 1),
        "venv_gb": sizes,
        "stress_runs_passed": stress.get("passed"),
        "stress_runs": stress.get("runs"),
        "commit": commit,
    }
    extra = {"slowest_tests": slowest(output)}
    if args.before:
        before = args.before.read_text(errors="replace")
        extra["slowest_tests_before"] = slowest(before)
        metrics["before_pytest_s"] = counts(before)[1]
        ended = WALL.search(before)
        metrics["before_ci_s"] = float(ended.group(1)) if ended else None
        metrics["before_ci_min"] = round(metrics["before_ci_s"] / 60, 2) if ended else None
    elif (RESULTS / "ci.json").is_file():  # the last results' "before" stays the anchor until another is given
        last = json.loads((RESULTS / "ci.json").read_text())
        metrics.update({k: v for k, v in last.items() if k.startswith("before_")})
        if "slowest_tests_before" in last:
            extra["slowest_tests_before"] = last["slowest_tests_before"]
    rows = [[r["test"][-90:], r["phase"], f"{r['s']:.1f}"] for r in extra["slowest_tests"]]
    print_table("the 20 slowest test phases", ["test", "phase", "s"], rows)
    print_table(
        "CI on a fresh clone",
        ["metric", "value", "target"],
        [
            ["fresh_clone_ci_s", f"{wall:.0f}", f"<= {TARGET_S:.0f}"],
            ["setup_s", str(metrics["setup_s"]), ""],
            ["pytest_s", f"{pytest_s:.0f}", ""],
            [
                "tests passed / skipped / failed",
                f"{metrics['tests_passed']} / {metrics['tests_skipped']} / {metrics['tests_failed']}",
                "",
            ],
        ],
    )
    write_results("ci", metrics, extra)
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Run the DDS tests again and again while busy loops load every core, to find tests that depend on
how promptly the OS schedules processes (CI runs on a shared 2-core machine).

Each run is a fresh pytest process over the `ros`-marked tests (or the paths/expressions given after
`--`). The busy loops run for the whole session at normal priority, as another job on the machine would.
Prints one line per run, then a summary; the full report (per run: outcome, duration, failed tests; each
run's output beside it) is written to runs/stress_dds/<time>/, and, for a run of the whole DDS suite, the
summary to bench/results/stress_dds.json (docs/testing.md quotes it).

  .venv/bin/python tools/stress_dds_tests.py                 # 20 runs of tests/captain_ros/ros, 2 busy loops
  .venv/bin/python tools/stress_dds_tests.py --workers 2          # each run on 2 workers, as `make test` runs it
  .venv/bin/python tools/stress_dds_tests.py --runs 5 --busy 3 -- tests/captain_ros/ros/test_motion_node.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import write_results  # noqa: E402 - bench/ is not a package

FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


TEARDOWN_S = 120.0  # an interrupted run's pytest gets this long to tear its fixtures (the nodes) down


def one_run(pytest_args: list[str], log_dir: Path, index: int) -> dict:
    """One pytest run in a process group of its own. Interrupted, pytest is sent SIGINT (its fixtures stop the nodes
    they started), then the group is killed: nothing a run started outlives it."""
    t0 = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.communicate(timeout=TEARDOWN_S)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    (log_dir / f"run-{index:02d}.log").write_text(out)
    summary = next(
        (line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error).* in [\d.]+s", line)), ""
    )
    return {
        "run": index,
        "passed": proc.returncode == 0,
        "returncode": proc.returncode,
        "duration_s": round(time.monotonic() - t0, 1),
        "summary": summary.strip("= "),
        "failed": FAILED.findall(out),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="pytest runs (default 20)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy-loop processes (default: cores)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="pytest-xdist workers per run, test files grouped as `make test` groups them (default 1: serial); "
        "2 with 2 busy loops is four CPU-hungry processes on a 2-core machine, a harder load than CI's; tests marked "
        "serial (the main job under its own busy loops) are then left out, as make test runs them alone",
    )
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed run")
    parser.add_argument(
        "pytest_args", nargs="*", help="after --: pytest arguments (default: -m ros tests/captain_ros/ros)"
    )
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args or ["-m", "ros", "tests/captain_ros/ros"]
    if args.workers > 1:  # tests marked serial bring their own busy loops and never share the machine (make test)
        pytest_args = ["-n", str(args.workers), "--dist", "loadgroup", *pytest_args]
        if not args.pytest_args:
            pytest_args = [a if a != "ros" else "ros and not serial" for a in pytest_args]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = ROOT / "runs" / "stress_dds" / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{args.runs} runs of pytest {' '.join(pytest_args)} with {args.busy} busy loops; logs in {log_dir}")
    loops = busy_loops(args.busy)
    runs: list[dict] = []
    try:
        for i in range(1, args.runs + 1):
            run = one_run(pytest_args, log_dir, i)
            runs.append(run)
            verdict = "pass" if run["passed"] else "FAIL " + ", ".join(run["failed"] or [f"rc {run['returncode']}"])
            print(f"run {i:2d}/{args.runs}: {run['duration_s']:6.1f} s  {run['summary']}  {verdict}", flush=True)
            if args.stop_on_failure and not run["passed"]:
                break
    except KeyboardInterrupt:
        print("interrupted")
    finally:
        for proc in loops:
            proc.kill()
    streak = longest = 0
    for run in runs:
        streak = streak + 1 if run["passed"] else 0
        longest = max(longest, streak)
    passed = sum(r["passed"] for r in runs)
    report = {
        "pytest_args": pytest_args,
        "busy_loops": args.busy,
        "workers": args.workers,
        "cores": os.cpu_count(),
        "runs": runs,
        "passed": passed,
        "longest_passing_streak": longest,
    }
    path = log_dir / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    if not args.pytest_args:  # the whole DDS suite: the figure the README quotes
        durations = [r["duration_s"] for r in runs]
        write_results(
            "stress_dds",
            {"runs": len(runs), "passed": passed, "longest_passing_streak": longest},
            {
                "busy_loops": args.busy,
                "workers": args.workers,
                "pytest_args": pytest_args,
                "run_s_max": max(durations, default=0.0),
                "run_s_median": sorted(durations)[len(durations) // 2] if durations else 0.0,
                "failed_tests": sorted({f for r in runs for f in r["failed"]}),
            },
        )
    print(f"\n{passed}/{len(runs)} runs passed; longest run of consecutive passes: {longest}; report: {path}")
    return 0 if passed == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())

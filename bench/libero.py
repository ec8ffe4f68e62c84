#!/usr/bin/env python3
"""LIBERO through the harness: the scripted expert per suite, and what the harness's drive costs against LIBERO's own.

With no arguments: the held-out protocol of CaPtain's Table 1. All 40 tasks of libero_spatial, libero_object,
libero_goal and libero_10, each on the official evaluation initial states 11-16 (240 episodes), CaPtain's budgets
(60 requests), through `captain-ros eval run --backend libero` (the bridge's rollout workers, one LIBERO server each,
in parallel on every core), as any evaluation runs. `--quick` is the iteration sample: three suites, state 11.

libero_<suite>_strict   strict success (finish() accepted on a scene LIBERO's goal predicate passes) of the scripted
                        expert; host success (`_host`) beside it. The expert acts on perception only: the built-in
                        segmenter's depth regions named by the appearance library rendered from LIBERO's asset
                        models (libero/appearance_library.py); LIBERO's predicate only scores
libero_strict, _host    over every episode of the four suites (240 for the protocol)
libero_pro_strict, _host  over every episode of LIBERO-PRO's perturbed suites run (`--suites libero_object_swap,...`;
                        each has its own libero_<suite>_strict too), never pooled into the protocol's
libero_episode_s_p50    wall time per episode (each worker on its own core)
episodes[].commit       the commit each episode ran at ("-dirty": its code differed): the file keeps the suites
                        other runs wrote, so one file can hold more than one expert
..._colour_shape        the same episodes with the built-in colour/shape naming alone (no appearance library)
..._oracle_segmentation the same episodes with ORACLE segmentation (libero/oracle.py: masks from the simulator's
                        object ids in place of a segmentation model; depth, geometry, planning and motion unchanged):
                        what the rest of the harness achieves on LIBERO when naming objects is solved
observe_ms_p50_libero   the observe capability on a LIBERO scene (head + wrist RGB-D 512x512 rendered by LIBERO's
                        own renderer, carried to the harness, point clouds built), p50
control_ms_per_50ms     wall time of the harness's joint control for 50 ms of simulated time (25 control periods
                        of 2 ms, each a round trip to the LIBERO server), against LIBERO's own env.step (OSC, the
                        same 50 ms) in one run; and the native render of the same two cameras against our capture

  python bench/libero.py                        # the protocol (headline variant), writes bench/results/libero.json
  python bench/libero.py --quick                # the sample: 3 suites x 10 tasks, state 11, every variant;
                                                # writes bench/results/libero_quick.json (never the protocol's file)
  python bench/libero.py --variants oracle_segmentation   # other variants; the others' figures are kept
  python bench/libero.py --suites libero_10 --states 11,12  # a part of the protocol (written beside the rest)
  python bench/libero.py --suites libero_object_swap,libero_object_lan   # LIBERO-PRO suites, the same way
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import print_table, run_to_end, write_results

from captain_ros.bridge.evaluation import load_rows
from captain_ros.core.config import load_config
from captain_ros.core.trajectory import JointTrajectory
from captain_ros.libero.libero_backend import libero_python
from captain_ros.libero.link import LiberoLink

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
PROTOCOL_STATES = "11,12,13,14,15,16"  # CaPtain's held-out official initial states
QUICK = {"suites": "libero_spatial,libero_object,libero_goal", "states": "11"}  # the iteration sample
SIZE_PX = 512
VARIANTS = {  # label -> the world's segmentation name; the first is the headline (its keys carry no suffix)
    "appearance": "appearance",
    "colour_shape": "colour_shape",
    "oracle_segmentation": "oracle",
}
RESULTS_DIR = Path(__file__).resolve().parent / "results"
NATIVE = Path(__file__).resolve().parent / "_libero_native.py"


def costs(link: LiberoLink, samples: int) -> dict[str, float]:
    link.reset("libero_spatial/0", "11", "eval", "bench-costs")
    observe = []
    for _ in range(samples):
        t0 = time.perf_counter()
        result = link.call("observe", {})
        observe.append(time.perf_counter() - t0)
        assert result["success"], result["receipt"]
    backend = link.backend
    capture = []
    for _ in range(samples):
        t0 = time.perf_counter()
        backend.capture(("head", "wrist"))
        capture.append(time.perf_counter() - t0)
    q = backend.read_state().q_rad
    target = q + np.array([0.3, -0.2, 0.2, 0.2, -0.2, 0.2, 0.3])
    backend.follow(JointTrajectory(backend.profile.arm_joints, np.array([2.0]), target[None], np.zeros((1, 7))))
    periods = round(0.05 / backend.control_period_s)
    control = []
    for _ in range(40):  # 2 s of motion, 50 ms at a time
        t0 = time.perf_counter()
        for _ in range(periods):
            backend.wait_period()
        control.append(time.perf_counter() - t0)
    return {
        "observe_ms_p50_libero": 1e3 * float(np.median(observe)),
        "capture_ms_p50_libero": 1e3 * float(np.median(capture)),
        "control_ms_per_50ms": 1e3 * float(np.median(control)),
    }


def native(samples: int) -> dict[str, float]:
    proc = subprocess.run(
        [str(libero_python()), "-P", str(NATIVE), str(SIZE_PX), str(samples)],  # -P: bench/libero.py is not `libero`
        capture_output=True,
        text=True,
        env={"MUJOCO_GL": "egl", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the native LIBERO timing failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "native_step_ms_per_50ms": 1e3 * out["step_s"],
        "native_step_with_cameras_ms": 1e3 * out["step_render_s"],
        "native_observe_ms": 1e3 * out["observe_s"],
    }


def episodes(args: argparse.Namespace, states: list[int], runs_dir: Path, variant: str) -> list:
    """One episode per task and state through `captain-ros eval run` (its progress bar shows); its records'
    rows (captain_ros.bridge.evaluation)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    command = [
        *(str(Path(sys.executable).with_name("captain-ros")), "eval", "run", "--backend", "libero"),
        *("--suite", args.suites, "--tasks", ",".join(str(t) for t in range(args.tasks))),
        *("--segmentation", VARIANTS[variant], "--workers", str(args.workers), "--no-ship"),
        *("--runs-dir", str(runs_dir), "--starts-per-task", str(len(states))),  # the first N of the states 11-16
    ]
    if run_to_end(command) != 0:
        raise SystemExit(f"the evaluation failed: {' '.join(command)}")
    stores = sorted(runs_dir.glob("*-eval/rollout.sqlite"))
    return [r for r in load_rows(stores[-1]) if r.valid]


def code_version() -> str:
    """The commit the episodes ran at, with "-dirty" when the code (src/, config/, urdf/) differs from it: a results
    file keeps the suites of earlier runs, so each episode says which expert it measured."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)

    head = git("rev-parse", "--short=7", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("diff", "--quiet", "HEAD", "--", "src", "config", "urdf").returncode != 0
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _suite_order(suite: str) -> tuple[int, str]:
    return (SUITES.index(suite) if suite in SUITES else len(SUITES), suite)


def figures(results: list[dict], dates: dict) -> tuple[list, dict]:
    """The table's rows and the results file's figures: per suite and variant, and pooled (the protocol's four
    suites; LIBERO-PRO's perturbed suites apart)."""
    rows: list = []
    metrics: dict = {}
    for variant in VARIANTS:
        if variant not in dates:
            continue
        suffix = "" if variant == next(iter(VARIANTS)) else f"_{variant}"
        for suite in sorted({r["suite"] for r in results if r["variant"] == variant}, key=_suite_order):
            mine = [r for r in results if r["suite"] == suite and r["variant"] == variant]
            strict = float(np.mean([r["outcome"] == "success" for r in mine]))
            host = float(np.mean([bool(r["host_success"]) for r in mine]))
            metrics[f"{suite}_strict{suffix}"] = strict
            metrics[f"{suite}_host{suffix}"] = host
            outcomes: dict[str, int] = {}
            for r in mine:
                outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
            requests = float(np.mean([r["requests"] for r in mine]))
            counts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
            rows.append([suite, variant, len(mine), host, strict, requests, counts])
        # the protocol's figures pool its four suites; LIBERO-PRO's perturbed suites (any other) pool apart
        for pooled, mine in (
            ("libero", [r for r in results if r["variant"] == variant and r["suite"] in SUITES]),
            ("libero_pro", [r for r in results if r["variant"] == variant and r["suite"] not in SUITES]),
        ):
            if not mine:
                continue
            metrics[f"{pooled}_strict{suffix}"] = float(np.mean([r["outcome"] == "success" for r in mine]))
            metrics[f"{pooled}_host{suffix}"] = float(np.mean([bool(r["host_success"]) for r in mine]))
            walls = [r["wall_time_s"] for r in mine if r.get("wall_time_s") is not None]
            if walls and pooled == "libero":
                metrics[f"libero_episode_s_p50{suffix}"] = float(np.median(walls))
    return rows, metrics


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"the iteration sample ({QUICK['suites']}; state {QUICK['states']}; every variant) into "
        "results/libero_quick.json",
    )
    parser.add_argument(
        "--states",
        default=None,
        help=f"official initial states per task (comma-separated; default {PROTOCOL_STATES}, "
        f"--quick {QUICK['states']})",
    )
    parser.add_argument("--samples", type=int, default=10, help="timing samples per measurement")
    parser.add_argument("--tasks", type=int, default=10, help="tasks per suite (the first N; 10 = all)")
    parser.add_argument(
        "--suites", default=None, help=f"LIBERO suites (comma-separated; default {','.join(SUITES)}, --quick fewer)"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="episodes in parallel")
    parser.add_argument(
        "--variants",
        default=None,
        help="variants to run (comma-separated; default: the headline, appearance; --quick: all); the figures and "
        "episodes of the others are kept from the last results file, each variant with the date it ran",
    )
    args = parser.parse_args()
    args.states = args.states or (QUICK["states"] if args.quick else PROTOCOL_STATES)
    args.suites = args.suites or (QUICK["suites"] if args.quick else ",".join(SUITES))
    args.variants = args.variants or (",".join(VARIANTS) if args.quick else next(iter(VARIANTS)))
    name = "libero_quick" if args.quick else "libero"
    results_file = RESULTS_DIR / f"{name}.json"
    states = [int(s) for s in args.states.split(",")]
    if states != list(range(11, 11 + len(states))) or len(states) > 6:
        parser.error(f"--states must be the first of the held-out states 11-16 (11, or 11,12, ...), not {args.states}")
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    previous = json.loads(results_file.read_text()) if results_file.is_file() else {}
    ran_now = {(v, suite) for v in chosen for suite in args.suites.split(",")}  # a variant's other suites are kept
    results = [
        r
        for r in previous.get("episodes", [])
        if r["variant"] in VARIANTS and (r["variant"], r["suite"]) not in ran_now
    ]
    kept = {r["variant"] for r in results}
    ran = previous.get("variant_dates", {})
    dates = {v: ran.get(v, previous.get("machine", {}).get("date_utc", "unknown")) for v in VARIANTS if v in kept}
    runs_dir = Path(tempfile.mkdtemp(prefix="bench-libero-"))
    timing_keys = ("capture_ms_p50_libero", "control_ms_per_50ms", "observe_ms_p50_libero")
    native_keys = ("native_step_ms_per_50ms", "native_step_with_cameras_ms", "native_observe_ms")
    ours = {k: previous[k] for k in timing_keys if k in previous}
    theirs = {k: previous[k] for k in native_keys if k in previous}
    if next(iter(VARIANTS)) in chosen:  # the costs first, alone on the machine
        link = LiberoLink(load_config(), image_size_px=SIZE_PX, log_dir=runs_dir / "costs")
        try:
            ours = costs(link, args.samples)
        finally:
            link.close()
        theirs = native(args.samples)
    commit = code_version()
    for variant in chosen:
        rows = episodes(args, states, runs_dir / variant, variant)
        results += [
            {
                "variant": variant,
                "suite": r.family,
                "task": r.task,
                "start_id": r.start_id,
                "outcome": r.outcome,
                "host_success": r.host_success,
                "requests": r.requests,
                "actions": r.actions,
                "wall_time_s": r.wall_time_s,
                "commit": commit,
            }
            for r in rows
        ]
        dates[variant] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    rows, metrics = figures(results, dates)
    print_table(
        f"Scripted expert on LIBERO ({'the quick sample' if args.quick else 'the held-out protocol'}: "
        f"this run's initial states {args.states}, tasks 0-{args.tasks - 1} of each suite)",
        ["suite", "segmentation", "episodes", "host", "strict", "requests", "outcomes"],
        rows,
    )
    ratio_control = ours["control_ms_per_50ms"] / theirs["native_step_ms_per_50ms"]
    ratio_observe = ours["capture_ms_p50_libero"] / theirs["native_observe_ms"]
    print_table(
        f"Cost per step and per observe against LIBERO's own environment ({SIZE_PX}x{SIZE_PX} head + wrist RGB-D)",
        ["what", "harness ms", "native ms", "ratio"],
        [
            [
                "50 ms of simulated arm control",
                ours["control_ms_per_50ms"],
                theirs["native_step_ms_per_50ms"],
                ratio_control,
            ],
            ["render both cameras", ours["capture_ms_p50_libero"], theirs["native_observe_ms"], ratio_observe],
            [
                "observe capability (+ clouds)",
                ours["observe_ms_p50_libero"],
                theirs["native_observe_ms"],
                ours["observe_ms_p50_libero"] / theirs["native_observe_ms"],
            ],
            ["native env.step with cameras", float("nan"), theirs["native_step_with_cameras_ms"], float("nan")],
        ],
    )
    metrics["observe_ms_p50_libero"] = ours["observe_ms_p50_libero"]
    write_results(
        name,
        metrics,
        {
            **ours,
            **theirs,
            "control_ratio_to_native": ratio_control,
            "capture_ratio_to_native": ratio_observe,
            "states": states,  # this run's
            "variant_states": {v: sorted({str(r["start_id"]) for r in results if r["variant"] == v}) for v in dates},
            "protocol": "quick sample" if args.quick else "held-out protocol",
            "workers": args.workers,
            "image_px": SIZE_PX,
            "policy": "scripted expert (captain_ros.agent.expert), perception only",
            "variant_dates": dates,
            "episodes": [
                {
                    k: r[k]
                    for k in (
                        "variant",
                        "suite",
                        "task",
                        "start_id",
                        "outcome",
                        "host_success",
                        "requests",
                        "actions",
                        "wall_time_s",
                        "commit",
                    )
                    if k in r
                }
                for r in results
            ],
        },
    )
    for store in sorted(runs_dir.glob("*/*-eval/rollout.sqlite")):
        print(f"episodes: {store} (a transcript: captain-ros eval transcript {store} --outcome failure --brief)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # run_to_end waited for the evaluation to stop what it started
        print("bench/libero.py: interrupted; no results written", file=sys.stderr)
        sys.exit(130)

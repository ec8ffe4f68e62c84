#!/usr/bin/env python3
"""Perception on the twin as a policy uses it: from a language query to a metric centre, with calibrated
(not perfect) cameras. Ground truth is read only by this benchmark, and only to score results.

Scenes: wide-layout start states of every task (10 per task, 130 in all), arm at home, head camera. Every
start state gives each camera a hand-eye calibration error (twin/start_states.py: head 1-4 mm and
0.1-0.5 deg): perception is handed the calibrated pose, the images are rendered from the true one.

Headline: the path a policy takes, with no ground truth inside it
  query      "<colour> <kind>" from the task's object catalogue: the words a language instruction gives
             the policy. One query per distinct description in the scene; the look-alike pairs of the
             spatial tasks (two red cubes, two green cubes, two black bowls) are one query each, since
             no colour-and-kind query can tell them apart (picking the one the instruction's relation
             means is the policy's work on the detections, not the segmenter's).
  path       observe() -> segment(query) -> its TOP-1 detection (never the best of several) ->
             measure_object_geometry(top-1).
  right      after the fact, from the simulator's own id image: most of the top-1 mask's pixels belong to
             an object of the asked description. A wrong object or no detection is a failure.
  e2e_success_rate          right AND the measured centre within 2 cm of that object's true centre (the
                            centre of its bounding box).
  e2e_center_error_cm_p50   over ALL queries, failures counted: a wrong detection by its distance to the
                            nearest object of the asked description (what a policy acting on it would be
                            off by), a missing one as infinitely far. The median over the right groundings
                            only is reported beside it (e2e_center_error_cm_p50_correct).
  e2e_point_success_rate    the same with point(query) (no pointing server here: the segmenter's top-1,
                            then mark_point on its central pixel) instead of segment.

Latency (fresh observations throughout: nothing is cached from an earlier observe). Wall-clock time, which
other jobs on the machine inflate: the load average at start and end and the process's CPU time per call
(*_cpu_ms_p50, all threads) are written beside.
  observe_ms_p50          the observe capability itself through the harness: both cameras rendered and handed to
                          the background build of their point clouds (table planes, robot masks, colour names),
                          which observe does not wait for. Compared with CaPtain's 160 ms per observe
                          (observe_ratio_to_captain).
  e2e_segment_measure_ms_p50  segment(query) + measure_object_geometry right after a fresh observe (includes
                          waiting for the rest of its clouds and segmenting the image).
  mark_measure_ms_p50     mark_point + measure_object_geometry on a fresh observation (includes segmenting).
Observe speed (bench/_observe_speed.py, one start state, all three in the same run):
  raw_render_ms_p50       both cameras rendered by the twin, nothing else: the anchor
  observe_ros_ms_p50      observe as the agent node calls it (/perception/call on the perception node, twin_node in
                          its own process); target <= 60 ms and observe_ros_ratio_to_render <= 3
  observe_inprocess_ms_p50  observe through the harness core in-process (render included); the breakdown of the
                          cloud build and the image fetch + PNG encoding the agent adds when it attaches images are
                          beside
  first_segment_{inprocess,ros}_ms_p50  the first segment on that observation: it waits for what of the clouds is
                          not built yet (over ROS the image fetch comes between, as in the agent)

Sub-metrics
  oracle_click_*          mark_point on the pixel of the object's TRUE mask nearest its centre, then measure:
                          back-projection and measurement given a perfect click (not grounding), per object.
  extent / yaw errors     over right top-1 groundings: largest of the three extent errors; boxes (cubes,
                          blocks, open boxes) modulo their symmetry.
  noisy_depth_*           the same states again with a structured-light depth error model (sigma 1.5 mm *
                          z^2, 2% holes, 1 mm steps) on top of the calibration error.
  perfect_calibration_*   the same states again handed the TRUE camera pose (evaluation only), to show what
                          the calibration error costs.
The drawer cabinet is excluded: fixed furniture whose box centre a policy never needs (it needs the handle).

  python bench/perception.py                # prints tables, writes bench/results/perception.json (several minutes)
  python bench/perception.py --speed-only   # only the observe speed, updated in that file
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
from _common import RESULTS, machine, print_table, write_results
from tqdm import tqdm

from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin
from captain_ros.twin.start_states import StartId, make_layout
from captain_ros.twin.tasks import default_suite

SUCCESS_CM = 2.0
CAPTAIN_OBSERVE_MS = 160.0  # CaPtain, Appendix (engineering table): observe latency 2.2 s -> 0.16 s
SQUARE_KINDS = {"cube", "block"}
MIN_VISIBLE_PX = 50


class NoisyDepthBackend(TwinBackend):
    """The twin with a structured-light-like depth error: sigma = 1.5 mm * z^2 (z in m), 2% missing pixels
    and 1 mm quantisation, to show what a real RGB-D camera costs in accuracy."""

    def __init__(self, twin: Twin, seed: int):
        super().__init__(twin)
        self.rng = np.random.default_rng(seed)

    def capture(self, cameras):
        images = super().capture(cameras)
        for name, im in images.items():
            z = im.depth_m
            noisy = z + self.rng.normal(0.0, 1.0, z.shape).astype(np.float32) * 0.0015 * z**2
            noisy = np.round(noisy * 1000.0) / 1000.0
            noisy[self.rng.random(z.shape) < 0.02] = 0.0
            images[name] = replace(im, depth_m=noisy.astype(np.float32))
        return images


class PerfectCalibrationBackend(TwinBackend):
    """EVALUATION ONLY: hands perception the true camera poses, to measure what calibration error costs."""

    def capture(self, cameras):
        images = super().capture(cameras)
        for name, im in images.items():
            position, rotation = self.twin.true_camera_pose(name)
            images[name] = replace(im, position_m=position, rotation=rotation)
        return images


def yaw_error_deg(measured: float, truth: float, period: float) -> float:
    d = (measured - truth) % period
    return float(min(d, period - d))


def click(mask: np.ndarray) -> tuple[float, float]:
    """The mask pixel nearest the mask's centroid, as fractions of width and height."""
    v, u = np.nonzero(mask)
    i = int(np.argmin((u - u.mean()) ** 2 + (v - v.mean()) ** 2))
    h, w = mask.shape
    return u[i] / (w - 1), v[i] / (h - 1)


class Truth:
    """EVALUATION ONLY: the simulator's id image and object poses of one start state, to score results."""

    def __init__(self, twin: Twin):
        self.twin = twin
        m = twin.model
        body_ids = twin._rig.render_body_ids(twin.data, "head")  # rendered from the true camera pose
        self.owner = np.full(body_ids.shape, -1)
        self.objects = [o for o in twin.task.objects if o.kind != "cabinet"]
        for i, spec in enumerate(self.objects):
            self.owner[body_ids == m.body(spec.name).id] = i

    def mask(self, i: int) -> np.ndarray:
        return self.owner == i

    def center(self, i: int) -> np.ndarray:
        spec = self.objects[i]
        r = self.twin.reader.rotation(spec.name)
        return self.twin.reader.position(spec.name) + r @ np.array([0.0, 0.0, spec.size_m[2] / 2])

    def owner_of(self, mask: np.ndarray) -> int | None:
        """The object most of the mask's pixels belong to (None: mostly table, robot or furniture)."""
        ids = self.owner[mask]
        counts = np.bincount(ids[ids >= 0], minlength=len(self.objects))
        return int(np.argmax(counts)) if counts.sum() * 2 > mask.sum() else None

    def geometry_errors(self, i: int, value: dict, rows: dict, prefix: str) -> None:
        spec = self.objects[i]
        ext = np.array(value["extents_m"])
        true_ext = np.array([*sorted(spec.size_m[:2], reverse=True), spec.size_m[2]])
        rows[f"{prefix}extent_cm"].append(float(np.abs(ext - true_ext).max()) * 100)
        if spec.kind in SQUARE_KINDS | {"box"}:
            r = self.twin.reader.rotation(spec.name)
            true_yaw = float(np.degrees(np.arctan2(r[1, 0], r[0, 0])))
            if spec.kind == "box" and spec.size_m[1] > spec.size_m[0]:
                true_yaw += 90.0  # the measured yaw is of the long side
            period = 90.0 if spec.kind in SQUARE_KINDS else 180.0
            rows[f"{prefix}yaw_deg"].append(yaw_error_deg(value["yaw_deg"], true_yaw, period))


def ground(harness: Harness, truth: Truth, query: str, targets: list[int], via: str) -> tuple[str, float, dict]:
    """One grounding along the policy's path; returns (outcome, centre error cm, measured value). Outcome:
    'right', 'wrong' (another object or mostly background) or 'missing' (nothing found / measure failed)."""
    if via == "segment":
        found = harness.call("segment", text=query)
        if not found.success:
            return "missing", math.inf, {}
        top1 = found.value["detections"][0]["detection_id"]
    else:
        found = harness.call("point", text=query)
        if not found.success:
            return "missing", math.inf, {}
        top1 = found.value["detection_id"]
    geom = harness.call("measure_object_geometry", object=top1)
    if not geom.success:
        return "missing", math.inf, {}
    # scoring only from here on
    measured = np.array(geom.value["center_m"])
    owner = truth.owner_of(harness.perception.detections[top1].mask)
    errors = {i: float(np.linalg.norm(measured - truth.center(i))) * 100 for i in targets}
    if owner in targets:
        return "right", errors[owner], geom.value | {"owner": owner}
    return "wrong", min(errors.values()), geom.value | {"owner": owner}


def make_backend(twin: Twin, mode: str, n: int) -> TwinBackend:
    if mode == "noisy_depth":
        return NoisyDepthBackend(twin, seed=n)
    if mode == "perfect_calibration":
        return PerfectCalibrationBackend(twin)
    return TwinBackend(twin)


class StateRun:
    """One start state's groundings. `timed`: a fresh observation before every grounding and every click."""

    def __init__(self, harness: Harness, truth: Truth, rows: dict[str, list], timed: bool, label: str):
        self.harness, self.truth, self.rows, self.timed, self.label = harness, truth, rows, timed, label

    def observe(self) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        obs = self.harness.call("observe")
        assert obs.success, obs.message
        self.rows["observe_ms"].append((time.perf_counter() - t0) * 1e3)
        self.rows["observe_cpu_ms"].append((time.process_time() - c0) * 1e3)

    def queries(self) -> None:
        truth, rows = self.truth, self.rows
        queries: dict[str, list[int]] = defaultdict(list)
        for i, spec in enumerate(truth.objects):
            queries[f"{spec.color} {spec.kind}"].append(i)
        for query, targets in queries.items():
            if self.timed:
                self.observe()
            t0, c0 = time.perf_counter(), time.process_time()
            outcome, err, value = ground(self.harness, truth, query, targets, "segment")
            if self.timed:
                rows["e2e_ms"].append((time.perf_counter() - t0) * 1e3)
                rows["e2e_cpu_ms"].append((time.process_time() - c0) * 1e3)
            rows["e2e_outcome"].append(outcome)
            rows["e2e_cm"].append(err)
            rows["e2e_kind"].append(truth.objects[targets[0]].kind)
            rows["e2e_lookalike"].append(len(targets) > 1)
            rows["e2e_hidden"].append(all(truth.mask(i).sum() < MIN_VISIBLE_PX for i in targets))
            if outcome == "right":
                truth.geometry_errors(value["owner"], value, rows, "e2e_")
            if outcome != "right" or err > SUCCESS_CM:
                seen = (
                    f" (measured as kind '{value['kind']}', extents "
                    f"{np.round(np.array(value['extents_m']) * 100, 1).tolist()} cm)"
                    if value
                    else ""
                )
                rows["e2e_failures"].append(f"{self.label} {query!r}: {outcome} object, {err:.1f} cm off{seen}")
            p_outcome, p_err, _ = ground(self.harness, truth, query, targets, "point")
            rows["point_success"].append(p_outcome == "right" and p_err <= SUCCESS_CM)

    def oracle_clicks(self) -> None:
        """Per object: mark_point on the pixel of its true mask nearest the mask centre, then measure."""
        truth, rows = self.truth, self.rows
        for i, spec in enumerate(truth.objects):
            mask = truth.mask(i)
            if mask.sum() < MIN_VISIBLE_PX:
                rows["oracle_hidden"].append(spec.name)
                continue
            if self.timed:
                self.observe()
            u, v = click(mask)
            t0, c0 = time.perf_counter(), time.process_time()
            mark = self.harness.call("mark_point", u=float(u), v=float(v), label=spec.describe())
            ok = mark.success
            geom = self.harness.call("measure_object_geometry", object=mark.value["detection_id"]) if ok else mark
            if self.timed:
                rows["mark_ms"].append((time.perf_counter() - t0) * 1e3)
                rows["mark_cpu_ms"].append((time.process_time() - c0) * 1e3)
            if not geom.success:
                rows["oracle_failed"].append(f"{self.label} {spec.name}: {geom.message}")
                continue
            rows["oracle_cm"].append(float(np.linalg.norm(np.array(geom.value["center_m"]) - truth.center(i))) * 100)
            truth.geometry_errors(i, geom.value, rows, "oracle_")


def run(per_task: int, mode: str = "calibrated") -> dict[str, list]:
    """mode: 'calibrated' (headline, timed: a fresh observation per grounding), 'noisy_depth' or
    'perfect_calibration' (one observation per state, untimed)."""
    kin, cfg = Kinematics(), load_config()
    rows: dict[str, list] = defaultdict(list)
    starts = [(task, n) for task in default_suite() for n in range(per_task)]
    timed = mode == "calibrated"
    for task, n in tqdm(starts, desc=f"start states ({mode.replace('_', ' ')})", unit="state"):
        twin = Twin(task)
        start = StartId(task, "wide", n)
        twin.reset(start)
        error = make_layout(twin.task, start).calibration_error["head"]  # evaluation only: reported
        rows["calib_mm"].append(error.translation_m * 1000)
        rows["calib_deg"].append(error.rotation_deg)
        harness = Harness(make_backend(twin, mode, n), cfg, kin)
        twin.observe()  # the renderer exists before the id image is drawn
        state = StateRun(harness, Truth(twin), rows, timed, str(start))
        if not timed:
            state.observe()
        state.queries()
        state.oracle_clicks()
        twin.close()
    return rows


def finite(x: float) -> float | None:
    """JSON has no infinity: a percentile that falls on a failure (infinitely far) is written as null."""
    return float(x) if math.isfinite(x) else None


def pct(a, q: float = 50) -> float:
    return float(np.percentile(a, q))


def e2e_summary(rows: dict[str, list]) -> dict[str, float | None]:
    err = np.array(rows["e2e_cm"])
    right = np.array(rows["e2e_outcome"]) == "right"
    success = right & (err <= SUCCESS_CM)
    return {
        "success_rate": float(success.mean()),
        "center_error_cm_p50": finite(np.median(err)),
        "center_error_cm_p90": finite(np.percentile(err, 90)),
        "center_error_cm_p50_correct": float(np.median(err[right])),
        "center_error_cm_p90_correct": float(np.percentile(err[right], 90)),
        "top1_right_rate": float(right.mean()),
        "point_success_rate": float(np.mean(rows["point_success"])),
    }


def by_kind(rows: dict[str, list]) -> dict[str, dict[str, float]]:
    outcomes, err, kinds = (np.array(rows[k]) for k in ("e2e_outcome", "e2e_cm", "e2e_kind"))
    out = {}
    for k in sorted(set(rows["e2e_kind"])):
        mine, right = kinds == k, (kinds == k) & (outcomes == "right")
        out[k] = {
            "queries": int(mine.sum()),
            "top1_right": int(right.sum()),
            "successes": int((right & (err <= SUCCESS_CM)).sum()),
            "center_error_cm_p50_correct": float(np.median(err[right])) if right.any() else None,
        }
    return out


def headline_table(rows: dict[str, list], e2e: dict) -> None:
    outcomes = np.array(rows["e2e_outcome"])
    observe_ms, e2e_ms, mark_ms, oracle = (np.array(rows[k]) for k in ("observe_ms", "e2e_ms", "mark_ms", "oracle_cm"))
    ratio = pct(observe_ms) / CAPTAIN_OBSERVE_MS
    n = len(outcomes)
    print_table(
        "Perception on the twin, the policy's path (head camera, wide layouts, calibrated cameras; "
        "ground truth only scores)",
        ["metric", "value", "target", "detail"],
        [
            ["e2e success (top-1 right, centre <= 2 cm)", e2e["success_rate"], ">= 0.9", f"{rows['n_success']}/{n}"],
            ["e2e centre error p50 (cm, failures counted)", e2e["center_error_cm_p50"], "<= 1", ""],
            ["e2e centre error p50 (cm, right top-1 only)", e2e["center_error_cm_p50_correct"], "", ""],
            [
                "top-1 detection is the asked object",
                e2e["top1_right_rate"],
                "",
                f"wrong {int((outcomes == 'wrong').sum())}, missing {int((outcomes == 'missing').sum())}",
            ],
            ["e2e success via point()", e2e["point_success_rate"], "", "segmenter top-1, then mark_point"],
            [
                "e2e extent error p50 (cm)",
                pct(rows["e2e_extent_cm"]),
                "<= 1",
                f"p90 {pct(rows['e2e_extent_cm'], 90):.2f}",
            ],
            [
                "e2e yaw error p50 (deg, boxes)",
                pct(rows["e2e_yaw_deg"]),
                "<= 10",
                f"p90 {pct(rows['e2e_yaw_deg'], 90):.1f}",
            ],
            [
                "oracle click: centre error p50 (cm)",
                pct(oracle),
                "",
                f"p90 {pct(oracle, 90):.2f}; {len(oracle)} objects, {len(rows['oracle_failed'])} failed",
            ],
            [
                "observe (ms) p50: 2 cameras + clouds",
                pct(observe_ms),
                "",
                f"{ratio:.2f}x CaPtain's 160 ms; CPU {pct(rows['observe_cpu_ms']):.0f} ms",
            ],
            ["segment + measure (ms) p50, fresh obs", pct(e2e_ms), "<= 50", f"p90 {pct(e2e_ms, 90):.1f}"],
            ["mark_point + measure (ms) p50, fresh obs", pct(mark_ms), "<= 50", f"p90 {pct(mark_ms, 90):.1f}"],
            [
                "head calibration error p50 (mm)",
                pct(rows["calib_mm"]),
                "",
                f"{pct(rows['calib_deg']):.2f} deg p50; max {max(rows['calib_mm']):.1f} mm, "
                f"{max(rows['calib_deg']):.2f} deg",
            ],
        ],
    )


def observe_speed() -> dict:
    """bench/_observe_speed.py: raw render vs observe in-process and over ROS, one table."""
    from _observe_speed import measure

    speed = measure()
    b = speed["observe_breakdown_ms_p50"]
    print_table(
        "observe speed (head + wrist RGB-D 512x512, p50 ms; one start state, arm at home)",
        ["what", "ms", "x raw render"],
        [
            ["raw render, both cameras (the anchor)", speed["raw_render_ms_p50"], 1.0],
            ["observe in-process (render; the clouds built after it answers)", speed["observe_inprocess_ms_p50"],
             speed["observe_inprocess_ratio_to_render"]],
            ["  then the first segment (waits for the clouds)", speed["first_segment_inprocess_ms_p50"], ""],
            ["observe over ROS (/perception/call)", speed["observe_ros_ms_p50"], speed["observe_ros_ratio_to_render"]],
            ["  + the images back and PNG-encoded, as the agent attaches them", speed["observe_ros_images_ms_p50"], ""],
            ["  then the first segment over ROS", speed["first_segment_ros_ms_p50"], ""],
            ["cloud build per camera (background)", b["clouds_per_camera_ms_p50"], ""],
            ["per camera: back-projection", b["backproject_ms_p50"], ""],
            ["per camera: table plane", b["table_ms_p50"], ""],
            ["per camera: robot mask", b["robot_mask_ms_p50"], ""],
            ["per camera: colour names", b["colours_ms_p50"], ""],
            ["per image: PNG encoding", b["png_ms_p50"], ""],
        ],
    )  # fmt: skip
    return speed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-task", type=int, default=10, help="wide start states per task (default 10: 130 states)")
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="only the observe speed (raw render, in-process, over ROS): its keys are updated in the results file",
    )
    args = parser.parse_args()
    speed = observe_speed()
    if args.speed_only:
        path = RESULTS / "perception.json"
        values = json.loads(path.read_text()) if path.is_file() else {}
        values.update(speed, observe_speed_machine=machine())
        path.write_text(json.dumps(values, indent=2) + "\n")
        print(f"\nupdated the observe speed in {path.relative_to(RESULTS.parent.parent)}")
        return 0
    load_at_start = os.getloadavg()[0]
    rows = run(args.per_task)
    rows["load_at_start"] = load_at_start
    noisy = run(args.per_task, "noisy_depth")
    perfect = run(args.per_task, "perfect_calibration")
    e2e, e2e_noisy, e2e_perfect = e2e_summary(rows), e2e_summary(noisy), e2e_summary(perfect)
    outcomes = np.array(rows["e2e_outcome"])
    rows["n_success"] = round(e2e["success_rate"] * len(outcomes))
    headline_table(rows, e2e)
    kinds = by_kind(rows)
    print_table(
        "By kind (e2e, calibrated cameras)",
        ["kind", "queries", "top-1 right", "successes", "centre cm p50 (right)"],
        [
            [k, v["queries"], v["top1_right"], v["successes"], v["center_error_cm_p50_correct"]]
            for k, v in kinds.items()
        ],
    )
    print_table(
        "Same states: noisy depth / perfect calibration (evaluation only)",
        ["metric", "calibrated (headline)", "noisy depth", "perfect calibration"],
        [
            [k, e2e[k], e2e_noisy[k], e2e_perfect[k]]
            for k in ("success_rate", "center_error_cm_p50", "center_error_cm_p50_correct", "top1_right_rate")
        ]
        + [["oracle click centre cm p50", pct(rows["oracle_cm"]), pct(noisy["oracle_cm"]), pct(perfect["oracle_cm"])]],
    )
    for failure in rows["e2e_failures"] + noisy["e2e_failures"]:
        print("e2e failure:", failure)
    for failure in rows["oracle_failed"] + noisy["oracle_failed"]:
        print("oracle click failed:", failure)
    observe_ms = np.array(rows["observe_ms"])
    write_results(
        "perception",
        {
            "e2e_success_rate": e2e["success_rate"],
            "e2e_center_error_cm_p50": e2e["center_error_cm_p50"],
            "observe_ms_p50": pct(observe_ms),
            "observe_ratio_to_captain": pct(observe_ms) / CAPTAIN_OBSERVE_MS,
            "e2e_segment_measure_ms_p50": pct(rows["e2e_ms"]),
            "mark_measure_ms_p50": pct(rows["mark_ms"]),
            **{k: v for k, v in speed.items() if not isinstance(v, dict)},
        },
        {
            "observe_breakdown_ms_p50": speed["observe_breakdown_ms_p50"],
            "observe_speed_machine": machine(),
            "e2e_success_criterion_cm": SUCCESS_CM,
            "load_average_1min_at_end": os.getloadavg()[0],  # other jobs on the machine skew the timings
            **{f"e2e_{k}": v for k, v in e2e.items() if k not in ("success_rate", "center_error_cm_p50")},
            "e2e_extent_error_cm_p50": pct(rows["e2e_extent_cm"]),
            "e2e_yaw_error_deg_p50": pct(rows["e2e_yaw_deg"]),
            "e2e_queries": len(outcomes),
            "e2e_successes": rows["n_success"],
            "e2e_wrong": int((outcomes == "wrong").sum()),
            "e2e_missing": int((outcomes == "missing").sum()),
            "e2e_lookalike_queries": int(np.sum(rows["e2e_lookalike"])),
            "e2e_hidden_queries": int(np.sum(rows["e2e_hidden"])),
            "e2e_by_kind": kinds,
            "e2e_failures": rows["e2e_failures"],
            "observe_ms_p90": pct(observe_ms, 90),
            # CPU seconds of this process (all its threads) per call: less sensitive to other jobs than wall time
            "observe_cpu_ms_p50": pct(rows["observe_cpu_ms"]),
            "e2e_segment_measure_cpu_ms_p50": pct(rows["e2e_cpu_ms"]),
            "mark_measure_cpu_ms_p50": pct(rows["mark_cpu_ms"]),
            "load_average_1min_at_start": rows["load_at_start"],
            "observe_anchor_ms": CAPTAIN_OBSERVE_MS,
            "e2e_segment_measure_ms_p90": pct(rows["e2e_ms"], 90),
            "mark_measure_ms_p90": pct(rows["mark_ms"], 90),
            "oracle_click_center_error_cm_p50": pct(rows["oracle_cm"]),
            "oracle_click_center_error_cm_p90": pct(rows["oracle_cm"], 90),
            "oracle_click_extent_error_cm_p50": pct(rows["oracle_extent_cm"]),
            "oracle_click_yaw_error_deg_p50": pct(rows["oracle_yaw_deg"]),
            "oracle_click_objects": len(rows["oracle_cm"]),
            "oracle_click_failures": len(rows["oracle_failed"]),
            "head_calibration_error_mm_p50": pct(rows["calib_mm"]),
            "head_calibration_error_deg_p50": pct(rows["calib_deg"]),
            "start_states": args.per_task * len(default_suite()),
            **{f"noisy_depth_e2e_{k}": v for k, v in e2e_noisy.items()},
            "noisy_depth_e2e_failures": noisy["e2e_failures"],
            "noisy_depth_oracle_click_center_error_cm_p50": pct(noisy["oracle_cm"]),
            "noisy_depth_oracle_click_failures": len(noisy["oracle_failed"]),
            **{f"perfect_calibration_e2e_{k}": v for k, v in e2e_perfect.items()},
            "perfect_calibration_e2e_failures": perfect["e2e_failures"],
            "perfect_calibration_oracle_click_center_error_cm_p50": pct(perfect["oracle_cm"]),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

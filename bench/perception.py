#!/usr/bin/env python3
"""Perception accuracy and latency on the twin, against ground truth read only by this benchmark.

Over wide-layout start states of every task (4 per task, 52 in all), head camera, arm at home:

center_error_cm_p50   mark_point on a pixel of each object (the pixel of its ground-truth mask nearest the
                      mask centre, as a policy would click), then measure_object_geometry: distance from the
                      true centre of the object's bounding box
extent_error_cm_p50   largest error of the three extents (footprint sides sorted, height) per object
yaw_error_deg_p50     boxes (cubes, blocks, open boxes), modulo the footprint's symmetry (90 or 180 deg)
segment_recall        segment("<colour> <kind>") finds the object with IoU > 0.5 against its true mask
mark_measure_ms_p50   mark_point + measure_object_geometry on an observation (after observe)
The drawer cabinet is excluded: fixed furniture, mostly outside the head camera's view of its back.
The same states are then measured again with noisy depth (a structured-light error model) and
reported beside, as noisy_depth_* keys.

  python bench/perception.py     # prints tables, writes bench/results/perception.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
from _common import print_table, write_results
from tqdm import tqdm

from captain_ros.core.kinematics import Kinematics
from captain_ros.harness.config import load_config
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin
from captain_ros.twin.start_states import StartId
from captain_ros.twin.tasks import default_suite

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


SQUARE_KINDS = {"cube", "block"}


def yaw_error_deg(measured: float, truth: float, period: float) -> float:
    d = (measured - truth) % period
    return float(min(d, period - d))


def click(mask: np.ndarray) -> tuple[float, float]:
    """The mask pixel nearest the mask's centroid, as fractions of width and height."""
    v, u = np.nonzero(mask)
    i = int(np.argmin((u - u.mean()) ** 2 + (v - v.mean()) ** 2))
    h, w = mask.shape
    return u[i] / (w - 1), v[i] / (h - 1)


def run(per_task: int, noisy: bool = False) -> dict[str, list]:
    kin, cfg = Kinematics(), load_config()
    rows: dict[str, list] = defaultdict(list)
    starts = [(task, n) for task in default_suite() for n in range(per_task)]
    for task, n in tqdm(starts, desc="start states" + (" (noisy depth)" if noisy else ""), unit="state"):
        twin = Twin(task)
        twin.reset(StartId(task, "wide", n))
        backend = NoisyDepthBackend(twin, seed=n) if noisy else TwinBackend(twin)
        harness = Harness(backend, cfg, kin)
        obs = harness.call("observe", cameras=["head"])
        assert obs.success, obs.message
        truth_ids = twin._rig.render_body_ids(twin.data, "head")  # evaluation only
        for spec in twin.task.objects:
            if spec.kind == "cabinet":
                continue
            truth = truth_ids == twin.model.body(spec.name).id
            if truth.sum() < MIN_VISIBLE_PX:
                rows["hidden"].append(spec.name)
                continue
            seg = harness.call("segment", text=f"{spec.color} {spec.kind}")
            best = 0.0
            if seg.success:
                for det in seg.value["detections"]:
                    mask = harness.perception.detections[det["detection_id"]].mask
                    best = max(best, (mask & truth).sum() / (mask | truth).sum())
            rows["recall"].append(best > 0.5)
            rows["iou"].append(best)
            u, v = click(truth)
            t0 = time.perf_counter()
            mark = harness.call("mark_point", u=float(u), v=float(v), label=spec.describe())
            geom = harness.call("measure_object_geometry", object=mark.value["detection_id"]) if mark.success else mark
            rows["ms"].append((time.perf_counter() - t0) * 1e3)
            if not geom.success:
                rows["failed"].append(f"{task}/{n} {spec.name}: {geom.message}")
                continue
            r = twin.reader.rotation(spec.name)
            center = twin.reader.position(spec.name) + r @ np.array([0.0, 0.0, spec.size_m[2] / 2])
            measured = np.array(geom.value["center_m"])
            ext = np.array(geom.value["extents_m"])
            true_ext = np.array([*sorted(spec.size_m[:2], reverse=True), spec.size_m[2]])
            rows["kind"].append(spec.kind)
            rows["center_cm"].append(float(np.linalg.norm(measured - center)) * 100)
            rows["extent_cm"].append(float(np.abs(ext - true_ext).max()) * 100)
            if spec.kind in SQUARE_KINDS | {"box"}:
                true_yaw = float(np.degrees(np.arctan2(r[1, 0], r[0, 0])))
                if spec.kind == "box" and spec.size_m[1] > spec.size_m[0]:
                    true_yaw += 90.0  # the measured yaw is of the long side
                period = 90.0 if spec.kind in SQUARE_KINDS else 180.0
                rows["yaw_deg"].append(yaw_error_deg(geom.value["yaw_deg"], true_yaw, period))
        twin.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-task", type=int, default=4, help="wide start states per task (default 4: 52 states)")
    args = parser.parse_args()
    rows = run(args.per_task)
    noisy = run(args.per_task, noisy=True)
    noisy_metrics = {
        "noisy_depth_center_error_cm_p50": float(np.median(noisy["center_cm"])),
        "noisy_depth_extent_error_cm_p50": float(np.median(noisy["extent_cm"])),
        "noisy_depth_yaw_error_deg_p50": float(np.median(noisy["yaw_deg"])),
        "noisy_depth_segment_recall": float(np.mean(noisy["recall"])),
    }
    center, extent, yaw = (np.array(rows[k]) for k in ("center_cm", "extent_cm", "yaw_deg"))
    recall, ms = float(np.mean(rows["recall"])), np.array(rows["ms"])
    kinds = np.array(rows["kind"])
    print_table(
        "Perception on the twin (head camera, wide layouts; ground truth read only here)",
        ["metric", "value", "target", "detail"],
        [
            ["centre error p50 (cm)", float(np.median(center)), "<= 1", f"p90 {np.percentile(center, 90):.2f}"],
            ["extent error p50 (cm)", float(np.median(extent)), "<= 1", f"p90 {np.percentile(extent, 90):.2f}"],
            ["yaw error p50 (deg, boxes)", float(np.median(yaw)), "<= 10", f"p90 {np.percentile(yaw, 90):.1f}"],
            ["segment recall (IoU > 0.5)", recall, ">= 0.9", f"{sum(rows['recall'])}/{len(rows['recall'])}"],
            ["mark_point + measure (ms) p50", float(np.median(ms)), "<= 50", f"p90 {np.percentile(ms, 90):.1f}"],
        ],
    )
    print_table(
        "By kind",
        ["kind", "n", "centre cm p50", "extent cm p50"],
        [
            [k, int((kinds == k).sum()), float(np.median(center[kinds == k])), float(np.median(extent[kinds == k]))]
            for k in sorted(set(rows["kind"]))
        ],
    )
    print_table(
        "Same states with noisy depth (sigma 1.5 mm * z^2, 2% holes, 1 mm steps)",
        ["metric", "value"],
        [[k.removeprefix("noisy_depth_"), v] for k, v in noisy_metrics.items()],
    )
    for failure in rows["failed"] + noisy["failed"]:
        print("measure failed:", failure)
    write_results(
        "perception",
        {
            "center_error_cm_p50": float(np.median(center)),
            "extent_error_cm_p50": float(np.median(extent)),
            "yaw_error_deg_p50": float(np.median(yaw)),
            "segment_recall": recall,
            "mark_measure_ms_p50": float(np.median(ms)),
        },
        {
            "objects": len(rows["recall"]),
            "start_states": args.per_task * len(default_suite()),
            "hidden_objects": len(rows["hidden"]),
            "measure_failures": len(rows["failed"]),
            "center_error_cm_p90": float(np.percentile(center, 90)),
            "extent_error_cm_p90": float(np.percentile(extent, 90)),
            "yaw_error_deg_p90": float(np.percentile(yaw, 90)),
            "segment_iou_p50": float(np.median(rows["iou"])),
            **noisy_metrics,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

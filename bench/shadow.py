#!/usr/bin/env python3
"""The shadow check on scripted safe and unsafe motions, in a "real" twin with hidden differences.

The "real" arm is the twin of a pick-and-place task with a purple post (a tall block) added, every object's mass
scaled by a hidden factor in [0.5, 2] and its friction by one in [0.6, 1.4]. The harness measures the scene with its
own perception (observe, segment each object by name, measure_object_geometry); the shadow twin is built from those
measurements only (their perception error is the pose error). Each scripted motion starts from the same scene (reset,
then unchecked set-up moves), is checked by the shadow (its prediction, not acted on here) and then executed on the
"real" twin regardless, where a Witness (harness/shadow.py) scores it with the real twin's contact forces: GROUND
TRUTH, used only to label the motion, never in the check's path. A motion is unsafe when the real execution hit
something with an arm link, exceeded the force limit, or pushed an object off the table.

shadow_check_ms_p50                 wall time of one shadow check (build the scene when measurements changed, place it,
                                    settle 0.1 s, play the action), p50 over all checks; target <= 200 ms. The "real"
                                    arm's harness runs at a real arm's 10 ms period (REAL_ARM_PERIOD_S), as the shadow's
                                    then does; physics and the witness run every 2 ms in both
shadow_refusal_recall               unsafe motions (by the real outcome) the shadow refused / unsafe motions
shadow_false_refusal_rate           safe motions it refused / safe motions
predicted_stop_reason_agreement     the predicted outcome (a motion's stop reason, a jaw's holding or not) equals the
                                    real one, over all motions
check_ratio_to_raw_physics_p50      a check's wall time over the raw work in it: MuJoCo's mj_step alone for the
                                    simulated time the check played, timed on that scene's shadow twin in the same run

  python bench/shadow.py              # 4 tasks x 2 held-out starts x 7 scripted motions
  python bench/shadow.py --starts 11,12,13
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is imported: the harness renders offscreen
import mujoco
import numpy as np
from _common import print_table, write_results
from tqdm import tqdm

from captain_ros.core.config import load_config
from captain_ros.harness.harness import Harness
from captain_ros.harness.shadow import WatchedBackend, Witness, force_limit
from captain_ros.twin.objects import SceneObject
from captain_ros.twin.sim import Twin
from captain_ros.twin.tasks import get_task

# The "real" arm's harness period: a real arm's joint states come at 100 Hz (the motion node's control_period_s), and
# the shadow twin's harness monitors at the real harness's period (its physics and witness still run every 2 ms).
REAL_ARM_PERIOD_S = 0.01
TASKS = ("put_red_cube_in_bowl", "put_green_cube_on_plate", "put_blue_cube_in_box", "put_cup_on_plate")
POST = SceneObject("purple_post", "block", "purple", (0.05, 0.05, 0.3), mass_kg=0.5)
POST_SPOTS = tuple((x, y) for x in (0.33, 0.28) for y in (0.0, -0.12, 0.12, -0.22, 0.22, 0.3))  # first one clear
SAFE_FAMILIES = (  # by intent; the label is the real outcome
    "transfer_high",
    "descend_above",
    "descend_onto_slowly",
    "jaw_close",
    "sweep_over_post",
    "sweep_wide_of_post",
    "touch_table_slowly",
)
UNSAFE_FAMILIES = ("sweep_past_post", "strike_table_fast")  # by intent; the label is the real outcome


def down(xyz, yaw_deg: float = 0.0) -> dict:
    return {"position": [float(v) for v in xyz], "yaw_deg": yaw_deg}


def scene(task_name: str, start: str, seed: int) -> tuple[Twin, dict]:
    """The "real" twin: the task with the post where it is clear of the layout, masses and friction changed."""
    base = get_task(task_name)
    spot = next(s for s in POST_SPOTS if all(np.hypot(s[0] - x, s[1] - y) > 0.14 for x, y, _ in base.layout.values()))
    task = replace(base, objects=(*base.objects, POST), layout={**base.layout, POST.name: (*spot, 0.0)})
    twin = Twin(task)
    rng = np.random.default_rng(seed)
    hidden = {}
    for obj in task.objects:
        body = twin.model.body(obj.name).id
        mass, friction = rng.uniform(0.5, 2.0), rng.uniform(0.6, 1.4)
        twin.model.body_mass[body] *= mass
        twin.model.body_inertia[body] *= mass
        twin.model.geom_friction[twin.model.geom_bodyid == body, 0] *= friction
        hidden[obj.name] = {"mass_x": round(float(mass), 3), "friction_x": round(float(friction), 3)}
    twin.reset(f"{task_name}/official/{start}")
    return twin, {"post_xy": spot, "hidden": hidden}


def measure_scene(harness: Harness, twin: Twin) -> list[str]:
    """Observe from home and measure every object the perception finds by its name; returns the names found."""
    assert harness.call("observe").success
    found = []
    for obj in twin.task.objects:
        seg = harness.call("segment", text=obj.describe())
        if not seg.success:
            continue
        det = seg.value["detections"][0]["detection_id"]
        if harness.call("measure_object_geometry", object=det).success:
            found.append(obj.name)
    return found


def sweep(family: str, x: float, y: float, z: float) -> tuple:
    """A 50 cm sweep along y at (x, z), centred on y, reached from 18 cm above its start."""
    start = (x, y - 0.25)
    setup = [("move_to", {"pose": down((*start, z + 0.18))}), ("move_to", {"pose": down((*start, z))})]
    return family, setup, "move_to", {"pose": down((x, y + 0.25, z))}


def motions(twin: Twin, post_xy) -> list[tuple[str, list[tuple[str, dict]], str, dict]]:
    """(family, set-up calls, capability, arguments) of the scripted motions. Positions come from the task's layout
    (the script is the experimenter; the shadow only sees measurements)."""
    layout = {o.name: twin.task.layout[o.name] for o in twin.task.objects if o.name != POST.name}
    a, b = list(layout)[:2]
    (ax, ay, _), (bx, by, _) = layout[a], layout[b]
    top = twin.task.object(a).height_m
    px, py = post_xy
    free = (0.6, -0.35 if ay > 0 else 0.35)
    return [
        ("transfer_high", [("move_to", {"pose": down((ax, ay, 0.3))})], "move_to", {"pose": down((bx, by, 0.3))}),
        (
            "descend_above",
            [("move_to", {"pose": down((ax, ay, 0.3))})],
            "move_to",
            {"pose": down((ax, ay, top + 0.05))},
        ),
        (
            "descend_onto_slowly",
            [("move_to", {"pose": down((ax, ay, top + 0.1))})],
            "move_to",
            {"pose": down((ax, ay, top - 0.03)), "speed_mps": 0.02},
        ),
        ("jaw_close", [("move_to", {"pose": down((bx, by, 0.3))})], "move_to", {"gripper": "close"}),
        sweep("sweep_past_post", px + 0.1, py, 0.12),  # the hand clears the post, the forearm does not
        sweep("sweep_over_post", px + 0.1, py, 0.45),
        sweep("sweep_wide_of_post", px + 0.25, py, 0.12),
        (
            "touch_table_slowly",
            [("move_to", {"pose": down((*free, 0.1))})],
            "move_to",
            {"pose": down((*free, 0.0)), "speed_mps": 0.02},
        ),
        (
            "strike_table_fast",
            [("move_to", {"pose": down((*free, 0.15))})],
            "move_to",
            {"pose": down((*free, 0.0)), "speed_mps": 0.25},
        ),
    ]


def raw_step_s(twin: Twin, steps: int = 2000) -> float:
    """Seconds of one bare mj_step on `twin`'s model from its current state (a copy of it): the raw work."""
    data = mujoco.MjData(twin.model)
    mujoco.mj_copyData(data, twin.model, twin.data)
    t0 = time.perf_counter()
    for _ in range(steps):
        mujoco.mj_step(twin.model, data)
    return (time.perf_counter() - t0) / steps


def run_motion(twin, start, harness, shadow, measured, *, setup, capability, kwargs) -> dict:
    twin.reset(start)
    harness.new_episode("bench")
    harness.shadow = None  # set-up moves run unchecked
    for name, args in setup:
        harness.call(name, **args)
    shadow.measured = dict(measured)
    state = harness.backend.read_state(require_force=False)
    predicted = shadow.predict(capability, kwargs, state)
    witness = harness.backend.witness
    witness.begin()
    result = harness.call(capability, **kwargs)  # executed whatever the shadow said: its real outcome scores it
    truth = witness.verdict(result, force_limit(harness.config.safety, kwargs))
    return {
        "refused": bool(predicted.refusal),
        "unsafe": bool(truth.refusal),
        "why_unsafe": truth.refusal,
        "refusal": predicted.refusal,
        "predicted": predicted.outcome,
        "actual": truth.outcome,
        "predicted_distance_m": predicted.executed_distance_m,
        "actual_distance_m": truth.executed_distance_m,
        "predicted_peak_n": predicted.peak_force_n,
        "actual_peak_n": truth.peak_force_n,
        "check_ms": predicted.check_ms,
        "simulated_s": predicted.simulated_s,
        "motion_s": float((result.value or {}).get("duration_s") or 0.0),  # the arm's own time for it
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", default="11,12", help="official held-out start states per task")
    args = parser.parse_args()
    starts = [s.strip() for s in args.starts.split(",") if s.strip()]
    config = load_config()
    rows = []
    jobs = [(t, s) for t in TASKS for s in starts]
    bar = tqdm(
        total=len(jobs) * (len(SAFE_FAMILIES) + len(UNSAFE_FAMILIES)), desc="shadow-checked motions", unit="motion"
    )
    for k, (task, start) in enumerate(jobs):
        twin, info = scene(task, start, seed=k)
        backend = WatchedBackend(twin, Witness(twin, config.safety), REAL_ARM_PERIOD_S)
        harness = Harness(backend, config)
        harness.enable_shadow()
        shadow = harness.shadow
        found = measure_scene(harness, twin)
        measured = dict(shadow.measured)
        first = len(rows)
        for family, setup, capability, kwargs in motions(twin, info["post_xy"]):
            row = run_motion(
                twin,
                f"{task}/official/{start}",
                harness,
                shadow,
                measured,
                setup=setup,
                capability=capability,
                kwargs=kwargs,
            )
            rows.append({"task": task, "start": start, "family": family, "measured": found, **row})
            bar.update()
        shadow_twin = shadow._scene()[0]  # this scene's shadow twin, as its checks left it
        step_s = raw_step_s(shadow_twin)
        for row in rows[first:]:
            raw_ms = 1e3 * step_s * row["simulated_s"] / float(shadow_twin.model.opt.timestep)
            row["raw_physics_ms"], row["check_ratio_to_raw_physics"] = raw_ms, row["check_ms"] / raw_ms
        shadow.close()
        twin.close()
    bar.close()

    unsafe = [r for r in rows if r["unsafe"]]
    safe = [r for r in rows if not r["unsafe"]]
    recall = float(np.mean([r["refused"] for r in unsafe])) if unsafe else float("nan")
    false_rate = float(np.mean([r["refused"] for r in safe])) if safe else float("nan")
    agreement = float(np.mean([r["predicted"] == r["actual"] for r in rows]))
    check_ms = [r["check_ms"] for r in rows]
    timed = [r for r in rows if r["motion_s"] > 0]
    ratio = float(np.median([r["check_ms"] / 1e3 / r["motion_s"] for r in timed])) if timed else float("nan")
    table = []
    for family in (*SAFE_FAMILIES, *UNSAFE_FAMILIES):
        mine = [r for r in rows if r["family"] == family]
        table.append(
            [
                family,
                len(mine),
                sum(r["unsafe"] for r in mine),
                sum(r["refused"] for r in mine),
                sum(r["refused"] and r["unsafe"] for r in mine),
                float(np.mean([r["predicted"] == r["actual"] for r in mine])),
                float(np.median([r["check_ms"] for r in mine])),
            ]
        )
    print_table(
        f"Shadow check on scripted motions ({len(jobs)} scenes with hidden mass/friction differences; unsafe = by "
        "the real outcome)",
        ["family", "motions", "unsafe", "refused", "refused & unsafe", "outcome agreement", "check ms p50"],
        table,
    )
    print_table(
        "Headline",
        ["metric", "value"],
        [
            ["shadow_refusal_recall", recall],
            ["shadow_false_refusal_rate", false_rate],
            ["predicted_stop_reason_agreement", agreement],
            ["shadow_check_ms_p50", float(np.median(check_ms))],
            ["raw physics in a check (mj_step alone), p50 ms", float(np.median([r["raw_physics_ms"] for r in rows]))],
            ["check time / its raw physics, p50", float(np.median([r["check_ratio_to_raw_physics"] for r in rows]))],
            ["check time / the motion's own duration, p50", ratio],
        ],
    )
    for r in rows:
        if r["refused"] != r["unsafe"]:
            print(
                f"  {'missed' if r['unsafe'] else 'false refusal'}: {r['task']}/{r['start']} {r['family']}: "
                f"{r['why_unsafe'] or r['refusal']}"
            )
    write_results(
        "shadow",
        {
            "shadow_check_ms_p50": float(np.median(check_ms)),
            "shadow_refusal_recall": recall,
            "shadow_false_refusal_rate": false_rate,
            "predicted_stop_reason_agreement": agreement,
        },
        {
            "unsafe_motions": len(unsafe),
            "safe_motions": len(safe),
            "refused_unsafe": sum(r["refused"] for r in unsafe),
            "refused_safe": sum(r["refused"] for r in safe),
            "scene_count": len(jobs),
            "check_ms_p90": float(np.percentile(check_ms, 90)),
            "check_to_motion_time_ratio_p50": ratio,
            "raw_physics_ms_p50": float(np.median([r["raw_physics_ms"] for r in rows])),
            "check_ratio_to_raw_physics_p50": float(np.median([r["check_ratio_to_raw_physics"] for r in rows])),
            "scenes": [f"{t}/official/{s}" for t, s in jobs],
            "motions": rows,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Guarded-motion benchmark on the twin backend (in-process harness core).

contact_stop_error_mm_p95  top-down guarded descents onto the table at 50 free spots: TCP travel
                           between the first finger-table contact and where the arm came to rest
                           (target: every run within 5 mm)
sweep_deviation_mm_max     20 cm straight sweeps in 12 directions: largest distance of the measured
                           TCP from the straight line (target < 5 mm)
cancel_to_stop_ms_p50      cancel at a random point of a motion: time until the commanded velocity
                           is zero (target: one control period)
ik_ms_p50                  damped-least-squares IK per top-down pose, with mink (QP-based, same
                           model) measured on the same targets for comparison
ros_overhead_ratio         the same 10 cm move_to through motion_node's MoveTo action vs the harness core
                           called in-process, both driving twin_node (real time) via ros2_control
force_limit_overshoot_n    manipulation-mode descents into the table (15 N limit, 2 cm/s): peak force
                           minus the limit, on the twin backend (checked every 2 ms physics step) and
                           on the ros2_control backend over DDS (checked at the 100 Hz joint-state
                           rate, in a client process that the OS may stall)

  python bench/motion.py     # prints tables, writes bench/results/motion.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import mujoco
import numpy as np
from _common import print_table, write_results
from tqdm import tqdm

from captain_ros.core.kinematics import Kinematics, top_down_rotation
from captain_ros.harness.config import load_config
from captain_ros.harness.harness import Harness
from captain_ros.harness.motion import Planner
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin import robot
from captain_ros.twin.sim import Twin
from captain_ros.twin.start_states import StartId

TASK = "put_blue_cube_in_box"
PAD_BODIES = ("panda_leftfinger", "panda_rightfinger")


class ContactWatch(TwinBackend):
    """The twin backend, recording the TCP height at the first finger-table contact."""

    def __init__(self, twin: Twin):
        super().__init__(twin)
        m = twin.model
        self.table = m.geom("table_top").id
        self.pads = {m.body(b).id for b in PAD_BODIES}
        self.first_contact_tcp = None
        self.stop_at = None
        self.periods = 0
        self.setpoint_speeds: list[tuple[int, float]] = []  # (period, largest commanded joint speed)
        self.harness: Harness | None = None

    def wait_period(self) -> None:
        super().wait_period()
        self.periods += 1
        d, m = self.twin.data, self.twin.model
        if self.first_contact_tcp is None:
            for c in d.contact[: d.ncon]:
                pair = {c.geom1, c.geom2}
                if self.table in pair and ({m.geom_bodyid[g] for g in pair} & self.pads):
                    self.first_contact_tcp = self.twin.tcp_pose()[0]
                    break
        self.setpoint_speeds.append((self.periods, float(np.abs(self.commanded()[1]).max())))
        if self.stop_at is not None and self.periods == self.stop_at:
            self.harness.cancel()


def free_spot(twin: Twin, rng: np.random.Generator) -> np.ndarray:
    objects = [twin.reader.position(o.name) for o in twin.task.objects]
    radii = [o.footprint_radius_m for o in twin.task.objects]
    while True:
        p = np.array([rng.uniform(0.35, 0.7), rng.uniform(-0.3, 0.3)])
        # the hand is 20 cm wide along the jaw axis: keep it clear of every object
        if all(np.linalg.norm(p - o[:2]) > r + 0.14 for o, r in zip(objects, radii, strict=True)):
            return p


def bench_contact(runs: int, kin: Kinematics) -> list[float]:
    cfg = load_config()
    rng = np.random.default_rng(0)
    errors = []
    for i in tqdm(range(runs), desc="guarded descents", unit="run"):
        twin = Twin(TASK)
        twin.reset(StartId(TASK, "wide", 100 + 10 * i))
        backend = ContactWatch(twin)
        harness = Harness(backend, cfg, kin)
        xy = free_spot(twin, rng)
        yaw = float(rng.uniform(-90, 90))
        harness.call("move_to", pose={"position": [*xy, 0.08], "yaw_deg": yaw})
        backend.first_contact_tcp = None
        result = harness.call(
            "move_to", pose={"position": [*xy, -0.0], "yaw_deg": yaw}, speed_mps=float(rng.uniform(0.03, 0.1))
        )
        if result.value is None or result.value["stop_reason"] != "contact" or backend.first_contact_tcp is None:
            raise RuntimeError(f"run {i}: the descent did not stop on contact: {result.receipt}")
        rest = np.array(result.value["tcp_position_m"])
        errors.append(float(np.linalg.norm(backend.first_contact_tcp - rest)) * 1e3)
    return errors


def bench_sweeps(kin: Kinematics) -> list[float]:
    cfg = load_config()
    deviations = []
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    harness = Harness(TwinBackend(twin), cfg, kin)
    center = np.array([0.5, 0.0, 0.3])
    for k in range(12):
        angle = np.pi * k / 12
        direction = np.array([np.cos(angle), np.sin(angle), 0.0]) if k % 3 else np.array([np.cos(angle), 0.0, 0.6])
        direction /= np.linalg.norm(direction)
        a, b = center - 0.1 * direction, center + 0.1 * direction
        harness.call("move_to", pose={"position": list(a), "yaw_deg": 0})
        result = harness.call("move_to", pose={"position": list(b), "yaw_deg": 0}, speed_mps=0.1)
        assert result.success, result.message
        trace = harness.motions[-1].outcome.trace
        ab = b - a
        worst = 0.0
        for row in trace:
            s = np.clip(np.dot(row.tcp_m - a, ab) / np.dot(ab, ab), 0, 1)
            worst = max(worst, float(np.linalg.norm(row.tcp_m - (a + s * ab))))
        deviations.append(worst * 1e3)
    return deviations


def bench_cancel(runs: int, kin: Kinematics) -> list[float]:
    cfg = load_config()
    rng = np.random.default_rng(1)
    latencies = []
    for _ in tqdm(range(runs), desc="cancels", unit="run"):
        twin = Twin(TASK)
        twin.reset(StartId(TASK, "official", 0))
        backend = ContactWatch(twin)
        harness = Harness(backend, cfg, kin)
        backend.harness = harness
        backend.stop_at = int(rng.integers(50, 600))
        result = harness.call("move_to", pose={"position": [0.45, float(rng.uniform(-0.25, 0.25)), 0.2], "yaw_deg": 0})
        assert result.failure_category.value == "canceled", result.receipt
        moving = [p for p, speed in backend.setpoint_speeds if p == backend.stop_at and speed > 1e-6]
        assert moving, "the arm must be commanded to move when the cancel comes"
        zero = next(p for p, speed in backend.setpoint_speeds if p > backend.stop_at and speed == 0.0)
        latencies.append((zero - backend.stop_at) * backend.control_period_s * 1e3)
    return latencies


def _launch(*args: str) -> subprocess.Popen:
    exe = shutil.which(args[0]) or str(Path(sys.executable).with_name(args[0]))
    return subprocess.Popen([exe, *args[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


# link-loss limit for the ROS runs: on this 2-core VM a process can stall past the production 0.5 s, which would
# abort the benchmark (link loss itself is tested in tests/ros/test_backends.py)
STATE_TIMEOUT_S = 2.0
FORCE_LIMIT_N = 15.0
FORCE_SPEED_MPS = 0.02


def force_limit_overshoots(harness: Harness, spots: list[np.ndarray], desc: str) -> list[float]:
    """Press into the table in manipulation mode at each spot; returns peak force minus the limit (N)."""
    overshoots = []
    for xy in tqdm(spots, desc=desc, unit="run"):
        above = harness.call("move_to", pose={"position": [*xy, 0.05], "yaw_deg": 0})
        if not above.success:
            raise RuntimeError(f"move above {xy}: {above.message}")
        result = harness.call(
            "move_to",
            pose={"position": [*xy, 0.0], "yaw_deg": 0},
            mode="manipulation",
            force_limit_n=FORCE_LIMIT_N,
            speed_mps=FORCE_SPEED_MPS,
        )
        if result.value is None or result.value["stop_reason"] != "force_limit":
            raise RuntimeError(f"the descent at {xy} did not stop at the force limit: {result.receipt}")
        overshoots.append(result.value["peak_force_n"] - FORCE_LIMIT_N)
        # straight up off the table: unloading the wrist is no contact, so in manipulation mode too
        lift = harness.call("move_to", pose={"position": [*xy, 0.05], "yaw_deg": 0}, mode="manipulation")
        if not lift.success:
            raise RuntimeError(f"lift at {xy}: {lift.message}")
    return overshoots


def force_spots(runs: int) -> list[np.ndarray]:
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    rng = np.random.default_rng(1)
    return [free_spot(twin, rng) for _ in range(runs)]


def bench_force_twin(spots: list[np.ndarray], kin: Kinematics) -> list[float]:
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    return force_limit_overshoots(Harness(TwinBackend(twin), load_config(), kin), spots, "force-limit descents, twin")


def bench_ros(moves: int, spots: list[np.ndarray], kin: Kinematics) -> dict:
    """twin_node (real time, its own process) driven through the ros2_control backend over DDS.
    Overhead: the same 10 cm move_to, alternately through motion_node's MoveTo action and by calling the
    harness core in this process, so the only difference is the ROS layer of the motion node.
    Then force-limit descents with the in-process core on the ros2_control backend."""
    os.environ.setdefault("ROS_DOMAIN_ID", str(151 + os.getpid() % 80))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    import rclpy
    import yaml
    from rclpy.action import ActionClient
    from rclpy.executors import MultiThreadedExecutor

    from captain_interfaces.action import MoveTo
    from captain_ros.paths import config_path
    from captain_ros.ros.ros2_control_backend import Ros2ControlBackend

    procs = [
        _launch(
            "twin_node",
            *("--ros-args", "-p", f"task:={TASK}", "-p", f"start_id:={TASK}/official/0", "-p", "camera_rate_hz:=0.0"),
        ),
        _launch("motion_node", "--ros-args", "-p", "watchdog:=false", "-p", f"state_timeout_s:={STATE_TIMEOUT_S}"),
    ]
    rclpy.init()
    node = rclpy.create_node("bench_motion")
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    try:
        interfaces = yaml.safe_load(config_path("robot.yaml").read_text())["interfaces"]
        backend = Ros2ControlBackend(node, interfaces, state_timeout_s=STATE_TIMEOUT_S)
        backend.wait_for_state(60)
        harness = Harness(backend, load_config(), kin)
        action = ActionClient(node, MoveTo, "/harness/move_to")
        if not action.wait_for_server(timeout_sec=60):
            raise RuntimeError("motion_node did not come up")
        targets = [np.array([0.5, -0.05, 0.3]), np.array([0.5, 0.05, 0.3])]
        harness.call("move_to", pose={"position": list(targets[0]), "yaw_deg": 0})  # the first timed move goes to 1
        times: dict[str, list[float]] = {"ros": [], "in_process": []}

        def through_ros(target: np.ndarray) -> str:
            goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE)
            goal.pose.pose.position.x, goal.pose.pose.position.y, goal.pose.pose.position.z = map(float, target)
            goal.pose.pose.orientation.x, goal.pose.pose.orientation.w = 1.0, 0.0
            done = threading.Event()
            future = action.send_goal_async(goal)
            future.add_done_callback(lambda _f: done.set())
            done.wait(30)
            result = future.result().get_result_async()
            finished = threading.Event()
            result.add_done_callback(lambda _f: finished.set())
            finished.wait(60)
            call = result.result().result.result
            return "" if call.success else f"{call.failure_category}: {call.message}"

        def in_process(target: np.ndarray) -> str:
            backend.resync()  # the motion node moved the arm since this harness last did
            call = harness.call("move_to", pose={"position": list(target), "yaw_deg": 0})
            return "" if call.success else f"{call.failure_category.value}: {call.message}"

        k = 0
        for i in tqdm(range(moves), desc="move_to via ROS / in-process", unit="pair"):
            for way in ("ros", "in_process") if i % 2 == 0 else ("in_process", "ros"):
                k += 1
                t0 = time.perf_counter()
                failure = (through_ros if way == "ros" else in_process)(targets[k % 2])
                times[way].append(time.perf_counter() - t0)
                if failure:
                    raise RuntimeError(f"move_to {way} failed: {failure}")
        backend.resync()
        overshoots = force_limit_overshoots(harness, spots, "force-limit descents, ros2_control")
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown()
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    ros, local = np.median(times["ros"]), np.median(times["in_process"])
    return {
        "ratio": float(ros / local),
        "ros_s_p50": float(ros),
        "in_process_s_p50": float(local),
        "overshoots": overshoots,
    }


def bench_ik(samples: int, kin: Kinematics) -> dict[str, float]:
    import mink

    rng = np.random.default_rng(2)
    targets = [
        (
            np.array([rng.uniform(0.3, 0.7), rng.uniform(-0.3, 0.3), rng.uniform(0.02, 0.35)]),
            top_down_rotation(rng.uniform(-1.5, 1.5)),
        )
        for _ in range(samples)
    ]
    dls_t, dls_ok = [], 0
    for p, r in targets:
        t0 = time.perf_counter()
        res = kin.solve(p, r, robot.HOME_Q_RAD)
        dls_t.append(time.perf_counter() - t0)
        dls_ok += res.converged
    model = kin.model
    config = mink.Configuration(model)
    task = mink.FrameTask("tcp", "site", position_cost=1.0, orientation_cost=1.0, lm_damping=1e-6)
    limits = [mink.ConfigurationLimit(model)]
    qadr = [model.joint(j).qposadr[0] for j in robot.ARM_JOINTS]
    mink_t, mink_ok = [], 0
    for p, r in targets:
        q = np.zeros(model.nq)
        q[qadr] = robot.HOME_Q_RAD
        config.update(q)
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, r.ravel())
        task.set_target(mink.SE3.from_rotation_and_translation(mink.SO3(quat), p))
        t0 = time.perf_counter()
        for _ in range(200):
            err = task.compute_error(config)
            if np.linalg.norm(err[:3]) < 5e-4 and np.linalg.norm(err[3:]) < 5e-3:
                mink_ok += 1
                break
            vel = mink.solve_ik(config, [task], 0.05, "daqp", damping=1e-3, limits=limits)
            config.integrate_inplace(vel, 0.05)
        mink_t.append(time.perf_counter() - t0)
    planner, plan_t = Planner(load_config(), kin), []
    for p, r in targets[:20]:
        start = kin.solve(p, r, robot.HOME_Q_RAD)
        if not start.converged:
            continue
        t0 = time.perf_counter()
        planner.plan_pose(start.q_rad, p + np.array([0.0, 0.0, 0.2]), r)  # a 20 cm lift, IK every 1 cm
        plan_t.append(time.perf_counter() - t0)
    return {
        "sweep_plan_ms_p50": float(np.median(plan_t) * 1e3),
        "dls_ms_p50": float(np.median(dls_t) * 1e3),
        "dls_success": dls_ok / samples,
        "mink_ms_p50": float(np.median(mink_t) * 1e3),
        "mink_success": mink_ok / samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="guarded descents (default 50)")
    parser.add_argument("--cancels", type=int, default=20, help="cancel trials (default 20)")
    parser.add_argument("--ik", type=int, default=100, help="IK targets (default 100)")
    parser.add_argument("--ros-moves", type=int, default=10, help="move_to pairs via ROS / in-process (default 10)")
    parser.add_argument("--force-runs", type=int, default=10, help="force-limit descents per backend (default 10)")
    args = parser.parse_args()
    kin = Kinematics()
    contact = np.array(bench_contact(args.runs, kin))
    sweeps = np.array(bench_sweeps(kin))
    cancels = np.array(bench_cancel(args.cancels, kin))
    ik = bench_ik(args.ik, kin)
    spots = force_spots(args.force_runs)
    force_twin = np.array(bench_force_twin(spots, kin))
    ros = bench_ros(args.ros_moves, spots, kin)
    force_ros = np.array(ros["overshoots"])
    period_ms = load_config().safety.control_period_s * 1e3
    print_table(
        "Guarded motion on the twin (in-process harness core)",
        ["metric", "value", "target", "detail"],
        [
            [
                "contact stop error p95 (mm)",
                float(np.percentile(contact, 95)),
                "<= 5",
                f"max {contact.max():.2f}, median {np.median(contact):.2f}, n={len(contact)}",
            ],
            [
                "sweep deviation max (mm)",
                float(sweeps.max()),
                "< 5",
                f"12 sweeps of 20 cm, median {np.median(sweeps):.2f}",
            ],
            [
                "cancel to zero commanded velocity (ms)",
                float(np.median(cancels)),
                f"<= {period_ms:.0f} (1 period)",
                f"max {cancels.max():.1f} ms over {len(cancels)} cancels",
            ],
        ],
    )
    print_table(
        "move_to through ROS vs in-process (10 cm, real time, ros2_control backend on twin_node)",
        ["path", "s p50", "ratio"],
        [
            ["in-process harness core", ros["in_process_s_p50"], 1.0],
            ["motion_node MoveTo action", ros["ros_s_p50"], ros["ratio"]],
        ],
    )
    print_table(
        f"Force-limit overshoot: peak - limit, {len(spots)} descents at {FORCE_SPEED_MPS * 100:.0f} cm/s, limit "
        f"{FORCE_LIMIT_N:.0f} N",
        ["backend", "N p50", "N max", "ratio p50"],
        [
            ["twin in-process (every 2 ms step)", float(np.median(force_twin)), float(force_twin.max()), 1.0],
            [
                "ros2_control over DDS (100 Hz states)",
                float(np.median(force_ros)),
                float(force_ros.max()),
                float(np.median(force_ros) / max(np.median(force_twin), 1e-9)),
            ],
        ],
    )
    print_table(
        "IK per top-down pose (same targets)",
        ["solver", "ms p50", "converged"],
        [
            ["damped least squares (ours)", ik["dls_ms_p50"], f"{ik['dls_success']:.0%}"],
            ["mink + daqp", ik["mink_ms_p50"], f"{ik['mink_success']:.0%}"],
            ["20 cm sweep plan (21 warm-started DLS solves + checks)", ik["sweep_plan_ms_p50"], ""],
        ],
    )
    write_results(
        "motion",
        {
            "contact_stop_error_mm_p95": float(np.percentile(contact, 95)),
            "sweep_deviation_mm_max": float(sweeps.max()),
            "cancel_to_stop_ms_p50": float(np.median(cancels)),
            "ik_ms_p50": ik["dls_ms_p50"],
            "ros_overhead_ratio": ros["ratio"],
        },
        {
            "contact_stop_error_mm_max": float(contact.max()),
            "cancel_to_stop_ms_max": float(cancels.max()),
            "control_period_ms": period_ms,
            "ik_success": ik["dls_success"],
            "mink_ms_p50": ik["mink_ms_p50"],
            "mink_success": ik["mink_success"],
            "sweep_plan_ms_p50": ik["sweep_plan_ms_p50"],
            "move_to_ros_s_p50": ros["ros_s_p50"],
            "move_to_in_process_s_p50": ros["in_process_s_p50"],
            "force_limit_overshoot_n_p50": float(np.median(force_twin)),
            "force_limit_overshoot_n_max": float(force_twin.max()),
            "ros_force_limit_overshoot_n_p50": float(np.median(force_ros)),
            "ros_force_limit_overshoot_n_max": float(force_ros.max()),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Guarded-motion benchmark: the harness core in-process on the twin backend, and over DDS (ros2_control
backend and motion_node driving twin_node in its own process at real time). Ground truth (the twin's own
TCP, its contacts, its physics-rate force) only scores the results.

contact_stop_error_mm_p95      top-down guarded descents onto the table at 50 free spots: distance between
                               the twin's TCP at the first finger-table contact and the twin's TCP once the
                               stopped arm has settled (target: every run within 5 mm)
sweep_deviation_mm_max         20 cm straight sweeps in 12 directions: largest distance of the twin's TCP (not
                               the planner's kinematics) from the straight line (target < 5 mm)
cancel_to_hold_ms_p50          in-process, paced at real time: another thread cancels at a random moment of a
                               motion; time until the harness commands the hold (the stop ramp begins the next period)
cancel_stop_distance_mm_p95    over DDS: MoveTo goals to motion_node canceled by the client at random moments;
                               TCP travel from the cancel request until the arm is at rest, with the measured TCP
                               speed at the request (cancel_speed_mps_*) and the times to the CANCELED result and
                               to rest (ros_cancel_to_result_ms_*, ros_cancel_to_rest_ms_*)
force_limit_overshoot_n_*      manipulation-mode descents into the table (15 N limit, 2 cm/s) at the same 50
                               spots: the peak external force at the hand (the twin's physics-rate measure, every
                               2 ms) minus the limit, in-process and over DDS (ros_*). The arm's force reflex is
                               set to the motion's limit in both; target: the DDS maximum within 5 N of the
                               in-process maximum. The harness's own peak readings are reported beside.
ik_ms_p50                      damped-least-squares IK per top-down pose, with mink (QP-based, same model)
                               measured on the same targets for comparison
ros_overhead_ratio             the same 10 cm move_to through motion_node's MoveTo action vs the harness core
                               called in-process, both driving twin_node (real time) via ros2_control

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
from _common import move_to_goal, print_table, wait_future, write_results
from tqdm import tqdm

from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics, top_down_rotation
from captain_ros.harness.harness import Harness
from captain_ros.harness.motion import Planner
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin
from captain_ros.twin.start_states import StartId

PANDA = robot.default_profile()  # the twin's arm

TASK = "put_blue_cube_in_box"
PAD_BODIES = ("panda_leftfinger", "panda_rightfinger")
# link-loss and wrench-lag limits for the ROS runs: on this 2-core VM a process can stall past the production
# 0.5 s / 0.25 s, which would abort the benchmark (link loss itself is tested in tests/captain_ros/ros/test_backends.py)
STATE_TIMEOUT_S = 2.0
WRENCH_MAX_LAG_S = 2.0
FORCE_LIMIT_N = 15.0
FORCE_SPEED_MPS = 0.02
# the peak force of a press is read over the descent and this much of the hold after the stop (arm time): the
# arm, stopped at 2 cm/s, still sinks into the table while it decelerates, in-process and over DDS alike
PRESS_SETTLE_S = 0.5
REST_SPEED_RADPS = 0.01


class TwinWatch(TwinBackend):
    """The twin backend, recording ground truth for scoring only: the twin's TCP at the first finger-table
    contact, the twin's TCP every period (with wall and sim time), and the wall time of every hold. With
    `real_time` it paces the simulation at real time, so another thread's timing means what it would on a robot."""

    def __init__(self, twin: Twin, real_time: bool = False):
        super().__init__(twin)
        m = twin.model
        self.table = m.geom("table_top").id
        self.pads = {m.body(b).id for b in PAD_BODIES}
        self.first_contact_tcp = None
        self.samples: list[tuple[float, float, np.ndarray]] = []  # (wall s, sim s, twin TCP)
        self.holds: list[float] = []
        self.real_time = real_time
        self._pace = (time.perf_counter(), twin.time_s)

    def hold(self, q_rad=None):
        self.holds.append(time.perf_counter())
        return super().hold(q_rad)

    def wait_period(self) -> None:
        super().wait_period()
        if self.real_time:
            wall0, sim0 = self._pace
            ahead = (self.twin.time_s - sim0) - (time.perf_counter() - wall0)
            if ahead > 0:
                time.sleep(ahead)
        d, m = self.twin.data, self.twin.model
        tcp = self.twin.tcp_pose()[0]
        self.samples.append((time.perf_counter(), self.twin.time_s, tcp))
        if self.first_contact_tcp is None:
            for c in d.contact[: d.ncon]:
                pair = {c.geom1, c.geom2}
                if self.table in pair and ({m.geom_bodyid[g] for g in pair} & self.pads):
                    self.first_contact_tcp = tcp
                    break

    def settle(self, within_s: float = 2.0) -> np.ndarray:
        """Step until the arm has been at rest for 0.1 s; returns the twin's TCP then."""
        rest_since, start = None, self.twin.time_s
        while self.twin.time_s - start < within_s:
            self.wait_period()
            if np.abs(self.twin.arm_qd()).max() >= REST_SPEED_RADPS:
                rest_since = None
            elif rest_since is None:
                rest_since = self.twin.time_s
            elif self.twin.time_s - rest_since >= 0.1:
                break
        return self.twin.tcp_pose()[0]


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
        backend = TwinWatch(twin)
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
        errors.append(float(np.linalg.norm(backend.first_contact_tcp - backend.settle())) * 1e3)
    return errors


def bench_sweeps(kin: Kinematics) -> list[float]:
    cfg = load_config()
    deviations = []
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    backend = TwinWatch(twin)
    harness = Harness(backend, cfg, kin)
    center = np.array([0.5, 0.0, 0.3])
    for k in range(12):
        angle = np.pi * k / 12
        direction = np.array([np.cos(angle), np.sin(angle), 0.0]) if k % 3 else np.array([np.cos(angle), 0.0, 0.6])
        direction /= np.linalg.norm(direction)
        a, b = center - 0.1 * direction, center + 0.1 * direction
        harness.call("move_to", pose={"position": list(a), "yaw_deg": 0})
        backend.samples.clear()
        result = harness.call("move_to", pose={"position": list(b), "yaw_deg": 0}, speed_mps=0.1)
        assert result.success, result.message
        ab = b - a
        worst = 0.0
        for _, _, tcp in backend.samples:
            s = np.clip(np.dot(tcp - a, ab) / np.dot(ab, ab), 0, 1)
            worst = max(worst, float(np.linalg.norm(tcp - (a + s * ab))))
        deviations.append(worst * 1e3)
    return deviations


def _cancel_from_another_thread(kin: Kinematics, cfg, target: list[float], delay_s: float) -> tuple[float, ...]:
    """One motion in a worker thread on a real-time twin, canceled by this thread `delay_s` after it got under
    way. Returns (ms to the hold, TCP speed at the cancel in m/s, TCP travel from the cancel to rest in mm)."""
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    backend = TwinWatch(twin, real_time=True)
    harness = Harness(backend, cfg, kin)
    under_way = threading.Event()
    harness.on_progress = lambda p: p.executed_distance_m > 0.01 and under_way.set()
    results = []
    worker = threading.Thread(
        target=lambda: results.append(harness.call("move_to", pose={"position": target, "yaw_deg": 0}))
    )
    worker.start()
    while not under_way.wait(0.1):
        if not worker.is_alive():
            raise RuntimeError(f"the motion never got under way: {results and results[0].message}")
    time.sleep(delay_s)
    t_cancel = time.perf_counter()
    harness.cancel()
    worker.join(60)
    if not results or results[0].failure_category.value != "canceled":
        raise RuntimeError(f"the cancel did not stop the motion: {results and results[0].receipt}")
    hold = next(t for t in backend.holds if t >= t_cancel)
    (_, t1, p1), (_, t2, p2) = [s for s in backend.samples if s[0] <= t_cancel][-2:]
    rest = backend.settle()
    return (hold - t_cancel) * 1e3, float(np.linalg.norm(p2 - p1) / (t2 - t1)), float(np.linalg.norm(rest - p2)) * 1e3


def bench_cancel_thread(runs: int, kin: Kinematics) -> dict[str, list[float]]:
    """The harness runs a motion in one thread (twin paced at real time); another thread cancels it at a random
    moment once it is under way."""
    cfg = load_config()
    rng = np.random.default_rng(1)
    rows = [
        _cancel_from_another_thread(kin, cfg, [0.45, float(rng.uniform(-0.25, 0.25)), 0.2], float(rng.uniform(0, 1.5)))
        for _ in tqdm(range(runs), desc="cancels from another thread", unit="run")
    ]
    return {key: [row[i] for row in rows] for i, key in enumerate(("hold_ms", "speed_mps", "distance_mm"))}


def _launch(*args: str) -> subprocess.Popen:
    exe = shutil.which(args[0]) or str(Path(sys.executable).with_name(args[0]))
    return subprocess.Popen([exe, *args[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def force_limit_descents(
    harness: Harness, spots: list[np.ndarray], desc: str, true_peak
) -> tuple[list[float], list[float]]:
    """Press into the table in manipulation mode at each spot. Returns, per descent, the peak external force
    (from `true_peak()`, the twin's physics-rate measure) and the harness's own peak reading, minus the limit."""
    overshoots, seen = [], []
    for xy in tqdm(spots, desc=desc, unit="run"):
        harness.new_episode()  # each press its own episode: 50 would spend an episode's action and time budgets
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
        overshoots.append(true_peak() - FORCE_LIMIT_N)
        seen.append(result.value["peak_force_n"] - FORCE_LIMIT_N)
        # straight up off the table: unloading the wrist is no contact, so in manipulation mode too
        lift = harness.call("move_to", pose={"position": [*xy, 0.05], "yaw_deg": 0}, mode="manipulation")
        if not lift.success:
            raise RuntimeError(f"lift at {xy}: {lift.message}")
    return overshoots, seen


def force_spots(runs: int) -> list[np.ndarray]:
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    rng = np.random.default_rng(1)
    return [free_spot(twin, rng) for _ in range(runs)]


def bench_force_twin(spots: list[np.ndarray], kin: Kinematics) -> tuple[list[float], list[float]]:
    twin = Twin(TASK)
    twin.reset(StartId(TASK, "official", 0))
    backend = TwinBackend(twin)
    harness = Harness(backend, load_config(), kin)

    def true_peak() -> float:
        """The reflex's physics-rate peak since the descent began, once the arm has held PRESS_SETTLE_S."""
        end_s = twin.time_s
        while twin.time_s < end_s + PRESS_SETTLE_S:
            backend.wait_period()  # the reflex has tripped already: it stays tripped, and keeps measuring
        return backend.controllers.reflex.peak_force_n

    return force_limit_descents(harness, spots, "force-limit descents, twin", true_peak)


def _tcp_and_speed(kin: Kinematics, q: np.ndarray, qd: np.ndarray) -> tuple[np.ndarray, float]:
    h = 1e-3
    p0, p1 = kin.forward(q)[0], kin.forward(q + h * qd)[0]
    return p0, float(np.linalg.norm(p1 - p0) / h)


def ros_cancels(action, backend, kin: Kinematics, runs: int, *, wait) -> dict[str, list[float]]:
    """MoveTo goals to motion_node, canceled by this client at random moments once under way: the time to the
    CANCELED result and to rest, the TCP speed at the request and the TCP travel from the request to rest."""
    rng = np.random.default_rng(3)
    cancel: dict[str, list[float]] = {"result_ms": [], "rest_ms": [], "distance_mm": [], "speed_mps": []}
    for i in tqdm(range(runs), desc="MoveTo cancels over DDS", unit="run"):
        side = 1.0 if i % 2 else -1.0
        # every canceled goal starts 50 cm from its target (5 s at 0.1 m/s), so the cancel always lands mid-motion
        start = wait(
            wait(action.send_goal_async(move_to_goal(np.array([0.45, -0.25 * side, 0.25]))), 30).get_result_async()
        )
        if not start.result.result.success:
            raise RuntimeError(f"the move to the cancel's start failed: {start.result.result.message}")
        feedback = []
        goal = move_to_goal(np.array([0.45, 0.25 * side, 0.25]), 0.1)
        handle = wait(action.send_goal_async(goal, feedback_callback=feedback.append), 30)
        deadline = time.monotonic() + 30
        while not (feedback and feedback[-1].feedback.executed_distance_m > 0.01):
            if time.monotonic() > deadline:
                raise RuntimeError("the MoveTo goal never got under way")
            time.sleep(0.005)
        time.sleep(float(rng.uniform(0.0, 1.0)))
        state = backend.read_state(require_force=False)
        tcp, speed = _tcp_and_speed(kin, state.q_rad, state.qd_radps)
        t_cancel = time.perf_counter()
        accepted = handle.cancel_goal_async()
        status = wait(handle.get_result_async())
        t_result = time.perf_counter()
        if status.result.result.failure_category != "canceled":
            call = status.result.result
            raise RuntimeError(
                f"the cancel did not stop the motion: {call.failure_category or 'success'} {call.message}"
            )
        rest_since = None
        while True:
            backend.wait_period()
            now = backend.read_state(require_force=False)
            if np.abs(now.qd_radps).max() >= REST_SPEED_RADPS:
                rest_since = None
            elif rest_since is None:
                rest_since = (time.perf_counter(), now.time_s)
            elif now.time_s - rest_since[1] >= 0.1:
                break
        wait(accepted)
        cancel["result_ms"].append((t_result - t_cancel) * 1e3)
        cancel["rest_ms"].append((rest_since[0] - t_cancel) * 1e3)
        cancel["speed_mps"].append(speed)
        cancel["distance_mm"].append(float(np.linalg.norm(kin.forward(now.q_rad)[0] - tcp)) * 1e3)
    return cancel


def bench_ros(moves: int, cancels: int, spots: list[np.ndarray], kin: Kinematics) -> dict:
    """twin_node (real time, its own process) driven through the ros2_control backend over DDS.
    Overhead: the same 10 cm move_to, alternately through motion_node's MoveTo action and by calling the
    harness core in this process, so the only difference is the ROS layer of the motion node.
    Cancels: MoveTo goals canceled by this client at random moments. Then force-limit descents with the
    in-process core on the ros2_control backend, scored by the twin's reflex diagnostics (physics rate)."""
    from captain_ros.core.domains import isolated_ros_env

    os.environ.update(isolated_ros_env(os.environ, 151, 230))
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import MultiThreadedExecutor

    from captain_interfaces.action import MoveTo
    from captain_ros.ros.ros2_control_backend import Ros2ControlBackend
    from captain_ros.ros.spin import SpunActionClient

    procs = [
        _launch(
            "twin_node",
            *("--ros-args", "-p", f"task:={TASK}", "-p", f"start_id:={TASK}/official/0", "-p", "camera_rate_hz:=0.0"),
        ),
        _launch(
            "motion_node",
            *("--ros-args", "-p", "watchdog:=false", "-p", f"state_timeout_s:={STATE_TIMEOUT_S}"),
            *("-p", f"wrench_max_lag_s:={WRENCH_MAX_LAG_S}"),
        ),
    ]
    rclpy.init()
    node = rclpy.create_node("bench_motion")
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    reflex: dict[str, float] = {}
    reflex_cond = threading.Condition()

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == "twin: arm force reflex":
                with reflex_cond:
                    reflex.update({kv.key: float(kv.value) for kv in status.values})
                    reflex["stamp_s"] = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
                    reflex_cond.notify_all()

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    try:
        backend = Ros2ControlBackend(node, PANDA, state_timeout_s=STATE_TIMEOUT_S, wrench_max_lag_s=WRENCH_MAX_LAG_S)
        backend.wait_for_state(60)
        harness = Harness(backend, load_config(), kin)
        action = SpunActionClient(node, MoveTo, "/harness/move_to")
        if not action.wait_for_server(timeout_sec=60):
            raise RuntimeError("motion_node did not come up")

        def wait(future, timeout_s: float = 60.0):
            return wait_future(future, timeout_s)

        targets = [np.array([0.5, -0.05, 0.3]), np.array([0.5, 0.05, 0.3])]
        harness.call("move_to", pose={"position": list(targets[0]), "yaw_deg": 0})  # the first timed move goes to 1
        times: dict[str, list[float]] = {"ros": [], "in_process": []}

        def through_ros(target: np.ndarray) -> str:
            call = wait(wait(action.send_goal_async(move_to_goal(target)), 30).get_result_async()).result.result
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

        cancel = ros_cancels(action, backend, kin, cancels, wait=wait)

        def true_peak() -> float:
            """The reflex's physics-rate peak since the descent began, from the first report stamped PRESS_SETTLE_S
            (arm time) after it ended."""
            end_s = backend.read_state(require_force=False).time_s + PRESS_SETTLE_S
            with reflex_cond:
                if not reflex_cond.wait_for(lambda: reflex.get("stamp_s", -1.0) >= end_s, 30):
                    raise RuntimeError("no force reflex diagnostics from twin_node")
                return reflex["peak_force_n"]

        backend.resync()
        overshoots, seen = force_limit_descents(harness, spots, "force-limit descents, ros2_control", true_peak)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown()
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()  # never leave a node behind
    ros, local = np.median(times["ros"]), np.median(times["in_process"])
    return {
        "ratio": float(ros / local),
        "ros_s_p50": float(ros),
        "in_process_s_p50": float(local),
        "cancel": cancel,
        "overshoots": overshoots,
        "seen": seen,
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
        res = kin.solve(p, r, PANDA.home_q)
        dls_t.append(time.perf_counter() - t0)
        dls_ok += res.converged
    model = kin.model
    config = mink.Configuration(model)
    task = mink.FrameTask("tcp", "site", position_cost=1.0, orientation_cost=1.0, lm_damping=1e-6)
    limits = [mink.ConfigurationLimit(model)]
    qadr = [model.joint(j).qposadr[0] for j in PANDA.arm_joints]
    mink_t, mink_ok = [], 0
    for p, r in targets:
        q = np.zeros(model.nq)
        q[qadr] = PANDA.home_q
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
        start = kin.solve(p, r, PANDA.home_q)
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


def _p(values, q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="guarded descents (default 50)")
    parser.add_argument("--cancels", type=int, default=20, help="cancels in-process and over DDS (default 20 each)")
    parser.add_argument("--ik", type=int, default=100, help="IK targets (default 100)")
    parser.add_argument("--ros-moves", type=int, default=10, help="move_to pairs via ROS / in-process (default 10)")
    parser.add_argument("--force-runs", type=int, default=50, help="force-limit descents per backend (default 50)")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]  # other jobs on the machine skew the wall-clock figures (cancels, move_to)
    kin = Kinematics()
    contact = np.array(bench_contact(args.runs, kin))
    sweeps = np.array(bench_sweeps(kin))
    local_cancel = bench_cancel_thread(args.cancels, kin)
    ik = bench_ik(args.ik, kin)
    spots = force_spots(args.force_runs)
    force_twin, seen_twin = map(np.array, bench_force_twin(spots, kin))
    ros = bench_ros(args.ros_moves, args.cancels, spots, kin)
    force_ros, seen_ros = np.array(ros["overshoots"]), np.array(ros["seen"])
    ros_cancel = ros["cancel"]
    period_ms = load_config().safety.control_period_s * 1e3
    print_table(
        "Guarded motion on the twin (in-process harness core; scored by the twin's own TCP)",
        ["metric", "value", "target", "detail"],
        [
            [
                "contact stop error p95 (mm)",
                _p(contact, 95),
                "<= 5",
                f"max {contact.max():.2f}, median {np.median(contact):.2f}, n={len(contact)}",
            ],
            [
                "sweep deviation max (mm)",
                float(sweeps.max()),
                "< 5",
                f"12 sweeps of 20 cm, median {np.median(sweeps):.2f}",
            ],
        ],
    )
    print_table(
        f"Cancel at random moments of a motion ({args.cancels} each)",
        ["path", "to hold/result ms p50", "p95", "to rest ms p50", "speed m/s p50", "stop mm p50", "stop mm p95"],
        [
            [
                "in-process, another thread (real time)",
                _p(local_cancel["hold_ms"], 50),
                _p(local_cancel["hold_ms"], 95),
                "",
                _p(local_cancel["speed_mps"], 50),
                _p(local_cancel["distance_mm"], 50),
                _p(local_cancel["distance_mm"], 95),
            ],
            [
                "MoveTo over DDS (motion_node, twin_node)",
                _p(ros_cancel["result_ms"], 50),
                _p(ros_cancel["result_ms"], 95),
                _p(ros_cancel["rest_ms"], 50),
                _p(ros_cancel["speed_mps"], 50),
                _p(ros_cancel["distance_mm"], 50),
                _p(ros_cancel["distance_mm"], 95),
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
        f"Force-limit overshoot: peak external force - limit, the same {len(spots)} descents at "
        f"{FORCE_SPEED_MPS * 100:.0f} cm/s, limit {FORCE_LIMIT_N:.0f} N, arm reflex set to the limit",
        ["backend", "N p50", "N max", "max - in-process max", "harness saw: N p50", "N max"],
        [
            [
                "twin in-process (reflex + monitor every 2 ms)",
                float(np.median(force_twin)),
                float(force_twin.max()),
                0.0,
                float(np.median(seen_twin)),
                float(seen_twin.max()),
            ],
            [
                "ros2_control over DDS (reflex in twin_node)",
                float(np.median(force_ros)),
                float(force_ros.max()),
                float(force_ros.max() - force_twin.max()),
                float(np.median(seen_ros)),
                float(seen_ros.max()),
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
            "contact_stop_error_mm_p95": _p(contact, 95),
            "sweep_deviation_mm_max": float(sweeps.max()),
            "cancel_to_hold_ms_p50": _p(local_cancel["hold_ms"], 50),
            "cancel_stop_distance_mm_p95": _p(ros_cancel["distance_mm"], 95),
            "force_limit_overshoot_n_max": float(force_twin.max()),
            "ros_force_limit_overshoot_n_max": float(force_ros.max()),
            "ik_ms_p50": ik["dls_ms_p50"],
            "ros_overhead_ratio": ros["ratio"],
        },
        {
            "contact_stop_error_mm_max": float(contact.max()),
            "sweep_deviation_mm_p50": float(np.median(sweeps)),
            "control_period_ms": period_ms,
            "cancel_to_hold_ms_p95": _p(local_cancel["hold_ms"], 95),
            "cancel_speed_mps_p50": _p(local_cancel["speed_mps"], 50),
            "cancel_stop_distance_mm_p50_in_process": _p(local_cancel["distance_mm"], 50),
            "cancel_stop_distance_mm_p95_in_process": _p(local_cancel["distance_mm"], 95),
            "ros_cancel_to_result_ms_p50": _p(ros_cancel["result_ms"], 50),
            "ros_cancel_to_result_ms_p95": _p(ros_cancel["result_ms"], 95),
            "ros_cancel_to_rest_ms_p50": _p(ros_cancel["rest_ms"], 50),
            "ros_cancel_speed_mps_p50": _p(ros_cancel["speed_mps"], 50),
            "cancel_stop_distance_mm_p50": _p(ros_cancel["distance_mm"], 50),
            "force_limit_overshoot_n_p50": float(np.median(force_twin)),
            "ros_force_limit_overshoot_n_p50": float(np.median(force_ros)),
            "ros_minus_in_process_overshoot_max_n": float(force_ros.max() - force_twin.max()),
            "harness_seen_overshoot_n_max": float(seen_twin.max()),
            "ros_harness_seen_overshoot_n_max": float(seen_ros.max()),
            "force_descents": len(spots),
            "cancels": args.cancels,
            "ik_success": ik["dls_success"],
            "mink_ms_p50": ik["mink_ms_p50"],
            "mink_success": ik["mink_success"],
            "sweep_plan_ms_p50": ik["sweep_plan_ms_p50"],
            "move_to_ros_s_p50": ros["ros_s_p50"],
            "move_to_in_process_s_p50": ros["in_process_s_p50"],
            "force_overshoots_n_in_process": [round(float(v), 3) for v in force_twin],
            "force_overshoots_n_ros": [round(float(v), 3) for v in force_ros],
            "load_average_1min_at_start": load_at_start,
            "load_average_1min_at_end": os.getloadavg()[0],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

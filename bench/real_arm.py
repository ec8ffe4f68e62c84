#!/usr/bin/env python3
"""Real-arm safety benchmark (issue 27), with the MuJoCo twin (twin_node, its own process, real time) as the arm and
motion_node driving it through the ros2_control backend, as on a robot.

kill_stop_distance_mm_p95   motion_node SIGKILLed mid-sweep (a 40 cm MoveTo at 0.1 m/s, killed at a random point
                            once under way): the arm's TCP travel from the newest joint state before the kill until
                            the arm rests, from /joint_states through the arm's kinematics (target <= 20 mm). The
                            backend gives the controller the sweep a short horizon at a time (sweep_horizon_s, 0.05 s).
                            Anchor: the same kill with sweep_horizon_s:=0 (each sweep sent whole, as before), where
                            the controller finishes the sweep unguarded (whole_sweep_kill_distance_mm_p50).
kill_commanded_rest_ms_p95  arm time (the twin's clock) from that joint state until the controller's setpoint is at
                            rest: the end of the last stretch the node sent before it died (target <= 200 ms)
kill_stop_time_ms_p95       the same until the measured arm rests (every joint under 0.01 rad/s): the setpoint's
                            stop plus the twin's servos settling
kill_tcp_speed_mps_p50      the TCP speed at the kill (min-jerk sweeps peak at 1.9x their mean speed)

After a SIGKILL the twin waits for the dead node's grants (lockstep) until DDS discovery drops the node (its lease,
about 20 s with Fast DDS), then runs freely: the arm's travel is on the twin's clock, so the wait changes nothing but
the wall time.

self_collision_check_ms_p50 one self-collision check (Kinematics.self_collisions: link poses, then FCL on every
                            checked pair) at random joint positions inside the limits, on the FR3's own mesh
                            description: franka_description's xacro output with its collision STLs, kept in
                            third_party/franka_description (no SRDF ships with it: the pairs touching at home are
                            left out) (target <= 5 ms); beside it the Panda's with MoveIt's SRDF, as
                            example-robot-data ships it on PyPI (self_collision_panda_srdf_*). Anchor: MuJoCo's
                            collision pass on the Panda twin's primitives, the check this one replaced (which saw no
                            mesh at all).

estop_lapse_to_hold_ms_p50/_p95  a dead e-stop button bridge: motion_node runs with estop_deadline_s 0.5 (as
                            real_arm.launch.py sets it), a bridge in this process publishes "not engaged" on
                            /safety/estop (std_msgs/Bool, reliable) every 50 ms, a sweep as the kill bench's is
                            under way (0.1 m/s) and the bridge dies (stops publishing, its publisher destroyed) once
                            the TCP is a random 5 to 20 cm along. Host steady time (CLOCK_MONOTONIC: the clock the
                            deadline runs on, one clock for every process here) from the deadline's expiry (the
                            bridge's last publish + 0.5 s; the node hears it a little later, so that delivery counts
                            in) until this process receives /safety/state with the e-stop engaged by the topic: the
                            node latched the stop and signalled the running motion to hold (the deadline is checked
                            every 20 ms, safety.DEADLINE_CHECK_S)
estop_lapse_to_result_ms_p95 the same until the sweep's MoveTo result (aborted, safety_stop) arrives (host steady time)
estop_hold_to_rest_ms_p95   arm time (the twin's clock, as the kill bench's) from the stamp of the stop ramp the node
                            sent on the controller's topic until the arm rests (every joint under 0.01 rad/s)
estop_lapse_to_rest_ms_p95  the two added: the node's reaction on the host's clock, the arm's stop on its own (the
                            twin in lockstep runs at its own pace when the host is busy, so its clock cannot be read
                            against the host's directly; on a real arm both run in real time)
estop_lapse_stop_distance_mm_p95  the TCP's travel after the lapse: from the arm's position lapse_to_hold of arm time
                            before the stop ramp's stamp (the sweep it was on) until it rests
estop_lapse_trials          lapses measured; estop_spurious_lapses counts lapses while the bridge was alive (a starved
                            host: the bridge's longest gap between heartbeats is kept with each), each trial then run
                            again
One motion_node serves every lapse: after each, the bridge comes back (a new publisher), /safety/clear_estop is
called until the node accepts it, and the next sweep starts again from the start pose.

moveit_scene_check_ms_p50/_p95  MoveIt's planning-scene check of one sweep (use_moveit): the 40 cm sweep the other
                            parts run, planned by the harness's planner, its sampled joint configurations sent 8 at a
                            time to /check_state_validity (moveit_msgs/GetStateValidity), every answer received: host
                            time around MoveItScene.check (ros/move_group_scene.py), over DDS to a fake move_group in
                            its own process (tests/captain_ros/ros/fake_move_group.py: the TCP as a sphere against world
                            boxes, one box measured into the scene first). The fake's own work per state (the profile's
                            forward kinematics in Python) is in the number; a real move_group's collision check of every
                            link's meshes takes its place (not measured: MoveIt does not install here).
moveit_scene_apply_ms_p50   one ApplyPlanningScene round trip (a measured box added, then removed)

  python bench/real_arm.py                      # prints a table, writes bench/results/real_arm.json
  python bench/real_arm.py --kills 1 --whole-kills 1 --lapses 1 --out /tmp/r.json    # one of each (the test's run)
  python bench/real_arm.py --only moveit        # only the planning-scene check; its keys merged into the results
  python bench/real_arm.py --only self_collision   # only the self-collision timing, likewise
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _common import RESULTS, machine, move_to_goal, print_table, wait_future
from tqdm import tqdm

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics
from captain_ros.stack import interrupt

TASK = "put_blue_cube_in_box"
START = np.array([0.45, -0.2, 0.25])
END = np.array([0.45, 0.2, 0.25])
SPEED_MPS = 0.1
HORIZON_S = 0.05
REST_RADPS = 0.01  # every joint slower than this, for REST_FOR_S of arm time: at rest (bench/motion.py's)
REST_FOR_S = 0.2
LOADED = (("state_timeout_s", 5.0), ("wrench_max_lag_s", 2.0))  # a 2-core host stalls processes past production 0.5 s
ESTOP_TOPIC = "safety/estop"  # safety.ESTOP: std_msgs/Bool, true = engaged
ESTOP_DEADLINE_S = 0.5  # real_arm.launch.py's estop_deadline_s
HEARTBEAT_S = 0.05  # the bridge publishes the button's state this often
STOP_RAMP_MIN_S = 1.0  # a hold's stop ramp lasts state_timeout_s (LOADED: 5 s) or more; a sweep's stretch ~0.1 s
WAIT_S = 120.0  # the longest wall wait for anything (a dead node's lease is about 20 s)
ROOT = Path(__file__).resolve().parents[1]


def _launch(executable: str, *params: tuple[str, object]) -> subprocess.Popen:
    exe = shutil.which(executable) or str(Path(sys.executable).with_name(executable))
    args = [exe, "--ros-args"]
    for name, value in params:
        args += ["-p", f"{name}:={value}"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def _wait_gone(node, name: str = "motion") -> None:
    """Until this process's DDS graph has dropped the motion node killed before (its lease, about 20 s): while it is
    known, a new one's action server and services are found before they exist, and a goal sent then is lost."""
    deadline = time.monotonic() + WAIT_S
    while name in node.get_node_names():
        if time.monotonic() > deadline:
            raise RuntimeError(f"a killed {name} node is still in the ROS graph after {WAIT_S:.0f} s")
        time.sleep(0.1)


class ArmWatch:
    """/joint_states in this process: the newest state, and a wait for the arm to rest after a time."""

    def __init__(self, node, profile: robot.RobotProfile):
        from sensor_msgs.msg import JointState
        from trajectory_msgs.msg import JointTrajectory as JointTrajectoryMsg

        self.profile, self.kin = profile, Kinematics(profile=profile)
        self._cond = threading.Condition()
        self._states: list[tuple[float, np.ndarray, np.ndarray, float]] = []  # (stamp s, q, qd, received: host s)
        self.commanded_until_s: float | None = None  # where the newest stamped trajectory on the topic ends
        # stamped trajectories on the topic: (received: host s, stamp s, duration s)
        self.commands: list[tuple[float, float, float]] = []
        node.create_subscription(JointState, "/joint_states", self._on_state, 100)
        node.create_subscription(JointTrajectoryMsg, profile.interfaces.trajectory_topic, self._on_stretch, 100)

    def _on_stretch(self, msg) -> None:
        start = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        if start and msg.points:
            end = msg.points[-1].time_from_start
            with self._cond:
                self.commanded_until_s = start + end.sec + end.nanosec * 1e-9
                self.commands.append((time.monotonic(), start, end.sec + end.nanosec * 1e-9))
                del self.commands[:-2000]
                self._cond.notify_all()

    def _on_state(self, msg) -> None:
        index = {n: i for i, n in enumerate(msg.name)}
        arm = [index[j] for j in self.profile.arm_joints]
        row = (
            msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9,
            np.asarray(msg.position)[arm],
            np.asarray(msg.velocity)[arm] if len(msg.velocity) == len(msg.position) else np.zeros(len(arm)),
            time.monotonic(),
        )
        with self._cond:
            self._states.append(row)
            del self._states[:-2000]
            self._cond.notify_all()

    def newest(self) -> tuple[float, np.ndarray, np.ndarray]:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._states), WAIT_S):
                raise RuntimeError("no joint states from twin_node")
            return self._states[-1][:3]

    def received_by(self, host_s: float) -> tuple[float, np.ndarray, np.ndarray]:
        """The newest state this process had received at host steady time `host_s` (stamp, q, qd)."""
        return self._last_up_to(3, host_s, f"host time {host_s:.3f} s")

    def state_at(self, stamp_s: float) -> tuple[float, np.ndarray, np.ndarray]:
        """The newest state stamped at or before `stamp_s` on the twin's clock (stamp, q, qd)."""
        return self._last_up_to(0, stamp_s, f"{stamp_s:.3f} s of arm time")

    def _last_up_to(self, column: int, limit: float, what: str) -> tuple[float, np.ndarray, np.ndarray]:
        with self._cond:
            before = [row for row in self._states if row[column] <= limit]
            if not before:
                raise RuntimeError(f"no joint state kept from before {what}")
            return before[-1][:3]

    def stop_ramp(self, after_host_s: float) -> float:
        """The stamp (arm time) of the first stop ramp on the controller's topic received after `after_host_s`
        (host): the backend's hold repeats the ramp's rest state_timeout_s on (STOP_RAMP_MIN_S), unlike a stretch."""

        def found():
            return next((c[1] for c in self.commands if c[0] > after_host_s and c[2] >= STOP_RAMP_MIN_S), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, WAIT_S):
                raise RuntimeError(f"no stop ramp on the controller's topic within {WAIT_S:.0f} s")
            return found()

    def received_at(self, stamp_s: float) -> float:
        """When (host steady time) this process received the state stamped `stamp_s`."""
        with self._cond:
            return next(row[3] for row in self._states if row[0] == stamp_s)

    def rest_after(self, stamp_s: float) -> tuple[float, np.ndarray]:
        """The first state after `stamp_s` from which the arm stays at rest for REST_FOR_S (its stamp, q)."""

        def found():
            since = None
            for t, q, qd, _ in self._states:
                if t <= stamp_s:
                    continue
                if np.abs(qd).max() >= REST_RADPS:
                    since = None
                elif since is None:
                    since = (t, q)
                elif t - since[0] >= REST_FOR_S:
                    return since
            return None

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, WAIT_S):
                raise RuntimeError(f"the arm did not come to rest within {WAIT_S:.0f} s of the stop")
            return found()

    def tcp(self, q: np.ndarray) -> np.ndarray:
        return self.kin.forward(q)[0]


class SafetyWatch:
    """/safety/state in this process, each with the host steady time it was received at."""

    def __init__(self, node):
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        from captain_interfaces.msg import SafetyState

        self._cond = threading.Condition()
        self.states: list[tuple[float, object]] = []
        latched = QoSProfile(
            depth=10, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
        )
        node.create_subscription(SafetyState, "/safety/state", self._on_state, latched)

    def _on_state(self, msg) -> None:
        with self._cond:
            self.states.append((time.monotonic(), msg))
            self._cond.notify_all()

    def first(self, predicate, after_s: float = -np.inf) -> tuple[float, object] | None:
        """The first state received after `after_s` (host) for which predicate(state) holds, or None."""
        with self._cond:
            return next(((t, m) for t, m in self.states if t > after_s and predicate(m)), None)

    def wait(self, predicate, after_s: float, what: str) -> tuple[float, object]:
        with self._cond:
            if not self._cond.wait_for(lambda: self.first(predicate, after_s) is not None, WAIT_S):
                raise RuntimeError(f"no {what} on /safety/state within {WAIT_S:.0f} s")
            return self.first(predicate, after_s)

    def latest(self):
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self.states), WAIT_S):
                raise RuntimeError("no /safety/state from motion_node")
            return self.states[-1][1]


class MotionLink:
    """This process's clients of motion_node, made once for every node the bench starts, and its /safety/state.

    A motion_node that answers a request before it has discovered this process's reader for the answer loses the
    answer (rmw_fastrtps: "failed to send response (timeout): client will not receive response"): a goal is then
    never answered, though it runs. Discovery announces a participant's endpoints in the order they were made, and
    the clients are made before the /safety/state subscription: once a new node's (latched) state has arrived here,
    that node knows the clients' readers too. One set of clients, not one per node: each new node must discover
    every endpoint this process has."""

    def __init__(self, node):
        from std_srvs.srv import Trigger

        from captain_interfaces.action import MoveTo
        from captain_ros.ros.spin import SpunActionClient

        self.node = node
        self.action = SpunActionClient(node, MoveTo, "/harness/move_to")
        self.clear = node.create_client(Trigger, "/safety/clear_estop")
        self.safety = SafetyWatch(node)  # after the clients (above)

    def launch(self, *params: tuple[str, object]) -> subprocess.Popen:
        """A new motion_node with `params`, once it serves MoveTo and has discovered this process's clients."""
        _wait_gone(self.node)
        launched = time.monotonic()
        proc = _launch("motion_node", *params)
        try:
            if not self.action.wait_for_server(timeout_sec=WAIT_S):
                raise RuntimeError("motion_node did not come up")
            self.safety.wait(lambda _state: True, launched, "state from the new motion_node")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return proc


def kill_mid_sweep(link: MotionLink, watch: ArmWatch, horizon_s: float, at_m: float) -> dict[str, float]:
    """Start motion_node (sweep_horizon_s = `horizon_s`), move to START, sweep towards END at SPEED_MPS, SIGKILL
    the node once the TCP is `at_m` along, and measure the travel after the kill."""
    proc = link.launch(("watchdog", False), ("sweep_horizon_s", horizon_s), *LOADED)
    action = link.action
    try:

        def wait(future):
            return wait_future(future, WAIT_S)

        handle = wait(action.send_goal_async(move_to_goal(START)))
        if not handle.accepted or not wait(handle.get_result_async()).result.result.success:
            raise RuntimeError("the move to the sweep's start failed")
        start_tcp = watch.tcp(watch.newest()[1])
        watch.commanded_until_s = None  # from here on: this sweep's stretches only
        wait(action.send_goal_async(move_to_goal(END, SPEED_MPS)))
        deadline = time.monotonic() + WAIT_S
        while np.linalg.norm(watch.tcp(watch.newest()[1]) - start_tcp) < at_m:
            if time.monotonic() > deadline:
                raise RuntimeError("the sweep never got under way")
            time.sleep(0.002)
        stamp, q, qd = watch.newest()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        tcp = watch.tcp(q)
        speed = float(np.linalg.norm(watch.tcp(q + 1e-3 * qd) - tcp) / 1e-3)
        rest_stamp, rest_q = watch.rest_after(stamp)
        until = watch.commanded_until_s  # where the last stretch the node sent ends (None: the sweep went whole)
        return {
            "distance_mm": float(np.linalg.norm(watch.tcp(rest_q) - tcp) * 1e3),
            "stop_time_ms": (rest_stamp - stamp) * 1e3,
            "commanded_rest_ms": float("nan") if until is None else (until - stamp) * 1e3,
            "speed_mps": speed,
            "killed_at_m": float(np.linalg.norm(tcp - start_tcp)),
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class EStopBridge:
    """An e-stop button's bridge in this process: "not engaged" on /safety/estop every HEARTBEAT_S until it dies
    (stops publishing and destroys its publisher); it can come back with a new publisher."""

    def __init__(self, node):
        self.node = node
        self.last_sent_s = float("nan")  # host steady time just after the newest publish returned
        self.longest_gap_s = 0.0  # the longest time between two heartbeats (a starved host), this life
        self._publisher = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self):
        """Publish from now on; returns the publisher (its subscription count tells whether motion_node hears it)."""
        from std_msgs.msg import Bool

        from captain_ros.ros.safety import RELIABLE

        publisher = self._publisher = self.node.create_publisher(Bool, "/" + ESTOP_TOPIC, RELIABLE)

        def beat():
            sent = None
            while not self._stop.is_set():
                publisher.publish(Bool(data=False))
                self.last_sent_s = time.monotonic()
                if sent is not None:
                    self.longest_gap_s = max(self.longest_gap_s, self.last_sent_s - sent)
                sent = self.last_sent_s
                self._stop.wait(HEARTBEAT_S)

        self._stop.clear()
        self.longest_gap_s = 0.0
        self._thread = threading.Thread(target=beat, name="estop_bridge", daemon=True)
        self._thread.start()
        return publisher

    def die(self) -> float:
        """Stop publishing (a dead bridge); returns when the last heartbeat went out (host steady time)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._publisher is not None:
            self.node.destroy_publisher(self._publisher)
            self._publisher = None
        return self.last_sent_s


class LapseBench:
    """One motion_node with the e-stop topic's deadline, the bridge that keeps it alive, and the lapses."""

    def __init__(self, link: MotionLink, watch: ArmWatch):
        self.link, self.watch = link, watch
        self.action, self.clear, self.safety = link.action, link.clear, link.safety
        self.bridge = EStopBridge(link.node)
        self.spurious = 0  # lapses while the bridge was alive
        self.spurious_reasons: list[str] = []
        self.proc = None

    def __enter__(self) -> LapseBench:
        self.publisher = self.bridge.start()  # before the node: it is watched from its start
        self.proc = self.link.launch(
            ("watchdog", False), ("sweep_horizon_s", HORIZON_S), ("estop_deadline_s", ESTOP_DEADLINE_S), *LOADED
        )
        return self

    def __exit__(self, *_exc) -> None:
        self.bridge.die()
        if self.proc is not None and self.proc.poll() is None:
            interrupt(self.proc, grace_s=20.0)

    def _wait(self, future):
        return wait_future(future, WAIT_S)

    def ensure_clear(self) -> None:
        """The bridge is heard and the e-stop clear: /safety/clear_estop until motion_node accepts it (it refuses
        while the topic's latest silence has not ended with a reading), then a state that says so."""
        from std_srvs.srv import Trigger

        deadline = time.monotonic() + WAIT_S
        while self.publisher.get_subscription_count() == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("motion_node does not subscribe to the e-stop topic")
            time.sleep(0.01)
        if not self.clear.wait_for_service(timeout_sec=WAIT_S):
            raise RuntimeError("motion_node serves no /safety/clear_estop")
        while not (reply := self._wait(self.clear.call_async(Trigger.Request()))).success:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the e-stop could not be cleared: {reply.message}")
            time.sleep(0.02)
        asked = time.monotonic()
        while self.safety.latest().estop_engaged:
            if time.monotonic() - asked > WAIT_S:
                raise RuntimeError("/safety/state still reads the e-stop engaged after a clear")
            time.sleep(0.01)

    def _move(self, target: np.ndarray, speed_mps: float = 0.0):
        handle = self._wait(self.action.send_goal_async(move_to_goal(target, speed_mps)))
        if not handle.accepted:
            raise RuntimeError("motion_node rejected the goal (see its receipts)")
        return handle

    def lapse_mid_sweep(self, at_m: float) -> dict[str, object] | None:
        """Move to START, sweep towards END at SPEED_MPS, let the bridge die once the TCP is `at_m` along, and
        measure the hold. None (counted as spurious) when the e-stop latched while the bridge was alive."""
        self.ensure_clear()
        began = time.monotonic()
        topic = f"the /{ESTOP_TOPIC} topic"

        def spurious() -> bool:
            early = self.safety.first(lambda m: m.estop_engaged, began)
            if early is None:
                return False
            self.spurious += 1
            gap = self.bridge.longest_gap_s
            self.spurious_reasons.append(f"{early[1].estop_reason}; bridge's longest gap {gap:.3f} s")
            return True

        moved = self._wait(self._move(START).get_result_async()).result.result
        if not moved.success:
            if spurious():
                return None
            raise RuntimeError(f"the move to the sweep's start failed: {moved.message}")
        start_tcp = self.watch.tcp(self.watch.newest()[1])
        sweep = self._move(END, SPEED_MPS).get_result_async()
        deadline = time.monotonic() + WAIT_S
        while np.linalg.norm(self.watch.tcp(self.watch.newest()[1]) - start_tcp) < at_m:
            if sweep.done() or time.monotonic() > deadline:
                if spurious():
                    return None
                raise RuntimeError("the sweep never got under way")
            time.sleep(0.01)
        last_s = self.bridge.die()
        expiry_s = last_s + ESTOP_DEADLINE_S
        hold_s, state = self.safety.wait(lambda m: m.estop_engaged, began, "e-stop engaged")
        # the node hears each heartbeat after it went out: its lapse comes after expiry_s, so one before latched
        # while the bridge was alive (a starved host)
        if hold_s < expiry_s and spurious():
            self._wait(sweep)
            self.publisher = self.bridge.start()
            return None
        result = self._wait(sweep).result.result
        result_s = time.monotonic()
        seen_stamp = self.watch.received_by(hold_s)[0]  # the arm still swept then: it rests later
        rest_stamp, rest_q = self.watch.rest_after(seen_stamp)
        rest_host_s = self.watch.received_at(rest_stamp)
        # the hold: the stop ramp the backend sent (stamped, in lockstep, at the arm time it starts at); the lapse on
        # the arm's clock: that stamp less the node's reaction
        ramp_stamp = self.watch.stop_ramp(last_s)
        lapse_stamp = ramp_stamp - (hold_s - expiry_s)
        _, q, qd = self.watch.state_at(lapse_stamp)
        tcp = self.watch.tcp(q)
        still = self.safety.latest()
        silent = re.search(r"silent for ([0-9.]+) s", state.estop_reason)
        self.publisher = self.bridge.start()  # the bridge is back; the next trial clears the e-stop
        return {
            "expiry_to_hold_ms": (hold_s - expiry_s) * 1e3,
            "expiry_to_result_ms": (result_s - expiry_s) * 1e3,
            "hold_to_rest_ms": (rest_stamp - ramp_stamp) * 1e3,
            "expiry_to_rest_ms": (hold_s - expiry_s + rest_stamp - ramp_stamp) * 1e3,
            "expiry_to_rest_host_ms": (rest_host_s - expiry_s) * 1e3,
            "distance_mm": float(np.linalg.norm(self.watch.tcp(rest_q) - tcp) * 1e3),
            "speed_mps": float(np.linalg.norm(self.watch.tcp(q + 1e-3 * qd) - tcp) / 1e-3),
            "bridge_died_at_m": at_m,
            "rest_short_of_end_mm": float(np.linalg.norm(END - self.watch.tcp(rest_q)) * 1e3),
            "node_silent_s": float(silent.group(1)) if silent else float("nan"),
            "engaged_by": state.estop_source,
            "estop_reason": state.estop_reason,
            "result_category": result.failure_category,
            "result_success": bool(result.success),
            "held": bool(
                state.estop_source == topic
                and still.estop_engaged
                and not result.success
                and result.failure_category == "safety_stop"
            ),
        }


FR3_PREFIX = ROOT / "third_party" / "franka_description"  # franka_description's FR3 (xacro output + collision STLs)


def _mesh_kinematics(arm: str) -> Kinematics:
    """Kinematics on a Franka mesh description, its package:// URIs resolved through AMENT_PREFIX_PATH: "fr3"
    (franka_description's FR3, kept in third_party; no SRDF ships with it) or "panda" (example-robot-data's Panda
    with MoveIt's SRDF)."""
    import importlib.metadata

    if arm == "fr3":
        prefix, urdf = FR3_PREFIX, FR3_PREFIX / "share" / "franka_description" / "urdf" / "fr3.urdf"
    else:
        prefix = Path(importlib.metadata.distribution("example-robot-data").locate_file("cmeel.prefix"))
        urdf = prefix / "share" / "example-robot-data" / "robots" / "panda_description" / "urdf" / "panda.urdf"
    os.environ["AMENT_PREFIX_PATH"] = os.pathsep.join(filter(None, [str(prefix), os.environ.get("AMENT_PREFIX_PATH")]))
    data = ROOT / "tests" / "captain_ros" / "core" / "data"
    profile = robot.load_profile(data / f"{arm}_franka_meshes.yaml")
    kin = Kinematics(profile=profile.with_urdf_text(urdf.read_text()))
    assert not kin.collision.coverage_problems(), kin.collision.coverage_problems()  # loads the meshes (untimed)
    return kin


def self_collision_timing(configs: int) -> dict[str, object]:
    """Per-configuration self-collision time on Franka's mesh descriptions (the FR3's, the headline; the Panda's
    with its SRDF), and MuJoCo's pass on the twin's primitives at the same configurations (the anchor)."""
    import mujoco

    arms = {arm: _mesh_kinematics(arm) for arm in ("fr3", "panda")}
    twin = Kinematics(profile=robot.load_profile("panda_twin"))
    spec = mujoco.MjSpec.from_string(twin.profile.urdf_text)
    spec.compiler.fusestatic = False
    spec.compiler.boundmass, spec.compiler.boundinertia = 1e-3, 1e-9
    anchor_model = spec.compile()
    anchor_data = mujoco.MjData(anchor_model)
    lower, upper = arms["fr3"].profile.arm_limits_rad()
    rng = np.random.default_rng(5)
    times: dict[str, list[float]] = {"fr3": [], "panda": [], "anchor": []}
    colliding = {"fr3": 0, "panda": 0}
    for q in tqdm(rng.uniform(lower, upper, size=(configs, len(lower))), desc="self-collision checks", unit="q"):
        for arm, kin in arms.items():
            t0 = time.perf_counter()
            colliding[arm] += bool(kin.self_collisions(q))
            times[arm].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        anchor_data.qpos[: len(q)] = q
        mujoco.mj_kinematics(anchor_model, anchor_data)
        mujoco.mj_collision(anchor_model, anchor_data)
        times["anchor"].append(time.perf_counter() - t0)
    fr3, panda = arms["fr3"].collision, arms["panda"].collision
    return {
        "self_collision_check_ms_p50": 1e3 * float(np.median(times["fr3"])),
        "self_collision_check_ms_p95": 1e3 * float(np.percentile(times["fr3"], 95)),
        "self_collision_anchor_ms_p50": 1e3 * float(np.median(times["anchor"])),
        "self_collision_description": "Franka FR3 (franka_description b299b39: xacro fr3.urdf.xacro hand:=true, "
        "collision STLs and the hand's finger boxes; no SRDF ships: pairs touching at home left out)",
        "self_collision_links_with_geometry": len(fr3.parts),
        "self_collision_pairs_checked": len(fr3.pairs),
        "self_collision_configs": configs,
        "self_collision_colliding_fraction": colliding["fr3"] / configs,
        "self_collision_panda_srdf_ms_p50": 1e3 * float(np.median(times["panda"])),
        "self_collision_panda_srdf_pairs_checked": len(panda.pairs),
        "self_collision_panda_srdf_colliding_fraction": colliding["panda"] / configs,
    }


def _print_self_collision(collision: dict[str, object], configs: int) -> None:
    print_table(
        f"self-collision check per configuration ({configs} random joint positions)",
        ["check", "geometry", "pairs", "p50 ms", "p95 ms", "ratio to anchor"],
        [
            [
                "FCL (core/collision.py)",
                "Franka FR3 meshes (franka_description)",
                collision["self_collision_pairs_checked"],
                collision["self_collision_check_ms_p50"],
                collision["self_collision_check_ms_p95"],
                collision["self_collision_check_ms_p50"] / collision["self_collision_anchor_ms_p50"],
            ],
            [
                "FCL (core/collision.py)",
                "Franka Panda meshes + SRDF",
                collision["self_collision_panda_srdf_pairs_checked"],
                collision["self_collision_panda_srdf_ms_p50"],
                "",
                collision["self_collision_panda_srdf_ms_p50"] / collision["self_collision_anchor_ms_p50"],
            ],
            ["MuJoCo (anchor)", "Panda twin primitives", "", collision["self_collision_anchor_ms_p50"], "", 1.0],
        ],
    )


def moveit_scene_timing(node, checks: int) -> dict[str, object]:
    """The planning-scene check's round trip against a fake move_group in its own process (see the docstring)."""
    from captain_ros.core.config import load_config
    from captain_ros.core.moveit_scene import SceneBox, judge
    from captain_ros.harness.motion import Planner
    from captain_ros.ros.move_group_scene import MoveItScene

    profile = robot.load_profile("panda_twin")
    kin = Kinematics(profile=profile)
    planner = Planner(load_config(), kin)
    home = np.array(profile.home_q_rad)
    start = planner.plan_pose(home, START, kin.forward(home)[1]).q_waypoints[-1]
    plan = planner.plan_pose(start, END, kin.forward(start)[1], speed_mps=SPEED_MPS)
    fake = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "captain_ros" / "ros" / "fake_move_group.py"), "--profile", profile.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    scene = None
    try:
        line = fake.stdout.readline()
        if "READY" not in line:
            raise RuntimeError(f"the fake move_group did not start: {line!r}")
        scene = MoveItScene(node, profile.interfaces.moveit, profile.arm_joints, profile.base_frame)
        missing = scene.missing(WAIT_S)
        if missing:
            raise RuntimeError(f"the fake move_group's services did not appear: {missing}")
        box = SceneBox("bench_box", (0.6, 0.35, 0.05), (0.05, 0.05, 0.1), 0.0)  # off the sweep
        applies, times = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            scene.apply([box], [])
            t1 = time.perf_counter()
            scene.apply([], [box.id])
            applies += [t1 - t0, time.perf_counter() - t1]
        scene.apply([box], [])
        for _ in range(3):  # warm-up: discovery and the first requests' allocations
            assert judge(scene.check(plan.q_waypoints), len(plan.q_waypoints)) == ""
        for _ in tqdm(range(checks), desc="MoveIt planning-scene checks", unit="sweep"):
            t0 = time.perf_counter()
            refusal = judge(scene.check(plan.q_waypoints), len(plan.q_waypoints))
            times.append(time.perf_counter() - t0)
            assert refusal == "", refusal
    finally:
        if scene is not None:
            scene.close()
        interrupt(fake, grace_s=20.0)
    states = min(len(plan.q_waypoints), profile.interfaces.moveit.max_states)
    return {
        "moveit_scene_check_ms_p50": 1e3 * float(np.median(times)),
        "moveit_scene_check_ms_p95": 1e3 * float(np.percentile(times, 95)),
        "moveit_scene_apply_ms_p50": 1e3 * float(np.median(applies)),
        "moveit_scene_checks": checks,
        "moveit_scene_states_per_check": states,
        "moveit_scene_sweep_waypoints": len(plan.q_waypoints),
        "moveit_scene_against": "tests/captain_ros/ros/fake_move_group.py in its own process over DDS (Fast DDS, "
        "localhost); its collision model is the TCP as a 3 cm sphere against world boxes (Python forward kinematics "
        "per state), not MoveIt's FCL on the robot's meshes, whose time per state takes its place on a real move_group",
    }


def _merge_moveit(args) -> None:
    """--only moveit: the planning-scene check alone, its keys merged into the results file."""
    from captain_ros.core.domains import isolated_ros_env

    os.environ.update(isolated_ros_env(os.environ, 151, 230))
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    rclpy.init()
    node = rclpy.create_node("bench_real_arm")
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    try:
        moveit = moveit_scene_timing(node, args.moveit_checks)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown()
    _print_moveit(moveit)
    _merge(Path(args.out), moveit, "moveit_scene_machine")


def _merge(out: Path, part: dict[str, object], machine_key: str) -> None:
    """One part's keys into the results file, the others as they were; `machine_key` names this part's machine
    ("machine" stays the other parts')."""
    results = json.loads(out.read_text()) if out.is_file() else {}
    results.update(part)
    results["not_measured_yet"] = [k for k in results.get("not_measured_yet", []) if k not in part]
    results[machine_key] = machine()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out} (this part's keys; the others as they were)")


def _print_moveit(moveit: dict[str, object]) -> None:
    print_table(
        f"MoveIt planning-scene check of one sweep ({moveit['moveit_scene_states_per_check']} states, "
        f"{moveit['moveit_scene_checks']} sweeps; fake move_group over DDS)",
        ["check", "p50 ms", "p95 ms", "apply p50 ms"],
        [
            [
                "GetStateValidity along the sweep",
                moveit["moveit_scene_check_ms_p50"],
                moveit["moveit_scene_check_ms_p95"],
                moveit["moveit_scene_apply_ms_p50"],
            ]
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=8, help="kills with the sweep given a horizon at a time")
    parser.add_argument("--whole-kills", type=int, default=2, help="kills with sweeps sent whole (the anchor)")
    parser.add_argument("--lapses", type=int, default=6, help="e-stop bridge deaths mid-sweep (deadline lapses)")
    parser.add_argument("--configs", type=int, default=2000, help="joint positions the self-collision check times")
    parser.add_argument("--moveit-checks", type=int, default=50, help="sweeps the planning-scene check times")
    parser.add_argument(
        "--only", choices=["moveit", "self_collision"], help="run only this part; its keys merged into --out"
    )
    parser.add_argument("--out", default=str(RESULTS / "real_arm.json"), help="where the results go")
    args = parser.parse_args()
    if args.only == "moveit":
        _merge_moveit(args)
        return
    if args.only == "self_collision":
        collision = self_collision_timing(args.configs)
        _print_self_collision(collision, args.configs)
        _merge(Path(args.out), collision, "self_collision_machine")
        return
    collision = self_collision_timing(args.configs)

    from captain_ros.core.domains import isolated_ros_env

    os.environ.update(isolated_ros_env(os.environ, 151, 230))
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    rng = np.random.default_rng(27)
    twin = _launch("twin_node", ("task", TASK), ("start_id", f"{TASK}/official/0"), ("camera_rate_hz", 0.0))
    rclpy.init()
    node = rclpy.create_node("bench_real_arm")
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    runs: dict[str, list[dict[str, object]]] = {"horizon": [], "whole": [], "lapse": []}
    spurious: list[str] = []
    try:
        link = MotionLink(node)
        watch = ArmWatch(node, robot.load_profile("panda_twin"))
        plan = [("horizon", HORIZON_S)] * args.kills + [("whole", 0.0)] * args.whole_kills
        for kind, horizon in tqdm(plan, desc="motion_node SIGKILLed mid-sweep", unit="kill"):
            runs[kind].append(kill_mid_sweep(link, watch, horizon, float(rng.uniform(0.05, 0.25))))
        if args.lapses:
            lapse_rng = np.random.default_rng(2727)
            with LapseBench(link, watch) as bench, tqdm(total=args.lapses, desc="e-stop bridge dies mid-sweep") as bar:
                while len(runs["lapse"]) < args.lapses:
                    if bench.spurious > 3 * args.lapses + 3:
                        raise RuntimeError(
                            f"{bench.spurious} lapses while the e-stop bridge was alive: "
                            + " | ".join(bench.spurious_reasons)
                        )
                    run = bench.lapse_mid_sweep(float(lapse_rng.uniform(0.05, 0.2)))
                    if run is not None:
                        runs["lapse"].append(run)
                        bar.update()
                spurious = bench.spurious_reasons
        moveit = moveit_scene_timing(node, args.moveit_checks)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown()
        interrupt(twin, grace_s=20.0)

    def column(kind: str, key: str) -> np.ndarray:
        return np.array([r[key] for r in runs[kind]]) if runs[kind] else np.array([np.nan])

    metrics: dict[str, object] = {
        "kill_stop_distance_mm_p95": float(np.percentile(column("horizon", "distance_mm"), 95)),
        "kill_stop_distance_mm_p50": float(np.percentile(column("horizon", "distance_mm"), 50)),
        "kill_stop_distance_mm_max": float(np.max(column("horizon", "distance_mm"))),
        "kill_commanded_rest_ms_p95": float(np.percentile(column("horizon", "commanded_rest_ms"), 95)),
        "kill_stop_time_ms_p95": float(np.percentile(column("horizon", "stop_time_ms"), 95)),
        "kill_tcp_speed_mps_p50": float(np.percentile(column("horizon", "speed_mps"), 50)),
        "whole_sweep_kill_distance_mm_p50": float(np.percentile(column("whole", "distance_mm"), 50)),
        "sweep_horizon_s": HORIZON_S,
        "sweep_speed_mps": SPEED_MPS,
        "kills": len(runs["horizon"]),
        "whole_kills": len(runs["whole"]),
        "estop_lapse_to_hold_ms_p50": float(np.percentile(column("lapse", "expiry_to_hold_ms"), 50)),
        "estop_lapse_to_hold_ms_p95": float(np.percentile(column("lapse", "expiry_to_hold_ms"), 95)),
        "estop_lapse_to_result_ms_p95": float(np.percentile(column("lapse", "expiry_to_result_ms"), 95)),
        "estop_hold_to_rest_ms_p95": float(np.percentile(column("lapse", "hold_to_rest_ms"), 95)),
        "estop_lapse_to_rest_ms_p95": float(np.percentile(column("lapse", "expiry_to_rest_ms"), 95)),
        "estop_lapse_stop_distance_mm_p50": float(np.percentile(column("lapse", "distance_mm"), 50)),
        "estop_lapse_stop_distance_mm_p95": float(np.percentile(column("lapse", "distance_mm"), 95)),
        "estop_lapse_tcp_speed_mps_p50": float(np.percentile(column("lapse", "speed_mps"), 50)),
        "estop_lapse_trials": len(runs["lapse"]),
        "estop_lapse_all_held": bool(runs["lapse"]) and all(r["held"] for r in runs["lapse"]),
        "estop_spurious_lapses": len(spurious),
        "estop_spurious_lapse_reasons": spurious,
        "estop_deadline_s": ESTOP_DEADLINE_S,
        "estop_heartbeat_s": HEARTBEAT_S,
        "estop_lapse_clocks": "lapse_to_hold, lapse_to_result: host steady time (CLOCK_MONOTONIC) from the "
        "deadline's expiry (the last heartbeat's publish + estop_deadline_s); hold_to_rest: the twin's clock, from the "
        "stop ramp's stamp; lapse_to_rest = lapse_to_hold + hold_to_rest; stop_distance: the TCP's travel from "
        "lapse_to_hold of arm time before the stop ramp's stamp until the arm rests",
        **collision,
        **moveit,
        "not_measured_yet": [] if runs["lapse"] else ["estop_lapse_to_hold_ms"],
    }
    anchor = metrics["whole_sweep_kill_distance_mm_p50"]
    print_table(
        f"motion_node SIGKILLed mid-sweep ({SPEED_MPS} m/s MoveTo, twin_node as the arm)",
        [
            "sweep sent",
            "kills",
            "travel after kill p50 mm",
            "p95 mm",
            "setpoint rest p95 ms",
            "arm rest p95 ms",
            "ratio to whole",
        ],
        [
            [
                f"{HORIZON_S} s at a time",
                len(runs["horizon"]),
                metrics["kill_stop_distance_mm_p50"],
                metrics["kill_stop_distance_mm_p95"],
                metrics["kill_commanded_rest_ms_p95"],
                metrics["kill_stop_time_ms_p95"],
                metrics["kill_stop_distance_mm_p50"] / anchor if anchor else float("nan"),
            ],
            [
                "whole (anchor)",
                len(runs["whole"]),
                anchor,
                float(np.percentile(column("whole", "distance_mm"), 95)),
                "",
                float(np.percentile(column("whole", "stop_time_ms"), 95)),
                1.0,
            ],
        ],
    )
    lapses = metrics["estop_lapse_trials"]
    print_table(
        f"e-stop bridge dies mid-sweep ({SPEED_MPS} m/s MoveTo, estop_deadline_s {ESTOP_DEADLINE_S}, "
        f"heartbeat every {HEARTBEAT_S} s; from the deadline's expiry)",
        ["lapses", "to hold p50 ms", "p95 ms", "to result p95 ms", "hold to rest p95 ms", "travel p95 mm", "held"],
        [
            [
                lapses,
                metrics["estop_lapse_to_hold_ms_p50"],
                metrics["estop_lapse_to_hold_ms_p95"],
                metrics["estop_lapse_to_result_ms_p95"],
                metrics["estop_hold_to_rest_ms_p95"],
                metrics["estop_lapse_stop_distance_mm_p95"],
                f"{sum(r['held'] for r in runs['lapse'])}/{lapses} (spurious lapses: {len(spurious)})",
            ]
        ],
    )
    _print_self_collision(collision, args.configs)
    _print_moveit(moveit)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**metrics, "runs": runs, "machine": machine()}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

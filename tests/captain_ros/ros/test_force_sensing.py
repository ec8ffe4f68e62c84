"""Force sensing fails closed over DDS, and the arm's own reflex bounds the force whatever the client does.

twin_node runs in its own process. The ros2_control backend reads its wrench through a relay, in a process of
its own too (tests/captain_ros/ros/wrench_relay.py), that passes the twin's /wrist_ft_sensor/wrench on, or falls silent,
stamps it late, or changes its frame: the ways a real force/torque topic goes missing, stalls or is
misconfigured. This process also republishes it as two vendors publish theirs (VendorWrench): in a frame only
/tf knows (UR's tool0_controller), and best effort (Franka's franka_robot_state_broadcaster)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import WrenchStamped
from rcl_interfaces.srv import SetParameters
from rclpy.qos import QoSProfile, ReliabilityPolicy
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import JointState
from tf2_msgs.msg import TFMessage

from captain_interfaces.srv import ResetEpisode
from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.contract import FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.wrench import change_frame
from captain_ros.harness.harness import Harness
from captain_ros.ros.frames import transform_msg

from .helpers import (
    LOADED_MACHINE_STATE_TIMEOUT_S,
    LOADED_MACHINE_WRENCH_LAG_S,
    fresh,
    launch_twin,
    result_of,
    set_parameters,
    start_script,
    stop,
    wait_for,
)

PANDA = robot.default_profile()  # the twin's arm

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TASK = "put_blue_cube_in_box"
START = f"{TASK}/official/0"
SPOT = [0.45, 0.0]  # clear of every object of the official layout (jaw along x)
RELAYED = "/test/relayed_wrench"


@pytest.fixture(scope="module")
def twin_node_process():
    proc, lines = launch_twin(TASK, START, real_time_factor=1.0, camera_rate_hz=0.0)
    yield proc, lines
    stop(proc)


@pytest.fixture(scope="module")
def relay_process(twin_node_process):
    """tests/captain_ros/ros/wrench_relay.py in its own process, once it relays the twin's wrench."""
    proc = start_script(Path(__file__).with_name("wrench_relay.py"))
    yield proc
    stop(proc)


class Relay:
    """The relay process's mode (its parameter), and the twin's own wrench as this process receives it."""

    def __init__(self, node):
        self.direct: np.ndarray | None = None  # the twin's own force (hand frame), as it arrived
        self._set = node.create_client(SetParameters, "/wrench_relay/set_parameters")
        node.create_subscription(WrenchStamped, "/wrist_ft_sensor/wrench", self._on_wrench, 10)
        self.mode = "pass"

    def _on_wrench(self, msg: WrenchStamped) -> None:
        self.direct = np.array([msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z])

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        set_parameters(self._set, mode=mode)
        self._mode = mode


class Reflex:
    """The twin's force reflex as /diagnostics reports it, and its parameter."""

    def __init__(self, node):
        self.latest: dict[str, str] = {}
        self.level = b"\x00"
        self.peaks: dict[float, float] = {}  # the highest peak force each threshold reported
        self.cond = threading.Condition()
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.set_client = node.create_client(SetParameters, "/twin/set_parameters")

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == "twin: arm force reflex":
                with self.cond:
                    self.latest = {kv.key: kv.value for kv in status.values}
                    self.level = status.level
                    threshold, peak = float(self.latest["threshold_n"]), float(self.latest["peak_force_n"])
                    self.peaks[threshold] = max(peak, self.peaks.get(threshold, 0.0))
                    self.cond.notify_all()

    def value(self, key: str) -> float:
        with self.cond:
            return float(self.latest.get(key, "nan"))

    def wait(self, predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout_s):
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")

    def set_threshold(self, newtons: float) -> None:
        set_parameters(self.set_client, reflex_force_threshold_n=newtons)


@pytest.fixture(scope="module")
def kinematics():
    return Kinematics()


@pytest.fixture
def rig(twin_node_process, relay_process, client_node, kinematics):
    """A fresh episode on the twin, the relay, the reflex monitor, and a harness factory."""
    from captain_ros.ros.ros2_control_backend import HORIZON_S, Ros2ControlBackend

    _, lines = twin_node_process
    reset = client_node.create_client(ResetEpisode, "/twin/reset")
    if not reset.wait_for_service(timeout_sec=60):
        raise RuntimeError("twin_node did not come up:\n" + "".join(lines))
    relay, reflex = Relay(client_node), Reflex(client_node)

    def harness(
        *,
        wrench_topic: str = RELAYED,
        reflex_configured: bool = True,
        force_ok: bool = True,
        wrench_qos: str = "reliable",
        horizon_s: float = HORIZON_S,
    ) -> Harness:
        """A new episode (the twin reset to its start) and a harness on it (waiting for usable force data
        unless `force_ok` is False)."""
        assert result_of(reset.call_async(ResetEpisode.Request(task=TASK, start_id=START)), 30).success
        profile = PANDA
        interfaces = replace(
            profile.interfaces,
            wrench_topic=wrench_topic,
            force_reflex=profile.interfaces.force_reflex if reflex_configured else None,
            wrench_qos=wrench_qos,
        )
        backend = Ros2ControlBackend(
            client_node,
            replace(profile, interfaces=interfaces),
            state_timeout_s=LOADED_MACHINE_STATE_TIMEOUT_S,
            wrench_max_lag_s=LOADED_MACHINE_WRENCH_LAG_S,
            horizon_s=horizon_s,
        )
        backend.wait_for_state(30, wrench_timeout_s=None if force_ok else 0.0)
        return Harness(backend, load_config(), kinematics)

    wait_for(lambda: relay.direct is not None, 30, "the twin's wrench")
    return relay, reflex, harness


def _move_above(harness: Harness) -> None:
    result = harness.call("move_to", pose={"position": [*SPOT, 0.05], "yaw_deg": 90})
    assert result.success, result.message


def test_a_silent_force_sensor_refuses_motion(rig):
    relay, _, make = rig
    relay.mode = "silent"
    harness = make(force_ok=False)
    q0 = harness.backend.commanded()[0]
    result = harness.call("move_to", pose={"position": [*SPOT, 0.2], "yaw_deg": 90})
    assert result.failure_category is FailureCategory.BACKEND_ERROR and not result.executed
    assert "no wrench received on /test/relayed_wrench" in result.message
    np.testing.assert_array_equal(harness.backend.commanded()[0], q0)  # nothing was commanded


def test_force_sensing_lost_mid_motion_stops_the_arm(rig):
    relay, _, make = rig
    harness = make()
    _move_above(harness)
    target = np.array([SPOT[0], SPOT[1] + 0.25, 0.3])
    fired = []

    def silence(progress):
        if progress.progress >= 0.1 and not fired:
            fired.append(progress)
            relay.mode = "silent"

    harness.on_progress = silence
    result = harness.call("move_to", pose={"position": target.tolist(), "yaw_deg": 90}, speed_mps=0.02)
    assert result.failure_category is FailureCategory.BACKEND_ERROR and result.executed
    # whichever notices first: the wrench's age (wall clock) or its stamp falling behind the joint states'
    assert "wrench on /test/relayed_wrench" in result.message
    assert "force sensing lost" in result.message or "stale force data" in result.message
    relay.mode = "pass"
    wait_for(lambda: fresh(harness.backend), 20, "the wrench again")
    assert np.linalg.norm(harness.call("get_robot_state").value["tcp_pose"]["position"] - target) > 0.05
    # held: the stop ramp (it starts at the sim time already granted to the twin, the harness returned at once)
    # brings the setpoint to rest within a second of the arm's time
    backend = harness.backend
    deadline = backend.read_state(require_force=False).time_s + 1.0
    while np.abs(backend.commanded()[1]).max() > 1e-12:
        assert backend.read_state(require_force=False).time_s < deadline, backend.commanded()[1]
        backend.wait_period()


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("late", "stale force data"),
        ("unknown_frame", "in frame 'ft_sensor_link', which the arm's description does not have and /tf cannot"),
    ],
)
def test_a_late_or_misframed_wrench_refuses_motion(rig, mode, words):
    relay, _, make = rig
    relay.mode = mode
    harness = make(force_ok=False)
    wait_for(lambda: harness.call("get_robot_state").failure_category is FailureCategory.BACKEND_ERROR, 20, mode)
    result = harness.call("move_to", pose={"position": [*SPOT, 0.2], "yaw_deg": 90})
    assert result.failure_category is FailureCategory.BACKEND_ERROR and not result.executed
    assert words in result.message


def test_a_wrench_in_another_frame_of_the_arm_is_expressed_in_the_hand_frame(rig):
    relay, _, make = rig
    relay.mode = "base_frame"
    harness = make()
    wait_for(lambda: fresh(harness.backend), 20, "the relayed wrench")
    state = harness.backend.read_state()
    np.testing.assert_allclose(state.force_n, relay.direct, atol=0.3)  # at rest: the hand's own weight
    assert np.linalg.norm(state.force_n) > 3.0  # the hand weighs ~7 N: a real force, not zeros
    _move_above(harness)
    result = harness.call("move_to", pose={"position": [*SPOT, 0.0], "yaw_deg": 90}, speed_mps=0.05)
    assert result.failure_category is FailureCategory.CONTACT_STOP  # guarded contact works through the frame change
    fingertips = PANDA.gripper_geometry.fingertips_below_tcp_m
    assert result.value["tcp_position_m"][2] == pytest.approx(fingertips, abs=0.005)


TOOL_FRAME = "tool0_controller"  # UR's name for the pendant's TCP: on /tf only, relative to the base
TOOL_IN_HAND = (np.array([0.0, 0.0, 0.1034]), Rotation.from_euler("z", 90, degrees=True).as_matrix())
TOOL_WRENCH, BEST_EFFORT_WRENCH = "/test/tool_frame_wrench", "/test/best_effort_wrench"


class VendorWrench:
    """The twin's wrench republished from this process as two vendors publish theirs: UR's force_torque_sensor_
    broadcaster, in a frame its URDF lacks (with /tf base -> tool0_controller from the joint states, at their
    stamps, as its tcp_pose_broadcaster does), and Franka's franka_robot_state_broadcaster, best effort."""

    def __init__(self, node):
        self.kin, self._lock = Kinematics(), threading.Lock()
        self.torque: np.ndarray | None = None  # the twin's own torque (hand frame), as it arrived
        self.published = 0
        self.tf = node.create_publisher(TFMessage, "/tf", 10)
        self.tool = node.create_publisher(WrenchStamped, TOOL_WRENCH, 10)
        best_effort = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)  # rclcpp::QoS(1).best_effort()
        self.best_effort = node.create_publisher(WrenchStamped, BEST_EFFORT_WRENCH, best_effort)
        node.create_subscription(JointState, "/joint_states", self._on_joints, 10)
        node.create_subscription(WrenchStamped, "/wrist_ft_sensor/wrench", self._on_wrench, 10)

    def _on_joints(self, msg: JointState) -> None:
        index = {n: i for i, n in enumerate(msg.name)}
        q = np.array([msg.position[index[j]] for j in PANDA.arm_joints])
        with self._lock:
            p_hand, r_hand = self.kin.forward(q, PANDA.hand_frame)
        p_tool, r_tool = p_hand + r_hand @ TOOL_IN_HAND[0], r_hand @ TOOL_IN_HAND[1]
        tool = transform_msg(PANDA.base_frame, TOOL_FRAME, p_tool, r_tool, msg.header.stamp)
        self.tf.publish(TFMessage(transforms=[tool]))

    def _on_wrench(self, msg: WrenchStamped) -> None:
        f, t = msg.wrench.force, msg.wrench.torque
        force, torque = np.array([f.x, f.y, f.z]), np.array([t.x, t.y, t.z])
        p, r = TOOL_IN_HAND
        tool_force, tool_torque = change_frame(force, torque, r.T, -r.T @ p)  # the same wrench, in the tool frame
        out = WrenchStamped()
        out.header.stamp, out.header.frame_id = msg.header.stamp, TOOL_FRAME
        out.wrench.force.x, out.wrench.force.y, out.wrench.force.z = map(float, tool_force)
        out.wrench.torque.x, out.wrench.torque.y, out.wrench.torque.z = map(float, tool_torque)
        self.tool.publish(out)
        self.best_effort.publish(msg)
        self.torque = torque
        self.published += 1


def test_a_wrench_in_a_frame_only_tf_knows_is_expressed_in_the_hand_frame_through_tf(rig, client_node):
    """UR's wrench comes in tool0_controller, which /tf places relative to the base (not a link of the URDF): the
    backend looks it up in the hand frame at the wrench's stamp, through the twin's /tf of the hand, and guarded
    contact works through it."""
    relay, _, make = rig
    vendor = VendorWrench(client_node)
    wait_for(lambda: vendor.torque is not None, 30, "the twin's wrench")
    harness = make(wrench_topic=TOOL_WRENCH)
    wait_for(lambda: fresh(harness.backend), 20, "the wrench through /tf")
    state = harness.backend.read_state()
    np.testing.assert_allclose(state.force_n, relay.direct, atol=0.3)  # at rest: the hand's own weight
    np.testing.assert_allclose(state.torque_nm, vendor.torque, atol=0.05)
    assert np.linalg.norm(state.force_n) > 3.0  # a real force, not zeros
    _move_above(harness)
    result = harness.call("move_to", pose={"position": [*SPOT, 0.0], "yaw_deg": 90}, speed_mps=0.05)
    assert result.failure_category is FailureCategory.CONTACT_STOP
    fingertips = PANDA.gripper_geometry.fingertips_below_tcp_m
    assert result.value["tcp_position_m"][2] == pytest.approx(fingertips, abs=0.005)


def test_a_best_effort_wrench_needs_the_profiles_best_effort_qos(rig, client_node):
    """Franka publishes its external wrench best effort: a reliable subscription never hears it (force sensing
    refuses motion), `wrench_qos: best_effort` does."""
    relay, _, make = rig
    vendor = VendorWrench(client_node)
    wait_for(lambda: vendor.published > 0, 30, "the best-effort wrench")
    deaf = make(wrench_topic=BEST_EFFORT_WRENCH, wrench_qos="reliable", force_ok=False)
    heard = vendor.published
    wait_for(lambda: vendor.published > heard + 100, 30, "100 more best-effort wrenches")  # ~1 s of them
    refused = deaf.call("move_to", pose={"position": [*SPOT, 0.2], "yaw_deg": 90})
    assert refused.failure_category is FailureCategory.BACKEND_ERROR and not refused.executed
    assert f"no wrench received on {BEST_EFFORT_WRENCH}" in refused.message
    deaf.backend.close()
    harness = make(wrench_topic=BEST_EFFORT_WRENCH, wrench_qos="best_effort")
    wait_for(lambda: fresh(harness.backend), 20, "the best-effort wrench")
    np.testing.assert_allclose(harness.backend.read_state().force_n, relay.direct, atol=0.3)


def test_a_stalled_client_cannot_press_the_arm_into_the_table(rig):
    """The 412 N case of bench/motion.py: the client stalled during a manipulation-mode descent while the
    controller kept following the trajectory into the table. The client here stalls on purpose (its progress
    hook blocks) until the twin reports what the arm did; without the reflex the press grows past 100 N,
    with it the arm stops itself at the motion's force limit. The sweeps go out whole (horizon_s=0), as then: with
    the default horizon the controller is only ever given 50 ms of the sweep, so a stalled client's arm stops by
    itself (test_sweep_horizon.py, test_kill_stop.py), and the twin in lockstep waits for the stalled loop."""
    _, reflex, make = rig
    limit = 15.0

    def descend(harness: Harness, released: Callable[[], bool]):
        _move_above(harness)
        fired = []

        def stall(progress):
            if progress.progress >= 0.2 and not fired:
                fired.append(progress)
                reflex.wait(released, "the twin to report the press")

        harness.on_progress = stall
        return harness.call(
            "move_to",
            pose={"position": [*SPOT, 0.0], "yaw_deg": 90},
            mode="manipulation",
            force_limit_n=limit,
            speed_mps=0.02,
        )

    # no reflex (an arm whose reflex this client cannot set, with it switched off): only the client can stop it
    reflex.set_threshold(0.0)
    unguarded = make(wrench_topic="/wrist_ft_sensor/wrench", reflex_configured=False, horizon_s=0.0)
    result = descend(unguarded, lambda: reflex.value("external_force_n") > 100.0)
    assert result.failure_category is FailureCategory.FORCE_LIMIT and reflex.value("peak_force_n") > 100.0

    # the same stall in a new episode, with the reflex set to the motion's limit by the harness
    guarded = make(wrench_topic="/wrist_ft_sensor/wrench", horizon_s=0.0)
    reflex.peaks.clear()
    result = descend(guarded, lambda: reflex.level == b"\x01")  # WARN: tripped
    # the arm stopped itself (the stall ended only once the twin reported the trip); whether this client then
    # reads the abort or the force first, the outcome is the force limit
    assert result.failure_category is FailureCategory.FORCE_LIMIT and result.executed
    # the peak while the reflex was at the motion's limit (the harness sets the standing reflex again when the
    # motion ends, so the latest status may already show that one)
    assert limit in reflex.peaks and reflex.peaks[limit] < limit + 45.0  # the impact spike, never hundreds of N
    np.testing.assert_allclose(guarded.backend.commanded()[1], 0.0, atol=1e-12)  # held

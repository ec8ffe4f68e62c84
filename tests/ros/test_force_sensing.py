"""Force sensing fails closed over DDS, and the arm's own reflex bounds the force whatever the client does.

twin_node runs in its own process. The ros2_control backend reads its wrench through a relay in this
process that passes the twin's /wrist_ft_sensor/wrench on, or falls silent, stamps it late, or changes its
frame: the ways a real force/torque topic goes missing, stalls or is misconfigured."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import WrenchStamped
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from sensor_msgs.msg import JointState

from captain_interfaces.srv import ResetEpisode
from captain_ros.core.contract import FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.wrench import change_frame
from captain_ros.harness.config import load_config
from captain_ros.harness.harness import Harness
from captain_ros.paths import config_path
from captain_ros.twin import robot

from .helpers import (
    LOADED_MACHINE_STATE_TIMEOUT_S,
    LOADED_MACHINE_WRENCH_LAG_S,
    launch_twin,
    result_of,
    stop,
    wait_for,
)

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


class Relay:
    """Passes the twin's wrench on to RELAYED, changed by `mode`: pass, silent, late, unknown_frame, base_frame."""

    def __init__(self, node, kin: Kinematics):
        self.mode = "pass"
        self.kin = kin
        self.q = None
        self.direct: np.ndarray | None = None  # the twin's own force (hand frame), as it arrived
        self.pub = node.create_publisher(WrenchStamped, RELAYED, 10)
        node.create_subscription(JointState, "/joint_states", self._on_joints, 10)
        node.create_subscription(WrenchStamped, "/wrist_ft_sensor/wrench", self._on_wrench, 10)

    def _on_joints(self, msg: JointState) -> None:
        index = {n: i for i, n in enumerate(msg.name)}
        self.q = np.array([msg.position[index[j]] for j in robot.ARM_JOINTS])

    def _on_wrench(self, msg: WrenchStamped) -> None:
        self.direct = np.array([msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z])
        if self.mode == "silent":
            return
        if self.mode == "late":
            msg.header.stamp.sec -= 5  # a sensor whose data lags the joint states by 5 s
        elif self.mode == "unknown_frame":
            msg.header.frame_id = "ft_sensor_link"  # not a frame of the arm's description
        elif self.mode == "base_frame" and self.q is not None:  # as an external-wrench estimate in the base frame
            _, r_hand = self.kin.forward(self.q, robot.HAND_FRAME)
            f, t = msg.wrench.force, msg.wrench.torque
            p_hand = self.kin.forward(self.q, robot.HAND_FRAME)[0]
            force, torque = change_frame(np.array([f.x, f.y, f.z]), np.array([t.x, t.y, t.z]), r_hand, p_hand)
            msg.header.frame_id = robot.BASE_FRAME
            msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = map(float, force)
            msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = map(float, torque)
        self.pub.publish(msg)


class Reflex:
    """The twin's force reflex as /diagnostics reports it, and its parameter."""

    def __init__(self, node):
        self.latest: dict[str, str] = {}
        self.level = b"\x00"
        self.cond = threading.Condition()
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.set_client = node.create_client(SetParameters, "/twin/set_parameters")

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == "twin: arm force reflex":
                with self.cond:
                    self.latest = {kv.key: kv.value for kv in status.values}
                    self.level = status.level
                    self.cond.notify_all()

    def value(self, key: str) -> float:
        with self.cond:
            return float(self.latest.get(key, "nan"))

    def wait(self, predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout_s):
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")

    def set_threshold(self, newtons: float) -> None:
        assert self.set_client.wait_for_service(timeout_sec=20)
        value = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=newtons)
        request = SetParameters.Request(parameters=[Parameter(name="reflex_force_threshold_n", value=value)])
        assert result_of(self.set_client.call_async(request), 20).results[0].successful


@pytest.fixture(scope="module")
def kinematics():
    return Kinematics()


@pytest.fixture
def rig(twin_node_process, client_node, kinematics):
    """A fresh episode on the twin, the relay, the reflex monitor, and a harness factory."""
    from captain_ros.ros.ros2_control_backend import Ros2ControlBackend

    _, lines = twin_node_process
    reset = client_node.create_client(ResetEpisode, "/twin/reset")
    if not reset.wait_for_service(timeout_sec=60):
        raise RuntimeError("twin_node did not come up:\n" + "".join(lines))
    relay, reflex = Relay(client_node, kinematics), Reflex(client_node)

    def harness(*, wrench_topic: str = RELAYED, reflex_configured: bool = True) -> Harness:
        """A new episode (the twin reset to its start) and a harness on it."""
        assert result_of(reset.call_async(ResetEpisode.Request(task=TASK, start_id=START)), 30).success
        interfaces = yaml.safe_load(config_path("robot.yaml").read_text())["interfaces"]
        interfaces["wrench_topic"] = wrench_topic
        if not reflex_configured:
            interfaces.pop("force_reflex")
        backend = Ros2ControlBackend(
            client_node,
            interfaces,
            state_timeout_s=LOADED_MACHINE_STATE_TIMEOUT_S,
            wrench_max_lag_s=LOADED_MACHINE_WRENCH_LAG_S,
        )
        backend.wait_for_state(30)
        return Harness(backend, load_config(), kinematics)

    wait_for(lambda: relay.direct is not None and relay.q is not None, 30, "the twin's wrench and joint states")
    return relay, reflex, harness


def _move_above(harness: Harness) -> None:
    result = harness.call("move_to", pose={"position": [*SPOT, 0.05], "yaw_deg": 90})
    assert result.success, result.message


def test_a_silent_force_sensor_refuses_motion(rig):
    relay, _, make = rig
    relay.mode = "silent"
    harness = make()
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
    wait_for(lambda: _fresh(harness), 20, "the wrench again")
    assert np.linalg.norm(harness.call("get_robot_state").value["tcp_pose"]["position"] - target) > 0.05
    np.testing.assert_allclose(harness.backend.commanded()[1], 0.0, atol=1e-12)  # held


@pytest.mark.parametrize(("mode", "words"), [("late", "stale force data"), ("unknown_frame", "'ft_sensor_link'")])
def test_a_late_or_misframed_wrench_refuses_motion(rig, mode, words):
    relay, _, make = rig
    relay.mode = mode
    harness = make()
    wait_for(lambda: harness.call("get_robot_state").failure_category is FailureCategory.BACKEND_ERROR, 20, mode)
    result = harness.call("move_to", pose={"position": [*SPOT, 0.2], "yaw_deg": 90})
    assert result.failure_category is FailureCategory.BACKEND_ERROR and not result.executed
    assert words in result.message


def test_a_wrench_in_another_frame_of_the_arm_is_expressed_in_the_hand_frame(rig):
    relay, _, make = rig
    relay.mode = "base_frame"
    harness = make()
    wait_for(lambda: _fresh(harness), 20, "the relayed wrench")
    state = harness.backend.read_state()
    np.testing.assert_allclose(state.force_n, relay.direct, atol=0.3)  # at rest: the hand's own weight
    assert np.linalg.norm(state.force_n) > 3.0  # the hand weighs ~7 N: a real force, not zeros
    _move_above(harness)
    result = harness.call("move_to", pose={"position": [*SPOT, 0.0], "yaw_deg": 90}, speed_mps=0.05)
    assert result.failure_category is FailureCategory.CONTACT_STOP  # guarded contact works through the frame change
    fingertips = robot.gripper_geometry().fingertips_below_tcp_m
    assert result.value["tcp_position_m"][2] == pytest.approx(fingertips, abs=0.005)


def test_a_stalled_client_cannot_press_the_arm_into_the_table(rig):
    """The 412 N case of bench/motion.py: the client stalled during a manipulation-mode descent while the
    controller kept following the trajectory into the table. The client here stalls on purpose (its progress
    hook blocks) until the twin reports what the arm did; without the reflex the press grows past 100 N,
    with it the arm stops itself at the motion's force limit."""
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
    unguarded = make(wrench_topic="/wrist_ft_sensor/wrench", reflex_configured=False)
    result = descend(unguarded, lambda: reflex.value("external_force_n") > 100.0)
    assert result.failure_category is FailureCategory.FORCE_LIMIT and reflex.value("peak_force_n") > 100.0

    # the same stall in a new episode, with the reflex set to the motion's limit by the harness
    guarded = make(wrench_topic="/wrist_ft_sensor/wrench")
    result = descend(guarded, lambda: reflex.level == b"\x01")  # WARN: tripped
    assert result.failure_category is FailureCategory.FORCE_LIMIT and result.executed
    assert "force reflex" in result.message
    reflex.wait(lambda: reflex.value("threshold_n") == limit, "the reflex status")
    assert reflex.value("peak_force_n") < limit + 45.0  # the table's impact spike, never hundreds of newtons
    np.testing.assert_allclose(guarded.backend.commanded()[1], 0.0, atol=1e-12)  # held


def _fresh(harness: Harness) -> bool:
    from captain_ros.harness.backend import BackendError

    try:
        harness.backend.read_state()
    except BackendError:
        return False
    return True

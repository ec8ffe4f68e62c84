"""Execution on a ros2_control arm: every stop is a ramp within the safety config's deceleration limit that begins
at the next control period, and the arm's speed scaling (UR's pendant slider) is respected.

Each test runs on the twin in-process and on the ros2_control backend driving twin_node (a separate process) over
DDS, as test_backends.py does. The arm is the UR5e-class twin (robot profile ur5e_twin): twin_node simulates UR's
scaled_joint_trajectory_controller and speed_scaling_state_broadcaster (percent, on the profile's topic), with the
pendant's speed slider as its parameter `speed_slider_fraction`. Durations are compared in the arm's own time (sim
time), never on the wall clock; decelerations are measured from the arm's joint velocities (/joint_states over DDS,
the simulator's in-process) and from the commands the controller received.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from rcl_interfaces.srv import SetParameters
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory as JointTrajectoryMsg

from captain_interfaces.srv import ResetEpisode
from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.contract import FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.trajectory import duration_to_s
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin

from .helpers import (
    LOADED_MACHINE_STATE_TIMEOUT_S,
    LOADED_MACHINE_WRENCH_LAG_S,
    fresh,
    launch_twin,
    result_of,
    set_parameters,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
PROFILE = robot.load_profile("ur5e_twin")  # a ros2_control arm with UR's speed scaling
TASK = "put_red_cube_in_bowl"
START = f"{TASK}/official/0"
LEFT = {"position": [0.45, 0.2, 0.25], "yaw_deg": 0}
RIGHT = {"position": [0.45, -0.1, 0.25], "yaw_deg": 0}
FAST = 0.25  # m/s, the speed limit: the faster the arm, the harder a stop that jumped to rest would be
DECEL = load_config().safety.stop_decel_radps2
# The ramp the controller is given is checked exactly against the limit. The arm's measured deceleration may exceed
# it a little: its servos lag the setpoint (30 % allowed). Over DDS the twin runs in lockstep with the backend
# (captain_ros.twin.lockstep), so the ramp starts at its stamp however late a loaded machine delivers it, as
# in-process; a stop that jumped to rest measures 25-45 rad/s^2 here.
MEASURED_MARGIN = 1.3


def _accelerations(samples: list[tuple[float, np.ndarray]], since_s: float) -> np.ndarray:
    """|dqd/dt| per joint between consecutive measured states from `since_s` on."""
    rows = [(t, qd) for t, qd in samples if t >= since_s]
    t = np.array([r[0] for r in rows])
    qd = np.array([r[1] for r in rows])
    keep = np.diff(t) > 1e-9
    return np.abs(np.diff(qd, axis=0)[keep] / np.diff(t)[keep][:, None])


@dataclass
class Recorder:
    """What the arm did and was told: measured joint velocities with their stamps, the positions hold() returned,
    and the stop messages its controller received (ros2_control)."""

    velocities: list[tuple[float, np.ndarray]] = field(default_factory=list)
    holds: list[np.ndarray] = field(default_factory=list)
    stops: list[JointTrajectoryMsg] = field(default_factory=list)
    setpoints: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)  # in-process: every period
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            self.velocities.clear()
            self.holds.clear()
            self.stops.clear()
            self.setpoints.clear()

    def samples(self) -> list[tuple[float, np.ndarray]]:
        with self.lock:
            return list(self.velocities)


@dataclass
class Arm:
    kind: str
    harness: Harness
    recorder: Recorder
    set_slider: Callable[[float], None]  # the pendant's speed slider

    @property
    def backend(self):
        return self.harness.backend

    def q(self) -> np.ndarray:
        return self.backend.read_state(require_force=False).q_rad

    def slide_to(self, fraction: float) -> None:
        """Move the slider and wait until the arm's controller reports that scaling."""
        self.set_slider(fraction)
        deadline = self.backend.read_state(require_force=False).time_s + 2.0  # the factor follows within 0.5 s
        while abs(self.backend.speed_scaling() - fraction) > 1e-6:
            self.backend.wait_period()
            assert self.backend.read_state(require_force=False).time_s < deadline, "the speed scaling did not follow"

    def settle(self, within_s: float = 5.0) -> np.ndarray:
        """Wait (in the arm's time) until it has been at rest for 0.1 s; returns where it is."""
        start, rest_since = self.backend.read_state(require_force=False).time_s, None
        while True:
            self.backend.wait_period()
            state = self.backend.read_state(require_force=False)
            moving = np.abs(state.qd_radps).max() >= 0.01
            rest_since = None if moving else (state.time_s if rest_since is None else rest_since)
            if rest_since is not None and state.time_s - rest_since >= 0.1:
                return state.q_rad
            assert state.time_s - start < within_s, f"the arm still moves after {within_s} s: {state.qd_radps}"


class _RecordingTwinBackend(TwinBackend):
    def __init__(self, twin: Twin, recorder: Recorder):
        super().__init__(twin)
        self.recorder = recorder

    def hold(self, q_rad=None):
        held = super().hold(q_rad)
        self.recorder.holds.append(held.copy())
        return held

    def wait_period(self):
        super().wait_period()
        t = self.twin.time_s
        self.recorder.velocities.append((t, self.twin.arm_qd()))
        arm = self.controllers.arm
        q = arm.update(t)  # the setpoint at this instant (the next physics step starts from it)
        self.recorder.setpoints.append((t, q, arm.desired_qd.copy()))


@pytest.fixture(scope="module")
def kinematics():
    return Kinematics(profile=PROFILE)


@pytest.fixture(scope="module")
def twin_node_process():
    proc, lines = launch_twin(TASK, START, real_time_factor=1.0, camera_rate_hz=0.0, robot_profile=PROFILE.name)
    yield proc, lines
    stop(proc)


def _twin_arm(kinematics) -> Arm:
    twin = Twin(TASK, profile=PROFILE)
    twin.reset(START)
    recorder = Recorder()
    backend = _RecordingTwinBackend(twin, recorder)

    def slider(fraction: float) -> None:
        backend.controllers.speed_scaling_target = fraction

    return Arm("twin", Harness(backend, load_config(), kinematics), recorder, slider)


def _ros2_control_arm(request, kinematics) -> Arm:
    from captain_ros.ros.ros2_control_backend import Ros2ControlBackend

    _, lines = request.getfixturevalue("twin_node_process")
    node = request.getfixturevalue("client_node")
    recorder = Recorder()
    reset = node.create_client(ResetEpisode, "/twin/reset")
    parameters = node.create_client(SetParameters, "/twin/set_parameters")
    if not reset.wait_for_service(timeout_sec=60):
        raise RuntimeError("twin_node did not come up:\n" + "".join(lines))
    set_parameters(parameters, speed_slider_fraction=1.0)  # whatever an earlier test left
    answer = result_of(reset.call_async(ResetEpisode.Request(task=TASK, start_id=START)), 30)
    assert answer.success, answer.message
    index = [None]

    def on_joints(msg: JointState) -> None:
        if index[0] is None:
            index[0] = [list(msg.name).index(j) for j in PROFILE.arm_joints]
        with recorder.lock:
            t = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            recorder.velocities.append((t, np.asarray(msg.velocity)[index[0]]))

    def on_stop(msg: JointTrajectoryMsg) -> None:
        with recorder.lock:
            recorder.stops.append(msg)

    node.create_subscription(JointState, PROFILE.interfaces.joint_states_topic, on_joints, 100)
    node.create_subscription(JointTrajectoryMsg, PROFILE.interfaces.trajectory_topic, on_stop, 10)
    backend = Ros2ControlBackend(
        node, PROFILE, state_timeout_s=LOADED_MACHINE_STATE_TIMEOUT_S, wrench_max_lag_s=LOADED_MACHINE_WRENCH_LAG_S
    )
    reset_time = backend.wait_for_state(30).time_s
    wait_for(lambda: fresh(backend) and backend.read_state().time_s > reset_time + 0.05, 10, "states after the reset")
    hold = backend.hold

    def recording_hold(q_rad=None):
        held = hold(q_rad)
        recorder.holds.append(held.copy())
        return held

    backend.hold = recording_hold
    return Arm(
        "ros2_control",
        Harness(backend, load_config(), kinematics),
        recorder,
        lambda fraction: set_parameters(parameters, speed_slider_fraction=fraction),
    )


@pytest.fixture(params=["twin", "ros2_control"])
def arm(request, kinematics) -> Iterator[Arm]:
    arm = _twin_arm(kinematics) if request.param == "twin" else _ros2_control_arm(request, kinematics)
    try:
        arm.slide_to(1.0)
        yield arm
    finally:
        if arm.kind == "ros2_control":
            arm.set_slider(1.0)
        arm.backend.close()


def _press_at(harness: Harness, fraction: float, action: Callable[[], None]) -> list:
    """Call `action` when the running motion is `fraction` done; returns [the arm state at that moment]."""
    pressed = []

    def hook(progress):
        if progress.progress >= fraction and not pressed:
            pressed.append(harness.backend.read_state(require_force=False))
            action()

    harness.on_progress = hook
    return pressed


def _check_stop_message(arm: Arm, requested_s: float) -> None:
    """ros2_control: the controller was sent a ramp, stamped with a joint state at or after the stop request, first
    point one control period after that stamp, decelerating within the limit to rest where hold() said."""
    period = arm.backend.control_period_s
    end = list(arm.recorder.holds[-1])

    def ramps():  # the sweep's stretches go on the same topic, stamped too: the ramp ends where hold() said
        with arm.recorder.lock:
            stamped = [m for m in arm.recorder.stops if m.header.stamp.sec or m.header.stamp.nanosec]
            return [m for m in stamped if list(m.points[-1].positions) == end]

    wait_for(lambda: bool(ramps()), 10, "the ramp")
    ramp = ramps()[0]
    stamp_s = ramp.header.stamp.sec + ramp.header.stamp.nanosec * 1e-9
    assert stamp_s >= requested_s - 1e-9  # computed from where the arm was when the stop came, or later
    times = np.array([duration_to_s(p.time_from_start.sec, p.time_from_start.nanosec) for p in ramp.points])
    assert times[0] == pytest.approx(period, abs=1e-9)  # it begins at the next control period
    assert list(ramp.joint_names) == list(PROFILE.arm_joints)
    velocities = np.array([p.velocities for p in ramp.points])
    positions = np.array([p.positions for p in ramp.points])
    decelerations = np.abs(np.diff(velocities, axis=0) / np.diff(times)[:, None])
    assert decelerations.max() <= DECEL * (1 + 1e-9)
    assert len(ramp.points) >= 3 and np.abs(velocities[0]).max() > 0.05  # a ramp from speed, not a hold point
    np.testing.assert_array_equal(velocities[-2:], 0.0)  # at rest, and kept there
    np.testing.assert_allclose(positions[-1], arm.recorder.holds[-1], atol=1e-12)  # where hold() said it ends


def _check_setpoints(arm: Arm, held_at_period: int) -> None:
    """In-process: the commanded setpoint decelerates from the very next period, within the limit, to rest."""
    setpoints = arm.recorder.setpoints
    period = arm.backend.control_period_s
    before, after = setpoints[held_at_period - 1][2], setpoints[held_at_period][2]
    fastest = int(np.argmax(np.abs(before)))
    assert abs(after[fastest]) < abs(before[fastest])  # already slower one period after the stop
    qd = np.array([s[2] for s in setpoints[held_at_period - 1 :]])
    assert np.abs(np.diff(qd, axis=0)).max() <= DECEL * period * (1 + 1e-6)
    np.testing.assert_allclose(qd[-1], 0.0, atol=1e-9)
    np.testing.assert_allclose(setpoints[-1][1], arm.recorder.holds[-1], atol=1e-12)


@pytest.mark.parametrize(
    ("button", "category"),
    [("cancel", FailureCategory.CANCELED), ("stop", FailureCategory.SAFETY_STOP)],
)
def test_a_stop_decelerates_within_the_limit_from_the_next_control_period(arm, button, category):
    harness = arm.harness
    assert harness.call("move_to", pose=LEFT, speed_mps=FAST).success
    arm.recorder.clear()
    pressed = _press_at(harness, 0.4, getattr(harness, button))
    result = harness.call("move_to", pose=RIGHT, speed_mps=FAST)
    harness.on_progress = None
    assert result.failure_category is category and result.executed, result.message
    assert result.value["distance_to_target_m"] > 0.05
    requested_s = pressed[0].time_s
    # the arm was moving fast: a jump to rest would have decelerated it far beyond the limit
    assert np.abs(pressed[0].qd_radps).max() > 0.3
    held = arm.recorder.holds[-1]
    if arm.kind == "ros2_control":
        _check_stop_message(arm, requested_s)
    else:
        period = next(i for i, s in enumerate(arm.recorder.setpoints) if s[0] > requested_s + 1e-9)
        _check_setpoints(arm, period)
    where = arm.settle()
    accelerations = _accelerations(arm.recorder.samples(), requested_s)
    assert accelerations.max() <= MEASURED_MARGIN * DECEL, accelerations.max(axis=0)
    np.testing.assert_allclose(where, held, atol=2e-3)  # the arm stays where the ramp ended
    np.testing.assert_allclose(arm.backend.commanded()[1], 0.0, atol=1e-9)
    if button == "stop":
        harness.resume()
    again = harness.call("move_to", pose=LEFT)  # at the default speed: a short sweep at the limit is felt as contact
    assert again.success, again.message  # and moves on


def test_the_watchdog_stops_with_the_same_ramp(arm):
    harness = arm.harness
    assert harness.call("move_to", pose=LEFT, speed_mps=FAST).success
    silent = [False]

    class Silence:  # the agent goes silent at 40 % of the sweep
        timeout_s = 1.0

        def feed(self):
            pass

        def expired(self):
            return silent[0]

        def silent_for_s(self):
            return 1.5

    harness.watchdog = Silence()
    arm.recorder.clear()
    pressed = _press_at(harness, 0.4, lambda: silent.__setitem__(0, True))
    result = harness.call("move_to", pose=RIGHT, speed_mps=FAST)
    harness.on_progress, harness.watchdog = None, None
    assert result.failure_category is FailureCategory.SAFETY_STOP and "watchdog" in result.message
    if arm.kind == "ros2_control":
        _check_stop_message(arm, pressed[0].time_s)
    else:
        period = next(i for i, s in enumerate(arm.recorder.setpoints) if s[0] > pressed[0].time_s + 1e-9)
        _check_setpoints(arm, period)
    arm.settle()
    assert _accelerations(arm.recorder.samples(), pressed[0].time_s).max() <= MEASURED_MARGIN * DECEL


def test_at_half_speed_scaling_a_motion_takes_twice_as_long_and_says_so(arm):
    harness = arm.harness
    assert harness.call("move_to", pose=LEFT, speed_mps=FAST).success
    planned = harness.call("check_motion", pose=RIGHT, speed_mps=FAST).value["duration_s"]
    full = harness.call("move_to", pose=RIGHT, speed_mps=FAST)
    assert full.success and "speed scaling" not in full.receipt
    assert 0.9 < full.value["duration_s"] / planned < 1.4
    arm.slide_to(0.5)
    planned = harness.call("check_motion", pose=LEFT, speed_mps=FAST).value["duration_s"]
    half = harness.call("move_to", pose=LEFT, speed_mps=FAST)
    assert half.success, half.message  # neither stalled nor timed out for being slow
    assert half.value["distance_to_target_m"] < 0.003
    assert 1.8 < half.value["duration_s"] / planned < 2.6  # sim time: 1/0.5 as long, plus settling
    assert "the arm's speed scaling was 50%" in half.receipt
    assert harness.motions[-1].outcome.speed_scaling_range == pytest.approx((0.5, 0.5))


def test_a_paused_arm_waits_then_stops_with_a_clear_message_and_never_jumps(arm):
    harness = arm.harness
    assert harness.call("move_to", pose=LEFT, speed_mps=FAST).success
    arm.recorder.clear()
    pressed = _press_at(harness, 0.3, lambda: arm.set_slider(0.0))  # the pendant's pause, mid-sweep
    result = harness.call("move_to", pose=RIGHT, speed_mps=FAST)
    harness.on_progress = None
    assert result.failure_category is FailureCategory.TIMEOUT and result.executed
    assert "paused: the arm's speed scaling has been 0" in result.message, result.message
    assert result.value["distance_to_target_m"] > 0.05
    # paused: the arm stands still, however long the pause
    assert arm.backend.speed_scaling() == 0.0
    paused_at = arm.settle()
    for _ in range(round(0.5 / arm.backend.control_period_s)):
        arm.backend.wait_period()
    np.testing.assert_allclose(arm.q(), paused_at, atol=1e-3)
    # resumed: it completes its stop where hold() said, decelerating within the limit all along
    arm.slide_to(1.0)
    where = arm.settle()
    np.testing.assert_allclose(where, arm.recorder.holds[-1], atol=2e-3)
    assert _accelerations(arm.recorder.samples(), pressed[0].time_s).max() <= MEASURED_MARGIN * DECEL
    again = harness.call("move_to", pose=RIGHT)
    assert again.success, again.message


@pytest.mark.parametrize(
    ("unit_line", "error"),
    [
        (None, "speed_scaling_unit must be one of percent, fraction with a speed_scaling_topic"),
        ("  speed_scaling_unit: percnt\n", "got 'percnt'"),
        ("  speed_scaling_unit: percent\n", None),
        ("  speed_scaling_unit: fraction\n", None),
    ],
)
def test_a_speed_scaling_topic_must_say_its_unit(tmp_path, unit_line, error):
    """UR publishes percent where its docs say [0, 1]: a profile naming the topic must say which it gets."""
    text = Path(PROFILE.source).read_text()
    lines = [line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("speed_scaling_unit:")]
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("speed_scaling_topic:")) + 1
    if unit_line is not None:
        lines.insert(at, unit_line)
    path = tmp_path / "scaled_arm.yaml"
    path.write_text("".join(lines))
    if error is not None:
        with pytest.raises(robot.ProfileError, match=error):
            robot.load_profile(path)
        return
    interfaces = robot.load_profile(path).interfaces
    full = {"percent": 100.0, "fraction": 1.0}[interfaces.speed_scaling_unit]
    assert interfaces.speed_scaling_fraction(0.3 * full) == pytest.approx(0.3)

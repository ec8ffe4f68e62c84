"""ros/franka.py's reasons, from the robot state franka_robot_state_broadcaster publishes (franka_msgs' constants).
The DDS path (FrankaStateWatch's polled reader; a reflex mid-motion, the recovery, a stale state):
test_vendor_profiles.py's test_fr3_* tests."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
from franka_msgs.msg import FrankaRobotState

from captain_ros.ros.franka import ROBOT_MODES, FrankaModeTracker, _error_names, refusal

TOPIC = "/franka_robot_state_broadcaster/robot_state"


@pytest.mark.parametrize("mode", [FrankaRobotState.ROBOT_MODE_IDLE, FrankaRobotState.ROBOT_MODE_MOVE])
def test_a_fresh_state_in_idle_or_move_may_move(mode):
    assert refusal(mode, (), 0.001, 0.5, TOPIC) == ""


@pytest.mark.parametrize(
    ("mode", "errors", "age_s", "reason"),
    [
        (None, (), 0.0, f"no robot state on {TOPIC} yet: motions are refused until franka_robot_state_broadcaster"),
        (
            FrankaRobotState.ROBOT_MODE_MOVE,
            (),
            0.61,
            f"the FR3's robot state on {TOPIC} is 0.61 s old (limit 0.5 s): franka_hardware stops its controllers "
            "after a reflex or a user stop",
        ),
        (
            FrankaRobotState.ROBOT_MODE_REFLEX,
            ("cartesian_reflex",),
            0.0,
            "the FR3's robot mode is REFLEX, errors: cartesian_reflex: the arm stopped itself",
        ),
        (FrankaRobotState.ROBOT_MODE_USER_STOPPED, (), 0.0, "USER_STOPPED: the external activation device"),
        (FrankaRobotState.ROBOT_MODE_GUIDING, (), 0.0, "GUIDING: someone is guiding the arm by hand"),
        (FrankaRobotState.ROBOT_MODE_OTHER, (), 0.0, "OTHER: the brakes are locked or FCI is not active"),
        (FrankaRobotState.ROBOT_MODE_AUTOMATIC_ERROR_RECOVERY, (), 0.0, "AUTOMATIC_ERROR_RECOVERY: the arm is running"),
        (42, (), 0.0, "the FR3's robot mode is 42: see Desk"),
    ],
)
def test_every_other_state_is_named(mode, errors, age_s, reason):
    assert reason in refusal(mode, errors, age_s, 0.5, TOPIC)


def test_the_names_are_the_messages_constants_and_errors_come_from_the_message():
    assert ROBOT_MODES[FrankaRobotState.ROBOT_MODE_REFLEX] == "REFLEX" and len(ROBOT_MODES) == 7
    msg = FrankaRobotState()
    assert _error_names(msg) == ()
    msg.last_motion_errors.joint_reflex = True
    assert _error_names(msg) == ("joint_reflex",)  # no current error: those that ended the last motion
    msg.current_errors.cartesian_reflex = msg.current_errors.power_limit_violation = True
    assert _error_names(msg) == ("cartesian_reflex", "power_limit_violation")


def mode(value: int) -> FrankaRobotState:
    return FrankaRobotState(robot_mode=value)


def test_the_tracker_keeps_the_latest_mode_and_judges_its_age_on_its_clock():
    now, changes = [100.0], []
    tracker = FrankaModeTracker(TOPIC, on_change=lambda: changes.append(tracker.mode), clock=lambda: now[0])
    assert "no robot state" in tracker.refusal(0.5) and not tracker.heard_since(0.0)
    tracker.update(mode(FrankaRobotState.ROBOT_MODE_MOVE))
    tracker.update(mode(FrankaRobotState.ROBOT_MODE_MOVE))  # no change: no wake-up
    assert tracker.refusal(0.5) == "" and changes == [FrankaRobotState.ROBOT_MODE_MOVE] and tracker.heard_since(99.0)
    now[0] = 100.6
    assert "is 0.60 s old (limit 0.5 s)" in tracker.refusal(0.5) and not tracker.heard_since(100.0)
    reflex = mode(FrankaRobotState.ROBOT_MODE_REFLEX)
    reflex.current_errors.cartesian_reflex = True
    tracker.update(reflex)
    assert "REFLEX, errors: cartesian_reflex" in tracker.refusal(0.5) and changes[-1] == reflex.robot_mode
    assert tracker.heard_since(100.5)
    tracker.update(reflex, came_after=100.4)  # taken now, known only to have come after the poll before
    assert tracker.heard_since(100.3) and not tracker.heard_since(100.5)


def test_a_state_delivered_late_is_as_old_as_its_stamp():
    """A loaded host can deliver a state published before a reflex after the motion already failed on the silence:
    taken just now, it is still judged by its stamp (its clock offset from the smallest delay seen), so motion stays
    refused; a state stamped now is fresh again."""
    now = [1000.0]
    tracker = FrankaModeTracker(TOPIC, on_change=lambda: None, clock=lambda: now[0])

    def state(stamp_s: float) -> FrankaRobotState:
        msg = mode(FrankaRobotState.ROBOT_MODE_MOVE)
        msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp_s), round((stamp_s % 1) * 1e9)
        return msg

    for i in range(5):  # stamped on another clock (5,000 s ahead), taken 1-3 ms after
        now[0] = 1000.0 + 0.001 * i
        tracker.update(state(6000.0 + 0.001 * i - 0.001 - 0.0005 * (i % 3)))
    assert tracker.refusal(0.5) == ""
    now[0] = 1001.0  # silent for a second: refused
    assert "s old (limit 0.5 s)" in tracker.refusal(0.5)
    tracker.update(state(6000.005))  # published right after the last, delivered a second late
    assert "s old (limit 0.5 s)" in tracker.refusal(0.5) and "call recover" in tracker.refusal(0.5)
    tracker.update(state(6001.0 - 0.001))  # published now
    assert tracker.refusal(0.5) == ""

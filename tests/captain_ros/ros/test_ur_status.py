"""ros/ur_status.py's reasons, from the modes io_and_status_controller publishes (ur_dashboard_msgs' constants).
The DDS path: test_vendor_profiles.py::test_ur_protective_stop_ends_the_motion_as_such_and_refuses_the_next."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
from ur_dashboard_msgs.msg import RobotMode, SafetyMode

from captain_ros.ros.ur_status import ROBOT_MODES, SAFETY_MODES, refusal


def test_a_running_arm_in_normal_or_reduced_mode_with_its_program_may_move():
    assert refusal(RobotMode.RUNNING, SafetyMode.NORMAL, True) == ""
    assert refusal(RobotMode.RUNNING, SafetyMode.REDUCED, True) == ""


@pytest.mark.parametrize(
    ("robot_mode", "safety_mode", "program", "reason"),
    [
        (
            RobotMode.RUNNING,
            SafetyMode.PROTECTIVE_STOP,
            True,
            "the UR is in a protective stop (safety mode PROTECTIVE_STOP): find what it hit",
        ),
        (
            RobotMode.RUNNING,
            SafetyMode.SAFEGUARD_STOP,
            True,
            "in safety mode SAFEGUARD_STOP (safety mode SAFEGUARD_STOP): a safeguard input is open",
        ),
        (RobotMode.RUNNING, SafetyMode.FAULT, True, "safety mode FAULT): see the pendant"),
        (RobotMode.POWER_OFF, SafetyMode.NORMAL, True, "the UR's robot mode is POWER_OFF, not RUNNING"),
        (
            RobotMode.IDLE,
            SafetyMode.NORMAL,
            True,
            "robot mode is IDLE, not RUNNING: power it on and release the brakes",
        ),
        (RobotMode.RUNNING, SafetyMode.NORMAL, False, "External Control program is not running: press play"),
        (
            None,
            SafetyMode.NORMAL,
            True,
            "no robot mode, safety mode and program state from io_and_status_controller yet",
        ),
        (
            RobotMode.POWER_OFF,
            SafetyMode.ROBOT_EMERGENCY_STOP,
            False,
            "ROBOT_EMERGENCY_STOP): the pendant's emergency stop",
        ),
    ],
)
def test_every_other_state_is_named(robot_mode, safety_mode, program, reason):
    assert reason in refusal(robot_mode, safety_mode, program)


def test_the_names_are_the_messages_constants():
    assert ROBOT_MODES[RobotMode.RUNNING] == "RUNNING" and ROBOT_MODES[RobotMode.NO_CONTROLLER] == "NO_CONTROLLER"
    assert SAFETY_MODES[SafetyMode.PROTECTIVE_STOP] == "PROTECTIVE_STOP" and len(SAFETY_MODES) == 13

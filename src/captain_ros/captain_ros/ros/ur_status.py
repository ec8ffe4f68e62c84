"""A UR's robot mode, safety mode and program state, as Universal_Robots_ROS2_Driver's io_and_status_controller
publishes them (latched, on change: ur_controllers/src/gpio_controller.cpp).

The arm moves only with the robot mode RUNNING, the safety mode NORMAL or REDUCED and the External Control program
running. Anything else makes the scaled trajectory controller stand still (its speed scaling drops to 0), which a
guarded motion would otherwise read as a pause or a stall: `refusal()` names the real reason, and the backend
refuses motions with it and ends a running one with it ("the UR is in a protective stop ...").
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from std_msgs.msg import Bool
from ur_dashboard_msgs.msg import RobotMode, SafetyMode

from captain_ros.core.robot import URStatus
from captain_ros.ros.description import LATCHED  # as io_and_status_controller publishes: transient local

ROBOT_MODE_TYPE, SAFETY_MODE_TYPE = "ur_dashboard_msgs/msg/RobotMode", "ur_dashboard_msgs/msg/SafetyMode"
MOVING_SAFETY_MODES = (SafetyMode.NORMAL, SafetyMode.REDUCED)


def _names(msg_type) -> dict[int, str]:
    """A message's constants by value (rclpy keeps them as properties of the message's metaclass)."""
    return {getattr(msg_type, k): k for k, v in vars(type(msg_type)).items() if isinstance(v, property) and k.isupper()}


ROBOT_MODES, SAFETY_MODES = _names(RobotMode), _names(SafetyMode)
SAFETY_HINTS = {
    SafetyMode.PROTECTIVE_STOP: "find what it hit, then unlock the protective stop on the pendant",
    SafetyMode.SAFEGUARD_STOP: "a safeguard input is open: close it (the fence, the light curtain)",
    SafetyMode.SYSTEM_EMERGENCY_STOP: "an emergency stop is pressed: release it, then re-enable the arm",
    SafetyMode.ROBOT_EMERGENCY_STOP: "the pendant's emergency stop is pressed: release it, then re-enable the arm",
}


def refusal(robot_mode: int | None, safety_mode: int | None, program_running: bool | None) -> str:
    """Why the UR cannot move now ('' = it can), from the latest of each (None = not heard yet)."""
    if robot_mode is None or safety_mode is None or program_running is None:
        return "no robot mode, safety mode and program state from io_and_status_controller yet (is it active?)"
    if safety_mode not in MOVING_SAFETY_MODES:
        name = SAFETY_MODES.get(safety_mode, str(safety_mode))
        what = "in a protective stop" if safety_mode == SafetyMode.PROTECTIVE_STOP else f"in safety mode {name}"
        return f"the UR is {what} (safety mode {name}): {SAFETY_HINTS.get(safety_mode, 'see the pendant')}"
    if robot_mode != RobotMode.RUNNING:
        name = ROBOT_MODES.get(robot_mode, str(robot_mode))
        return f"the UR's robot mode is {name}, not RUNNING: power it on and release the brakes on the pendant"
    if not program_running:
        return "the UR's External Control program is not running: press play on the pendant (or resend_robot_program)"
    return ""


class URStatusWatch:
    """The latest robot mode, safety mode and program state of `status`'s topics (resolved by `resolve`), heard by
    `node`; `on_change` is called after each change (the backend wakes its motion loop with it)."""

    def __init__(self, node, status: URStatus, resolve: Callable[[str], str], group, on_change: Callable[[], None]):
        self._lock = threading.Lock()
        self._on_change = on_change
        self.robot_mode: int | None = None
        self.safety_mode: int | None = None
        self.program_running: bool | None = None
        for msg_type, topic, field in (
            (RobotMode, status.robot_mode_topic, "robot_mode"),
            (SafetyMode, status.safety_mode_topic, "safety_mode"),
            (Bool, status.program_running_topic, "program_running"),
        ):
            node.create_subscription(
                msg_type, resolve(topic), lambda msg, field=field: self._set(field, msg), LATCHED, callback_group=group
            )

    def _set(self, field: str, msg) -> None:
        with self._lock:
            setattr(self, field, msg.data if field == "program_running" else msg.mode)
        self._on_change()

    def heard(self) -> bool:
        """Whether each of the three has been heard."""
        with self._lock:
            return None not in (self.robot_mode, self.safety_mode, self.program_running)

    def refusal(self) -> str:
        with self._lock:
            return refusal(self.robot_mode, self.safety_mode, self.program_running)

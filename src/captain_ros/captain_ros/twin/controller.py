"""The twin's controllers, as ros2_control would run them on the real arm: one joint trajectory
follower for the 7 arm joints and one for the gripper's finger joint (half the jaw opening),
updated at every physics step. Used by twin_node and by the in-process twin backend, so both
move the arm exactly the same way."""

from __future__ import annotations

import numpy as np

from captain_ros.core.trajectory import JointTrajectory, TrajectoryFollower
from captain_ros.twin import robot
from captain_ros.twin.sim import Twin

GRIPPER_JOINTS = (robot.FINGER_JOINTS[0],)


class TwinControllers:
    def __init__(self, twin: Twin):
        lower, upper = robot.arm_limits_rad()
        finger = robot.joint_limits()[GRIPPER_JOINTS[0]]
        self.arm = TrajectoryFollower(robot.ARM_JOINTS, lower, upper, twin.arm_q())
        self.gripper = TrajectoryFollower(
            GRIPPER_JOINTS, np.array([finger.lower]), np.array([finger.upper]), np.array([twin.jaw_opening_m() / 2])
        )

    def __getitem__(self, name: str) -> TrajectoryFollower:
        return {"arm": self.arm, "gripper": self.gripper}[name]

    def jaw_trajectory(self, opening_m: float, duration_s: float) -> JointTrajectory:
        """Move the jaw to `opening_m` (clipped to the finger's range) in `duration_s`."""
        half = float(np.clip(opening_m / 2, self.gripper.lower[0], self.gripper.upper[0]))
        return JointTrajectory(GRIPPER_JOINTS, np.array([max(duration_s, 1e-3)]), np.array([[half]]), None)

    def step(self, twin: Twin, n: int = 1) -> None:
        """Advance n physics steps, updating both controllers' setpoints before each."""
        for _ in range(n):
            twin.set_arm_command(self.arm.update(twin.time_s))
            twin.set_gripper_command(2.0 * float(self.gripper.update(twin.time_s)[0]))
            twin.step()

"""moveit_py/src/moveit/moveit_core/robot_trajectory/robot_trajectory.cpp (core/robot_trajectory.pyi)."""

from __future__ import annotations

from moveit_msgs.msg import RobotTrajectory as RobotTrajectoryMsg
from trajectory_msgs.msg import JointTrajectoryPoint


class RobotTrajectory:
    def __init__(self, robot_model, waypoints=None, group: str = "") -> None:
        self._model, self._waypoints, self.joint_model_group_name = robot_model, list(waypoints or []), group

    def __len__(self) -> int:
        return len(self._waypoints)

    def __getitem__(self, idx: int):
        return self._waypoints[idx]

    def __iter__(self):
        return iter(self._waypoints)

    def get_robot_trajectory_msg(self, joint_filter: list[str] | None = None) -> RobotTrajectoryMsg:
        """The waypoints as a moveit_msgs RobotTrajectory (the fake lists the joints in reverse: a client maps
        them by name)."""
        names = list(reversed(self._model.profile.arm_joints))
        msg = RobotTrajectoryMsg()
        msg.joint_trajectory.joint_names = names
        msg.joint_trajectory.points = [
            JointTrajectoryPoint(positions=[float(w.joint_positions[j]) for j in names]) for w in self._waypoints
        ]
        return msg

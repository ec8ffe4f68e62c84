"""moveit_py/src/moveit/moveit_core/planning_interface/planning_response.cpp (core/planning_interface.pyi)."""

from __future__ import annotations

from moveit_msgs.msg import MoveItErrorCodes, RobotState


class MotionPlanResponse:
    def __init__(self, error_code: int, trajectory=None, planner_id: str = "") -> None:
        self._code, self._trajectory, self._planner_id = error_code, trajectory, planner_id

    @property
    def trajectory(self):
        return self._trajectory

    @property
    def error_code(self) -> MoveItErrorCodes:
        return MoveItErrorCodes(val=self._code)

    @property
    def planning_time(self) -> float:
        return 0.0

    @property
    def planner_id(self) -> str:
        return self._planner_id

    @property
    def start_state(self) -> RobotState:
        return RobotState()

    def __bool__(self) -> bool:
        return self._code == MoveItErrorCodes.SUCCESS

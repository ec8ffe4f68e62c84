"""moveit_py/src/moveit/moveit_core/robot_state/robot_state.cpp (core/robot_state.pyi)."""

from __future__ import annotations

import numpy as np


class RobotState:
    def __init__(self, robot_model) -> None:
        self._model = robot_model
        self._positions = dict(zip(robot_model.profile.arm_joints, robot_model.profile.home_q_rad, strict=True))
        self._dirty = False

    @property
    def robot_model(self):
        return self._model

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def joint_positions(self) -> dict[str, float]:
        return dict(self._positions)

    @joint_positions.setter
    def joint_positions(self, joint_positions: dict[str, float]) -> None:
        """setJointPositions: each named variable set (setVariablePosition throws for an unknown name)."""
        for name, value in joint_positions.items():
            if name not in self._positions:
                raise RuntimeError(f"Variable '{name}' is not known to model '{self._model.name}'")
            self._positions[name] = float(value)
        self._dirty = True

    def set_joint_group_positions(self, joint_model_group_name: str, position_values) -> None:
        group = self._model.get_joint_model_group(joint_model_group_name)
        self.joint_positions = dict(zip(group.active_joint_model_names, position_values, strict=True))

    def get_joint_group_positions(self, joint_model_group_name: str) -> np.ndarray:
        group = self._model.get_joint_model_group(joint_model_group_name)
        return np.array([self._positions[j] for j in group.active_joint_model_names])

    def update(self, force: bool = False, type: str = "all") -> None:  # moveit_py's argument names
        self._dirty = False

    def q(self) -> np.ndarray:
        """(fake) the arm's joints in the profile's order."""
        return np.array([self._positions[j] for j in self._model.profile.arm_joints])

    def __copy__(self) -> RobotState:
        out = RobotState(self._model)
        out._positions, out._dirty = dict(self._positions), self._dirty
        return out

    def __deepcopy__(self, memo) -> RobotState:
        return self.__copy__()

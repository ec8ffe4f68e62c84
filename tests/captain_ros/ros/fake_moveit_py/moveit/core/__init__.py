"""moveit.core (pybind11 module `core`, moveit_py/src/moveit/core.cpp): its submodules as attributes."""

from moveit.core import (
    collision_detection,
    planning_interface,
    planning_scene,
    robot_model,
    robot_state,
    robot_trajectory,
)

__all__ = [
    "collision_detection",
    "planning_interface",
    "planning_scene",
    "robot_model",
    "robot_state",
    "robot_trajectory",
]

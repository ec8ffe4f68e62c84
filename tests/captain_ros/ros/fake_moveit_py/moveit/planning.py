"""moveit.planning (pybind11 module `planning`, moveit_py/src/moveit/planning.cpp; moveit_py/moveit/planning.pyi):
MoveItPy (moveit_ros/moveit_cpp/moveit_cpp.cpp), PlanningComponent and PlanRequestParameters
(moveit_ros/moveit_cpp/planning_component.cpp), PlanningSceneMonitor and its lock context managers
(moveit_ros/planning_scene_monitor/planning_scene_monitor.cpp)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
from moveit_msgs.msg import CollisionObject, MoveItErrorCodes
from shape_msgs.msg import SolidPrimitive

from captain_ros.core.moveit_scene import SceneBox
from moveit import _fake
from moveit.core.planning_interface import MotionPlanResponse
from moveit.core.planning_scene import PlanningScene
from moveit.core.robot_model import RobotModel
from moveit.core.robot_trajectory import RobotTrajectory
from moveit.utils import get_launch_params_filepaths


class LockedPlanningSceneContextManagerRO:
    def __init__(self, monitor) -> None:
        self._monitor = monitor

    def __enter__(self):
        _fake.STATE.maybe_fail("read_only")
        return self._monitor._scene

    def __exit__(self, type, value, traceback) -> None:  # the binding's argument names
        return None


class LockedPlanningSceneContextManagerRW(LockedPlanningSceneContextManagerRO):
    pass


def _box(obj: CollisionObject) -> SceneBox | None:
    """A box primitive at the object's pose (yaw only: the fake's model); None for anything else."""
    if len(obj.primitives) != 1 or obj.primitives[0].type != SolidPrimitive.BOX:
        return None
    q, p = obj.pose.orientation, obj.pose.position
    yaw = float(np.arctan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z)))
    return SceneBox(obj.id, (p.x, p.y, p.z), tuple(float(v) for v in obj.primitives[0].dimensions), yaw)


class PlanningSceneMonitor:
    def __init__(self, robot_model) -> None:
        self._scene = PlanningScene(robot_model)

    @property
    def name(self) -> str:
        return "planning_scene_monitor"

    def read_only(self) -> LockedPlanningSceneContextManagerRO:
        return LockedPlanningSceneContextManagerRO(self)

    def read_write(self) -> LockedPlanningSceneContextManagerRW:
        return LockedPlanningSceneContextManagerRW(self)

    def process_collision_object(self, collision_object_msg: CollisionObject, color_msg=None) -> bool:
        """PlanningScene::processCollisionObjectMsg: ADD/APPEND (a box, in the fake) replaces an object of the same
        id, REMOVE of an object not there is False."""
        _fake.STATE.maybe_fail("process_collision_object")
        obj, world = collision_object_msg, _fake.STATE.world
        if obj.operation == CollisionObject.REMOVE:
            return world.pop(obj.id, None) is not None
        if obj.operation in (CollisionObject.ADD, CollisionObject.APPEND):
            box = _box(obj)
            if box is None or not obj.header.frame_id:
                return False
            world[obj.id] = box
            return True
        return False


class PlanRequestParameters:
    def __init__(self, moveit_cpp, ns, /) -> None:
        """params.load(node, ns): the node's parameters under `ns`, these defaults without them."""
        self.planner_id = ""
        self.planning_pipeline = ""
        self.planning_attempts = 1
        self.planning_time = 1.0
        self.max_velocity_scaling_factor = 1.0
        self.max_acceleration_scaling_factor = 1.0
        self.ns = ns  # (fake) kept for the tests


class PlanningComponent:
    def __init__(self, joint_model_group_name: str, moveit_py_instance) -> None:
        if not moveit_py_instance.get_robot_model().has_joint_model_group(joint_model_group_name):
            raise RuntimeError(f"No JointModelGroup named '{joint_model_group_name}'")
        self._group, self._moveit = joint_model_group_name, moveit_py_instance
        self._start = None
        self._goal: list | None = None

    @property
    def planning_group_name(self) -> str:
        return self._group

    def set_start_state(self, configuration_name: str | None = None, robot_state=None) -> bool:
        if configuration_name is not None and robot_state is not None:
            raise ValueError("Cannot specify both configuration name and robot state")
        if configuration_name is None and robot_state is None:
            raise ValueError("Must specify at least one argument")
        if robot_state is None:
            return False  # the fake knows no named configurations
        self._start = copy.copy(robot_state)
        return True

    def set_goal_state(
        self,
        configuration_name: str | None = None,
        robot_state=None,
        pose_stamped_msg=None,
        pose_link: str | None = None,
        motion_plan_constraints: list | None = None,
    ) -> bool:
        given = [a is not None for a in (configuration_name, robot_state, pose_stamped_msg, motion_plan_constraints)]
        if sum(given) > 1:
            raise ValueError("Cannot specify more than one goal")
        if not any(given) and pose_link is None:
            raise ValueError("Must specify at least one argument")
        if motion_plan_constraints is None:
            return False  # the fake plans to joint constraints only
        self._goal = list(motion_plan_constraints)
        return True

    def plan(
        self,
        single_plan_parameters=None,
        multi_plan_parameters=None,
        planning_scene=None,
        solution_selection_function=None,
        stopping_criterion_callback=None,
    ) -> MotionPlanResponse:
        """The straight line in joint space from the start to the joint goal (fake_move_group's plan);
        PLANNING_FAILED when a point of it collides."""
        _fake.STATE.maybe_fail("plan")
        if single_plan_parameters is not None and multi_plan_parameters is not None:
            raise ValueError("Cannot specify both single and multi plan parameters")
        p = single_plan_parameters
        _fake.STATE.plans.append(
            {
                "group": self._group,
                "pipeline": None if p is None else p.planning_pipeline,
                "planner_id": None if p is None else p.planner_id,
                "planning_time": None if p is None else p.planning_time,
                "ns": None if p is None else p.ns,
                "goal": self._goal,
            }
        )
        model = self._moveit.get_robot_model()
        if self._start is None or not self._goal:
            return MotionPlanResponse(MoveItErrorCodes.INVALID_GOAL_CONSTRAINTS)
        goal = {c.joint_name: c.position for c in self._goal[0].joint_constraints}
        start = self._start.q()
        end = np.array([goal[j] for j in model.profile.arm_joints])
        scene = self._moveit._psm._scene
        waypoints = []
        for q in np.linspace(start, end, _fake.PLAN_POINTS):
            state = copy.copy(self._start)
            state.joint_positions = dict(zip(model.profile.arm_joints, q, strict=True))
            if scene.hits(state, scene.allowed_collision_matrix):
                return MotionPlanResponse(MoveItErrorCodes.PLANNING_FAILED)
            waypoints.append(state)
        return MotionPlanResponse(
            MoveItErrorCodes.SUCCESS, RobotTrajectory(model, waypoints, self._group), "" if p is None else p.planner_id
        )


class MoveItPy:
    def __init__(  # noqa: PLR0917
        self,
        node_name: str = "moveit_py",
        name_space: str = "",
        launch_params_filepaths: list[str] | None = None,
        config_dict: dict | None = None,
        provide_planning_service: bool = True,
        remappings: dict | None = None,
    ) -> None:
        """Loads the MoveIt configuration from the params files (rclcpp fails on one that is not there)."""
        files = get_launch_params_filepaths() if launch_params_filepaths is None else list(launch_params_filepaths)
        _fake.STATE.started.append({"node_name": node_name, "launch_params_filepaths": files})
        _fake.STATE.maybe_fail("MoveItPy")
        for f in files:
            if not Path(f).is_file():
                raise RuntimeError(f"failed to parse params file '{f}': no such file")
        self._model = RobotModel()
        self._psm = PlanningSceneMonitor(self._model)

    def get_planning_component(self, planning_component_name: str) -> PlanningComponent:
        return PlanningComponent(planning_component_name, self)

    def get_planning_scene_monitor(self) -> PlanningSceneMonitor:
        return self._psm

    def get_robot_model(self) -> RobotModel:
        return self._model

    def shutdown(self) -> None:
        _fake.STATE.shutdown += 1

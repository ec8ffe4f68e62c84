"""MoveIt 2's planning scene through move_group's standard services (moveit_msgs): the motion node's `use_moveit`.

`MoveItScene.check(q_waypoints)` asks `/check_state_validity` (GetStateValidity) about each sampled configuration of
a sweep, 8 requests in flight at a time (IN_FLIGHT), and returns the answers, which the harness judges
(core/moveit_scene.judge: a refusal naming what collides where). `apply(add, remove)` puts measured objects into
the scene as collision boxes and takes stale ones out, as one diff through `/apply_planning_scene`
(ApplyPlanningScene). No answer within the profile's `interfaces.moveit.timeout_s`, or a refused update, raises
SceneCheckError: the harness then refuses the sweep.

This is the profile's `interfaces.moveit.api` "services" (and "auto" where moveit-py does not import): these services
reach the move_group an integrator already runs with the vendor's MoveIt configuration (franka_fr3_moveit_config,
ur_moveit_config). moveit-py (`moveit.planning.MoveItPy`, embedding its own planning scene monitor in this process) is
ros/moveit_py_scene.py; `open_scene` picks one (core/moveit_scene.choose_api). The clients live on a side node spun by
a thread of its own, so a harness call waiting on them never blocks their replies.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from geometry_msgs.msg import Pose
from moveit_msgs.msg import CollisionObject, Constraints, JointConstraint, MoveItErrorCodes, PlanningScene, RobotState
from moveit_msgs.srv import ApplyPlanningScene, GetMotionPlan, GetStateValidity
from shape_msgs.msg import SolidPrimitive

from captain_ros.core.moveit_scene import (
    SceneBox,
    SceneCheckError,
    StateVerdict,
    TouchRule,
    choose_api,
    joint_path,
    sample_indices,
)
from captain_ros.core.robot import MoveItInterface
from captain_ros.ros.spin import SideNode

GOAL_TOL_RAD = 1e-3  # a free-space plan's joint goal tolerance
IN_FLIGHT = 8  # requests sent before waiting for their replies: under a service's default queue depth of 10


def collision_box(box: SceneBox, frame_id: str) -> CollisionObject:
    obj = CollisionObject(id=box.id, operation=CollisionObject.ADD)
    obj.header.frame_id = frame_id
    obj.pose.position.x, obj.pose.position.y, obj.pose.position.z = box.center_m
    q = box.quaternion_xyzw()
    obj.pose.orientation.x, obj.pose.orientation.y, obj.pose.orientation.z, obj.pose.orientation.w = q
    obj.primitives = [SolidPrimitive(type=SolidPrimitive.BOX, dimensions=list(box.extents_m))]
    obj.primitive_poses = [Pose()]  # the box centred on the object's pose
    return obj


def scene_diff(add: list[SceneBox], remove: list[str], frame_id: str) -> PlanningScene:
    scene = PlanningScene(is_diff=True)
    scene.robot_state.is_diff = True
    scene.world.collision_objects = [CollisionObject(id=oid, operation=CollisionObject.REMOVE) for oid in remove] + [
        collision_box(box, frame_id) for box in add
    ]
    return scene


def joint_goal(joint_names: tuple[str, ...], q_goal: np.ndarray) -> Constraints:
    """A free-space plan's goal: each arm joint at `q_goal` within GOAL_TOL_RAD (both APIs send this)."""
    return Constraints(
        joint_constraints=[
            JointConstraint(
                joint_name=j, position=float(v), tolerance_above=GOAL_TOL_RAD, tolerance_below=GOAL_TOL_RAD, weight=1.0
            )
            for j, v in zip(joint_names, q_goal, strict=True)
        ]
    )


def error_code_name(code: int) -> str:
    """MoveItErrorCodes' name for `code` ('' when it has none)."""
    return next((k for k in dir(MoveItErrorCodes) if k.isupper() and getattr(MoveItErrorCodes, k) == code), "")


def open_scene(host, settings: MoveItInterface, joint_names: tuple[str, ...], frame_id: str):
    """The planning scene `settings.api` asks for (core/moveit_scene.choose_api): MoveItPyScene (moveit-py in this
    process) or MoveItScene (move_group's services). SceneCheckError when moveit_py is asked for and does not import,
    or does not start."""
    from captain_ros.ros import moveit_py_scene

    if choose_api(settings.api, moveit_py_scene.importable()) == "moveit_py":
        return moveit_py_scene.MoveItPyScene(settings, joint_names, frame_id)
    return MoveItScene(host, settings, joint_names, frame_id)


class MoveItScene:
    """move_group's planning scene for the harness (harness.PlanningScene)."""

    api = "services"

    def __init__(self, host, settings: MoveItInterface, joint_names: tuple[str, ...], frame_id: str) -> None:
        self.settings, self.joint_names, self.frame_id = settings, tuple(joint_names), frame_id
        self.node = SideNode(host, "moveit")
        self.validity_name = host.resolve_service_name(settings.check_state_validity_service)
        self.apply_name = host.resolve_service_name(settings.apply_planning_scene_service)
        self._validity = self.node.create_client(GetStateValidity, self.validity_name)
        self._apply = self.node.create_client(ApplyPlanningScene, self.apply_name)
        self.free_space_min_m = settings.free_space_min_m
        self.plan_name = host.resolve_service_name(settings.plan_service)
        self._plan = self.node.create_client(GetMotionPlan, self.plan_name) if settings.free_space_min_m > 0 else None
        self.node.start()

    def missing(self, timeout_s: float) -> list[str]:
        """The move_group services not there within `timeout_s` (configure names them)."""
        return [
            f"{name} ({kind})"
            for client, name, kind in (
                (self._validity, self.validity_name, "moveit_msgs/srv/GetStateValidity"),
                (self._apply, self.apply_name, "moveit_msgs/srv/ApplyPlanningScene"),
                (self._plan, self.plan_name, "moveit_msgs/srv/GetMotionPlan"),
            )
            if client is not None and not client.wait_for_service(timeout_sec=timeout_s)
        ]

    def _request(self, q: np.ndarray) -> GetStateValidity.Request:
        request = GetStateValidity.Request(group_name=self.settings.planning_group)
        request.robot_state = RobotState(is_diff=True)  # joints not named keep move_group's current values
        request.robot_state.joint_state.name = list(self.joint_names)
        request.robot_state.joint_state.position = [float(v) for v in q]
        return request

    def plan(self, q_start: np.ndarray, q_goal: np.ndarray) -> tuple[np.ndarray | None, str]:
        """A free-space joint path from `q_start` to `q_goal` planned by move_group (GetMotionPlan: the profile's
        pipeline and planner, a joint goal within 1 mrad): (path, '') or (None, why not, naming MoveIt's error code).
        SceneCheckError when move_group does not answer within planning_time_s + timeout_s."""
        if self._plan is None:
            raise SceneCheckError("free-space planning is off (interfaces.moveit.free_space_min_m is 0)")
        s = self.settings
        request = GetMotionPlan.Request()
        mpr = request.motion_plan_request
        mpr.group_name, mpr.pipeline_id, mpr.planner_id = s.planning_group, s.pipeline_id, s.planner_id
        mpr.num_planning_attempts, mpr.allowed_planning_time = 1, s.planning_time_s
        mpr.max_velocity_scaling_factor = mpr.max_acceleration_scaling_factor = 1.0  # timed again here
        mpr.start_state = RobotState(is_diff=True)
        mpr.start_state.joint_state.name = list(self.joint_names)
        mpr.start_state.joint_state.position = [float(v) for v in q_start]
        mpr.goal_constraints = [joint_goal(self.joint_names, q_goal)]
        limit = s.planning_time_s + s.timeout_s
        (reply,) = self._wait_all(self._plan, [request], self.plan_name, limit)
        response = reply.motion_plan_response
        code = response.error_code.val
        if code != MoveItErrorCodes.SUCCESS:
            name = error_code_name(code)
            return None, f"move_group found no free-space path ({name or 'error'} {code}, {s.pipeline_id})"
        traj = response.trajectory.joint_trajectory
        try:
            path = joint_path(list(traj.joint_names), [list(p.positions) for p in traj.points], self.joint_names)
        except ValueError as exc:
            return None, f"move_group's free-space path is unusable: {exc}"
        return path, ""

    def _wait_all(self, client, requests: list, what: str, limit_s: float | None = None) -> list:
        """Send the requests IN_FLIGHT at a time and wait for every reply, all within the timeout; SceneCheckError
        if not. (A service's request queue keeps the 10 newest by default, rclcpp's and rclpy's alike: a burst of
        more loses the oldest, which then never get an answer.)"""
        limit_s = self.settings.timeout_s if limit_s is None else limit_s
        deadline = time.monotonic() + limit_s
        replies: list = []
        for first in range(0, len(requests), IN_FLIGHT):
            batch = requests[first : first + IN_FLIGHT]
            pending, lock, done = [len(batch)], threading.Lock(), threading.Event()

            def one_done(_future, pending=pending, lock=lock, done=done) -> None:
                with lock:
                    pending[0] -= 1
                    if pending[0] == 0:
                        done.set()

            futures = []
            for request in batch:
                future = client.call_async(request)
                future.add_done_callback(one_done)
                futures.append(future)
            if not done.wait(max(deadline - time.monotonic(), 0.0)):
                answered = len(replies) + sum(f.done() for f in futures)
                for future in futures:
                    if not future.done():
                        client.remove_pending_request(future)
                        future.cancel()
                raise SceneCheckError(
                    f"{what} did not answer within {limit_s:g} s ({answered} of {len(requests)} "
                    "replies; is move_group running with this robot's MoveIt configuration?)"
                )
            replies += [f.result() for f in futures]
        return replies

    def check(self, q_waypoints: np.ndarray, may_touch: TouchRule | None = None) -> list[StateVerdict]:
        """move_group's verdict on the sampled configurations (judged by core/moveit_scene.judge). `may_touch` is
        left to judge: GetStateValidity names each contact pair, and judge drops those the rule allows."""
        indices = sample_indices(len(q_waypoints), self.settings.max_states)
        replies = self._wait_all(self._validity, [self._request(q_waypoints[i]) for i in indices], self.validity_name)
        return [
            StateVerdict(i, bool(r.valid), tuple((c.contact_body_1, c.contact_body_2) for c in r.contacts))
            for i, r in zip(indices, replies, strict=True)
        ]

    def apply(self, add: list[SceneBox], remove: list[str]) -> None:
        request = ApplyPlanningScene.Request(scene=scene_diff(add, remove, self.frame_id))
        (reply,) = self._wait_all(self._apply, [request], self.apply_name)
        if not reply.success:
            raise SceneCheckError(
                f"{self.apply_name} did not apply the scene update ({len(add)} add, {len(remove)} remove)"
            )

    def close(self) -> None:
        self.node.close()

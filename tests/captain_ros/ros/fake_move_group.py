"""A fake MoveIt 2 move_group: the planning-scene services the motion node's use_moveit check calls, over DDS.

  /check_state_validity  moveit_msgs/srv/GetStateValidity    valid unless the TCP, a sphere of `tcp_radius_m`
                                                              around it (the profile's forward kinematics), touches
                                                              a collision box of the world: then invalid, with a
                                                              ContactInformation naming the TCP link and the box
  /apply_planning_scene  moveit_msgs/srv/ApplyPlanningScene  world collision objects: ADD (a box primitive)
                                                              replaces one of the same id, REMOVE takes it out
  /get_planning_scene    moveit_msgs/srv/GetPlanningScene    the world's collision objects as kept
  /plan_kinematic_path   moveit_msgs/srv/GetMotionPlan       a free-space "plan": the straight line in joint space
                                                              from the start to the joint goal (PLAN_POINTS points),
                                                              PLANNING_FAILED when a point of it is invalid

Its collision model is small on purpose (the TCP against boxes; no robot links, no self-collision, no octomap):
enough to see a sweep refused by an obstacle and objects come and go. The real move_group checks every link's
geometry. Used in-process by tests/captain_ros/ros/test_move_group_scene.py and as a process by bench/real_arm.py:

    python tests/captain_ros/ros/fake_move_group.py [--profile panda_twin] [--obstacle x,y,z,sx,sy,sz]   (prints READY)
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np
import rclpy
from moveit_msgs.msg import CollisionObject, ContactInformation, MoveItErrorCodes
from moveit_msgs.srv import ApplyPlanningScene, GetMotionPlan, GetPlanningScene, GetStateValidity
from rclpy.executors import SingleThreadedExecutor
from shape_msgs.msg import SolidPrimitive
from trajectory_msgs.msg import JointTrajectoryPoint

from captain_ros.core.kinematics import Kinematics
from captain_ros.core.moveit_scene import SceneBox
from captain_ros.core.robot import RobotProfile, load_profile

try:
    from .helpers import spin_in_background, stop_spinning
except ImportError:  # run as a script (bench/real_arm.py): this folder is sys.path[0]
    from helpers import spin_in_background, stop_spinning

PLAN_POINTS = 25


def _box(obj: CollisionObject) -> SceneBox:
    """A box primitive at the object's pose (yaw only: the fake's model)."""
    (prim,) = obj.primitives
    if prim.type != SolidPrimitive.BOX:
        raise ValueError(f"{obj.id}: the fake move_group models boxes only, got primitive type {prim.type}")
    q = obj.pose.orientation
    yaw = float(np.arctan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z)))
    p = obj.pose.position
    return SceneBox(obj.id, (p.x, p.y, p.z), tuple(float(v) for v in prim.dimensions), yaw)


class FakeMoveGroup:
    def __init__(self, context, profile: str | RobotProfile = "panda_twin", tcp_radius_m: float = 0.03) -> None:
        """`profile`: a name, or a RobotProfile (one whose URDF comes from /robot_description: with_urdf_text)."""
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.kin = Kinematics(profile=self.profile)
        self.tcp_radius_m = tcp_radius_m
        self.world: dict[str, SceneBox] = {}
        self.checked = 0  # GetStateValidity requests answered
        self.groups: set[str] = set()  # planning groups asked about
        self.applied = 0
        self.plans: list[GetMotionPlan.Request] = []  # GetMotionPlan requests answered
        self._lock = threading.Lock()
        self.node = rclpy.create_node("move_group", context=context)
        self.node.create_service(GetStateValidity, "/check_state_validity", self._validity)
        self.node.create_service(ApplyPlanningScene, "/apply_planning_scene", self._apply)
        self.node.create_service(GetPlanningScene, "/get_planning_scene", self._get)
        self.node.create_service(GetMotionPlan, "/plan_kinematic_path", self._plan)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)

    def start(self) -> FakeMoveGroup:
        self.thread = spin_in_background(self.executor)
        return self

    def close(self) -> None:
        stop_spinning(self.executor, self.thread)  # no service callback runs any more: the node may go
        self.node.destroy_node()

    def add(self, box: SceneBox) -> None:
        with self._lock:
            self.world[box.id] = box

    def _hits(self, q: np.ndarray) -> list[SceneBox]:
        tcp = self.kin.forward(q)[0]
        with self._lock:
            return [box for box in self.world.values() if box.contains(tcp, margin_m=self.tcp_radius_m)]

    def _plan(self, request, response):
        mpr = request.motion_plan_request
        names = list(mpr.start_state.joint_state.name)
        start = np.array([mpr.start_state.joint_state.position[names.index(j)] for j in self.profile.arm_joints])
        goal_by_name = {c.joint_name: c.position for c in mpr.goal_constraints[0].joint_constraints}
        goal = np.array([goal_by_name[j] for j in self.profile.arm_joints])
        path = np.linspace(start, goal, PLAN_POINTS)
        with self._lock:
            self.plans.append(request)
            self.groups.add(mpr.group_name)
        out = response.motion_plan_response
        out.group_name = mpr.group_name
        if any(self._hits(q) for q in path):
            out.error_code.val = MoveItErrorCodes.PLANNING_FAILED
            return response
        out.error_code.val = MoveItErrorCodes.SUCCESS
        traj = out.trajectory.joint_trajectory
        traj.joint_names = list(reversed(self.profile.arm_joints))  # any order: the client maps names
        traj.points = [JointTrajectoryPoint(positions=[float(v) for v in reversed(q)]) for q in path]
        return response

    def _validity(self, request, response):
        names = list(request.robot_state.joint_state.name)
        q = np.array([request.robot_state.joint_state.position[names.index(j)] for j in self.profile.arm_joints])
        hits = self._hits(q)
        with self._lock:
            self.checked += 1
            self.groups.add(request.group_name)
        response.valid = not hits
        response.contacts = [
            ContactInformation(
                contact_body_1=self.profile.tcp_frame,
                body_type_1=ContactInformation.ROBOT_LINK,
                contact_body_2=box.id,
                body_type_2=ContactInformation.WORLD_OBJECT,
            )
            for box in hits
        ]
        return response

    def _apply(self, request, response):
        try:
            with self._lock:
                for obj in request.scene.world.collision_objects:
                    if obj.operation == CollisionObject.REMOVE:
                        self.world.pop(obj.id, None)
                    elif obj.operation in (CollisionObject.ADD, CollisionObject.APPEND):
                        self.world[obj.id] = _box(obj)
                self.applied += 1
            response.success = True
        except ValueError as exc:
            self.node.get_logger().error(str(exc))
            response.success = False
        return response

    def _get(self, request, response):
        with self._lock:
            boxes = list(self.world.values())
        response.scene.world.collision_objects = [CollisionObject(id=b.id) for b in boxes]
        return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="panda_twin")
    parser.add_argument("--obstacle", action="append", default=[], help="x,y,z,sx,sy,sz: a box in the base frame")
    args = parser.parse_args()
    rclpy.init()
    fake = FakeMoveGroup(rclpy.get_default_context(), args.profile)
    for k, spec in enumerate(args.obstacle):
        v = [float(x) for x in spec.split(",")]
        fake.add(SceneBox(f"obstacle_{k}", tuple(v[:3]), tuple(v[3:6]), 0.0))
    fake.start()
    print("READY", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        fake.close()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src" / "captain_ros"))
    main()

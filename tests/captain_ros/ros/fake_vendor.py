"""Fake vendor bring-ups for DDS tests: what franka_bringup, ur_robot_driver or a ros2_control demo serve, under the
vendor's own names, with just enough behaviour behind them for the motion node to configure and move.

A `VendorGraph` runs in its own rclpy context (its own DDS participant) in the test process, like the fake grippers
of test_grippers.py (whose `FakeGripper` it reuses for the gripper, in a context of its own):

  robot_state_publisher   /robot_description (latched) and, on request, /tf and /tf_static of every URDF joint
  joint_state_broadcaster the arm's joints (and, where the vendor reports the gripper there, its joint) at the
                          control rate, hardware-stamped (the node's clock)
  arm controller          a joint_trajectory_controller: FollowJointTrajectory action and JointTrajectory topic,
                          integrated with captain_ros.core.trajectory.TrajectoryFollower (the controller modelled;
                          the arm tracks it exactly), so motions complete; UR's scaled controller advances its
                          trajectory time at the speed-scaling factor
  wrench broadcaster      geometry_msgs/WrenchStamped in the vendor's frame, stamped as the joint states, with the
                          vendor's QoS (franka_ros2 >= v3.4.0: best effort, depth 1)
  speed scaling           std_msgs/Float64 in percent (UR's speed_scaling_state_broadcaster: factor * 100)
  tcp pose broadcaster    UR: the wrench frame tool0_controller on /tf, child of `base`
  Franka's state          franka_robot_state_broadcaster's robot state (FrankaRobotState: its robot mode, MOVE while
                          the trajectory controller is active, IDLE otherwise; a test may set another), and what a
                          reflex does in franka_ros2 v3.4.0 (`reflex()`): franka_hardware's read fails, so the
                          controller_manager leaves its component unconfigured and deactivates every controller on it:
                          the trajectory controller aborts its goal and ignores its topic, both broadcasters fall
                          silent (joint states, wrench, robot state), the arm stands where it stopped
  Franka's recovery       franka_hardware's error_recovery action (it may abort: `recovery_aborts`) and the
                          controller_manager's set_hardware_component_state, switch_controller (STRICT: one unknown,
                          already active or refusing controller fails it all; `refuse_activation`) and
                          list_controllers, over the component's and controllers' states; `recovery_calls` lists what
                          they were asked, in order

The vendor facts (`VENDORS`) are written here from docs/vendor_interfaces.md, not read from the robot profiles, so a
test compares a profile with the vendor. Any interface can be left out (`omit`), to check that the motion node's
configure names exactly what is missing. Descriptions: tests/captain_ros/ros/urdf/ holds stand-ins with the vendors'
link and joint names (each file says where its names come from), used as they are: no camera links (cameras come from
/tf) and, as in the Hand-E's xacro, its finger links without inertials.

Other tests could use these fakes: test_grippers.py's FakeGripper would move here (VendorGraph already builds on it),
and test_motion_lifecycle.py's configure failures (`_bad_profile`) could use `VendorGraph(omit=...)` instead of a
profile that points at names nobody serves.
"""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import rclpy
from control_msgs.action import FollowJointTrajectory, ParallelGripperCommand
from controller_manager_msgs.msg import ControllerState
from controller_manager_msgs.srv import ListControllers, SetHardwareComponentState, SwitchController
from franka_msgs.action import ErrorRecovery
from franka_msgs.msg import FrankaRobotState
from franka_msgs.srv import SetForceTorqueCollisionBehavior, SetLoad
from geometry_msgs.msg import TransformStamped, WrenchStamped
from lifecycle_msgs.msg import State
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64, String
from tf2_msgs.msg import TFMessage
from trajectory_msgs.msg import JointTrajectory as JointTrajectoryMsg
from ur_dashboard_msgs.msg import RobotMode, SafetyMode

from captain_ros.core.trajectory import JointTrajectory, TrajectoryError, TrajectoryFollower, duration_to_s

from .helpers import spin_in_background, stop_spinning
from .test_grippers import FakeGripper

URDF_DIR = Path(__file__).with_name("urdf")
LATCHED = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)
BEST_EFFORT = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)  # franka_ros2 v3.4.0's rclcpp::QoS(1)
REMOVED = "/removed_by_test"  # an omitted gripper interface is served under this prefix: absent at the vendor's name
GRIPPER_PARTS = {
    "gripper_action": "action",
    "grasp_action": "grasp_action",
    "gripper_joint_states": "joint_states_topic",
}
MONITOR_PERIOD_S = 0.05  # joint_trajectory_controller's action_monitor_rate 20 Hz
HANDE_STROKE_M = 0.05  # Robotiq Hand-E: hande_finger_distance 0..0.05 m, 0 = open (robotiq_hand_e_macro.urdf.xacro)


# ---------------------------------------------------------------------------------------------- descriptions
def read_urdf(name: str) -> str:
    return (URDF_DIR / name).read_text()


@dataclass(frozen=True)
class _Joint:
    name: str
    kind: str
    parent: str
    child: str
    origin: np.ndarray  # 4x4
    axis: np.ndarray
    lower: float
    upper: float
    mimic: tuple[str, float, float] | None  # (joint, multiplier, offset)


class UrdfTree:
    """The joints of a URDF and the link poses they give, as robot_state_publisher computes them."""

    def __init__(self, urdf_text: str):
        self.joints: list[_Joint] = []
        for j in ET.fromstring(urdf_text).iter("joint"):
            origin = j.find("origin")
            xyz = [float(v) for v in (origin.get("xyz", "0 0 0") if origin is not None else "0 0 0").split()]
            rpy = [float(v) for v in (origin.get("rpy", "0 0 0") if origin is not None else "0 0 0").split()]
            axis = j.find("axis")
            limit = j.find("limit")
            mimic = j.find("mimic")
            self.joints.append(
                _Joint(
                    j.get("name"),
                    j.get("type"),
                    j.find("parent").get("link"),
                    j.find("child").get("link"),
                    _matrix(Rotation.from_euler("xyz", rpy).as_matrix(), np.array(xyz)),
                    np.array([float(v) for v in (axis.get("xyz") if axis is not None else "1 0 0").split()]),
                    float(limit.get("lower", 0.0)) if limit is not None else 0.0,
                    float(limit.get("upper", 0.0)) if limit is not None else 0.0,
                    None
                    if mimic is None
                    else (mimic.get("joint"), float(mimic.get("multiplier", 1.0)), float(mimic.get("offset", 0.0))),
                )
            )
        self.by_name = {j.name: j for j in self.joints}
        children = {j.child for j in self.joints}
        self.root = next(j.parent for j in self.joints if j.parent not in children)

    def limits(self, joints: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        return np.array([self.by_name[j].lower for j in joints]), np.array([self.by_name[j].upper for j in joints])

    def joint_transform(self, joint: _Joint, positions: dict[str, float]) -> np.ndarray:
        """Parent-to-child transform of `joint` at `positions` (mimic joints follow their leader)."""
        if joint.kind == "fixed":
            return joint.origin
        q = positions.get(joint.name, 0.0)
        if joint.mimic is not None:
            leader, multiplier, offset = joint.mimic
            q = multiplier * positions.get(leader, 0.0) + offset
        if joint.kind == "prismatic":
            return joint.origin @ _matrix(np.eye(3), joint.axis * q)
        return joint.origin @ _matrix(Rotation.from_rotvec(joint.axis * q).as_matrix(), np.zeros(3))

    def poses(self, positions: dict[str, float]) -> dict[str, np.ndarray]:
        """Every link's pose in the root link's frame."""
        poses = {self.root: np.eye(4)}
        pending = list(self.joints)
        while pending:
            ready = [j for j in pending if j.parent in poses]
            for j in ready:
                poses[j.child] = poses[j.parent] @ self.joint_transform(j, positions)
            done = {j.name for j in ready}
            pending = [j for j in pending if j.name not in done]
            if not ready:
                break  # links not connected to the root
        return poses


def _matrix(rotation: np.ndarray, translation: np.ndarray) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3], m[:3, 3] = rotation, translation
    return m


def _transform_msg(parent: str, child: str, m: np.ndarray, stamp) -> TransformStamped:
    t = TransformStamped()
    t.header.stamp, t.header.frame_id, t.child_frame_id = stamp, parent, child
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = map(float, m[:3, 3])
    x, y, z, w = Rotation.from_matrix(m[:3, :3]).as_quat()
    t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w = x, y, z, w
    return t


# ---------------------------------------------------------------------------------------------- vendor facts
@dataclass(frozen=True)
class FrankaRecoveryNames:
    """franka_ros2 v3.4.0's robot state and what recovering from a reflex calls (docs/vendor_interfaces.md)."""

    robot_state_topic: str  # franka_robot_state_broadcaster's ~/robot_state
    error_recovery_action: str  # franka_hardware's action_server node: ~/error_recovery
    controller_manager: str
    hardware_component: str  # franka_description's <ros2_control name>
    trajectory_controller: str
    joint_state_broadcaster: str  # publishes the joint states
    robot_state_broadcaster: str  # publishes the robot state and the wrench

    def services(self) -> dict[str, str]:
        return {key: f"{self.controller_manager}/{key}" for key in CONTROLLER_MANAGER_SERVICES}


CONTROLLER_MANAGER_SERVICES = ("set_hardware_component_state", "switch_controller", "list_controllers")
REFLEX_ABORT = "Current goal cancelled during deactivate transition."  # joint_trajectory_controller, on_deactivate


@dataclass(frozen=True)
class VendorSpec:
    """One vendor bring-up's names (docs/vendor_interfaces.md) and the stand-in description it publishes."""

    profile: str  # the shipped robot profile written for this bring-up
    urdf: str  # stand-in description under tests/captain_ros/ros/urdf/
    arm_joints: tuple[str, ...]
    joint_states_topic: str
    trajectory_action: str
    trajectory_topic: str
    wrench_topic: str
    wrench_frame: str
    start_q: tuple[float, ...]  # where the arm stands when the bring-up starts (TCP inside safety.yaml's box)
    wrench_best_effort: bool = False
    speed_scaling_topic: str = ""  # UR: percent
    wrench_tf_parent: str = ""  # UR's tcp_pose_broadcaster: the wrench frame on /tf, child of this URDF frame
    gripper: FakeGripper | None = None  # the gripper's bring-up (a template: copied on every start)
    arm_state_gripper_joints: Callable[[float], dict[str, float]] | None = None  # the gripper in the arm's states
    # the stand-in's collision meshes are the vendor's package:// URIs, whose packages do not install here: the
    # motion node refuses such a description unless allow_unchecked_self_collision waives the check
    meshes_elsewhere: bool = False
    # franka_hardware's param services (collision behaviour, load), each answering as FakeFrankaSettings does
    franka_services: tuple[str, str] | None = None
    # io_and_status_controller's latched robot mode, safety mode and program state (UR), published on change
    ur_status_topics: tuple[str, str, str] | None = None
    # Franka's robot state, error recovery and the controller_manager services the recovery calls
    franka_recovery: FrankaRecoveryNames | None = None

    def interfaces(self) -> dict[str, str]:
        """Every interface this bring-up serves that a motion node must find: key (for `omit`) -> name."""
        names = {
            "robot_description": "/robot_description",
            "joint_states": self.joint_states_topic,
            "trajectory_action": self.trajectory_action,
            "trajectory_topic": self.trajectory_topic,
            "wrench": self.wrench_topic,
        }
        if self.speed_scaling_topic:
            names["speed_scaling"] = self.speed_scaling_topic
        if self.gripper is not None:
            names["gripper_action"] = self.gripper.action
            if self.gripper.grasp_action:
                names["grasp_action"] = self.gripper.grasp_action
            if self.arm_state_gripper_joints is None:
                names["gripper_joint_states"] = self.gripper.joint_states_topic
        if self.franka_services is not None:
            names["collision_behavior"], names["set_load"] = self.franka_services
        if self.ur_status_topics is not None:
            names["robot_mode"], names["safety_mode"], names["program_running"] = self.ur_status_topics
        if self.franka_recovery is not None:
            names["robot_state"] = self.franka_recovery.robot_state_topic
            names["error_recovery"] = self.franka_recovery.error_recovery_action
            names |= self.franka_recovery.services()
        return names


@dataclass
class HandEGripper(FakeGripper):
    """PickNik's Hand-E bring-up: parallel_gripper_action_controller on `hande_finger_distance`, the one joint the
    driver commands and reports: 0 = open, 0.05 m = shut (the fingers are mimics: each 0.025 - distance / 2), so
    distance = 0.05 m - opening. The controller takes command.position[0] as that joint's target and ignores the
    joint name."""

    def _execute_parallel(self, goal_handle):
        result = ParallelGripperCommand.Result()
        if self.mode == "abort":
            goal_handle.abort()
            return result
        self._command(HANDE_STROKE_M - goal_handle.request.command.position[0])
        how, opening = self._settle(goal_handle)
        result.state.name, result.state.position = ["hande_finger_distance"], [HANDE_STROKE_M - opening]
        result.reached_goal, result.stalled = how == "reached", how == "stalled"
        {"reached": goal_handle.succeed, "stalled": goal_handle.succeed, "canceled": goal_handle.canceled}[how]()
        return result  # allow_stalling: true (robotiq_hand_e_controllers.yaml): a stall succeeds


FR3_ARM = tuple(f"fr3_joint{i}" for i in range(1, 8))
UR_ARM = ("shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint", "wrist_3_joint")

VENDORS: dict[str, VendorSpec] = {
    # franka_ros2 v3.4.0: franka.launch.py robot_type:=fr3 load_gripper:=true with fr3_ros_controllers.yaml
    "franka_fr3": VendorSpec(
        profile="franka_fr3",
        urdf="fr3_vendor.urdf",
        arm_joints=FR3_ARM,
        joint_states_topic="/franka/joint_states",
        trajectory_action="/fr3_arm_controller/follow_joint_trajectory",
        trajectory_topic="/fr3_arm_controller/joint_trajectory",
        wrench_topic="/franka_robot_state_broadcaster/external_wrench_in_stiffness_frame",
        wrench_frame="fr3_hand_tcp",
        wrench_best_effort=True,
        start_q=(0.0, -0.7853981633974483, 0.0, -2.356194490192345, 0.0, 1.5707963267948966, 0.7853981633974483),
        gripper=FakeGripper(
            "franka",
            action="/franka_gripper/move",
            grasp_action="/franka_gripper/grasp",
            joint_states_topic="/franka_gripper/joint_states",
            joints=("fr3_finger_joint1", "fr3_finger_joint2"),
        ),
        # franka_hardware's franka_param_service_server (node service_server)
        franka_services=("/service_server/set_force_torque_collision_behavior", "/service_server/set_load"),
        franka_recovery=FrankaRecoveryNames(
            robot_state_topic="/franka_robot_state_broadcaster/robot_state",
            error_recovery_action="/action_server/error_recovery",
            controller_manager="/controller_manager",
            hardware_component="FrankaHardwareInterface",
            trajectory_controller="fr3_arm_controller",
            joint_state_broadcaster="joint_state_broadcaster",
            robot_state_broadcaster="franka_robot_state_broadcaster",
        ),
    ),
    # Universal_Robots_ROS2_Driver jazzy: ur_control.launch.py ur_type:=ur5e, plus PickNik's Hand-E controller
    "ur5e": VendorSpec(
        profile="ur5e",
        urdf="ur5e_hande_vendor.urdf",
        arm_joints=UR_ARM,
        joint_states_topic="/joint_states",
        trajectory_action="/scaled_joint_trajectory_controller/follow_joint_trajectory",
        trajectory_topic="/scaled_joint_trajectory_controller/joint_trajectory",
        wrench_topic="/force_torque_sensor_broadcaster/wrench",
        wrench_frame="tool0_controller",
        wrench_tf_parent="base",
        speed_scaling_topic="/speed_scaling_state_broadcaster/speed_scaling",
        start_q=(-0.9708, -1.5708, 1.5708, -1.5708, -1.5708, 0.0),  # home turned 0.6 rad: TCP inside the box
        gripper=HandEGripper(
            "parallel_gripper_command",
            action="/robotiq_gripper_controller/gripper_cmd",
            joint_states_topic=f"{REMOVED}/hand_e_joint_states",  # its state goes out with the arm's (below)
            distance_joint=True,
        ),
        arm_state_gripper_joints=lambda opening_m: {"hande_finger_distance": HANDE_STROKE_M - opening_m},
        meshes_elsewhere=True,  # the Hand-E's (robotiq_description)
        ur_status_topics=(
            "/io_and_status_controller/robot_mode",
            "/io_and_status_controller/safety_mode",
            "/io_and_status_controller/robot_program_running",
        ),
    ),
    # ros2_control_demos example 7 (r6bot) with a JointTrajectoryController and an F/T broadcaster added
    "ros2_control_demo": VendorSpec(
        profile="ros2_control_demo",
        urdf="r6bot_vendor.urdf",
        arm_joints=tuple(f"joint_{i}" for i in range(1, 7)),
        joint_states_topic="/joint_states",
        trajectory_action="/joint_trajectory_controller/follow_joint_trajectory",
        trajectory_topic="/joint_trajectory_controller/joint_trajectory",
        wrench_topic="/force_torque_sensor_broadcaster/wrench",
        wrench_frame="ft_frame",
        start_q=(-1.5707963267948966, 0.0, 0.0, 0.0, 0.0, 0.0),  # joint_1 turned: TCP inside the box
        meshes_elsewhere=True,  # every link's (ros2_control_demo_description)
    ),
}


# ---------------------------------------------------------------------------------------------- the arm controller
class FakeTrajectoryController:
    """A joint_trajectory_controller on the arm: goals and topic messages are validated against its joints and
    followed by TrajectoryFollower (the controller modelled) on the node's clock, from their header stamp (zero:
    on receipt) and at the speed scaling (UR's scaled controller; 1 for the others). The arm tracks it exactly. As
    in joint_trajectory_controller, a topic message replaces the trajectory without ending the running goal."""

    def __init__(self, node, action: str, topic: str, *, joints: tuple[str, ...], lower, upper, start_q, group):
        self.joints = joints
        self.follower = TrajectoryFollower(joints, lower, upper, np.asarray(start_q, dtype=float))
        self.goals: list[FollowJointTrajectory.Goal] = []  # every goal received
        self.topic_messages: list[JointTrajectoryMsg] = []
        self.received: list[tuple[str, JointTrajectoryMsg]] = []  # ("goal" | "topic", msg) taken up, in order
        self._following: list[int] | None = None  # [token]: the trajectory the running goal follows
        self._switch = threading.Lock()  # a trajectory taken up and the running goal's token change together
        self.active = True  # the controller_manager's lifecycle state of this controller (Franka's fake switches it)
        self._clock = node.get_clock()
        self._server = (
            ActionServer(
                node,
                FollowJointTrajectory,
                action,
                execute_callback=self._execute,
                goal_callback=self._on_goal,
                cancel_callback=lambda _goal: CancelResponse.ACCEPT,
                callback_group=group,
            )
            if action
            else None
        )
        if topic:
            node.create_subscription(JointTrajectoryMsg, topic, self._on_topic, 10, callback_group=group)
        self._context = node.context
        self._stopping = threading.Event()  # the bring-up stops: a goal being followed ends

    def stop_work(self) -> None:
        """End the goal being followed (aborted), so that the executor running it can stop before the node goes."""
        self._stopping.set()

    def now_s(self) -> float:
        return self._clock.now().nanoseconds * 1e-9

    def update(self, now_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The arm's position and velocity at `now_s`: where the controller commands it."""
        q = self.follower.update(now_s)
        return q, self.follower.desired_qd * self.follower.speed_scaling

    def _start(self, msg: JointTrajectoryMsg, kind: str) -> int:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        token = self.follower.start(self._trajectory(msg), self.now_s(), start_time_s=stamp or None)
        self.received.append((kind, msg))
        return token

    def _trajectory(self, msg: JointTrajectoryMsg) -> JointTrajectory:
        points = msg.points
        velocities = [list(p.velocities) for p in points] if all(len(p.velocities) for p in points) else None
        return JointTrajectory.build(
            msg.joint_names,
            [duration_to_s(p.time_from_start.sec, p.time_from_start.nanosec) for p in points],
            [list(p.positions) for p in points],
            velocities,
            controlled=self.joints,
            lower=self.follower.lower,
            upper=self.follower.upper,
        )

    def _on_goal(self, goal: FollowJointTrajectory.Goal) -> GoalResponse:
        if not self.active:  # "Can't accept new action goals. Controller is not running."
            return GoalResponse.REJECT
        self.goals.append(goal)
        return GoalResponse.ACCEPT

    def deactivate(self) -> None:
        """The controller_manager deactivates it: the arm stops where it is (Franka's reflex brakes it), the running
        goal is aborted (on_deactivate), and neither goals nor topic messages are taken until it is activated."""
        with self._switch:
            self.active = False
            self.follower.hold(self.follower.update(self.now_s()))

    def activate(self) -> None:
        """Activated again: it holds the arm where it stands (on_activate), then follows what comes."""
        with self._switch:
            self.follower.hold(self.follower.update(self.now_s()))
            self.active = True

    def _on_topic(self, msg: JointTrajectoryMsg) -> None:
        """A topic trajectory replaces what the controller follows; a running goal goes on, judged against it
        (joint_trajectory_controller: the active goal ends when the newest trajectory does)."""
        self.topic_messages.append(msg)
        with self._switch:
            if not self.active:
                return  # subscriber_is_active_ is false while the controller is inactive
            try:
                token = self._start(msg, "topic")
            except TrajectoryError:
                return  # the real controller logs and ignores it
            if self._following is not None:
                self._following[0] = token

    def _execute(self, goal_handle) -> FollowJointTrajectory.Result:
        result = FollowJointTrajectory.Result()
        try:
            with self._switch:
                if not self.active:  # deactivated between its acceptance and its execution: never started
                    raise TrajectoryError(REFLEX_ABORT)  # aborted as INVALID_GOAL, as on_deactivate aborts it
                following = self._following = [self._start(goal_handle.request.trajectory, "goal")]
        except TrajectoryError as exc:
            result.error_code = (
                FollowJointTrajectory.Result.INVALID_JOINTS
                if exc.bad_joint_names
                else FollowJointTrajectory.Result.INVALID_GOAL
            )
            result.error_string = str(exc)
            goal_handle.abort()
            return result
        while self._context.ok() and not self._stopping.is_set():
            with self._switch:
                token = following[0]
                replaced = self._following is not following or self.follower.active_token() != token
                if not self.active:  # deactivated under it: on_deactivate aborts the active goal
                    result.error_code = FollowJointTrajectory.Result.INVALID_GOAL
                    result.error_string = REFLEX_ABORT
                    goal_handle.abort()
                    return result
            if goal_handle.is_cancel_requested:
                if not replaced:  # canceling a goal a newer one replaced leaves the arm alone
                    self.follower.hold(self.follower.desired_q)
                goal_handle.canceled()
                return result
            if replaced:  # a newer goal took over
                result.error_code = FollowJointTrajectory.Result.INVALID_GOAL
                result.error_string = "preempted by a newer trajectory"
                goal_handle.abort()
                return result
            if self.follower.finished(token, self.now_s()):
                result.error_code = FollowJointTrajectory.Result.SUCCESSFUL
                goal_handle.succeed()
                return result
            time.sleep(MONITOR_PERIOD_S)
        goal_handle.abort()
        return result

    def destroy(self) -> None:
        if self._server is not None:
            self._server.destroy()


# ---------------------------------------------------------------------------------------------- the graph
@dataclass
class VendorGraph:
    """A vendor's bring-up (`spec`) serving `description` on /robot_description, without the interfaces in
    `omit` (keys of VendorSpec.interfaces()). `gripper_overrides` changes fields of the spec's gripper template
    (object_m, opening_m, ...)."""

    spec: VendorSpec
    description: str
    omit: frozenset[str] = frozenset()
    rate_hz: float = 100.0  # the arm's control rate as the motion node sees it (control_period_s 0.01)
    wrench_frame: str = ""  # "" = the vendor's
    wrench_best_effort: bool | None = None  # None = as the vendor publishes it
    speed_scaling_percent: float = 100.0
    publish_tf: bool = False  # robot_state_publisher's /tf and /tf_static (and UR's tcp_pose_broadcaster)
    gripper_overrides: dict = field(default_factory=dict)
    franka_refusal: str = ""  # franka_hardware's services answer success false with this error ("" = success)
    recovery_aborts: bool = False  # franka_hardware's error recovery fails (libfranka could not recover)
    refuse_activation: frozenset[str] = frozenset()  # controllers whose activation fails (switch_controller: not ok)

    def start(self) -> VendorGraph:
        spec, omit = self.spec, self.omit
        unknown = omit - set(spec.interfaces())
        if unknown:
            raise ValueError(f"{spec.profile}'s bring-up has no {sorted(unknown)} to omit")
        self.tree = UrdfTree(self.description)
        self.wrench_frame = self.wrench_frame or spec.wrench_frame
        best_effort = spec.wrench_best_effort if self.wrench_best_effort is None else self.wrench_best_effort
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        node = self.node = rclpy.create_node("fake_vendor_bringup", context=self.context)
        group = ReentrantCallbackGroup()
        self._publishers: dict[str, object] = {}
        if "robot_description" not in omit:
            self._publishers["robot_description"] = node.create_publisher(String, "/robot_description", LATCHED)
            self._publishers["robot_description"].publish(String(data=self.description))
        if "joint_states" not in omit:
            self._publishers["joint_states"] = node.create_publisher(JointState, spec.joint_states_topic, 10)
        if "wrench" not in omit:
            qos = BEST_EFFORT if best_effort else 10
            self._publishers["wrench"] = node.create_publisher(WrenchStamped, spec.wrench_topic, qos)
        if spec.speed_scaling_topic and "speed_scaling" not in omit:
            self._publishers["speed_scaling"] = node.create_publisher(Float64, spec.speed_scaling_topic, 10)
        if self.publish_tf:
            self._publishers["tf"] = node.create_publisher(TFMessage, "/tf", 100)
            self._publishers["tf_static"] = node.create_publisher(TFMessage, "/tf_static", LATCHED)
        lower, upper = self.tree.limits(spec.arm_joints)
        self.controller = FakeTrajectoryController(
            node,
            "" if "trajectory_action" in omit else spec.trajectory_action,
            "" if "trajectory_topic" in omit else spec.trajectory_topic,
            joints=spec.arm_joints,
            lower=lower,
            upper=upper,
            start_q=spec.start_q,
            group=group,
        )
        self.gripper: FakeGripper | None = None
        if spec.gripper is not None:
            # an omitted gripper interface is served under another name: absent at the vendor's
            changes = {
                attribute: f"{REMOVED}{getattr(spec.gripper, attribute)}"
                for key, attribute in GRIPPER_PARTS.items()
                if key in omit
            }
            changes = {"goals": [], "speed_mps": 1.0, **changes, **self.gripper_overrides}
            self.gripper = replace(spec.gripper, **changes).start()
        self._vendor_states(node, group)
        self._franka_recovery(node, group)
        if spec.speed_scaling_topic:  # UR's scaled_joint_trajectory_controller
            self.controller.follower.set_speed_scaling(self.speed_scaling_percent / 100.0, self.controller.now_s())
        self._published_static = False
        self._timer = node.create_timer(1.0 / self.rate_hz, self._tick, callback_group=MutuallyExclusiveCallbackGroup())
        self.executor = MultiThreadedExecutor(num_threads=4, context=self.context)
        self.executor.add_node(node)
        self._thread = spin_in_background(self.executor)
        return self

    def stop(self) -> None:
        """Stop it (once: later calls do nothing)."""
        if not self.context.ok():
            return
        if self.gripper is not None:
            self.gripper.stop()
        # the 100 Hz timer first: a callback the executor schedules while it shuts down would trip over its
        # destroyed guard condition (rclpy prints "exception was never retrieved")
        self._timer.cancel()
        time.sleep(2.0 / self.rate_hz)
        self.controller.stop_work()
        stop_spinning(self.executor, self._thread)  # every callback has returned: the servers and node may go
        self.controller.destroy()
        if self._recovery_server is not None:
            self._recovery_server.destroy()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)

    def _vendor_states(self, node, group) -> None:
        """franka_hardware's param services and io_and_status_controller's UR state, where the vendor has them."""
        spec, omit = self.spec, self.omit
        self.franka_requests: list[tuple[str, object]] = []  # (service name, request) as franka_hardware got them
        self._stopped_by_ur = False
        if spec.franka_services is not None:
            kinds = (("collision_behavior", SetForceTorqueCollisionBehavior), ("set_load", SetLoad))
            for (key, srv_type), name in zip(kinds, spec.franka_services, strict=True):
                if key not in omit:
                    node.create_service(srv_type, name, self._franka_setting(name), callback_group=group)
        if spec.ur_status_topics is not None:  # a UR powered on, brakes released, External Control playing
            kinds = (("robot_mode", RobotMode), ("safety_mode", SafetyMode), ("program_running", Bool))
            for (key, msg_type), name in zip(kinds, spec.ur_status_topics, strict=True):
                if key not in omit:
                    self._publishers[key] = node.create_publisher(msg_type, name, LATCHED)
            self._publish_ur_status(RobotMode.RUNNING, SafetyMode.NORMAL, True)  # the follower runs as set

    def set_ur_status(self, robot_mode: int, safety_mode: int, program_running: bool) -> None:
        """Publish a UR's state as io_and_status_controller does (latched); a safety mode that stops the arm also
        stops the scaled trajectory controller (speed scaling 0), as on the robot."""
        self._publish_ur_status(robot_mode, safety_mode, program_running)
        moving = robot_mode == RobotMode.RUNNING and safety_mode in (SafetyMode.NORMAL, SafetyMode.REDUCED)
        self._stopped_by_ur = not (moving and program_running)
        self.controller.follower.set_speed_scaling(self._scaling_percent() / 100.0, self.controller.now_s())

    def _publish_ur_status(self, robot_mode: int, safety_mode: int, program_running: bool) -> None:
        for key, msg in (
            ("robot_mode", RobotMode(mode=robot_mode)),
            ("safety_mode", SafetyMode(mode=safety_mode)),
            ("program_running", Bool(data=program_running)),
        ):
            if key in self._publishers:
                self._publishers[key].publish(msg)

    def _scaling_percent(self) -> float:
        """The speed scaling the UR applies: the slider's, 0 while its state stops the arm."""
        return 0.0 if self._stopped_by_ur else self.speed_scaling_percent

    def _franka_setting(self, name: str):
        """franka_param_service_server's callback: the request is recorded; the robot refuses it (its error) when
        franka_refusal is set, as libfranka does while a motion runs."""

        def serve(request, response):
            self.franka_requests.append((name, request))
            response.success, response.error = not self.franka_refusal, self.franka_refusal
            return response

        return serve

    def _franka_recovery(self, node, group) -> None:
        """Franka's robot state publisher, error-recovery action and controller_manager services (their states)."""
        names, omit = self.spec.franka_recovery, self.omit
        self.recovery_calls: list[str] = []  # what the recovery interfaces were asked, in order
        self._recovery_server = None
        self._cm_lock = threading.Lock()
        self.hardware_state = "active"
        self.controller_states: dict[str, str] = {}
        self.robot_mode: int | None = None  # None: MOVE while the trajectory controller is active, IDLE otherwise
        self.robot_errors: tuple[str, ...] = ()  # libfranka error names the robot state reports as current
        self.robot_state_silent = False  # the robot state stops (only it: a test of the staleness limit)
        self._in_reflex = False
        if names is None:
            return
        for name in (names.trajectory_controller, names.joint_state_broadcaster, names.robot_state_broadcaster):
            self.controller_states[name] = "active"
        if "robot_state" not in omit:
            self._publishers["robot_state"] = node.create_publisher(FrankaRobotState, names.robot_state_topic, 10)
            self._robot_state = FrankaRobotState()  # built once: a message of this size takes ~0.5 ms to make
        if "error_recovery" not in omit:
            self._recovery_server = ActionServer(
                node,
                ErrorRecovery,
                names.error_recovery_action,
                execute_callback=self._error_recovery,
                cancel_callback=lambda _goal: CancelResponse.ACCEPT,
                callback_group=group,
            )
        services = {
            "set_hardware_component_state": (SetHardwareComponentState, self._set_hardware_component_state),
            "switch_controller": (SwitchController, self._switch_controller),
            "list_controllers": (ListControllers, self._list_controllers),
        }
        for key, name in names.services().items():
            if key not in omit:
                srv_type, serve = services[key]
                node.create_service(srv_type, name, serve, callback_group=group)

    def reflex(self) -> None:
        """The FR3 stops itself in a reflex (franka_ros2 v3.4.0 with ros2_control, see the module's docstring)."""
        with self._cm_lock:
            self._in_reflex = True
            self.hardware_state = "unconfigured"  # the component's on_error: success -> unconfigured
            for name in self.controller_states:
                self.controller_states[name] = "inactive"
            self.controller.deactivate()

    def _broadcasting(self, broadcaster: str) -> bool:
        """Whether a Franka broadcaster publishes (always, on the vendors without a controller_manager fake)."""
        return self.spec.franka_recovery is None or self.controller_states.get(broadcaster) == "active"

    def _error_recovery(self, goal_handle) -> ErrorRecovery.Result:
        self.recovery_calls.append("error_recovery")
        if self.recovery_aborts:
            goal_handle.abort()  # franka::Exception in automaticErrorRecovery()
        else:
            with self._cm_lock:
                self._in_reflex = False
            goal_handle.succeed()
        return ErrorRecovery.Result()

    def _set_hardware_component_state(self, request, response):
        target = request.target_state.label or str(request.target_state.id)
        self.recovery_calls.append(f"set_hardware_component_state {request.name} {target}")
        with self._cm_lock:
            if request.name != self.spec.franka_recovery.hardware_component:
                response.ok = False  # "hardware component with name '...' does not exist"
                return response
            if request.target_state.id == State.PRIMARY_STATE_ACTIVE or request.target_state.label == "active":
                self.hardware_state = "active"  # from unconfigured: configure, then activate
                response.ok = True
            response.state = State(id=State.PRIMARY_STATE_ACTIVE, label="active")
            if self.hardware_state != "active":
                response.state = State(id=State.PRIMARY_STATE_UNCONFIGURED, label="unconfigured")
        return response

    def _switch_controller(self, request, response):
        """STRICT: every controller to activate must exist, be inactive and activate, or nothing is switched."""
        names = self.spec.franka_recovery
        strict = "strict" if request.strictness == SwitchController.Request.STRICT else str(request.strictness)
        self.recovery_calls.append(f"switch_controller activate {sorted(request.activate_controllers)} {strict}")
        with self._cm_lock:
            problems = []
            for name in request.activate_controllers:
                if name not in self.controller_states:
                    problems.append(
                        f"Could not activate controller with name '{name}' because no controller with this name exists"
                    )
                elif self.controller_states[name] == "active":
                    problems.append(f"Controller with name '{name}' is already active.")
                elif self.hardware_state != "active" or name in self.refuse_activation:
                    problems.append(f"After activating, controller '{name}' is in state 'inactive', expected Active")
            if problems and request.strictness == SwitchController.Request.STRICT:
                response.ok, response.message = False, "; ".join(problems)
                return response
            for name in request.activate_controllers:
                if name in self.controller_states and name not in self.refuse_activation:
                    self.controller_states[name] = "active"
                    if name == names.trajectory_controller:
                        self.controller.activate()
            response.ok, response.message = True, "Successfully switched controllers!"
        return response

    def _list_controllers(self, request, response):
        self.recovery_calls.append("list_controllers")
        with self._cm_lock:
            response.controller = [ControllerState(name=n, state=s) for n, s in self.controller_states.items()]
        return response

    def _robot_state_msg(self, stamp) -> FrankaRobotState:
        msg = self._robot_state
        msg.header.stamp = stamp
        mode = self.robot_mode
        if mode is None and self._in_reflex:  # libfranka reports the reflex until its error recovery
            mode = FrankaRobotState.ROBOT_MODE_REFLEX
        elif mode is None:  # libfranka: MOVE while franka_hardware runs a controller's command loop, else IDLE
            active = self.controller.active
            mode = FrankaRobotState.ROBOT_MODE_MOVE if active else FrankaRobotState.ROBOT_MODE_IDLE
        msg.robot_mode = mode
        for name in msg.current_errors.get_fields_and_field_types():
            setattr(msg.current_errors, name, name in self.robot_errors)
        return msg

    # ------------------------------------------------------------------ the control loop
    def _tick(self) -> None:
        now = self.node.get_clock().now()
        q, qd = self.controller.update(now.nanoseconds * 1e-9)
        stamp = now.to_msg()
        positions = dict(zip(self.spec.arm_joints, q.tolist(), strict=True))
        states = JointState(name=list(self.spec.arm_joints), position=q.tolist(), velocity=qd.tolist())
        states.effort = [0.0] * len(q)
        if self.gripper is not None and self.spec.arm_state_gripper_joints is not None:
            for name, value in self.spec.arm_state_gripper_joints(self.gripper.opening_m).items():
                states.name.append(name)
                states.position.append(value)
                states.velocity.append(0.0)
                states.effort.append(0.0)
                positions[name] = value
        states.header.stamp = stamp
        franka = self.spec.franka_recovery
        joint_states_on = self._broadcasting(franka.joint_state_broadcaster) if franka else True
        robot_state_on = self._broadcasting(franka.robot_state_broadcaster) if franka else True
        if "joint_states" in self._publishers and joint_states_on:
            self._publishers["joint_states"].publish(states)
        if "wrench" in self._publishers and robot_state_on:
            wrench = WrenchStamped()
            wrench.header.stamp, wrench.header.frame_id = stamp, self.wrench_frame
            self._publishers["wrench"].publish(wrench)  # no external force
        if "robot_state" in self._publishers and robot_state_on and not self.robot_state_silent:
            self._publishers["robot_state"].publish(self._robot_state_msg(stamp))
        if "speed_scaling" in self._publishers:
            self._publishers["speed_scaling"].publish(Float64(data=float(self._scaling_percent())))
        if self.publish_tf:
            self._publish_tf(positions, stamp)

    def _publish_tf(self, positions: dict[str, float], stamp) -> None:
        """robot_state_publisher's transforms (fixed joints once on /tf_static, moving ones on /tf) and, where the
        vendor has one, the pose broadcaster's wrench frame (UR: tool0_controller = tool0 with the pendant's TCP
        at zero)."""
        moving = [
            _transform_msg(j.parent, j.child, self.tree.joint_transform(j, positions), stamp)
            for j in self.tree.joints
            if j.kind != "fixed"
        ]
        if self.spec.wrench_tf_parent and self.wrench_frame not in {j.child for j in self.tree.joints}:
            poses = self.tree.poses(positions)
            relative = np.linalg.inv(poses[self.spec.wrench_tf_parent]) @ poses["tool0"]
            moving.append(_transform_msg(self.spec.wrench_tf_parent, self.wrench_frame, relative, stamp))
        self._publishers["tf"].publish(TFMessage(transforms=moving))
        if not self._published_static:
            fixed = [_transform_msg(j.parent, j.child, j.origin, stamp) for j in self.tree.joints if j.kind == "fixed"]
            self._publishers["tf_static"].publish(TFMessage(transforms=fixed))
            self._published_static = True

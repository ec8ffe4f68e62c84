"""The robot as the stack sees it: one profile per arm (config/robots/<name>.yaml), plus what its URDF says.

A profile names everything that differs between arms and bring-ups: the URDF, the frames, the arm's joints
(any number: the kinematics and planning work for any serial arm), the gripper's joints and how it is
commanded, and the ros2_control interfaces (trajectory action, wrench, speed scaling, cameras). Nothing in
code restates a joint name, a frame or a topic: it asks the profile. Numbers that the URDF holds (limits,
gripper geometry) are read from the URDF, never restated in the profile.

A real arm whose vendor publishes its description on /robot_description may leave `description.urdf` empty;
the node that loads such a profile passes the received URDF text to `RobotProfile.with_urdf_text`.

Camera frames need not be links of the URDF: on a real arm they come from the camera driver's /tf and the
hand-eye calibration on /tf_static, and what needs a camera's pose looks it up there (perception_node); only a
use that truly needs the URDF's pose (the MuJoCo twin renders its cameras at their links) checks, and says so.
An arm without a gripper names no gripper joints (`has_gripper`); its gripper commands are refused.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from captain_ros.paths import config_path, urdf_path

DEFAULT_PROFILE = "panda_twin"
GRIPPER_COMMANDS = ("joint_trajectory", "gripper_command", "parallel_gripper_command", "franka")
# interfaces.speed_scaling_unit -> the value the topic carries at full speed (UR's broadcaster publishes percent)
SPEED_SCALING_UNITS = {"percent": 100.0, "fraction": 1.0}
# The wrench subscription's reliability: a best-effort subscriber hears reliable and best-effort publishers alike,
# a reliable one only reliable publishers (franka_robot_state_broadcaster publishes best effort from v3.4.0 on).
WRENCH_QOS = ("reliable", "best_effort")
OPENING_TOLERANCE_M = 1e-4  # how far below 0 a shut jaw may compute (rounding of URDF limits and offsets)


class ProfileError(ValueError):
    """A robot profile that cannot be used: which file, which key, and what is wrong."""


@dataclass(frozen=True)
class JointLimits:
    name: str
    lower: float
    upper: float
    velocity: float
    effort: float


@dataclass(frozen=True)
class GripperGeometry:
    """Gripper dimensions along the hand axis (z) and the finger pad box, read from the URDF."""

    tcp_from_flange_m: float
    fingertips_below_tcp_m: float
    finger_pad_size_m: tuple[float, float, float]
    # the hand body's collision box (across the jaw, along the jaw) and how far its underside sits above the TCP;
    # None where the hand frame's link has no <collision><box> (or the TCP does not hang from the hand frame)
    palm_size_m: tuple[float, float] | None = None
    palm_above_tcp_m: float | None = None


@dataclass(frozen=True)
class CameraInterface:
    color_topic: str
    depth_topic: str
    info_topic: str


@dataclass(frozen=True)
class GripperInterface:
    """How the gripper is commanded and read.

    command: "joint_trajectory" (a JointTrajectoryController on the finger joint: the twin, ros2_control demos),
    "gripper_command" (control_msgs/action/GripperCommand: gripper_action_controller, Robotiq drivers),
    "parallel_gripper_command" (control_msgs/action/ParallelGripperCommand: parallel_gripper_action_controller),
    or "franka" (franka_msgs/action/Move and Grasp of franka_gripper); "" for an arm without a gripper.

    The jaw opening (the gap between the finger pads, m) is linear in the gripper joints the profile names (the
    joints the controller drives and the joint states report): opening = opening_offset_m + opening_per_joint *
    (the sum of their positions), and a command sends every named joint the inverse of it. Why both numbers: the
    joint a vendor's controller drives is not always a finger. Two prismatic fingers (Panda, FR3) are 0 and 1; one
    prismatic finger whose mirror is a mimic joint, 0 and 2; the Robotiq Hand-E's hande_finger_distance (0 = open,
    0.05 m = shut, the fingers its mimics) 0.05 and -1."""

    command: str = ""
    action: str = ""  # the trajectory / GripperCommand / ParallelGripperCommand / franka Move action
    grasp_action: str = ""  # franka_gripper's Grasp action (command "franka")
    joint_states_topic: str = ""  # where the fingers' measured positions come from ("" = the arm's joint_states)
    max_effort_n: float = 70.0  # grasp force asked of force-controlled grippers
    opening_offset_m: float = 0.0  # the opening with every gripper joint at 0
    opening_per_joint: float = 1.0  # metres of opening per unit of the joints' sum (profiles default 2 for one joint)


@dataclass(frozen=True)
class ForceReflex:
    """The arm's own force reflex, set to each motion's force limit through a SetParameters service."""

    parameter_service: str
    parameter: str


@dataclass(frozen=True)
class Payload:
    """What the arm carries beyond the end effector its controller already models (a tool, a fixture), in the
    flange frame. A force-torque estimate from joint torques (Franka's) reads a payload it was not told of as a
    constant wrench: 1 kg undeclared is 9.8 N of "contact" on every motion."""

    mass_kg: float = 0.0
    center_of_mass_m: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class FrankaSettings:
    """franka_hardware's own services (franka_ros2 v3.4.0), set at configure: the payload (SetLoad) and the
    contact/collision reflex thresholds (SetForceTorqueCollisionBehavior; the arm refuses them while it moves).
    Torques in N m per joint, forces in N along and about the TCP's axes (x, y, z, then 3 torques in N m).

    And what watching and recovering the arm takes: franka_robot_state_broadcaster's robot state (its robot mode;
    motion is refused unless it is fresh and IDLE or MOVE), and after a reflex, which leaves franka_hardware's
    component and every controller on it inactive, franka_hardware's error-recovery action, then the
    controller_manager's services to bring the hardware component, the trajectory controller and the broadcasters
    back (captain_ros.ros.franka)."""

    set_load_service: str
    collision_behavior_service: str
    lower_torque_thresholds_nm: tuple[float, ...]  # contact: over these the arm reports contact
    upper_torque_thresholds_nm: tuple[float, ...]  # collision: over these the arm stops (a reflex)
    lower_force_thresholds_n: tuple[float, ...]
    upper_force_thresholds_n: tuple[float, ...]
    robot_state_topic: str  # franka_msgs/msg/FrankaRobotState (franka_robot_state_broadcaster, 1 kHz)
    error_recovery_action: str  # franka_msgs/action/ErrorRecovery (franka_hardware's action_server)
    controller_manager: str  # the controller_manager node: its switch_controller, list_controllers, ...
    hardware_component: str  # franka_hardware's ros2_control component (FrankaHardwareInterface)
    trajectory_controller: str  # the controller behind interfaces.trajectory_action
    broadcasters: tuple[str, ...]  # the broadcasters the recovery brings back with it
    recovery_step_timeout_s: float = 10.0  # each recovery step's limit


@dataclass(frozen=True)
class URStatus:
    """A UR's state as Universal_Robots_ROS2_Driver's io_and_status_controller publishes it (latched, on change):
    motions need the robot mode RUNNING, the safety mode NORMAL or REDUCED and the External Control program
    running; anything else is reported by name (a protective stop as a protective stop)."""

    robot_mode_topic: str  # ur_dashboard_msgs/msg/RobotMode
    safety_mode_topic: str  # ur_dashboard_msgs/msg/SafetyMode
    program_running_topic: str  # std_msgs/msg/Bool


MOVEIT_APIS = ("auto", "moveit_py", "services")  # interfaces.moveit.api


@dataclass(frozen=True)
class MoveItInterface:
    """move_group's services the planning-scene check calls (motion node `use_moveit:=true`, core/moveit_scene.py):
    each sweep's sampled joint configurations are checked with GetStateValidity, measured objects go into the scene
    with ApplyPlanningScene."""

    planning_group: str  # the SRDF group of the arm's joints in the MoveIt configuration
    check_state_validity_service: str = "/check_state_validity"  # moveit_msgs/srv/GetStateValidity
    apply_planning_scene_service: str = "/apply_planning_scene"  # moveit_msgs/srv/ApplyPlanningScene
    timeout_s: float = 2.0  # one sweep's check (all its states) or one scene update; no answer = refused
    max_states: int = 64  # configurations checked per sweep, evenly spread along it, its ends always among them
    # free-space moves: a move_to whose target is at least this far from the TCP is planned by move_group instead of
    # a straight sweep (0 = never); through plan_service, in pipeline_id with planner_id ("" = the pipeline's default)
    free_space_min_m: float = 0.0
    plan_service: str = "/plan_kinematic_path"  # moveit_msgs/srv/GetMotionPlan (move_group's plan service)
    pipeline_id: str = "ompl"  # or "pilz_industrial_motion_planner" with planner_id "PTP"
    planner_id: str = ""
    planning_time_s: float = 5.0  # move_group's allowed_planning_time; the call waits this plus timeout_s
    # how the stack reaches MoveIt (one of MOVEIT_APIS): "services" = move_group's services above; "moveit_py" =
    # moveit-py (moveit.planning.MoveItPy) in the motion node's process, loading the MoveIt configuration from
    # moveit_py_params_file ("" = the --params-file arguments of this process); "auto" = moveit_py where it imports
    api: str = "auto"
    moveit_py_params_file: str = ""


@dataclass(frozen=True)
class Interfaces:
    joint_states_topic: str
    trajectory_action: str  # control_msgs/action/FollowJointTrajectory of the arm's trajectory controller
    trajectory_topic: str  # trajectory_msgs/JointTrajectory of the same controller (the hold/stop path)
    wrench_topic: str  # geometry_msgs/WrenchStamped, in a frame of the arm's URDF or one /tf connects to the hand
    gripper: GripperInterface
    cameras: dict[str, CameraInterface]
    speed_scaling_topic: str = ""  # std_msgs/Float64: the arm's execution-speed scaling; "" = none
    speed_scaling_unit: str = "fraction"  # "percent" (0..100: UR's speed_scaling_state_broadcaster) or "fraction"
    force_reflex: ForceReflex | None = None
    franka: FrankaSettings | None = None  # franka_hardware's load and collision-behaviour services
    ur_status: URStatus | None = None  # a UR's robot mode, safety mode and program state
    moveit: MoveItInterface | None = None  # move_group's planning-scene services (used with use_moveit:=true)
    wrench_qos: str = "reliable"  # the wrench subscription's reliability: one of WRENCH_QOS
    camera_qos: str = "reliable"  # the camera topics' subscriptions' reliability: one of WRENCH_QOS ("best_effort":
    # a driver that publishes as sensor data, rclcpp::SensorDataQoS; a best-effort subscription hears both)

    def speed_scaling_fraction(self, value: float) -> float:
        """A speed_scaling_topic value as a fraction of full speed (1 = as planned, 0 = paused)."""
        return float(value) / SPEED_SCALING_UNITS[self.speed_scaling_unit]


@dataclass(frozen=True)
class TwinSpec:
    """What a MuJoCo twin of this arm needs beyond its URDF (absent for arms without a twin)."""

    arm_kp: tuple[float, ...]  # position-servo stiffness per arm joint, N m / rad
    gripper_force_n: float = 70.0
    gripper_kp: float = 800.0
    base_contact_excludes: tuple[str, ...] = ()  # links touching the base at rest (no contact with it)
    link_colors: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cache key for its compiled models
class RobotProfile:
    name: str
    source: str  # the file it was read from (for error messages)
    urdf_file: str  # under urdf/ of this package; "" = given later from /robot_description (with_urdf_text)
    base_frame: str
    flange_frame: str
    hand_frame: str  # the gripper body; the twin's wrist wrench is expressed here
    tcp_frame: str  # tool centre point between the finger pads
    arm_joints: tuple[str, ...]
    home_q_rad: tuple[float, ...]
    finger_joints: tuple[str, ...]  # the gripper's joints (none: no gripper); opening: GripperInterface
    pad_links: tuple[str, ...]  # the finger links that touch objects
    camera_frames: dict[str, str]  # camera name -> optical frame (a URDF link, or a frame only /tf knows)
    self_filter_chain_m: dict[str, float]  # links cut out of point clouds, with a radius around each
    interfaces: Interfaces
    twin: TwinSpec | None = None
    urdf_text: str = ""  # the URDF itself (read from urdf_file, or given)
    srdf_file: str = ""  # MoveIt's SRDF (its disabled collision pairs): under urdf/, a path or a package:// URI
    srdf_text: str = ""  # the SRDF itself (read from srdf_file); "" = none (core/collision.py then says what it does)
    shadow_twin: str = ""  # a twin profile with this arm's kinematics, for the shadow check (harness/shadow.py)
    payload: Payload = Payload()  # carried beyond the modelled end effector (Franka: set at configure)

    # ------------------------------------------------------------------ derived from the URDF
    @property
    def dof(self) -> int:
        return len(self.arm_joints)

    @property
    def description_path(self) -> Path | None:
        return urdf_path(self.urdf_file) if self.urdf_file else None

    @cached_property
    def _urdf(self) -> ET.Element:
        if not self.urdf_text:
            raise ProfileError(f"{self.source}: no URDF yet (description.urdf is empty: give /robot_description)")
        return ET.fromstring(self.urdf_text)

    @cached_property
    def joint_limits(self) -> dict[str, JointLimits]:
        """Limits of every non-fixed joint of the URDF, by joint name."""
        limits = {}
        for joint in self._urdf.iter("joint"):
            if joint.get("type") in ("fixed", "floating", "planar"):
                continue
            lim = joint.find("limit")
            name = joint.get("name")
            if lim is None:
                raise ProfileError(f"{self.source}: URDF joint {name} has no <limit>")
            continuous = joint.get("type") == "continuous"
            limits[name] = JointLimits(
                name,
                -math.pi if continuous else float(lim.get("lower", 0.0)),
                math.pi if continuous else float(lim.get("upper", 0.0)),
                float(lim.get("velocity", 0.0)),
                float(lim.get("effort", 0.0)),
            )
        return limits

    def arm_limits_rad(self) -> tuple[np.ndarray, np.ndarray]:
        lim = self.joint_limits
        return np.array([lim[j].lower for j in self.arm_joints]), np.array([lim[j].upper for j in self.arm_joints])

    def arm_velocity_limits_rad_s(self) -> np.ndarray:
        return np.array([self.joint_limits[j].velocity for j in self.arm_joints])

    @property
    def home_q(self) -> np.ndarray:
        return np.array(self.home_q_rad)

    # ------------------------------------------------------------------ the gripper
    @property
    def has_gripper(self) -> bool:
        """Whether the arm has a gripper: the profile names its joints (gripper.joints)."""
        return bool(self.finger_joints)

    def jaw_opening_at(self, joint_position: float) -> float:
        """The jaw opening (m) with every gripper joint at `joint_position` (gripper.opening_offset_m +
        opening_per_joint * their sum)."""
        g = self.interfaces.gripper
        return float(g.opening_offset_m + g.opening_per_joint * len(self.finger_joints) * joint_position)

    def finger_joint_position(self, opening_m: float) -> float:
        """The position every gripper joint is commanded to for a jaw opening: the inverse of `jaw_opening_at`
        (Panda: opening / 2 per finger; Hand-E: hande_finger_distance = 0.05 m - opening)."""
        if not self.has_gripper:
            raise ProfileError(f"{self.source}: robot profile '{self.name}' has no gripper (gripper.joints is empty)")
        g = self.interfaces.gripper
        return float((opening_m - g.opening_offset_m) / (g.opening_per_joint * len(self.finger_joints)))

    def jaw_opening_range_m(self) -> tuple[float, float]:
        """(shut, fully open) jaw openings over the gripper joints' URDF limits; (0, 0) without a gripper."""
        if not self.has_gripper:
            return 0.0, 0.0
        n = len(self.finger_joints)
        lower = sum(self.joint_limits[j].lower for j in self.finger_joints) / n
        upper = sum(self.joint_limits[j].upper for j in self.finger_joints) / n
        ends = self.jaw_opening_at(lower), self.jaw_opening_at(upper)
        return min(ends), max(ends)

    def max_jaw_opening_m(self) -> float:
        """The jaw opening when fully open (from the gripper joints' URDF limits; 0 without a gripper)."""
        return self.jaw_opening_range_m()[1]

    def jaw_opening_m(self, positions: dict[str, float]) -> float | None:
        """The measured jaw opening from gripper joint positions (joint name -> position); a joint missing from
        `positions` counts as the mean of those present (a mimic finger the broadcaster does not report). None
        when none of them is there (or the arm has no gripper)."""
        known = [positions[j] for j in self.finger_joints if j in positions]
        if not known:
            return None
        return self.jaw_opening_at(sum(known) / len(known))

    @cached_property
    def gripper_geometry(self) -> GripperGeometry:
        if not self.has_gripper or not self.pad_links:
            what = "has no gripper" if not self.has_gripper else "names no gripper.pad_links"
            raise ProfileError(f"{self.source}: robot profile '{self.name}' {what}: no finger pad geometry")
        joints = {j.find("child").get("link"): j for j in self._urdf.iter("joint")}
        links = {link.get("name"): link for link in self._urdf.iter("link")}
        tcp_z = float(_origin_xyz(joints[self.tcp_frame])[2])
        finger_z = float(_origin_xyz(joints[self.pad_links[0]])[2])
        collision = links[self.pad_links[0]].find("collision")
        box = collision.find("geometry/box") if collision is not None else None
        if box is None:
            raise ProfileError(f"{self.source}: pad link {self.pad_links[0]} needs a <collision><box> in the URDF")
        size = [float(v) for v in box.get("size").split()]
        tip_z = finger_z + float(_origin_xyz(collision)[2]) + size[2] / 2
        palm_size, palm_above = None, None
        hand = links.get(self.hand_frame)
        boxes = [
            c
            for c in ([] if hand is None else hand.iter("collision"))
            if c.find("geometry/box") is not None and not any(_origin_rpy(c))
        ]
        if boxes and joints[self.tcp_frame].find("parent").get("link") == self.hand_frame:
            # the box whose underside comes nearest the fingers is what a descent brings down onto its neighbours
            def underside(c: ET.Element) -> float:
                return float(_origin_xyz(c)[2]) + float(c.find("geometry/box").get("size").split()[2]) / 2

            palm = max(boxes, key=underside)
            px, py, _ = (float(v) for v in palm.find("geometry/box").get("size").split())
            palm_size, palm_above = (px, py), tcp_z - underside(palm)
        return GripperGeometry(tcp_z, tip_z - tcp_z, (size[0], size[1], size[2]), palm_size, palm_above)

    def links(self) -> list[str]:
        return [link.get("name") for link in self._urdf.iter("link")]

    def arm_links(self) -> list[str]:
        """The links that move with the arm: every link below the base (cameras mounted elsewhere excluded)."""
        children: dict[str, list[str]] = {}
        for joint in self._urdf.iter("joint"):
            children.setdefault(joint.find("parent").get("link"), []).append(joint.find("child").get("link"))
        out, todo = [], [self.base_frame]
        while todo:
            link = todo.pop()
            out.append(link)
            todo.extend(children.get(link, []))
        return out

    # ------------------------------------------------------------------ variants
    def with_urdf_text(self, text: str) -> RobotProfile:
        """This profile on a URDF received at run time (/robot_description), checked like a file's."""
        profile = replace(self, urdf_text=text)
        profile.validate()
        return profile

    def validate(self) -> None:
        """Every name the profile gives exists in the URDF (camera frames excepted: /tf may hold them), the home
        pose is inside the limits, the gripper is described consistently and opens from 0 up."""
        where = self.source
        if len(self.home_q_rad) != self.dof:
            raise ProfileError(
                f"{where}: description.home_q_rad has {len(self.home_q_rad)} values for {self.dof} joints"
            )
        self._validate_gripper()
        if not self.urdf_text:
            return
        try:
            links = set(self.links())
            limits = self.joint_limits
        except ET.ParseError as exc:
            raise ProfileError(f"{where}: the URDF does not parse: {exc}") from exc
        for key, frame in (
            ("base_frame", self.base_frame),
            ("flange_frame", self.flange_frame),
            ("hand_frame", self.hand_frame),
            ("tcp_frame", self.tcp_frame),
            *((f"gripper.pad_links[{i}]", f) for i, f in enumerate(self.pad_links)),
            *((f"self_filter_chain_m.{f}", f) for f in self.self_filter_chain_m),
        ):
            if frame not in links:
                raise ProfileError(f"{where}: {key} '{frame}' is not a link of the URDF")
        for key, joints in (("arm_joints", self.arm_joints), ("gripper.joints", self.finger_joints)):
            for j in joints:
                if j not in limits:
                    raise ProfileError(f"{where}: {key} '{j}' is not a movable joint of the URDF")
        lower, upper = self.arm_limits_rad()
        outside = [j for j, q, lo, hi in zip(self.arm_joints, self.home_q_rad, lower, upper, strict=True)
                   if not lo <= q <= hi]  # fmt: skip
        if outside:
            raise ProfileError(f"{where}: description.home_q_rad is outside the URDF limits at {', '.join(outside)}")
        if self.twin is not None and len(self.twin.arm_kp) != self.dof:
            raise ProfileError(f"{where}: twin.arm_kp has {len(self.twin.arm_kp)} values for {self.dof} joints")
        shut, open_ = self.jaw_opening_range_m()
        if self.has_gripper and (shut < -OPENING_TOLERANCE_M or open_ <= shut):
            raise ProfileError(
                f"{where}: gripper: over the URDF limits of {', '.join(self.finger_joints)} the jaw would open "
                f"{shut:.4f}..{open_:.4f} m (opening = opening_offset_m + opening_per_joint * their sum); a jaw "
                "opens from 0 (shut) up: check opening_offset_m and opening_per_joint"
            )

    def _validate_gripper(self) -> None:
        """A gripper names its joints, action and command and an invertible opening; an arm without one (no
        gripper.joints) names none of its interfaces, and has no twin (the twin simulates a gripper)."""
        g, where = self.interfaces.gripper, f"{self.source}: gripper"
        if not self.has_gripper:
            given = [
                key
                for key, value in (
                    ("command", g.command),
                    ("action", g.action),
                    ("grasp_action", g.grasp_action),
                    ("joint_states_topic", g.joint_states_topic),
                    ("pad_links", self.pad_links),
                )
                if value
            ]
            if given:
                raise ProfileError(
                    f"{where}: joints is empty (an arm without a gripper) but {', '.join(given)} "
                    f"{'is' if len(given) == 1 else 'are'} given: name the gripper's joints, or remove "
                    f"{'it' if len(given) == 1 else 'them'}"
                )
            if self.twin is not None:
                raise ProfileError(f"{where}: joints is empty, but the MuJoCo twin needs a gripper to simulate")
            return
        if g.command not in GRIPPER_COMMANDS:
            raise ProfileError(f"{where}: command must be one of {', '.join(GRIPPER_COMMANDS)}, got {g.command!r}")
        if not g.action:
            raise ProfileError(f"{where}: action is empty: name the gripper controller's action")
        if not math.isfinite(g.opening_offset_m):
            raise ProfileError(f"{where}: opening_offset_m must be a finite number of metres, got {g.opening_offset_m}")
        if not (math.isfinite(g.opening_per_joint) and g.opening_per_joint != 0):
            raise ProfileError(
                f"{where}: opening_per_joint must be a finite, non-zero number (the opening must follow the joints), "
                f"got {g.opening_per_joint}"
            )


def _origin_rpy(element: ET.Element) -> list[float]:
    origin = element.find("origin")
    return [] if origin is None else [float(v) for v in origin.get("rpy", "0 0 0").split()]


def _origin_xyz(element: ET.Element | None) -> np.ndarray:
    origin = None if element is None else element.find("origin")
    return np.zeros(3) if origin is None else np.array([float(v) for v in origin.get("xyz", "0 0 0").split()])


# ---------------------------------------------------------------------------------------------- loading
def profile_path(name_or_path: str | Path) -> Path:
    """A profile name (config/robots/<name>.yaml) or a path to a profile file."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return Path(text)
    return config_path(f"robots/{text}.yaml")


def available_profiles() -> list[str]:
    return sorted(p.stem for p in config_path("robots").glob("*.yaml"))


def _moveit(doc: dict, where: str) -> MoveItInterface:
    default = MoveItInterface("")
    settings = MoveItInterface(
        planning_group=_get(doc, "planning_group", where),
        check_state_validity_service=_get(
            doc, "check_state_validity_service", where, str, default.check_state_validity_service
        ),
        apply_planning_scene_service=_get(
            doc, "apply_planning_scene_service", where, str, default.apply_planning_scene_service
        ),
        timeout_s=_get(doc, "timeout_s", where, float, default.timeout_s),
        max_states=int(_get(doc, "max_states", where, int, default.max_states)),
        free_space_min_m=_get(doc, "free_space_min_m", where, float, default.free_space_min_m),
        plan_service=_get(doc, "plan_service", where, str, default.plan_service),
        pipeline_id=_get(doc, "pipeline_id", where, str, default.pipeline_id),
        planner_id=_get(doc, "planner_id", where, str, default.planner_id),
        planning_time_s=_get(doc, "planning_time_s", where, float, default.planning_time_s),
        api=_get(doc, "api", where, str, default.api),
        moveit_py_params_file=_get(doc, "moveit_py_params_file", where, str, default.moveit_py_params_file),
    )
    if settings.api not in MOVEIT_APIS:
        raise ProfileError(f"{where}.api: '{settings.api}' is not one of {', '.join(MOVEIT_APIS)}")
    if settings.timeout_s <= 0 or settings.max_states < 2:
        raise ProfileError(f"{where}: timeout_s must be > 0 and max_states >= 2")
    if settings.free_space_min_m < 0 or settings.planning_time_s <= 0:
        raise ProfileError(f"{where}: free_space_min_m must be >= 0 (0 = off) and planning_time_s > 0")
    return settings


@cache
def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> RobotProfile:
    """Read and check a profile; ProfileError names the file, the key and what is wrong."""
    path = profile_path(name_or_path)
    if not path.is_file():
        raise ProfileError(
            f"no robot profile '{name_or_path}' ({path} does not exist); the shipped ones are "
            f"{', '.join(available_profiles())}, or give a path to your own (docs/robot_profiles.md)"
        )
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    profile = _parse(doc, str(path))
    profile.validate()
    return profile


def default_profile() -> RobotProfile:
    return load_profile(DEFAULT_PROFILE)


def _get(doc: dict, key: str, where: str, kind: type | tuple = str, default: Any = ...) -> Any:
    if key not in doc or doc[key] is None:
        if default is ...:
            raise ProfileError(f"{where}: missing '{key}'")
        return default
    value = doc[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise ProfileError(f"{where}: '{key}' must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _names(doc: dict, key: str, where: str, default: Any = ...) -> tuple[str, ...]:
    value = _get(doc, key, where, list, default)
    if not all(isinstance(v, str) and v for v in value):
        raise ProfileError(f"{where}: '{key}' must be a list of names, got {value!r}")
    return tuple(value)


def _numbers(doc: dict, key: str, where: str, default: Any = ...) -> tuple[float, ...]:
    value = _get(doc, key, where, list, default)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise ProfileError(f"{where}: '{key}' must be a list of finite numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _payload(doc: dict, where: str) -> Payload:
    mass = _get(doc, "mass_kg", where, (int, float), 0.0)
    com = _numbers(doc, "center_of_mass_m", where, (0.0, 0.0, 0.0))
    if not (math.isfinite(mass) and mass >= 0) or len(com) != 3 or not all(math.isfinite(c) for c in com):
        raise ProfileError(f"{where}: mass_kg must be a finite mass >= 0 and center_of_mass_m 3 finite numbers")
    return Payload(float(mass), (com[0], com[1], com[2]))


def _franka(doc: dict, where: str) -> FrankaSettings:
    thresholds = {}
    for key, n in (
        ("lower_torque_thresholds_nm", 7),
        ("upper_torque_thresholds_nm", 7),
        ("lower_force_thresholds_n", 6),
        ("upper_force_thresholds_n", 6),
    ):
        values = _numbers(doc, key, where)
        if len(values) != n or not all(math.isfinite(v) and v > 0 for v in values):
            raise ProfileError(f"{where}: {key} must be {n} finite numbers > 0, got {list(values)}")
        thresholds[key] = values
    for kind in ("torque_thresholds_nm", "force_thresholds_n"):
        if any(lo > hi for lo, hi in zip(thresholds[f"lower_{kind}"], thresholds[f"upper_{kind}"], strict=True)):
            raise ProfileError(f"{where}: each lower_{kind} must be at most its upper_{kind}")
    step_s = _get(doc, "recovery_step_timeout_s", where, (int, float), 10.0)
    if not (math.isfinite(step_s) and step_s > 0):
        raise ProfileError(f"{where}: recovery_step_timeout_s must be a finite time > 0 s, got {step_s!r}")
    return FrankaSettings(
        set_load_service=_get(doc, "set_load_service", where),
        collision_behavior_service=_get(doc, "collision_behavior_service", where),
        **thresholds,
        robot_state_topic=_get(doc, "robot_state_topic", where),
        error_recovery_action=_get(doc, "error_recovery_action", where),
        controller_manager=_get(doc, "controller_manager", where),
        hardware_component=_get(doc, "hardware_component", where),
        trajectory_controller=_get(doc, "trajectory_controller", where),
        broadcasters=_names(doc, "broadcasters", where),
        recovery_step_timeout_s=float(step_s),
    )


def _read_srdf(name: str, where: str) -> str:
    """An SRDF named by a profile: a file under urdf/ of this package, a path, or a package:// URI."""
    from captain_ros.core.collision import resolve_uri

    path = urdf_path(name) if "/" not in name else resolve_uri(name)
    try:
        if path is None:
            raise OSError("not found (package:// is looked up under AMENT_PREFIX_PATH's share/)")
        return Path(path).read_text()
    except OSError as exc:
        raise ProfileError(f"{where}: srdf '{name}' cannot be read: {exc}") from exc


def _parse(doc: dict, source: str) -> RobotProfile:
    if not isinstance(doc, dict):
        raise ProfileError(f"{source}: a robot profile is a mapping")
    desc = _get(doc, "description", source, dict)
    grip = _get(doc, "gripper", source, dict, {})  # absent: an arm without a gripper
    ifc = _get(doc, "interfaces", source, dict)
    d, g, i = f"{source}: description", f"{source}: gripper", f"{source}: interfaces"
    finger_joints = _names(grip, "joints", g, [])
    per_joint_default = 2.0 if len(finger_joints) == 1 else 1.0  # one prismatic finger, its mirror a mimic
    camera_frames = _get(desc, "camera_frames", d, dict, {})
    for cam, frame in camera_frames.items():
        if not (isinstance(frame, str) and frame):
            raise ProfileError(f"{d}: camera_frames.{cam} must be a frame name, got {frame!r}")
    cameras = {}
    for cam, topics in _get(ifc, "cameras", i, dict, {}).items():
        w = f"{i}.cameras.{cam}"
        cameras[cam] = CameraInterface(
            _get(topics, "color_topic", w), _get(topics, "depth_topic", w), _get(topics, "info_topic", w)
        )
    reflex = _get(ifc, "force_reflex", i, dict, None)
    scaling_topic = _get(ifc, "speed_scaling_topic", i, str, "")
    scaling_unit = _get(ifc, "speed_scaling_unit", i, str, "") or ("" if scaling_topic else "fraction")
    if scaling_unit not in SPEED_SCALING_UNITS:
        raise ProfileError(
            f"{i}: speed_scaling_unit must be one of {', '.join(SPEED_SCALING_UNITS)} with a speed_scaling_topic "
            f"(UR's speed_scaling_state_broadcaster publishes percent, 0..100), got {scaling_unit!r}"
        )
    wrench_qos = _get(ifc, "wrench_qos", i, str, "reliable")
    if wrench_qos not in WRENCH_QOS:
        raise ProfileError(f"{i}: wrench_qos must be one of {', '.join(WRENCH_QOS)}, got {wrench_qos!r}")
    camera_qos = _get(ifc, "camera_qos", i, str, "reliable")
    if camera_qos not in WRENCH_QOS:
        raise ProfileError(f"{i}: camera_qos must be one of {', '.join(WRENCH_QOS)}, got {camera_qos!r}")
    twin = _get(doc, "twin", source, dict, None)
    urdf_file = _get(desc, "urdf", d, str, "")
    urdf_text = ""
    if urdf_file:
        try:
            urdf_text = urdf_path(urdf_file).read_text()
        except OSError as exc:
            raise ProfileError(f"{d}: urdf '{urdf_file}' cannot be read: {exc}") from exc
    franka = _get(ifc, "franka", i, dict, None)
    ur_status = _get(ifc, "ur_status", i, dict, None)
    moveit = _get(ifc, "moveit", i, dict, None)
    payload = _get(doc, "payload", source, dict, {})
    srdf_file = _get(desc, "srdf", d, str, "")
    srdf_text = _read_srdf(srdf_file, d) if srdf_file else ""
    radii = _get(desc, "self_filter_chain_m", d, dict, {})
    return RobotProfile(
        name=_get(doc, "name", source),
        shadow_twin=_get(doc, "shadow_twin", source, str, ""),
        source=source,
        urdf_file=urdf_file,
        base_frame=_get(desc, "base_frame", d),
        flange_frame=_get(desc, "flange_frame", d),
        hand_frame=_get(desc, "hand_frame", d),
        tcp_frame=_get(desc, "tcp_frame", d),
        arm_joints=_names(desc, "arm_joints", d),
        home_q_rad=_numbers(desc, "home_q_rad", d),
        finger_joints=finger_joints,
        pad_links=_names(grip, "pad_links", g, []),
        camera_frames={str(k): v for k, v in camera_frames.items()},
        self_filter_chain_m={str(k): float(v) for k, v in radii.items()},
        interfaces=Interfaces(
            joint_states_topic=_get(ifc, "joint_states_topic", i),
            trajectory_action=_get(ifc, "trajectory_action", i),
            trajectory_topic=_get(ifc, "trajectory_topic", i),
            wrench_topic=_get(ifc, "wrench_topic", i),
            gripper=GripperInterface(
                command=_get(grip, "command", g, str, ""),
                action=_get(grip, "action", g, str, ""),
                grasp_action=_get(grip, "grasp_action", g, str, ""),
                joint_states_topic=_get(grip, "joint_states_topic", g, str, ""),
                max_effort_n=_get(grip, "max_effort_n", g, float, 70.0),
                opening_offset_m=_get(grip, "opening_offset_m", g, float, 0.0),
                opening_per_joint=_get(grip, "opening_per_joint", g, float, per_joint_default),
            ),
            cameras=cameras,
            speed_scaling_topic=scaling_topic,
            speed_scaling_unit=scaling_unit,
            force_reflex=None
            if reflex is None
            else ForceReflex(_get(reflex, "parameter_service", i), _get(reflex, "parameter", i)),
            franka=None if franka is None else _franka(franka, f"{i}.franka"),
            ur_status=None
            if ur_status is None
            else URStatus(
                *(
                    _get(ur_status, k, f"{i}.ur_status")
                    for k in ("robot_mode_topic", "safety_mode_topic", "program_running_topic")
                )
            ),
            moveit=None if moveit is None else _moveit(moveit, f"{i}.moveit"),
            wrench_qos=wrench_qos,
            camera_qos=camera_qos,
        ),
        twin=None
        if twin is None
        else TwinSpec(
            arm_kp=_numbers(twin, "arm_kp", f"{source}: twin"),
            gripper_force_n=_get(twin, "gripper_force_n", f"{source}: twin", float, 70.0),
            gripper_kp=_get(twin, "gripper_kp", f"{source}: twin", float, 800.0),
            base_contact_excludes=_names(twin, "base_contact_excludes", f"{source}: twin", []),
            link_colors={str(k): tuple(float(c) for c in v) for k, v in (twin.get("link_colors") or {}).items()},
        ),
        urdf_text=urdf_text,
        srdf_file=srdf_file,
        srdf_text=srdf_text,
        payload=_payload(payload, f"{source}: payload"),
    )

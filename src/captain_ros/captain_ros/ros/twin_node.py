"""twin_node: the MuJoCo twin as a ROS 2 robot.

It looks to clients like a ros2_control arm with RGB-D cameras:
  /joint_states                                   sensor_msgs/JointState
  /arm_controller/follow_joint_trajectory         control_msgs/action/FollowJointTrajectory (the arm joints)
  /arm_controller/joint_trajectory                trajectory_msgs/JointTrajectory (topic interface)
  /gripper_controller/follow_joint_trajectory     same, for the first finger joint (its share of the opening)
  /gripper_controller/joint_trajectory
  /wrist_ft_sensor/wrench                         geometry_msgs/WrenchStamped (hand frame)
  /diagnostics                                    diagnostic_msgs/DiagnosticArray: the arm's force reflex
  /<cam>_camera/color/image_raw, .../camera_info  sensor_msgs/Image rgb8 + CameraInfo
  /<cam>_camera/aligned_depth_to_color/image_raw  sensor_msgs/Image 32FC1, metres (+ camera_info)
  /clock, /tf, /robot_description (transient local)
and for the sim bridge:
  /twin/reset                                     captain_interfaces/srv/ResetEpisode
  /twin/training_only/privileged_snapshot         captain_interfaces/srv/GetPrivilegedSnapshot
The training-only name is never used by the harness or the agent: the policy cannot reach it.
The arm has a force reflex in its physics loop, as a real arm has in its controller (parameter
`reflex_force_threshold_n`, default from config/safety.yaml; clients set it at run time through the
standard parameter service, as they would set a vendor's collision thresholds): above it the arm stops
where it is and the running trajectory goal is aborted with a "force reflex: ..." error string.
The twin runs in lockstep with the backend that commands its arm (parameter `lockstep`, captain_ros.twin.lockstep):
it steps only within the sim time that backend has granted (/twin/lockstep/grant), and echoes the stamp of each
arm command it takes up (/twin/lockstep/taken), so commands start at their stamps however busy the host is;
with no backend granting it runs freely.
A stop or hold sent on a controller's topic before a reset is dropped, never applied to the new episode, and
after a reflex trip the arm takes no topic command until the next trajectory goal. Trajectories honour their
header.stamp as their start time (joint_trajectory_controller's rule; 0 = on receipt). As in
joint_trajectory_controller, a trajectory on the topic replaces the one a running goal follows without ending the
goal: the goal is then judged against the newest trajectory (the ros2_control backend sends a sweep's later stretches
that way), and a reflex trip or a newer goal still ends it.
An arm whose profile names a speed_scaling_topic (ur5e_twin, as UR's) runs its arm trajectories at the simulated
pendant slider (parameter `speed_slider_fraction`, 0..1; 0 pauses the arm), approached smoothly as UR's
scaled_joint_trajectory_controller does, and publishes the factor on that topic in the profile's unit.
The arm, its names and its topics come from the robot profile (parameter `robot_profile`, a profile with a
`twin` section); parameters from config/twin.yaml.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np
import rclpy
from control_msgs.action import FollowJointTrajectory
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import TransformStamped, WrenchStamped
from rcl_interfaces.msg import FloatingPointRange, ParameterDescriptor, SetParametersResult
from rclpy._rclpy_pybind11 import RCLError
from rclpy.action import CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image, JointState
from std_msgs.msg import Float64, Header, String
from tf2_msgs.msg import TFMessage
from trajectory_msgs.msg import JointTrajectory as JointTrajectoryMsg
from trajectory_msgs.msg import JointTrajectoryPoint

from captain_interfaces.msg import PrivilegedSnapshot
from captain_interfaces.srv import GetPrivilegedSnapshot, ResetEpisode
from captain_ros.agent.prompt import task_md
from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.trajectory import JointTrajectory, TrajectoryError, duration_to_s
from captain_ros.ros.convert import camera_info, image_msg, pose_msg, quat_wxyz, stamp_msg
from captain_ros.ros.frames import stamp_ns
from captain_ros.ros.guard import GuardedActionServer, GuardedNode
from captain_ros.ros.spin import spin
from captain_ros.twin import lockstep
from captain_ros.twin.cameras import CameraFrame
from captain_ros.twin.controller import ReflexTrip, TwinControllers
from captain_ros.twin.privileged_state import FEATURE_NAMES
from captain_ros.twin.sim import SimulationFault, Twin
from captain_ros.twin.start_states import StartId
from captain_ros.twin.tasks import TaskError, default_suite, get_task

DEFAULT_GOAL_TOLERANCE = 0.02  # rad (arm) / m (finger) when a goal gives none
DEFAULT_GOAL_TIME_TOLERANCE_S = 1.0
ACTION_MONITOR_RATE_HZ = 20.0  # goal checks and feedback, joint_trajectory_controller's default
MAX_LAG_S = 0.1  # falling further behind real time than this drops the lag instead of fast-forwarding
SWITCH_INTERVAL_S = 0.0005  # the interpreter lock changes hands this often (Python's default: 5 ms)
YIELD_WHEN_BEHIND_S = 0.001  # behind real time, each physics step still leaves this long to the node's callbacks
SLOW_GRANT_S = 1.0  # a wait this long (wall clock) for the commanding backend's grant is logged
DIAGNOSTICS_PERIOD_S = 0.1  # wall clock; a reflex trip is published at once
REFLEX_PARAMETER = "reflex_force_threshold_n"
SPEED_SLIDER_PARAMETER = "speed_slider_fraction"


@dataclass
class _Following:
    """What a running trajectory goal follows: its own trajectory, or the newest one the controller's topic sent."""

    token: int
    trajectory: JointTrajectory


class TwinNode(GuardedNode, Node):
    def __init__(self, **node_options) -> None:
        """`node_options` go to rclpy's Node (a context, parameter overrides: tests run it in-process)."""
        super().__init__("twin", **node_options)
        self._declare_parameters()
        self.profile = robot.load_profile(self.get_parameter("robot_profile").value)
        if self.profile.twin is None:
            raise robot.ProfileError(f"robot profile '{self.profile.name}' has no twin section: it has no twin")
        self.interfaces = self.profile.interfaces
        problem = self._check_slider(float(self.get_parameter(SPEED_SLIDER_PARAMETER).value))
        if problem:
            raise ValueError(f"{SPEED_SLIDER_PARAMETER}: {problem}")
        self._moving_links = set(self.profile.arm_links()) - {self.profile.base_frame}  # their /tf
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.twin: Twin | None = None
        self.episode_id = ""
        self.fault = ""  # set when the simulation failed; cleared by the next reset
        self._reset_at_ns = 0  # system clock when the last reset took effect (orders topic commands against it)
        self._following: dict[str, _Following] = {}  # per controller: what its running goal follows (under _lock)
        reentrant = ReentrantCallbackGroup()
        latched = QoSProfile(
            depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE
        )

        self.joint_pub = self.create_publisher(JointState, self.interfaces.joint_states_topic, 10)
        self.wrench_pub = self.create_publisher(WrenchStamped, self.interfaces.wrench_topic, 10)
        scaling_topic = self.interfaces.speed_scaling_topic  # as UR's speed_scaling_state_broadcaster
        self.scaling_pub = self.create_publisher(Float64, scaling_topic, 10) if scaling_topic else None
        self.clock_pub = self.create_publisher(Clock, "/clock", 10)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._next_diagnostics = 0.0
        self._trips = 0
        self.tf_pub = self.create_publisher(TFMessage, "/tf", 10)
        self.description_pub = self.create_publisher(String, "/robot_description", latched)
        self.description_pub.publish(String(data=self.profile.urdf_text))
        self.camera_pubs = {}
        for cam, topics in self.interfaces.cameras.items():
            depth_info = topics.depth_topic.rsplit("/", 1)[0] + "/camera_info"
            self.camera_pubs[cam] = {
                "color": self.create_publisher(Image, topics.color_topic, 2),
                "depth": self.create_publisher(Image, topics.depth_topic, 2),
                "info": self.create_publisher(CameraInfo, topics.info_topic, 2),
                "depth_info": self.create_publisher(CameraInfo, depth_info, 2),
            }

        self.create_service(
            ResetEpisode, "/twin/reset", self._on_reset, callback_group=MutuallyExclusiveCallbackGroup()
        )
        self.create_service(
            GetPrivilegedSnapshot,
            "/twin/training_only/privileged_snapshot",
            self._on_snapshot,
            callback_group=reentrant,
        )
        self._grants: lockstep.Grants | None = None
        if self.get_parameter("lockstep").value:
            self._grants = lockstep.Grants()
            self.create_subscription(Header, lockstep.GRANT_TOPIC, self._on_grant, 10, callback_group=reentrant)
            echoes = QoSProfile(
                depth=lockstep.TAKEN_DEPTH,
                durability=DurabilityPolicy.TRANSIENT_LOCAL,
                reliability=ReliabilityPolicy.RELIABLE,
            )
            self._taken_pub = self.create_publisher(Header, lockstep.TAKEN_TOPIC, echoes)
            self._taken_pub.publish(Header(frame_id="arm"))  # latched: a commander learns the twin follows grants
        self.controllers: TwinControllers | None = None
        self._action_servers = []
        gripper_action = self.interfaces.gripper.action
        for name, action, topic_name in (
            ("arm", self.interfaces.trajectory_action, self.interfaces.trajectory_topic),
            ("gripper", gripper_action, gripper_action.rsplit("/", 1)[0] + "/joint_trajectory"),
        ):
            self._action_servers.append(
                GuardedActionServer(
                    self,
                    FollowJointTrajectory,
                    action,
                    execute_callback=lambda gh, n=name: self._execute(n, gh),
                    goal_callback=lambda _goal: GoalResponse.ACCEPT,
                    cancel_callback=lambda _gh: CancelResponse.ACCEPT,
                    callback_group=reentrant,
                )
            )
            self.create_subscription(
                JointTrajectoryMsg,
                topic_name,
                lambda msg, info, n=name: self._on_topic(n, msg, info),  # two arguments: rclpy passes MessageInfo
                10,
                callback_group=reentrant,
            )

        task = self.get_parameter("task").value or next(iter(default_suite()))
        start = self.get_parameter("start_id").value or None
        self._load(task, start, self.get_parameter("split").value)
        self._thread = threading.Thread(target=self._physics_loop, name="twin-physics", daemon=True)
        self._thread.start()
        self.get_logger().info(
            f"twin ready: task '{self.twin.task.name}', start '{self.twin.start_id}', "
            f"real-time factor {self.get_parameter('real_time_factor').value or 'unlimited'}"
        )

    # ------------------------------------------------------------------------------ parameters
    def _declare_parameters(self) -> None:
        def desc(text: str, lo: float | None = None, hi: float | None = None) -> ParameterDescriptor:
            d = ParameterDescriptor(description=text)
            if lo is not None:
                d.floating_point_range = [FloatingPointRange(from_value=lo, to_value=hi, step=0.0)]
            return d

        self.declare_parameter("task", "", desc("task of the twin's suite (config/tasks.yaml); empty = the first"))
        self.declare_parameter("start_id", "", desc("start-state id '<task>/<wide|official>/<index>'; empty = sample"))
        self.declare_parameter("split", "any", desc("split start ids are drawn from: train, eval or any"))
        self.declare_parameter(
            "real_time_factor", 1.0, desc("simulated seconds per wall second; 0 = as fast as possible", 0.0, 100.0)
        )
        self.declare_parameter(
            "state_rate_hz", 100.0, desc("joint_states, wrench and clock rate (sim time)", 1.0, 500.0)
        )
        self.declare_parameter(
            "lockstep",
            True,
            ParameterDescriptor(
                description="step only within the sim time granted by the backend commanding the arm, so its commands "
                "start at their stamps however busy the host is (captain_ros.twin.lockstep); false: run freely"
            ),
        )
        self.declare_parameter("tf_rate_hz", 30.0, desc("/tf rate (sim time)", 1.0, 200.0))
        self.declare_parameter("camera_rate_hz", 10.0, desc("camera image rate (sim time); 0 = no images", 0.0, 60.0))
        self.declare_parameter(
            "robot_profile", str(robot.DEFAULT_PROFILE), desc("robot profile (config/robots/<name>.yaml or a path)")
        )
        config = load_config()
        self.budgets = config.budgets  # stated in the TASK.md of each reset
        self.declare_parameter(
            REFLEX_PARAMETER,
            config.safety.arm_reflex_force_n,
            desc("the arm's force reflex: external force at the hand that stops it; 0 = off", 0.0, 500.0),
        )
        self.declare_parameter(
            SPEED_SLIDER_PARAMETER,
            1.0,
            desc(
                "the pendant's speed slider, simulated (arms whose profile names a speed_scaling_topic, as UR's): the "
                "arm's trajectory controller runs at this fraction of planned speed; 0 pauses it",
                0.0,
                1.0,
            ),
        )
        self.add_on_set_parameters_callback(self._on_set_parameters)

    def _check_slider(self, value: float) -> str:
        if value != 1.0 and not self.interfaces.speed_scaling_topic:
            return f"robot profile '{self.profile.name}' names no speed_scaling_topic: this arm has no speed scaling"
        return ""

    def _on_set_parameters(self, parameters) -> SetParametersResult:
        for parameter in parameters:
            if parameter.name == SPEED_SLIDER_PARAMETER and self._check_slider(float(parameter.value)):
                return SetParametersResult(successful=False, reason=self._check_slider(float(parameter.value)))
        for parameter in parameters:
            if parameter.name == REFLEX_PARAMETER and self.controllers is not None:
                with self._lock:
                    self.controllers.reflex.threshold_n = float(parameter.value)
            if parameter.name == SPEED_SLIDER_PARAMETER and self.controllers is not None:
                with self._lock:
                    self.controllers.speed_scaling_target = float(parameter.value)
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------------------ episode
    def _load(self, task: str, start_id: str | None, split: str) -> StartId:
        with self._lock:
            if self.twin is None or self.twin.task.name != task:
                twin = Twin(get_task(task), profile=self.profile)
                try:
                    start = twin.reset(start_id, split=split)
                except Exception:
                    twin.close()
                    raise  # the running twin stays as it was
                if self.twin is not None:
                    self.twin.close()
                self.twin = twin
            else:
                start = self.twin.reset(start_id, split=split)
            # fresh followers: goals still running on the old ones see the swap and abort
            self.controllers = TwinControllers(
                self.twin,
                float(self.get_parameter(REFLEX_PARAMETER).value),
                float(self.get_parameter(SPEED_SLIDER_PARAMETER).value),
            )
            self._next_state = self._next_tf = self._next_camera = 0.0
            self._state_published_s = math.nan
            self.fault = ""
            self._reset_at_ns = time.time_ns()
            return start

    def _on_reset(self, request: ResetEpisode.Request, response: ResetEpisode.Response) -> ResetEpisode.Response:
        try:
            start = self._load(request.task, request.start_id or None, request.split or "any")
        except (TaskError, SimulationFault) as exc:
            response.success, response.message = False, str(exc)
            self.get_logger().warning(f"reset refused: {exc}")
            return response
        self.episode_id = request.episode_id or uuid.uuid4().hex
        response.success = True
        response.episode_id, response.start_id = self.episode_id, str(start)
        response.instruction = self.twin.task.instruction
        response.task_md = task_md(self.twin.task.instruction, self.twin.task.success_criteria(), self.budgets)
        response.message = f"reset to {start}"
        self.get_logger().info(f"episode {self.episode_id}: {start}")
        return response

    def _on_snapshot(
        self, request: GetPrivilegedSnapshot.Request, response: GetPrivilegedSnapshot.Response
    ) -> GetPrivilegedSnapshot.Response:
        with self._lock:
            snap, fault = None, self.fault
            if not fault:
                try:
                    snap = self.twin.snapshot()
                except (SimulationFault, FloatingPointError) as exc:
                    fault = str(exc)
        msg = PrivilegedSnapshot(episode_id=self.episode_id, request_index=request.request_index)
        msg.header.stamp = stamp_msg(self.twin.time_s)
        if snap is None:
            msg.unstable, msg.fault_message = True, fault
            response.success, response.message, response.snapshot = False, fault, msg
            return response
        msg.task, msg.start_id = snap.task, snap.start_id
        msg.feature_names, msg.features = list(FEATURE_NAMES), [float(v) for v in snap.features]
        msg.object_names = list(snap.object_poses)
        msg.object_poses = [pose_msg(np.array(p), np.array(q)) for p, q in snap.object_poses.values()]
        msg.joint_names, msg.joint_positions = list(snap.joint_positions), list(snap.joint_positions.values())
        msg.task_success, msg.subgoals_reached = snap.success, list(snap.subgoals_reached)
        response.success, response.snapshot = True, msg
        return response

    # ------------------------------------------------------------------------------ control
    def _trajectory_from_msg(self, name: str, msg: JointTrajectoryMsg) -> JointTrajectory:
        follower = self.controllers[name]
        points: list[JointTrajectoryPoint] = msg.points
        times = [duration_to_s(p.time_from_start.sec, p.time_from_start.nanosec) for p in points]
        velocities = [list(p.velocities) for p in points] if all(len(p.velocities) for p in points) else None
        return JointTrajectory.build(
            msg.joint_names,
            times,
            [list(p.positions) for p in points],
            velocities,
            controlled=follower.joint_names,
            lower=follower.lower,
            upper=follower.upper,
        )

    @staticmethod
    def _start_time_s(msg: JointTrajectoryMsg) -> float | None:
        """The trajectory's start time (header.stamp, sim time), or None: start on receipt. As in
        joint_trajectory_controller, a trajectory stamped in the past begins part-way along (a stop ramp computed
        at a joint state's stamp runs as computed however late it arrives)."""
        stamp = msg.header.stamp
        return None if stamp.sec == 0 and stamp.nanosec == 0 else stamp.sec + stamp.nanosec * 1e-9

    def _on_topic(self, name: str, msg: JointTrajectoryMsg, info: dict) -> None:
        """A trajectory on the controller's topic (a stop or hold) preempts whatever the controller follows.
        One sent before the last reset is dropped: topic messages and the reset request travel on separate
        channels and run in separate callbacks, so the previous episode's final hold can be handled after the
        reset and would drive the new episode's arm back to where the old one stopped (pressed into the table,
        say). DDS stamps every message at its writer (`source_timestamp`, the system clock): a command written
        before the reset took effect belongs to the episode before it. Clients on other hosts need synchronised
        clocks for this, as for any stamp; a dropped hold is logged, and the stop it went with also cancels the
        goal through the action."""
        try:
            trajectory = self._trajectory_from_msg(name, msg)
        except TrajectoryError as exc:
            self._taken(name, msg)
            self.get_logger().error(f"{name} trajectory rejected: {exc}")
            return
        sent_ns = int(info.get("source_timestamp", 0) or 0)  # 0: the middleware does not stamp at the writer
        with self._lock:
            stale = 0 < sent_ns < self._reset_at_ns
            # after a reflex trip the arm holds where it stopped until the next trajectory goal, as a real arm in its
            # reflex state takes no position command until recovered: a client's hold at a position it read later
            # (while the arm still sank into what it hit) would press it deeper
            reflex_holds = name == "arm" and self.controllers.reflex.tripped is not None
            if not (stale or reflex_holds):
                token = self.controllers[name].start(trajectory, self.twin.time_s, self._start_time_s(msg))
                following = self._following.get(name)
                if following is not None:  # the running goal follows it now (joint_trajectory_controller's rule)
                    following.token, following.trajectory = token, trajectory
            now, reset_ns = self.twin.time_s, self._reset_at_ns
        self._taken(name, msg)
        if stale:
            self.get_logger().warning(
                f"{name}: dropped a topic trajectory sent {(reset_ns - sent_ns) / 1e9:.3f} s before the last reset"
            )
        elif reflex_holds:
            self.get_logger().info(f"arm: topic trajectory at {now:.3f} s ignored: holding after a force reflex trip")
        else:
            self.get_logger().debug(f"{name}: {len(msg.points)}-point topic trajectory at {now:.3f} s")

    def _on_grant(self, msg: Header) -> None:
        self._grants.grant(msg.frame_id, stamp_ns(msg.stamp))

    def _taken(self, name: str, msg: JointTrajectoryMsg) -> None:
        """Echo an arm command's stamp once it is taken up (or refused): its commander's grants resume."""
        if name == "arm" and self._grants is not None:
            self._taken_pub.publish(Header(stamp=msg.header.stamp, frame_id=name))

    def _commanders(self) -> set[str]:
        """The nodes that publish grants now (fully qualified names, as they sign their grants)."""
        infos = self.get_publishers_info_by_topic(lockstep.GRANT_TOPIC)
        return {f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in infos}

    def _measured(self, name: str) -> np.ndarray:
        if name == "arm":
            return self.twin.arm_q()
        return np.array([self.profile.finger_joint_position(self.twin.jaw_opening_m())])

    def _execute(self, name: str, goal_handle) -> FollowJointTrajectory.Result:
        result = FollowJointTrajectory.Result()
        goal = goal_handle.request
        try:
            trajectory = self._trajectory_from_msg(name, goal.trajectory)
        except TrajectoryError as exc:
            result.error_code = (
                FollowJointTrajectory.Result.INVALID_JOINTS
                if exc.bad_joint_names
                else FollowJointTrajectory.Result.INVALID_GOAL
            )
            result.error_string = str(exc)
            self._taken(name, goal.trajectory)
            goal_handle.abort()
            return result
        follower = self.controllers[name]
        tolerances = {t.name: t.position for t in goal.goal_tolerance if t.position > 0}
        tol = np.array([tolerances.get(j, DEFAULT_GOAL_TOLERANCE) for j in follower.joint_names])
        time_tol = (
            duration_to_s(goal.goal_time_tolerance.sec, goal.goal_time_tolerance.nanosec)
            or DEFAULT_GOAL_TIME_TOLERANCE_S
        )
        with self._lock:
            controllers = self.controllers
            start = controllers.start_motion if name == "arm" else follower.start
            following = _Following(start(trajectory, self.twin.time_s, self._start_time_s(goal.trajectory)), trajectory)
            self._following[name] = following
            start_s = self.twin.time_s
        self._taken(name, goal.trajectory)
        try:
            feedback = FollowJointTrajectory.Feedback(joint_names=list(follower.joint_names))
            while rclpy.ok() and not self._stop.is_set():
                with self._lock:
                    now = self.twin.time_s
                    measured = self._measured(name)
                    desired = follower.desired_q.copy()
                    token, trajectory = following.token, following.trajectory
                    replaced = (
                        self._following.get(name) is not following
                        or follower.active_token() not in (token, None)
                        or self.controllers[name] is not follower
                    )
                    trip = controllers.reflex.tripped if name == "arm" and not replaced else None
                    # how far along, in the trajectory's own time (it runs at the arm's speed scaling)
                    elapsed = follower.elapsed_s(token, now)
                    elapsed = now - start_s if elapsed is None else elapsed
                if goal_handle.is_cancel_requested:
                    if not replaced:  # a goal another goal replaced no longer commands the arm
                        with self._lock:
                            follower.hold(measured)  # stop where the arm is, within one control period
                    goal_handle.canceled()
                    result.error_string = "canceled: holding the current position"
                    return result
                if replaced or (trip is not None and trip.time_s >= start_s):
                    if replaced:
                        self.get_logger().info(f"{name}: goal preempted at {now:.3f} s (started {start_s:.3f} s)")
                        result.error_code = FollowJointTrajectory.Result.INVALID_GOAL
                        result.error_string = "preempted by a newer trajectory or a reset"
                    else:  # the reflex stopped the arm: it holds where it stopped
                        result.error_code = FollowJointTrajectory.Result.PATH_TOLERANCE_VIOLATED
                        result.error_string = trip.message
                    goal_handle.abort()
                    return result
                feedback.header.stamp = stamp_msg(now)
                feedback.desired = JointTrajectoryPoint(positions=desired.tolist())
                feedback.actual = JointTrajectoryPoint(positions=measured.tolist())
                feedback.error = JointTrajectoryPoint(positions=(desired - measured).tolist())
                goal_handle.publish_feedback(feedback)
                if elapsed >= trajectory.duration_s:
                    error = np.abs(trajectory.positions[-1] - measured)
                    if np.all(error <= tol):
                        goal_handle.succeed()
                        result.error_code = FollowJointTrajectory.Result.SUCCESSFUL
                        return result
                    if elapsed > trajectory.duration_s + time_tol:
                        worst = int(np.argmax(error - tol))
                        goal_handle.abort()
                        result.error_code = FollowJointTrajectory.Result.GOAL_TOLERANCE_VIOLATED
                        result.error_string = (
                            f"{follower.joint_names[worst]} ended {error[worst]:.4f} from its goal "
                            f"(tolerance {tol[worst]:.4f})"
                        )
                        return result
                time.sleep(1.0 / ACTION_MONITOR_RATE_HZ)
            goal_handle.abort()
            result.error_string = "twin shutting down"
            return result
        finally:
            with self._lock:
                if self._following.get(name) is following:
                    del self._following[name]

    # ------------------------------------------------------------------------------ physics
    def _physics_loop(self) -> None:
        """Step the twin at the configured real-time factor and publish its sensors (sim-time rates)."""
        pace = {"wall0": time.monotonic(), "sim0": None}
        while not self._stop.is_set():
            try:
                self._tick(pace)
            except RCLError:
                if not rclpy.ok(context=self.context):
                    return  # shutting down
                raise

    def _tick(self, pace: dict) -> None:
        rtf = float(self.get_parameter("real_time_factor").value)
        trip = None
        if self._grants is not None and self.twin is not None:
            next_ns = round((self.twin.time_s + self.twin.model.opt.timestep) * 1e9)
            began = time.monotonic()
            if self._grants.wait(next_ns, self._stop, self._commanders, on_hold=self._publish_held_state):
                pace["sim0"] = None  # waited for its commander: real time is counted again from here
                waited = time.monotonic() - began
                if waited > SLOW_GRANT_S:
                    self.get_logger().warning(
                        f"waited {waited:.1f} s for the sim time granted by the backend commanding the arm "
                        "(lockstep; a backend that was killed holds the twin until DDS notices it has gone)",
                        throttle_duration_sec=5.0,
                    )
        with self._lock:
            twin = self.twin
            if self.fault:  # nothing moves until a reset
                pace["sim0"] = None
                self._stop.wait(0.05)
                return
            if pace["sim0"] is None or twin.time_s < pace["sim0"]:  # first tick or after a reset
                pace["wall0"], pace["sim0"] = time.monotonic(), twin.time_s
            try:
                trip = self.controllers.step(twin)
            except SimulationFault as exc:
                self.fault = str(exc)
                self.get_logger().error(
                    f"simulation fault (infrastructure, not a task outcome): {exc}; stopped until the next reset"
                )
                return
            now = twin.time_s
            frames = self._publish_due(twin, trip)
        if trip is not None:
            self.get_logger().warning(trip.message)  # outside the lock: rclpy's logger inspects the stack
        if frames:
            self._publish_cameras(frames, now)
        if rtf > 0:
            ahead = (now - pace["sim0"]) / rtf - (time.monotonic() - pace["wall0"])
            if ahead > 0:
                time.sleep(ahead)
            else:  # behind: let the node's callbacks run at every step (see main); the twin runs slower than real time
                time.sleep(YIELD_WHEN_BEHIND_S)
            if ahead < -MAX_LAG_S:  # stalled (CPU starved, paused): carry on from now, never fast-forward
                self.get_logger().warning(
                    f"fell {-ahead:.2f} s behind real time; continuing from now", throttle_duration_sec=5.0
                )
                pace["wall0"], pace["sim0"] = time.monotonic(), now

    def _publish_due(self, twin: Twin, trip: ReflexTrip | None) -> dict[str, CameraFrame] | None:
        """Publish what is due at this step (sim-time rates; diagnostics at once on a reflex trip); returns the
        camera frames when they are due (published outside the lock)."""
        now = twin.time_s
        if trip is not None:
            self._trips += 1
        if trip is not None or time.monotonic() >= self._next_diagnostics:
            self._next_diagnostics = time.monotonic() + DIAGNOSTICS_PERIOD_S
            self._publish_diagnostics(now, trip)
        if now >= self._next_state:
            self._publish_state(twin)
        if now >= self._next_tf:
            self._next_tf = now + 1.0 / self.get_parameter("tf_rate_hz").value
            self._publish_tf(twin)
        camera_hz = self.get_parameter("camera_rate_hz").value
        if camera_hz > 0 and now >= self._next_camera:
            self._next_camera = now + 1.0 / camera_hz
            return twin.observe()
        return None

    def _publish_held_state(self) -> None:
        """Lockstep: the twin stops to wait for a grant. Its commander grants past the states it receives, so
        it must have the state the twin stopped at (the next scheduled one may lie past the grant)."""
        with self._lock:
            if self.twin is not None and self._state_published_s != self.twin.time_s:
                self._publish_state(self.twin)

    def _publish_state(self, twin: Twin) -> None:
        """Joint states, wrench, clock and speed scaling at the twin's time; the next are due a state period on."""
        self._state_published_s = twin.time_s
        self._next_state = twin.time_s + 1.0 / self.get_parameter("state_rate_hz").value
        stamp = stamp_msg(twin.time_s)
        self.clock_pub.publish(Clock(clock=stamp))
        d, m = twin.data, twin.model
        names = [*self.profile.arm_joints, *self.profile.finger_joints]
        qadr = [m.joint(j).qposadr[0] for j in names]
        dadr = [m.joint(j).dofadr[0] for j in names]
        self.joint_pub.publish(
            JointState(
                header=Header(stamp=stamp, frame_id=""),
                name=names,
                position=[float(d.qpos[a]) for a in qadr],
                velocity=[float(d.qvel[a]) for a in dadr],
                effort=[float(d.qfrc_actuator[a]) for a in dadr],
            )
        )
        wrench = twin.wrist_wrench()
        msg = WrenchStamped(header=Header(stamp=stamp, frame_id=self.profile.hand_frame))
        msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = map(float, wrench.force_n)
        msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = map(float, wrench.torque_nm)
        self.wrench_pub.publish(msg)
        if self.scaling_pub is not None:  # in the profile's unit, as UR's broadcaster (percent)
            full = robot.SPEED_SCALING_UNITS[self.interfaces.speed_scaling_unit]
            self.scaling_pub.publish(Float64(data=self.controllers.arm.speed_scaling * full))

    def _publish_diagnostics(self, now: float, trip: ReflexTrip | None) -> None:
        """The arm's force reflex for operators (rqt_robot_monitor) and benchmarks: its threshold, the external
        force now, the peak since the current motion armed it, and how often it fired."""
        reflex = self.controllers.reflex
        tripped = trip or reflex.tripped
        status = DiagnosticStatus(
            level=DiagnosticStatus.WARN if tripped else DiagnosticStatus.OK,
            name="twin: arm force reflex",
            hardware_id="captain_ros_twin",
            message=tripped.message if tripped else f"armed at {reflex.threshold_n:.1f} N",
            values=[
                KeyValue(key="threshold_n", value=f"{reflex.threshold_n:.3f}"),
                KeyValue(key="external_force_n", value=f"{reflex.external_force_n:.3f}"),
                KeyValue(key="peak_force_n", value=f"{reflex.peak_force_n:.3f}"),
                KeyValue(key="trips", value=str(self._trips)),
            ],
        )
        self.diagnostics_pub.publish(DiagnosticArray(header=Header(stamp=stamp_msg(now)), status=[status]))

    def _publish_tf(self, twin: Twin) -> None:
        """Every robot link, and the cameras' links and optical frames as CALIBRATED (what a calibrated robot
        publishes; the rendered cameras differ by the start state's calibration error), relative to the base."""
        stamp = stamp_msg(twin.time_s)
        m, d = twin.model, twin.data
        base, moving = self.profile.base_frame, self._moving_links
        transforms = []

        def add(child: str, pos: np.ndarray, quat: np.ndarray) -> None:
            t = TransformStamped(header=Header(stamp=stamp, frame_id=base), child_frame_id=child)
            t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = map(float, pos)
            t.transform.rotation.w, t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z = map(
                float, quat
            )
            transforms.append(t)

        cameras = twin.camera_transforms()  # the cameras' links and optical frames, as calibrated
        for b in range(1, m.nbody):
            name = m.body(b).name
            if name in moving and name not in cameras:
                add(name, d.xpos[b], d.xquat[b])
        for frame, (pos, rotation) in cameras.items():
            add(frame, pos, quat_wxyz(rotation))
        self.tf_pub.publish(TFMessage(transforms=transforms))

    def _publish_cameras(self, frames: dict[str, CameraFrame], now: float) -> None:
        stamp = stamp_msg(now)
        for cam, frame in frames.items():
            pubs = self.camera_pubs.get(cam)
            if pubs is None:
                continue
            header = Header(stamp=stamp, frame_id=self.profile.camera_frames[cam])
            pubs["color"].publish(image_msg(header, frame.rgb, "rgb8"))
            pubs["depth"].publish(image_msg(header, frame.depth_m.astype("<f4"), "32FC1"))
            info = camera_info(frame, header)
            pubs["info"].publish(info)
            pubs["depth_info"].publish(info)

    def stop_work(self) -> None:
        """Ctrl-C or SIGTERM (captain_ros.ros.spin): the simulation loop and the goals being followed end."""
        self._stop.set()
        if self._grants is not None:
            self._grants.wake()

    def destroy_node(self) -> None:
        self.stop_work()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        with self._lock:
            if self.twin is not None:
                self.twin.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> None:
    """The physics loop and the node's callbacks share one interpreter. On a loaded machine the loop runs behind
    real time without sleeping, and a callback thread waited for the interpreter lock at each of the hundreds of
    hand-overs a goal takes (5 ms apiece by default): goals were taken up to 0.7 s of sim time after they came, and
    began part-way along. Behind real time the loop now leaves YIELD_WHEN_BEHIND_S to the callbacks at every step
    (the twin runs slower than real time rather than deaf), and the lock changes hands every SWITCH_INTERVAL_S."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    spin(TwinNode, args)


if __name__ == "__main__":
    main()

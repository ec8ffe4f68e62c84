"""motion_node: the harness core as a ROS 2 lifecycle node, driving a ros2_control arm (or twin_node).

  /harness/move_to      captain_interfaces/action/MoveTo     feedback every few periods; cancel holds the arm
  /harness/call         captain_interfaces/srv/HarnessCall   any capability by name, JSON keyword arguments
  /harness/receipts     captain_interfaces/msg/CallResult    every result, whichever way it was called, and
                                                             every MoveTo goal rejected (with the reason)
  /harness/stop         std_srvs/Trigger                     halt within one control period; motions refused
  /harness/resume       std_srvs/Trigger                     accept motions again
  /harness/new_episode  std_srvs/Trigger                     fresh budgets, log and gate (message: episode id)
  /harness/gate         std_srvs/Trigger                     read-only: would finish() be accepted now, and if
                                                             not, the gate's objections (success = none)
  /agent/heartbeat      std_msgs/Empty                       the agent is alive (watchdog; see `watchdog`)
  /captain/markers      visualization_msgs/MarkerArray       each motion's planned TCP sweep just before it runs
                                                             (ns 'planned') and its executed path (ns 'motions')
  /safety/...                                                the safety supervisor (ros/safety.py): e-stop
                                                             service and topic, clear_estop, approval mode
                                                             (approve, approval_requests), state, and the
                                                             workspace box on /captain/markers
  ~/change_state, ~/get_state, ...                           the standard lifecycle services (/motion/...)

Lifecycle (ROS 2 managed node): configure = read the parameters, load the robot profile and connect: every
interface the profile names must be there (joint states, the trajectory controller's action server and topic,
the wrench publisher, the gripper's interface, the force-reflex and speed-scaling interfaces where named)
within `connect_timeout_s`, else the transition fails, the log names what is missing and the node stays
unconfigured; activate = build the harness (kept across deactivate/activate: the episode and its budgets go
on) and accept goals and calls; deactivate = stop the running motion, hold the arm and refuse goals and calls
("motion node is inactive: activate it"); cleanup and shutdown release the arm. With `autostart` (the default)
the node configures and activates itself at start-up, so `ros2 run` and the launch files work as they always
did: its services appear once it is active (a client that waits for them waits for a connected arm), and it
exits with status 1 if it cannot connect. Managed by an operator:

    ros2 run captain_ros motion_node --ros-args -p autostart:=false
    ros2 lifecycle set /motion configure   # connect; `ros2 lifecycle get /motion` says where it is
    ros2 lifecycle set /motion activate    # accept goals; `deactivate` holds the arm, `cleanup` lets it go

Then the harness services exist from start-up and refuse with the node's state until it is active.

Calls run one at a time (one arm); stop, resume, cancel and lifecycle transitions never wait for a running
call. Each kind of callback has its callback group: calls (one at a time: calls waiting for the arm wait in the
middleware's queue, not in executor threads), the MoveTo action, the safety services, the state subscriptions
(heartbeat, receipts) and the lifecycle services (rclpy puts them in the node's default group, which holds
nothing else); the arm's joint states and wrench arrive on the backend's own node and thread. A MoveTo goal
that arrives while another call holds the arm is rejected; the action protocol carries no reason for a
rejection, so the reason goes to the log and, as a CallResult with the goal's call_id, to the receipts topic.
The core never raises: every failure is a CallResult with its category, also on the receipts topic.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from geometry_msgs.msg import Point
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.action import CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from std_msgs.msg import Empty
from std_srvs.srv import Trigger
from visualization_msgs.msg import Marker, MarkerArray

from captain_interfaces.action import MoveTo
from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import HarnessCall
from captain_ros.core import robot
from captain_ros.core.clock import ForwardClock
from captain_ros.core.config import load_config
from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.moveit_scene import SceneCheckError
from captain_ros.core.operator_markers import planned_sweep_marker
from captain_ros.harness.approval import load_supervisor_config
from captain_ros.harness.backend import BackendError
from captain_ros.harness.harness import Harness
from captain_ros.harness.motion import MotionProgress, StopReason, SweepPlan, Watchdog
from captain_ros.harness.shadow import ShadowError
from captain_ros.paths import config_path
from captain_ros.ros.convert import call_result_to_msg
from captain_ros.ros.description import resolve_profile
from captain_ros.ros.grippers import ACTION_TYPES as GRIPPER_ACTION_TYPES
from captain_ros.ros.grippers import GRASP_ACTION_TYPE
from captain_ros.ros.guard import GuardedActionServer, GuardedNode
from captain_ros.ros.operator_view import marker_msg
from captain_ros.ros.ros2_control_backend import HORIZON_S, LOCKSTEP_STATE_TIMEOUT_S, Ros2ControlBackend
from captain_ros.ros.safety import SafetySupervisor

WAIVER = "allow_unchecked_self_collision"  # the parameter that runs a description whose collision geometry won't load

FEEDBACK_EVERY_S = 0.05
HALT_WAIT_S = 10.0  # deactivation: how long the running call may take to end after its stop


def move_to_kwargs(goal: MoveTo.Goal, base_frame: str) -> dict:
    """MoveTo goal -> move_to keyword arguments (zeros and empty strings mean 'the default')."""
    kwargs: dict = {}
    if goal.target_kind == MoveTo.Goal.TARGET_POSE:
        frame = goal.pose.header.frame_id
        if frame not in ("", base_frame):
            raise ValueError(f"pose.header.frame_id must be '' or '{base_frame}', got '{frame}'")
        p, o = goal.pose.pose.position, goal.pose.pose.orientation
        kwargs["pose"] = {"position": [p.x, p.y, p.z], "quaternion": [o.x, o.y, o.z, o.w]}
    elif goal.target_kind == MoveTo.Goal.TARGET_JAW:
        kwargs["gripper"] = goal.jaw_command or goal.jaw_opening_m
    else:
        raise ValueError(f"target_kind must be TARGET_POSE (0) or TARGET_JAW (1), got {goal.target_kind}")
    if goal.mode:
        kwargs["mode"] = goal.mode
    for name in ("speed_mps", "duration_s", "force_limit_n"):
        if getattr(goal, name) != 0.0:
            kwargs[name] = getattr(goal, name)
    return kwargs


class MotionNode(GuardedNode, LifecycleNode):
    def __init__(self) -> None:
        super().__init__("motion")
        describe = ParameterDescriptor
        self.declare_parameter(
            "autostart",
            True,
            describe(
                description="configure and activate at start-up (exit 1 if the arm is not there); false = wait "
                "for `ros2 lifecycle set /motion configure|activate`"
            ),
        )
        self.declare_parameter(
            "connect_timeout_s",
            30.0,
            describe(description="configure: how long to wait for the robot description and the arm's interfaces"),
        )
        # read at configure time: while unconfigured an operator may still change them
        self.declare_parameter(
            "robot_profile",
            str(robot.DEFAULT_PROFILE),
            describe(description="robot profile: a name in config/robots/ or a path to a profile YAML"),
        )
        self.declare_parameter("safety_config", str(config_path("safety.yaml")), describe(description="safety limits"))
        self.declare_parameter(
            "harness_config", str(config_path("harness.yaml")), describe(description="motion, budget and gate settings")
        )
        self.declare_parameter(
            "control_period_s", 0.01, describe(description="monitoring period; the joint-state period of the arm")
        )
        self.declare_parameter(
            "state_timeout_s",
            0.5,
            describe(description="a joint state or wrench older than this (wall time) = link or force sensing lost"),
        )
        self.declare_parameter(
            "lockstep_state_timeout_s",
            LOCKSTEP_STATE_TIMEOUT_S,
            describe(
                description="the same limit against a twin in lockstep, which cannot move while unheard (a busy host "
                "slows it down): only a twin that stopped altogether is a lost link"
            ),
        )
        self.declare_parameter(
            "sweep_horizon_s",
            HORIZON_S,
            describe(
                description="the arm controller is given a sweep this far ahead of what this node last sent, "
                "renewed every 20 ms by the motion loop: if this node dies or stalls, the arm runs at most "
                "this much further along the sweep, then stops within stop_decel_radps2 (0 = send sweeps whole: "
                "the controller then finishes a sweep whatever happens to this node)"
            ),
        )
        self.declare_parameter(
            "wrench_max_lag_s",
            0.25,
            describe(description="a wrench stamped further than this from the joint states = stale force data"),
        )
        self.declare_parameter(
            "watchdog", True, describe(description="hold the arm when /agent/heartbeat and calls go silent")
        )
        self.declare_parameter(
            "watchdog_timeout_s",
            0.0,
            describe(description="silence that trips the watchdog; 0 = safety.yaml's watchdog_timeout_s"),
        )
        self.declare_parameter(
            "approval_mode",
            False,
            describe(
                description="every physical action waits for an operator's approval (/safety/approve or "
                "`captain-ros approve`); settable at run time"
            ),
        )
        self.declare_parameter(
            "shadow_check",
            False,
            describe(
                description="play every physical action first in a twin built from what the robot measured, and "
                "refuse it when the twin predicts a collision of the arm, a force over the limit or an object pushed "
                "off the table (harness/shadow.py); real_arm.launch.py turns it on; harness.yaml's shadow.enabled "
                "turns it on too"
            ),
        )
        self.declare_parameter(
            "estop_deadline_s",
            0.0,
            describe(
                description="the /safety/estop topic must speak at least this often (steady time), else the e-stop "
                "engages and cannot be cleared until it speaks again, released (a dead button bridge fails closed); "
                "0 = no deadline; settable at run time; real_arm.launch.py: 0.5"
            ),
        )
        self.declare_parameter(
            "allow_unchecked_self_collision",  # WAIVER
            False,
            describe(
                description="configure refuses a robot description whose collision geometry cannot be loaded here "
                "(meshes by package:// URIs that no AMENT_PREFIX_PATH package holds, or none at all): self-collision "
                "would go unchecked. true runs anyway, with the check on what loaded; the log names what did not"
            ),
        )
        self.declare_parameter(
            "use_moveit",
            False,
            describe(
                description="check every sweep in MoveIt's planning scene before it runs (move_group's "
                "/check_state_validity along the sweep; measured objects added to the scene, removed when stale): "
                "configure needs the profile's interfaces.moveit services, and a move_group that does not answer "
                "refuses the sweep"
            ),
        )
        self.declare_parameter(
            "approval_timeout_s",
            0.0,
            describe(
                description="approval mode: no answer within this (wall time) fails the call and the arm "
                "holds; 0 = safety.yaml's supervisor.approval_timeout_s"
            ),
        )
        self.autostart = bool(self.get_parameter("autostart").value)
        # the node's clock (sim time with the twin): the watchdog and the wall-time budget mean the same at any
        # real-time factor; ForwardClock ignores the jump back to 0 when the twin resets
        self.clock = ForwardClock(lambda: self.get_clock().now().nanoseconds * 1e-9)
        self.profile: robot.RobotProfile | None = None  # set by configure
        self.config = None
        self.backend: Ros2ControlBackend | None = None
        self.watchdog: Watchdog | None = None
        self.harness: Harness | None = None  # built by the first activation after configure
        self.kinematics: Kinematics | None = None  # the profile's, its self-collision geometry checked (configure)
        self.moveit = None  # ros/move_group_scene.open_scene's MoveItScene or MoveItPyScene with use_moveit
        self.failure = ""  # why the last transition failed (the lifecycle service's reply is only a bool)
        self._state = "unconfigured"  # this node's lifecycle state, for the reasons it gives
        self._active = False  # goals and calls are accepted
        self._halt_reason = ""  # why running motions are being stopped (deactivation)
        self._busy = threading.Lock()
        self._goal_lock = threading.Lock()
        self._goal_reserved = ""  # call_id (or '-') of the MoveTo goal accepted and not yet finished
        self._goal = None  # the MoveTo goal being executed
        self._last_feedback = 0.0
        self._serving = False
        self.receipts = self.create_publisher(CallResultMsg, "/harness/receipts", 50)
        self.markers = self.create_publisher(MarkerArray, "/captain/markers", 10)
        # e-stop, approval and their state: served from start-up, in every lifecycle state
        self.safety = SafetySupervisor(self, self._on_estop, ReentrantCallbackGroup())
        self.safety.set_estop_deadline(float(self.get_parameter("estop_deadline_s").value))
        if not self.autostart:
            self._serve()  # managed: the services exist from the start and say why they refuse

    # ------------------------------------------------------------------------------ lifecycle
    def start_up(self) -> str:
        """`autostart`: configure, then activate; returns why that failed ('' = active)."""
        for name, transition in (("configure", self.trigger_configure), ("activate", self.trigger_activate)):
            if transition() != TransitionCallbackReturn.SUCCESS:
                return self.failure or f"{name} failed"
        return ""

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Connect to the arm the profile describes and check that every interface it names is there."""
        self._state, self.failure = "configuring", ""
        try:
            self._connect()
        except Exception as exc:  # any failure: the transition fails and says why
            self.failure = f"configure failed: {exc}"
            self.get_logger().error(f"{self.failure}; the node stays unconfigured")
            self._release()
            self._state = "unconfigured"
            return TransitionCallbackReturn.FAILURE
        self._state = "inactive"
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._state, self.failure = "activating", ""
        try:
            if self.harness is None:
                self.harness = Harness(
                    self.backend,
                    self.config,
                    kinematics=self.kinematics,
                    clock=self.clock,
                    watchdog=self.watchdog,
                    approver=self.safety.approver,
                    estop=self.safety.estop,
                )
                if self.get_parameter("shadow_check").value and not (self.profile.twin or self.profile.shadow_twin):
                    self.get_logger().warning(
                        f"shadow check OFF: robot profile '{self.profile.name}' has no twin and names no shadow_twin, "
                        "so there is no twin to play its actions in; every other check stands (shadow_check:=false "
                        "says you know; a profile with a shadow_twin turns the check on)"
                    )
                elif self.get_parameter("shadow_check").value:
                    self.harness.enable_shadow()
                    twin = self.harness.shadow.profile.name
                    self.get_logger().info(
                        f"shadow check on: every physical action is first played in the {twin} twin, built from "
                        "this episode's measurements"
                    )
                self.harness.on_progress = self._feedback
                self.harness.scene = self.moveit
                self.harness.executor.on_plan = lambda plan, harness=self.harness: self._show_plan(harness, plan)
                self.harness.new_episode(uuid.uuid4().hex)
            tcp = self.harness.kin.forward(self.backend.read_state(require_force=False).q_rad)[0]
        except (BackendError, ShadowError) as exc:
            self.harness = None
            self.failure = f"activate failed: {exc}"
            self.get_logger().error(f"{self.failure}; the node stays inactive")
            self._state = "inactive"
            return TransitionCallbackReturn.FAILURE
        if self.watchdog is not None:
            self.watchdog.feed()  # a silence while inactive is no reason to stop the first motion
        self._halt_reason = ""
        self._state, self._active = "active", True
        self._serve()  # with autostart, the services appear only now: clients waiting for them wait for the arm
        self.get_logger().info(
            f"harness ready on {self.backend.name}: tcp at {np.round(tcp, 3)} m, "
            f"episode {self.harness.episode_id}, watchdog {'on' if self.watchdog else 'off'}, "
            f"approval mode {'on' if self.safety.approver.enabled else 'off'}"
        )
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._state = "deactivating"
        self._halt("the motion node was deactivated: the arm holds")
        self._state = "inactive"
        self.get_logger().warning("deactivated: the arm holds; goals and calls are refused until activate")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._state = "cleaningup"
        self._release()
        self._state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._state = "shuttingdown"
        if self._active:
            self._halt("the motion node is shutting down: the arm holds")
        self._release()
        self._state = "finalized"
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self._active:
            self._halt("the motion node failed a transition: the arm holds")
        self._release()
        self._state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def _connect(self) -> None:
        param = self.get_parameter
        timeout_s = float(param("connect_timeout_s").value)
        if not timeout_s > 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {timeout_s}")
        deadline = time.monotonic() + timeout_s
        self.profile = resolve_profile(self, param("robot_profile").value, timeout_s=timeout_s)
        own_work = time.monotonic()
        self.kinematics = self._check_collision_geometry(self.profile)
        self.config = load_config(Path(param("safety_config").value), Path(param("harness_config").value))
        # loading meshes and building the collision models is this node's own work, seconds on a busy host: it is
        # not time the arm's bring-up was given to appear, so the wait for the interfaces below does not lose it
        deadline += time.monotonic() - own_work
        # the graph first: a backend subscribing to a topic of another type would fail with the RMW's words
        wrong, missing = self._wait_for_interfaces(deadline)
        if wrong:
            raise BackendError(
                f"robot profile '{self.profile.name}': {'; '.join(wrong)} (does the profile name the right "
                "interfaces, and this vendor's gripper command?)"
            )
        if missing:
            raise BackendError(
                f"robot profile '{self.profile.name}': nothing behind {'; '.join(missing)} within {timeout_s:g} s "
                "(is the arm's bring-up running, with these controllers active?)"
            )
        if self.profile.interfaces.franka is not None:  # before anything moves: franka_hardware refuses it mid-motion
            from captain_ros.ros.franka import apply_settings

            settings = apply_settings(
                self, self.profile.interfaces.franka, self.profile.payload, max(deadline - time.monotonic(), 5.0)
            )
            self.get_logger().info(settings)
        elif self.profile.payload.mass_kg > 0:  # only franka_hardware's SetLoad is sent; say so rather than drop it
            self.get_logger().warning(
                f"robot profile '{self.profile.name}' declares a payload of {self.profile.payload.mass_kg:g} kg, which "
                "this stack sends only to franka_hardware: set it on the arm itself (UR: the teach pendant's "
                "installation, or the driver's set_payload service) so that its own force estimate and protective "
                "stops account for it"
            )
        self.backend = Ros2ControlBackend(
            self,
            self.profile,
            control_period_s=float(param("control_period_s").value),
            state_timeout_s=float(param("state_timeout_s").value),
            lockstep_state_timeout_s=float(param("lockstep_state_timeout_s").value),
            wrench_max_lag_s=float(param("wrench_max_lag_s").value),
            stop_decel_radps2=self.config.safety.stop_decel_radps2,
            horizon_s=float(param("sweep_horizon_s").value),
        )
        self.backend.wait_for_state(max(deadline - time.monotonic(), 1.0))
        self.backend.wait_for_servers(max(deadline - time.monotonic(), 1.0))
        if param("use_moveit").value:
            self._connect_moveit(max(deadline - time.monotonic(), 1.0))
        watchdog_s = float(param("watchdog_timeout_s").value) or self.config.safety.watchdog_timeout_s
        self.watchdog = Watchdog(watchdog_s, clock=self.clock) if param("watchdog").value else None
        self.safety.configure(
            load_supervisor_config(Path(param("safety_config").value)),
            self.config.safety,
            self.profile.base_frame,
            approval_mode=bool(param("approval_mode").value),
            approval_timeout_s=float(param("approval_timeout_s").value),
            cell_timeout_s=self.config.agent.cell_timeout_s,
        )

    def _connect_moveit(self, timeout_s: float) -> None:
        """use_moveit: MoveIt's planning scene through moveit-py or move_group's services, as the profile's
        interfaces.moveit.api chooses (logged); the services must answer, moveit-py's model must hold the planning
        group (configure fails naming what is missing otherwise)."""
        settings = self.profile.interfaces.moveit
        if settings is None:
            raise BackendError(
                f"use_moveit: robot profile '{self.profile.name}' names no interfaces.moveit (planning_group and "
                "move_group's services); add them or run with use_moveit:=false"
            )
        from captain_ros.ros.move_group_scene import open_scene  # moveit_msgs only where MoveIt is used

        try:  # interfaces.moveit.api: moveit-py in this process, or move_group's services (core/moveit_scene.py)
            self.moveit = open_scene(self, settings, self.profile.arm_joints, self.profile.base_frame)
        except SceneCheckError as exc:
            raise BackendError(f"use_moveit: {exc}") from exc
        missing = self.moveit.missing(timeout_s)
        if missing:
            where = (
                f"moveit_py has no {'; '.join(missing)} (is {settings.moveit_py_params_file or 'its params file'} "
                f"the MoveIt configuration of '{self.profile.name}'?)"
                if self.moveit.api == "moveit_py"
                else f"nothing behind {'; '.join(missing)} within {timeout_s:.0f} s (is move_group running with the "
                f"MoveIt configuration of '{self.profile.name}', planning group '{settings.planning_group}'?)"
            )
            raise BackendError(f"use_moveit: {where}")
        self.get_logger().info(
            f"MoveIt planning scene on ({self.moveit.api}, interfaces.moveit.api {settings.api}): every sweep "
            f"checked through {self.moveit.validity_name} (group "
            f"'{settings.planning_group}', up to {settings.max_states} states, {settings.timeout_s:g} s), measured "
            f"objects kept through {self.moveit.apply_name}"
            + (
                f"; move_to targets {settings.free_space_min_m:g} m or farther planned through {self.moveit.plan_name}"
                f" ({settings.pipeline_id}{'/' + settings.planner_id if settings.planner_id else ''})"
                if settings.free_space_min_m > 0
                else ""
            )
        )

    def _check_collision_geometry(self, profile: robot.RobotProfile) -> Kinematics:
        """The profile's kinematics, once its self-collision check is known to work on the description's geometry
        (core/collision.py) or the operator waived it by name."""
        kinematics = Kinematics(profile=profile)
        model = kinematics.collision
        problems = model.coverage_problems()
        srdf = f"SRDF {profile.srdf_file}" if profile.srdf_text else "no SRDF: pairs touching at home skipped"
        if not problems:
            self.get_logger().info(
                f"self-collision: {len(model.parts)} links with geometry, {len(model.pairs)} pairs checked ({srdf})"
            )
            return kinematics
        listed = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        if not self.get_parameter(WAIVER).value:
            raise BackendError(
                f"robot profile '{profile.name}': self-collision cannot be checked on this description: {listed}. "
                "Source the workspace that installs the arm's description package (its meshes resolve through "
                f"AMENT_PREFIX_PATH), or set {WAIVER}:=true to run with the check on what loaded"
            )
        self.get_logger().warning(
            f"self-collision partly UNCHECKED ({WAIVER} is true): {listed}; {len(model.pairs)} pairs "
            f"checked among {len(model.parts)} links with geometry"
        )
        return kinematics

    def required_interfaces(self) -> list[tuple[str, object]]:
        """(what, check) for every interface the profile names; check() is '' when it is there with the type this
        node speaks, 'absent', or why its type is wrong."""
        interfaces = self.profile.interfaces
        topic, service = self.resolve_topic_name, self.resolve_service_name

        def typed(name: str, expected: str, count, names_and_types):
            def check() -> str:
                if count(name) == 0:
                    return "absent"
                types = sorted({t for n, ts in names_and_types() if n == name for t in ts})
                if types and expected not in types:
                    return f"{name} is {' and '.join(types)}, not {expected}"
                return ""

            return check

        def publisher(name: str, expected: str):
            return typed(name, expected, self.count_publishers, self.get_topic_names_and_types)

        def subscriber(name: str, expected: str):
            return typed(name, expected, self.count_subscribers, self.get_topic_names_and_types)

        def server(name: str, expected: str):
            return typed(name, expected, self.count_services, self.get_service_names_and_types)

        def action(name: str, expected: str):  # an action server serves its send_goal service (clients only call it)
            return server(f"{topic(name)}/_action/send_goal", f"{expected}_SendGoal")

        joints = topic(interfaces.joint_states_topic)
        trajectory = topic(interfaces.trajectory_topic)
        wrench = topic(interfaces.wrench_topic)
        needed = [
            (f"{joints} (no joint state publisher)", publisher(joints, "sensor_msgs/msg/JointState")),
            (
                f"{topic(interfaces.trajectory_action)} (no FollowJointTrajectory server)",
                action(interfaces.trajectory_action, "control_msgs/action/FollowJointTrajectory"),
            ),
            (
                f"{trajectory} (no trajectory subscriber: the hold/stop path)",
                subscriber(trajectory, "trajectory_msgs/msg/JointTrajectory"),
            ),
            (f"{wrench} (no wrench publisher: force sensing)", publisher(wrench, "geometry_msgs/msg/WrenchStamped")),
        ]
        gripper = interfaces.gripper
        if gripper.command == "joint_trajectory":  # the controller's topic next to the action (as grippers.py)
            fingers = topic(gripper.action.rsplit("/", 1)[0] + "/joint_trajectory")
            needed.append(
                (
                    f"{fingers} (no gripper trajectory subscriber)",
                    subscriber(fingers, "trajectory_msgs/msg/JointTrajectory"),
                )
            )
        elif self.profile.has_gripper:  # an arm without a gripper names no gripper interface (profile validation)
            needed.append(
                (
                    f"{topic(gripper.action)} (no {gripper.command} gripper server)",
                    action(gripper.action, GRIPPER_ACTION_TYPES[gripper.command]),
                )
            )
        if gripper.grasp_action:
            needed.append(
                (f"{topic(gripper.grasp_action)} (no grasp server)", action(gripper.grasp_action, GRASP_ACTION_TYPE))
            )
        if gripper.joint_states_topic:
            finger_states = topic(gripper.joint_states_topic)
            needed.append(
                (
                    f"{finger_states} (no gripper joint state publisher)",
                    publisher(finger_states, "sensor_msgs/msg/JointState"),
                )
            )
        if interfaces.speed_scaling_topic:
            scaling = topic(interfaces.speed_scaling_topic)
            needed.append((f"{scaling} (no speed scaling publisher)", publisher(scaling, "std_msgs/msg/Float64")))
        if interfaces.franka is not None:
            from captain_ros.ros.franka import (
                COLLISION_BEHAVIOR_TYPE,
                CONTROLLER_MANAGER_SERVICES,
                ERROR_RECOVERY_TYPE,
                ROBOT_STATE_TYPE,
                SET_LOAD_TYPE,
            )

            franka = interfaces.franka
            for name, kind, what in (
                (franka.collision_behavior_service, COLLISION_BEHAVIOR_TYPE, "collision thresholds"),
                (franka.set_load_service, SET_LOAD_TYPE, "payload"),
            ):
                needed.append((f"{service(name)} (no franka_hardware {what} service)", server(service(name), kind)))
            state = topic(franka.robot_state_topic)
            needed.append(
                (f"{state} (no franka_robot_state_broadcaster: the robot mode)", publisher(state, ROBOT_STATE_TYPE))
            )
            needed.append(
                (
                    f"{topic(franka.error_recovery_action)} (no franka_hardware error recovery server)",
                    action(franka.error_recovery_action, ERROR_RECOVERY_TYPE),
                )
            )
            manager = franka.controller_manager.rstrip("/")
            for key, (_, kind) in CONTROLLER_MANAGER_SERVICES.items():
                name = service(f"{manager}/{key}")
                needed.append((f"{name} (no controller_manager service: the recovery)", server(name, kind)))
        if interfaces.ur_status is not None:
            from captain_ros.ros.ur_status import ROBOT_MODE_TYPE, SAFETY_MODE_TYPE

            for name, kind in (
                (interfaces.ur_status.robot_mode_topic, ROBOT_MODE_TYPE),
                (interfaces.ur_status.safety_mode_topic, SAFETY_MODE_TYPE),
                (interfaces.ur_status.program_running_topic, "std_msgs/msg/Bool"),
            ):
                needed.append(
                    (f"{topic(name)} (no io_and_status_controller: the UR's state)", publisher(topic(name), kind))
                )
        if interfaces.force_reflex is not None:
            reflex = service(interfaces.force_reflex.parameter_service)
            needed.append(
                (f"{reflex} (no force reflex parameter service)", server(reflex, "rcl_interfaces/srv/SetParameters"))
            )
        return needed

    def _wait_for_interfaces(self, deadline: float) -> tuple[list[str], list[str]]:
        """Poll the ROS graph (discovery takes a moment) until every interface is there. Returns (of the wrong type,
        missing): a wrong type ends the wait at once, as this node cannot speak to it."""
        needed = self.required_interfaces()
        while True:
            found = [(what, check()) for what, check in needed]
            wrong = [f"{why} ({what.split(' (', 1)[1]}" for what, why in found if why not in ("", "absent")]
            missing = [what for what, why in found if why == "absent"]
            if wrong or not missing or time.monotonic() > deadline:
                return wrong, missing
            time.sleep(0.1)

    def _halt(self, reason: str) -> None:
        """Refuse goals and calls, stop the running motion (if any) and hold the arm. Does not wait on the call
        queue: the stop is asked for again every few milliseconds until the running call has ended (a call that
        was just starting clears stop requests made before its motion began)."""
        self._active, self._halt_reason = False, reason
        self.safety.approver.withdraw("the motion node stopped serving")  # a call waiting for an operator ends
        deadline = time.monotonic() + HALT_WAIT_S
        while not self._busy.acquire(timeout=0.02):
            if self.harness is not None:
                self.harness.stop_signal.request(StopReason.SAFETY_STOP)
            if time.monotonic() > deadline:
                self.get_logger().error(f"the running call did not end within {HALT_WAIT_S:g} s of the stop")
                break
        else:
            self._busy.release()
        if self.backend is None:
            return
        try:
            self.backend.hold()
        except BackendError as exc:
            self.get_logger().error(f"{reason}, but the hold failed: {exc}")

    def _release(self) -> None:
        """Let go of the arm: no harness, no backend (its node and thread end)."""
        self._active = False
        self.harness = self.kinematics = None
        moveit, self.moveit = self.moveit, None
        if moveit is not None:
            moveit.close()
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()

    def refusal(self) -> str:
        """Why goals and calls are refused now ('' = they are accepted)."""
        if self._active:
            return ""
        return (
            f"motion node is {self._state}: activate it "
            f"(ros2 lifecycle set {self.get_fully_qualified_name()} {'activate' if self.backend else 'configure'})"
        )

    def _refused(
        self, capability: str, reason: str, call_id: str = "", category: FailureCategory = FailureCategory.SAFETY_STOP
    ) -> CallResult:
        """A call or goal refused before it reached the harness (nothing moved): published and logged like any
        result. While the node is not active the arm holds (safety_stop, as for the stop service)."""
        result = CallResult.fail(capability, category, reason)
        if call_id:
            result.call_id = call_id
        if self.harness is not None:
            result.episode_id = self.harness.episode_id
        self.receipts.publish(call_result_to_msg(result, time.time()))
        self.get_logger().warning(f"{capability} refused: {reason}")
        return result

    def _serve(self) -> None:
        """Create the harness services and the MoveTo action (once)."""
        if self._serving:
            return
        self._serving = True
        calls = MutuallyExclusiveCallbackGroup()  # waiting calls queue in the middleware, not in threads
        safety = ReentrantCallbackGroup()  # stop, resume, new episode, gate
        motion = ReentrantCallbackGroup()  # MoveTo goals, cancels and the running goal
        states = ReentrantCallbackGroup()  # heartbeat and receipts
        self.create_service(HarnessCall, "/harness/call", self._on_call, callback_group=calls)
        self.create_service(Trigger, "/harness/stop", self._on_stop, callback_group=safety)
        self.create_service(Trigger, "/harness/resume", self._on_resume, callback_group=safety)
        self.create_service(Trigger, "/harness/new_episode", self._on_new_episode, callback_group=safety)
        self.create_service(Trigger, "/harness/gate", self._on_gate, callback_group=safety)
        self.create_subscription(Empty, "/agent/heartbeat", self._on_heartbeat, 10, callback_group=states)
        # perception runs in the perception node: its results count as verification for the completion gate
        self.create_subscription(CallResultMsg, "/harness/receipts", self._on_receipt, 50, callback_group=states)
        self._action = GuardedActionServer(
            self,
            MoveTo,
            "/harness/move_to",
            execute_callback=self._execute_move_to,
            goal_callback=self._on_goal,
            cancel_callback=self._on_cancel,
            callback_group=motion,
        )

    # ------------------------------------------------------------------------------ calls
    def run(self, capability: str, kwargs: dict, call_id: str = "") -> CallResult:
        """One harness call, serialized with all others; published on the receipts topic."""
        refusal = self.refusal()
        if refusal:
            return self._refused(capability, refusal, call_id)
        harness = self.harness
        engagements = self.safety.estop.engagements
        if not self._busy.acquire(timeout=120.0):
            result = CallResult.fail(capability, FailureCategory.TIMEOUT, "another call held the arm for 120 s")
        else:
            try:
                refusal = self.refusal()  # deactivated while this call waited for the arm
                if refusal:
                    return self._refused(capability, refusal, call_id)
                if self.watchdog is not None:
                    self.watchdog.feed()
                harness = self.harness  # cleanup may drop it once the arm is free: _show uses this one
                result = harness.call(capability, **kwargs)
            finally:
                self._busy.release()
        if self._halt_reason and result.failure_category is FailureCategory.SAFETY_STOP:
            result.message = f"{result.message} ({self._halt_reason})"
        self.safety.annotate(result, engagements)
        if call_id:
            result.call_id = call_id
        self.receipts.publish(call_result_to_msg(result, time.time()))
        if result.executed and isinstance(result.value, dict) and "motion_id" in result.value:
            self._show(result, harness)
        text = result.receipt or f"{capability}: {result.failure_category.value}: {result.message}"
        if result.success:  # rclpy forbids one logging call site from changing severity
            self.get_logger().info(text)
        else:
            self.get_logger().warning(text)
        return result

    def _show(self, result: CallResult, harness: Harness) -> None:
        """The executed TCP path of a motion in rviz (/captain/markers, namespace 'motions'): green when it
        reached its target, orange when it stopped early."""
        record = harness.motions[result.value["motion_id"] - 1]
        line = Marker(ns="motions", id=record.motion_id, type=Marker.LINE_STRIP, action=Marker.ADD)
        line.header.frame_id = harness.profile.base_frame
        line.points = [
            Point(x=float(r.tcp_m[0]), y=float(r.tcp_m[1]), z=float(r.tcp_m[2])) for r in record.outcome.trace
        ]
        line.scale.x = 0.004
        line.color.r, line.color.g, line.color.b, line.color.a = (
            (0.2, 0.9, 0.2, 1.0) if result.success else (1.0, 0.5, 0.0, 1.0)
        )
        self.markers.publish(MarkerArray(markers=[line]))

    def _show_plan(self, harness: Harness, plan: SweepPlan) -> None:
        """The TCP sweep a motion is about to run, in rviz (/captain/markers, namespace 'planned'), with the id
        its result's motion_id will have (calls run one at a time: the next one). Published before the arm
        moves and by the publisher of the executed paths, so a subscriber sees each plan before its path."""
        try:
            spec = planned_sweep_marker(len(harness.motions) + 1, plan.tcp_waypoints, harness.profile.base_frame)
            self.markers.publish(MarkerArray(markers=[marker_msg(spec)]))
        except Exception as exc:  # a display must never stop a motion
            self.get_logger().error(f"the planned sweep could not be published: {exc}")

    def _on_call(self, request: HarnessCall.Request, response: HarnessCall.Response) -> HarnessCall.Response:
        try:
            kwargs = json.loads(request.args_json or "{}")
            if not isinstance(kwargs, dict):
                raise ValueError(f"args_json must be a JSON object, got {type(kwargs).__name__}")
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            result = CallResult.fail(request.capability, FailureCategory.INVALID_ARGUMENT, f"bad args_json: {exc}")
            result.call_id = request.call_id or result.call_id
            harness = self.harness
            result.episode_id = harness.episode_id if harness is not None else ""
            self.receipts.publish(call_result_to_msg(result, time.time()))
        else:
            result = self.run(request.capability, kwargs, request.call_id)
        response.result = call_result_to_msg(result, time.time())
        return response

    # ------------------------------------------------------------------------------ MoveTo action
    def _execute_move_to(self, goal_handle) -> MoveTo.Result:
        try:
            try:
                kwargs = move_to_kwargs(goal_handle.request, self.profile.base_frame if self.profile else "")
            except ValueError as exc:
                result = CallResult.fail("move_to", FailureCategory.INVALID_ARGUMENT, str(exc))
                self.receipts.publish(call_result_to_msg(result, time.time()))
            else:
                self._goal = goal_handle
                try:
                    result = self.run("move_to", kwargs, goal_handle.request.call_id)
                finally:
                    self._goal = None
        finally:
            with self._goal_lock:
                self._goal_reserved = ""
        if result.success:
            goal_handle.succeed()
        elif result.failure_category is FailureCategory.CANCELED and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        else:
            goal_handle.abort()
        return MoveTo.Result(result=call_result_to_msg(result, time.time()))

    def _on_goal(self, goal: MoveTo.Goal) -> GoalResponse:
        """One motion at a time: a goal that arrives while one runs is rejected, not queued in a thread. The
        action protocol's reply carries no reason: it goes to the log and the receipts topic (goal's call_id)."""
        reason, category = self.refusal() or self.safety.estop.refusal(), FailureCategory.SAFETY_STOP
        if not reason:
            category = FailureCategory.INVALID_ARGUMENT  # one goal at a time: this one was sent too early
            with self._goal_lock:
                if self._goal_reserved:
                    reason = (
                        f"another MoveTo goal (call_id {self._goal_reserved}) is running: wait for its result "
                        "or cancel it"
                    )
                elif self._busy.locked():
                    reason = "a harness call holds the arm: send the goal when it has finished"
                else:
                    self._goal_reserved = goal.call_id or "-"
                    return GoalResponse.ACCEPT
        self._refused("move_to", f"MoveTo goal rejected: {reason}", goal.call_id, category)
        return GoalResponse.REJECT

    def _on_cancel(self, goal_handle) -> CancelResponse:
        harness = self.harness
        if self._goal is goal_handle and harness is not None:
            harness.cancel()
        return CancelResponse.ACCEPT

    def _feedback(self, progress: MotionProgress) -> None:
        goal, now = self._goal, time.monotonic()
        if goal is None or now - self._last_feedback < FEEDBACK_EVERY_S:
            return
        self._last_feedback = now
        goal.publish_feedback(MoveTo.Feedback(**vars(progress)))  # same field names, same units

    # ------------------------------------------------------------------------------ safety services
    def _on_estop(self, source: str) -> None:
        """The e-stop latched (the supervisor withdrew any pending approval): signal the running motion, which
        holds at its next control period, or hold an idle arm. Never waits for the running call."""
        harness, backend = self.harness, self.backend
        if harness is not None:
            harness.stop_signal.request(StopReason.SAFETY_STOP)
        if backend is not None and not self._busy.locked():
            try:
                backend.hold()
            except BackendError as exc:
                self.get_logger().error(f"e-stop engaged by {source}, but the hold failed: {exc}")

    def _on_stop(self, _request, response: Trigger.Response) -> Trigger.Response:
        """Accepted in every state where this node commands the arm (a stop latched while inactive still holds
        after activation); unconfigured, it commands no arm and says so."""
        harness, backend = self.harness, self.backend
        if backend is None:
            response.success, response.message = False, f"{self.refusal()}: this node commands no arm"
            return response
        if harness is not None:
            harness.stop()  # the running motion holds at its next control period
        if not self._busy.locked():
            try:
                backend.hold()
            except BackendError as exc:
                response.success, response.message = False, f"stop requested but hold failed: {exc}"
                return response
        if harness is None:  # configured, never activated: nothing to latch, nothing moves until activation
            response.success, response.message = True, "stopped: the arm holds (the node is not active)"
            return response
        self.get_logger().warning("STOP: motions refused until /harness/resume")
        response.success, response.message = True, "stopped: the arm holds; call /harness/resume to continue"
        return response

    def _on_resume(self, _request, response: Trigger.Response) -> Trigger.Response:
        harness = self.harness
        if harness is None:
            response.success, response.message = False, self.refusal() or "no harness"
            return response
        harness.resume()
        self.get_logger().info("resumed: motions accepted")
        response.success, response.message = True, "resumed" + (f"; but {self.refusal()}" if self.refusal() else "")
        return response

    def _on_gate(self, _request, response: Trigger.Response) -> Trigger.Response:
        refusal, harness = self.refusal(), self.harness
        if refusal or harness is None:
            response.success, response.message = False, refusal or "no harness"
            return response
        try:
            objections = harness.gate_objections()
        except BackendError as exc:
            response.success, response.message = False, f"the gate cannot judge: {exc}"
            return response
        response.success = not objections
        response.message = "; ".join(objections) or "finish() would be accepted"
        return response

    def _on_new_episode(self, _request, response: Trigger.Response) -> Trigger.Response:
        if self.refusal():
            response.success, response.message = False, self.refusal()
            return response
        if not self._busy.acquire(timeout=5.0):
            response.success, response.message = False, "a call is running; try again when it has finished"
            return response
        try:
            refusal = self.refusal()
            if refusal:
                response.success, response.message = False, refusal
                return response
            self.harness.new_episode(uuid.uuid4().hex)
            response.success, response.message = True, self.harness.episode_id
        finally:
            self._busy.release()
        return response

    def _on_receipt(self, msg: CallResultMsg) -> None:
        harness = self.harness
        if harness is not None and hasattr(harness.perception, f"_{msg.capability}"):  # never our own results
            harness.note_external_call(msg.capability, msg.success)
            if harness.scene is not None and msg.success:  # measured objects into MoveIt's scene
                try:
                    harness.note_measurement(msg.capability, json.loads(msg.value_json or "null"))
                    harness.sync_scene()
                except (SceneCheckError, ValueError, KeyError) as exc:
                    self.get_logger().warning(f"MoveIt scene: {msg.capability} result not applied yet: {exc}")
            if harness.shadow is not None and msg.success:  # the perception node's measurements shape the shadow
                known = set(harness.shadow.measured)
                try:
                    harness.shadow.note(msg.capability, json.loads(msg.value_json or "null"))
                except (ShadowError, json.JSONDecodeError) as exc:
                    self.get_logger().warning(f"shadow check: {msg.capability} result left out: {exc}")
                for name in set(harness.shadow.measured) - known:
                    m = harness.shadow.measured[name]
                    size = "x".join(f"{s * 100:.1f}" for s in m.size_m)
                    self.get_logger().info(
                        f"shadow check: measured {name} ({m.kind} {size} cm at ({m.pose[0]:.3f}, {m.pose[1]:.3f}) m); "
                        f"{len(harness.shadow.measured)} object(s) in the shadow twin"
                    )

    def _on_heartbeat(self, _msg: Empty) -> None:
        if self.watchdog is not None:
            self.watchdog.feed()

    def stop_work(self) -> None:
        """Ctrl-C or SIGTERM (captain_ros.ros.spin): the running motion halts and the arm holds, while the context
        still carries the stop to the arm."""
        if self._active:
            self.get_logger().warning("the motion node is stopping (Ctrl-C or SIGTERM): halting the arm first")
            self._halt("the motion node is stopping (Ctrl-C or SIGTERM): the arm holds")

    def destroy_node(self) -> None:
        self._release()
        super().destroy_node()


def main(args: list[str] | None = None) -> None:
    """Spin in this thread; with `autostart`, configure and activate from a helper thread (the transitions wait
    for the arm while the executor serves the node). Ctrl-C and SIGTERM halt the arm before the node goes
    (captain_ros.ros.spin: `stop_work`, then the executor, the node and the context, in that order).

    The thread that spun is the one that shuts down, so no thread still waits on the node while the
    executor and the node go away (a spinner thread of its own made Ctrl-C crash the process now and
    then: SIGSEGV, or "terminate called without an active exception").
    """
    from captain_ros.ros.spin import close, init, request_stop, spin_until_stopped

    init(args)
    node: MotionNode | None = None
    executor: MultiThreadedExecutor | None = None
    failed: list[str] = []
    try:
        node = MotionNode()
        # threads for: a running MoveTo, a queued call, a lifecycle transition, stop/cancel, heartbeat, receipts
        executor = MultiThreadedExecutor(num_threads=8)
        executor.add_node(node)

        def start_up(node: MotionNode = node) -> None:
            failure = node.start_up()
            if failure:
                node.get_logger().fatal(failure)
                failed.append(failure)
                request_stop()  # ends the spin below

        if node.autostart:
            threading.Thread(target=start_up, name="start_up", daemon=True).start()
        else:
            node.get_logger().info(
                f"unconfigured (autostart:=false): ros2 lifecycle set {node.get_fully_qualified_name()} configure"
            )
        spin_until_stopped(executor)
    except KeyboardInterrupt:
        pass
    finally:
        close(executor, node)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

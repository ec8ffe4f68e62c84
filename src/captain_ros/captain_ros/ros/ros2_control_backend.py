"""The real-arm backend: drives any ros2_control arm through its standard interfaces.

In:  sensor_msgs/JointState (joint_state_broadcaster), geometry_msgs/WrenchStamped (the wrist F/T, or the
     vendor's external-wrench estimate; subscribed with the profile's `wrench_qos`) in any frame of the arm's
     description, or in one that /tf connects to it (UR's tool0_controller: /tf is then subscribed too): it is
     expressed in the hand frame the harness assumes, from the message's own frame, at the message's stamp.
Out: control_msgs/action/FollowJointTrajectory to the arm's joint_trajectory_controller, a sweep a short horizon
     at a time (`horizon_s`, 0.05 s of the sweep by default): the goal carries its first stretch, ending in a stop
     ramp (core.trajectory.horizon_piece), and while the harness's motion loop runs, every `REFRESH_S` of the arm's
     clock the next stretch goes out on the controller's JointTrajectory topic, stamped where the running one is,
     so it replaces it from there without a step (the goal stays the controller's active goal, judged against the
     newest trajectory, as joint_trajectory_controller does). The controller interpolates at its own rate, so the
     arm moves as smoothly as with the whole sweep; but if this process dies or stalls mid-sweep, the controller
     runs at most `horizon_s` (plus the stretch's lead) further along the sweep and then ramps to rest by itself.
     A motion loop that comes back after the arm passed its cut gets a BackendError: the sweep is over, it stopped.
     `horizon_s=0` sends each sweep whole (the controller then finishes it whatever happens to this process).
     Stops go out on the controller's JointTrajectory topic (a topic message replaces the
     running trajectory at once): a ramp that decelerates the setpoint to rest within the safety config's
     `stop_decel_radps2`, first point one control period ahead, stamped with the joint state it starts from
     (`hold`, `_send_stop_ramp`). The speed scaling topic, where the profile names one (UR), is followed: the
     backend's copy of the controller runs trajectories at that fraction of the clock, and reports how far
     along they are (`trajectory_time_s`). The jaw is driven through the gripper interface the profile names
     (captain_ros.ros.grippers: a JointTrajectory topic, GripperCommand, ParallelGripperCommand or franka_gripper's
     Move/Grasp), and its opening is always the measured one: from the fingers in the arm's joint states, or from
     the gripper's own joint states topic where the profile names one (franka_gripper).
The backend runs its own copy of the controller's interpolation (`TrajectoryFollower`) to know what
the arm is being commanded at any time. Periods are paced by the measured state's stamps (sim
time on the twin, hardware time on a robot), so the harness runs at any real-time factor. A state
older than `state_timeout_s` (wall clock) means the link is lost: BackendError, reported as
backend_error, and the harness then holds: the backend cancels the running goal and commands its last
setpoint (the state stream may be lost while commands still get through).
Force sensing fails closed the same way: no wrench yet, a wrench older than `state_timeout_s`, one whose
stamp is more than `wrench_max_lag_s` away from the joint states', or one in a frame that neither the
description nor /tf relates to the hand is a BackendError, so a silent or misconfigured sensor refuses motion
and stops a running one instead of reading as 0 N.
Against the MuJoCo twin (a profile with a twin section) the backend runs in lockstep with it
(captain_ros.twin.lockstep): it grants the twin sim time as joint states come, and stamps each goal and stop ramp at
a time the twin has not reached yet, so they run exactly as computed however busy the host is.
Every name (joints, frames, topics, actions) comes from the robot profile (captain_ros.core.robot).
Where the profile names it (`force_reflex`), the arm's own force reflex is set before each motion through
that node's parameter service; a goal the controller aborts because the reflex fired is an ArmReflexStop.
A vendor's own state fails closed too: a UR's robot and safety modes (captain_ros.ros.ur_status), a Franka's robot
mode (captain_ros.ros.franka: a silent robot state or a mode other than IDLE and MOVE refuses motion and ends a
running one, naming why); `recover_vendor` runs the Franka's recovery after a reflex (the policy's `recover` asks for
it when `vendor_fault` says the arm needs it).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Duration
from control_msgs.action import FollowJointTrajectory
from geometry_msgs.msg import WrenchStamped
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64, Header
from trajectory_msgs.msg import JointTrajectory as JointTrajectoryMsg
from trajectory_msgs.msg import JointTrajectoryPoint

from captain_ros.core import robot
from captain_ros.core.clock import StampedHistory
from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.trajectory import REST_RADPS, JointTrajectory, TrajectoryFollower, horizon_piece
from captain_ros.core.wrench import REFLEX_ABORT_PREFIX, change_frame
from captain_ros.harness.backend import ArmBackend, ArmReflexStop, ArmState, BackendError
from captain_ros.ros.convert import stamp_msg, stamp_msg_ns
from captain_ros.ros.frames import FrameBuffer, FrameError, Transform, stamp_ns
from captain_ros.ros.grippers import FingerStates, make_gripper
from captain_ros.ros.guard import GuardedNode
from captain_ros.ros.spin import SpunActionClient, spin_until_shutdown
from captain_ros.twin import lockstep

REFLEX_FORCE = re.compile(r"external force ([0-9.]+) N")
_LINKS = itertools.count()  # numbers each backend's own node
LOCKSTEP_STATE_TIMEOUT_S = 20.0  # the link-loss limit against a twin in lockstep (see Ros2ControlBackend.link_limit_s)


class _LinkNode(GuardedNode, Node):
    """The backend's own node: a callback that raises drops its message instead of ending the arm's state stream."""


WRENCH_HISTORY_S = 0.5  # wrenches kept for /tf to reach, by their stamps, at least (and as long as wrench_max_lag_s)
GOAL_LEAD_FIRST_S = 0.2  # a goal's start stamp ahead of the arm's clock before any goal round trip was measured
GOAL_LEAD_MAX_S = 1.0  # never further ahead: a goal that takes longer to arrive begins part-way along
GOAL_LEAD_PER_LAG = 2.0  # the lead over the slowest recent round trip (which the joint states' own delay shortens)
GOAL_LAGS_KEPT = 8  # the lead covers the slowest of the last goals' round trips
HORIZON_S = 0.05  # how much of a sweep the controller has beyond the newest stretch sent (see the module doc)
FRANKA_STATE_GRACE_S = 0.1  # wait_period: how much longer a Franka's robot state may take to be judged at link loss
REFRESH_S = 0.02  # arm time between stretches: a motion loop may stall 0.03 s before the arm starts to stop


@dataclass
class _Sweep:
    """The sweep being given to the controller a stretch at a time."""

    trajectory: JointTrajectory
    offset_s: float  # the sweep's time at the running stretch's time zero
    cut_s: float  # the sweep's time where the running stretch's stop begins
    final: bool  # the running stretch reaches the sweep's end
    refresh_at_s: float  # the arm's clock time at which the next stretch is due


def _duration(seconds: float) -> Duration:
    ns = round(seconds * 1e9)
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def _stamp_s(msg: JointState | WrenchStamped) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def trajectory_msg(trajectory: JointTrajectory) -> JointTrajectoryMsg:
    velocities = trajectory.velocities
    return JointTrajectoryMsg(
        joint_names=list(trajectory.joint_names),
        points=[
            JointTrajectoryPoint(
                positions=trajectory.positions[i].tolist(),
                velocities=[] if velocities is None else velocities[i].tolist(),
                time_from_start=_duration(float(t)),
            )
            for i, t in enumerate(trajectory.times_s)
        ],
    )


class Ros2ControlBackend(ArmBackend):
    name = "ros2_control"

    def __init__(
        self,
        node: Node,
        profile: robot.RobotProfile,
        *,
        control_period_s: float = 0.01,
        state_timeout_s: float = 0.5,
        server_timeout_s: float = 5.0,
        wrench_max_lag_s: float = 0.25,
        stop_decel_radps2: float | None = None,
        goal_lead_min_s: float = 0.05,
        lockstep_state_timeout_s: float = LOCKSTEP_STATE_TIMEOUT_S,
        horizon_s: float = HORIZON_S,
    ):
        """`node` is the host: its namespace and remappings name the arm's interfaces. The backend talks to the
        arm through a node of its own, spun by a thread of its own, so the arm's state keeps flowing however
        busy the host's executor is (every one of its threads waiting for the arm, say); close() stops it.
        `stop_decel_radps2`: the stop ramps' deceleration limit (default: config/safety.yaml's).
        `goal_lead_min_s`: the least a goal is stamped ahead of the arm's clock (see `follow`).
        `lockstep_state_timeout_s`: the link-loss limit (wall time) while a twin runs in lockstep with this backend,
        in place of `state_timeout_s` (see `link_limit_s`).
        `horizon_s`: how much of a sweep the controller is given beyond the newest stretch (0: sweeps go whole)."""
        decel = load_config().safety.stop_decel_radps2 if stop_decel_radps2 is None else float(stop_decel_radps2)
        if not decel > 0:  # also refuses NaN
            raise ValueError(f"stop_decel_radps2 must be > 0 rad/s^2, got {stop_decel_radps2}")
        self.stop_decel_radps2 = decel
        if not 0 <= goal_lead_min_s <= GOAL_LEAD_MAX_S:  # also refuses NaN
            raise ValueError(f"goal_lead_min_s must be in [0, {GOAL_LEAD_MAX_S}] s, got {goal_lead_min_s}")
        if not (horizon_s >= 0 and np.isfinite(horizon_s)):  # also refuses NaN
            raise ValueError(f"horizon_s must be finite and >= 0 s (0: sweeps go whole), got {horizon_s}")
        self.horizon_s = float(horizon_s)
        self._sweep: _Sweep | None = None  # the sweep given a stretch at a time (follow, _extend_sweep)
        self.node, self.profile = node, profile
        interfaces = profile.interfaces
        topic, service = node.resolve_topic_name, node.resolve_service_name
        link = _LinkNode(
            f"{node.get_name()}_arm_link_{next(_LINKS)}",
            context=node.context,
            use_global_arguments=False,  # the host's remappings are already in the resolved names
            start_parameter_services=False,
        )
        self._link, self._executor = link, SingleThreadedExecutor(context=node.context)  # short callbacks
        self._executor.add_node(link)
        self._period = control_period_s
        self._timeout = state_timeout_s
        if not lockstep_state_timeout_s >= state_timeout_s:  # also refuses NaN
            raise ValueError(
                f"lockstep_state_timeout_s must be >= state_timeout_s ({state_timeout_s} s), "
                f"got {lockstep_state_timeout_s}"
            )
        self._lockstep_timeout = lockstep_state_timeout_s
        self._server_timeout = server_timeout_s
        self._wrench_max_lag = wrench_max_lag_s
        self._goal_lead_min_s = goal_lead_min_s
        self._goal_lags: deque[float] = deque(maxlen=GOAL_LAGS_KEPT)  # arm seconds from sending a goal to its accept
        self._cond = threading.Condition()
        self._joints: JointState | None = None
        self._joints_wall = 0.0
        self._wrench: WrenchStamped | None = None  # none until the sensor speaks: motion is refused until then
        self._wrench_wall = 0.0
        self._wrench_topic = topic(interfaces.wrench_topic)
        self._kin = Kinematics(profile=profile)  # expresses wrenches in the hand frame; guarded by _kin_lock
        self._kin_lock = threading.Lock()
        self._frames = {self._kin.model.body(b).name for b in range(1, self._kin.model.nbody)}
        self.lower, self.upper = profile.arm_limits_rad()
        self._mirror: TrajectoryFollower | None = None
        self._goal = None  # the running FollowJointTrajectory goal handle
        self._goal_failure = ""  # set when the controller aborts a goal we did not stop ourselves
        self._goal_failure_wall = 0.0  # when it was set (time.monotonic())
        self._reflex_stop = ""  # set when the controller aborted a goal because the arm's force reflex fired
        self._reflex_holds = False  # the reflex stopped the arm and it holds there, until the next goal
        group = ReentrantCallbackGroup()
        link.create_subscription(
            JointState, topic(interfaces.joint_states_topic), self._on_joints, 10, callback_group=group
        )
        reliability = (
            ReliabilityPolicy.BEST_EFFORT if interfaces.wrench_qos == "best_effort" else ReliabilityPolicy.RELIABLE
        )
        wrench_qos = QoSProfile(depth=10, reliability=reliability)  # a best-effort publisher needs best effort here
        link.create_subscription(WrenchStamped, self._wrench_topic, self._on_wrench, wrench_qos, callback_group=group)
        # a wrench in a frame only /tf knows (UR's tool0_controller) goes to the hand frame through /tf at its own
        # stamp: recent wrenches wait for /tf to reach them; /tf is subscribed when the first such wrench comes
        # as long as a wrench may lag the joint states: /tf reaching a frame later than that fails on the lag anyway
        kept_s = max(WRENCH_HISTORY_S, wrench_max_lag_s)
        stamp_of = lambda m: stamp_ns(m.header.stamp) * 1e-9  # noqa: E731
        self._wrenches = StampedHistory(kept_s, stamp_of, max_items=round(2000 * kept_s))  # up to 2 kHz
        self._tf: FrameBuffer | None = None
        self._tf_group, self._tf_problem = group, ""
        reflex = interfaces.force_reflex
        self._reflex_parameter = reflex.parameter if reflex else ""
        self._reflex_client = (
            link.create_client(SetParameters, service(reflex.parameter_service), callback_group=group)
            if reflex
            else None
        )
        self._reflex_n: float | None = None  # the threshold the arm last accepted
        self._action_name = topic(interfaces.trajectory_action)
        self._arm_action = SpunActionClient(link, FollowJointTrajectory, self._action_name, callback_group=group)
        self._arm_topic = link.create_publisher(JointTrajectoryMsg, topic(interfaces.trajectory_topic), 10)
        # the arm controller's speed scaling (UR): full speed until the topic says otherwise
        self._scaling, self._scaling_topic, self._scaling_seen = 1.0, "", False
        if interfaces.speed_scaling_topic:
            self._scaling_topic = topic(interfaces.speed_scaling_topic)
            link.create_subscription(Float64, self._scaling_topic, self._on_speed_scaling, 10, callback_group=group)
        # a UR's robot and safety modes: a motion is refused, and a running one ends, naming why the arm cannot move
        self._ur = None
        if interfaces.ur_status is not None:
            from captain_ros.ros.ur_status import URStatusWatch

            self._ur = URStatusWatch(link, interfaces.ur_status, topic, group, on_change=self._wake)
        # a Franka's robot mode, and its recovery after a reflex (franka_hardware's, then the controller_manager's)
        self._franka = self._franka_recovery = None
        if interfaces.franka is not None:
            from captain_ros.ros.franka import FrankaRecovery, FrankaStateWatch

            franka = interfaces.franka
            self._franka = FrankaStateWatch(link, topic(franka.robot_state_topic), group, on_change=self._wake)
            self._franka_recovery = FrankaRecovery(link, franka, topic, service, group)
        # the fingers' measured positions: the arm's joint states carry them unless the gripper publishes its own
        finger_topic = topic(interfaces.gripper.joint_states_topic) if interfaces.gripper.joint_states_topic else ""
        apart = bool(finger_topic) and finger_topic != topic(interfaces.joint_states_topic)
        self._finger_states = FingerStates(profile, link, finger_topic, group) if apart else None
        fingers = self._finger_states or FingerStates(profile, clock=link.get_clock())
        self._arm_fingers = None if apart else fingers  # fed from _on_joints
        self._gripper = make_gripper(
            link,
            profile,
            fingers,
            resolve=topic,
            callback_group=group,
            server_timeout_s=server_timeout_s,
            control_period_s=control_period_s,
        )
        # lockstep with the twin: grants on each joint state; the twin's echo of the commands it took up, latched
        self._lockstep: lockstep.Commander | None = None
        if profile.twin is not None:
            self._grant_pub = link.create_publisher(Header, topic(lockstep.GRANT_TOPIC), 10)
            self._lockstep = lockstep.Commander(publish=self._publish_grant)
            echoes = QoSProfile(
                depth=lockstep.TAKEN_DEPTH,
                durability=DurabilityPolicy.TRANSIENT_LOCAL,
                reliability=ReliabilityPolicy.RELIABLE,
            )
            link.create_subscription(Header, topic(lockstep.TAKEN_TOPIC), self._on_taken, echoes, callback_group=group)
        self._spinner = threading.Thread(target=spin_until_shutdown, args=(self._executor,), daemon=True)
        self._spinner.name = "arm-link"
        self._spinner.start()

    # ------------------------------------------------------------------------------ callbacks
    def _on_joints(self, msg: JointState) -> None:
        with self._cond:
            self._joints = msg
            self._joints_wall = time.monotonic()
            self._cond.notify_all()
        if self._arm_fingers is not None:
            self._arm_fingers.update(msg)
        if self._lockstep is not None:
            self._lockstep.on_state(stamp_ns(msg.header.stamp))  # grants the twin a horizon past it

    def _vendor_refusal(self) -> str:
        """Why the vendor's own state forbids motion ('' = it does not): a UR's modes, a Franka's robot state."""
        if self._ur is not None and (why := self._ur.refusal()):
            return why
        if self._franka is not None:
            return self._franka.refusal(self.link_limit_s)
        return ""

    def vendor_fault(self, ask_controllers: bool = False) -> str:
        """Why the arm needs its vendor's recovery ('' = it does not, or this arm has none here): a Franka whose robot
        state is silent (a reflex or a user stop deactivated franka_hardware's controllers) or in a mode other than
        IDLE and MOVE; with `ask_controllers`, also one whose trajectory controller or broadcasters the
        controller_manager lists as not active (right after a reflex, before the robot state counts as silent)."""
        if self._franka is None:
            return ""
        why = self._franka.refusal(self.link_limit_s)
        if not why and ask_controllers:
            inactive = self._franka_recovery.not_active()
            if inactive:
                why = f"the controller_manager lists {', '.join(inactive)} (a reflex or a stop deactivates them)"
        return why

    def recover_vendor(self) -> list[str]:
        """The Franka's recovery (captain_ros.ros.franka.FrankaRecovery.run: error recovery, the hardware component,
        the trajectory controller and broadcasters, confirmed), then a wait until the arm's joint states, its wrench
        and a robot state that allows motion are back; the trajectory controller holds where it was activated, and so
        does this backend's copy of it. Returns what was done; BackendError names the step that failed (the arm holds:
        nothing was commanded)."""
        if self._franka_recovery is None:
            raise BackendError(f"robot profile '{self.profile.name}' names no vendor recovery")
        self._end_sweep()
        with self._cond:
            goal, self._goal, self._goal_failure, self._reflex_stop = self._goal, None, "", ""
        if goal is not None:
            goal.cancel_goal_async()
        done = self._franka_recovery.run()
        limit = max(self._franka_recovery.settings.recovery_step_timeout_s, self.link_limit_s)
        deadline, why = time.monotonic() + limit, ""
        while True:
            try:
                state = self.read_state(require_force=False)
                why = self._franka.refusal(self.link_limit_s)
            except BackendError as exc:
                why = str(exc)
            if not why:
                break
            if time.monotonic() > deadline:
                raise BackendError(
                    f"Franka recovery: the controllers are active again, but within {limit:g} s: {why}; the arm holds"
                )
            with self._cond:
                self._cond.wait(self._period)
        problem = self._wait_for_force(max(0.0, deadline - time.monotonic()))
        if problem:
            raise BackendError(f"Franka recovery: the controllers are active again, but {problem}; the arm holds")
        self._mirror_or_fail().hold(state.q_rad)  # joint_trajectory_controller holds where it was activated
        done.append("arm state back")
        return done

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _publish_grant(self, until_ns: int) -> None:
        self._grant_pub.publish(Header(stamp=stamp_msg_ns(until_ns), frame_id=self._link.get_fully_qualified_name()))

    def _on_taken(self, msg: Header) -> None:
        self._lockstep.on_taken(stamp_ns(msg.stamp))

    def _lockstep_begin(self) -> int | None:
        """Pause the twin's grants for a command; its stamp (ns), or None without lockstep."""
        return None if self._lockstep is None else self._lockstep.begin()

    def _lockstep_end(self, stamp: int | None, sent: bool) -> None:
        """Resume the grants once the twin took the command stamped `stamp` up (`sent`: it went out)."""
        if stamp is None:
            return
        # at most the link-loss limit: a twin that takes longer to answer is lost anyway
        limit = self.link_limit_s
        taken, _ = self._lockstep.end(stamp, sent, limit)
        if sent and not taken:
            self._link.get_logger().warning(
                f"the twin did not echo the command stamped {stamp * 1e-9:.3f} s within {limit} s: grants "
                "resumed without it"
            )

    def _on_speed_scaling(self, msg: Float64) -> None:
        """The controller's speed scaling, in the profile's unit; the mirror runs its trajectory at it from the
        latest joint state's stamp on (the topic has no stamp of its own)."""
        fraction = self.profile.interfaces.speed_scaling_fraction(msg.data)
        if not np.isfinite(fraction):
            self._link.get_logger().warning(
                f"{self._scaling_topic}: speed scaling {msg.data} is not finite: ignored", throttle_duration_sec=5.0
            )
            return
        if not -1e-6 <= fraction <= 1 + 1e-6:
            self._link.get_logger().warning(
                f"{self._scaling_topic}: speed scaling {msg.data} is outside full speed 0..1 in the profile's unit "
                f"'{self.profile.interfaces.speed_scaling_unit}' (is speed_scaling_unit right?): clipped",
                throttle_duration_sec=5.0,
            )
        fraction = float(np.clip(fraction, 0.0, 1.0))
        with self._cond:
            self._scaling, self._scaling_seen = fraction, True
            mirror, joints = self._mirror, self._joints
            self._cond.notify_all()
        if mirror is not None and joints is not None:
            mirror.set_speed_scaling(fraction, _stamp_s(joints))

    def _on_wrench(self, msg: WrenchStamped) -> None:
        frame = msg.header.frame_id
        if self._tf is None and not self._tf_problem and frame != self.profile.hand_frame and frame not in self._frames:
            try:  # created here, in the link's executor, before a reader can see the wrench
                self._tf = FrameBuffer(self._link, callback_group=self._tf_group)
            except ImportError as exc:
                self._tf_problem = f"no transform library ({exc}): install tf2_ros, or pytransform3d"
        with self._cond:
            self._wrench, self._wrench_wall = msg, time.monotonic()
            self._wrenches.append(msg)
            self._cond.notify_all()

    # ------------------------------------------------------------------------------ state
    @property
    def control_period_s(self) -> float:
        return self._period

    @property
    def link_limit_s(self) -> float:
        """How old (wall time) the latest joint state or wrench may be before the link counts as lost.

        A real arm moves whether or not this process hears it, so its states must stay fresh: `state_timeout_s`.
        A twin in lockstep with this backend cannot run more than a grant horizon (20 ms of sim time) past the
        newest state the backend has seen, so a state that comes late only means a busy host that slows the twin
        down, never an arm moving unobserved: there the limit is `lockstep_state_timeout_s` (20 s by default, Fast
        DDS's lease for a participant that is gone), and only a twin that stopped altogether ends the call."""
        follows = self._lockstep is not None and self._lockstep.enabled
        return self._lockstep_timeout if follows else self._timeout

    def wait_for_servers(self, timeout_s: float) -> None:
        """Block until this backend's clients are matched with the arm controller's trajectory action, the force
        reflex's parameter service and the gripper's action servers, at most `timeout_s` in all; BackendError
        naming those that are not. The graph can list a server well before a client made just now is matched with
        it (seconds on a busy host): configure waits for that here, under its connect timeout, rather than leaving
        it to the first goal's short wait, which would fail that motion."""
        deadline = time.monotonic() + timeout_s
        left = lambda: max(deadline - time.monotonic(), 0.0)  # noqa: E731
        missing = [] if self._arm_action.wait_for_server(timeout_sec=left()) else [self._action_name]
        if self._reflex_client is not None and not self._reflex_client.wait_for_service(timeout_sec=left()):
            missing.append(self._reflex_client.srv_name)
        missing += self._gripper.unmatched(left())
        if missing:
            raise BackendError(
                f"no answer from {', '.join(missing)} within {timeout_s:.0f} s (is the controller running?)"
            )

    def wait_for_state(self, timeout_s: float = 10.0, wrench_timeout_s: float | None = None) -> ArmState:
        """Block until the first joint state arrives, then until force sensing is usable (at most
        `wrench_timeout_s`, by default what is left of `timeout_s`); the backend holds wherever the arm is.
        Without usable force data it still returns, with the force NaN and a warning, and read_state()
        refuses motion until it is."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if not self._cond.wait_for(lambda: self._joints is not None, timeout_s):
                raise BackendError(f"no joint states within {timeout_s:.0f} s: is the arm (or twin) running?")
        if self._finger_states is not None and self._finger_states.latest() is None:
            left = max(0.0, deadline - time.monotonic())
            try:
                self._finger_states.wait_newer(0, left)
            except BackendError as exc:
                raise BackendError(f"{exc}: is the gripper running?") from None
        left = max(0.0, deadline - time.monotonic()) if wrench_timeout_s is None else wrench_timeout_s
        problem = self._wait_for_force(left)
        if problem:  # logged outside the lock: rclpy's logger inspects the stack, slowly
            self._link.get_logger().warning(f"{problem}; motions are refused until force sensing works")
        if self._scaling_topic:
            left = max(0.0, deadline - time.monotonic())
            with self._cond:
                heard = self._cond.wait_for(lambda: self._scaling_seen, left)
            if not heard:
                self._link.get_logger().warning(
                    f"no speed scaling on {self._scaling_topic} yet: the arm is taken to run at full speed until it "
                    "comes (a slowed or paused arm then fails its motions as stalled)"
                )
        if self._ur is not None:  # latched: heard at once where io_and_status_controller runs
            left = max(0.0, deadline - time.monotonic())
            with self._cond:
                self._cond.wait_for(self._ur.heard, left)
            if not self._ur.heard():
                raise BackendError(f"{self._ur.refusal()}, waited {timeout_s:.0f} s")
            if why := self._ur.refusal():
                self._link.get_logger().warning(f"{why}: motions are refused until it can move")
        if self._franka is not None:  # 1 kHz where the broadcaster runs: heard at once
            left = max(0.0, deadline - time.monotonic())
            with self._cond:
                self._cond.wait_for(lambda: self._franka.heard_since(0.0), left)
            if why := self._franka.refusal(self.link_limit_s):
                self._link.get_logger().warning(f"{why}: motions are refused until it can move")
        if self._lockstep is not None and not self._lockstep.wait_enabled(deadline - time.monotonic()):
            self._link.get_logger().warning(
                f"the twin has not said it runs in lockstep ({lockstep.TAKEN_TOPIC}): goals are stamped ahead of its "
                "clock until it does (a busy host can then make them start part-way along)"
            )
        state = self.read_state(require_force=False)
        mirror = TrajectoryFollower(self.profile.arm_joints, self.lower, self.upper, state.q_rad)
        with self._cond:
            mirror.set_speed_scaling(self._scaling, state.time_s)
            self._mirror = mirror
        return state

    def _wait_for_force(self, timeout_s: float) -> str:
        """Wait (on new messages) until a full state with usable force data can be read; returns why not, or ''.
        After a reset of the arm's clock (the twin's new episode) the two streams agree again within a message."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.read_state()
                return ""
            except BackendError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    return str(exc)
            with self._cond:
                self._cond.wait(min(left, self._period))

    def read_state(self, require_force: bool = True) -> ArmState:
        with self._cond:
            msg, wall, wrench, wrench_wall = self._joints, self._joints_wall, self._wrench, self._wrench_wall
        if msg is None:
            raise BackendError("no joint state received yet")
        now = time.monotonic()
        age, limit = now - wall, self.link_limit_s
        if age > limit:
            lost = f"the last joint state is {age:.2f} s old (limit {limit} s): link lost"
            why = self._vendor_refusal()  # a Franka after a reflex: its broadcasters stopped with its controllers
            raise BackendError(f"{why} ({lost})" if why else lost)
        index = {n: i for i, n in enumerate(msg.name)}
        try:
            arm = [index[j] for j in self.profile.arm_joints]
        except KeyError as exc:
            raise BackendError(f"joint states lack {exc.args[0]}") from None
        pos, vel = np.asarray(msg.position), np.asarray(msg.velocity)
        if self._finger_states is not None:  # the gripper's own joint states (franka_gripper)
            jaw = self._finger_states.latest()
            jaw = float("nan") if jaw is None else jaw
        else:
            fingers = {j: float(pos[index[j]]) for j in self.profile.finger_joints if j in index}
            jaw = self.profile.jaw_opening_m(fingers) or 0.0  # a mimic finger not reported: symmetric jaw
        q = pos[arm].copy()
        try:
            force, torque = self._hand_wrench(wrench, now - wrench_wall, _stamp_s(msg), q)
        except BackendError:
            if require_force:
                raise
            force = torque = np.full(3, np.nan)
        qd = vel[arm].copy() if len(vel) == len(pos) else np.zeros(len(arm))
        return ArmState(_stamp_s(msg), q, qd, jaw, force, torque)

    def _hand_wrench(
        self, msg: WrenchStamped | None, age_s: float, joints_stamp_s: float, q: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The latest wrench in the hand frame, or BackendError when force sensing cannot be trusted. One in a frame
        of the arm's description is expressed in the hand frame through the kinematics at q; one in a frame only /tf
        knows, through /tf at its own stamp: the newest wrench /tf has reached (as tf2_ros's MessageFilter would
        pass it on), so the frame change is never taken at another time than the force's."""
        topic = self._wrench_topic
        if msg is None:
            raise BackendError(
                f"no wrench received on {topic}: without force sensing motions are refused "
                "(is the force/torque sensor broadcaster running, on that topic?)"
            )
        if age_s > self.link_limit_s:
            raise BackendError(
                f"the last wrench on {topic} is {age_s:.2f} s old (limit {self.link_limit_s} s): force sensing lost"
            )
        hand, frame = self.profile.hand_frame, msg.header.frame_id
        on_tf = frame != hand and frame not in self._frames
        if on_tf:
            msg, to_hand = self._wrench_on_tf(msg)
        lag = joints_stamp_s - _stamp_s(msg)
        if abs(lag) > self._wrench_max_lag:
            raise BackendError(
                f"the {'newest wrench /tf reaches' if on_tf else 'wrench'} on {topic} is stamped {lag:+.3f} s from "
                f"the joint states (limit {self._wrench_max_lag} s): stale force data"
            )
        f, t = msg.wrench.force, msg.wrench.torque
        force, torque = np.array([f.x, f.y, f.z]), np.array([t.x, t.y, t.z])
        if not (np.all(np.isfinite(force)) and np.all(np.isfinite(torque))):
            raise BackendError(f"the wrench on {topic} is not finite: force sensing failed")
        if frame == hand:
            return force, torque
        if on_tf:
            return change_frame(force, torque, to_hand.rotation, to_hand.position_m)
        with self._kin_lock:
            p_hand, r_hand = self._kin.forward(q, hand)
            p_frame, r_frame = self._kin.forward(q, frame)
        return change_frame(force, torque, r_hand.T @ r_frame, r_hand.T @ (p_frame - p_hand))

    def _wrench_on_tf(self, latest: WrenchStamped) -> tuple[WrenchStamped, Transform]:
        """The newest wrench in `latest`'s frame that /tf can express in the hand frame at its own stamp, with
        that transform (the frame's pose in the hand frame); BackendError when there is none."""
        topic, hand, frame = self._wrench_topic, self.profile.hand_frame, latest.header.frame_id
        try:
            if self._tf is None:
                raise FrameError(self._tf_problem or "/tf is not subscribed yet")
            reach = self._tf.lookup(hand, frame)  # at the newest time the whole chain has
            if reach.stamp_ns is None:  # a chain of static transforms: the same at any time
                return latest, reach
            with self._cond:
                kept = [m for m in reversed(self._wrenches) if m.header.frame_id == frame]
            msg = next((m for m in kept if stamp_ns(m.header.stamp) <= reach.stamp_ns), None)
            if msg is None:
                raise FrameError(
                    f"/tf reaches '{frame}' only up to {reach.stamp_ns * 1e-9:.3f} s, before the {len(kept)} wrenches "
                    f"kept (the newest stamped {_stamp_s(latest):.3f} s): is the publisher of '{frame}' late?"
                )
            return msg, self._tf.lookup(hand, frame, msg.header.stamp)
        except FrameError as exc:
            raise BackendError(
                f"the wrench on {topic} is in frame '{frame}', which the arm's description does not have and /tf "
                f"cannot express in {hand}: {exc} (expected {hand}, another link of the arm, or a frame on /tf)"
            ) from None

    def _mirror_or_fail(self) -> TrajectoryFollower:
        if self._mirror is None:
            raise BackendError("the backend has not received a joint state yet (call wait_for_state first)")
        return self._mirror

    def commanded(self) -> tuple[np.ndarray, np.ndarray]:
        mirror = self._mirror_or_fail()
        mirror.update(self.read_state(require_force=False).time_s)
        return mirror.desired_q.copy(), mirror.desired_qd.copy()

    def speed_scaling(self) -> float:
        with self._cond:
            return self._scaling

    def trajectory_time_s(self) -> float | None:
        """The mirror's trajectory time at the latest joint state's stamp: it integrates the speed scaling topic on
        the joint states' stamps as the scaled controller integrates its scaling factor on its own clock (the
        factor sampled at the topic's rate, 100 Hz on UR, which is close enough to judge progress by)."""
        mirror = self._mirror_or_fail()
        elapsed = mirror.elapsed_s(now_s=self.read_state(require_force=False).time_s)
        sweep = self._sweep
        return elapsed if sweep is None or elapsed is None else sweep.offset_s + elapsed

    def capture(self, cameras: tuple[str, ...]) -> dict:
        raise BackendError(
            "cameras are served by the perception node: call perception capabilities on /perception/call"
        )

    def resync(self) -> None:
        """A new episode: after a reset the arm's clock may have jumped, so wait (briefly) until the joint states
        and the wrench agree again before holding where the arm is."""
        self._wait_for_force(self.link_limit_s)
        self._end_sweep()
        self._mirror_or_fail().hold(self.read_state(require_force=False).q_rad)

    def set_force_reflex(self, threshold_n: float) -> bool:
        if self._reflex_client is None:
            return False
        if self._reflex_n == threshold_n:
            return True
        service = self._reflex_client.srv_name
        if not self._reflex_client.wait_for_service(timeout_sec=self._server_timeout):
            raise BackendError(f"the arm's force reflex cannot be set: {service} is not available")
        value = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=float(threshold_n))
        done = threading.Event()
        future = self._reflex_client.call_async(
            SetParameters.Request(parameters=[Parameter(name=self._reflex_parameter, value=value)])
        )
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(self._server_timeout):
            raise BackendError(f"the arm's force reflex cannot be set: {service} did not answer")
        result = future.result().results[0]
        if not result.successful:
            raise BackendError(f"the arm refused force reflex {threshold_n} N: {result.reason}")
        self._reflex_n = threshold_n
        return True

    def close(self) -> None:
        """Stop the backend's own executor and release its node (the host node is the caller's). After a
        shutdown of the context (Ctrl-C, SIGTERM) its spin ends by itself: wait for that before shutting the
        executor down, never while its thread still waits on it."""
        if not self.node.context.ok():
            self._spinner.join(timeout=5.0)
        self._executor.shutdown(timeout_sec=5.0)
        self._spinner.join(timeout=5.0)
        if self._franka is not None:
            self._franka.close()  # its reader node (polled by a timer of the link's, stopped above)
        self._link.destroy_node()

    # ------------------------------------------------------------------------------ commands
    def _arm_clock_s(self) -> float:
        """The arm's clock now: the latest joint state's stamp plus the time since it came (a state read by a busy
        host can be a while old; the arm's clock runs at real time, and a simulator slower than that only makes a
        goal start a little later than it could)."""
        with self._cond:
            msg, wall = self._joints, self._joints_wall
        if msg is None:
            raise BackendError("no joint state received yet")
        return _stamp_s(msg) + (time.monotonic() - wall)

    def goal_lead_s(self) -> float:
        """How far ahead of the arm's clock the next goal is stamped: GOAL_LEAD_PER_LAG times the slowest of the
        last goals' round trips (send to accept, on the arm's clock), within [goal_lead_min_s, GOAL_LEAD_MAX_S]."""
        lead = GOAL_LEAD_PER_LAG * max(self._goal_lags) if self._goal_lags else GOAL_LEAD_FIRST_S
        return min(GOAL_LEAD_MAX_S, max(self._goal_lead_min_s, lead))

    def follow(self, trajectory: JointTrajectory) -> None:
        """Send `trajectory` as a goal stamped a little ahead of the arm's clock (`goal_lead_s`, `_arm_clock_s`):
        the controller starts it at that time on its own clock (header.stamp), and so does this backend's copy of
        it, so both are at the same point of it at every stamp (a goal started "on receipt" would leave the copy a
        transport delay apart, and a stop ramped from the copy's setpoint would then begin with a jump). The lead
        covers the goal's way to the controller: one that arrived after its stamp would begin part-way along, a
        step in the setpoint that the arm feels as a jolt (and its force sensing as a contact) the later it comes.
        The lead follows the measured round trips, so a loaded host stamps further ahead by itself. Against the twin
        in lockstep the goal is stamped at the sim time granted already, which it cannot have passed (no lead).
        With a horizon the goal carries the sweep's first stretch only (`_extend_sweep` sends the rest)."""
        mirror = self._mirror_or_fail()
        if why := self._vendor_refusal():
            raise BackendError(why)
        if not self._arm_action.wait_for_server(timeout_sec=self._server_timeout):
            raise BackendError(f"the arm controller's action server {self._action_name} is not available")
        self._end_sweep()
        state_s = self.read_state(require_force=False).time_s
        piece = horizon_piece(trajectory, 0.0, self.horizon_s, **self._stop_limits()) if self.horizon_s else None
        piece = None if piece is None or piece.final else piece
        msg = trajectory_msg(trajectory if piece is None else piece.trajectory)
        stamp, accepted = self._lockstep_begin(), False
        try:
            if stamp is None:
                sent_s = self._arm_clock_s()
                start_s = sent_s + self.goal_lead_s()
                msg.header.stamp = stamp_msg(start_s)
            else:
                start_s, msg.header.stamp = stamp * 1e-9, stamp_msg_ns(stamp)
            handle = self._send_goal(msg)
            accepted = True
            if piece is not None:
                self._sweep = _Sweep(trajectory, 0.0, piece.cut_s, False, start_s + REFRESH_S)
                self._cap_grants(self._sweep, stamp)
        finally:
            self._lockstep_end(stamp, accepted)
        if stamp is None:
            accepted_s = self._arm_clock_s()
            self._goal_lags.append(accepted_s - sent_s)
            if accepted_s > start_s:
                self._link.get_logger().warning(
                    f"the arm controller accepted the goal {accepted_s - start_s:.3f} s after its start stamp: it "
                    f"begins part-way along; the next goals are stamped {self.goal_lead_s():.3f} s ahead"
                )
        with self._cond:
            self._goal, self._goal_failure, self._reflex_holds = handle, "", False
        handle.get_result_async().add_done_callback(lambda f, h=handle: self._on_result(h, f))
        mirror.update(state_s)
        mirror.start(trajectory if piece is None else piece.trajectory, state_s, start_time_s=start_s)

    def _stop_limits(self) -> dict:
        return {
            "decel_radps2": self.stop_decel_radps2,
            "period_s": self._period,
            "lower": self.lower,
            "upper": self.upper,
        }

    def _cap_grants(self, sweep: _Sweep | None, stamp: int | None) -> None:
        """In lockstep, keep the twin from running past the next stretch's due time (plus two periods) while a
        sweep goes out a stretch at a time: a motion loop the host starves then holds the twin, not the arm's
        sweep (the twin runs only where this backend grants; the real arm has no such wait, and stops)."""
        if self._lockstep is None or (stamp is None and sweep is not None):
            return
        self._lockstep.cap(
            None if sweep is None or sweep.final else round((sweep.refresh_at_s + 2 * self._period) * 1e9)
        )

    def _end_sweep(self) -> None:
        """No sweep goes out a stretch at a time any more (a stop, a hold, a new goal, a new episode)."""
        if self._sweep is not None:
            self._sweep = None
            self._cap_grants(None, None)

    def _extend_sweep(self, state_s: float) -> None:
        """Send the sweep's next stretch once it is due (`REFRESH_S` after the last, on the arm's clock), on the
        controller's topic, stamped with the state's stamp (in lockstep: the time granted already) and starting
        from the sweep's time the running stretch is at then: the controller continues from its setpoint along the
        sweep's own points, without a step, however late the message arrives within the horizon. A running stretch
        already past its cut means the loop came back too late: the arm has stopped by itself, and the sweep is
        over (BackendError; the harness then holds)."""
        sweep = self._sweep
        if sweep is None or sweep.final or state_s + self._period < sweep.refresh_at_s:
            return
        with self._cond:
            if self._goal_failure or self._reflex_stop:
                return  # the goal failed: wait_period reports it (a goal that ended ran out its stretch: below)
        mirror = self._mirror_or_fail()
        stamp, sent = self._lockstep_begin(), False
        try:
            at_s = state_s if stamp is None else stamp * 1e-9
            elapsed = mirror.elapsed_s(now_s=at_s)
            if elapsed is None:
                return
            at = sweep.offset_s + elapsed
            if at >= sweep.cut_s:
                self._sweep = None
                raise BackendError(
                    f"the motion loop sent no stretch of the sweep for {at - sweep.offset_s:.3f} s of it (horizon "
                    f"{self.horizon_s} s): the arm stopped by itself, and the sweep is over"
                )
            piece = horizon_piece(sweep.trajectory, at, self.horizon_s, **self._stop_limits())
            if piece is None:
                sweep.final = True
                return
            mirror.update(at_s)
            msg = trajectory_msg(piece.trajectory)
            msg.header.stamp = stamp_msg(at_s) if stamp is None else stamp_msg_ns(stamp)
            self._arm_topic.publish(msg)
            sent = True
            mirror.start(piece.trajectory, at_s, start_time_s=at_s)
            sweep.offset_s, sweep.cut_s, sweep.final, sweep.refresh_at_s = (
                at,
                piece.cut_s,
                piece.final,
                at_s + REFRESH_S,
            )
            self._cap_grants(sweep, stamp)
        finally:
            self._lockstep_end(stamp, sent)

    def _send_goal(self, msg: JointTrajectoryMsg):
        """Send a trajectory goal and return its handle once accepted (BackendError when it is not)."""
        answered = threading.Event()
        future = self._arm_action.send_goal_async(FollowJointTrajectory.Goal(trajectory=msg))
        future.add_done_callback(lambda _f: answered.set())
        limit = max(self._server_timeout, self.link_limit_s)  # a twin on a busy host answers late, not never
        if not answered.wait(limit):
            raise BackendError(f"the arm controller did not answer the goal within {limit:.0f} s")
        handle = future.result()
        if handle is None or not handle.accepted:
            raise BackendError("the arm controller rejected the trajectory goal")
        return handle

    def _on_result(self, handle, future) -> None:
        response = future.result()
        result = None if response is None else response.result
        with self._cond:
            if self._goal is not handle:
                return  # a goal we stopped or replaced ourselves
            self._goal = None
            if result is not None and result.error_string.startswith(REFLEX_ABORT_PREFIX):
                self._reflex_stop, self._reflex_holds = result.error_string, True
            elif result is not None and result.error_code != FollowJointTrajectory.Result.SUCCESSFUL:
                self._goal_failure = f"error {result.error_code}: {result.error_string or 'no error string'}"
                self._goal_failure_wall = time.monotonic()
            self._cond.notify_all()

    def hold(self, q_rad: np.ndarray | None = None) -> np.ndarray:
        """Stop. Without `q_rad`: the setpoint the controller follows (the mirror's, at the latest joint state's
        stamp) is ramped to rest within `stop_decel_radps2` (`_send_stop_ramp`); returns where the ramp ends. A
        setpoint at rest is held where it is, a hold the controller already has is not sent again.

        After the arm's reflex stopped it, the arm already holds where it stopped: a hold at a position read later
        (a state that may be 10 ms old, taken while the arm rebounded from the contact) would move an arm that
        presses on something, so none is sent, as a real arm in its reflex state takes no position command until
        the next motion. Without a fresh joint state (link lost) nothing can be ramped from where the controller
        is: it is told to hold the last setpoint we commanded, and its goal is canceled (the stop then is a jump,
        but a stop). With `q_rad`: hold that position (one point one period ahead, the goal canceled)."""
        mirror = self._mirror_or_fail()
        self._end_sweep()
        if q_rad is None:
            try:
                state = self.read_state(require_force=False)
            except BackendError:  # no fresh state (link lost): stop at the last setpoint we commanded
                state = None
            with self._cond:
                reflex_holds = self._reflex_holds and self._goal is None
            if reflex_holds:
                mirror.hold(mirror.desired_q if state is None else state.q_rad)
                return mirror.desired_q.copy()
            stamp, sent = (None if state is None else self._lockstep_begin()), False
            try:
                # the ramp starts at the state's stamp, or in lockstep at the granted time the twin has not passed
                at_s = None if state is None else state.time_s if stamp is None else stamp * 1e-9
                q_rad = mirror.desired_q if at_s is None else mirror.update(at_s)
                if state is not None and np.abs(mirror.desired_qd).max(initial=0.0) > REST_RADPS:
                    ramp = self._stop_ramp(q_rad, mirror.desired_qd, self.lower, self.upper)
                    if ramp is None:  # a setpoint gone non-finite cannot be ramped: hold where the arm is
                        q_rad = state.q_rad
                    else:
                        end = self._send_stop_ramp(mirror, ramp, at_s, stamp)
                        sent = True
                        return end
            finally:
                self._lockstep_end(stamp, sent)
        q = np.clip(np.asarray(q_rad, dtype=float), self.lower, self.upper)
        with self._cond:
            # from here on the running goal's abort is ours, and an earlier goal's late failure is superseded
            goal, self._goal, self._goal_failure, self._reflex_stop = self._goal, None, "", ""
        if goal is None and not mirror.desired_qd.any() and np.array_equal(mirror.desired_q, q):
            # already holding exactly there: a repeated hold message could reach the controller after the
            # next trajectory goal (topic and action are separate channels) and cut that goal short
            return q
        point = JointTrajectoryPoint(
            positions=q.tolist(), velocities=[0.0] * len(q), time_from_start=_duration(self._period)
        )
        self._arm_topic.publish(JointTrajectoryMsg(joint_names=list(self.profile.arm_joints), points=[point]))
        if goal is not None:
            goal.cancel_goal_async()
        mirror.hold(q)
        return q

    def _send_stop_ramp(
        self, mirror: TrajectoryFollower, ramp: JointTrajectory, stamp_s: float, stamp_ns: int | None
    ) -> np.ndarray:
        """Send a stop ramp on the controller's trajectory topic, stamped with the time it was computed at (the
        joint state's, or in lockstep `stamp_ns`, exactly).

        The stamp makes the controller run the ramp on its own clock from that state's time (header.stamp is the
        trajectory's start time for joint_trajectory_controller, and for twin_node): however late the message
        arrives, the ramp continues from where the setpoint is, instead of starting a period late from a setpoint
        that has moved on (which would brake harder than the ramp). A controller discards a trajectory that ends
        before it arrives, so the ramp's rest position is repeated `state_timeout_s` later: it still applies if it
        arrives that late (a state older than that is a lost link anyway).

        The running goal is not canceled: joint_trajectory_controller answers a cancel by holding the current
        position at once, the very jump the ramp replaces. The topic message replaces the goal's trajectory (the
        controller, and the twin as it, lets the goal end with the ramp) and this backend no longer listens to that
        goal's result."""
        end = ramp.positions[-1]
        held = JointTrajectory(
            ramp.joint_names,
            np.append(ramp.times_s, ramp.times_s[-1] + max(self._timeout, self._period)),
            np.vstack([ramp.positions, end]),
            np.vstack([ramp.velocities, np.zeros_like(end)]),
        )
        msg = trajectory_msg(held)
        msg.header.stamp = stamp_msg(stamp_s) if stamp_ns is None else stamp_msg_ns(stamp_ns)
        with self._cond:
            # from here on the running goal's end is ours, and an earlier goal's late failure is superseded
            self._goal, self._goal_failure, self._reflex_stop = None, "", ""
        self._arm_topic.publish(msg)
        mirror.start(held, stamp_s, start_time_s=stamp_s)
        return end.copy()

    def move_gripper(self, opening_m: float, duration_s: float) -> float:
        """Start the jaw towards `opening_m` with the profile's grasp force and return the opening sent; the
        harness then waits periods and reads the measured opening. A goal the gripper rejects raises here, one it
        aborts (or never finishes) at the next wait_period."""
        return self._gripper.move(opening_m, duration_s)

    def hold_gripper(self) -> float:
        """Hold the jaw where it is: the trajectory controller is sent the measured opening, an action gripper's
        running goal is canceled (the controllers then hold their joint where it is; franka_gripper stops)."""
        return self._gripper.stop(self.read_state(require_force=False).jaw_opening_m)

    def wait_period(self) -> None:
        """Wait until the measured state has advanced one control period (by its own stamps). A sweep's next
        stretch goes out first when it is due: this is the motion loop's heartbeat, so an arm whose loop stops
        calling it stops too."""
        start = self.read_state(require_force=False).time_s
        self._extend_sweep(start)
        limit = self.link_limit_s
        deadline, graced = time.monotonic() + limit, self._franka is None
        with self._cond:
            while True:
                gripper_failure = self._gripper.failure()
                if gripper_failure:
                    raise BackendError(gripper_failure)
                if self._reflex_stop:
                    message, self._reflex_stop = self._reflex_stop, ""
                    force = REFLEX_FORCE.search(message)
                    raise ArmReflexStop(message, float(force.group(1)) if force else 0.0)
                why = self._vendor_refusal()
                if why:
                    failure, self._goal_failure = self._goal_failure, ""
                    raise BackendError(f"{why} (the arm controller: {failure})" if failure else why)
                # a Franka's controller aborts its goal when a reflex deactivates it: wait until its robot state says
                # whether that was a reflex (silent, or a stop mode: above) or not (a newer state: the abort itself)
                if self._goal_failure and (self._franka is None or self._franka.heard_since(self._goal_failure_wall)):
                    failure, self._goal_failure = self._goal_failure, ""
                    raise BackendError(f"the arm controller aborted the trajectory ({failure})")
                if _stamp_s(self._joints) >= start + self._period - 1e-9:
                    return
                left = deadline - time.monotonic()
                if left <= 0 and not graced:
                    # a Franka's robot state comes in the joint states' control cycle: a moment more, and a robot
                    # state that stopped with them is judged too old as well (above: the reason names the reflex)
                    graced, deadline = True, time.monotonic() + FRANKA_STATE_GRACE_S
                    continue
                if left <= 0:
                    failure, self._goal_failure = self._goal_failure, ""
                    lost = f"joint states stopped advancing for {limit} s: link lost"
                    raise BackendError(
                        f"{lost} (the arm controller aborted the trajectory: {failure})" if failure else lost
                    )
                # a Franka's robot state is judged by its age too: look again when it would be too old
                self._cond.wait(left if self._franka is None else min(left, self._period))

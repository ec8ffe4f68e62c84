"""Grippers through their vendors' standard interfaces, behind one small interface.

`Gripper.move(opening_m, duration_s)` commands a jaw opening (the gap between the finger pads, in metres) with
the profile's grasp force, `wait()` blocks until the gripper is done and reports the MEASURED opening (from the
gripper joints' states, never the command), `stop()` holds where the jaw is. Openings and joint positions are
related by the profile's linear mapping (`gripper.opening_offset_m`, `gripper.opening_per_joint`:
RobotProfile.jaw_opening_m for what the joint states say, RobotProfile.finger_joint_position for what a command
sends): two prismatic fingers get opening / 2 each, the Robotiq Hand-E's hande_finger_distance 0.05 m - opening.
A profile without a gripper gets `NoGripper`, which refuses every command. The four kinds a robot profile names
(`gripper.command`, captain_ros.core.robot.GripperInterface):

  joint_trajectory          a JointTrajectoryController on the finger joint: one trajectory_msgs/JointTrajectory
                            point on `<controller>/joint_trajectory` (the twin, ros2_control demos). No result:
                            done when the jaw reaches the command or stops moving.
  gripper_command           control_msgs/action/GripperCommand. `command.position` is the position of the joint
                            the server drives: ros2_controllers' gripper_action_controller commands its `joint`
                            (a prismatic finger joint: per-finger metres), and franka_gripper's
                            `~/gripper_action` takes the per-finger position as well (width = 2 * position,
                            gripper_action_server.cpp): both get the profile's joint position for the opening.
                            Their results differ (the controller reports the joint position, Franka the full
                            width), so the opening is read from the joint states, not from the result. A revolute
                            finger joint (Robotiq 2F-85's left_knuckle_joint) is not a linear function of the
                            opening: not supported.
  parallel_gripper_command  control_msgs/action/ParallelGripperCommand (parallel_gripper_action_controller, Jazzy
                            and later): the goal is a JointState with exactly one position (the server rejects
                            others), the profile's joint position for the opening, named as the profile's first
                            gripper joint (the Hand-E's hande_finger_distance: 0 = open); `effort` carries the
                            grasp force and `velocity` the joint's speed (used only where the controller has
                            max_effort_interface / max_velocity_interface).
  franka                    franka_gripper's franka_msgs/action/Move {width, speed} and Grasp {width, epsilon,
                            speed, force}: widths are the full opening. Opening (or staying) is a Move; CLOSING is
                            a Grasp, because libfranka's move() fails when the fingers meet an object while grasp()
                            holds it with `force`. The grasp's epsilon window is inner 0.005 m (the vendor default)
                            and outer up to the opening at the start: wherever the fingers stop between the target
                            and where they were counts as a grasp, and the caller judges from the measured opening
                            whether something is held (as the harness does). The speed is the opening change over
                            `duration_s`, at most Franka's default 0.1 m/s.

Results are judged the same way for every action kind: a goal that closes the jaw and ends (succeeded, or aborted
for a stall: gripper_action_controller aborts a stall unless allow_stalling, franka_gripper's GripperCommand aborts
a grasp outside its epsilons) with the measured opening above the target stopped on an object: a grasp, not an
error. Anything else that is not a success is a BackendError: no server, a rejected goal, an abort (with the
vendor's error text where it gives one), a stall while opening, a goal the server does not finish in time, a goal
canceled by someone else.

Grippers run on the caller's node (the arm backend's link node): their subscriptions and action clients use the
callback group given, and blocking calls (move waits for the goal's acceptance, wait for the result) must come
from a thread other than the one spinning that node.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration
from rclpy.node import Node
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory as JointTrajectoryMsg
from trajectory_msgs.msg import JointTrajectoryPoint

from captain_ros.core.robot import ProfileError, RobotProfile
from captain_ros.harness.backend import BackendError
from captain_ros.ros.spin import SpunActionClient

GOAL_TOLERANCE_M = 0.002  # the jaw reached its target within this; above it on closing = stopped on an object
FRANKA_DEFAULT_SPEED_MPS = 0.1  # franka_gripper's default_speed (config/franka_gripper_node.yaml)
FRANKA_MIN_SPEED_MPS = 0.005
FRANKA_EPSILON_INNER_M = 0.005  # franka_msgs/msg/GraspEpsilon's default
SETTLE_STILL_S = 0.3  # joint_trajectory: the jaw counts as stopped after this long (joint-state stamps) unmoved
SETTLE_STILL_M = 2e-4


def _duration(seconds: float) -> Duration:
    ns = round(seconds * 1e9)
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def per_finger_m(profile: RobotProfile, opening_m: float) -> float:
    """A gripper joint's position for a jaw opening, with the profile's mapping (RobotProfile.finger_joint_position:
    two prismatic fingers opening / 2 each, the Hand-E's hande_finger_distance 0.05 m - opening)."""
    return profile.finger_joint_position(opening_m)


@dataclass(frozen=True)
class GripperOutcome:
    """How a gripper motion ended: the measured opening, and what it was asked."""

    opening_m: float  # measured from the fingers' joint states once the gripper was done
    command_m: float  # the opening sent, after clipping
    reached_goal: bool  # within GOAL_TOLERANCE_M of the command
    stalled: bool  # stopped short of a closing command: on an object
    detail: str = ""  # the vendor's words, where it gave any


class FingerStates:
    """The jaw opening measured from sensor_msgs/JointState messages with the profile's finger joints: either
    its own subscription (a gripper that publishes its own joint states, franka_gripper) or messages passed in
    with `update` (the arm's joint_state_broadcaster also reports the fingers)."""

    def __init__(
        self, profile: RobotProfile, node: Node | None = None, topic: str = "", callback_group=None, clock=None
    ):
        self.profile, self.topic = profile, topic
        self._clock = clock if clock is not None else (node.get_clock() if node is not None else None)
        self._cond = threading.Condition()
        self._opening: float | None = None
        self._count = 0  # messages that carried the fingers
        self._problem = ""  # why the last message gave no opening
        self._history: deque[tuple[float, float]] = deque(maxlen=256)  # (stamp s, opening m)
        self._delays: deque[float] = deque(maxlen=64)  # receive time - stamp, s (the clock given), recent
        if node is not None and topic:
            node.create_subscription(JointState, topic, self.update, 10, callback_group=callback_group)

    def now_s(self) -> float | None:
        """The time on the clock messages are received by (None without one)."""
        return None if self._clock is None else self._clock.now().nanoseconds * 1e-9

    def update(self, msg: JointState) -> None:
        positions = dict(zip(msg.name, msg.position, strict=False))
        opening = self.profile.jaw_opening_m(positions)
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        received = self.now_s()
        with self._cond:
            if opening is None:
                self._problem = (
                    f"the joint states{f' on {self.topic}' if self.topic else ''} carry {', '.join(msg.name) or 'no'} "
                    f"joints, not the profile's finger joints {', '.join(self.profile.finger_joints)}"
                )
                return
            self._opening, self._problem = opening, ""
            self._count += 1
            self._history.append((stamp, opening))
            if received is not None:
                self._delays.append(received - stamp)
            self._cond.notify_all()

    def latest(self) -> float | None:
        with self._cond:
            return self._opening

    def count(self) -> int:
        with self._cond:
            return self._count

    def wait_newer(self, count: int, timeout_s: float) -> float:
        """The first opening measured after the `count`-th message (BackendError if none in `timeout_s`)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._count > count, timeout_s):
                why = self._problem or f"no finger joint states{f' on {self.topic}' if self.topic else ''}"
                raise BackendError(f"the gripper's opening cannot be measured: {why} within {timeout_s:.0f} s")
            return self._opening

    def measured_after(self, time_s: float | None, count: int, timeout_s: float) -> float:
        """The opening from a message the gripper published after `time_s` (this clock's time, from `now_s`).

        Messages on two topics may be received out of order (a result before a joint state published ahead of
        it), so a message received after an event is not enough: its stamp must be later than the event, less
        the smallest receive delay seen (which takes in a constant offset between the robot's clock and this
        one). Without a clock or a stamp to judge by: the first opening measured after the `count`-th message."""
        with self._cond:
            if time_s is None or not self._delays:
                return self.wait_newer(count, timeout_s)
            since = time_s - min(self._delays)
            if not self._cond.wait_for(lambda: self._history and self._history[-1][0] >= since, timeout_s):
                why = self._problem or f"no finger joint states{f' on {self.topic}' if self.topic else ''}"
                raise BackendError(f"the gripper's opening cannot be measured: {why} within {timeout_s:.0f} s")
            return self._history[-1][1]

    def latest_stamp_s(self) -> float | None:
        """The stamp of the newest message with the fingers (None before one)."""
        with self._cond:
            return self._history[-1][0] if self._history else None

    def still_for(self, span_s: float, tolerance_m: float, after_s: float | None = None) -> bool:
        """Whether the opening moved less than `tolerance_m` over the last `span_s` of message stamps, a span that
        begins no earlier than `after_s` (a command's time: stillness before it says nothing of the motion). The
        span reaches back to the message at or before its start: a gap between messages (a busy publisher) is not
        stillness."""
        with self._cond:
            if not self._history:
                return False
            start = self._history[-1][0] - span_s
            if self._history[0][0] > start or (after_s is not None and start < after_s):
                return False  # not that much history yet
            window = []
            for stamp, opening in reversed(self._history):
                window.append(opening)
                if stamp <= start:
                    break
            return max(window) - min(window) < tolerance_m

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)


class Gripper(ABC):
    """Command an opening, report the measured opening once done, hold."""

    kind: str = ""

    def __init__(
        self,
        node: Node,
        profile: RobotProfile,
        fingers: FingerStates,
        *,
        resolve: Callable[[str], str] | None = None,
        callback_group=None,
        server_timeout_s: float = 5.0,
        control_period_s: float = 0.01,
    ):
        if not profile.finger_joints:
            raise BackendError(f"robot profile '{profile.name}' names no gripper finger joints: no gripper to drive")
        self.node, self.profile, self.fingers = node, profile, fingers
        self.interface = profile.interfaces.gripper
        self._resolve = resolve or (lambda name: name)
        self._group = callback_group
        self._server_timeout = server_timeout_s
        self._period_s = control_period_s  # the shortest time to a point a trajectory controller is given
        try:
            self.min_opening_m, self.max_opening_m = profile.jaw_opening_range_m()
        except (ProfileError, KeyError):  # no URDF yet (/robot_description): the vendor refuses what it cannot do
            self.min_opening_m, self.max_opening_m = 0.0, None
        self._command_m = float("nan")

    def clip(self, opening_m: float) -> float:
        if not np.isfinite(opening_m):
            raise BackendError(f"gripper opening must be a finite number of metres, got {opening_m!r}")
        upper = self.max_opening_m if self.max_opening_m is not None else np.inf
        return float(np.clip(opening_m, max(self.min_opening_m, 0.0), upper))

    @abstractmethod
    def move(self, opening_m: float, duration_s: float, max_effort_n: float | None = None) -> float:
        """Start the jaw towards `opening_m` (reached in about `duration_s`, squeezing with at most `max_effort_n`,
        the profile's by default); returns the opening sent after clipping. BackendError when the gripper
        cannot take it (no server, goal rejected)."""

    @abstractmethod
    def wait(self, timeout_s: float = 10.0) -> GripperOutcome:
        """Block until the last motion is done; its outcome with the measured opening. BackendError if it failed
        or did not finish within `timeout_s`."""

    def stop(self, measured_m: float) -> float:
        """Hold the jaw where it is (`measured_m`, the caller's latest measurement); returns the held opening."""
        return measured_m

    def unmatched(self, timeout_s: float) -> list[str]:
        """The action servers this gripper's clients are not yet matched with after waiting up to `timeout_s`
        (none for a topic-driven or absent gripper). Configure waits here, so that a goal's own short wait for its
        server is not where a busy host's discovery of a fresh client happens."""
        return []

    def failure(self) -> str:
        """Why the last motion failed, once (''): for callers that do not block on `wait`."""
        return ""

    def _outcome(self, opening_m: float, closing: bool, detail: str = "", command_m: float | None = None):
        """The outcome at a measured opening: short of a closing command means on an object."""
        command = self._command_m if command_m is None else command_m
        reached = abs(opening_m - command) <= GOAL_TOLERANCE_M
        return GripperOutcome(opening_m, command, reached, closing and opening_m > command + GOAL_TOLERANCE_M, detail)


class JointTrajectoryGripper(Gripper):
    """A JointTrajectoryController on the first finger joint (the other finger mimics it): one point, reached at
    `duration_s`, on the controller's topic (`<controller>/joint_trajectory`, next to the action the profile
    names), which preempts whatever it was doing."""

    kind = "joint_trajectory"

    def __init__(self, node: Node, profile: RobotProfile, fingers: FingerStates, **kwargs):
        super().__init__(node, profile, fingers, **kwargs)
        if not self.interface.action:
            raise BackendError(f"robot profile '{profile.name}': gripper.action is empty")
        self.topic = self._resolve(self.interface.action.rsplit("/", 1)[0] + "/joint_trajectory")
        limits = profile.joint_limits[profile.finger_joints[0]]
        self._finger_range = (limits.lower, limits.upper)
        self._publisher = node.create_publisher(JointTrajectoryMsg, self.topic, 10)
        self._sent: int | None = None  # finger messages seen when the last command went out
        self._sent_stamp_s: float | None = None  # the newest finger message's stamp then
        self._closing = False

    def move(self, opening_m: float, duration_s: float, max_effort_n: float | None = None) -> float:
        finger = float(np.clip(per_finger_m(self.profile, opening_m), *self._finger_range))
        point = JointTrajectoryPoint(positions=[finger], time_from_start=_duration(max(duration_s, self._period_s)))
        names = [self.profile.finger_joints[0]]
        start = self.fingers.latest()
        self._publisher.publish(JointTrajectoryMsg(joint_names=names, points=[point]))
        self._command_m = self.profile.jaw_opening_at(finger)
        self._closing = start is not None and self._command_m < start - GOAL_TOLERANCE_M
        self._sent, self._sent_stamp_s = self.fingers.count(), self.fingers.latest_stamp_s()
        return self._command_m

    def stop(self, measured_m: float) -> float:
        return self.move(measured_m, 0.0)

    def wait(self, timeout_s: float = 10.0) -> GripperOutcome:
        """Done when the jaw is at the command, or has stopped moving (on an object) for SETTLE_STILL_S of
        joint-state time since the command: this controller gives no result."""
        sent = self._sent
        if sent is None:
            raise BackendError("the gripper was not commanded yet")
        self.fingers.wait_newer(sent, timeout_s)

        def settled() -> bool:  # called under the finger states' (re-entrant) lock
            opening = self.fingers.latest()
            at_goal = opening is not None and abs(opening - self._command_m) <= GOAL_TOLERANCE_M
            return at_goal or self.fingers.still_for(SETTLE_STILL_S, SETTLE_STILL_M, self._sent_stamp_s)

        if not self.fingers.wait(settled, timeout_s):
            raise BackendError(f"the gripper on {self.topic} kept moving for {timeout_s:.0f} s")
        return self._outcome(self.fingers.latest(), self._closing)


@dataclass
class _Goal:
    handle: object
    name: str  # the action's resolved name
    what: str  # the goal's kind, for messages (GripperCommand, Move, Grasp, ...)
    command_m: float
    closing: bool  # the command is below the opening measured when it was sent
    deadline: float  # monotonic: the server must have finished by then
    done: threading.Event
    ours_canceled: bool = False
    finished_s: float | None = None  # when the result arrived (the finger states' clock)
    finished_count: int = 0  # finger messages received by then
    detail: str = ""  # the judged outcome's words
    error: str = ""  # why it failed ('' = it did not)
    reported: bool = False


class ActionGripper(Gripper):
    """The goal/result bookkeeping the action kinds share: acceptance waited for, the result judged when it
    arrives (never blocking the executor), the measured opening reported once the gripper is done."""

    action_type: type = object

    def __init__(self, node: Node, profile: RobotProfile, fingers: FingerStates, **kwargs):
        super().__init__(node, profile, fingers, **kwargs)
        if not self.interface.action:
            raise BackendError(f"robot profile '{profile.name}': gripper.action is empty")
        self.action_name = self._resolve(self.interface.action)
        self._client = SpunActionClient(node, self.action_type, self.action_name, callback_group=self._group)
        self._lock = threading.Lock()
        self._goal: _Goal | None = None

    def _clients(self) -> list[tuple[str, SpunActionClient]]:
        return [(self.action_name, self._client)]

    def unmatched(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        return [
            name
            for name, client in self._clients()
            if not client.wait_for_server(timeout_sec=max(deadline - time.monotonic(), 0.0))
        ]

    def _effort(self, max_effort_n: float | None) -> float:
        effort = self.interface.max_effort_n if max_effort_n is None else max_effort_n
        if not (np.isfinite(effort) and effort > 0):
            raise BackendError(f"gripper max effort must be a positive number of newtons, got {effort!r}")
        return float(effort)

    def _send(
        self, client: SpunActionClient, name: str, goal, *, command_m: float, duration_s: float, what: str
    ) -> None:
        if not client.wait_for_server(timeout_sec=self._server_timeout):
            raise BackendError(
                f"the gripper's action server {name} is not available (is the gripper controller running?)"
            )
        answered = threading.Event()
        start_m = self.fingers.latest()
        future = client.send_goal_async(goal)
        future.add_done_callback(lambda _f: answered.set())
        if not answered.wait(self._server_timeout):
            raise BackendError(f"the gripper's {name} did not answer the {what} goal within {self._server_timeout} s")
        handle = future.result()
        if handle is None or not handle.accepted:
            raise BackendError(f"the gripper's {name} rejected the {what} goal (opening {command_m:.4f} m)")
        record = _Goal(
            handle,
            name,
            what,
            command_m,
            start_m is not None and command_m < start_m - GOAL_TOLERANCE_M,
            time.monotonic() + max(duration_s, 0.0) + self._server_timeout,
            threading.Event(),
        )
        with self._lock:
            previous, self._goal = self._goal, record
        if previous is not None:
            previous.ours_canceled = True  # preempted by our own goal: the server cancels or aborts it
        self._command_m = command_m
        handle.get_result_async().add_done_callback(lambda f, r=record: self._on_result(r, f))

    def _on_result(self, record: _Goal, future) -> None:
        """Judge the result where it arrives (the executor's thread: nothing here blocks)."""
        record.finished_s, record.finished_count = self.fingers.now_s(), self.fingers.count()
        response = future.result()
        status = GoalStatus.STATUS_UNKNOWN if response is None else response.status
        if not (record.ours_canceled and status in (GoalStatus.STATUS_CANCELED, GoalStatus.STATUS_ABORTED)):
            try:
                record.detail = self._judge(record, status, None if response is None else response.result)
            except BackendError as exc:
                record.error = str(exc)
        record.done.set()

    def _judge(self, record: _Goal, status: int, result) -> str:
        """The words for a finished goal, or BackendError when it failed (see the module docstring)."""
        opening = self.fingers.latest()
        vendor_error = getattr(result, "error", "") or ""
        at = "unmeasured" if opening is None else f"{opening:.4f} m"
        short = opening is not None and opening > record.command_m + GOAL_TOLERANCE_M
        stalled = bool(getattr(result, "stalled", False))
        goal = f"{record.what} goal to {record.command_m:.4f} m"
        if status == GoalStatus.STATUS_SUCCEEDED:
            return "stalled" if stalled else ""
        if status == GoalStatus.STATUS_ABORTED and not vendor_error and record.closing and short:
            return f"{'stalled' if stalled else 'stopped short'} on an object at {at}"
        if status == GoalStatus.STATUS_ABORTED:
            why = vendor_error or ("it stalled" if stalled else "no reason given")
            raise BackendError(f"the gripper's {record.name} aborted the {goal} at {at}: {why}")
        if status == GoalStatus.STATUS_CANCELED:
            raise BackendError(f"the gripper's {record.name} canceled the {goal} (not this client) at {at}")
        raise BackendError(f"the gripper's {record.name} ended the {goal} with status {status} at {at}")

    def wait(self, timeout_s: float = 10.0) -> GripperOutcome:
        with self._lock:
            record = self._goal
        if record is None:
            raise BackendError("the gripper was not commanded yet")
        if not record.done.wait(timeout_s):
            raise BackendError(
                f"the gripper's {record.name} has not finished the {record.what} goal to {record.command_m:.4f} m "
                f"within {timeout_s:.0f} s (stalled?)"
            )
        record.reported = True
        if record.error:
            raise BackendError(record.error)
        # a joint state published after the result: the opening the gripper ended at, not one from before
        opening = self.fingers.measured_after(
            record.finished_s, record.finished_count, max(timeout_s, self._server_timeout)
        )
        return self._outcome(opening, record.closing, record.detail, record.command_m)

    def failure(self) -> str:
        with self._lock:
            record = self._goal
        if record is None or record.reported:
            return ""
        if record.done.is_set():
            if record.error:
                record.reported = True
            return record.error
        if time.monotonic() > record.deadline:
            record.reported = True
            return (
                f"the gripper's {record.name} has not finished the {record.what} goal to {record.command_m:.4f} m "
                f"{self._server_timeout:.0f} s after it should have (stalled?)"
            )
        return ""

    def stop(self, measured_m: float) -> float:
        """Cancel the running goal: gripper_action_controller and parallel_gripper_action_controller then hold
        the joint where it is (set_hold_position), franka_gripper calls libfranka's stop()."""
        with self._lock:
            record = self._goal
        if record is not None and not record.done.is_set():
            record.ours_canceled = True
            record.handle.cancel_goal_async()
        self._command_m = measured_m
        return measured_m


class GripperCommandGripper(ActionGripper):
    """control_msgs/action/GripperCommand: position = the joint's position (the profile's mapping), max_effort = the
    grasp force."""

    kind = "gripper_command"

    def __init__(self, node: Node, profile: RobotProfile, fingers: FingerStates, **kwargs):
        from control_msgs.action import GripperCommand

        self.action_type = GripperCommand
        super().__init__(node, profile, fingers, **kwargs)

    def move(self, opening_m: float, duration_s: float, max_effort_n: float | None = None) -> float:
        from control_msgs.msg import GripperCommand as Command

        target = self.clip(opening_m)
        goal = self.action_type.Goal(
            command=Command(position=per_finger_m(self.profile, target), max_effort=self._effort(max_effort_n))
        )
        self._send(self._client, self.action_name, goal, command_m=target, duration_s=duration_s, what="GripperCommand")
        return target


class ParallelGripper(ActionGripper):
    """control_msgs/action/ParallelGripperCommand: one joint's position (the profile's mapping), speed and force."""

    kind = "parallel_gripper_command"

    def __init__(self, node: Node, profile: RobotProfile, fingers: FingerStates, **kwargs):
        from control_msgs.action import ParallelGripperCommand

        self.action_type = ParallelGripperCommand
        super().__init__(node, profile, fingers, **kwargs)

    def move(self, opening_m: float, duration_s: float, max_effort_n: float | None = None) -> float:
        target = self.clip(opening_m)
        command = JointState(
            name=[self.profile.finger_joints[0]],
            position=[per_finger_m(self.profile, target)],
            effort=[self._effort(max_effort_n)],
        )
        start = self.fingers.latest()
        if duration_s > 0 and start is not None and abs(start - target) > 0:
            travel = abs(per_finger_m(self.profile, start) - per_finger_m(self.profile, target))
            command.velocity = [travel / duration_s]  # the joint's speed
        goal = self.action_type.Goal(command=command)
        self._send(
            self._client, self.action_name, goal, command_m=target, duration_s=duration_s, what="ParallelGripperCommand"
        )
        return target


class FrankaGripper(ActionGripper):
    """franka_gripper's Move (opening) and Grasp (closing) actions: full widths in metres, speed in m/s."""

    kind = "franka"

    def __init__(self, node: Node, profile: RobotProfile, fingers: FingerStates, **kwargs):
        from franka_msgs.action import Grasp, Move

        self.action_type, self._grasp_type = Move, Grasp
        super().__init__(node, profile, fingers, **kwargs)
        if not self.interface.grasp_action:
            raise BackendError(f"robot profile '{profile.name}': a franka gripper needs gripper.grasp_action")
        self.grasp_name = self._resolve(self.interface.grasp_action)
        self._grasp_client = SpunActionClient(node, Grasp, self.grasp_name, callback_group=self._group)

    def _clients(self) -> list[tuple[str, SpunActionClient]]:
        return [*super()._clients(), (self.grasp_name, self._grasp_client)]

    def move(self, opening_m: float, duration_s: float, max_effort_n: float | None = None) -> float:
        from franka_msgs.msg import GraspEpsilon

        target = self.clip(opening_m)
        start = self.fingers.latest()
        change = abs(target - start) if start is not None else 0.0
        speed = FRANKA_DEFAULT_SPEED_MPS if duration_s <= 0 or change == 0 else change / duration_s
        speed = float(np.clip(speed, FRANKA_MIN_SPEED_MPS, FRANKA_DEFAULT_SPEED_MPS))
        if start is not None and target < start - GOAL_TOLERANCE_M:
            epsilon = GraspEpsilon(inner=FRANKA_EPSILON_INNER_M, outer=start - target + FRANKA_EPSILON_INNER_M)
            goal = self._grasp_type.Goal(width=target, epsilon=epsilon, speed=speed, force=self._effort(max_effort_n))
            self._send(self._grasp_client, self.grasp_name, goal, command_m=target, duration_s=duration_s, what="Grasp")
        else:
            goal = self.action_type.Goal(width=target, speed=speed)
            self._send(self._client, self.action_name, goal, command_m=target, duration_s=duration_s, what="Move")
        return target

    def _judge(self, record: _Goal, status: int, result) -> str:
        if record.what == "Grasp" and status == GoalStatus.STATUS_ABORTED and not result.error:
            return "grasp() returned false: the fingers stopped outside the epsilon window"  # closed on nothing
        return super()._judge(record, status, result)


class NoGripper(Gripper):
    """The gripper of an arm without one (a profile with no gripper joints): every command is refused with a
    BackendError that says so, before anything is sent; holding does nothing (there is nothing to hold)."""

    kind = ""

    def __init__(self, node: Node, profile: RobotProfile, fingers: FingerStates, **_kwargs):
        self.node, self.profile, self.fingers = node, profile, fingers
        self.interface = profile.interfaces.gripper
        self.min_opening_m, self.max_opening_m = 0.0, 0.0
        self._command_m = 0.0

    def _refuse(self) -> BackendError:
        return BackendError(
            f"this robot profile ('{self.profile.name}') has no gripper (gripper.joints is empty): nothing to open, "
            "close or grasp with"
        )

    def move(self, opening_m: float, duration_s: float, max_effort_n: float | None = None) -> float:
        raise self._refuse()

    def wait(self, timeout_s: float = 10.0) -> GripperOutcome:
        raise self._refuse()


KINDS: dict[str, type[Gripper]] = {
    "joint_trajectory": JointTrajectoryGripper,
    "gripper_command": GripperCommandGripper,
    "parallel_gripper_command": ParallelGripper,
    "franka": FrankaGripper,
}
# the ROS type of each kind's gripper action, and of franka's grasp action (motion_node checks them on the graph)
ACTION_TYPES = {
    "gripper_command": "control_msgs/action/GripperCommand",
    "parallel_gripper_command": "control_msgs/action/ParallelGripperCommand",
    "franka": "franka_msgs/action/Move",
}
GRASP_ACTION_TYPE = "franka_msgs/action/Grasp"


def make_gripper(
    node: Node,
    profile: RobotProfile,
    fingers: FingerStates,
    *,
    resolve: Callable[[str], str] | None = None,
    callback_group=None,
    server_timeout_s: float = 5.0,
    control_period_s: float = 0.01,
) -> Gripper:
    """The gripper the profile's `gripper.command` names (`NoGripper` for a profile without a gripper)."""
    if not profile.has_gripper:
        return NoGripper(node, profile, fingers)
    kind = profile.interfaces.gripper.command
    if kind not in KINDS:
        raise BackendError(f"robot profile '{profile.name}': unknown gripper command '{kind}'")
    return KINDS[kind](
        node,
        profile,
        fingers,
        resolve=resolve,
        callback_group=callback_group,
        server_timeout_s=server_timeout_s,
        control_period_s=control_period_s,
    )

"""motion_node: the harness core as a ROS 2 node, driving a ros2_control arm (or twin_node).

  /harness/move_to      captain_interfaces/action/MoveTo     feedback every few periods; cancel holds the arm
  /harness/call         captain_interfaces/srv/HarnessCall   any capability by name, JSON keyword arguments
  /harness/receipts     captain_interfaces/msg/CallResult    every result, whichever way it was called
  /harness/stop         std_srvs/Trigger                     halt within one control period; motions refused
  /harness/resume       std_srvs/Trigger                     accept motions again
  /harness/new_episode  std_srvs/Trigger                     fresh budgets, log and gate (message: episode id)
  /harness/gate         std_srvs/Trigger                     read-only: would finish() be accepted now, and if
                                                             not, the gate's objections (success = none)
  /agent/heartbeat      std_msgs/Empty                       the agent is alive (watchdog; see `watchdog`)
  /captain/markers      visualization_msgs/MarkerArray       executed TCP paths (rviz)

It serves once the arm's joint states arrive. Calls run one at a time (one arm); stop, resume and
cancel never wait for a running call. Calls waiting for the arm wait in the middleware's queue (one
callback group that runs one at a time), not in executor threads, so stop, cancel, the heartbeat and
the receipts always find a thread; a MoveTo goal that arrives while a motion runs is rejected. The
core never raises: every failure is a CallResult with its category, also on the receipts topic.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import rclpy
from geometry_msgs.msg import Point
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
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
from captain_ros.harness.backend import BackendError
from captain_ros.harness.harness import Harness
from captain_ros.harness.motion import MotionProgress, Watchdog
from captain_ros.paths import config_path
from captain_ros.ros.convert import call_result_to_msg
from captain_ros.ros.description import resolve_profile
from captain_ros.ros.ros2_control_backend import Ros2ControlBackend

FEEDBACK_EVERY_S = 0.05


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


class MotionNode(Node):
    def __init__(self) -> None:
        super().__init__("motion")
        describe = ParameterDescriptor
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
        param = self.get_parameter
        self.profile = resolve_profile(self, param("robot_profile").value)
        self.config = load_config(Path(param("safety_config").value), Path(param("harness_config").value))
        self.backend = Ros2ControlBackend(
            self,
            self.profile,
            control_period_s=float(param("control_period_s").value),
            state_timeout_s=float(param("state_timeout_s").value),
            wrench_max_lag_s=float(param("wrench_max_lag_s").value),
        )
        watchdog_s = float(param("watchdog_timeout_s").value) or self.config.safety.watchdog_timeout_s
        # the node's clock (sim time with the twin): the watchdog and the wall-time budget mean the same at any
        # real-time factor; ForwardClock ignores the jump back to 0 when the twin resets
        self.clock = ForwardClock(lambda: self.get_clock().now().nanoseconds * 1e-9)
        self.watchdog = Watchdog(watchdog_s, clock=self.clock) if param("watchdog").value else None
        self.harness: Harness | None = None
        self._busy = threading.Lock()
        self._goal = None  # the MoveTo goal being executed
        self._last_feedback = 0.0
        self.receipts = self.create_publisher(CallResultMsg, "/harness/receipts", 50)
        self.markers = self.create_publisher(MarkerArray, "/captain/markers", 10)

    def connect(self, timeout_s: float = 30.0) -> None:
        """Wait for the arm's joint states, then start serving (the executor must already spin)."""
        state = self.backend.wait_for_state(timeout_s)
        self.harness = Harness(self.backend, self.config, clock=self.clock, watchdog=self.watchdog)
        self.harness.on_progress = self._feedback
        self.harness.new_episode(uuid.uuid4().hex)
        # serve only now: clients that wait for these services wait for a connected arm
        group = ReentrantCallbackGroup()
        calls = MutuallyExclusiveCallbackGroup()  # waiting calls queue in the middleware, not in threads
        self.create_service(HarnessCall, "/harness/call", self._on_call, callback_group=calls)
        self.create_service(Trigger, "/harness/stop", self._on_stop, callback_group=group)
        self.create_service(Trigger, "/harness/resume", self._on_resume, callback_group=group)
        self.create_service(Trigger, "/harness/new_episode", self._on_new_episode, callback_group=group)
        self.create_service(Trigger, "/harness/gate", self._on_gate, callback_group=group)
        self.create_subscription(Empty, "/agent/heartbeat", self._on_heartbeat, 10, callback_group=group)
        # perception runs in the perception node: its results count as verification for the completion gate
        self.create_subscription(CallResultMsg, "/harness/receipts", self._on_receipt, 50, callback_group=group)
        self._action = ActionServer(
            self,
            MoveTo,
            "/harness/move_to",
            execute_callback=self._execute_move_to,
            goal_callback=self._on_goal,
            cancel_callback=self._on_cancel,
            callback_group=group,
        )
        self.get_logger().info(
            f"harness ready on {self.backend.name}: tcp at {np.round(self.harness.kin.forward(state.q_rad)[0], 3)} m, "
            f"episode {self.harness.episode_id}, watchdog {'on' if self.watchdog else 'off'}"
        )

    # ------------------------------------------------------------------------------ calls
    def run(self, capability: str, kwargs: dict, call_id: str = "") -> CallResult:
        """One harness call, serialized with all others; published on the receipts topic."""
        if not self._busy.acquire(timeout=120.0):
            result = CallResult.fail(capability, FailureCategory.TIMEOUT, "another call held the arm for 120 s")
        else:
            try:
                if self.watchdog is not None:
                    self.watchdog.feed()
                result = self.harness.call(capability, **kwargs)
            finally:
                self._busy.release()
        if call_id:
            result.call_id = call_id
        self.receipts.publish(call_result_to_msg(result, time.time()))
        if result.executed and isinstance(result.value, dict) and "motion_id" in result.value:
            self._show(result)
        text = result.receipt or f"{capability}: {result.failure_category.value}: {result.message}"
        if result.success:  # rclpy forbids one logging call site from changing severity
            self.get_logger().info(text)
        else:
            self.get_logger().warning(text)
        return result

    def _show(self, result: CallResult) -> None:
        """The executed TCP path of a motion in rviz (/captain/markers, namespace 'motions'): green when it
        reached its target, orange when it stopped early."""
        record = self.harness.motions[result.value["motion_id"] - 1]
        line = Marker(ns="motions", id=record.motion_id, type=Marker.LINE_STRIP, action=Marker.ADD)
        line.header.frame_id = self.profile.base_frame
        line.points = [
            Point(x=float(r.tcp_m[0]), y=float(r.tcp_m[1]), z=float(r.tcp_m[2])) for r in record.outcome.trace
        ]
        line.scale.x = 0.004
        line.color.r, line.color.g, line.color.b, line.color.a = (
            (0.2, 0.9, 0.2, 1.0) if result.success else (1.0, 0.5, 0.0, 1.0)
        )
        self.markers.publish(MarkerArray(markers=[line]))

    def _on_call(self, request: HarnessCall.Request, response: HarnessCall.Response) -> HarnessCall.Response:
        try:
            kwargs = json.loads(request.args_json or "{}")
            if not isinstance(kwargs, dict):
                raise ValueError(f"args_json must be a JSON object, got {type(kwargs).__name__}")
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            result = CallResult.fail(request.capability, FailureCategory.INVALID_ARGUMENT, f"bad args_json: {exc}")
            result.call_id, result.episode_id = request.call_id or result.call_id, self.harness.episode_id
            self.receipts.publish(call_result_to_msg(result, time.time()))
        else:
            result = self.run(request.capability, kwargs, request.call_id)
        response.result = call_result_to_msg(result, time.time())
        return response

    # ------------------------------------------------------------------------------ MoveTo action
    def _execute_move_to(self, goal_handle) -> MoveTo.Result:
        try:
            kwargs = move_to_kwargs(goal_handle.request, self.profile.base_frame)
        except ValueError as exc:
            result = CallResult.fail("move_to", FailureCategory.INVALID_ARGUMENT, str(exc))
            self.receipts.publish(call_result_to_msg(result, time.time()))
        else:
            self._goal = goal_handle
            try:
                result = self.run("move_to", kwargs, goal_handle.request.call_id)
            finally:
                self._goal = None
        if result.success:
            goal_handle.succeed()
        elif result.failure_category is FailureCategory.CANCELED and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        else:
            goal_handle.abort()
        return MoveTo.Result(result=call_result_to_msg(result, time.time()))

    def _on_goal(self, _goal) -> GoalResponse:
        """One motion at a time: a goal that arrives while one runs is rejected, not queued in a thread."""
        if self._goal is not None or self._busy.locked():
            self.get_logger().warning("MoveTo goal rejected: the arm is busy with another call")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_cancel(self, goal_handle) -> CancelResponse:
        if self._goal is goal_handle:
            self.harness.cancel()
        return CancelResponse.ACCEPT

    def _feedback(self, progress: MotionProgress) -> None:
        goal, now = self._goal, time.monotonic()
        if goal is None or now - self._last_feedback < FEEDBACK_EVERY_S:
            return
        self._last_feedback = now
        goal.publish_feedback(MoveTo.Feedback(**vars(progress)))  # same field names, same units

    # ------------------------------------------------------------------------------ safety services
    def _on_stop(self, _request, response: Trigger.Response) -> Trigger.Response:
        self.harness.stop()  # the running motion holds at its next control period
        if not self._busy.locked():
            try:
                self.backend.hold()
            except BackendError as exc:
                response.success, response.message = False, f"stop requested but hold failed: {exc}"
                return response
        self.get_logger().warning("STOP: motions refused until /harness/resume")
        response.success, response.message = True, "stopped: the arm holds; call /harness/resume to continue"
        return response

    def _on_resume(self, _request, response: Trigger.Response) -> Trigger.Response:
        self.harness.resume()
        self.get_logger().info("resumed: motions accepted")
        response.success, response.message = True, "resumed"
        return response

    def _on_gate(self, _request, response: Trigger.Response) -> Trigger.Response:
        try:
            objections = self.harness.gate_objections()
        except BackendError as exc:
            response.success, response.message = False, f"the gate cannot judge: {exc}"
            return response
        response.success = not objections
        response.message = "; ".join(objections) or "finish() would be accepted"
        return response

    def _on_new_episode(self, _request, response: Trigger.Response) -> Trigger.Response:
        if not self._busy.acquire(timeout=5.0):
            response.success, response.message = False, "a call is running; try again when it has finished"
            return response
        try:
            self.harness.new_episode(uuid.uuid4().hex)
        finally:
            self._busy.release()
        response.success, response.message = True, self.harness.episode_id
        return response

    def _on_receipt(self, msg: CallResultMsg) -> None:
        if hasattr(self.harness.perception, f"_{msg.capability}"):  # never our own (motion) results
            self.harness.note_external_call(msg.capability, msg.success)

    def destroy_node(self) -> None:
        self.backend.close()
        super().destroy_node()

    def _on_heartbeat(self, _msg: Empty) -> None:
        if self.watchdog is not None:
            self.watchdog.feed()


def main(args: list[str] | None = None) -> None:
    """Spin in this thread and connect to the arm from a helper thread (connect waits on topics the
    executor serves, then starts the services).

    The thread that spun is the one that shuts down, so no thread still waits on the node while the
    executor and the node go away (a spinner thread of its own made Ctrl-C crash the process now and
    then: SIGSEGV, or "terminate called without an active exception"). `rclpy.init()` plus
    `rclpy.try_shutdown()` in `finally` rather than `with rclpy.init()`, which Jazzy does not have
    (see captain_ros.ros.spin).
    """
    from captain_ros.ros.spin import spin_until_shutdown

    rclpy.init(args=args)
    node: MotionNode | None = None
    executor: MultiThreadedExecutor | None = None
    failed: list[BackendError] = []
    try:
        node = MotionNode()
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)

        def connect(node: MotionNode = node) -> None:
            try:
                node.connect()
            except BackendError as exc:
                node.get_logger().fatal(str(exc))
                failed.append(exc)
                rclpy.try_shutdown()  # ends the spin below

        threading.Thread(target=connect, name="connect", daemon=True).start()
        spin_until_shutdown(executor)
        if failed:
            raise SystemExit(1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()

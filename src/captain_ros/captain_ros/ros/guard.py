"""Callbacks that never kill their node: an exception in a service, action, subscription or timer callback
becomes an error answer and a log line, and the node goes on.

rclpy lets an exception raised by a callback out of the executor's spin, so one unforeseen error (the motion node's
`/harness/new_episode` meeting a lost link, say) ended the whole node and left every later caller without an
answer. Here:
- a service answers with its response marked as failed: `success` false and `message` where the type has them,
  a `CallResult` of category backend_error where it carries one (HarnessCall, GetObservation);
- an action's execute callback aborts its goal with such a result; a goal callback that raises rejects the goal,
  a cancel callback that raises rejects the cancel (it did not happen);
- a subscription or timer callback logs and drops that message or tick.

`GuardedNode` is a mixin for Node and LifecycleNode (`class MotionNode(GuardedNode, LifecycleNode)`): everything it
creates is guarded. `GuardedActionServer` is rclpy's ActionServer with guarded callbacks.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from typing import Any

from rclpy.action import ActionServer, CancelResponse, GoalResponse

from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.ros.convert import call_result_to_msg


def _report(node: Any, what: str, exc: BaseException) -> str:
    message = f"{what} failed: {type(exc).__name__}: {exc}"
    node.get_logger().error(f"{message}\n{''.join(traceback.format_exception(exc, limit=8))}")
    return message


def mark_failed(response: Any, message: str, capability: str = "") -> Any:
    """`response` (a service response or an action result) filled in as an error with `message`."""
    if hasattr(response, "success"):
        response.success = False
    if hasattr(response, "message"):
        response.message = message
    if hasattr(response, "error_string"):  # control_msgs' FollowJointTrajectory and friends
        response.error_string = message
        if hasattr(response, "error_code") and hasattr(response, "INVALID_GOAL"):
            response.error_code = response.INVALID_GOAL
    if hasattr(response, "result") and type(response.result).__name__ == "CallResult":
        response.result = call_result_to_msg(
            CallResult.fail(capability, FailureCategory.BACKEND_ERROR, message), time.time()
        )
    return response


def guard_service(node: Any, name: str, callback: Callable) -> Callable:
    @functools.wraps(callback)
    def guarded(request: Any, response: Any) -> Any:
        try:
            return callback(request, response)
        except Exception as exc:
            return mark_failed(response, _report(node, f"service {name}", exc), getattr(request, "capability", ""))

    return guarded


def guard_callback(node: Any, what: str, callback: Callable) -> Callable:
    """A subscription's or timer's callback: an exception is logged, the message or tick dropped."""

    @functools.wraps(callback)
    def guarded(*args: Any) -> None:
        try:
            callback(*args)
        except Exception as exc:
            _report(node, what, exc)

    return guarded


class GuardedNode:
    """Mixin for rclpy's Node and LifecycleNode: services, subscriptions and timers it creates are guarded."""

    def create_service(self, srv_type, srv_name, callback, *args, **kwargs):
        return super().create_service(srv_type, srv_name, guard_service(self, srv_name, callback), *args, **kwargs)

    def create_subscription(self, msg_type, topic, callback, *args, **kwargs):
        guarded = guard_callback(self, f"subscription {topic}", callback)
        return super().create_subscription(msg_type, topic, guarded, *args, **kwargs)

    def create_timer(self, timer_period_sec, callback, *args, **kwargs):
        guarded = guard_callback(self, f"timer {getattr(callback, '__name__', 'callback')}", callback)
        return super().create_timer(timer_period_sec, guarded, *args, **kwargs)


class GuardedActionServer(ActionServer):
    """rclpy's ActionServer whose execute, goal and cancel callbacks cannot end the node (see the module)."""

    def __init__(self, node, action_type, action_name, execute_callback, **kwargs):
        what = f"action {action_name}"
        for key, answer in (("goal_callback", GoalResponse.REJECT), ("cancel_callback", CancelResponse.REJECT)):
            if kwargs.get(key) is not None:
                kwargs[key] = self._answering(node, f"{what} ({key})", kwargs[key], answer)

        @functools.wraps(execute_callback)
        def execute(goal_handle):
            try:
                return execute_callback(goal_handle)
            except Exception as exc:
                message = _report(node, what, exc)
                try:
                    goal_handle.abort()
                except Exception:  # it had ended already; the result below still says what happened
                    pass
                return mark_failed(action_type.Result(), message, str(action_name).rsplit("/", 1)[-1])

        super().__init__(node, action_type, action_name, execute, **kwargs)

    @staticmethod
    def _answering(node: Any, what: str, callback: Callable, answer: Any) -> Callable:
        @functools.wraps(callback)
        def guarded(request: Any) -> Any:
            try:
                return callback(request)
            except Exception as exc:
                _report(node, what, exc)
                return answer

        return guarded

"""The server side of the interface round-trip test, run as its own OS process.

Serves `HarnessCall` (answers with a real core CallResult) and a `MoveTo` action that sweeps a
virtual TCP at the requested speed, publishing feedback every 20 ms, and stops on cancel.
Prints READY once its endpoints exist.
"""

from __future__ import annotations

import json
import math
import sys
import time

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from captain_interfaces.action import MoveTo
from captain_interfaces.srv import HarnessCall
from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.ros.convert import call_result_to_msg
from captain_ros.ros.spin import spin

PERIOD_S = 0.02


class InterfacePeer(Node):
    def __init__(self) -> None:
        super().__init__("interface_peer")
        group = ReentrantCallbackGroup()
        self.create_service(HarnessCall, "harness/call", self.on_call, callback_group=group)
        self.action = ActionServer(
            self,
            MoveTo,
            "harness/move_to",
            execute_callback=self.execute,
            goal_callback=self.on_goal,
            cancel_callback=lambda _: CancelResponse.ACCEPT,
            callback_group=group,
        )
        self.tcp = [0.4, 0.0, 0.3]

    def on_call(self, request: HarnessCall.Request, response: HarnessCall.Response) -> HarnessCall.Response:
        try:
            args = json.loads(request.args_json or "{}")
            result = CallResult.ok(
                request.capability,
                value={"echo": args},
                receipt=f"{request.capability}: ok",
                call_id=request.call_id or "server-assigned",
                episode_id=request.episode_id,
            )
        except json.JSONDecodeError as exc:
            result = CallResult.fail(
                request.capability,
                FailureCategory.INVALID_ARGUMENT,
                f"args_json is not JSON: {exc}",
                call_id=request.call_id,
            )
        response.result = call_result_to_msg(result)
        return response

    def on_goal(self, goal: MoveTo.Goal) -> GoalResponse:
        return GoalResponse.ACCEPT if goal.target_kind == MoveTo.Goal.TARGET_POSE else GoalResponse.REJECT

    def execute(self, goal_handle) -> MoveTo.Result:
        goal = goal_handle.request
        p = goal.pose.pose.position
        target = [p.x, p.y, p.z]
        start = list(self.tcp)
        distance = math.dist(start, target)
        speed = goal.speed_mps or 0.1
        steps = max(1, math.ceil(distance / speed / PERIOD_S))
        feedback = MoveTo.Feedback()
        for i in range(1, steps + 1):
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
                result = CallResult.fail(
                    "move_to",
                    FailureCategory.CANCELED,
                    "canceled by the caller",
                    executed=True,
                    value={"executed_distance_m": feedback.executed_distance_m},
                    call_id=goal.call_id,
                )
                return MoveTo.Result(result=call_result_to_msg(result))
            s = i / steps
            self.tcp = [a + s * (b - a) for a, b in zip(start, target, strict=True)]
            feedback.executed_distance_m = s * distance
            feedback.remaining_distance_m = (1 - s) * distance
            feedback.current_force_n = 0.5
            feedback.peak_force_n = 0.5
            feedback.progress = s
            goal_handle.publish_feedback(feedback)
            time.sleep(PERIOD_S)
        goal_handle.succeed()
        result = CallResult.ok(
            "move_to",
            executed=True,
            value={"executed_distance_m": distance},
            receipt=f"move_to: reached target, moved {distance * 100:.1f} cm",
            call_id=goal.call_id,
        )
        return MoveTo.Result(result=call_result_to_msg(result))


def main() -> None:
    def ready() -> InterfacePeer:
        node = InterfacePeer()
        print("READY", flush=True)
        return node

    spin(ready)  # rclpy.init() + try_shutdown(): Jazzy has no `with rclpy.init()`


if __name__ == "__main__":
    sys.exit(main())

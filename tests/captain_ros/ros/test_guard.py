"""Callbacks that raise never end their node (captain_ros.ros.guard): over DDS, a service that raises answers an
error, an action aborts, a subscription drops the message, and every one of them works again for the next request.

Right after discovery a service can drop its first responses (its response writer has not matched the client's
reader yet, a known DDS race): each server here answers probes it does not count, resent until one is answered,
before the requests that count."""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.action import ActionClient, GoalResponse  # noqa: E402
from rclpy.node import Node  # noqa: E402
from std_msgs.msg import String  # noqa: E402
from std_srvs.srv import SetBool  # noqa: E402

from captain_interfaces.action import MoveTo  # noqa: E402
from captain_interfaces.srv import HarnessCall  # noqa: E402
from captain_ros.core.contract import FailureCategory  # noqa: E402
from captain_ros.ros.convert import call_result_from_msg  # noqa: E402
from captain_ros.ros.guard import GuardedActionServer, GuardedNode  # noqa: E402

from .helpers import result_of, spinning, wait_for  # noqa: E402

pytestmark = pytest.mark.ros
PROBE = "probe"
RESEND_AFTER_S = 2.0  # a probe without an answer by then is sent again (this only decides when; 60 s in all)


def until_answered(send, client=None, what: str = "a probe"):
    """`send()` again every RESEND_AFTER_S until one of its futures is done; its result."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        future = send()
        resend_at = time.monotonic() + RESEND_AFTER_S
        while not future.done() and time.monotonic() < resend_at:
            time.sleep(0.01)
        if future.done():
            return future.result()
        if client is not None:
            client.remove_pending_request(future)
    raise TimeoutError(f"no answer to {what} in 60 s")


class Flaky(GuardedNode, Node):
    """Every callback raises on its first use and works on the second."""

    def __init__(self, context):
        super().__init__("flaky_server", context=context)
        self.calls: dict[str, int] = {}
        self.heard: list[str] = []
        self.create_service(SetBool, "/flaky/trigger", self._trigger)
        self.create_service(HarnessCall, "/flaky/call", self._call)
        self.create_subscription(String, "/flaky/topic", self._topic, 10)
        self.action = GuardedActionServer(self, MoveTo, "/flaky/move_to", self._execute, goal_callback=self._goal)

    def _first(self, name: str) -> bool:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name] == 1

    def _trigger(self, request, response):
        if not request.data:  # a probe
            response.success, response.message = True, "ready"
            return response
        if self._first("trigger"):
            raise RuntimeError("the link is lost")
        response.success, response.message = True, "fine"
        return response

    def _call(self, request, response):
        if request.capability == PROBE:
            return response
        if self._first("call"):
            raise KeyError("no such joint")
        return response

    def _topic(self, msg):
        if self._first("topic"):
            raise ValueError("bad message")
        self.heard.append(msg.data)

    @staticmethod
    def _goal(goal):
        return GoalResponse.REJECT if goal.call_id == PROBE else GoalResponse.ACCEPT

    def _execute(self, goal_handle):
        if self._first("execute"):
            raise RuntimeError("the controller went away")
        goal_handle.succeed()
        return MoveTo.Result()


@pytest.fixture
def flaky():
    with spinning(Flaky) as (node, thread):
        yield node, thread


def test_a_service_that_raises_answers_an_error_and_the_node_goes_on(flaky, client_node):
    _, spinner = flaky
    trigger = client_node.create_client(SetBool, "/flaky/trigger")
    assert trigger.wait_for_service(timeout_sec=30)
    assert until_answered(lambda: trigger.call_async(SetBool.Request(data=False)), trigger).message == "ready"
    first = result_of(trigger.call_async(SetBool.Request(data=True)), 60)
    assert not first.success and "RuntimeError: the link is lost" in first.message
    assert "/flaky/trigger" in first.message
    second = result_of(trigger.call_async(SetBool.Request(data=True)), 60)
    assert (second.success, second.message) == (True, "fine")
    call = client_node.create_client(HarnessCall, "/flaky/call")
    assert call.wait_for_service(timeout_sec=30)
    until_answered(lambda: call.call_async(HarnessCall.Request(capability=PROBE)), call)
    answer = result_of(call.call_async(HarnessCall.Request(capability="observe", args_json="{}")), 60)
    result = call_result_from_msg(answer.result)
    assert result.failure_category is FailureCategory.BACKEND_ERROR and "KeyError" in result.message
    assert result.capability == "observe"
    assert spinner.is_alive()


def test_a_subscription_that_raises_drops_that_message_only(flaky, client_node):
    node, spinner = flaky
    publisher = client_node.create_publisher(String, "/flaky/topic", 10)
    wait_for(lambda: publisher.get_subscription_count() > 0, 30, "the subscription")
    publisher.publish(String(data="first"))
    wait_for(lambda: node.calls.get("topic", 0) >= 1, 30, "the first message")
    publisher.publish(String(data="second"))
    wait_for(lambda: node.heard == ["second"], 30, "the second message")
    assert spinner.is_alive()


def test_an_action_that_raises_aborts_its_goal_and_takes_the_next(flaky, client_node):
    _, spinner = flaky
    client = ActionClient(client_node, MoveTo, "/flaky/move_to")
    wait_for(client.server_is_ready, 60, "the action server's five endpoints")
    assert not until_answered(lambda: client.send_goal_async(MoveTo.Goal(call_id=PROBE))).accepted
    outcomes = []
    for _ in range(2):
        handle = result_of(client.send_goal_async(MoveTo.Goal(call_id="g")), 60)
        assert handle.accepted
        outcomes.append(result_of(handle.get_result_async(), 60))
    aborted = call_result_from_msg(outcomes[0].result.result)
    assert outcomes[0].status == 6  # GoalStatus.STATUS_ABORTED
    assert aborted.failure_category is FailureCategory.BACKEND_ERROR and "controller went away" in aborted.message
    assert outcomes[1].status == 4  # GoalStatus.STATUS_SUCCEEDED
    assert spinner.is_alive()

"""captain_interfaces round trip between two OS processes over DDS on loopback (own domain id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from action_msgs.msg import GoalStatus

from captain_interfaces.action import MoveTo
from captain_interfaces.srv import HarnessCall
from captain_ros.core.contract import FailureCategory
from captain_ros.ros.convert import call_result_from_msg
from captain_ros.ros.spin import SpunActionClient

from .helpers import result_of, wait_for

PEER = Path(__file__).with_name("interface_peer.py")
pytestmark = pytest.mark.ros


@pytest.fixture
def peer(start_peer):
    return start_peer(PEER)


def _move_goal(x: float, speed_mps: float) -> MoveTo.Goal:
    goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE, mode=MoveTo.Goal.MODE_GUARDED, speed_mps=speed_mps)
    goal.pose.pose.position.x, goal.pose.pose.position.z = x, 0.3
    goal.pose.pose.orientation.w = 1.0
    goal.call_id = f"goal-{x}"
    return goal


def test_harness_call_service_round_trip(peer, client_node):
    client = client_node.create_client(HarnessCall, "harness/call")
    assert client.wait_for_service(timeout_sec=20), "HarnessCall service not discovered"
    request = HarnessCall.Request(
        capability="segment", args_json=json.dumps({"text": "red cube"}), call_id="c-1", episode_id="ep-1"
    )
    response = result_of(client.call_async(request))
    result = call_result_from_msg(response.result)
    assert result.success and result.call_id == "c-1" and result.episode_id == "ep-1"
    assert result.value == {"echo": {"text": "red cube"}}
    assert result.budget.requests_limit == 60

    bad = result_of(client.call_async(HarnessCall.Request(capability="segment", args_json="{oops")))
    bad_result = call_result_from_msg(bad.result)
    assert bad_result.failure_category is FailureCategory.INVALID_ARGUMENT
    assert "not JSON" in bad_result.message


def test_move_to_action_feedback_and_success(peer, client_node):
    client = SpunActionClient(client_node, MoveTo, "harness/move_to")
    assert client.wait_for_server(timeout_sec=20), "MoveTo action server not discovered"
    feedback: list[MoveTo.Feedback] = []
    goal_handle = result_of(
        client.send_goal_async(_move_goal(0.5, 0.5), feedback_callback=lambda m: feedback.append(m.feedback))
    )
    assert goal_handle.accepted
    wrapped = result_of(goal_handle.get_result_async())
    assert wrapped.status == GoalStatus.STATUS_SUCCEEDED
    result = call_result_from_msg(wrapped.result.result)
    assert result.success and result.executed and result.call_id == "goal-0.5"
    assert result.value["executed_distance_m"] == pytest.approx(0.1, abs=1e-9)
    assert feedback, "no feedback arrived"
    distances = [f.executed_distance_m for f in feedback]
    assert distances == sorted(distances) and distances[-1] <= 0.1 + 1e-9


def test_move_to_action_cancel_stops_the_motion(peer, client_node):
    client = SpunActionClient(client_node, MoveTo, "harness/move_to")
    assert client.wait_for_server(timeout_sec=20)
    feedback: list[MoveTo.Feedback] = []
    # 1 m at 0.05 m/s would take 20 s: cancel after the first feedback
    goal_handle = result_of(
        client.send_goal_async(_move_goal(1.4, 0.05), feedback_callback=lambda m: feedback.append(m.feedback))
    )
    wait_for(lambda: len(feedback) >= 3, what="feedback")
    cancel = result_of(goal_handle.cancel_goal_async())
    assert len(cancel.goals_canceling) == 1
    wrapped = result_of(goal_handle.get_result_async())
    assert wrapped.status == GoalStatus.STATUS_CANCELED
    result = call_result_from_msg(wrapped.result.result)
    assert result.failure_category is FailureCategory.CANCELED
    assert 0.0 < result.value["executed_distance_m"] < 0.5


def test_move_to_rejects_a_goal_it_cannot_serve(peer, client_node):
    client = SpunActionClient(client_node, MoveTo, "harness/move_to")
    assert client.wait_for_server(timeout_sec=20)
    goal_handle = result_of(client.send_goal_async(MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_JAW)))
    assert not goal_handle.accepted

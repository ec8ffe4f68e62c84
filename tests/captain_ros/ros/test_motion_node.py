"""motion_node over DDS: twin_node and motion_node in their own processes, this test as the agent.
MoveTo with feedback and cancel, HarnessCall, the receipts topic, stop/resume, the heartbeat
watchdog and new episodes; the node as `ros2 run` starts it (autostart: configured and active). Its lifecycle
transitions and the rejection of a second goal are in test_motion_lifecycle.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from action_msgs.msg import GoalStatus
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import GetState
from std_msgs.msg import Empty
from std_srvs.srv import Trigger
from visualization_msgs.msg import MarkerArray

from captain_interfaces.action import MoveTo
from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import HarnessCall
from captain_ros.ros.spin import SpunActionClient

from .helpers import (
    launch_motion_node,
    launch_twin,
    node_processes,
    result_of,
    wait_for,
)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TASK = "put_red_cube_in_bowl"
WATCHDOG_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def nodes():
    with node_processes() as started:
        started["twin"] = launch_twin(TASK, f"{TASK}/official/0", real_time_factor=1.0, camera_rate_hz=0.0)
        # a starved test process can miss heartbeats for over a second: only the watchdog test goes silent
        started["motion"] = launch_motion_node(("watchdog_timeout_s", WATCHDOG_TIMEOUT_S))
        yield started["motion"][1], started["twin"][1]


@dataclass
class Agent:
    node: object
    call: Callable[..., CallResultMsg]  # call("capability", **kwargs) through /harness/call
    trigger: Callable[[str], Trigger.Response]  # trigger("stop" | "resume" | "new_episode")
    move: SpunActionClient  # /harness/move_to
    receipts: list[CallResultMsg]
    beating: list[bool]  # set beating[0] = False to silence the heartbeat


@pytest.fixture
def agent(nodes, client_node) -> Agent:
    """The test as the agent: heartbeats at 10 Hz, the harness services, and every receipt."""
    node = client_node
    heartbeat = node.create_publisher(Empty, "/agent/heartbeat", 10)
    beating = [True]
    node.create_timer(0.1, lambda: beating[0] and heartbeat.publish(Empty()))
    receipts: list[CallResultMsg] = []
    node.create_subscription(CallResultMsg, "/harness/receipts", receipts.append, 50)
    call = node.create_client(HarnessCall, "/harness/call")
    if not call.wait_for_service(timeout_sec=60):
        raise RuntimeError("motion_node did not come up:\n" + "".join(nodes[0]) + "".join(nodes[1]))
    services = {name: node.create_client(Trigger, f"/harness/{name}") for name in ("stop", "resume", "new_episode")}
    for client in services.values():
        assert client.wait_for_service(timeout_sec=20)
    move = SpunActionClient(node, MoveTo, "/harness/move_to")
    assert move.wait_for_server(timeout_sec=20)
    assert result_of(services["new_episode"].call_async(Trigger.Request()), 10).success

    def harness(capability: str, **kwargs) -> CallResultMsg:
        request = HarnessCall.Request(capability=capability, args_json=json.dumps(kwargs))
        return result_of(call.call_async(request), 60).result

    def trigger(name: str) -> Trigger.Response:
        return result_of(services[name].call_async(Trigger.Request()), 10)

    return Agent(node, harness, trigger, move, receipts, beating)


def _pose_goal(x: float, y: float, z: float, **fields) -> MoveTo.Goal:
    goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE, **fields)
    goal.pose.pose.position.x, goal.pose.pose.position.y, goal.pose.pose.position.z = x, y, z
    goal.pose.pose.orientation.x, goal.pose.pose.orientation.w = 1.0, 0.0  # fingers down
    return goal


def _under_way(feedback: list) -> bool:
    """The motion has begun moving the arm (not only measured its force baseline)."""
    return bool(feedback) and feedback[-1].executed_distance_m > 0.01


def _run(move: SpunActionClient, goal: MoveTo.Goal, cancel_when_under_way: bool = False):
    feedback = []
    handle = result_of(move.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)), 10)
    assert handle.accepted
    if cancel_when_under_way:
        wait_for(lambda: _under_way(feedback), 60, "the motion to be under way")
        result_of(handle.cancel_goal_async(), 10)
    wrapped = result_of(handle.get_result_async(), 120)
    return wrapped.status, wrapped.result.result, feedback


def test_autostart_configures_and_activates_the_lifecycle_node(agent):
    get_state = agent.node.create_client(GetState, "/motion/get_state")
    assert get_state.wait_for_service(timeout_sec=20)

    def state() -> int:
        return result_of(get_state.call_async(GetState.Request()), 10).current_state.id

    # the harness services appear while the node is still `activating`: it becomes active right after
    wait_for(lambda: state() == State.PRIMARY_STATE_ACTIVE, 60, "the motion node to become active")


def test_calls_return_results_and_every_receipt_is_published(agent):
    state = agent.call("get_robot_state")
    assert state.success and state.receipt.startswith("get_robot_state: tcp")
    assert json.loads(state.value_json)["jaw_opening_m"] == pytest.approx(0.08, abs=0.002)
    bad_json = result_of(
        agent.node.create_client(HarnessCall, "/harness/call").call_async(
            HarnessCall.Request(capability="get_robot_state", args_json="{not json")
        ),
        10,
    ).result
    assert bad_json.failure_category == "invalid_argument" and "args_json" in bad_json.message
    unknown = agent.call("teleport", where="moon")
    assert unknown.failure_category == "invalid_argument" and "unknown capability" in unknown.message
    wait_for(lambda: len(agent.receipts) >= 3, 10, "three receipts")
    assert [r.capability for r in agent.receipts[-3:]] == ["get_robot_state", "get_robot_state", "teleport"]
    assert agent.receipts[-3].budget.requests_limit == 60


def test_move_to_action_gives_feedback_and_a_call_result(agent):
    paths: list[MarkerArray] = []
    agent.node.create_subscription(MarkerArray, "/captain/markers", paths.append, 10)
    status, result, feedback = _run(agent.move, _pose_goal(0.45, 0.05, 0.35, speed_mps=0.1))
    assert status == GoalStatus.STATUS_SUCCEEDED and result.success and result.executed
    assert "target_reached" in result.receipt and result.budget.actions_used >= 1
    assert len(feedback) >= 3 and feedback[-1].progress > feedback[0].progress
    assert feedback[-1].executed_distance_m > 0.05
    motion_id = json.loads(result.value_json)["motion_id"]
    wait_for(lambda: any(m.ns == "motions" and m.id == motion_id for a in paths for m in a.markers), 10, "the path")
    jaw_status, jaw, _ = _run(agent.move, MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_JAW, jaw_opening_m=0.04))
    assert jaw_status == GoalStatus.STATUS_SUCCEEDED and "jaw closed 80->40 mm" in jaw.receipt
    assert json.loads(agent.call("gripper_state").value_json)["opening_m"] == pytest.approx(0.04, abs=0.002)


def test_cancel_and_bad_goals(agent):
    move = agent.move
    # slow and long (~20 s): the cancel arrives while it moves however slowly this process is scheduled
    status, result, _ = _run(move, _pose_goal(0.45, -0.25, 0.25, speed_mps=0.02), cancel_when_under_way=True)
    assert status == GoalStatus.STATUS_CANCELED and result.failure_category == "canceled" and result.executed
    wrong_frame = _pose_goal(0.45, 0.0, 0.3)
    wrong_frame.pose.header.frame_id = "map"
    status, result, _ = _run(move, wrong_frame)
    assert status == GoalStatus.STATUS_ABORTED and result.failure_category == "invalid_argument"
    assert "frame_id" in result.message
    status, result, _ = _run(move, MoveTo.Goal(target_kind=7))
    assert result.failure_category == "invalid_argument" and "target_kind" in result.message
    outside = _run(move, _pose_goal(1.5, 0.0, 0.3))[1]
    assert outside.failure_category == "workspace_limit" and not outside.executed


def test_stop_service_halts_motion_and_refuses_more_until_resume(agent):
    feedback = []
    goal = _pose_goal(0.5, 0.2, 0.3, speed_mps=0.02)
    handle = result_of(agent.move.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)), 10)
    wait_for(lambda: _under_way(feedback), 60, "the motion to be under way")
    assert agent.trigger("stop").success
    stopped = result_of(handle.get_result_async(), 30).result.result
    assert stopped.failure_category == "safety_stop" and stopped.executed
    refused = agent.call("move_to", pose={"position": [0.45, 0.0, 0.3], "yaw_deg": 0})
    assert refused.failure_category == "safety_stop" and not refused.executed
    assert agent.trigger("resume").success
    assert agent.call("move_to", pose={"position": [0.45, 0.0, 0.3], "yaw_deg": 0}).success


def test_watchdog_holds_the_arm_when_the_agent_goes_silent(agent):
    agent.beating[0] = False  # the agent dies: no more heartbeats
    # a ~25 s motion: the watchdog (5 s without a heartbeat or a call) stops it long before it could end
    status, result, _ = _run(agent.move, _pose_goal(0.45, 0.25, 0.2, speed_mps=0.02))
    assert status == GoalStatus.STATUS_ABORTED and result.failure_category == "safety_stop"
    assert "watchdog" in result.message
    agent.beating[0] = True
    episode = agent.trigger("new_episode")
    assert episode.success and len(episode.message) == 32
    assert agent.call("get_robot_state").budget.actions_used == 0


def test_calls_waiting_for_the_arm_do_not_starve_the_motion(agent):
    """More calls wait for the arm than the motion node's executor has threads: the motion still sees the arm's
    state (the ros2_control backend spins its own node) and ends at its target; then every waiting call is served."""
    feedback = []
    goal = _pose_goal(0.45, 0.1, 0.3, speed_mps=0.02)  # ~8 s: longer than the loaded-machine link limit
    handle = result_of(agent.move.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)), 10)
    wait_for(lambda: _under_way(feedback), 60, "the motion to be under way")
    client = agent.node.create_client(HarnessCall, "/harness/call")
    assert client.wait_for_service(timeout_sec=20)
    waiting = [client.call_async(HarnessCall.Request(capability="get_robot_state")) for _ in range(6)]
    moved = result_of(handle.get_result_async(), 120).result.result
    assert moved.success, moved.message
    answers = [result_of(future, 120).result for future in waiting]
    assert all(a.success for a in answers), [a.message for a in answers if not a.success]

"""The motion node's safety supervisor over DDS: twin_node is the arm, motion_node runs as `ros2 run` starts it,
and this test is agent and operator at once.

Approval mode (switched on and off at run time through the node's parameters): a motion waits, its request
published, until an operator approves it through /safety/approve or the terminal prompt; a rejection fails the
call and nothing moves; no answer times out into a hold. The e-stop, by topic and by service, halts a running
motion, withdraws a pending request and refuses every motion ("e-stop engaged by <source>") until an operator
clears it, which needs the topic to read false first. The workspace box and the supervisor's state are
latched. Each test leaves the supervisor as it found it (e-stop clear, approval mode off)."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from action_msgs.msg import GoalStatus
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Empty
from std_srvs.srv import Trigger
from visualization_msgs.msg import MarkerArray

from captain_interfaces.action import MoveTo
from captain_interfaces.msg import ApprovalRequest, SafetyState
from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import Approve, HarnessCall
from captain_ros.core.config import load_config
from captain_ros.ros.safety import ApprovalPrompt
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
ARM = [f"panda_joint{i}" for i in range(1, 8)]
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
LONG_S = 100.0  # an approval timeout no loaded machine reaches (below the agent's 120 s cell limit, as it must be)


@pytest.fixture(scope="module")
def nodes():
    with node_processes() as started:
        started["twin"] = launch_twin(TASK, f"{TASK}/official/0", real_time_factor=1.0, camera_rate_hz=0.0)
        # the test beats at 10 Hz; a starved test process can miss a second
        started["motion"] = launch_motion_node(("watchdog_timeout_s", 5.0))
        yield started["motion"][1], started["twin"][1]


@dataclass
class Operator:
    node: object
    output: list[str]
    move: SpunActionClient
    clients: dict
    estop_topic: object
    receipts: list[CallResultMsg] = field(default_factory=list)
    states: list[SafetyState] = field(default_factory=list)
    requests: list[ApprovalRequest] = field(default_factory=list)
    joint_states: list[JointState] = field(default_factory=list)

    def call_async(self, capability: str, **kwargs):
        request = HarnessCall.Request(capability=capability, args_json=json.dumps(kwargs))
        return self.clients["call"].call_async(request)

    def call(self, capability: str, **kwargs) -> CallResultMsg:
        return result_of(self.call_async(capability, **kwargs), 120).result

    def trigger(self, name: str) -> Trigger.Response:
        return result_of(self.clients[name].call_async(Trigger.Request()), 30)

    def answer(self, request_id: str, approve: bool, note: str = "") -> Approve.Response:
        request = Approve.Request(request_id=request_id, approve=approve, note=note)
        return result_of(self.clients["approve"].call_async(request), 30)

    def parameters(self, accepted: bool = True, **values: bool | float) -> list:
        def value(v: bool | float) -> ParameterValue:
            if isinstance(v, bool):
                return ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=v)
            return ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=float(v))

        request = SetParameters.Request(parameters=[Parameter(name=n, value=value(v)) for n, v in values.items()])
        results = result_of(self.clients["set_parameters"].call_async(request), 30).results
        if accepted:
            assert all(r.successful for r in results), [r.reason for r in results]
        return results

    def state(self, predicate, what: str) -> SafetyState:
        """Wait for a supervisor state that satisfies `predicate` (the latest one is judged)."""
        wait_for(lambda: bool(self.states) and predicate(self.states[-1]), 60, what)
        return self.states[-1]

    def request(self, capability: str) -> ApprovalRequest:
        """Wait for a new approval request of `capability`."""
        seen = len(self.requests)
        wait_for(
            lambda: any(r.capability == capability for r in self.requests[seen:]) or _pending(self, capability),
            60,
            f"an approval request for {capability}",
        )
        return next((r for r in self.requests[seen:] if r.capability == capability), None) or _pending(self, capability)

    def arm_q(self) -> np.ndarray:
        wait_for(lambda: bool(self.joint_states), 30, "a joint state")
        msg = self.joint_states[-1]
        index = {n: i for i, n in enumerate(msg.name)}
        return np.array([msg.position[index[j]] for j in ARM])

    def tcp(self) -> np.ndarray:
        return np.array(json.loads(self.call("get_robot_state").value_json)["tcp_pose"]["position"])


def _pending(op: Operator, capability: str) -> ApprovalRequest | None:
    """A pending request of `capability` in the latest state (published before or after the request itself)."""
    if not op.states:
        return None
    return next((r for r in op.states[-1].pending if r.capability == capability), None)


@pytest.fixture
def op(nodes, client_node):
    node = client_node
    heartbeat = node.create_publisher(Empty, "/agent/heartbeat", 10)
    node.create_timer(0.1, lambda: heartbeat.publish(Empty()))
    clients = {
        "call": node.create_client(HarnessCall, "/harness/call"),
        "resume": node.create_client(Trigger, "/harness/resume"),
        "estop": node.create_client(Trigger, "/safety/estop"),
        "clear_estop": node.create_client(Trigger, "/safety/clear_estop"),
        "approve": node.create_client(Approve, "/safety/approve"),
        "set_parameters": node.create_client(SetParameters, "/motion/set_parameters"),
    }
    estop_topic = node.create_publisher(Bool, "/safety/estop", RELIABLE)  # a button's bridge
    operator = Operator(node, nodes[0], SpunActionClient(node, MoveTo, "/harness/move_to"), clients, estop_topic)
    node.create_subscription(CallResultMsg, "/harness/receipts", operator.receipts.append, 50)
    node.create_subscription(SafetyState, "/safety/state", operator.states.append, LATCHED)
    node.create_subscription(ApprovalRequest, "/safety/approval_requests", operator.requests.append, RELIABLE)
    node.create_subscription(JointState, "/joint_states", operator.joint_states.append, 10)
    for name, client in clients.items():  # /harness/call appears once the node is active
        if not client.wait_for_service(timeout_sec=120):
            raise RuntimeError(f"motion_node serves no {name}:\n" + "".join(nodes[0]) + "".join(nodes[1]))
    assert operator.move.wait_for_server(timeout_sec=30)
    wait_for(lambda: operator.estop_topic.get_subscription_count() > 0, 30, "the e-stop topic's subscriber")
    yield operator
    # leave the supervisor as the next test expects it: e-stop released and cleared, approval mode off
    operator.estop_topic.publish(Bool(data=False))
    operator.state(lambda s: not s.estop_inputs_pressed, "the e-stop input to read released")
    operator.parameters(estop_deadline_s=0.0)
    assert operator.trigger("clear_estop").success
    operator.parameters(approval_mode=False, approval_timeout_s=0.0)
    assert operator.trigger("resume").success


def _pose_goal(x: float, y: float, z: float, **fields) -> MoveTo.Goal:
    goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE, **fields)
    goal.pose.pose.position.x, goal.pose.pose.position.y, goal.pose.pose.position.z = x, y, z
    goal.pose.pose.orientation.x, goal.pose.pose.orientation.w = 1.0, 0.0  # fingers down
    return goal


def _start_slow_motion(op: Operator, x: float, y: float, z: float):
    """A slow, long MoveTo (~20 s): whatever stops it arrives while it moves. Returns its handle once under way."""
    feedback = []
    goal = _pose_goal(x, y, z, speed_mps=0.02)
    handle = result_of(op.move.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)), 30)
    assert handle.accepted
    wait_for(lambda: bool(feedback) and feedback[-1].executed_distance_m > 0.01, 60, "the motion to be under way")
    return handle


def _home(op: Operator) -> None:
    """Back to a pose the tests start from (approval mode off, e-stop clear)."""
    result = op.call("move_to", pose={"position": [0.45, 0.0, 0.35], "yaw_deg": 0}, speed_mps=0.15)
    assert result.success, result.message


def _refused_everywhere(op: Operator, source: str) -> None:
    """Every motion is refused with the e-stop's source: calls, MoveTo goals, and after the agent's resume."""
    words = f"e-stop engaged by {source}"
    refused = op.call("move_to", pose={"position": [0.45, 0.0, 0.3], "yaw_deg": 0})
    assert refused.failure_category == "safety_stop" and not refused.executed and words in refused.receipt
    assert words in op.call("move_to", gripper=0.05).receipt
    goal = _pose_goal(0.45, 0.0, 0.3, call_id="goal-under-estop")
    assert not result_of(op.move.send_goal_async(goal), 30).accepted
    wait_for(lambda: any(r.call_id == "goal-under-estop" for r in op.receipts), 30, "the rejection's receipt")
    assert words in next(r for r in op.receipts if r.call_id == "goal-under-estop").message
    assert op.trigger("resume").success  # the agent's resume is no e-stop reset
    assert words in op.call("hold", duration_s=0.1).message


def test_the_workspace_box_and_the_supervisor_state_are_latched(op):
    markers: list[MarkerArray] = []
    op.node.create_subscription(MarkerArray, "/captain/markers", markers.append, LATCHED)  # joins late

    def box():
        return next((m for a in markers for m in a.markers if m.ns == "workspace"), None)

    wait_for(lambda: box() is not None, 60, "the workspace box")
    marker, safety = box(), load_config().safety
    assert marker.type == marker.LINE_LIST and len(marker.points) == 24  # 12 edges
    points = np.array([[p.x, p.y, p.z] for p in marker.points])
    np.testing.assert_allclose(points.min(axis=0), safety.workspace_min_m)
    np.testing.assert_allclose(points.max(axis=0), safety.workspace_max_m)
    assert marker.header.frame_id == op.call("get_robot_state").header.frame_id == "panda_link0"
    state = op.state(lambda s: True, "the supervisor's state")
    assert not state.estop_engaged and not state.approval_mode and state.approval_timeout_s == 30.0  # safety.yaml
    assert list(state.pending) == []


def test_approval_blocks_a_motion_until_an_operator_approves_it(op):
    _home(op)
    markers: list[MarkerArray] = []
    op.node.create_subscription(MarkerArray, "/captain/markers", markers.append, LATCHED)

    def sweep():  # the latest word on the sweep waiting for approval
        return next((m for a in reversed(markers) for m in a.markers if m.ns == "approval"), None)

    op.parameters(approval_mode=True, approval_timeout_s=LONG_S)
    op.state(lambda s: s.approval_mode, "approval mode on")
    feedback = []
    goal = _pose_goal(0.45, 0.1, 0.3, speed_mps=0.1, call_id="approved-goal")
    handle = result_of(op.move.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)), 30)
    assert handle.accepted
    request = op.request("move_to")
    assert request.has_target_pose and request.header.frame_id == "panda_link0"
    target = request.target_pose.position
    np.testing.assert_allclose([target.x, target.y, target.z], [0.45, 0.1, 0.3], atol=1e-4)
    assert request.description.startswith("move_to (guarded): TCP (") and "-> (0.450, 0.100, 0.300) m" in (
        request.description
    )
    assert json.loads(request.args_json)["pose"]["position"] == [0.45, 0.1, 0.3]
    assert request.deadline.sec > time.time() and request.timeout_s == LONG_S
    op.state(lambda s: [r.request_id for r in s.pending] == [request.request_id], "the pending request")
    wait_for(lambda: sweep() is not None and sweep().action == sweep().ADD, 30, "the sweep drawn for the operator")
    end = sweep().points[-1]
    np.testing.assert_allclose([end.x, end.y, end.z], [0.45, 0.1, 0.3], atol=1e-3)
    # it waits: no result, no feedback, the arm where it was
    q0 = op.arm_q()
    result_future = handle.get_result_async()
    assert not result_future.done() and feedback == []
    np.testing.assert_allclose(op.arm_q(), q0, atol=2e-3)
    assert not op.answer("no-such-id", True).success
    reply = op.answer(request.request_id, True, "clear path")
    assert reply.success and reply.message == "approved: clear path"
    wrapped = result_of(result_future, 120)
    assert wrapped.status == GoalStatus.STATUS_SUCCEEDED and "target_reached" in wrapped.result.result.receipt
    state = op.state(lambda s: not s.pending, "no pending request")
    assert state.last_decision == f"{request.request_id} move_to: approved (clear path)"
    wait_for(lambda: sweep().action == sweep().DELETE, 30, "the answered sweep to be taken down")


def test_a_rejected_action_fails_clearly_and_the_arm_does_not_move(op):
    _home(op)
    tcp0 = op.tcp()
    op.parameters(approval_mode=True, approval_timeout_s=LONG_S)
    future = op.call_async("move_to", pose={"position": [0.5, -0.1, 0.25], "yaw_deg": 0})
    request = op.request("move_to")
    assert op.answer(request.request_id, False, "the bowl is in the way").success
    result = result_of(future, 120).result
    assert result.failure_category == "safety_stop" and not result.executed
    assert "the operator rejected move_to: the bowl is in the way; the arm holds" in result.receipt
    op.parameters(approval_mode=False)
    np.testing.assert_allclose(op.tcp(), tcp0, atol=0.002)


def test_an_unanswered_request_times_out_into_a_hold(op):
    _home(op)
    q0, tcp0 = op.arm_q(), op.tcp()
    op.parameters(approval_mode=True, approval_timeout_s=2.0)
    state = op.state(lambda s: s.approval_mode and s.approval_timeout_s == 2.0, "the short timeout")
    result = op.call("move_to", pose={"position": [0.5, 0.1, 0.25], "yaw_deg": 0})
    assert result.failure_category == "timeout" and not result.executed
    assert "no operator approval for move_to: no answer within 2 s; the arm holds" in result.message
    state = op.state(lambda s: not s.pending and "timed_out" in s.last_decision, "the request to have timed out")
    assert state.last_decision.endswith("move_to: timed_out (no answer within 2 s)")
    np.testing.assert_allclose(op.arm_q(), q0, atol=2e-3)
    op.parameters(approval_mode=False)
    np.testing.assert_allclose(op.tcp(), tcp0, atol=0.002)


def test_an_approval_timeout_at_or_above_the_agents_cell_limit_is_refused(op):
    """An approval wait must end before the agent's cell time limit (harness.yaml agent.cell_timeout_s), or an
    action could be approved after the agent killed the cell that asked for it."""
    limit = load_config().agent.cell_timeout_s
    (result,) = op.parameters(accepted=False, approval_timeout_s=limit)
    assert not result.successful and "shorter than the agent's cell time limit" in result.reason
    op.parameters(approval_timeout_s=limit / 2)  # below it: accepted
    op.parameters(approval_timeout_s=0.0)  # back to safety.yaml's


def test_the_terminal_prompt_shows_requests_and_answers_them(op):
    op.parameters(approval_mode=True, approval_timeout_s=LONG_S)
    shown: list[str] = []
    typed = ["maybe", "y jaw looks clear"]  # a confused operator first, then an answer

    def read_line(timeout_s: float) -> str | None:
        if not any("approve? [y/n" in text for text in shown) or not typed:
            time.sleep(min(timeout_s, 0.05))
            return None
        return typed.pop(0)

    prompt = ApprovalPrompt(op.node, read_line, shown.append)
    done = threading.Event()
    worker = threading.Thread(target=prompt.run, args=(done,), daemon=True)
    worker.start()
    try:
        result = op.call("move_to", gripper=0.04)
    finally:
        done.set()
        worker.join(30)
    text = "".join(shown)
    assert result.success and "jaw closed 80->40 mm" in result.receipt, (result.message, text)
    assert "move_to: jaw 80 -> 40 mm" in text and "jaw target: 40 mm" in text
    assert "answer y or n" in text and "approved: jaw looks clear" in text
    op.parameters(approval_mode=False)
    assert op.call("move_to", gripper="open").success


def test_the_estop_topic_halts_a_running_motion_and_refuses_motions_until_released_and_cleared(op):
    _home(op)
    handle = _start_slow_motion(op, 0.45, 0.25, 0.2)
    op.estop_topic.publish(Bool(data=True))  # the button's bridge: pressed
    wrapped = result_of(handle.get_result_async(), 60)
    stopped = wrapped.result.result
    assert wrapped.status == GoalStatus.STATUS_ABORTED and stopped.failure_category == "safety_stop"
    assert stopped.executed and "e-stop engaged by the /safety/estop topic" in stopped.receipt
    end = json.loads(stopped.value_json)
    assert end["distance_to_target_m"] > 0.05  # stopped on the way, not at the target ...
    np.testing.assert_allclose(op.tcp(), end["tcp_position_m"], atol=0.005)  # ... and holds there
    state = op.state(lambda s: s.estop_engaged, "the e-stop in the state")
    assert state.estop_source == "the /safety/estop topic" and list(state.estop_inputs_pressed) == [
        "the /safety/estop topic"
    ]
    _refused_everywhere(op, "the /safety/estop topic")
    refused = op.trigger("clear_estop")  # the button still reads pressed
    assert not refused.success and "release the e-stop" in refused.message
    op.estop_topic.publish(Bool(data=False))
    op.state(lambda s: not s.estop_inputs_pressed and s.estop_engaged, "released, still engaged")
    assert "e-stop engaged by" in op.call("move_to", gripper=0.05).message  # a release alone restarts nothing
    cleared = op.trigger("clear_estop")
    assert cleared.success and "engaged by the /safety/estop topic" in cleared.message
    op.state(lambda s: not s.estop_engaged, "the e-stop cleared")
    _home(op)


def test_a_silent_estop_bridge_halts_the_arm_and_blocks_the_reset_until_it_speaks_released(op):
    """With a deadline on /safety/estop (here 1 s, set at run time) a bridge that stops publishing engages the
    e-stop in the topic's name: the running motion stops and holds, motions are refused, and the reset is refused
    until the bridge speaks again, reading false."""
    for bad in (-1.0, math.inf, math.nan):  # refused with the reason; the deadline stays off
        (refused,) = op.parameters(accepted=False, estop_deadline_s=bad)
        assert not refused.successful and "estop_deadline_s must be a float >= 0" in refused.reason
    assert not op.states[-1].estop_engaged
    _home(op)
    handle = _start_slow_motion(op, 0.45, 0.25, 0.2)
    op.parameters(estop_deadline_s=1.0)  # watched from now; nothing publishes on the topic
    wrapped = result_of(handle.get_result_async(), 60)
    stopped = wrapped.result.result
    assert wrapped.status == GoalStatus.STATUS_ABORTED and stopped.failure_category == "safety_stop"
    assert "e-stop engaged by the /safety/estop topic" in stopped.receipt
    end = json.loads(stopped.value_json)
    assert end["distance_to_target_m"] > 0.05
    np.testing.assert_allclose(op.tcp(), end["tcp_position_m"], atol=0.005)  # it holds where it stopped
    state = op.state(lambda s: s.estop_engaged, "the e-stop in the state")
    assert state.estop_source == "the /safety/estop topic" and "past its 1 s deadline" in state.estop_reason
    _refused_everywhere(op, "the /safety/estop topic")
    refused = op.trigger("clear_estop")
    assert not refused.success and "went silent past its deadline: restore its bridge" in refused.message
    op.parameters(estop_deadline_s=600.0)  # re-armed from now: no second lapse while this test waits; still silent
    assert "went silent" in op.trigger("clear_estop").message
    op.estop_topic.publish(Bool(data=False))  # the bridge is back, released
    wait_for(lambda: op.trigger("clear_estop").success, 60, "the reset once the bridge spoke")
    op.state(lambda s: not s.estop_engaged, "the e-stop cleared")
    op.parameters(estop_deadline_s=0.0)
    _home(op)


def test_the_estop_service_halts_a_running_motion_and_withdraws_a_pending_approval(op):
    _home(op)
    handle = _start_slow_motion(op, 0.45, -0.25, 0.2)
    engaged = op.trigger("estop")
    assert engaged.success and "clear_estop" in engaged.message
    stopped = result_of(handle.get_result_async(), 60).result.result
    assert stopped.failure_category == "safety_stop" and stopped.executed
    assert "e-stop engaged by the /safety/estop service" in stopped.receipt
    assert json.loads(stopped.value_json)["distance_to_target_m"] > 0.05
    _refused_everywhere(op, "the /safety/estop service")
    assert op.trigger("clear_estop").success
    _home(op)
    # an e-stop while an operator is being asked withdraws the request, and the call fails with the e-stop
    op.parameters(approval_mode=True, approval_timeout_s=LONG_S)
    q0 = op.arm_q()
    future = op.call_async("move_to", pose={"position": [0.5, 0.0, 0.25], "yaw_deg": 0})
    request = op.request("move_to")
    assert op.trigger("estop").success
    result = result_of(future, 60).result
    assert result.failure_category == "safety_stop" and not result.executed
    assert "e-stop engaged by the /safety/estop service" in result.receipt
    state = op.state(lambda s: not s.pending and s.estop_engaged, "the request withdrawn")
    assert state.last_decision.startswith(f"{request.request_id} move_to: withdrawn (e-stop engaged by")
    assert not op.answer(request.request_id, True).success  # too late: nothing to approve
    np.testing.assert_allclose(op.arm_q(), q0, atol=2e-3)

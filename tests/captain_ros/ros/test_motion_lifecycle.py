"""motion_node as a managed (lifecycle) node over DDS: twin_node is the arm, motion_node starts with
autostart:=false, and this test drives /motion/change_state as an operator would (`ros2 lifecycle set`).

Unconfigured and inactive, goals and calls are refused with the node's state as the reason; configure checks the
arm's interfaces and fails, naming what is missing, against a profile with nothing behind it; deactivating
during a motion stops and holds the arm; a second MoveTo goal while one runs is rejected, its reason on the
receipts topic. Each test first drives the node to the state it starts from, so each runs on its own."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml
from action_msgs.msg import GoalStatus
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rcl_interfaces.srv import SetParameters
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from captain_interfaces.action import MoveTo
from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import HarnessCall
from captain_ros.paths import config_path
from captain_ros.ros.ros2_control_backend import HORIZON_S
from captain_ros.ros.spin import SpunActionClient

from .helpers import (
    launch_motion_node,
    launch_twin,
    node_processes,
    result_of,
    set_parameters,
    wait_for,
)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TASK = "put_red_cube_in_bowl"
ARM = [f"panda_joint{i}" for i in range(1, 8)]
LABELS = {
    State.PRIMARY_STATE_UNCONFIGURED: "unconfigured",
    State.PRIMARY_STATE_INACTIVE: "inactive",
    State.PRIMARY_STATE_ACTIVE: "active",
}
UP = {"unconfigured": Transition.TRANSITION_CONFIGURE, "inactive": Transition.TRANSITION_ACTIVATE}
DOWN = {"active": Transition.TRANSITION_DEACTIVATE, "inactive": Transition.TRANSITION_CLEANUP}
ORDER = ["unconfigured", "inactive", "active"]
GOOD = {"robot_profile": "panda_twin", "connect_timeout_s": 60.0}  # a starved twin may take a while to be found


@pytest.fixture(scope="module")
def nodes():
    with node_processes() as started:
        started["twin"] = launch_twin(TASK, f"{TASK}/official/0", real_time_factor=1.0, camera_rate_hz=0.0)
        started["motion"] = launch_motion_node(("autostart", False), ("watchdog", False))
        yield started["motion"][1], started["twin"][1]


@dataclass
class Operator:
    """The test as operator and agent: lifecycle and parameter services, the harness, the arm's joint states."""

    node: object
    output: list[str]  # the motion node's console lines
    move: SpunActionClient
    receipts: list[CallResultMsg]
    joint_states: list[JointState] = field(default_factory=list)
    clients: dict = field(default_factory=dict)

    def state(self) -> str:
        reply = result_of(self.clients["get_state"].call_async(GetState.Request()), 30)
        return LABELS.get(reply.current_state.id, reply.current_state.label)

    def change(self, transition: int) -> bool:
        request = ChangeState.Request(transition=Transition(id=transition))
        return result_of(self.clients["change_state"].call_async(request), 120).success

    def drive_to(self, target: str) -> None:
        """Take the node to `target` by the standard transitions (configure with the panda twin's profile)."""
        state = self.state()
        while state != target:
            if ORDER.index(state) < ORDER.index(target):
                if state == "unconfigured":
                    set_parameters(self.clients["set_parameters"], **GOOD)
                assert self.change(UP[state]), f"{UP[state]} failed from {state}:\n{''.join(self.output[-20:])}"
            else:
                assert self.change(DOWN[state]), f"{DOWN[state]} failed from {state}"
            state = self.state()

    def call(self, capability: str, **kwargs) -> CallResultMsg:
        request = HarnessCall.Request(capability=capability, args_json=json.dumps(kwargs))
        return result_of(self.clients["call"].call_async(request), 120).result

    def trigger(self, name: str) -> Trigger.Response:
        return result_of(self.clients[name].call_async(Trigger.Request()), 30)

    def receipt(self, call_id: str) -> CallResultMsg:
        wait_for(lambda: any(r.call_id == call_id for r in self.receipts), 30, f"the receipt of {call_id}")
        return next(r for r in self.receipts if r.call_id == call_id)

    def rejected(self, goal: MoveTo.Goal) -> CallResultMsg:
        """Send a goal that must be rejected; returns the receipt that says why."""
        handle = result_of(self.move.send_goal_async(goal), 30)
        assert not handle.accepted, f"goal {goal.call_id} was accepted"
        return self.receipt(goal.call_id)

    def velocities_after(self, count: int) -> np.ndarray:
        """The arm's joint velocities in the next `count` joint-state messages (waits for them)."""
        start = len(self.joint_states)
        wait_for(lambda: len(self.joint_states) >= start + count, 60, f"{count} joint states")
        rows = []
        for msg in self.joint_states[start : start + count]:
            index = {n: i for i, n in enumerate(msg.name)}
            rows.append([msg.velocity[index[j]] for j in ARM])
        return np.array(rows)


@pytest.fixture
def operator(nodes, client_node) -> Operator:
    node = client_node
    receipts: list[CallResultMsg] = []
    node.create_subscription(CallResultMsg, "/harness/receipts", receipts.append, 50)
    op = Operator(node, nodes[0], SpunActionClient(node, MoveTo, "/harness/move_to"), receipts)
    node.create_subscription(JointState, "/joint_states", op.joint_states.append, 50)
    op.clients = {
        "get_state": node.create_client(GetState, "/motion/get_state"),
        "change_state": node.create_client(ChangeState, "/motion/change_state"),
        "set_parameters": node.create_client(SetParameters, "/motion/set_parameters"),
        "call": node.create_client(HarnessCall, "/harness/call"),
        "stop": node.create_client(Trigger, "/harness/stop"),
    }
    for name, client in op.clients.items():
        if not client.wait_for_service(timeout_sec=60):
            raise RuntimeError(f"motion_node serves no {name}:\n" + "".join(nodes[0]) + "".join(nodes[1]))
    assert op.move.wait_for_server(timeout_sec=30)
    return op


def _pose_goal(x: float, y: float, z: float, call_id: str, **fields) -> MoveTo.Goal:
    goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE, call_id=call_id, **fields)
    goal.pose.pose.position.x, goal.pose.pose.position.y, goal.pose.pose.position.z = x, y, z
    goal.pose.pose.orientation.x, goal.pose.pose.orientation.w = 1.0, 0.0  # fingers down
    return goal


def _start(op: Operator, goal: MoveTo.Goal):
    """Send a slow goal and wait until it moves the arm; returns its handle."""
    feedback = []
    handle = result_of(op.move.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)), 30)
    assert handle.accepted
    wait_for(lambda: bool(feedback) and feedback[-1].executed_distance_m > 0.01, 60, "the motion to be under way")
    return handle


def _moves(op: Operator, call_id: str, x: float = 0.45, y: float = 0.0, z: float = 0.3) -> None:
    handle = result_of(op.move.send_goal_async(_pose_goal(x, y, z, call_id, speed_mps=0.1)), 30)
    assert handle.accepted, op.receipt(call_id).message
    wrapped = result_of(handle.get_result_async(), 120)
    assert wrapped.status == GoalStatus.STATUS_SUCCEEDED, (wrapped.result.result.message, "".join(op.output[-30:]))


def _bad_profile(tmp_path: Path, name: str, **interfaces: str) -> str:
    doc = yaml.safe_load(config_path("robots/panda_twin.yaml").read_text())
    doc["name"] = name
    doc["interfaces"].update(interfaces)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_unconfigured_refuses_and_configure_checks_every_interface(operator, tmp_path):
    op = operator
    op.drive_to("unconfigured")
    assert op.state() == "unconfigured"
    refused = op.call("get_robot_state")
    assert refused.failure_category == "safety_stop" and not refused.executed
    assert "motion node is unconfigured: activate it" in refused.message
    early = op.rejected(_pose_goal(0.45, 0.0, 0.3, "goal-while-unconfigured"))
    assert "motion node is unconfigured" in early.message and not early.executed
    assert not op.trigger("stop").success  # unconfigured, it commands no arm, and says so

    # nothing behind the joint states, then nothing behind the trajectory action, then a wrench topic that is the
    # joint states (a profile naming the wrong topic): configure fails, naming it
    joints = yaml.safe_load(config_path("robots/panda_twin.yaml").read_text())["interfaces"]["joint_states_topic"]
    for name, interfaces, missing in (
        ("no_arm", {"joint_states_topic": "/no_arm/joint_states"}, "/no_arm/joint_states"),
        ("no_controller", {"trajectory_action": "/no_controller/follow_joint_trajectory"}, "/no_controller/"),
        (
            "wrong_wrench",
            {"wrench_topic": joints},
            f"{joints} is sensor_msgs/msg/JointState, not geometry_msgs/msg/WrenchStamped (no wrench publisher",
        ),
    ):
        set_parameters(op.clients["set_parameters"], robot_profile=_bad_profile(tmp_path, name, **interfaces))
        set_parameters(op.clients["set_parameters"], connect_timeout_s=3.0)
        assert not op.change(Transition.TRANSITION_CONFIGURE)
        assert op.state() == "unconfigured"
        wait_for(
            lambda name=name, missing=missing: any(
                "configure failed" in line and name in line and missing in line for line in op.output
            ),
            30,
            f"the configure failure naming {missing}",
        )
        assert "motion node is unconfigured" in op.call("get_robot_state").message

    # a sweep horizon that is none (negative, NaN): configure fails, saying why
    for horizon_s in (-0.05, float("nan")):
        set_parameters(op.clients["set_parameters"], **GOOD, sweep_horizon_s=horizon_s)
        assert not op.change(Transition.TRANSITION_CONFIGURE)
        assert op.state() == "unconfigured"
        wait_for(
            lambda h=horizon_s: any(
                "configure failed" in line
                and f"horizon_s must be finite and >= 0 s (0: sweeps go whole), got {h}" in line
                for line in op.output
            ),
            30,
            f"the configure failure naming sweep_horizon_s {horizon_s}",
        )
    set_parameters(op.clients["set_parameters"], sweep_horizon_s=HORIZON_S)

    op.drive_to("inactive")
    inactive = op.call("get_robot_state")
    assert inactive.failure_category == "safety_stop" and "motion node is inactive: activate it" in inactive.message
    assert "motion node is inactive" in op.rejected(_pose_goal(0.45, 0.0, 0.3, "goal-while-inactive")).message

    op.drive_to("active")
    state = op.call("get_robot_state")
    assert state.success, state.message
    _moves(op, "first-active-move", y=0.05)


def test_deactivate_stops_a_running_motion_and_holds_the_arm(operator):
    op = operator
    op.drive_to("active")
    handle = _start(op, _pose_goal(0.45, -0.25, 0.25, "long-move", speed_mps=0.02))  # ~20 s
    assert op.change(Transition.TRANSITION_DEACTIVATE)
    wrapped = result_of(handle.get_result_async(), 60)
    stopped = wrapped.result.result
    assert wrapped.status == GoalStatus.STATUS_ABORTED and stopped.failure_category == "safety_stop"
    assert "deactivated" in stopped.message and stopped.executed
    assert op.state() == "inactive"
    # the arm holds: its measured joint velocities fall to ~0 and stay there
    wait_for(lambda: np.abs(op.velocities_after(1)).max() < 1e-3, 60, "the arm to come to rest")
    assert np.abs(op.velocities_after(50)).max() < 1e-3
    refused = op.rejected(_pose_goal(0.45, 0.0, 0.3, "goal-while-deactivated"))
    assert "motion node is inactive: activate it" in refused.message
    assert "motion node is inactive" in op.call("get_robot_state").message

    op.drive_to("active")
    _moves(op, "after-reactivation")


def test_a_second_goal_while_one_runs_is_rejected_with_its_reason(operator):
    op = operator
    op.drive_to("active")
    first = _start(op, _pose_goal(0.45, -0.2, 0.3, "running-goal", speed_mps=0.02))
    second = op.rejected(_pose_goal(0.45, 0.1, 0.3, "second-goal"))
    assert second.failure_category == "invalid_argument" and not second.executed
    assert "another MoveTo goal (call_id running-goal) is running" in second.message
    result_of(first.cancel_goal_async(), 30)
    wrapped = result_of(first.get_result_async(), 60)
    assert wrapped.status == GoalStatus.STATUS_CANCELED, wrapped.result.result.message
    _moves(op, "after-the-rejection")  # the rejection left nothing reserved

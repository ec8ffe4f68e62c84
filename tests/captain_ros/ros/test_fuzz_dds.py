"""Property-based fuzzing of every capability over DDS: twin_node, motion_node and perception_node in their
own processes, this test as a careless agent sending random and malformed HarnessCall requests to
/harness/call and /perception/call (the strategies of tests/captain_ros/harness/test_fuzz.py, plus
malformed args_json, and names sent to the server that does not offer them).

Properties, for every request: an answer arrives (within a generous bound: waits bound events, they never
judge timing), in the contract (success, or a failure category of the closed set with a clear message,
never a crash), with the caller's call_id and a receipt within its limit; nothing moved unless the result
says `executed` (the arm's TCP and jaw from /joint_states before and after); every node stays alive. After
the fuzzing the completion gate still answers finish within the contract, every result was published on
/harness/receipts, and an honest episode (back to a safe pose, a small move, an observation, a check) is
accepted by the gate, in the fuzzed episode and in a new one.

One request per example: the nodes keep their state from call to call, as they would with a real agent, so
ids that earlier answers named ("<det>", "<obs>") make later calls valid. Shrinking is off (each failing
example is a single request already, and replaying one over DDS while the nodes' state moves on proves
little); the failing request is printed with the nodes' output.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import HarnessCall
from captain_ros.core import robot
from captain_ros.core.contract import CAPABILITIES, CAPABILITY_BY_NAME
from captain_ros.core.kinematics import Kinematics

from ..harness.test_fuzz import HONEST_MOVES, Seen, calls, check_answer, record_outcome
from .helpers import (
    launch_motion_node,
    launch_perception_node,
    launch_twin,
    node_processes,
    wait_for,
)

PANDA = robot.default_profile()  # the twin's arm

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TASK = "put_red_cube_in_bowl"
CALL_TIMEOUT_S = 180.0  # a bound on a lost answer, far above any call's duration on a loaded machine
RESEND_AFTER_S = 5.0  # first calls only (see Rig.ready)
SETTLE_STATES = 5  # joint states to wait for after an answer before reading "after" (events, not time)
STILL_TCP_M = 0.002  # the arm's TCP and the jaw move less than this when nothing was executed
STILL_JAW_M = 0.002
AT_REST_RADPS = 0.01  # every joint (arm and fingers, rad/s or m/s) slower than this: at rest
PERCEPTION = {c.name for c in CAPABILITIES if c.group in ("perception", "measurement")}  # /perception/call
MALFORMED_JSON = (
    "{not json",
    "{'pose': 1}",
    '{"duration_s": }',
    '{"a": 1',
    "[]",
    "[1, 2]",
    "null",
    "1",
    '"move_to"',
    "true",
    "NaN",
    '{"duration_s": NaN}',
    '{"duration_s": -Infinity}',
    '{"gripper": 1e999}',
    '{"a": 1, "a": 2}',
    "{}" * 2,
    "[" * 100_000 + "]" * 100_000,  # deeper than Python's recursion limit
    '{"a":' * 50_000 + "1" + "}" * 50_000,
    '{"page": ' + "9" * 5000 + "}",  # more digits than Python converts
    "\ufeff{}",
    " \n\t{}",
)


@st.composite
def requests(draw) -> tuple[str, str, dict | str]:
    """(server, capability, args_json template): a call of test_fuzz's strategies, sent to the server that
    offers it (mostly) or to the other one, its arguments as JSON (NaN and Infinity literals included),
    or malformed args_json."""
    capability, kwargs = draw(calls(physical_weight=3))
    usual = "perception" if capability in PERCEPTION else "harness"
    server = draw(st.sampled_from([usual] * 6 + ["harness", "perception"]))
    if draw(st.integers(0, 9)) == 0:
        return server, capability, draw(st.sampled_from(MALFORMED_JSON) | st.text(max_size=40))
    return server, capability, kwargs


@dataclass
class Rig:
    node: object
    procs: dict  # name -> (process, output lines)
    clients: dict  # "harness" | "perception" | "new_episode" -> client
    joints: list = field(default_factory=list)  # JointState messages, newest last
    receipts: list = field(default_factory=list)
    sent: list = field(default_factory=list)  # call_ids of every request
    asked: set = field(default_factory=set)  # (server, capability, args_json) already sent
    drift_m: list = field(default_factory=lambda: [0.0])  # largest TCP/jaw change without `executed`
    end_gap_m: list = field(default_factory=lambda: [0.0])  # largest gap: reported end TCP - TCP at rest
    seen: Seen = field(default_factory=Seen)
    outcomes: Counter = field(default_factory=Counter)  # "server capability: category" -> calls
    history: deque = field(default_factory=lambda: deque(maxlen=4))  # the last calls, for failure messages

    def output(self) -> str:
        return "\n".join(f"--- {name} ---\n{''.join(lines[-40:])}" for name, (_, lines) in self.procs.items())

    def assert_alive(self, what: str) -> None:
        dead = {name: proc.returncode for name, (proc, _) in self.procs.items() if proc.poll() is not None}
        assert not dead, f"{dead} exited during {what}\n{self.output()}"

    def answer(self, future, what: str):
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not future.done():
            self.assert_alive(what)
            assert time.monotonic() < deadline, f"no answer within {CALL_TIMEOUT_S} s to {what}\n{self.output()}"
            time.sleep(0.005)
        return future.result()

    def ready(self, server: str, request) -> None:
        """Wait until a server answers. Right after discovery a service can drop its first responses (its
        response writer has not matched this client's reader yet, a known DDS race), so a first call is
        resent until one answer arrives; the bound per try only decides when to resend."""
        client = self.clients[server]
        for _ in range(round(CALL_TIMEOUT_S / RESEND_AFTER_S)):
            future = client.call_async(request)
            deadline = time.monotonic() + RESEND_AFTER_S
            while not future.done() and time.monotonic() < deadline:
                self.assert_alive(f"the first call to {server}")
                time.sleep(0.01)
            if future.done():
                return
            client.remove_pending_request(future)
        raise AssertionError(f"{server} never answered\n{self.output()}")

    def gate_clear(self) -> bool:
        """Whether the motion node's completion gate has no objection now (read-only)."""
        return self.answer(self.clients["gate"].call_async(Trigger.Request()), "the gate").success

    def rest_state(self, what: str) -> JointState:
        """A joint state published after this moment (a few states later: whatever a call started shows)
        with the arm and the jaw at rest, so that a motion still ending is not charged to the next call."""
        n = len(self.joints)
        wait_for(
            lambda: len(self.joints) >= n + SETTLE_STATES and _at_rest(self.joints[-1]),
            CALL_TIMEOUT_S,
            f"the arm at rest around {what}",
        )
        return self.joints[-1]

    def call(self, server: str, capability: str, args: dict | str) -> CallResultMsg:
        args_json = args if isinstance(args, str) else json.dumps(self.seen.resolve(args))
        what = f"{server}: {capability!r} {args_json[:300]!r}"
        request = HarnessCall.Request(capability=capability, args_json=args_json, call_id=uuid.uuid4().hex)
        capability = capability.partition("\x00")[0]  # ROS strings end at a NUL: the name the server gets
        before = self.rest_state(what)
        self.sent.append(request.call_id)
        result = self.answer(self.clients[server].call_async(request), what).result
        after = self.rest_state(what)
        self.assert_alive(what)
        category = result.failure_category
        record_outcome(capability, category, result.executed, where=f"{server}: ")
        known = capability if capability in CAPABILITY_BY_NAME else "<unknown name>"
        self.outcomes[f"{server} {known}: {category or 'ok'}{', executed' if result.executed else ''}"] += 1
        check_answer(
            capability, result.success, result.executed, category, result.message, result.receipt, result.capability
        )
        assert result.call_id == request.call_id, f"{what}: answered with call_id {result.call_id!r}"
        value = json.loads(result.value_json) if result.value_json else None
        json.loads(result.diagnostics_json or "{}")
        self.seen.note(value)
        earlier = "\n".join(self.history)
        self.history.append(f"{what} -> {category or 'ok'}{' executed' if result.executed else ''}: {result.message}")
        (tcp0, jaw0), (tcp1, jaw1) = _tcp_and_jaw(before), _tcp_and_jaw(after)
        if result.executed and isinstance(value, dict) and "tcp_position_m" in value:  # where it said it ended
            self.end_gap_m[0] = max(self.end_gap_m[0], float(np.linalg.norm(tcp1 - value["tcp_position_m"])))
        if not result.executed:
            tcp_moved, jaw_moved = float(np.linalg.norm(tcp1 - tcp0)), abs(jaw1 - jaw0)
            self.drift_m[0] = max(self.drift_m[0], tcp_moved, jaw_moved)
            moved = f"{what}: not executed, yet TCP {tcp_moved * 1000:.1f} mm, jaw {jaw_moved * 1000:.1f} mm"
            assert tcp_moved < STILL_TCP_M and jaw_moved < STILL_JAW_M, f"{moved}; the calls before:\n{earlier}"
        self.asked.add((server, request.capability, args_json))  # after the checks: a failure is replayed
        return result


KINEMATICS = Kinematics()


def _at_rest(msg: JointState) -> bool:
    return len(msg.velocity) == len(msg.position) and float(np.abs(msg.velocity).max()) < AT_REST_RADPS


def _tcp_and_jaw(msg: JointState) -> tuple[np.ndarray, float]:
    index = {name: i for i, name in enumerate(msg.name)}
    q = np.array([msg.position[index[j]] for j in PANDA.arm_joints])
    return KINEMATICS.forward(q)[0], sum(msg.position[index[j]] for j in PANDA.finger_joints)


@pytest.fixture(scope="module")
def nodes():
    buffered = os.environ.get("PYTHONUNBUFFERED")
    os.environ["PYTHONUNBUFFERED"] = "1"  # the nodes' output is complete when one fails
    with node_processes() as procs:
        try:
            procs["twin_node"] = launch_twin(TASK, f"{TASK}/official/0", real_time_factor=1.0, camera_rate_hz=5.0)
            procs["perception_node"] = launch_perception_node()
            procs["motion_node"] = launch_motion_node(("watchdog", False))
        finally:
            if buffered is None:
                del os.environ["PYTHONUNBUFFERED"]
            else:
                os.environ["PYTHONUNBUFFERED"] = buffered
        yield procs


@pytest.fixture
def rig(nodes, client_node) -> Rig:
    node = client_node
    rig = Rig(node, nodes, {})
    node.create_subscription(JointState, "/joint_states", rig.joints.append, 10)
    node.create_subscription(CallResultMsg, "/harness/receipts", rig.receipts.append, 100)
    for name, service in (("harness", "/harness/call"), ("perception", "/perception/call")):
        rig.clients[name] = node.create_client(HarnessCall, service)
        if not rig.clients[name].wait_for_service(timeout_sec=120):
            raise RuntimeError(f"{service} did not come up\n{rig.output()}")
        rig.ready(name, HarnessCall.Request(capability="robot_geometry", args_json="{}"))
    rig.clients["new_episode"] = node.create_client(Trigger, "/harness/new_episode")
    rig.clients["gate"] = node.create_client(Trigger, "/harness/gate")
    assert rig.clients["new_episode"].wait_for_service(timeout_sec=30)
    rig.ready("new_episode", Trigger.Request())  # a fresh episode (the motion node's answers say which)
    rig.ready("gate", Trigger.Request())
    # the cameras need a moment to publish their first frames
    wait_for(lambda: rig.call("perception", "observe", {}).success, 120, "a first observation")
    return rig


def _honest_episode(rig: Rig) -> None:
    """Back to a safe pose, open, a small move and an observation (the gate's verification), then finish:
    accepted."""
    for capability, args in HONEST_MOVES:
        moved = rig.call("harness", capability, args)
        assert moved.success and moved.executed, moved.message
    # under load the cameras' latest images can be too old for observe (a backend_error): look again
    wait_for(lambda: rig.call("perception", "observe", {}).success, CALL_TIMEOUT_S, "an observation")
    assert rig.call("harness", "get_robot_state", {}).success
    # the observe receipt reaches the motion node on its own topic: wait until its gate has seen it
    wait_for(rig.gate_clear, CALL_TIMEOUT_S, "the gate to see the observation")
    finish = rig.call("harness", "finish", {"note": "honest"})
    assert finish.success and json.loads(finish.value_json)["accepted"], finish.message


def test_random_and_malformed_calls_over_dds(rig):
    @settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=250,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(request=requests())
    @example(request=("harness", "mvoe_to", {"pose": {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}}))  # issue 9
    @example(request=("harness", "get_robot_state", {"capability": "move_to"}))
    @example(request=("perception", "observe", {"capability": "observe", "self": 1}))
    @example(request=("harness", "hold", {"duration_s": 10**400}))
    @example(request=("harness", "hold", '{"duration_s": NaN}'))
    @example(request=("harness", "get_robot_state", "[" * 100_000 + "]" * 100_000))
    @example(request=("perception", "observe", "[" * 100_000 + "]" * 100_000))
    @example(request=("perception", "segment", {"text": "red cube"}))
    @example(request=("perception", "measure_object_geometry", {"object": "<det>", "destination": "<det~1>"}))
    @example(request=("perception", "point", {"text": "red cube"}))
    @example(request=("perception", "mark_point", {"u": "<u>", "v": "<v>", "label": "\udc00"}))  # not UTF-8
    @example(request=("perception", "segment", {"text": "red cube \udc00"}))
    @example(request=("harness", "move_to", {"gripper": "close"}))
    @example(request=("perception", "measure_object_geometry", {"object": "<det>"}))  # stale now
    def fuzz(request):
        server, capability, args = request
        args_json = args if isinstance(args, str) else json.dumps(rig.seen.resolve(args))
        if (server, capability, args_json) not in rig.asked:  # generation repeats itself now and then
            rig.call(*request)

    fuzz()
    print(f"{len(rig.sent)} calls; largest TCP or jaw change without `executed`: {rig.drift_m[0] * 1000:.3f} mm")
    print(f"largest gap between a motion's reported end TCP and the TCP at rest: {rig.end_gap_m[0] * 1000:.3f} mm")
    print("\n".join(f"{n:4d}  {what}" for what, n in sorted(rig.outcomes.items())))
    # nothing crashed the gate: finish answers within the contract, whatever the fuzzing logged
    finish = rig.call("harness", "finish", {})
    assert finish.success or finish.failure_category == "gate_rejected", finish.message
    _honest_episode(rig)  # in the fuzzed episode ...
    assert rig.answer(rig.clients["new_episode"].call_async(Trigger.Request()), "new_episode").success
    _honest_episode(rig)  # ... and in a fresh one
    published = lambda: set(rig.sent) <= {r.call_id for r in rig.receipts}  # noqa: E731
    wait_for(published, CALL_TIMEOUT_S, "a receipt for every call")
    rig.assert_alive("the test")

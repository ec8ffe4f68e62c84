"""The operator's say over physical actions, without ROS: the e-stop latch, the approver, and the harness
gate that asks it (on the twin backend). The same paths over DDS are in tests/captain_ros/ros/test_safety.py."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from captain_ros.core.config import ConfigError, load_config
from captain_ros.core.contract import FailureCategory
from captain_ros.harness.approval import (
    Answer,
    Approval,
    ApprovalRequest,
    Decision,
    EStop,
    OperatorApprover,
    PendingAction,
    describe_request,
    load_supervisor_config,
    parse_answer,
)
from captain_ros.harness.harness import Harness
from captain_ros.harness.motion import StopReason
from captain_ros.harness.twin_backend import TwinBackend

POSE = {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}


# ------------------------------------------------------------------------------ e-stop latch
def test_estop_latches_the_first_source_until_cleared():
    estop = EStop()
    assert estop.refusal() == "" and estop.engagements == 0
    assert estop.engage("the service", "operator pressed it")
    assert not estop.engage("the topic")  # already engaged: the first source stays
    assert estop.refusal().startswith("e-stop engaged by the service (operator pressed it)")
    assert estop.engagements == 1
    assert estop.clear() == "" and not estop.engaged and estop.refusal() == ""
    assert estop.last_source == "the service"  # results of calls it stopped can still name it


def test_estop_cannot_be_cleared_while_an_input_reads_pressed_and_a_release_clears_nothing():
    estop = EStop()
    assert estop.set_input("the button", pressed=True)
    assert not estop.set_input("the button", pressed=True)  # a bridge repeating its state engages once
    refused = estop.clear()
    assert "the button still reads engaged" in refused and estop.engaged
    estop.set_input("the button", pressed=False)
    assert estop.engaged  # releasing the button alone restarts nothing
    assert estop.clear() == "" and not estop.engaged and estop.engagements == 1


def test_a_watched_input_that_goes_silent_engages_and_blocks_a_clear_until_it_speaks_released():
    """A button's bridge under a 0.5 s deadline (times by hand): speaking keeps it clear; silence past the deadline
    engages once in its name; a clear is refused until it speaks again, and a released reading then allows it."""
    estop, button = EStop(), "the button"
    estop.watch(button, 0.5, now_s=10.0)
    assert estop.lapse(10.5) == [] and not estop.engaged  # the first reading is due by 10.5: not yet late
    assert not estop.set_input(button, pressed=False, now_s=10.4)
    assert estop.lapse(10.9) == [] and not estop.engaged  # 0.5 s after 10.4: still within
    assert estop.lapse(10.95) == [button] and estop.engaged  # 0.55 s of silence
    assert estop.refusal() == (
        "e-stop engaged by the button (silent for 0.55 s, past its 0.5 s deadline): nothing moves until an "
        "operator clears it"
    )
    assert estop.lapse(20.0) == [] and estop.engagements == 1  # one silence, one engagement
    assert "went silent past its deadline" in estop.clear() and estop.engaged
    estop.set_input(button, pressed=False, now_s=20.1)  # the bridge is back, released
    assert estop.clear() == "" and not estop.engaged
    assert estop.lapse(20.5) == [] and estop.lapse(20.7) == [button]  # watched again from its last message


def test_an_input_that_never_speaks_lapses_and_a_zero_deadline_ends_the_watch():
    estop = EStop()
    estop.watch("the button", 0.2, now_s=0.0)
    assert estop.deadline_s("the button") == 0.2 and estop.lapse(0.3) == ["the button"]
    estop.watch("the button", 0.0, now_s=0.3)  # the operator waives the contract
    assert estop.deadline_s("the button") == 0.0 and estop.lapse(100.0) == []
    assert estop.clear() == ""  # its silence no longer blocks the reset
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number of seconds"):
            estop.watch("the button", bad, now_s=0.0)


# ------------------------------------------------------------------------------ approver
def _action(capability: str = "move_to") -> PendingAction:
    return PendingAction(
        capability,
        {"pose": POSE},
        "move_to (guarded): 20 cm",
        frame_id="base",
        target_position_m=(0.4, 0.0, 0.3),
        target_quaternion_xyzw=(1.0, 0.0, 0.0, 0.0),
    )


def test_with_approval_mode_off_nothing_is_asked():
    asked = []
    approver = OperatorApprover(on_request=asked.append)
    approval = approver.ask(_action())
    assert approval.approved and not approval.asked and asked == []


def _answering(approve: bool, note: str = ""):
    """An approver whose operator answers each request as it is published."""
    holder: list[OperatorApprover] = []
    requests: list[ApprovalRequest] = []
    changes: list[list[ApprovalRequest]] = []

    def on_request(request: ApprovalRequest) -> None:
        requests.append(request)
        assert holder[0].pending() == [request]  # published while it is pending
        assert holder[0].answer(request.request_id, approve, note) == ""

    holder.append(OperatorApprover(60.0, enabled=True, on_request=on_request, on_change=changes.append))
    return holder[0], requests, changes


def test_an_approved_action_runs_and_a_rejected_one_carries_the_note():
    approver, requests, changes = _answering(True)
    approval = approver.ask(_action())
    assert approval == Approval(Decision.APPROVED, "", requests[0].request_id) and approval.asked
    assert requests[0].action.target_position_m == (0.4, 0.0, 0.3) and requests[0].timeout_s == 60.0
    assert [len(c) for c in changes] == [1, 0] and approver.pending() == []
    approver, requests, _ = _answering(False, "  too close to the bowl ")
    rejected = approver.ask(_action())
    assert rejected.decision is Decision.REJECTED and rejected.note == "too close to the bowl"
    assert approver.last == (requests[0], rejected)


def test_no_answer_times_out_and_a_late_answer_is_refused():
    requests: list[ApprovalRequest] = []
    approver = OperatorApprover(0.05, enabled=True, on_request=requests.append)
    approval = approver.ask(_action())
    assert approval.decision is Decision.TIMED_OUT and "no answer within 0.05 s" in approval.note
    late = approver.answer(requests[0].request_id, True)
    assert "no pending approval request" in late and approver.pending() == []


def test_a_withdrawn_request_ends_the_wait_and_an_empty_id_answers_the_only_one():
    approver = OperatorApprover(60.0, enabled=True)
    results: list[Approval] = []
    asking = threading.Thread(target=lambda: results.append(approver.ask(_action())))
    asking.start()
    while not approver.pending():  # the asking thread has published its request
        time.sleep(0.01)
    assert "no pending approval request 'nope'" in approver.answer("nope", True)
    assert approver.withdraw("e-stop engaged by the service") == 1
    asking.join(30)
    assert results[0].decision is Decision.WITHDRAWN and results[0].note == "e-stop engaged by the service"
    # one pending request: '' answers it
    approver, _, _ = _answering(True)
    approver.on_request = lambda request: approver.answer("", True)
    assert approver.ask(_action()).approved


def test_a_request_that_could_not_be_published_is_not_left_pending():
    def broken(request: ApprovalRequest) -> None:
        raise RuntimeError("publisher gone")

    approver = OperatorApprover(60.0, enabled=True, on_request=broken)
    with pytest.raises(RuntimeError, match="publisher gone"):
        approver.ask(_action())
    assert approver.pending() == [] and approver.last[1].decision is Decision.TIMED_OUT


def test_typed_answers_and_the_description_an_operator_reads():
    assert parse_answer("y") == (Answer.APPROVE, "")
    assert parse_answer(" YES looks fine ") == (Answer.APPROVE, "looks fine")
    assert parse_answer("n: the bowl is in the way") == (Answer.REJECT, "the bowl is in the way")
    assert parse_answer("") is None and parse_answer("maybe") is None
    request = ApprovalRequest("ab12cd34", _action(), 30.0, deadline_unix_s=1000.0)
    text = describe_request(request, now_unix_s=990.0)
    assert text.startswith("[ab12cd34] move_to (guarded): 20 cm")
    assert "TCP target: (0.400, 0.000, 0.300) m in base" in text and "answer within 10 s" in text
    assert 'pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0}' in text


def test_the_supervisor_section_of_the_safety_file(tmp_path):
    assert load_supervisor_config().approval_timeout_s > 0
    path = tmp_path / "safety.yaml"
    path.write_text("safety: {}\n")
    assert load_supervisor_config(path).approval_timeout_s == 30.0  # no section: the defaults
    path.write_text("supervisor:\n  approval_timeout_s: 5\n")
    assert load_supervisor_config(path).approval_timeout_s == 5.0
    for bad, words in (("approval_timeout_s: 0", "must be positive"), ("approval_timeout: 5", "unknown keys")):
        path.write_text(f"supervisor:\n  {bad}\n")
        with pytest.raises(ConfigError, match=words):
            load_supervisor_config(path)


# ------------------------------------------------------------------------------ the harness gate
class Scripted:
    """An approver that records what it is asked and answers with `decision` (and runs `during` meanwhile)."""

    def __init__(self, decision: Decision = Decision.APPROVED, during=None):
        self.decision, self.during = decision, during
        self.asked: list[PendingAction] = []
        self.withdrawn: list[str] = []

    def ask(self, action: PendingAction) -> Approval:
        self.asked.append(action)
        if self.during is not None:
            self.during()
        return Approval(self.decision, "scripted", f"r{len(self.asked)}")

    def withdraw(self, reason: str) -> int:
        self.withdrawn.append(reason)
        return 0


@pytest.fixture
def make(twin, kinematics):
    def make(approver=None, estop=None) -> Harness:
        return Harness(TwinBackend(twin), load_config(), kinematics, approver=approver, estop=estop)

    return make


def test_every_physical_action_is_described_to_the_approver_before_it_moves(make, twin):
    approver = Scripted()
    harness = make(approver)
    assert harness.call("get_robot_state").success and harness.call("check_motion", pose=POSE).success
    assert approver.asked == []  # read-only calls never wait for an operator
    moved = harness.call("move_to", pose=POSE, speed_mps=0.1)
    assert moved.success and moved.value["distance_to_target_m"] < 0.003
    ask = approver.asked[-1]
    assert ask.capability == "move_to" and ask.args == {"pose": POSE, "speed_mps": 0.1}
    assert ask.target_position_m == (0.4, 0.0, 0.3) and ask.frame_id == harness.profile.base_frame
    assert ask.description.startswith("move_to (guarded): TCP (") and "-> (0.400, 0.000, 0.300) m" in ask.description
    assert ask.episode_id == harness.episode_id
    assert len(ask.tcp_path_m) > 2 and ask.tcp_path_m[-1] == pytest.approx((0.4, 0.0, 0.3), abs=1e-3)  # the sweep
    assert harness.call("move_to", gripper=0.04).success
    assert approver.asked[-1].target_jaw_opening_m == 0.04 and "jaw 80 -> 40 mm" in approver.asked[-1].description
    assert harness.call("release", opening_m=0.06).success and approver.asked[-1].capability == "release"
    assert harness.call("hold", duration_s=0.1).success
    np.testing.assert_allclose(approver.asked[-1].target_position_m, (0.4, 0.0, 0.3), atol=0.003)
    assert harness.call("recover", distance_m=0.05).success and approver.asked[-1].capability == "recover"
    assert [a.capability for a in approver.asked] == ["move_to", "move_to", "release", "hold", "recover"]


@pytest.mark.parametrize(
    ("decision", "category", "words"),
    [
        (Decision.REJECTED, FailureCategory.SAFETY_STOP, "the operator rejected move_to: scripted; the arm holds"),
        (Decision.TIMED_OUT, FailureCategory.TIMEOUT, "no operator approval for move_to: scripted; the arm holds"),
        (Decision.WITHDRAWN, FailureCategory.SAFETY_STOP, "the approval request was withdrawn: scripted"),
    ],
)
def test_an_action_not_approved_fails_and_nothing_moves(make, twin, decision, category, words):
    harness = make(Scripted(decision))
    q0, jaw0 = twin.arm_q(), twin.jaw_opening_m()
    for kwargs in ({"pose": POSE}, {"gripper": 0.02}):
        result = harness.call("move_to", **kwargs)
        assert result.failure_category is category and not result.executed
        assert words in result.message and words in result.receipt
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-6)
    assert abs(twin.jaw_opening_m() - jaw0) < 1e-4
    assert harness.budget.actions_used == 2  # asked for with valid arguments: counted, as a failed motion is


def test_the_estop_refuses_before_anyone_is_asked_and_after_an_approval(make, twin):
    estop, approver = EStop(), Scripted()
    harness = make(approver, estop)
    estop.engage("the /safety/estop topic")
    q0 = twin.arm_q()
    refused = harness.call("move_to", pose=POSE)
    assert refused.failure_category is FailureCategory.SAFETY_STOP and not refused.executed
    assert "e-stop engaged by the /safety/estop topic" in refused.receipt and approver.asked == []
    harness.resume()  # the agent's resume is not an e-stop reset
    assert "e-stop engaged by" in harness.call("hold").message
    assert estop.clear() == ""
    # engaged while the operator was being asked (then approved): still refused, nothing moves
    harness = make(Scripted(during=lambda: estop.engage("the /safety/estop service")), estop)
    late = harness.call("move_to", pose=POSE)
    assert late.failure_category is FailureCategory.SAFETY_STOP and "e-stop engaged by the /safety/estop service" in (
        late.message
    )
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-6)


def test_stop_and_cancel_withdraw_the_pending_request(make, twin):
    approver = Scripted(Decision.WITHDRAWN)
    harness = make(approver)
    approver.during = harness.cancel  # the action's cancel arrives while the operator is asked
    canceled = harness.call("move_to", pose=POSE)
    assert canceled.failure_category is FailureCategory.CANCELED and "while waiting for approval" in canceled.message
    approver.during = harness.stop
    stopped = harness.call("move_to", pose=POSE)
    assert stopped.failure_category is FailureCategory.SAFETY_STOP and "stop service" in stopped.message
    assert approver.withdrawn == ["the call was canceled", "the stop service was called"]
    assert harness.stop_signal.reason is StopReason.SAFETY_STOP and not stopped.executed

"""The harness core on the twin backend: results, receipts, exact stop timing, the watchdog, budgets, the
gate. Behaviour both backends share (pick-and-place, contact and force stops, cancel, stop, bad targets)
is tested on both in tests/captain_ros/ros/test_backends.py."""

import numpy as np
import pytest

from captain_ros.core.config import load_config
from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.harness.backend import BackendError
from captain_ros.harness.harness import Harness
from captain_ros.harness.motion import Watchdog
from captain_ros.harness.twin_backend import TwinBackend


def test_motion_receipt_reports_stop_reason_distance_force_and_jaw(harness, twin):
    result = harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    assert result.success and result.executed
    v = result.value
    assert v["stop_reason"] == "target_reached" and v["distance_to_target_m"] < 0.003
    assert v["executed_distance_m"] == pytest.approx(
        np.linalg.norm(np.array([0.4, 0, 0.3]) - [0.3069, 0, 0.4869]), abs=0.003
    )
    for words in ("target_reached after", "cm", "peak", "N", "jaw 80->80 mm"):
        assert words in result.receipt
    assert set(result.to_dict()) == {
        "success",
        "executed",
        "failure_category",
        "message",
        "value",
        "diagnostics",
        "budget",
    }


class _CancelAt(TwinBackend):
    """The twin backend, with an operator pressing cancel at control period `at`."""

    def __init__(self, twin, harness_ref, at: int):
        super().__init__(twin)
        self.harness_ref, self.at, self.periods = harness_ref, at, 0
        self.holds, self.setpoints = [], []

    def hold(self, q_rad=None):
        held = super().hold(q_rad)
        self.holds.append((self.periods, held.copy(), self.read_state().q_rad.copy()))
        return held

    def wait_period(self):
        super().wait_period()
        self.periods += 1
        self.setpoints.append((self.periods, *self.commanded()))
        if self.periods == self.at:
            self.harness_ref[0].cancel()


def test_cancel_ramps_the_arm_to_rest_from_the_next_control_period(twin, kinematics):
    """A cancel is answered in the same period (the hold), and from the next one the commanded velocity falls
    along the stop ramp, never faster than safety.yaml's deceleration limit, to rest where hold() said."""
    ref = []
    backend = _CancelAt(twin, ref, at=300)
    harness = Harness(backend, load_config(), kinematics)
    ref.append(harness)
    result = harness.call("move_to", pose={"position": [0.45, 0.2, 0.25], "yaw_deg": 0})
    assert result.failure_category is FailureCategory.CANCELED and result.executed
    assert result.value["distance_to_target_m"] > 0.05
    period, held, _ = next(h for h in backend.holds if h[0] >= 300)
    assert period == 300
    decel, dt = load_config().safety.stop_decel_radps2, backend.control_period_s
    velocities = np.array([s[2] for s in backend.setpoints if s[0] >= 301])
    assert np.abs(velocities[1]).max() < np.abs(velocities[0]).max() > 0.01  # decelerating, not stopped dead
    assert np.abs(np.diff(velocities, axis=0)).max() <= decel * dt * (1 + 1e-6)
    np.testing.assert_allclose(velocities[-1], 0.0, atol=1e-9)
    np.testing.assert_allclose(backend.setpoints[-1][1], held, atol=1e-12)
    np.testing.assert_allclose(twin.arm_q(), held, atol=2e-3)


def test_stop_service_refuses_motion_until_resume(harness, twin):
    q0 = twin.arm_q()
    harness.stop()
    result = harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    assert result.failure_category is FailureCategory.SAFETY_STOP and not result.executed
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-6)
    harness.resume()
    assert harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0}).success


def test_watchdog_holds_the_arm_when_the_agent_goes_silent(twin, kinematics):
    now = [0.0]
    harness = Harness(
        TwinBackend(twin), load_config(), kinematics, clock=lambda: now[0], watchdog=Watchdog(1.0, clock=lambda: now[0])
    )

    class Silent(TwinBackend):
        def wait_period(self):
            super().wait_period()
            now[0] += 0.01  # the agent says nothing while the arm moves

    harness.backend = Silent(twin)
    result = harness.call("move_to", pose={"position": [0.45, 0.2, 0.25], "yaw_deg": 0})
    assert result.failure_category is FailureCategory.SAFETY_STOP
    assert "watchdog" in result.message


def test_action_budget_is_enforced_and_reported(harness, twin):
    harness.budget.actions_limit = 1
    first = harness.call("move_to", gripper=0.05)
    assert first.success and first.budget.actions_used == 1
    q0 = twin.arm_q()
    second = harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    assert second.failure_category is FailureCategory.BUDGET_EXHAUSTED and "physical actions" in second.message
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-6)
    harness.budget.actions_limit = 150
    harness.note_request()
    assert harness.call("get_robot_state").budget.requests_used == 1


def test_completion_gate_rejects_twice_then_accepts(harness):
    first = harness.call("finish", note="done?")
    assert first.failure_category is FailureCategory.GATE_REJECTED
    assert "no physical action" in first.message
    harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    second = harness.call("finish")
    assert second.failure_category is FailureCategory.GATE_REJECTED and "verify the scene" in second.message
    third = harness.call("finish")
    assert third.success and third.value["accepted"]


def test_gate_accepts_at_once_after_a_scene_measurement_and_not_after_robot_state_alone(harness):
    """Robot state says where the arm is, not where the objects are: only perception verifies the scene."""
    harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    assert harness.call("get_robot_state").success and harness.call("gripper_state").success
    assert any("verify the scene" in reason for reason in harness.gate_objections())
    assert harness.call("observe").success
    assert harness.gate_objections() == []
    assert harness.call("finish").success


def test_check_and_preview_are_read_only(harness, twin):
    q0 = twin.arm_q()
    below = harness.call("check_motion", pose={"position": [0.5, 0.0, 0.002], "yaw_deg": 0})
    assert below.success and not below.value["feasible"] and "below the table" in below.value["reason"]
    far = harness.call("check_motion", pose={"position": [0.95, 0.0, 0.2], "yaw_deg": 0})
    assert not far.value["feasible"] and far.value["failure_category"] == "workspace_limit"
    ok = harness.call("check_motion", pose={"position": [0.5, 0.0, 0.2], "yaw_deg": 0})
    assert ok.value["feasible"]
    preview = harness.call("preview_motion", pose={"position": [0.5, 0.0, 0.2], "yaw_deg": 0}, speed_mps=0.05)
    assert preview.value["peak_speed_mps"] <= 0.05 + 1e-9 and preview.value["duration_s"] > 0
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-9)
    assert harness.budget.actions_used == 0


def test_trajectory_pages_and_pose_arithmetic(harness):
    harness.call("move_to", pose={"position": [0.4, 0.1, 0.3], "yaw_deg": 30})
    page0 = harness.call("read_motion_trajectory")
    assert page0.success and page0.value["pages"] > 1 and len(page0.value["rows"]) == 50
    last = harness.call("read_motion_trajectory", page=page0.value["pages"] - 1)
    np.testing.assert_allclose(last.value["rows"][-1]["tcp_m"], [0.4, 0.1, 0.3], atol=0.003)
    out = harness.call("transform_pose", pose={"position": [0, 0, 0.05], "quaternion": [0, 0, 0, 1]}, from_frame="tcp")
    np.testing.assert_allclose(out.value["pose"]["position"], [0.4, 0.1, 0.25], atol=0.003)  # 5 cm along the fingers
    shifted = harness.call("transform_pose", pose={"position": [0.4, 0.1, 0.3], "yaw_deg": 30}, offset_m=[0, 0, 0.05])
    np.testing.assert_allclose(shifted.value["pose"]["position"], [0.4, 0.1, 0.25], atol=1e-6)


class _Broken(TwinBackend):
    def wait_period(self):
        raise BackendError("link to the controller lost")


def test_backend_failure_is_reported_never_raised(twin, kinematics):
    harness = Harness(_Broken(twin), load_config(), kinematics)
    result = harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    assert result.failure_category is FailureCategory.BACKEND_ERROR and "link to the controller lost" in result.message


def test_verification_served_elsewhere_counts_for_the_gate(harness):
    """The motion node feeds the perception node's receipts in: an observation there is verification."""
    harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    harness.note_external_call("move_to", True)  # physical calls from elsewhere are ignored
    harness.note_external_call("observe", True)
    assert harness.call("finish").success


def test_recover_reverses_the_exact_distance_even_between_sparse_trace_rows(harness, twin):
    assert harness.call("move_to", pose={"position": [0.45, 0.0, 0.30], "yaw_deg": 0}).success
    assert harness.call("move_to", pose={"position": [0.45, 0.0, 0.22], "yaw_deg": 0}).success
    trace = harness.motions[-1].outcome.trace
    trace[:] = [trace[0], trace[-1]]  # as if the client had stalled through the whole motion: 8 cm between rows
    result = harness.call("recover", distance_m=0.03)
    assert result.success, result.message
    assert "reversed 3.0 cm" in result.receipt
    assert twin.tcp_pose()[0][2] == pytest.approx(0.25, abs=0.004)


class _FaultedArm(TwinBackend):
    """The twin backend as an arm whose own controller reports a fault that its vendor's recovery clears (a Franka
    after a reflex: ros2_control_backend's vendor_fault), or whose recovery fails (`fails`)."""

    def __init__(self, twin, fails: str = ""):
        super().__init__(twin)
        self.fault, self.fails, self.recoveries = "", fails, 0

    def vendor_fault(self, ask_controllers: bool = False) -> str:
        return self.fault

    def recover_vendor(self) -> list[str]:
        self.recoveries += 1
        if self.fails:
            raise BackendError(self.fails)
        self.fault = ""
        return ["error recovery done", "controllers confirmed active"]


def test_recover_on_a_faulted_arm_runs_its_vendor_recovery_instead_of_a_reversal(twin, kinematics):
    """While the arm reports a fault, `recover` runs the vendor's recovery (one physical action, behind the e-stop
    like any), says so in its receipt and moves nothing; get_robot_state reports the fault. Once cleared, `recover`
    reverses the last motion again; a recovery that fails is a backend_error with its message."""
    backend = _FaultedArm(twin)
    harness = Harness(backend, load_config(), kinematics)
    assert harness.call("move_to", pose={"position": [0.45, 0.0, 0.30], "yaw_deg": 0}).success
    backend.fault = "the FR3's robot mode is REFLEX: the arm stopped itself"
    state = harness.call("get_robot_state")
    assert state.value["arm_fault"] == backend.fault and "arm fault: the FR3's robot mode is REFLEX" in state.receipt
    harness.estop.engage("service", "test")
    refused = harness.call("recover")
    assert refused.failure_category is FailureCategory.SAFETY_STOP and backend.recoveries == 0
    assert harness.estop.clear() == ""
    before, used = twin.tcp_pose()[0], harness.budget.actions_used
    result = harness.call("recover")
    assert result.success and not result.executed, result.message
    assert result.receipt.startswith("recover: arm error recovery: error recovery done; controllers confirmed active")
    assert result.value == {
        "vendor_recovery": ["error recovery done", "controllers confirmed active"],
        "fault": ("the FR3's robot mode is REFLEX: the arm stopped itself"),
    }
    assert backend.recoveries == 1 and harness.budget.actions_used == used + 1
    np.testing.assert_allclose(twin.tcp_pose()[0], before, atol=1e-4)  # nothing moved
    assert "arm_fault" not in harness.call("get_robot_state").value
    reversed_ = harness.call("recover", distance_m=0.02)
    assert reversed_.success and "cm of motion 1" in reversed_.receipt, reversed_.message  # the move_to, reversed
    backend.fault, backend.fails = "a reflex", "Franka recovery step 1 of 4 (...): aborted; the arm holds"
    failed = harness.call("recover")
    assert failed.failure_category is FailureCategory.BACKEND_ERROR and failed.message == backend.fails


def test_an_unknown_capability_name_never_breaks_the_completion_gate(harness):
    """Issue 9 section 5: a call naming an unknown capability was recorded in the episode log, and every
    later finish() failed with `internal error KeyError: '<that name>'`."""
    typo = harness.call("mvoe_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0})
    assert typo.failure_category is FailureCategory.INVALID_ARGUMENT and "unknown capability" in typo.message
    assert not typo.executed
    harness.note_external_call("teleport", True)  # a receipt from elsewhere naming no capability
    assert harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0}).success
    assert harness.call("observe").success
    finish = harness.call("finish")
    assert finish.success and finish.value["accepted"], finish.message


def test_the_completion_gate_reads_any_log_entry_without_failing(harness):
    """Whatever the log holds (names from older code, other servers, typos), the gate objects or accepts;
    it never raises."""
    harness.log.calls += [("teleport", True), ("", False), ("observe", True)]
    assert harness.gate_objections() == ["no physical action was executed in this episode"]
    harness.log.calls += [("move_to", True), ("🤖", True)]
    assert "verify the scene" in harness.gate_objections()[-1]
    rejected = harness.call("finish")
    assert rejected.failure_category is FailureCategory.GATE_REJECTED, rejected.message


def test_an_argument_named_capability_or_self_is_refused_not_raised(harness):
    """Found by fuzzing: Harness.call(capability, **kwargs) raised TypeError ('got multiple values for
    argument capability') for args_json {"capability": ...}, out of the motion node's service callback."""
    for kwargs in ({"capability": "move_to"}, {"self": 1}):
        result = harness.call("get_robot_state", **kwargs)
        assert result.failure_category is FailureCategory.INVALID_ARGUMENT, result.message
        assert "unexpected arguments" in result.message and next(iter(kwargs)) in result.message


def test_an_integer_too_large_for_a_float_is_an_invalid_argument(harness, twin):
    """Found by fuzzing: JSON integers have no size limit, and float(10**400) raised OverflowError, which
    came back as an internal backend_error instead of invalid_argument."""
    q0 = twin.arm_q()
    for capability, kwargs in (
        ("hold", {"duration_s": 10**400}),
        ("move_to", {"gripper": -(10**400)}),
        ("move_to", {"pose": {"position": [10**400, 0.0, 0.3], "yaw_deg": 0}}),
    ):
        result = harness.call(capability, **kwargs)
        assert result.failure_category is FailureCategory.INVALID_ARGUMENT, result.message
        assert "must be finite" in result.message and not result.executed
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-9)
    assert harness.budget.actions_used == 0


def test_text_that_cannot_go_on_the_wire_is_refused(harness):
    """Found by fuzzing: JSON carries lone surrogates ("\\udc00"); mark_point put such a label into its
    receipt, which no ROS string (UTF-8) can hold, so publishing the result raised in the node."""
    assert harness.call("observe").success
    pointed = harness.call("point", text="red cube")
    assert pointed.success, pointed.message
    u, v = pointed.value["uv"]
    for capability, kwargs, name in (
        ("mark_point", {"u": u, "v": v, "label": "\udc00"}, "label"),
        ("segment", {"text": "red cube \udc00"}, "text"),
        ("measure_image_points", {"points": [[0.5, 0.5]], "camera": ["\ud800"]}, "camera[0]"),
    ):
        result = harness.call(capability, **kwargs)
        assert result.failure_category is FailureCategory.INVALID_ARGUMENT, result.receipt
        assert result.message.startswith(f"{name} holds a lone surrogate"), result.message
        result.receipt.encode("utf-8")
    marked = harness.call("mark_point", u=u, v=v, label="cube ✓")  # any real text is fine
    assert marked.success and "cube ✓" in marked.receipt


def test_receipts_and_messages_are_always_utf8():
    result = CallResult.fail("segment", FailureCategory.NOT_FOUND, "nothing matches '\udc00'")
    assert result.message == "nothing matches '\\udc00'" and result.receipt.encode("utf-8")
    assert CallResult.ok("observe", receipt="observe: \ud800" + "x" * 400).receipt.encode("utf-8")


def test_gate_objections_say_what_happened(harness):
    """The objection to a failed last action said "nothing was re-checked since" even after a check."""
    assert harness.call("move_to", pose={"position": [0.4, 0.0, 0.3], "yaw_deg": 0}).success
    assert harness.call("hold", duration_s=-1).failure_category is FailureCategory.INVALID_ARGUMENT
    assert harness.gate_objections()[0] == "the last physical action (hold) failed and nothing was re-checked since"
    assert harness.call("observe").success
    assert harness.gate_objections() == ["the last physical action (hold) failed"]


def test_a_stop_ramp_comes_to_rest_and_a_non_finite_setpoint_has_none(harness):
    """Every backend's stops go through ArmBackend._stop_ramp: a ramp to rest within the deceleration limit, or None
    (the backend then holds where the arm is) for a setpoint that is no longer finite."""
    backend = harness.backend
    lower, upper = backend.profile.arm_limits_rad()
    q, qd = backend.profile.home_q, np.full(backend.profile.dof, 0.3)
    ramp = backend._stop_ramp(q, qd, lower, upper)
    assert ramp is not None and not ramp.velocities[-1].any()
    assert ramp.times_s[-1] >= 0.3 / backend.stop_decel_radps2 - 1e-9
    assert backend._stop_ramp(np.full(backend.profile.dof, np.nan), qd, lower, upper) is None

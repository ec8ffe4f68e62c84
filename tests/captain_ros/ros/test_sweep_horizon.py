"""The real-arm path of a sweep given to the controller a horizon at a time (Ros2ControlBackend against a fake
ros2_control bring-up, no lockstep: the controller runs on its own clock, as a real one does). A motion loop that
keeps calling wait_period moves the arm along the whole sweep through one goal and its topic stretches; one that
stalls finds the arm stopped by itself short of the sweep's end, and is told so."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy")
from captain_ros.core import robot
from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.backend import BackendError
from captain_ros.ros.ros2_control_backend import HORIZON_S, Ros2ControlBackend

from .fake_vendor import VENDORS, VendorGraph, read_urdf
from .helpers import (
    LOADED_MACHINE_STATE_TIMEOUT_S,
    LOADED_MACHINE_SWEEP_HORIZON_S,
    LOADED_MACHINE_WRENCH_LAG_S,
    wait_for,
)

pytestmark = [pytest.mark.ros]
SPEC = VENDORS["ros2_control_demo"]


@pytest.fixture
def arm(client_node, request):
    """The fake bring-up and a backend on it that gives the controller `request.param` seconds of a sweep."""
    description = read_urdf(SPEC.urdf)
    graph = VendorGraph(SPEC, description).start()
    try:
        profile = robot.load_profile(SPEC.profile).with_urdf_text(description)
        backend = Ros2ControlBackend(
            client_node,
            profile,
            state_timeout_s=LOADED_MACHINE_STATE_TIMEOUT_S,
            wrench_max_lag_s=LOADED_MACHINE_WRENCH_LAG_S,
            horizon_s=request.param,
        )
        try:
            backend.wait_for_state(60)
            yield graph, backend
        finally:
            backend.close()
    finally:
        graph.stop()


def _sweep(backend, duration_s: float = 1.0) -> JointTrajectory:
    """A slow minimum-jerk sweep of every joint by 0.2 rad from where the arm is, a point every 10 ms."""
    q0 = backend.read_state(require_force=False).q_rad
    t = np.arange(1, round(duration_s / 0.01) + 1) * 0.01
    s = t / duration_s
    shape, rate = 10 * s**3 - 15 * s**4 + 6 * s**5, (30 * s**2 - 60 * s**3 + 30 * s**4) / duration_s
    return JointTrajectory(backend.profile.arm_joints, t, q0 + 0.2 * shape[:, None], 0.2 * np.outer(rate, np.ones(6)))


@pytest.mark.parametrize("arm", [LOADED_MACHINE_SWEEP_HORIZON_S], indirect=True)
def test_a_loop_that_keeps_up_runs_the_whole_sweep_in_stretches(arm):
    """Stamped where the running stretch is (in the past by the time they arrive), the stretches take the arm along
    the sweep to its end. (The horizon is the loaded machine's: a 2-core host can stall this process for seconds.)"""
    graph, backend = arm
    sweep = _sweep(backend, duration_s=2 * LOADED_MACHINE_SWEEP_HORIZON_S)
    backend.follow(sweep)
    end_s = backend.read_state(require_force=False).time_s + sweep.duration_s + 0.3
    while backend.read_state(require_force=False).time_s < end_s:
        backend.wait_period()
    kinds = [kind for kind, _ in graph.controller.received]
    assert kinds[0] == "goal" and kinds.count("topic") >= 3  # one goal, then the stretches on the topic
    np.testing.assert_allclose(graph.controller.follower.desired_q, sweep.positions[-1], atol=1e-9)
    assert np.abs(graph.controller.follower.desired_qd).max() == 0.0
    assert backend.trajectory_time_s() >= sweep.duration_s  # the sweep's own time, across the stretches


@pytest.mark.parametrize("arm", [HORIZON_S], indirect=True)
def test_a_loop_that_stalls_finds_the_arm_stopped_by_itself_and_is_told(arm):
    graph, backend = arm
    sweep = _sweep(backend)
    backend.follow(sweep)
    start_s = backend.read_state(require_force=False).time_s
    # the loop stalls: no wait_period for 0.5 s of the arm's clock (joint states keep coming)
    wait_for(lambda: backend.read_state(require_force=False).time_s > start_s + 0.5, 30, "0.5 s of joint states")
    stopped = graph.controller.follower.desired_q.copy()
    assert np.abs(graph.controller.follower.desired_qd).max() == 0.0  # at rest, by itself
    progress = float(np.abs(stopped - sweep.positions[0]).max() / 0.2)
    assert progress < 0.1  # within the horizon of where the goal began: not the sweep's end
    with pytest.raises(BackendError, match="the arm stopped by itself, and the sweep is over"):
        backend.wait_period()

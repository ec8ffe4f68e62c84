"""The sweep's joint setpoints: through every IK waypoint, at rest at both ends, and smooth in between (a kink in
the commanded path is an acceleration spike that the wrist's force sensor reads as a contact)."""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from captain_ros.core.config import load_config
from captain_ros.harness.motion import Planner, SweepPlan

KHZ = 1000.0


def accelerations(plan: SweepPlan) -> np.ndarray:
    """The commanded joint accelerations (rad/s^2) sampled at 1 kHz over the whole sweep."""
    t = np.arange(0.0, plan.duration_s, 1.0 / KHZ)
    return np.diff(plan.setpoints(t), 2, axis=0) * KHZ**2


def test_setpoints_pass_through_the_waypoints_and_start_and_end_at_rest():
    q = np.cumsum(np.full((12, 7), 0.03), axis=0)
    plan = SweepPlan(q, np.zeros((12, 3)), 4.0, 0.3, 0.0, 0.14)
    tau = np.linspace(0.0, 1.0, 2001)
    x = tau**3 * (10 - 15 * tau + 6 * tau**2) * (len(q) - 1)  # the minimum-jerk path parameter
    for k in range(len(q)):  # each waypoint is reached at the time the profile's parameter passes it
        t = 4.0 * tau[np.argmin(np.abs(x - k))]
        np.testing.assert_allclose(plan.setpoints(np.array([t]))[0], q[k], atol=2e-4)
    ends = plan.setpoints(np.array([0.0, 1e-3, 4.0 - 1e-3, 4.0]))
    assert np.abs(ends[1] - ends[0]).max() < 1e-6 and np.abs(ends[3] - ends[2]).max() < 1e-6
    single = SweepPlan(q[:1], np.zeros((1, 3)), 0.0, 0.0, 0.0, 0.0)
    np.testing.assert_array_equal(single.setpoints(np.array([0.0, 1.0])), q[[0, 0]])


def test_waypoints_that_zigzag_by_millirads_give_no_acceleration_spike():
    """IK solutions scatter by a few millirad about the smooth path; joining them with straight segments turned
    the joints at every waypoint, which LIBERO's arm followed with 17 rad/s^2 spikes and its wrist read 3.7 N."""
    rng = np.random.default_rng(0)
    q = np.linspace(0.0, 1.2, 39)[:, None] * np.linspace(0.5, 1.0, 7)[None, :] + rng.uniform(-0.002, 0.002, (39, 7))
    plan = SweepPlan(q, np.zeros((39, 3)), 7.0, 0.38, 0.0, 0.1)
    t = np.arange(0.0, 7.0, 1.0 / KHZ)
    tau = t / 7.0
    x = tau**3 * (10 - 15 * tau + 6 * tau**2) * 38
    segments = np.stack([np.interp(x, np.arange(39), q[:, j]) for j in range(7)], axis=1)  # straight segments
    assert np.abs(np.diff(segments, 2, axis=0) * KHZ**2).max() > 10.0
    assert np.abs(accelerations(plan)).max() < 2.0  # rad/s^2


def test_a_planned_sweep_is_smooth_in_acceleration():
    """A 35 cm sweep turning the hand 60 deg, planned on the twin's Panda: no step in the commanded acceleration
    between two 1 ms samples larger than the profile's own change."""
    planner = Planner(load_config())
    q0 = planner.kin.profile.home_q_rad
    p0, r0 = planner.kin.forward(q0)
    target = Rotation.from_euler("z", 60, degrees=True).as_matrix() @ r0
    plan = planner.plan_pose(q0, p0 + np.array([0.15, 0.25, -0.12]), target)
    assert len(plan.q_waypoints) > 30
    a = accelerations(plan)
    assert np.abs(a).max() < 3.0
    assert np.abs(np.diff(a, axis=0)).max() < 0.05  # rad/s^2 per ms: no spike, no step

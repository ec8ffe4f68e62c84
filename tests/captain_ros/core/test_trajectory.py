import numpy as np
import pytest

from captain_ros.core.trajectory import (
    JointTrajectory,
    TrajectoryError,
    TrajectoryFollower,
    horizon_piece,
    stop_ramp,
)

JOINTS = ("a", "b")
LO, HI = np.array([-1.0, -1.0]), np.array([1.0, 1.0])


def build(names=JOINTS, times=(1.0,), positions=((0.5, -0.5),), velocities=None):
    return JointTrajectory.build(names, times, positions, velocities, controlled=JOINTS, lower=LO, upper=HI)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"names": ("a", "c")}, "unknown joints \\['c'\\]"),
        ({"names": ("a",), "positions": ((0.5,),)}, "joints \\['b'\\] are missing"),
        ({"names": ("a", "a")}, "repeat"),
        ({"times": ()}, "no points"),
        ({"times": (1.0, 1.0), "positions": ((0, 0), (0, 0))}, "strictly increasing"),
        ({"times": (float("nan"),)}, "strictly increasing"),
        ({"positions": ((0.5,),)}, "needs 2 positions"),
        ({"positions": ((np.nan, 0.0),)}, "finite"),
        ({"positions": ((0.0, 1.5),)}, "b = 1.5000 is outside its limits"),
        ({"velocities": ((0.0,),)}, "velocities must be finite"),
    ],
)
def test_invalid_trajectories_say_why(kwargs, message):
    with pytest.raises(TrajectoryError, match=message):
        build(**kwargs)


def test_joint_order_is_normalised():
    t = build(names=("b", "a"), positions=((0.2, 0.7),))
    np.testing.assert_allclose(t.positions[0], [0.7, 0.2])


def test_linear_sampling_starts_at_the_current_position_and_holds_the_end():
    t = build(times=(1.0, 2.0), positions=((0.5, 0.0), (0.5, 1.0)))
    start = np.array([-0.5, 0.0])
    np.testing.assert_allclose(t.sample(0.0, start)[0], start)
    np.testing.assert_allclose(t.sample(0.5, start)[0], [0.0, 0.0])
    np.testing.assert_allclose(t.sample(1.5, start)[0], [0.5, 0.5])
    q, qd = t.sample(5.0, start)
    np.testing.assert_allclose(q, [0.5, 1.0])
    np.testing.assert_allclose(qd, [0.0, 0.0])


def test_cubic_sampling_meets_positions_and_velocities_at_the_points():
    t = build(times=(1.0, 2.0), positions=((0.5, 0.0), (0.0, 0.5)), velocities=((0.2, 0.1), (0.0, 0.0)))
    start = np.zeros(2)
    q, qd = t.sample(1.0, start)
    np.testing.assert_allclose(q, [0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(qd, [0.2, 0.1], atol=1e-12)


def test_cubic_sampling_between_the_points_is_the_hermite_spline_worked_by_hand():
    """Segment 0 -> 1 s from rest at 0 to (0.5, 0) moving at (0.2, 0.1), sampled at its middle (s = 0.5, h = 1):
    q = h00 p0 + h10 m0 + h01 p1 + h11 m1 with h00 = h01 = 0.5, h10 = 0.125, h11 = -0.125 (m = v h):
    joint a 0.5 * 0.5 - 0.125 * 0.2 = 0.225, joint b -0.125 * 0.1 = -0.0125; the velocity
    (-1.5 p0 - 0.25 m0 + 1.5 p1 - 0.25 m1) / h: a 0.75 - 0.05 = 0.7, b -0.025."""
    t = build(times=(1.0, 2.0), positions=((0.5, 0.0), (0.0, 0.5)), velocities=((0.2, 0.1), (0.0, 0.0)))
    q, qd = t.sample(0.5, np.zeros(2))
    np.testing.assert_allclose(q, [0.225, -0.0125], atol=1e-12)
    np.testing.assert_allclose(qd, [0.7, -0.025], atol=1e-12)
    q, qd = t.sample(1.5, np.zeros(2))  # second segment: (0.5, 0) at 0.2, 0.1 rad/s to (0, 0.5) at rest
    np.testing.assert_allclose(q, [0.5 * 0.5 + 0.125 * 0.2, 0.125 * 0.1 + 0.5 * 0.5], atol=1e-12)
    np.testing.assert_allclose(qd, [-0.25 * 0.2 - 1.5 * 0.5, -0.25 * 0.1 + 1.5 * 0.5], atol=1e-12)


def test_follower_preempts_holds_and_clips():
    f = TrajectoryFollower(JOINTS, LO, HI, np.zeros(2))
    first = f.start(build(), now_s=0.0)
    np.testing.assert_allclose(f.update(0.5), [0.25, -0.25])
    second = f.start(build(positions=((0.0, 0.0),)), now_s=0.5)
    assert f.active_token() == second and f.finished(first, 0.6)
    f.hold(np.array([3.0, -3.0]))  # cancel: hold where the arm is (clipped to the limits)
    assert f.active_token() is None
    np.testing.assert_allclose(f.update(10.0), [1.0, -1.0])


def test_streamed_trajectories_join_without_a_velocity_jump():
    t = build(times=(0.1,), positions=((0.5, 0.0),), velocities=((1.0, 0.0),))
    start_qd = np.array([0.8, 0.0])
    _, qd0 = t.sample(0.0, np.zeros(2), start_qd)
    np.testing.assert_allclose(qd0, start_qd, atol=1e-12)  # continues at the speed it was moving
    f = TrajectoryFollower(JOINTS, LO, HI, np.zeros(2))
    f.start(build(times=(1.0,), positions=((0.5, 0.0),), velocities=((0.2, 0.0),)), now_s=0.0)
    f.update(0.5)
    moving = f.desired_qd.copy()
    f.start(build(times=(1.0,), positions=((0.9, 0.0),), velocities=((0.0, 0.0),)), now_s=0.5)
    f.update(0.5)
    np.testing.assert_allclose(f.desired_qd, moving, atol=1e-9)


def test_a_trajectory_taking_over_starts_from_the_setpoint_at_its_start_not_at_the_last_sample():
    """The twin's physics samples the setpoint before each step; a trajectory taken up between steps starts from
    where the running one is at that time (from an older sample the setpoint would stand still for a step)."""
    moving = build(times=(1.0,), positions=((0.5, 0.0),), velocities=((0.2, 0.0),))
    f, reference = TrajectoryFollower(JOINTS, LO, HI, np.zeros(2)), TrajectoryFollower(JOINTS, LO, HI, np.zeros(2))
    f.start(moving, now_s=0.0)
    reference.start(moving, now_s=0.0)
    f.update(0.498)
    q, qd = reference.update(0.5), reference.desired_qd
    f.start(build(times=(1.0,), positions=((0.9, 0.0),), velocities=((0.0, 0.0),)), now_s=0.5, start_time_s=0.5)
    np.testing.assert_allclose(f.update(0.5), q, atol=1e-12)
    np.testing.assert_allclose(f.desired_qd, qd, atol=1e-12)


# ---------------------------------------------------------------------------------------------- stop ramps
ARM = ("j1", "j2", "j3")
PERIOD = 0.01


def _decelerations(ramp, qd0: np.ndarray) -> np.ndarray:
    """Per-joint deceleration of each ramp segment, from the exact velocities at its points."""
    times = np.concatenate([[0.0], ramp.times_s])
    velocities = np.vstack([qd0, ramp.velocities])
    return np.abs(np.diff(velocities, axis=0) / np.diff(times)[:, None])


@pytest.mark.parametrize(
    ("qd0", "decel"),
    [
        (np.array([0.8, -0.3, 0.05]), 5.0),
        (np.array([0.8, -0.3, 0.05]), np.array([2.0, 7.5, 1.0])),  # per-joint limits: the slowest joint decides
        (np.array([1e-3, 0.0, -2e-3]), 5.0),  # barely moving: one period suffices
        (np.array([40.0, 0.0, 0.0]), 5.0),  # a long stop: sampled sparsely, still exact
    ],
)
def test_stop_ramp_decelerates_every_joint_within_its_limit_to_rest(qd0, decel):
    q0 = np.array([0.1, -0.2, 0.3])
    ramp = stop_ramp(ARM, q0, qd0, decel_radps2=decel, period_s=PERIOD)
    limit = np.broadcast_to(decel, qd0.shape)
    assert np.all(_decelerations(ramp, qd0) <= limit * (1 + 1e-9))
    # it begins at the next control period and takes whole periods
    assert ramp.times_s[0] == pytest.approx(PERIOD)
    assert ramp.duration_s / PERIOD == pytest.approx(round(ramp.duration_s / PERIOD))
    # ends at rest, every joint together, having travelled what a constant deceleration travels
    np.testing.assert_array_equal(ramp.velocities[-1], 0.0)
    np.testing.assert_allclose(ramp.positions[-1], q0 + qd0 * ramp.duration_s / 2, atol=1e-12)
    # and it is no longer than the slowest joint needs, rounded up to a period
    assert ramp.duration_s < float(np.max(np.abs(qd0) / limit)) + PERIOD + 1e-12
    # the controller's cubic interpolation from the moving setpoint reproduces the constant deceleration:
    # no velocity step at the start, no acceleration beyond the limit anywhere
    t = np.linspace(0.0, ramp.duration_s, 2001)
    qd = np.array([ramp.sample(ti, q0, qd0)[1] for ti in t])
    np.testing.assert_allclose(qd[0], qd0, atol=1e-12)
    accel = np.abs(np.diff(qd, axis=0) / np.diff(t)[:, None])
    assert np.all(accel <= limit * (1 + 1e-6))


def test_stop_ramp_from_rest_is_one_hold_point_a_period_ahead():
    q0 = np.array([0.1, -0.2, 0.3])
    ramp = stop_ramp(ARM, q0, np.zeros(3), decel_radps2=5.0, period_s=PERIOD)
    np.testing.assert_array_equal(ramp.times_s, [PERIOD])
    np.testing.assert_array_equal(ramp.positions, [q0])
    np.testing.assert_array_equal(ramp.velocities, [[0.0, 0.0, 0.0]])


def test_stop_ramp_stays_inside_the_joint_limits():
    ramp = stop_ramp(
        ARM, [0.95, 0.0, 0.0], [1.0, 0.0, 0.0], decel_radps2=5.0, period_s=PERIOD, lower=-np.ones(3), upper=np.ones(3)
    )
    assert ramp.positions[:, 0].max() == 1.0  # a stop that would cross the limit ends at it
    assert np.all(ramp.velocities[ramp.positions[:, 0] >= 1.0, 0] == 0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"qd_radps": [np.nan, 0.0, 0.0]}, "must be finite"),
        ({"q_rad": [0.0, np.inf, 0.0]}, "must be finite"),
        ({"qd_radps": [0.1, 0.0]}, "3 joints need 3 positions and velocities"),
        ({"decel_radps2": 0.0}, "decel_radps2 must be finite and > 0"),
        ({"decel_radps2": [5.0, -1.0, 5.0]}, "decel_radps2 must be finite and > 0"),
        ({"decel_radps2": np.nan}, "decel_radps2 must be finite and > 0"),
        ({"decel_radps2": [5.0, 5.0]}, "one value or one per joint"),
        ({"period_s": 0.0}, "control period must be finite and > 0"),
    ],
)
def test_stop_ramp_refuses_bad_input_with_a_reason(kwargs, message):
    args = {"q_rad": [0.0, 0.0, 0.0], "qd_radps": [0.1, 0.0, 0.0], "decel_radps2": 5.0, "period_s": PERIOD}
    args.update(kwargs)
    with pytest.raises(TrajectoryError, match=message):
        stop_ramp(ARM, args.pop("q_rad"), args.pop("qd_radps"), **args)


# ---------------------------------------------------------------------------------------------- speed scaling
def test_a_scaled_follower_runs_the_trajectory_at_that_fraction_of_the_clock():
    f = TrajectoryFollower(JOINTS, LO, HI, np.zeros(2))
    token = f.start(build(times=(1.0,), positions=((0.5, 0.0),)), now_s=0.0)
    f.set_speed_scaling(0.5, now_s=0.0)
    np.testing.assert_allclose(f.update(1.0), [0.25, 0.0])  # half way after one second at 50 %
    assert f.elapsed_s(token) == pytest.approx(0.5) and not f.finished(token, 1.0)
    f.set_speed_scaling(0.0, now_s=1.0)  # paused: nothing moves however long it lasts
    np.testing.assert_allclose(f.update(30.0), [0.25, 0.0])
    f.set_speed_scaling(1.0, now_s=30.0)
    np.testing.assert_allclose(f.update(30.25), [0.375, 0.0])
    assert f.finished(token, 30.5) and f.elapsed_s(token, 31.0) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="fraction in"):
        f.set_speed_scaling(50.0, now_s=31.0)  # percent given as a fraction


def test_a_trajectory_stamped_in_the_past_begins_part_way_along():
    """A stop computed at a joint state's stamp and received later runs as computed: at receipt the setpoint is
    where the trajectory is by then, not a period behind it."""
    q0, qd0 = np.zeros(3), np.array([0.5, -0.25, 0.0])
    ramp = stop_ramp(ARM, q0, qd0, decel_radps2=5.0, period_s=PERIOD)
    late = TrajectoryFollower(ARM, -np.ones(3), np.ones(3), q0)
    late.desired_qd = qd0.copy()
    late.desired_q = q0 + qd0 * 0.004  # the setpoint moved on for the 4 ms the message took
    late.start(ramp, now_s=10.004, start_time_s=10.0)
    expected, _ = ramp.sample(0.004 + PERIOD, q0, qd0)
    np.testing.assert_allclose(late.update(10.004 + PERIOD), expected, atol=1e-5)
    np.testing.assert_allclose(late.update(11.0), ramp.positions[-1], atol=1e-12)


def test_a_trajectory_stamped_in_the_future_starts_at_its_stamp():
    """A goal stamped ahead of the clock (a client's lead over its transport delay) leaves the arm where it is
    until the stamp, then runs as if received then; it goes from the state at receipt to the first point at the
    stamp plus its time_from_start, as joint_trajectory_controller interpolates it."""
    q0 = np.zeros(2)
    early = TrajectoryFollower(JOINTS, LO, HI, q0)
    on_time = TrajectoryFollower(JOINTS, LO, HI, q0)
    sweep = build(times=(0.5, 1.0), positions=((0.25, -0.25), (0.5, -0.5)), velocities=((0.75, -0.75), (0, 0)))
    token = early.start(sweep, now_s=10.0, start_time_s=10.2)
    on_time.start(sweep, now_s=10.2)
    assert early.elapsed_s(token) == pytest.approx(-0.2)
    assert np.abs(early.update(10.05)).max() < 0.01  # barely moving before its stamp
    for t in (10.5, 10.9, 11.1):  # on the way, after the stamp: as close as the receipt segment lets it be
        np.testing.assert_allclose(early.update(t), on_time.update(t), atol=0.05)
    assert not early.finished(token, 11.19)
    np.testing.assert_allclose(early.update(11.2), (0.5, -0.5), atol=1e-12)  # and there when it was due
    assert early.finished(token, 11.2)


# ---------------------------------------------------------------------------------------------- horizon pieces
def _sweep(duration_s: float = 1.0, spacing_s: float = PERIOD) -> JointTrajectory:
    """A minimum-jerk sweep of three joints sampled as the harness samples its sweeps (positions and velocities)."""
    t = np.arange(1, round(duration_s / spacing_s) + 1) * spacing_s
    s = t / duration_s
    span = np.array([0.6, -0.4, 0.2])
    shape = 10 * s**3 - 15 * s**4 + 6 * s**5
    rate = (30 * s**2 - 60 * s**3 + 30 * s**4) / duration_s
    return JointTrajectory(ARM, t, shape[:, None] * span, rate[:, None] * span)


def _piece(sweep, from_s, horizon_s=0.1):
    return horizon_piece(sweep, from_s, horizon_s, decel_radps2=3.0, period_s=PERIOD)


def test_a_piece_is_the_sweeps_own_points_up_to_the_horizon_then_a_stop_within_the_limit():
    sweep = _sweep()
    piece = _piece(sweep, 0.303)
    n = np.searchsorted(piece.trajectory.times_s, piece.cut_s - 0.303 + 1e-9)
    # the sweep's points after 0.303 s up to the first one at or past 0.403 s, at the sweep's times less 0.303 s
    inside = (sweep.times_s > 0.303) & (sweep.times_s <= 0.41 + 1e-9)
    np.testing.assert_allclose(piece.trajectory.times_s[:n], sweep.times_s[inside] - 0.303)
    np.testing.assert_allclose(piece.trajectory.positions[:n], sweep.positions[inside])
    assert piece.cut_s == pytest.approx(0.41) and not piece.final
    ramp_v = np.vstack([sweep.velocities[inside][-1], piece.trajectory.velocities[n:]])
    ramp_t = np.concatenate([[piece.cut_s - 0.303], piece.trajectory.times_s[n:]])
    assert np.all(np.abs(np.diff(ramp_v, axis=0) / np.diff(ramp_t)[:, None]) <= 3.0 + 1e-9)
    np.testing.assert_array_equal(piece.trajectory.velocities[-1], 0.0)  # it ends at rest


def test_pieces_renewed_in_time_follow_the_sweep_exactly_and_one_left_alone_stops_past_its_horizon():
    sweep = _sweep()
    start = np.zeros(3)
    whole = TrajectoryFollower(ARM, -np.full(3, 3.0), np.full(3, 3.0), start)
    pieces = TrajectoryFollower(ARM, -np.full(3, 3.0), np.full(3, 3.0), start)
    whole.start(sweep, 0.0)
    piece = _piece(sweep, 0.0)
    pieces.start(piece.trajectory, 0.0)
    offset, t = 0.0, 0.0
    while t < 0.6:  # a new piece every 25 ms, started where the controller is (as the backend stamps them)
        t = round(t + 0.025, 9)
        np.testing.assert_allclose(pieces.update(t), whole.update(t), atol=1e-12)
        offset = offset + pieces.elapsed_s()
        piece = _piece(sweep, offset)
        pieces.start(piece.trajectory, t, start_time_s=t)
    q_cut, qd_cut = sweep.sample(piece.cut_s, np.zeros(3))
    for k in range(1, 200):  # the commander is gone: the last piece runs out
        pieces.update(t + 0.01 * k)
    assert np.abs(pieces.desired_qd).max() == 0.0  # at rest
    # where it stopped: the sweep up to the cut (at most the horizon past where the last piece began), then the stop
    stop_s = np.ceil(np.abs(qd_cut).max() / 3.0 / PERIOD) * PERIOD  # a whole number of periods at <= 3 rad/s^2
    np.testing.assert_allclose(pieces.desired_q, q_cut + qd_cut * stop_s / 2, atol=1e-9)
    assert piece.cut_s - offset <= 0.1 + PERIOD + 1e-9


def test_the_last_piece_is_the_sweeps_rest_without_a_stop_and_after_the_end_there_is_none():
    sweep = _sweep()
    piece = _piece(sweep, 0.95)
    assert piece.final and piece.cut_s == pytest.approx(1.0)
    np.testing.assert_allclose(piece.trajectory.positions[-1], sweep.positions[-1])
    assert _piece(sweep, 1.0) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"horizon_s": 0.0}, "horizon_s must be finite and > 0"), ({"horizon_s": float("nan")}, "horizon_s")],
)
def test_a_horizon_piece_refuses_bad_input_with_a_reason(kwargs, message):
    with pytest.raises(TrajectoryError, match=message):
        horizon_piece(_sweep(), 0.0, decel_radps2=3.0, period_s=PERIOD, **kwargs)
    sweep = _sweep()
    with pytest.raises(TrajectoryError, match="needs the sweep's velocities"):
        _piece(JointTrajectory(ARM, sweep.times_s, sweep.positions, None), 0.0)

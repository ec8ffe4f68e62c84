import numpy as np
import pytest

from captain_ros.core.trajectory import JointTrajectory, TrajectoryError, TrajectoryFollower

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

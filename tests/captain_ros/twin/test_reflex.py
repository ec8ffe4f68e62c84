"""The arm's own force reflex in the twin's controllers: a client that never stops the arm (a stalled
harness) cannot press it into the table with hundreds of newtons; free motion never trips it."""

import math

import numpy as np
import pytest

from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics, top_down_rotation
from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.controller import ForceReflex
from captain_ros.twin.sim import Twin

PANDA = robot.default_profile()  # the twin's arm

TASK = "put_blue_cube_in_box"
SPOT = [0.45, 0.0]  # clear of every object of the official layout, jaw along x


@pytest.fixture(scope="module")
def kin():
    return Kinematics()


def _above_the_table(kin) -> tuple[TwinBackend, Twin]:
    twin = Twin(TASK)
    twin.reset(f"{TASK}/official/0")
    backend = TwinBackend(twin)
    assert Harness(backend, load_config(), kin).call("move_to", pose={"position": [*SPOT, 0.05], "yaw_deg": 90}).success
    return backend, twin


def _press_without_stopping(backend: TwinBackend, twin: Twin, kin, reflex_n: float, seconds: float = 3.0):
    """One trajectory 3 cm into the table and nobody watching: what a stalled client leaves the arm doing."""
    backend.set_force_reflex(reflex_n)
    target = kin.solve(np.array([*SPOT, -0.03]), top_down_rotation(math.pi / 2), twin.arm_q())
    assert target.converged
    backend.controllers.start_motion(
        JointTrajectory(PANDA.arm_joints, np.array([2.0]), target.q_rad[None], None), twin.time_s
    )
    trips = []
    for _ in range(round(seconds / twin.model.opt.timestep)):
        trip = backend.controllers.step(twin)
        if trip is not None:
            trips.append(trip)
    return backend.controllers.reflex.peak_force_n, trips


def test_the_reflex_stops_a_press_that_nobody_else_stops(kin):
    backend, twin = _above_the_table(kin)
    unguarded_peak, trips = _press_without_stopping(backend, twin, kin, reflex_n=0.0)
    assert not trips and unguarded_peak > 150.0  # what the 412 N bench case was: position servos pushing on
    backend, twin = _above_the_table(kin)
    peak, trips = _press_without_stopping(backend, twin, kin, reflex_n=15.0)
    assert len(trips) == 1 and trips[0].force_n > 15.0 and "force reflex" in trips[0].message
    assert peak < unguarded_peak / 2
    assert peak <= trips[0].force_n + 1.0  # nothing grows after the trip: the arm holds where it stopped
    np.testing.assert_allclose(backend.commanded()[1], 0.0, atol=1e-12)
    assert np.abs(twin.arm_qd()).max() < 0.01
    assert twin.tcp_pose()[0][2] > 0.0  # it stopped at the table, not 3 cm into it


def test_after_a_trip_a_hold_keeps_the_arm_where_the_reflex_stopped_it(kin):
    """The harness holds after every stop; after a reflex trip the arm already holds where it stopped, and a hold
    at a position read later (the arm still sinking into the table) would press it deeper."""
    backend, twin = _above_the_table(kin)
    _, trips = _press_without_stopping(backend, twin, kin, reflex_n=15.0)
    assert len(trips) == 1
    held = backend.commanded()[0]
    backend.controllers.step(twin, 5)
    np.testing.assert_array_equal(backend.hold(), held)
    np.testing.assert_array_equal(backend.commanded()[0], held)
    moved = held + 0.01
    np.testing.assert_allclose(backend.hold(moved), moved)  # an explicit position is still a command


def test_free_motion_never_trips_a_low_reflex(kin):
    backend, twin = _above_the_table(kin)
    backend.set_force_reflex(3.0)  # the guarded-contact threshold
    goal = kin.solve(np.array([0.5, 0.25, 0.35]), top_down_rotation(0.3), twin.arm_q())
    sweep = JointTrajectory(PANDA.arm_joints, np.array([2.5]), goal.q_rad[None], None)
    backend.controllers.start_motion(sweep, twin.time_s)
    trips = [backend.controllers.step(twin) for _ in range(1500)]
    assert not any(trips) and backend.controllers.reflex.peak_force_n < 3.0


def test_a_trip_lasts_until_the_next_motion_arms_the_reflex_again():
    reflex = ForceReflex(10.0, baseline_steps=2)
    level = np.eye(3).ravel().tolist()  # the hand's rotation, row by row
    rest = ([0.0, 0.0, -7.0], level)
    assert reflex.check(*rest, 0.0) is None and reflex.check(*rest, 0.002) is None  # armed at rest
    pressed = [0.0, 0.0, -19.0]
    trip = reflex.check(pressed, level, 0.004)
    assert trip is not None and trip.force_n == pytest.approx(12.0)
    assert reflex.check(pressed, level, 0.006) is None  # tripped once, not every step
    reflex.arm()
    assert reflex.tripped is None and reflex.check(pressed, level, 0.008) is None  # re-armed on the load


def test_reflex_threshold_must_be_a_finite_force():
    with pytest.raises(ValueError, match="finite"):
        ForceReflex(math.nan)

"""Wrench arithmetic shared by the harness monitor and the arm's reflex."""

import math

import numpy as np

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.wrench import change_frame, external_force_n, force_beyond_n

PANDA = robot.default_profile()  # the twin's arm


def _rot_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def test_external_force_removes_the_load_rotated_with_the_hand():
    load = np.array([0.0, 0.0, -7.0])  # the hand's weight along its own -z at the baseline
    r0 = np.eye(3)
    # the hand turned 90 deg about the world x axis: the same weight now reads along the hand's +y
    r = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    weight_now = r.T @ (r0 @ load)
    assert external_force_n(weight_now, r, load, r0) == 0.0
    assert math.isclose(external_force_n(weight_now + [0.0, 0.0, 4.0], r, load, r0), 4.0)
    # without the rotation the turned load would read as ~9.9 N of contact
    assert external_force_n(weight_now, np.eye(3), load, r0) > 9.0


def test_change_frame_moves_torque_by_the_lever_arm():
    # a sensor 10 cm along a's +y, turned 90 deg about z, measures 2 N along its own +x
    force_a, torque_a = change_frame(np.array([2.0, 0.0, 0.0]), np.zeros(3), _rot_z(math.pi / 2), np.array([0, 0.1, 0]))
    np.testing.assert_allclose(force_a, [0.0, 2.0, 0.0], atol=1e-12)  # along a's +y
    np.testing.assert_allclose(torque_a, [0.0, 0.0, 0.0], atol=1e-12)  # force along the lever arm: no moment
    force_a, torque_a = change_frame(np.array([0.0, 2.0, 0.0]), np.zeros(3), _rot_z(math.pi / 2), np.array([0, 0.1, 0]))
    np.testing.assert_allclose(force_a, [-2.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(torque_a, [0.0, 0.0, 0.2], atol=1e-12)  # r x F = (0, .1, 0) x (-2, 0, 0)


def test_change_frame_round_trips_through_the_arm_links():
    kin = Kinematics()
    p_hand, r_hand = kin.forward(PANDA.home_q, PANDA.hand_frame)
    p_base, r_base = np.zeros(3), np.eye(3)
    force_h, torque_h = np.array([1.0, -2.0, 3.0]), np.array([0.1, 0.2, -0.3])
    # hand -> base, then base -> hand
    force_b, torque_b = change_frame(force_h, torque_h, r_base.T @ r_hand, r_base.T @ (p_hand - p_base))
    back_f, back_t = change_frame(force_b, torque_b, r_hand.T @ r_base, r_hand.T @ (p_base - p_hand))
    np.testing.assert_allclose(back_f, force_h, atol=1e-12)
    np.testing.assert_allclose(back_t, torque_h, atol=1e-12)


def test_the_plain_float_force_beyond_the_load_is_numpys_norm_of_force_minus_rotated_load():
    rng = np.random.default_rng(3)
    for _ in range(20):
        r, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        force, load_base = rng.normal(size=3) * 10, rng.normal(size=3) * 10
        expected = np.linalg.norm(force - r.T @ load_base)
        assert math.isclose(force_beyond_n(force.tolist(), r.ravel().tolist(), load_base.tolist()), expected)

"""Wrist wrench arithmetic shared by the harness's force monitor and the arm's own force reflex.

Both judge contact the same way: the wrist force minus the load measured at rest before the motion
(hand, fingers and anything held), rotated with the hand, so the load's weight is not mistaken for
contact when the hand turns.
"""

from __future__ import annotations

import math

import numpy as np


def external_force_n(
    force_hand_n: np.ndarray, r_hand: np.ndarray, baseline_force_hand_n: np.ndarray, r_hand_at_baseline: np.ndarray
) -> float:
    """Magnitude of the force at the hand beyond the baseline load. Forces are in the hand frame;
    rotations are the hand's orientation in the base frame now and when the baseline was measured."""
    return force_beyond_n(force_hand_n, r_hand, r_hand_at_baseline @ baseline_force_hand_n)


def force_beyond_n(force_hand_n: np.ndarray, r_hand: np.ndarray, baseline_force_base_n: np.ndarray) -> float:
    """external_force_n with the baseline load already in the base frame (a reflex checking every physics step
    rotates it once per motion)."""
    d = force_hand_n - r_hand.T @ baseline_force_base_n
    return math.sqrt(float(d @ d))  # np.linalg.norm's overhead matters at every physics step


def change_frame(
    force_b: np.ndarray, torque_b: np.ndarray, r_ab: np.ndarray, p_ab: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A wrench measured in frame b, expressed in frame a, where b has rotation `r_ab` and origin `p_ab` in a:
    the force rotates; the torque rotates and gains the moment of the force about a's origin."""
    force_a = r_ab @ force_b
    return force_a, r_ab @ torque_b + np.cross(p_ab, force_a)


# An arm controller that aborts a trajectory because its force reflex fired says so with this prefix in the
# goal's error string (the twin does; a vendor's wording is mapped by its robot profile).
REFLEX_ABORT_PREFIX = "force reflex"

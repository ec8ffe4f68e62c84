"""Wrist wrench arithmetic shared by the harness's force monitor and the arm's own force reflex.

Both judge contact the same way: the wrist force minus the load measured at rest before the motion
(hand, fingers and anything held), rotated with the hand, so the load's weight is not mistaken for
contact when the hand turns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def external_force_n(
    force_hand_n: np.ndarray, r_hand: np.ndarray, baseline_force_hand_n: np.ndarray, r_hand_at_baseline: np.ndarray
) -> float:
    """Magnitude of the force at the hand beyond the baseline load. Forces are in the hand frame;
    rotations are the hand's orientation in the base frame now and when the baseline was measured."""
    baseline = (np.asarray(r_hand_at_baseline) @ np.asarray(baseline_force_hand_n)).tolist()
    return force_beyond_n(np.asarray(force_hand_n).tolist(), np.asarray(r_hand).ravel().tolist(), baseline)


def force_beyond_n(
    force_hand_n: Sequence[float], r_hand_rows: Sequence[float], baseline_force_base_n: Sequence[float]
) -> float:
    """external_force_n with the baseline load already in the base frame (a reflex checking every physics step
    rotates it once per motion). Plain floats: the hand's rotation as its nine entries row by row (MuJoCo's xmat
    layout). At every physics step numpy's per-call overhead was most of this arithmetic's cost (3.3 us vs 0.7)."""
    fx, fy, fz = force_hand_n
    r0, r1, r2, r3, r4, r5, r6, r7, r8 = r_hand_rows
    bx, by, bz = baseline_force_base_n
    dx = fx - (r0 * bx + r3 * by + r6 * bz)  # force minus R^T @ baseline
    dy = fy - (r1 * bx + r4 * by + r7 * bz)
    dz = fz - (r2 * bx + r5 * by + r8 * bz)
    return math.sqrt(dx * dx + dy * dy + dz * dz)


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

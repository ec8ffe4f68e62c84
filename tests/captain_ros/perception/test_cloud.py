"""The table fit of perception.cloud: a depth image without a horizontal plane is a clear ValueError (the
perception call then fails as not found), never Open3D's RuntimeError from a plane search on too few points."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from captain_ros.perception.cloud import fit_table


def grid(n: int = 80) -> tuple[np.ndarray, np.ndarray]:
    u, v = np.meshgrid(np.linspace(0.0, 0.3, n), np.linspace(0.0, 0.3, n))
    return u, v


def test_a_tilted_table_is_found_with_its_normal_up():
    u, v = grid()
    points = np.stack([u, v, 0.02 * u + 0.01], axis=-1)  # 1.1 deg tilt, 1 cm up
    normal, d = fit_table(points)
    np.testing.assert_allclose(normal, np.array([-0.02, 0.0, 1.0]) / np.hypot(0.02, 1.0), atol=1e-3)
    assert normal @ np.array([0.1, 0.1, 0.012]) + d == pytest.approx(0.0, abs=1e-3)


def test_two_walls_and_no_table_is_a_clear_error():
    u, v = grid()
    wall_x = np.stack([np.zeros_like(u), u, v], axis=-1)  # the plane x = 0
    wall_y = np.stack([u, np.zeros_like(u), v], axis=-1)  # the plane y = 0
    points = np.concatenate([wall_x, wall_y], axis=0)
    with pytest.raises(ValueError, match="no horizontal plane"):
        fit_table(points)


def test_too_few_depth_points_is_a_clear_error():
    points = np.full((40, 40, 3), np.nan)
    points[:8, :8] = 0.0
    with pytest.raises(ValueError, match="too few depth points"):
        fit_table(points)


def test_a_known_table_is_refined_where_it_still_fits_and_searched_for_where_it_does_not():
    u, v = grid()
    table = np.stack([u, v, 0.001 * u], axis=-1)
    found = fit_table(table)
    again = fit_table(table, hint=found)
    np.testing.assert_allclose(again[0], found[0], atol=1e-4)
    assert again[1] == pytest.approx(found[1], abs=1e-4)
    lifted = np.stack([u, v, 0.001 * u + 0.05], axis=-1)  # a new table 5 cm higher: the old plane fits no point
    normal, d = fit_table(lifted, hint=found)
    assert normal @ np.array([0.1, 0.1, 0.0501]) + d == pytest.approx(0.0, abs=1e-3)
    wall = np.stack([np.zeros_like(u), u, v], axis=-1)
    with pytest.raises(ValueError, match="no horizontal plane"):
        fit_table(wall, hint=found)  # a hint never turns a wall into a table


def test_the_robot_mask_matches_point_to_segment_distances():
    """robot_mask's all-segments-at-once algebra against a plain loop over segments, on random points."""
    from captain_ros.core.kinematics import Kinematics
    from captain_ros.perception.cloud import robot_mask

    kin = Kinematics()
    rng = np.random.default_rng(3)
    q = kin.profile.home_q
    points = rng.uniform([-0.3, -0.6, -0.1], [0.9, 0.6, 1.2], size=(120, 100, 3)).astype(np.float32)
    candidates = rng.random((120, 100)) < 0.7
    chain = list(kin.profile.self_filter_chain_m.items())
    ends = [(kin.forward(q, frame)[0], radius) for frame, radius in chain]
    flat = points.reshape(-1, 3).astype(np.float64)
    expected = np.zeros(len(flat), dtype=bool)
    for (a, ra), (b, rb) in itertools.pairwise(ends):
        t = np.clip(((flat - a) @ (b - a)) / max((b - a) @ (b - a), 1e-12), 0, 1)  # two frames may coincide
        expected |= np.linalg.norm(flat - (a + t[:, None] * (b - a)), axis=1) < max(ra, rb)
    expected = expected.reshape(candidates.shape) & candidates
    got = robot_mask(points, kin, q, candidates)
    assert expected.sum() > 100
    assert (got != expected).sum() <= 2  # float32 against float64 at the surface of a capsule

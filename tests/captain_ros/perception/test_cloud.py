"""The table fit of perception.cloud: a depth image without a horizontal plane is a clear ValueError (the
perception call then fails as not found), never Open3D's RuntimeError from a plane search on too few points."""

from __future__ import annotations

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

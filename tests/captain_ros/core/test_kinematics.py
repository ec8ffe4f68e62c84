import numpy as np
import pytest

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics, top_down_rotation

PROFILES = ("panda_twin", "ur5e_twin")  # a 7-joint and a 6-joint arm: the IK is not written for one of them


@pytest.fixture(params=PROFILES)
def profile(request) -> robot.RobotProfile:
    return robot.load_profile(request.param)


def test_ik_reaches_top_down_poses_over_the_table_within_limits(profile):
    kin = Kinematics(profile=profile)
    rng = np.random.default_rng(3)
    lower, upper = profile.arm_limits_rad()
    for _ in range(30):
        target = np.array([rng.uniform(0.3, 0.7), rng.uniform(-0.3, 0.3), rng.uniform(0.02, 0.3)])
        rotation = top_down_rotation(rng.uniform(-1.5, 1.5))
        result = kin.solve(target, rotation, profile.home_q)
        assert result.converged
        assert np.all(result.q_rad >= lower) and np.all(result.q_rad <= upper)
        pos, rot = kin.forward(result.q_rad)
        np.testing.assert_allclose(pos, target, atol=1e-3)
        np.testing.assert_allclose(rot, rotation, atol=1e-2)
        assert kin.self_collisions(result.q_rad) == []  # usable, not only solved


def test_unreachable_target_is_reported_not_faked(profile):
    result = Kinematics(profile=profile).solve(np.array([2.0, 0.0, 0.3]), top_down_rotation(), profile.home_q)
    assert not result.converged and result.position_error_m > 0.5


def test_top_down_rotation_points_the_fingers_down():
    rot = top_down_rotation(0.3)
    np.testing.assert_allclose(rot[:, 2], [0, 0, -1])
    assert np.linalg.det(rot) == pytest.approx(1.0)

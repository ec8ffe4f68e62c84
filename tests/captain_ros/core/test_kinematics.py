"""Kinematics from the profile's URDF: IK on a 7- and a 6-joint arm, and vendor descriptions as they come (massless
moving links, mimic fingers)."""

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from captain_ros.core import robot
from captain_ros.core.kinematics import PLACEHOLDER_MASS_KG, Kinematics, top_down_rotation

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


# ---------------------------------------------------------------------------------------------- vendor descriptions
HANDE_URDF = Path(__file__).parents[1] / "ros" / "urdf" / "ur5e_hande_vendor.urdf"  # PickNik's Hand-E on a UR5e


def test_a_description_with_massless_moving_links_compiles_for_kinematics():
    """The Hand-E's fingers and hande_finger_distance_link have no <inertial> (their mesh collisions are stripped
    too): MuJoCo refuses such moving bodies, so the kinematic model gives them a placeholder mass, and only them."""
    text = HANDE_URDF.read_text()
    root = ET.fromstring(text)
    massless = {link.get("name") for link in root.iter("link") if link.find("inertial") is None}
    assert {"hande_finger_distance_link", "hande_left_finger", "hande_right_finger"} <= massless
    ur5e = robot.load_profile("ur5e").with_urdf_text(text)
    kin = Kinematics(profile=ur5e)
    for link in ("hande_finger_distance_link", "hande_left_finger"):
        assert kin.model.body(link).mass[0] == pytest.approx(PLACEHOLDER_MASS_KG)
    assert kin.model.body("hand_e_base_link").mass[0] == pytest.approx(0.86387)  # a real inertial is kept
    position, rotation = kin.forward(ur5e.home_q)
    result = kin.solve(position + np.array([0.05, 0.0, -0.05]), rotation, ur5e.home_q)
    assert result.converged  # and the arm's kinematics work on it


def test_self_collisions_place_the_mimic_fingers_from_the_driven_joint():
    """The Hand-E's fingers mimic hande_finger_distance (finger = 0.025 - distance / 2): at a jaw opening the
    driven joint is 0.05 m minus it and each finger at half the opening, as MuJoCo's dynamics would hold them."""
    ur5e = robot.load_profile("ur5e").with_urdf_text(HANDE_URDF.read_text())
    kin = Kinematics(profile=ur5e)
    assert kin.self_collisions(ur5e.home_q, jaw_opening_m=0.03) == []

    def at(joint: str) -> float:
        return float(kin.data.qpos[kin.model.joint(joint).qposadr[0]])

    assert at("hande_finger_distance") == pytest.approx(0.02)
    assert [at("hande_left_finger_joint"), at("hande_right_finger_joint")] == pytest.approx([0.015, 0.015])
    panda = robot.default_profile()
    kin = Kinematics(profile=panda)
    kin.self_collisions(panda.home_q, jaw_opening_m=0.05)
    assert [at(j) for j in panda.finger_joints] == pytest.approx([0.025, 0.025])

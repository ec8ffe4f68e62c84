"""Each twin's URDF (urdf/panda.urdf, urdf/ur5e_twin.urdf) is the single source of truth: a PyPI URDF library,
the twin and the IK agree on it, and it carries the vendor's published numbers."""

import math

import mujoco
import numpy as np
import pytest
import yourdfpy

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics
from captain_ros.twin.sim import Twin

PROFILES = ("panda_twin", "ur5e_twin")  # the twins
TASK = "put_red_cube_in_bowl"

# Published limits each URDF must carry, joint -> (lower rad, upper rad, effort N m): Franka's datasheet; UR's
# ur_description config/ur5e/joint_limits.yaml (+-360 deg, the elbow +-180 deg, 150 / 28 N m).
PUBLISHED_LIMITS = {
    "panda_twin": {"panda_joint4": (-3.0718, -0.0698, 87.0), "panda_joint6": (-0.0175, 3.7525, 12.0)},
    "ur5e_twin": {
        "shoulder_lift_joint": (-2 * math.pi, 2 * math.pi, 150.0),
        "elbow_joint": (-math.pi, math.pi, 150.0),
        "wrist_1_joint": (-2 * math.pi, 2 * math.pi, 28.0),
    },
}
MAX_JAW_OPENING_M = {"panda_twin": 0.08, "ur5e_twin": 0.085}
# TCP position at the home pose: Franka's ready pose; the UR twin's chosen home above the table
HOME_TCP_M = {"panda_twin": [0.3069, 0.0, 0.4869], "ur5e_twin": [0.35, 0.0, 0.45]}
# TCP from the hand, fingertips below the TCP, pad box (m)
GRIPPER = {
    "panda_twin": (0.1034, 0.0584 + 0.053 - 0.1034, (0.02, 0.018, 0.053)),
    "ur5e_twin": (0.115, 0.075 + 0.048 - 0.115, (0.022, 0.012, 0.048)),
}


@pytest.fixture(scope="module", params=PROFILES)
def profile(request) -> robot.RobotProfile:
    return robot.load_profile(request.param)


@pytest.fixture(scope="module")
def urdf(profile):
    return yourdfpy.URDF.load(str(profile.description_path), build_collision_scene_graph=False, load_meshes=False)


def _configure(urdf, profile: robot.RobotProfile, q: np.ndarray, finger_m: float) -> None:
    """The arm at q and the (first) finger at finger_m; the mimic finger follows in yourdfpy."""
    assert urdf.actuated_joint_names == [*profile.arm_joints, profile.finger_joints[0]]
    urdf.update_cfg(np.concatenate([q, [finger_m]]))


def test_description_has_the_arm_its_gripper_and_its_cameras(profile, urdf):
    assert urdf.actuated_joint_names[: profile.dof] == list(profile.arm_joints)
    assert {profile.tcp_frame, "head_camera_optical_frame", "wrist_camera_optical_frame"} <= set(urdf.link_map)
    for joint, (lower, upper, effort) in PUBLISHED_LIMITS[profile.name].items():
        limits = profile.joint_limits[joint]
        assert (limits.lower, limits.upper, limits.effort) == pytest.approx((lower, upper, effort)), joint
    assert profile.max_jaw_opening_m() == pytest.approx(MAX_JAW_OPENING_M[profile.name])


def test_home_pose_holds_the_gripper_down_above_the_table(profile, urdf):
    _configure(urdf, profile, profile.home_q, profile.max_jaw_opening_m() / 2)
    tcp = urdf.get_transform(profile.tcp_frame, profile.base_frame)
    np.testing.assert_allclose(tcp[:3, 3], HOME_TCP_M[profile.name], atol=2e-4)
    np.testing.assert_allclose(tcp[:3, 2], [0.0, 0.0, -1.0], atol=1e-3)  # fingers down


def _ur_dh_tool0(q: np.ndarray) -> np.ndarray:
    """tool0 in the controller's `base` frame from UR's published UR5e DH parameters (standard DH)."""
    d = (0.1625, 0.0, 0.0, 0.1333, 0.0997, 0.0996)
    a = (0.0, -0.425, -0.3922, 0.0, 0.0, 0.0)
    alpha = (math.pi / 2, 0.0, 0.0, math.pi / 2, -math.pi / 2, 0.0)
    pose = np.eye(4)
    for qi, di, ai, al in zip(q, d, a, alpha, strict=True):
        ct, st, ca, sa = math.cos(qi), math.sin(qi), math.cos(al), math.sin(al)
        pose = pose @ np.array(
            [[ct, -st * ca, st * sa, ai * ct], [st, ct * ca, -ct * sa, ai * st], [0, sa, ca, di], [0, 0, 0, 1]]
        )
    return pose


def test_ur5e_twin_has_the_published_ur5e_kinematics():
    profile = robot.load_profile("ur5e_twin")
    urdf = yourdfpy.URDF.load(str(profile.description_path), build_collision_scene_graph=False, load_meshes=False)
    rng = np.random.default_rng(11)
    lower, upper = profile.arm_limits_rad()
    for q in [np.zeros(6), *rng.uniform(lower, upper, size=(20, 6))]:
        _configure(urdf, profile, q, 0.0)
        np.testing.assert_allclose(urdf.get_transform("tool0", "base"), _ur_dh_tool0(q), atol=1e-6)


def test_forward_kinematics_agree_within_1mm_at_random_configurations(profile, urdf):
    rng = np.random.default_rng(7)
    lower, upper = profile.arm_limits_rad()
    kin = Kinematics(profile=profile)
    twin = Twin(TASK, profile=profile)
    m, d = twin.model, twin.data
    # every link of the chain, the flange, the hand, the TCP, both cameras
    frames = {*profile.self_filter_chain_m, profile.flange_frame, profile.hand_frame, profile.tcp_frame}
    frames |= set(profile.camera_frames.values())
    for _ in range(25):
        q = rng.uniform(lower, upper)
        _configure(urdf, profile, q, 0.02)
        d.qpos[[m.joint(j).qposadr[0] for j in profile.arm_joints]] = q
        mujoco.mj_kinematics(m, d)
        for frame in sorted(frames):
            expected = urdf.get_transform(frame, profile.base_frame)
            body = m.body(frame).id
            np.testing.assert_allclose(d.xpos[body], expected[:3, 3], atol=1e-3, err_msg=frame)
            np.testing.assert_allclose(d.xmat[body].reshape(3, 3), expected[:3, :3], atol=1e-3, err_msg=frame)
            pos, rot = kin.forward(q, frame)  # the IK's model of the same URDF
            np.testing.assert_allclose(pos, expected[:3, 3], atol=1e-3, err_msg=frame)
            np.testing.assert_allclose(rot, expected[:3, :3], atol=1e-3, err_msg=frame)


def test_twin_cameras_are_calibrated_at_the_urdf_optical_frames(profile):
    twin = Twin(TASK, profile=profile)
    twin.reset(f"{TASK}/official/0")  # official starts keep the URDF camera placement
    m, d = twin.model, twin.data
    for cam, frame in profile.camera_frames.items():
        body = m.body(frame).id
        position, rotation = twin.camera_pose(cam)  # as calibrated
        np.testing.assert_allclose(position, d.xpos[body], atol=1e-9)
        np.testing.assert_allclose(rotation, d.xmat[body].reshape(3, 3), atol=1e-9)
        # the rendered camera (MuJoCo's looks along -z with y up, the optical frame along +z with y down)
        # is the calibrated one plus a few millimetres of calibration error
        optical = d.cam_xmat[m.cam(cam).id].reshape(3, 3) @ np.diag([1, -1, -1])
        assert 0.0004 < np.linalg.norm(d.cam_xpos[m.cam(cam).id] - d.xpos[body]) < 0.005
        np.testing.assert_allclose(optical, d.xmat[body].reshape(3, 3), atol=0.01)


def test_both_twins_see_the_table_from_the_same_head_camera_pose():
    poses = []
    for name in PROFILES:
        profile = robot.load_profile(name)
        poses.append(Kinematics(profile=profile).forward(np.zeros(profile.dof), profile.camera_frames["head"]))
    np.testing.assert_allclose(poses[0][0], poses[1][0], atol=1e-9)
    np.testing.assert_allclose(poses[0][1], poses[1][1], atol=1e-9)


def test_gripper_geometry_comes_from_the_urdf(profile):
    tcp_m, fingertips_m, pad_m = GRIPPER[profile.name]
    g = profile.gripper_geometry
    assert g.tcp_from_flange_m == pytest.approx(tcp_m)
    assert g.fingertips_below_tcp_m == pytest.approx(fingertips_m)
    assert g.finger_pad_size_m == pad_m

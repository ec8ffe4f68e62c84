"""urdf/panda.urdf is the single source of truth: a PyPI URDF library and the twin agree on it."""

import numpy as np
import pytest
import yourdfpy

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics
from captain_ros.twin.sim import Twin

PANDA = robot.default_profile()  # the twin's arm

FRAMES = [PANDA.tcp_frame, "panda_link4", "panda_hand", *PANDA.camera_frames.values()]


@pytest.fixture(scope="module")
def urdf():
    return yourdfpy.URDF.load(str(PANDA.description_path), build_collision_scene_graph=False, load_meshes=False)


def test_description_has_the_panda_and_its_cameras(urdf):
    assert urdf.actuated_joint_names[:7] == list(PANDA.arm_joints)
    assert {"panda_tcp", "head_camera_optical_frame", "wrist_camera_optical_frame"} <= set(urdf.link_map)
    lower, upper = PANDA.arm_limits_rad()
    # Franka's published limits (datasheet)
    assert lower[3] == pytest.approx(-3.0718) and upper[5] == pytest.approx(3.7525)
    assert PANDA.joint_limits["panda_joint5"].effort == 12
    assert PANDA.max_jaw_opening_m() == pytest.approx(0.08)


def test_home_pose_is_the_known_panda_ready_pose(urdf):
    urdf.update_cfg(np.concatenate([PANDA.home_q, [0.04]]))
    tcp = urdf.get_transform(PANDA.tcp_frame, PANDA.base_frame)
    np.testing.assert_allclose(tcp[:3, 3], [0.3069, 0.0, 0.4869], atol=2e-4)


def test_forward_kinematics_agree_within_1mm_at_random_configurations(urdf):
    rng = np.random.default_rng(7)
    lower, upper = PANDA.arm_limits_rad()
    kin = Kinematics()
    twin = Twin("put_red_cube_in_bowl")
    m, d = twin.model, twin.data
    import mujoco

    for _ in range(25):
        q = rng.uniform(lower, upper)
        urdf.update_cfg(np.concatenate([q, [0.02]]))
        d.qpos[[m.joint(j).qposadr[0] for j in PANDA.arm_joints]] = q
        mujoco.mj_kinematics(m, d)
        for frame in FRAMES:
            expected = urdf.get_transform(frame, PANDA.base_frame)
            body = m.body(frame).id
            np.testing.assert_allclose(d.xpos[body], expected[:3, 3], atol=1e-3, err_msg=frame)
            np.testing.assert_allclose(d.xmat[body].reshape(3, 3), expected[:3, :3], atol=1e-3, err_msg=frame)
            pos, rot = kin.forward(q, frame)  # the IK's model of the same URDF
            np.testing.assert_allclose(pos, expected[:3, 3], atol=1e-3, err_msg=frame)
            np.testing.assert_allclose(rot, expected[:3, :3], atol=1e-3, err_msg=frame)


def test_twin_cameras_are_calibrated_at_the_urdf_optical_frames():
    twin = Twin("put_red_cube_in_bowl")
    twin.reset("put_red_cube_in_bowl/official/0")  # official starts keep the URDF camera placement
    m, d = twin.model, twin.data
    for cam, frame in PANDA.camera_frames.items():
        body = m.body(frame).id
        position, rotation = twin.camera_pose(cam)  # as calibrated
        np.testing.assert_allclose(position, d.xpos[body], atol=1e-9)
        np.testing.assert_allclose(rotation, d.xmat[body].reshape(3, 3), atol=1e-9)
        # the rendered camera (MuJoCo's looks along -z with y up, the optical frame along +z with y down)
        # is the calibrated one plus a few millimetres of calibration error
        optical = d.cam_xmat[m.cam(cam).id].reshape(3, 3) @ np.diag([1, -1, -1])
        assert 0.0004 < np.linalg.norm(d.cam_xpos[m.cam(cam).id] - d.xpos[body]) < 0.005
        np.testing.assert_allclose(optical, d.xmat[body].reshape(3, 3), atol=0.01)


def test_gripper_geometry_comes_from_the_urdf():
    g = PANDA.gripper_geometry
    assert g.tcp_from_flange_m == pytest.approx(0.1034)
    assert g.fingertips_below_tcp_m == pytest.approx(0.0584 + 0.053 - 0.1034)
    assert g.finger_pad_size_m == (0.02, 0.018, 0.053)

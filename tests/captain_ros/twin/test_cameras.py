"""Cameras: RGB + metric depth with CameraInfo-convention intrinsics and optical-frame extrinsics, rendered
from the true camera pose and labelled with the calibrated one (a start state's hand-eye calibration error
apart)."""

import numpy as np
import pytest

from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin, rotvec_matrix
from captain_ros.twin.start_states import CALIBRATION_ERROR_RANGES, StartId, make_layout

PANDA = robot.default_profile()  # the twin's arm

TASK = "put_red_cube_in_bowl"


@pytest.fixture(scope="module")
def scene():
    with Twin(TASK) as twin:
        twin.reset(f"{TASK}/official/0")
        yield twin, twin.observe()


def _project(position, rotation, K, point):  # noqa: N803 - the usual name
    p = rotation.T @ (point - position)
    return K[0, 0] * p[0] / p[2] + K[0, 2], K[1, 1] * p[1] / p[2] + K[1, 2], p[2]


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.degrees(np.arccos(np.clip((np.trace(a.T @ b) - 1) / 2, -1.0, 1.0))))


def test_images_have_the_promised_shapes_and_types(scene):
    _, frames = scene
    for frame in frames.values():
        assert frame.rgb.shape == (512, 512, 3) and frame.rgb.dtype == np.uint8
        assert frame.depth_m.shape == (512, 512) and frame.depth_m.dtype == np.float32
        assert frame.K[0, 2] == frame.K[1, 2] == 255.5  # pixel centres at integers, as CameraInfo


def test_a_known_point_projects_onto_its_object_with_its_depth_from_the_true_pose(scene):
    twin, frames = scene
    head = frames["head"]
    top = twin.reader.position("red_cube") + [0.0, 0.0, 0.045]  # centre of the cube's top face
    u, v, z = _project(*twin.true_camera_pose("head"), head.K, top)
    r, g, b = head.rgb[round(v), round(u)].astype(int)
    assert r > 120 and r > 2 * g and r > 2 * b, (r, g, b)
    assert head.depth_m[round(v), round(u)] == pytest.approx(z, abs=0.002)


def test_depth_back_projects_to_the_table_from_the_true_pose_and_shifted_by_the_error_from_the_calibrated_one(
    scene,
):
    twin, frames = scene
    head = frames["head"]
    v, u = 500, 20  # a table pixel away from objects
    z = float(head.depth_m[v, u])
    ray = np.array([(u - head.K[0, 2]) / head.K[0, 0], (v - head.K[1, 2]) / head.K[1, 1], 1.0]) * z
    p_true, r_true = twin.true_camera_pose("head")
    assert (p_true + r_true @ ray)[2] == pytest.approx(0.0, abs=0.001)
    seen = head.position_m + head.rotation @ ray  # what perception computes from the calibrated pose
    # the calibrated pose moves every point rigidly: T_calibrated * T_true^-1
    expected = head.rotation @ r_true.T @ (p_true + r_true @ ray - p_true) + head.position_m
    np.testing.assert_allclose(seen, expected, atol=1e-9)
    assert 0.0005 < np.linalg.norm(seen - (p_true + r_true @ ray)) < 0.02


@pytest.mark.parametrize("start", [f"{TASK}/official/0", f"{TASK}/official/12", f"{TASK}/wide/3", f"{TASK}/wide/19"])
def test_rendered_cameras_deviate_from_the_calibrated_poses_by_the_start_states_error(start):
    layout = make_layout(Twin(TASK).task, StartId.parse(start))
    with Twin(TASK) as twin:
        twin.reset(start)
        frames = twin.observe()
        for cam in PANDA.camera_frames:
            p_cal, r_cal = twin.camera_pose(cam)
            p_true, r_true = twin.true_camera_pose(cam)
            error = layout.calibration_error[cam]
            np.testing.assert_allclose(p_true, p_cal + r_cal @ np.array(error.offset_m), atol=1e-9)
            np.testing.assert_allclose(r_true, r_cal @ rotvec_matrix(error.rotvec_rad), atol=1e-9)
            (t_lo, t_hi), (r_lo, r_hi) = CALIBRATION_ERROR_RANGES[cam]
            assert t_lo - 1e-9 <= np.linalg.norm(p_true - p_cal) <= t_hi + 1e-9
            assert r_lo - 1e-6 <= _angle_deg(r_cal, r_true) <= r_hi + 1e-6
            # what observe hands on is the calibrated pose, never the true one
            np.testing.assert_array_equal(frames[cam].position_m, p_cal)
            np.testing.assert_array_equal(frames[cam].rotation, r_cal)


def test_perception_is_given_the_calibrated_pose_through_the_backend_and_the_harness():
    with Twin(TASK) as twin:
        twin.reset(f"{TASK}/wide/7")
        images = TwinBackend(twin).capture(("head", "wrist"))
        harness = Harness(TwinBackend(twin), load_config(), Kinematics())
        assert harness.call("observe").success
        stored = harness.perception.store.latest().images
        for cam in PANDA.camera_frames:
            p_cal, r_cal = twin.camera_pose(cam)
            p_true, _ = twin.true_camera_pose(cam)
            for image in (images[cam], stored[cam]):
                np.testing.assert_array_equal(image.position_m, p_cal)
                np.testing.assert_array_equal(image.rotation, r_cal)
                assert np.linalg.norm(image.position_m - p_true) > 0.0004


def test_calibrated_poses_are_the_urdf_extrinsics_moved_by_the_wide_head_placement():
    """The wrist camera's calibrated pose is the URDF's hand-eye extrinsic (what perception_node computes from
    the joint states); the head camera's is the URDF pose on official starts, the wide layout's placement
    otherwise (the placement reaches the renderer: MuJoCo fixes world-attached camera poses at reset)."""
    kin = Kinematics()
    with Twin(TASK) as twin:
        twin.reset(f"{TASK}/official/0")
        for cam, frame in PANDA.camera_frames.items():
            pos, rot = twin.camera_pose(cam)
            want_pos, want_rot = kin.forward(twin.arm_q(), frame)
            np.testing.assert_allclose(pos, want_pos, atol=1e-6)
            np.testing.assert_allclose(rot, want_rot, atol=1e-6)
        urdf_head = twin.camera_pose("head")
        twin.reset(f"{TASK}/wide/3")
        layout = make_layout(twin.task, StartId.parse(f"{TASK}/wide/3"))
        pos, rot = twin.camera_pose("head")
        np.testing.assert_allclose(pos, urdf_head[0] + urdf_head[1] @ np.array(layout.head_camera_offset_m), atol=1e-9)
        np.testing.assert_allclose(rot, urdf_head[1] @ rotvec_matrix(layout.head_camera_rotvec_rad), atol=1e-9)
        assert np.linalg.norm(twin.true_camera_pose("head")[0] - urdf_head[0]) > 0.001  # rendered from there too
        wrist = twin.camera_pose("wrist")
        np.testing.assert_allclose(wrist[0], kin.forward(twin.arm_q(), PANDA.camera_frames["wrist"])[0], atol=1e-6)


def test_tf_frames_carry_the_calibrated_poses_and_the_urdf_link_to_optical_joints():
    with Twin(TASK) as twin:
        twin.reset(f"{TASK}/wide/3")
        frames = twin.camera_transforms()
        m, d = twin.model, twin.data
        for cam, optical in PANDA.camera_frames.items():
            link = optical.replace("_optical_frame", "_link")
            assert set(frames) >= {optical, link}
            pos, rot = twin.camera_pose(cam)
            np.testing.assert_allclose(frames[optical][0], pos, atol=1e-12)
            np.testing.assert_allclose(frames[optical][1], rot, atol=1e-12)
            # link -> optical stays the URDF's fixed joint
            lp, lr = frames[link]
            ob, lb = m.body(optical).id, m.body(link).id
            urdf_rel = d.xmat[lb].reshape(3, 3).T @ d.xmat[ob].reshape(3, 3)
            np.testing.assert_allclose(lr.T @ rot, urdf_rel, atol=1e-9)
            urdf_offset = d.xmat[lb].reshape(3, 3).T @ (d.xpos[ob] - d.xpos[lb])
            np.testing.assert_allclose(lr.T @ (pos - lp), urdf_offset, atol=1e-9)


def test_wide_lighting_reaches_the_renderer():
    with Twin(TASK) as twin:
        for start in (f"{TASK}/wide/3", f"{TASK}/wide/5"):
            twin.reset(start)
            key = twin.model.light("key").id
            want = np.asarray(make_layout(twin.task, StartId.parse(start)).key_light_dir)
            np.testing.assert_allclose(twin.data.light_xdir[key], want / np.linalg.norm(want), atol=1e-9)


def test_a_twin_nobody_closed_does_not_break_another_twins_images_when_it_is_collected():
    """GL objects are per context: a rig collected while another rig's context is current must free its own
    (it once deleted the other's framebuffers, whose next depth image lost the table: seen only in full runs)."""
    import gc

    start = f"{TASK}/official/0"
    left_open, kept = Twin(TASK), Twin(TASK)
    left_open.reset(start)
    kept.reset(start)
    left_open.observe(("head",))
    before = kept.observe(("head",))["head"]  # the kept twin's context is the current one
    del left_open
    gc.collect()
    after = kept.observe(("head",))["head"]
    np.testing.assert_array_equal(after.depth_m, before.depth_m)
    np.testing.assert_array_equal(after.rgb, before.rgb)
    kept.close()

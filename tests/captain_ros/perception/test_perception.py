"""Perception through the harness API on the twin: observe, segment, mark_point, select_detection,
measure_object_geometry, measure_image_points; staleness; bad input for every argument."""

import threading
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import pytest

from captain_ros.core.contract import RECEIPT_MAX_CHARS, FailureCategory

from .conftest import pixel_of


def true_center(twin, name: str) -> np.ndarray:
    spec = next(o for o in twin.task.objects if o.name == name)
    return twin.reader.position(name) + twin.reader.rotation(name) @ np.array([0, 0, spec.size_m[2] / 2])


def seen_center(twin, name: str, camera: str = "head") -> np.ndarray:
    """Ground truth for tests only: where a perfect measurement through the calibrated camera puts the object's
    centre (the true centre moved by the start state's calibration error: T_calibrated * T_true^-1)."""
    p_cal, r_cal = twin.camera_pose(camera)
    p_true, r_true = twin.true_camera_pose(camera)
    return r_cal @ r_true.T @ (true_center(twin, name) - p_true) + p_cal


def test_segment_and_measure_find_the_objects_in_metres(harness, twin):
    obs = harness.call("observe")
    assert obs.success and obs.value["observation_handle"] == "obs-1"
    assert set(obs.value["cameras"]) == {"head", "wrist"}
    cube = harness.call("segment", text="the red cube")
    assert cube.success and cube.value["detections"][0]["named"] == "red cube"
    bowl = harness.call("segment", text="black bowl")
    geometry = harness.call(
        "measure_object_geometry",
        object=cube.value["detections"][0]["detection_id"],
        destination=bowl.value["detections"][0]["detection_id"],
    )
    assert geometry.success and len(geometry.receipt) <= RECEIPT_MAX_CHARS
    v = geometry.value
    np.testing.assert_allclose(v["center_m"], seen_center(twin, "red_cube"), atol=0.002)
    np.testing.assert_allclose(v["extents_m"], [0.045, 0.045, 0.045], atol=0.005)
    assert v["kind"] == "cube" and not v["open_top"]
    dest = v["destination"]
    assert dest["kind"] == "bowl" and dest["open_top"] and not dest["center_inside_footprint"]
    expected = seen_center(twin, "black_bowl")[:2] - seen_center(twin, "red_cube")[:2]
    np.testing.assert_allclose(dest["offset_xy_m"], expected, atol=0.005)
    assert "offset" in geometry.receipt and "outside footprint" in geometry.receipt


def test_measurements_carry_the_calibration_error_perception_cannot_know(harness, twin):
    """Perception is given the calibrated camera pose, never the true one: on exact depth it measures where the
    calibrated camera sees the object, a few millimetres from the truth (this start's head-camera error)."""
    harness.call("observe")
    for name in ("red_cube", "green_cube", "black_bowl"):
        det = harness.call("segment", text=name.replace("_", " ")).value["detections"][0]["detection_id"]
        center = np.array(harness.call("measure_object_geometry", object=det).value["center_m"])
        np.testing.assert_allclose(center, seen_center(twin, name), atol=0.0015)
        assert np.linalg.norm(center - true_center(twin, name)) > 0.002, name


def test_mark_point_and_select_detection(harness, twin):
    harness.call("observe", cameras=["head"])
    u, v = pixel_of(twin, "red_cube")
    mark = harness.call("mark_point", observation_handle="obs-1", camera="head", u=u, v=v, label="red cube")
    assert mark.success, mark.message
    np.testing.assert_allclose(mark.value["position_m"], seen_center(twin, "red_cube"), atol=0.003)
    cubes = harness.call("segment", text="cube")
    ids = [d["detection_id"] for d in cubes.value["detections"]]
    assert len(ids) == 2  # red and green
    chosen = harness.call("select_detection", candidates=ids, evidence=mark.value["detection_id"])
    assert chosen.success and chosen.value["label"] == "cube"
    np.testing.assert_allclose(chosen.value["position_m"], mark.value["position_m"], atol=0.002)
    gu, gv = pixel_of(twin, "green_cube")
    green = harness.call("mark_point", u=gu, v=gv)
    miss = harness.call(
        "select_detection", candidates=[chosen.value["detection_id"]], evidence=green.value["detection_id"]
    )
    assert miss.failure_category is FailureCategory.NOT_FOUND and "outside every candidate mask" in miss.message
    point = harness.call("mark_point", u=u, v=v, granularity="point")
    assert point.success and point.value["mask_pixels"] < mark.value["mask_pixels"]
    pts = harness.call("measure_image_points", points=[[u, v], [0.5, 0.98]])
    assert pts.success and pts.value["points"][0]["height_above_table_m"] > 0.03


def test_observations_and_detections_go_stale_after_a_physical_action(harness):
    harness.call("observe")
    det = harness.call("segment", text="green cube").value["detections"][0]["detection_id"]
    assert harness.call("move_to", gripper=0.06).success
    stale = harness.call("measure_object_geometry", object=det)
    assert stale.failure_category is FailureCategory.STALE_OBSERVATION and "observe() again" in stale.message
    again = harness.call("segment", text="green cube", observation_handle="obs-1")
    assert again.failure_category is FailureCategory.STALE_OBSERVATION
    harness.call("observe")
    assert harness.call("segment", text="green cube").success  # the newest observation by default


def test_an_episode_keeps_a_bounded_number_of_observations_and_says_what_it_dropped(harness):
    kept = harness.perception.store.max_kept
    harness.call("observe", cameras=["head"])
    det = harness.call("segment", text="green cube").value["detections"][0]["detection_id"]
    for _ in range(kept - 1):
        assert "dropped" not in harness.call("observe", cameras=["head"]).receipt
    newest = harness.call("observe", cameras=["head"])
    assert newest.value["dropped_observations"] == ["obs-1"] and "dropped obs-1" in newest.receipt
    assert len(harness.perception.store.all()) == kept
    gone = harness.call("segment", text="green cube", observation_handle="obs-1")
    assert gone.failure_category is FailureCategory.INVALID_ARGUMENT and "obs-1 was dropped" in gone.message
    lost = harness.call("measure_object_geometry", object=det)  # its detection went with it
    assert "was dropped" in lost.message and "observe() again" in lost.message
    unknown = harness.call("segment", text="green cube", observation_handle="obs-99")
    assert "unknown observation handle" in unknown.message
    fresh = harness.call("segment", text="green cube").value["detections"][0]["detection_id"]
    assert fresh != det  # ids are never reused


def test_the_observation_store_bounds_bytes_and_keeps_the_newest():
    from captain_ros.perception.observation import CameraImage, ObservationStore, observation_bytes

    image = CameraImage("head", np.zeros((100, 100, 3), np.uint8), np.zeros((100, 100), np.float32),
                        np.eye(3), np.zeros(3), np.eye(3))  # fmt: skip
    one = 100 * 100 * 3 + 100 * 100 * 4
    store = ObservationStore(max_kept=100, max_bytes=3 * one)
    for _ in range(3):
        obs = store.add(0.0, {"head": image}, np.zeros(7), 0.0)
    obs.cache[("cloud", "head")] = {"points": np.zeros((100, 100, 3))}  # a cached cloud counts too
    assert observation_bytes(obs) == one + 100 * 100 * 3 * 8
    store.add(0.0, {"head": image}, np.zeros(7), 0.0)
    assert store.dropped == ["obs-1", "obs-2", "obs-3"] and [o.handle for o in store.all()] == ["obs-4"]
    tiny = ObservationStore(max_kept=1, max_bytes=1)
    tiny.add(0.0, {"head": image}, np.zeros(7), 0.0)
    assert [o.handle for o in tiny.all()] == ["obs-1"]  # the newest is kept whatever its size
    with pytest.raises(ValueError):
        ObservationStore(max_kept=0)


@pytest.mark.parametrize(
    ("capability", "kwargs", "category", "words"),
    [
        ("segment", {"text": ""}, FailureCategory.INVALID_ARGUMENT, "text"),
        ("segment", {"text": 3}, FailureCategory.INVALID_ARGUMENT, "text"),
        ("segment", {"text": "purple cup"}, FailureCategory.NOT_FOUND, "seen: "),
        ("segment", {"text": "cube", "camera": "left"}, FailureCategory.INVALID_ARGUMENT, "camera"),
        ("segment", {"text": "cube", "observation_handle": "obs-9"}, FailureCategory.INVALID_ARGUMENT, "unknown"),
        ("mark_point", {"u": 1.5, "v": 0.5}, FailureCategory.INVALID_ARGUMENT, "u must be <= 1"),
        ("mark_point", {"u": float("nan"), "v": 0.5}, FailureCategory.INVALID_ARGUMENT, "finite"),
        ("mark_point", {"u": 0.5}, FailureCategory.INVALID_ARGUMENT, "needs u and v"),
        ("mark_point", {"u": 0.5, "v": 0.97}, FailureCategory.NOT_FOUND, "table (background)"),
        ("mark_point", {"u": 0.5, "v": 0.02}, FailureCategory.NOT_FOUND, "on the robot"),
        ("mark_point", {"u": 0.5, "v": 0.5, "granularity": "atom"}, FailureCategory.INVALID_ARGUMENT, "granularity"),
        ("mark_point", {"u": 0.5, "v": 0.5, "label": 7}, FailureCategory.INVALID_ARGUMENT, "label"),
        ("measure_object_geometry", {"object": "det-99"}, FailureCategory.INVALID_ARGUMENT, "unknown detection"),
        ("measure_object_geometry", {"object": None}, FailureCategory.INVALID_ARGUMENT, "detection id"),
        ("measure_object_geometry", {"object": "det-1", "shape": "torus"}, FailureCategory.INVALID_ARGUMENT, "shape"),
        ("select_detection", {"candidates": [], "evidence": "det-1"}, FailureCategory.INVALID_ARGUMENT, "candidates"),
        ("measure_image_points", {"points": [[0.5]]}, FailureCategory.INVALID_ARGUMENT, "2 numbers"),
        ("measure_image_points", {"points": "all"}, FailureCategory.INVALID_ARGUMENT, "points"),
        ("observe", {"cameras": ["thermal"]}, FailureCategory.INVALID_ARGUMENT, "cameras"),
        ("observe", {"cameras": []}, FailureCategory.INVALID_ARGUMENT, "non-empty"),
    ],
)
def test_bad_perception_input_is_refused_clearly(harness, capability, kwargs, category, words):
    assert harness.call("observe").success
    result = harness.call(capability, **kwargs)
    assert result.failure_category is category, result.message
    assert words in result.message


def test_perception_before_any_observation(harness):
    result = harness.call("segment", text="red cube")
    assert result.failure_category is FailureCategory.INVALID_ARGUMENT and "observe()" in result.message


def test_pixels_without_depth_are_reported(harness, twin):
    """A real sensor leaves holes (0 or NaN depth): marking or measuring there says so."""
    images = harness.backend.capture(("head",))
    head = images["head"]
    depth = head.depth_m.copy()
    depth[:100] = 0.0
    depth[100:120] = np.nan
    holes = {"head": replace(head, depth_m=depth)}
    state = harness.backend.read_state()
    obs = harness.perception.store.add(state.time_s, holes, state.q_rad, state.jaw_opening_m)
    for v in (0.05, 0.21):
        result = harness.call("mark_point", observation_handle=obs.handle, u=0.5, v=v)
        assert result.failure_category is FailureCategory.NO_DEPTH and "no depth" in result.message
    points = harness.call("measure_image_points", observation_handle=obs.handle, points=[[0.5, 0.05]])
    assert points.failure_category is FailureCategory.NO_DEPTH


def test_observe_answers_before_its_clouds_are_built_and_later_calls_wait_for_them(harness, twin):
    """observe hands its images to a background build and answers; the first call that needs a cloud waits for it.
    A camera without depth is reported there, naming the camera and the handle; a build the scene change overtook is
    not kept."""
    perception = harness.perception
    gate = threading.Event()
    perception._clouds.submit(gate.wait)  # the builder is busy: nothing of the next observe can be built yet
    obs = harness.call("observe")
    assert obs.success
    pending = perception.store.get(obs.value["observation_handle"]).cache
    clouds = [pending[("cloud", c)] for c in ("head", "wrist")]
    assert all(isinstance(c, Future) and not c.done() for c in clouds)
    gate.set()
    cube = harness.call("segment", text="red cube")
    assert cube.success and cube.value["detections"][0]["named"] == "red cube"
    assert not isinstance(pending[("cloud", "head")], Future)  # kept as the cloud itself from then on

    head = harness.backend.capture(("head",))["head"]
    blind = {"head": replace(head, depth_m=np.zeros_like(head.depth_m))}
    harness.perception.capture = lambda cameras: (0.0, blind, twin.arm_q(), 0.04)
    obs = harness.call("observe", cameras=["head"])
    assert obs.success
    result = harness.call("segment", text="red cube", observation_handle=obs.value["observation_handle"])
    assert result.failure_category is FailureCategory.NO_DEPTH
    assert f"head camera of {obs.value['observation_handle']}" in result.message and "depth" in result.message

    gate.clear()
    perception._clouds.submit(gate.wait)
    harness.perception.capture = lambda cameras: (0.0, {"head": head}, twin.arm_q(), 0.04)
    late = perception.store.get(harness.call("observe", cameras=["head"]).value["observation_handle"])
    perception.scene_changed()  # a physical action before the cloud was built
    gate.set()
    perception._clouds.submit(lambda: None).result()  # the builder has finished the stale build
    assert late.cache == {}


def test_point_contact_release_track_and_compare(harness, twin):
    harness.call("observe")
    point = harness.call("point", text="red cube")
    assert point.success and "segmenter" in point.value["source"]
    np.testing.assert_allclose(point.value["position_m"], seen_center(twin, "red_cube"), atol=0.003)
    cube = point.value["detection_id"]
    bowl = harness.call("segment", text="black bowl").value["detections"][0]["detection_id"]
    above = {"position": point.value["position_m"], "yaw_deg": 0}
    grasp = harness.call("inspect_contact_geometry", object=cube, pose=above, jaw_opening_m=0.08)
    assert grasp.success and grasp.value["graspable"] and grasp.value["fits_between_pads"]
    assert 0.044 < grasp.value["width_along_jaw_m"] < 0.065  # a 4.5 cm cube, turned a little
    assert grasp.value["obstacle_points_under_palm"] == 0
    narrow = harness.call("inspect_contact_geometry", object=cube, pose=above, jaw_opening_m=0.03)
    assert not narrow.value["graspable"] and not narrow.value["fits_between_pads"]
    # the hand's body low over the bowl: its rim stands under the palm (the URDF's hand box)
    b = harness.call("measure_object_geometry", object=bowl).value
    over = {"position": [*b["center_m"][:2], b["top_z_m"] - 0.06], "yaw_deg": 0}
    blocked = harness.call("inspect_contact_geometry", object=cube, pose=over, jaw_opening_m=0.08)
    assert blocked.value["obstacle_points_under_palm"] >= 3 and not blocked.value["graspable"]
    assert "under the palm" in blocked.receipt
    centred = harness.call("inspect_release_geometry", object=cube, destination=bowl)
    assert centred.value["footprint_inside"] and centred.value["signed_clearance_m"] > 0.02
    bowl_xy = harness.call("measure_object_geometry", object=bowl).value["center_m"][:2]
    off = harness.call(
        "inspect_release_geometry", object=cube, destination=bowl, position=[bowl_xy[0] + 0.07, bowl_xy[1]]
    )
    assert not off.value["footprint_inside"] and off.value["signed_clearance_m"] < 0
    # carry the cube 6 cm, then follow it into a new observation
    p = true_center(twin, "red_cube")
    yaw = float(np.degrees(np.arctan2(*twin.reader.rotation("red_cube")[[1, 0], 0])))
    for kwargs in (
        {"pose": {"position": [p[0], p[1], 0.12], "yaw_deg": yaw}},
        {"pose": {"position": [p[0], p[1], 0.0225], "yaw_deg": yaw}},
        {"gripper": "close"},
        {"pose": {"position": [p[0], p[1] - 0.06, 0.06], "yaw_deg": yaw}, "mode": "manipulation"},
        {"pose": {"position": [p[0], p[1] - 0.06, 0.024], "yaw_deg": yaw}, "mode": "manipulation"},
        {"gripper": "open"},
        {"pose": {"position": [p[0], p[1] - 0.06, 0.2], "yaw_deg": yaw}},
    ):
        assert harness.call("move_to", **kwargs).success
    moved_by = true_center(twin, "red_cube") - p
    assert np.linalg.norm(moved_by) > 0.01
    harness.call("observe")
    tracked = harness.call("track_target", detection=cube)
    assert tracked.success, tracked.message
    np.testing.assert_allclose(tracked.value["displacement_m"], moved_by, atol=0.006)
    compare = harness.call("compare_object_observations", before=cube, after=tracked.value["detection_id"])
    assert compare.value["moved"] and compare.value["distance_m"] == pytest.approx(np.linalg.norm(moved_by), abs=0.006)


@pytest.mark.parametrize(
    ("capability", "kwargs", "words"),
    [
        ("point", {"text": ""}, "text"),
        ("track_target", {"detection": "det-404"}, "unknown detection"),
        ("compare_object_observations", {"before": "det-1", "after": 5}, "detection id"),
        ("inspect_contact_geometry", {"object": "det-1", "jaw_opening_m": 0.5}, "jaw_opening_m"),
        ("inspect_contact_geometry", {"object": "det-1", "pose": {"position": [0, 0]}}, "position"),
        ("inspect_release_geometry", {"object": "det-1", "destination": "det-1", "position": "here"}, "position"),
        ("inspect_release_geometry", {"object": "det-1"}, "destination"),
    ],
)
def test_bad_measurement_input(harness, capability, kwargs, words):
    harness.call("observe")
    assert harness.call("segment", text="red cube").success  # det-1
    result = harness.call(capability, **kwargs)
    assert result.failure_category is FailureCategory.INVALID_ARGUMENT, result.message
    assert words in result.message

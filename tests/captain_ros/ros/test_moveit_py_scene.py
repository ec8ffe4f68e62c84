"""MoveIt's planning-scene check through moveit-py (ros/moveit_py_scene.py) against a fake `moveit` package
(tests/captain_ros/ros/fake_moveit_py, built from moveit2's moveit_py stubs and bindings, put on sys.path by these tests
only): the chooser (interfaces.moveit.api), a sweep through a world box refused as over the services, a guarded sweep's
gripper allowed to reach a measured object through the check's AllowedCollisionMatrix (and nothing else allowed),
measured objects added and removed, a free-space plan's joint waypoints, and anything moveit-py raises failing
closed. The real moveit-py is not installed here (no PyPI build): what these show is the calls against its names, not
MoveIt's collision checking."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from captain_interfaces.srv import HarnessCall
from captain_ros.core.contract import FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.moveit_scene import SceneBox, SceneCheckError, judge, links_below, touch_rule
from captain_ros.core.robot import load_profile
from captain_ros.ros import moveit_py_scene
from captain_ros.ros.move_group_scene import MoveItScene, open_scene
from captain_ros.ros.moveit_py_scene import MoveItPyScene

from .helpers import (
    launch_motion_node,
    launch_twin,
    node_processes,
    result_of,
)
from .test_move_group_scene import _harness_with_object_midway, _sweep  # as the services path's tests

FAKE = Path(__file__).parent / "fake_moveit_py"
PROFILE = load_profile("panda_twin")
POSE = {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}
UNNAMED = "panda_arm collides with MoveIt's scene (moveit_py names no contacts)"
GRIPPER = links_below(PROFILE.urdf_text, PROFILE.hand_frame)  # the harness's gripper links


def _drop_moveit() -> None:
    for name in [m for m in sys.modules if m == "moveit" or m.startswith("moveit.")]:
        del sys.modules[name]


@pytest.fixture
def fake(monkeypatch):
    """The fake moveit-py importable for this test only; yields its state (moveit/_fake.py)."""
    _drop_moveit()
    monkeypatch.syspath_prepend(str(FAKE))
    from moveit import _fake

    yield _fake.reset()
    _drop_moveit()


@pytest.fixture
def scene(fake):
    s = MoveItPyScene(PROFILE.interfaces.moveit, PROFILE.arm_joints, PROFILE.base_frame)
    assert s.missing(1.0) == []
    yield s
    s.close()


def test_auto_picks_moveit_py_where_it_imports_and_the_services_otherwise(client_node, monkeypatch):
    assert not moveit_py_scene.importable()  # not installed here
    settings = PROFILE.interfaces.moveit
    assert settings.api == "auto"
    services = open_scene(client_node, settings, PROFILE.arm_joints, PROFILE.base_frame)
    try:
        assert isinstance(services, MoveItScene) and services.api == "services"
    finally:
        services.close()
    with pytest.raises(SceneCheckError, match=r"api is moveit_py, but moveit\.planning\.MoveItPy does not import"):
        open_scene(client_node, replace(settings, api="moveit_py"), PROFILE.arm_joints, PROFILE.base_frame)

    _drop_moveit()
    monkeypatch.syspath_prepend(str(FAKE))
    try:
        from moveit import _fake

        state = _fake.reset()
        assert moveit_py_scene.importable()
        chosen = open_scene(client_node, settings, PROFILE.arm_joints, PROFILE.base_frame)
        assert isinstance(chosen, MoveItPyScene) and chosen.api == "moveit_py"
        assert state.started == [{"node_name": "moveit_py", "launch_params_filepaths": []}]  # this process's none
        chosen.close()
        assert state.shutdown == 1
        services = open_scene(client_node, replace(settings, api="services"), PROFILE.arm_joints, PROFILE.base_frame)
        assert isinstance(services, MoveItScene)
        services.close()
    finally:
        _drop_moveit()


def test_the_params_file_is_handed_to_moveit_py_and_a_bad_one_fails_closed(fake, tmp_path):
    params = tmp_path / "moveit_py.yaml"
    params.write_text("moveit_py:\n  ros__parameters: {}\n")
    settings = replace(PROFILE.interfaces.moveit, moveit_py_params_file=str(params))
    MoveItPyScene(settings, PROFILE.arm_joints, PROFILE.base_frame).close()
    assert fake.started[-1] == {"node_name": "moveit_py", "launch_params_filepaths": [str(params)]}
    missing = replace(settings, moveit_py_params_file=str(tmp_path / "none.yaml"))
    with pytest.raises(SceneCheckError, match=r"moveit_py start \(MoveItPy\) failed: RuntimeError: failed to parse"):
        MoveItPyScene(missing, PROFILE.arm_joints, PROFILE.base_frame)


def test_a_planning_group_moveit_py_does_not_know_is_named(fake):
    s = MoveItPyScene(replace(PROFILE.interfaces.moveit, planning_group="fr3_arm"), PROFILE.arm_joints, "base")
    assert s.missing(1.0) == ["planning group 'fr3_arm' in moveit_py's robot model 'panda_twin'"]
    s = MoveItPyScene(PROFILE.interfaces.moveit, (*PROFILE.arm_joints, "fr3_joint8"), "base")
    assert s.missing(1.0) == ["joints fr3_joint8 in planning group 'panda_arm' of moveit_py"]


def test_a_sweep_through_a_world_box_is_refused(scene, fake):
    q, middle = _sweep()
    assert judge(scene.check(q), len(q)) == ""
    assert fake.checked == 41 and fake.groups == {"panda_arm"}
    fake.world["crate"] = SceneBox("crate", tuple(middle), (0.05, 0.05, 0.05), 0.0)
    verdicts = scene.check(q)
    assert any(v.index == 20 and not v.valid for v in verdicts)
    refusal = judge(verdicts, len(q))  # the real binding cannot read the contacts: unnamed, still refused
    assert refusal.startswith(f"MoveIt planning scene: {UNNAMED} at ") and "% of the sweep" in refusal
    fake.contacts_readable = True  # a moveit-py that binds collision_detection::Contact: named as over services
    assert f"{PROFILE.tcp_frame} collides with crate at" in judge(scene.check(q), len(q))


def test_measured_objects_are_added_and_removed(scene, fake):
    box = SceneBox("det_4", (0.5, 0.1, 0.04), (0.06, 0.04, 0.08), np.pi / 6)
    scene.apply([box], [])
    kept = fake.world["det_4"]
    assert kept.center_m == pytest.approx(box.center_m) and kept.extents_m == pytest.approx(box.extents_m)
    assert kept.yaw_rad == pytest.approx(np.pi / 6)
    scene.apply([], ["det_4"])
    assert fake.world == {}
    with pytest.raises(SceneCheckError, match="moveit_py did not apply the scene update for det_4"):
        scene.apply([], ["det_4"])  # not there: PlanningScene::processCollisionObjectRemove is false


def test_free_space_paths_come_from_the_planning_component(fake):
    settings = replace(PROFILE.interfaces.moveit, free_space_min_m=0.2, pipeline_id="pilz_industrial_motion_planner")
    s = MoveItPyScene(replace(settings, planner_id="PTP"), PROFILE.arm_joints, PROFILE.base_frame)
    q, middle = _sweep()
    path, refusal = s.plan(q[0], q[-1])
    assert refusal == "" and path.shape == (25, len(PROFILE.arm_joints))
    np.testing.assert_allclose(path[[0, -1]], q[[0, -1]], atol=1e-9)  # the fake's names reversed, mapped back
    (asked,) = fake.plans
    assert (asked["group"], asked["pipeline"], asked["planner_id"]) == (
        "panda_arm",
        "pilz_industrial_motion_planner",
        "PTP",
    )
    assert asked["planning_time"] == settings.planning_time_s
    assert len(asked["goal"][0].joint_constraints) == len(PROFILE.arm_joints)
    fake.world["crate"] = SceneBox("crate", tuple(middle), (0.05, 0.05, 0.05), 0.0)
    path, refusal = s.plan(q[0], q[-1])
    assert (
        path is None
        and refusal == "moveit_py found no free-space path (PLANNING_FAILED -1, pilz_industrial_motion_planner)"
    )
    with pytest.raises(SceneCheckError, match="free_space_min_m is 0"):
        MoveItPyScene(PROFILE.interfaces.moveit, PROFILE.arm_joints, PROFILE.base_frame).plan(q[0], q[-1])


def test_anything_moveit_py_raises_fails_closed(scene, fake):
    q, _ = _sweep()
    fake.fail["check_collision"] = RuntimeError("collision environment not ready")
    with pytest.raises(
        SceneCheckError,
        match=r"moveit_py state check \(PlanningScene.check_collision\) failed: RuntimeError: collision environment",
    ):
        scene.check(q)
    fake.fail = {"read_only": RuntimeError("scene lock")}
    with pytest.raises(SceneCheckError, match="RuntimeError: scene lock"):
        scene.check(q)
    fake.fail = {"process_collision_object": TypeError("bad message")}
    with pytest.raises(SceneCheckError, match=r"moveit_py scene update .* failed: TypeError: bad message"):
        scene.apply([SceneBox("a", (0.5, 0, 0), (0.1, 0.1, 0.1), 0.0)], [])
    scene.free_space_min_m = 0.2
    fake.fail = {"plan": RuntimeError("pipeline 'ompl' not loaded")}
    with pytest.raises(SceneCheckError, match=r"free-space planning \(PlanningComponent.plan\) failed: RuntimeError"):
        scene.plan(q[0], q[-1])


def test_a_guarded_sweep_may_bring_the_gripper_to_a_measured_object_and_nothing_else(scene, fake):
    """The touch rule goes into a copy of the scene's AllowedCollisionMatrix: the gripper reaching a measured object
    is allowed; the same sweep touching it with another link, or touching an object the integrator put in the scene,
    is refused (unnamed: the real binding cannot read the contacts); the monitored scene's ACM is left as it was."""
    q, middle = _sweep()
    assert PROFILE.tcp_frame in GRIPPER and "panda_link5" not in GRIPPER
    fake.world["det_3"] = SceneBox("det_3", tuple(middle), (0.04, 0.04, 0.04), 0.0)  # measured, applied
    rule = touch_rule(GRIPPER, frozenset({"det_3"}))
    assert judge(scene.check(q, rule), len(q), rule) == ""
    assert fake.acm_checks == 41 and fake.clones == 1  # one ACM copy per check, passed with every state
    monitored = scene.psm._scene.allowed_collision_matrix
    assert monitored.get_entry(PROFILE.tcp_frame, "det_3") == (False, "UNKNOWN")  # the copy was changed, not it
    assert judge(scene.check(q), len(q)).startswith(f"MoveIt planning scene: {UNNAMED} at ")  # no rule: refused
    fake.body = "panda_link5"  # the arm's other link reaches it
    assert judge(scene.check(q, rule), len(q), rule).startswith(f"MoveIt planning scene: {UNNAMED} at ")
    fake.body = ""
    fake.world["fixture"] = SceneBox("fixture", tuple(middle), (0.04, 0.04, 0.04), 0.0)  # the integrator's object
    verdicts = scene.check(q, rule)
    assert judge(verdicts, len(q), rule).startswith(f"MoveIt planning scene: {UNNAMED} at ")
    fake.contacts_readable = True  # with the contacts named: only the integrator's object, det_3 was allowed
    assert {c for v in scene.check(q, rule) for c in v.contacts} == {(PROFILE.tcp_frame, "fixture")}
    assert judge(scene.check(q, touch_rule(GRIPPER, frozenset())), len(q)).startswith(
        f"MoveIt planning scene: {PROFILE.tcp_frame} collides with det_3 at "
    )  # no measured objects: no pair allowed, no ACM copied
    assert fake.acm_checks == 4 * 41


def test_a_harness_refuses_a_move_to_through_a_measured_object(scene, fake):
    harness, start, middle = _harness_with_object_midway(scene)
    result = harness.call("move_to", pose=POSE, mode="manipulation")
    assert result.failure_category == FailureCategory.SAFETY_STOP, result.message
    assert UNNAMED in result.message and "refused, nothing moved" in result.message
    assert set(fake.world) == {"det_7"}
    fake.fail = {"check_collision": RuntimeError("collision environment not ready")}
    result = harness.call("move_to", pose=POSE)
    assert result.failure_category == FailureCategory.SAFETY_STOP, result.message
    assert "MoveIt planning-scene check failed: moveit_py state check" in result.message
    fake.fail, fake.body = {}, "panda_link5"  # guarded, but the arm's other link would hit the measured object
    result = harness.call("move_to", pose=POSE)
    assert result.failure_category == FailureCategory.SAFETY_STOP and UNNAMED in result.message, result.message
    fake.body = ""
    fake.world["fixture"] = SceneBox("fixture", tuple(middle), (0.02, 0.02, 0.02), 0.0)  # the integrator's
    result = harness.call("move_to", pose=POSE)
    assert result.failure_category == FailureCategory.SAFETY_STOP and UNNAMED in result.message, result.message
    moved = harness.kin.forward(harness.backend.read_state(require_force=False).q_rad)[0]
    assert np.linalg.norm(moved - start) < 0.002
    del fake.world["fixture"]
    # guarded: the hand may reach a measured object, allowed in the check's ACM (as judge allows it over services)
    result = harness.call("move_to", pose=POSE)
    assert result.success, result.message
    assert fake.world == {}  # stale after that motion: removed


@pytest.mark.slow
def test_the_motion_node_configures_with_moveit_py_where_it_imports_and_refuses_through_it(monkeypatch, client_node):
    """motion_node with use_moveit:=true, the fake moveit-py on its PYTHONPATH and an obstacle in the fake's world
    halfway along a move_to: configure picks moveit_py (api auto) and the move_to is refused before it moves."""
    task = "put_red_cube_in_bowl"
    start = Kinematics(profile=PROFILE).forward(np.array(PROFILE.home_q_rad))[0]  # the twin starts at home
    middle = (start + np.array(POSE["position"])) / 2
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FAKE), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("FAKE_MOVEIT_OBSTACLES", ",".join(f"{v:.4f}" for v in (*middle, 0.06, 0.06, 0.06)))
    with node_processes() as started:
        started["twin"] = launch_twin(task, f"{task}/official/0", real_time_factor=1.0, camera_rate_hz=0.0)
        started["motion"] = launch_motion_node(("use_moveit", True), ("watchdog", False), ("connect_timeout_s", 60.0))
        (_, twin_lines), (_, lines) = started["twin"], started["motion"]
        call = client_node.create_client(HarnessCall, "/harness/call")
        if not call.wait_for_service(timeout_sec=90):
            raise RuntimeError("motion_node did not come up:\n" + "".join(lines) + "".join(twin_lines))
        log = "".join(lines)
        assert (
            "MoveIt planning scene on (moveit_py, interfaces.moveit.api auto): every sweep checked through moveit_py "
            "PlanningScene.check_collision (group 'panda_arm'"
        ) in log, log
        request = HarnessCall.Request(capability="move_to", args_json=json.dumps({"pose": POSE}))
        result = result_of(call.call_async(request), 120).result
        assert result.failure_category == "safety_stop" and not result.executed, result.message
        assert f"{UNNAMED} at" in result.message and "refused, nothing moved" in result.message, result.message

"""MoveIt's planning-scene check over DDS (ros/move_group_scene.py) against a fake move_group (fake_move_group.py):
moveit_msgs' GetStateValidity along a sweep, ApplyPlanningScene for measured objects, a missing move_group refusing
the sweep, and a harness on the twin refusing a move_to whose sweep passes through a measured object (unless
guarded: the gripper may touch what was measured)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from captain_ros.core.config import load_config
from captain_ros.core.contract import FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.moveit_scene import SceneBox, SceneCheckError, judge
from captain_ros.core.robot import load_profile
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.ros.move_group_scene import MoveItScene
from captain_ros.twin.sim import Twin

from .fake_move_group import FakeMoveGroup

PROFILE = load_profile("panda_twin")
POSE = {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}


@pytest.fixture
def move_group(client_node):
    fake = FakeMoveGroup(client_node.context, PROFILE.name).start()
    yield fake
    fake.close()


@pytest.fixture
def scene(client_node, move_group):
    s = MoveItScene(client_node, PROFILE.interfaces.moveit, PROFILE.arm_joints, PROFILE.base_frame)
    assert s.missing(10.0) == []
    yield s
    s.close()


def _sweep() -> tuple[np.ndarray, np.ndarray]:
    """A joint path of 41 waypoints from home, and its TCP at the middle."""
    home = np.array(PROFILE.home_q_rad)
    q = np.linspace(home, home + np.array([0.6, 0.2, 0, -0.2, 0, 0.2, 0]), 41)
    return q, Kinematics(profile=PROFILE).forward(q[20])[0]


def test_a_sweep_through_a_world_box_is_refused_naming_it(scene, move_group):
    q, middle = _sweep()
    assert judge(scene.check(q), len(q)) == ""
    assert move_group.checked == 41 and move_group.groups == {"panda_arm"}
    move_group.add(SceneBox("crate", tuple(middle), (0.05, 0.05, 0.05), 0.0))
    refusal = judge(scene.check(q), len(q))
    assert f"{PROFILE.tcp_frame} collides with crate at" in refusal
    assert "% of the sweep" in refusal


def test_measured_objects_are_added_and_removed_through_apply_planning_scene(scene, move_group):
    box = SceneBox("det_4", (0.5, 0.1, 0.04), (0.06, 0.04, 0.08), np.pi / 6)
    scene.apply([box], [])
    kept = move_group.world["det_4"]
    assert kept.center_m == pytest.approx(box.center_m) and kept.extents_m == pytest.approx(box.extents_m)
    assert kept.yaw_rad == pytest.approx(np.pi / 6)
    scene.apply([], ["det_4"])
    assert move_group.world == {}


def test_a_missing_move_group_refuses_the_check(client_node):
    settings = replace(PROFILE.interfaces.moveit, timeout_s=0.5)
    s = MoveItScene(client_node, settings, PROFILE.arm_joints, PROFILE.base_frame)
    try:
        assert s.missing(0.2) == [
            "/check_state_validity (moveit_msgs/srv/GetStateValidity)",
            "/apply_planning_scene (moveit_msgs/srv/ApplyPlanningScene)",
        ]
        with pytest.raises(SceneCheckError, match=r"did not answer within 0\.5 s"):
            s.check(_sweep()[0])
        with pytest.raises(SceneCheckError, match="/apply_planning_scene did not answer"):
            s.apply([SceneBox("a", (0, 0, 0), (0.1, 0.1, 0.1), 0.0)], [])
    finally:
        s.close()


def _harness_with_object_midway(scene):
    """A harness on the twin checking with `scene`, with an object measured halfway from the TCP to POSE: the
    harness, the TCP's start and the object's centre."""
    twin = Twin("put_red_cube_in_bowl")
    twin.reset("put_red_cube_in_bowl/official/0")
    harness = Harness(TwinBackend(twin), load_config(), Kinematics())
    harness.scene = scene
    start = harness.kin.forward(harness.backend.read_state(require_force=False).q_rad)[0]
    middle = (start + np.array(POSE["position"])) / 2
    harness.note_measurement(
        "measure_object_geometry",
        {"object": "det_7", "center_m": middle.tolist(), "extents_m": [0.04, 0.04, 0.04], "yaw_deg": 0.0},
    )
    return harness, start, middle


def test_a_harness_refuses_a_move_to_through_a_measured_object(scene, move_group):
    harness, start, _ = _harness_with_object_midway(scene)
    result = harness.call("move_to", pose=POSE, mode="manipulation")  # guarded, the gripper may touch it
    assert result.failure_category == FailureCategory.SAFETY_STOP, result.message
    assert "collides with det_7" in result.message and "refused, nothing moved" in result.message
    assert set(move_group.world) == {"det_7"}
    moved = harness.kin.forward(harness.backend.read_state(require_force=False).q_rad)[0]
    assert np.linalg.norm(moved - start) < 0.002
    assert harness.call("move_to", pose=POSE).success  # guarded: the hand may reach a measured object
    assert move_group.world == {}  # stale after that motion: removed


def test_free_space_paths_come_from_get_motion_plan(client_node, move_group):
    settings = replace(PROFILE.interfaces.moveit, free_space_min_m=0.2, pipeline_id="pilz_industrial_motion_planner")
    s = MoveItScene(client_node, replace(settings, planner_id="PTP"), PROFILE.arm_joints, PROFILE.base_frame)
    try:
        assert s.missing(10.0) == []
        q, middle = _sweep()
        path, refusal = s.plan(q[0], q[-1])
        assert refusal == "" and path.shape == (25, len(PROFILE.arm_joints))
        np.testing.assert_allclose(path[[0, -1]], q[[0, -1]], atol=1e-9)  # the fake's names reversed, mapped back
        (request,) = move_group.plans
        mpr = request.motion_plan_request
        assert (mpr.group_name, mpr.planner_id) == ("panda_arm", "PTP")
        assert mpr.pipeline_id == "pilz_industrial_motion_planner"
        assert len(mpr.goal_constraints[0].joint_constraints) == len(PROFILE.arm_joints)
        move_group.add(SceneBox("crate", tuple(middle), (0.05, 0.05, 0.05), 0.0))
        path, refusal = s.plan(q[0], q[-1])
        assert path is None and "PLANNING_FAILED -1" in refusal, refusal
    finally:
        s.close()

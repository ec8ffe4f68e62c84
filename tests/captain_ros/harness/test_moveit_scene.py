"""MoveIt's planning-scene check without ROS: the core (core/moveit_scene.py) and the harness's use of a scene
(harness.PlanningScene), with a scene of the test's own. tests/captain_ros/ros/test_move_group_scene.py runs the same
over DDS against a fake move_group."""

from __future__ import annotations

import math

import numpy as np
import pytest

from captain_ros.core.contract import FailureCategory
from captain_ros.core.moveit_scene import (
    SceneBox,
    SceneCheckError,
    SceneObjects,
    StateVerdict,
    TouchRule,
    box_from_measurement,
    choose_api,
    judge,
    links_below,
    sample_indices,
    touch_rule,
)

POSE = {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}


class BoxScene:
    """A planning scene that knows boxes and the TCP (a 3 cm sphere), like
    tests/captain_ros/ros/fake_move_group.py."""

    def __init__(self, kinematics, fail: bool = False, link: str = "panda_link5") -> None:
        self.kin, self.fail, self.link = kinematics, fail, link  # `link`: the robot link its contacts name
        self.world: dict[str, SceneBox] = {}
        self.checked: list[int] = []
        self.rules: list[TouchRule | None] = []  # the touch rule each check was given (judge applies it)
        self.plans: list[np.ndarray] = []

    def check(self, q_waypoints: np.ndarray, may_touch: TouchRule | None = None) -> list[StateVerdict]:
        self.rules.append(may_touch)
        if self.fail:
            raise SceneCheckError("/check_state_validity did not answer within 2 s")
        idx = sample_indices(len(q_waypoints))
        self.checked.append(len(idx))
        verdicts = []
        for i in idx:
            tcp = self.kin.forward(q_waypoints[i])[0]
            hits = [b.id for b in self.world.values() if b.contains(tcp, margin_m=0.03)]
            verdicts.append(StateVerdict(i, not hits, tuple((self.link, h) for h in hits)))
        return verdicts

    free_space_min_m = 0.0  # > 0: move_to plans far targets here (plan)

    def plan(self, q_start: np.ndarray, q_goal: np.ndarray) -> tuple[np.ndarray | None, str]:
        """The straight line in joint space, as tests/captain_ros/ros/fake_move_group.py plans; refused through a
        box."""
        if self.fail:
            raise SceneCheckError("/plan_kinematic_path did not answer within 7 s")
        path = np.linspace(q_start, q_goal, 25)
        self.plans.append(path)
        for q in path:
            tcp = self.kin.forward(q)[0]
            if any(b.contains(tcp, margin_m=0.03) for b in self.world.values()):
                return None, "move_group found no free-space path (PLANNING_FAILED -1, ompl)"
        return path, ""

    def apply(self, add: list[SceneBox], remove: list[str]) -> None:
        if self.fail:
            raise SceneCheckError("/apply_planning_scene did not answer")
        for oid in remove:
            self.world.pop(oid)
        self.world.update({b.id: b for b in add})


def test_sample_indices_keep_both_ends_and_cap_the_count():
    assert sample_indices(0) == []
    assert sample_indices(5, 64) == [0, 1, 2, 3, 4]
    picks = sample_indices(500, 64)
    assert picks[0] == 0 and picks[-1] == 499 and len(picks) == 64 and picks == sorted(set(picks))


def test_judge_names_the_first_collision_and_where():
    ok = [StateVerdict(i, True) for i in range(11)]
    assert judge(ok, 11) == ""
    verdicts = ok[:5] + [StateVerdict(5, False, (("fr3_hand_tcp", "det_2"),)), StateVerdict(6, False)] + ok[7:]
    refusal = judge(verdicts, 11)
    assert "fr3_hand_tcp collides with det_2 at 50% of the sweep" in refusal
    assert "1 more of 11 checked states invalid" in refusal
    hand = touch_rule(frozenset({"fr3_hand", "fr3_hand_tcp", "fr3_leftfinger"}), frozenset({"det_2"}))
    assert "at 60% of the sweep" in judge(verdicts, 11, hand)  # the contact-free invalid state is still refused
    touching = [StateVerdict(3, False, (("fr3_leftfinger", "det_2"),))]
    assert judge(touching, 11, hand) == ""  # the gripper reaching a measured object
    assert judge([StateVerdict(3, False, (("fr3_link5", "det_2"),))], 11, hand) != ""  # the arm hitting it
    assert judge([StateVerdict(3, False, (("fr3_hand", "table"),))], 11, hand) != ""  # the integrator's scene
    # the same rule as (link, object) pairs: what moveit-py's check allows in its ACM (ros/moveit_py_scene.py)
    assert hand.pairs() == [("fr3_hand", "det_2"), ("fr3_hand_tcp", "det_2"), ("fr3_leftfinger", "det_2")]
    assert all(hand(*pair) and hand(*reversed(pair)) for pair in hand.pairs())
    assert touch_rule(frozenset({"fr3_hand"}), frozenset()).pairs() == []
    assert "no contact reported" in judge([StateVerdict(0, False)], 2)


def test_scene_box_from_a_measurement_is_yawed_and_padded():
    box = box_from_measurement(
        "det_1", {"center_m": [0.5, 0.0, 0.05], "extents_m": [0.2, 0.04, 0.1], "yaw_deg": 90.0}, padding_m=0.005
    )
    assert box.extents_m == pytest.approx((0.21, 0.05, 0.11))
    assert box.contains(np.array([0.5, 0.09, 0.05]))  # along the long side, turned onto y
    assert not box.contains(np.array([0.59, 0.0, 0.05]))
    assert box.contains(np.array([0.59, 0.0, 0.05]), margin_m=0.07)
    assert box.quaternion_xyzw() == pytest.approx((0, 0, math.sqrt(0.5), math.sqrt(0.5)))


def test_scene_objects_add_fresh_and_remove_stale():
    objects = SceneObjects()
    a = SceneBox("a", (0, 0, 0), (0.1, 0.1, 0.1), 0.0)
    objects.measured(a, scene_version=0)
    add, remove = objects.update(0)
    assert add == [a] and remove == []
    objects.applied(add, remove, 0)
    assert objects.update(0) == ([], [])
    add, remove = objects.update(1)  # something physical happened since: a's measurement is stale
    assert add == [] and remove == ["a"]
    objects.applied(add, remove, 1)
    assert objects.in_scene == {}
    objects.measured(a, scene_version=0)  # a late measurement of an old scene never enters
    assert objects.update(1) == ([], [])
    objects.measured(a, 1)
    objects.applied(*objects.update(1), 1)
    objects.measured(SceneBox("a", (0.1, 0, 0), (0.1, 0.1, 0.1), 0.0), 1)  # measured again: replaced, not removed
    add, remove = objects.update(1)
    assert [b.center_m for b in add] == [(0.1, 0, 0)] and remove == []
    assert objects.clear() == ["a"]


def _tcp(harness) -> np.ndarray:
    return harness.kin.forward(harness.backend.read_state(require_force=False).q_rad)[0]


def test_a_sweep_through_a_scene_object_is_refused_and_nothing_moves(harness, kinematics):
    scene = harness.scene = BoxScene(kinematics)
    start = _tcp(harness)
    midway = (start + np.array(POSE["position"])) / 2
    scene.world["crate"] = SceneBox("crate", tuple(midway), (0.04, 0.04, 0.04), 0.0)
    result = harness.call("move_to", pose=POSE)
    assert result.failure_category == FailureCategory.SAFETY_STOP, result.message
    assert "panda_link5 collides with crate" in result.message and "refused, nothing moved" in result.message
    assert np.linalg.norm(_tcp(harness) - start) < 0.002
    del scene.world["crate"]
    assert harness.call("move_to", pose=POSE).success
    assert scene.checked[-1] >= 2


def test_an_operator_is_asked_only_about_sweeps_the_scene_lets_through(harness, kinematics):
    from captain_ros.harness.approval import Approval, Decision

    class Recording:
        def __init__(self) -> None:
            self.asked: list[str] = []

        def ask(self, action) -> Approval:
            self.asked.append(action.capability)
            return Approval(Decision.APPROVED, "", request_id=f"r{len(self.asked)}")

        def withdraw(self, reason: str) -> int:
            return 0

    scene = harness.scene = BoxScene(kinematics)
    harness.approver = approver = Recording()
    start = _tcp(harness)
    scene.world["crate"] = SceneBox("crate", tuple((start + np.array(POSE["position"])) / 2), (0.04,) * 3, 0.0)
    assert not harness.call("move_to", pose=POSE).success
    assert approver.asked == []  # refused before anyone was asked
    del scene.world["crate"]
    assert harness.call("move_to", pose=POSE).success
    assert approver.asked == ["move_to"] and len(scene.checked) == 3  # checked, asked, planned again and checked


def test_no_answer_from_the_scene_refuses_the_sweep(harness, kinematics):
    harness.scene = BoxScene(kinematics, fail=True)
    start = _tcp(harness)
    result = harness.call("move_to", pose=POSE)
    assert result.failure_category == FailureCategory.SAFETY_STOP
    assert "MoveIt planning-scene check failed" in result.message and "did not answer" in result.message
    assert np.linalg.norm(_tcp(harness) - start) < 0.002


def test_measured_objects_enter_the_scene_and_leave_it_when_stale(harness, kinematics):
    scene = harness.scene = BoxScene(kinematics)
    value = {
        "object": "det_1",
        "center_m": [0.6, 0.3, 0.03],
        "extents_m": [0.05, 0.05, 0.06],
        "yaw_deg": 0.0,
        "destination": {"detection_id": "det_2", "center_m": [0.6, -0.3, 0.03], "extents_m": [0.15, 0.15, 0.06]},
    }
    harness.note_measurement("measure_object_geometry", value)
    harness.sync_scene()
    assert set(scene.world) == {"det_1", "det_2"}
    assert harness.call("move_to", pose=POSE).success  # a physical action: every measurement is stale now
    assert scene.world == {}
    harness.note_measurement("measure_object_geometry", value)  # recorded at the new scene version
    harness.sync_scene()
    assert set(scene.world) == {"det_1", "det_2"}
    harness.new_episode("next")
    assert scene.world == {}


def test_profiles_name_their_moveit_groups_and_a_bad_block_is_refused(tmp_path):
    import yaml

    from captain_ros.core import robot

    groups = {n: robot.load_profile(n).interfaces.moveit.planning_group for n in ("franka_fr3", "ur5e", "panda_twin")}
    assert groups == {"franka_fr3": "fr3_arm", "ur5e": "ur_manipulator", "panda_twin": "panda_arm"}
    moveit = robot.load_profile("franka_fr3").interfaces.moveit
    assert (moveit.check_state_validity_service, moveit.apply_planning_scene_service) == (
        "/check_state_validity",
        "/apply_planning_scene",
    )
    doc = yaml.safe_load(robot.profile_path("panda_twin").read_text())
    doc["interfaces"]["moveit"]["max_states"] = 1
    path = tmp_path / "bad_moveit.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(robot.ProfileError, match=r"interfaces\.moveit: timeout_s must be > 0 and max_states >= 2"):
        robot.load_profile(path)
    del doc["interfaces"]["moveit"]["planning_group"]
    path = tmp_path / "no_group.yaml"  # load_profile caches by path: one name per edit
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(robot.ProfileError, match="missing 'planning_group'"):
        robot.load_profile(path)
    doc["interfaces"]["moveit"].update(planning_group="panda_arm", max_states=64, api="moveitpy")
    path = tmp_path / "bad_api.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(robot.ProfileError, match=r"interfaces\.moveit\.api: 'moveitpy' is not one of auto, moveit_py"):
        robot.load_profile(path)
    doc["interfaces"]["moveit"].update(api="moveit_py", moveit_py_params_file="/opt/cell/moveit_py.yaml")
    path = tmp_path / "moveit_py.yaml"
    path.write_text(yaml.safe_dump(doc))
    moveit = robot.load_profile(path).interfaces.moveit
    assert (moveit.api, moveit.moveit_py_params_file) == ("moveit_py", "/opt/cell/moveit_py.yaml")
    assert robot.load_profile("panda_twin").interfaces.moveit.api == "auto"


def test_choose_api_takes_moveit_py_where_it_imports_unless_told_services():
    assert choose_api("auto", True) == "moveit_py"
    assert choose_api("auto", False) == "services"
    assert choose_api("services", True) == "services"
    assert choose_api("moveit_py", True) == "moveit_py"
    with pytest.raises(SceneCheckError, match=r"api is moveit_py, but moveit\.planning\.MoveItPy does not import"):
        choose_api("moveit_py", False)
    with pytest.raises(SceneCheckError, match="is not auto, moveit_py or services"):
        choose_api("moveitpy", True)


def test_a_guarded_sweep_may_bring_the_gripper_to_a_measured_object(harness, kinematics):
    """A guarded move_to whose hand reaches a measured object runs (the force guard stops it at the touch); the
    same contact with the arm's other links, or in manipulation mode, is refused."""
    assert {"panda_hand", "panda_leftfinger", "panda_rightfinger"} <= links_below(
        harness.profile.urdf_text, harness.profile.hand_frame
    )
    scene = harness.scene = BoxScene(kinematics, link="panda_hand")
    target = np.array(POSE["position"])
    harness.note_measurement(
        "measure_object_geometry",
        {"object": "det_9", "center_m": target.tolist(), "extents_m": [0.03, 0.03, 0.03], "yaw_deg": 0.0},
    )
    refused = harness.call("move_to", pose=POSE, mode="manipulation")
    assert not refused.success and "panda_hand collides with det_9" in refused.message
    assert set(scene.world) == {"det_9"} and scene.rules[-1] is None  # manipulation: no touch rule
    assert harness.call("move_to", pose=POSE).success  # guarded: the default mode
    rule = scene.rules[-1]  # the scene is handed the rule judge applies (moveit-py allows it in its check)
    assert rule.objects == {"det_9"} and rule("panda_hand", "det_9") and not rule("panda_link5", "det_9")


def test_far_targets_are_planned_by_move_group_and_near_ones_swept(harness, kinematics):
    """free_space_min_m: a move_to at least that far is move_group's joint path (timed here, run guarded and checked
    in the scene), a nearer one the straight sweep; a path move_group cannot find is refused, nothing moved."""
    scene = harness.scene = BoxScene(kinematics)
    scene.free_space_min_m = 0.15
    start = _tcp(harness)
    far = harness.call("move_to", pose=POSE)
    assert far.success, far.message
    assert len(scene.plans) == 1 and "free-space path planned by move_group (25 waypoints)" in far.receipt
    assert np.linalg.norm(_tcp(harness) - np.array(POSE["position"])) < 0.003
    near = harness.call("move_to", pose={"position": [0.4, 0.05, 0.3], "yaw_deg": 0})
    assert near.success and len(scene.plans) == 1  # 5 cm: the straight sweep
    scene.world["wall"] = SceneBox("wall", tuple((start + np.array([0.4, 0.05, 0.3])) / 2), (0.3, 0.3, 0.3), 0.0)
    blocked = harness.call("move_to", pose={"position": start.tolist(), "yaw_deg": 0})
    assert blocked.failure_category == FailureCategory.UNREACHABLE
    assert "PLANNING_FAILED" in blocked.message and "nothing moved" in blocked.message
    scene.fail = True
    lost = harness.call("move_to", pose={"position": start.tolist(), "yaw_deg": 0})
    assert not lost.success and "free-space planning failed" in lost.message

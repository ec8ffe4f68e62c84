"""Robot profiles: every shipped profile loads; the Panda twin's numbers come from its URDF; a profile that names
something its URDF lacks, or is malformed, fails with the file, the key and what is wrong."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from captain_ros.core import robot
from captain_ros.paths import config_path

PANDA_FILE = config_path("robots/panda_twin.yaml")


def write_profile(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load(PANDA_FILE.read_text())
    edit(doc)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_shipped_profile_loads():
    names = robot.available_profiles()
    assert {"panda_twin", "franka_fr3", "ur5e", "ros2_control_demo"} <= set(names)
    for name in names:
        profile = robot.load_profile(name)
        assert profile.dof == len(profile.home_q_rad) >= 6
        assert profile.interfaces.trajectory_action.endswith("follow_joint_trajectory")
        assert profile.interfaces.gripper.command in robot.GRIPPER_COMMANDS


def test_the_panda_twin_reads_its_numbers_from_the_urdf():
    panda = robot.default_profile()
    assert panda.name == "panda_twin" and panda.dof == 7 and panda.twin is not None
    assert panda.joint_limits["panda_joint5"].effort == 12
    assert panda.max_jaw_opening_m() == pytest.approx(0.08)  # two fingers, 0.04 each
    assert panda.jaw_opening_m({"panda_finger_joint1": 0.02, "panda_finger_joint2": 0.02}) == pytest.approx(0.04)
    assert panda.jaw_opening_m({"panda_finger_joint1": 0.015}) == pytest.approx(0.03)  # mimic finger not reported
    assert panda.jaw_opening_m({}) is None
    g = panda.gripper_geometry
    assert g.tcp_from_flange_m == pytest.approx(0.1034) and g.finger_pad_size_m == (0.02, 0.018, 0.053)
    assert {"panda_link7", "panda_hand", "panda_tcp", "wrist_camera_optical_frame"} <= set(panda.arm_links())
    lower, upper = panda.arm_limits_rad()
    assert lower[3] == pytest.approx(-3.0718) and upper[3] == pytest.approx(-0.0698)


def test_a_path_or_a_name_selects_a_profile():
    assert robot.profile_path("ur5e") == config_path("robots/ur5e.yaml")
    assert robot.profile_path("/etc/captain/my_arm.yaml") == Path("/etc/captain/my_arm.yaml")
    assert robot.load_profile(str(PANDA_FILE)).arm_joints == robot.default_profile().arm_joints


def test_an_unknown_profile_lists_the_shipped_ones():
    with pytest.raises(robot.ProfileError, match=r"no robot profile 'kuka'.*franka_fr3.*panda_twin.*ur5e"):
        robot.load_profile("kuka")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["description"]["arm_joints"].__setitem__(6, "panda_joint9"), "arm_joints 'panda_joint9' is not"),
        (lambda d: d["description"].__setitem__("tcp_frame", "panda_tool"), "tcp_frame 'panda_tool' is not a link"),
        (lambda d: d["description"]["home_q_rad"].__setitem__(3, 0.5), "outside the URDF limits at panda_joint4"),
        (lambda d: d["description"]["home_q_rad"].pop(), "home_q_rad has 6 values for 7 joints"),
        (lambda d: d["description"]["home_q_rad"].__setitem__(0, "up"), "home_q_rad' must be a list of finite"),
        (lambda d: d["gripper"].__setitem__("command", "suction"), "command must be one of"),
        (lambda d: d["interfaces"].pop("trajectory_action"), "missing 'trajectory_action'"),
        (lambda d: d["twin"]["arm_kp"].pop(), "twin.arm_kp has 6 values for 7 joints"),
        (lambda d: d["description"].__setitem__("urdf", "missing.urdf"), "urdf 'missing.urdf' cannot be read"),
        (lambda d: d["gripper"]["pad_links"].__setitem__(0, "panda_thumb"), "pad_links\\[0\\] 'panda_thumb'"),
    ],
)
def test_a_broken_profile_says_which_key_and_why(tmp_path, edit, message):
    with pytest.raises(robot.ProfileError, match=message) as info:
        robot.load_profile(write_profile(tmp_path, edit))
    assert "edited.yaml" in str(info.value)


def test_a_profile_without_a_urdf_takes_the_robot_description_and_checks_it(tmp_path):
    text = robot.default_profile().urdf_text
    path = write_profile(tmp_path, lambda d: d["description"].__setitem__("urdf", ""))
    bare = robot.load_profile(path)
    assert bare.urdf_text == "" and bare.description_path is None
    with pytest.raises(robot.ProfileError, match="no URDF yet"):
        _ = bare.joint_limits
    assert bare.with_urdf_text(text).max_jaw_opening_m() == pytest.approx(0.08)
    with pytest.raises(robot.ProfileError, match="arm_joints 'panda_joint7' is not a movable joint"):
        bare.with_urdf_text(text.replace('"panda_joint7"', '"joint_7"'))
    with pytest.raises(robot.ProfileError, match="does not parse"):
        bare.with_urdf_text("<robot name='x'><link")


def test_continuous_joints_get_a_full_turn(tmp_path):
    text = robot.default_profile().urdf_text.replace(
        '<joint name="panda_joint7" type="revolute">', '<joint name="panda_joint7" type="continuous">'
    )
    limits = robot.load_profile(write_profile(tmp_path, lambda d: None)).with_urdf_text(text).joint_limits
    assert (limits["panda_joint7"].lower, limits["panda_joint7"].upper) == (-math.pi, math.pi)

"""Robot profiles: every shipped profile loads; the Panda twin's numbers come from its URDF; a profile that names
something its URDF lacks, or is malformed, fails with the file, the key and what is wrong; the gripper joints map to
the jaw opening both ways (the Hand-E's distance joint included); an arm may have no gripper; camera frames need not
be URDF links, and what needs one says so when it is used."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics
from captain_ros.paths import config_path

PANDA_FILE = config_path("robots/panda_twin.yaml")
VENDOR_URDFS = Path(__file__).parents[1] / "ros" / "urdf"  # stand-ins for the vendors' /robot_description


FRANKA = {
    "set_load_service": "/s/set_load",
    "collision_behavior_service": "/s/cb",
    "lower_torque_thresholds_nm": [20.0] * 7,
    "upper_torque_thresholds_nm": [20.0] * 7,
    "lower_force_thresholds_n": [20.0] * 6,
    "upper_force_thresholds_n": [20.0] * 6,
    "robot_state_topic": "/rs/robot_state",
    "error_recovery_action": "/a/error_recovery",
    "controller_manager": "/cm",
    "hardware_component": "Hw",
    "trajectory_controller": "arm_controller",
    "broadcasters": ["joint_state_broadcaster"],
}  # a valid interfaces.franka block


def write_profile(tmp_path: Path, edit, name: str = "edited") -> Path:
    """The Panda twin's profile edited, as <name>.yaml (load_profile caches by path: one name per edit)."""
    doc = yaml.safe_load(PANDA_FILE.read_text())
    edit(doc)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_shipped_profile_loads():
    names = robot.available_profiles()
    assert {"panda_twin", "franka_fr3", "ur5e", "ros2_control_demo"} <= set(names)
    for name in names:
        profile = robot.load_profile(name)
        assert profile.dof == len(profile.home_q_rad) >= 6
        assert profile.interfaces.trajectory_action.endswith("follow_joint_trajectory")
        gripper = profile.interfaces.gripper
        assert gripper.command in (robot.GRIPPER_COMMANDS if profile.has_gripper else ("",)), name
        assert bool(gripper.action) == profile.has_gripper, name
    assert not robot.load_profile("ros2_control_demo").has_gripper  # the r6bot has none


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
    # the hand's body: its collision box (0.05 across the jaw, 0.2 along it), its underside 0.06 below the hand frame
    assert g.palm_size_m == (0.05, 0.2) and g.palm_above_tcp_m == pytest.approx(0.1034 - 0.06)
    libero = robot.load_profile("libero_panda").gripper_geometry  # robosuite's hand mesh's bounds, in its URDF
    assert libero.palm_size_m == (0.063, 0.208) and libero.palm_above_tcp_m == pytest.approx(0.031)
    assert {"panda_link7", "panda_hand", "panda_tcp", "wrist_camera_optical_frame"} <= set(panda.arm_links())
    lower, upper = panda.arm_limits_rad()
    assert lower[3] == pytest.approx(-3.0718) and upper[3] == pytest.approx(-0.0698)


def test_the_fr3_declares_its_payload_and_franka_hardware_settings():
    fr3 = robot.load_profile("franka_fr3")
    assert fr3.payload == robot.Payload(0.0, (0.0, 0.0, 0.0))
    settings = fr3.interfaces.franka
    assert settings.set_load_service == "/service_server/set_load"
    assert settings.upper_torque_thresholds_nm == (20.0, 20.0, 18.0, 18.0, 16.0, 14.0, 12.0)
    assert settings.robot_state_topic == "/franka_robot_state_broadcaster/robot_state"
    assert settings.error_recovery_action == "/action_server/error_recovery"
    assert (settings.controller_manager, settings.hardware_component) == (
        "/controller_manager",
        "FrankaHardwareInterface",
    )
    assert settings.trajectory_controller == fr3.interfaces.trajectory_action.split("/")[1]  # fr3_arm_controller
    assert settings.broadcasters == ("joint_state_broadcaster", "franka_robot_state_broadcaster")
    assert robot.load_profile("ur5e").interfaces.franka is None
    assert robot.load_profile("panda_twin").payload.mass_kg == 0.0  # absent: nothing carried


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
        (lambda d: d["gripper"].__setitem__("opening_per_joint", 0), "opening_per_joint must be a finite, non-zero"),
        (lambda d: d["gripper"].__setitem__("opening_per_joint", "wide"), "'opening_per_joint' must be float"),
        (lambda d: d["gripper"].__setitem__("opening_offset_m", float("nan")), "opening_offset_m must be a finite"),
        (lambda d: d["gripper"].__setitem__("opening_per_joint", -1.0), "the jaw would open -0.0800..0.0000 m"),
        (lambda d: d["gripper"].__setitem__("action", ""), "gripper: action is empty"),
        (lambda d: d["gripper"].__setitem__("joints", []), "joints is empty .* but command, action, pad_links are"),
        (lambda d: d["description"]["camera_frames"].__setitem__("head", None), "camera_frames.head must be a frame"),
        (lambda d: d["interfaces"].__setitem__("camera_qos", "sensor"), "camera_qos must be one of reliable, best_"),
        (lambda d: d.__setitem__("payload", {"mass_kg": -1.0}), "payload: mass_kg must be a finite mass >= 0"),
        (lambda d: d.__setitem__("payload", {"center_of_mass_m": [0, 0]}), "center_of_mass_m 3 finite numbers"),
        (
            lambda d: d["interfaces"].__setitem__("franka", {**FRANKA, "lower_force_thresholds_n": [20.0] * 5}),
            "lower_force_thresholds_n must be 6 finite numbers > 0",
        ),
        (
            lambda d: d["interfaces"].__setitem__("franka", {**FRANKA, "lower_torque_thresholds_nm": [30.0] * 7}),
            "each lower_torque_thresholds_nm must be at most its upper",
        ),
        (
            lambda d: d["interfaces"].__setitem__(
                "franka", {k: v for k, v in FRANKA.items() if k != "set_load_service"}
            ),
            "missing 'set_load_service'",
        ),
        (
            lambda d: d["interfaces"].__setitem__(
                "franka", {k: v for k, v in FRANKA.items() if k != "robot_state_topic"}
            ),
            "missing 'robot_state_topic'",
        ),
        (
            lambda d: d["interfaces"].__setitem__("franka", {**FRANKA, "recovery_step_timeout_s": 0}),
            "recovery_step_timeout_s must be a finite time > 0 s",
        ),
        (lambda d: d["description"].__setitem__("srdf", "absent.srdf"), "srdf 'absent.srdf' cannot be read"),
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


# ---------------------------------------------------------------------------------------------- the gripper
def vendor_profile(name: str, urdf: str) -> robot.RobotProfile:
    """A shipped real-arm profile on the stand-in of its vendor's /robot_description (tests/captain_ros/ros/urdf/)."""
    return robot.load_profile(name).with_urdf_text((VENDOR_URDFS / urdf).read_text())


def test_the_hand_e_opening_is_its_distance_joint_inverted_both_ways():
    """The Hand-E's controller drives hande_finger_distance (0 = open, 0.05 m = shut): the measured opening and
    the commanded joint position are 0.05 m minus each other, and the range comes from the joint's limits."""
    ur5e = vendor_profile("ur5e", "ur5e_hande_vendor.urdf")
    assert ur5e.finger_joints == ("hande_finger_distance",)
    assert ur5e.jaw_opening_range_m() == pytest.approx((0.0, 0.05))
    assert ur5e.jaw_opening_m({"hande_finger_distance": 0.0}) == pytest.approx(0.05)  # open
    assert ur5e.jaw_opening_m({"hande_finger_distance": 0.02, "hande_left_finger_joint": 0.015}) == pytest.approx(0.03)
    assert ur5e.finger_joint_position(0.05) == pytest.approx(0.0)
    assert ur5e.finger_joint_position(0.0) == pytest.approx(0.05)  # close = the joint at its upper limit
    assert ur5e.jaw_opening_m({"hande_left_finger_joint": 0.02}) is None  # mimics are not the gripper's joints


@pytest.mark.parametrize(
    ("name", "urdf"),
    [("panda_twin", None), ("ur5e_twin", None), ("franka_fr3", "fr3_vendor.urdf"), ("ur5e", "ur5e_hande_vendor.urdf")],
)
def test_the_opening_mapping_round_trips(name, urdf):
    """Commanding an opening and measuring the joints the command sets gives the opening back, across the range."""
    profile = robot.load_profile(name) if urdf is None else vendor_profile(name, urdf)
    shut, full = profile.jaw_opening_range_m()
    assert shut == pytest.approx(0.0) and full > 0.04
    for opening in np.linspace(shut, full, 7):
        q = profile.finger_joint_position(opening)
        assert profile.jaw_opening_m({j: q for j in profile.finger_joints}) == pytest.approx(opening)
        assert profile.jaw_opening_at(q) == pytest.approx(opening)
        lower = min(profile.joint_limits[j].lower for j in profile.finger_joints)
        upper = max(profile.joint_limits[j].upper for j in profile.finger_joints)
        assert lower - 1e-12 <= q <= upper + 1e-12  # an opening in range is a joint position in range


def test_the_defaults_keep_the_finger_conventions(tmp_path):
    """Without opening_* keys: two fingers sum (Panda: 0.02 + 0.02 = 0.04 m), one finger counts twice."""
    panda = robot.default_profile()
    assert (panda.interfaces.gripper.opening_offset_m, panda.interfaces.gripper.opening_per_joint) == (0.0, 1.0)
    assert panda.finger_joint_position(0.04) == pytest.approx(0.02)

    def one_finger(d):
        d["gripper"]["joints"] = ["panda_finger_joint1"]

    single = robot.load_profile(write_profile(tmp_path, one_finger))
    assert single.interfaces.gripper.opening_per_joint == 2.0
    assert single.max_jaw_opening_m() == pytest.approx(0.08)
    assert single.jaw_opening_m({"panda_finger_joint1": 0.015}) == pytest.approx(0.03)
    assert single.finger_joint_position(0.03) == pytest.approx(0.015)


def test_a_profile_without_a_gripper_loads_and_refuses_gripper_questions(tmp_path):
    demo = vendor_profile("ros2_control_demo", "r6bot_vendor.urdf")
    assert not demo.has_gripper and demo.jaw_opening_range_m() == (0.0, 0.0) and demo.max_jaw_opening_m() == 0.0
    assert demo.jaw_opening_m({"joint_1": 0.3}) is None
    with pytest.raises(robot.ProfileError, match="has no gripper"):
        demo.finger_joint_position(0.02)
    with pytest.raises(robot.ProfileError, match="has no gripper: no finger pad geometry"):
        _ = demo.gripper_geometry
    assert Kinematics(profile=demo).self_collisions(demo.home_q) == []  # no fingers to place

    def no_gripper_section(d):
        del d["gripper"], d["twin"]

    assert not robot.load_profile(write_profile(tmp_path, no_gripper_section, "no_gripper")).has_gripper

    def twin_without_gripper(d):
        d["gripper"] = {"joints": []}

    with pytest.raises(robot.ProfileError, match="the MuJoCo twin needs a gripper"):
        robot.load_profile(write_profile(tmp_path, twin_without_gripper, "twin_no_gripper"))


# ---------------------------------------------------------------------------------------------- cameras
def test_camera_frames_need_not_be_links_of_the_urdf():
    """A vendor's description has no camera links (the calibration is on /tf_static): the profile loads on it;
    the kinematics, asked for such a frame, say where it lives instead of failing obscurely."""
    for name, urdf in (("franka_fr3", "fr3_vendor.urdf"), ("ur5e", "ur5e_hande_vendor.urdf")):
        profile = vendor_profile(name, urdf)
        assert profile.camera_frames["head"] == "head_camera_optical_frame"
        assert "head_camera_optical_frame" not in profile.links()
        kin = Kinematics(profile=profile)
        assert "head_camera_optical_frame" not in kin.links
        with pytest.raises(KeyError, match=r"'head_camera_optical_frame' is not a link .* /tf"):
            kin.forward(profile.home_q, "head_camera_optical_frame")


def test_the_twin_needs_its_cameras_in_its_urdf(tmp_path):
    """The twin renders each camera at its optical frame's link: a twin profile naming a frame its URDF lacks
    loads (validation does not ask), and building the twin says which camera and why."""
    from captain_ros.twin.scene import build_spec

    def elsewhere(d):
        d["description"]["camera_frames"]["head"] = "calibrated_head_optical_frame"

    profile = robot.load_profile(write_profile(tmp_path, elsewhere))
    with pytest.raises(robot.ProfileError, match=r"camera_frames\.head 'calibrated_head_optical_frame' is not a link"):
        build_spec([], profile=profile)

"""core/camera_calibration.py: the calibration file a real arm's launch publishes, picked by profile and checked
against it."""

from __future__ import annotations

import pytest
import yaml

from captain_ros.core import robot
from captain_ros.core.camera_calibration import CalibrationError, calibration_path, load_calibration
from captain_ros.paths import config_path


@pytest.mark.parametrize("name", ["franka_fr3", "ur5e", "panda_twin"])
def test_each_arm_with_cameras_ships_a_calibration_on_its_own_frames(name):
    profile = robot.load_profile(name)
    path = calibration_path(profile)
    assert path == config_path(f"camera_calibration/{name}.yaml")
    mounts = load_calibration(path, profile)
    assert set(mounts) == set(profile.interfaces.cameras) == set(profile.camera_frames)
    assert mounts["head"].parent_frame == profile.base_frame and mounts["wrist"].parent_frame == profile.hand_frame
    assert {m.child_frame for m in mounts.values()} == set(profile.camera_frames.values())


def test_a_given_file_wins_and_a_profile_without_one_is_told_how(tmp_path):
    fr3 = robot.load_profile("franka_fr3")
    assert calibration_path(fr3, str(tmp_path / "mine.yaml")) == tmp_path / "mine.yaml"
    shipped = r"\(shipped: franka_fr3, panda_twin, ur5e\)"
    with pytest.raises(
        CalibrationError, match=rf"robot profile 'ros2_control_demo' {shipped}: give yours with camera_"
    ):
        calibration_path(robot.load_profile("ros2_control_demo"))


def test_another_arms_calibration_is_refused_naming_the_frame():
    frames = r"\(its base fr3_link0, flange fr3_link8, hand fr3_hand\)"
    with pytest.raises(
        CalibrationError, match=rf"head: parent_frame panda_link0 is not a frame of .*'franka_fr3' {frames}"
    ):
        load_calibration(config_path("camera_calibration/panda_twin.yaml"), robot.load_profile("franka_fr3"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["wrist"].__setitem__("rotation_xyzw", [0, 0, 0, 2]), "is not a unit quaternion"),
        (lambda c: c["wrist"].__setitem__("translation_m", [0, float("nan"), 0]), "3 and rotation_xyzw 4 finite"),
        (lambda c: c["wrist"].__setitem__("translation_m", [0, 0]), "3 and rotation_xyzw 4 finite"),
        (lambda c: c["head"].pop("child_frame"), "needs parent_frame, child_frame"),
        (lambda c: c.clear(), "no 'cameras' mapping"),
    ],
)
def test_a_broken_calibration_says_what(tmp_path, edit, message):
    doc = yaml.safe_load(config_path("camera_calibration/ur5e.yaml").read_text())
    edit(doc["cameras"])
    path = tmp_path / "ur5e.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path, robot.load_profile("ur5e"))


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(CalibrationError, match=r"missing\.yaml cannot be read"):
        load_calibration(tmp_path / "missing.yaml", robot.load_profile("ur5e"))

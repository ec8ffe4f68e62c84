"""The rviz2 configurations of the robot profiles (config/rviz/<profile>.rviz): generated from the profiles and
checked in; each is valid YAML showing the robot, the profile's cameras and the operator view in its base frame.
rviz2 itself does not install here, so the files are checked by their structure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from captain_ros.cli import main as captain_ros
from captain_ros.core import robot, rviz_config
from captain_ros.paths import config_path

PROFILES = robot.available_profiles()
SHIPPED = {"panda_twin", "ur5e_twin", "franka_fr3", "ur5e", "ros2_control_demo"}


def displays(doc: dict) -> dict[str, list[dict]]:
    """Display class (without the plugin prefix) -> its displays."""
    out: dict[str, list[dict]] = {}
    for display in doc["Visualization Manager"]["Displays"]:
        out.setdefault(display["Class"].split("/")[-1], []).append(display)
    return out


def test_every_shipped_profile_has_a_configuration_and_no_other_file_is_there():
    assert set(PROFILES) >= SHIPPED
    on_disk = {p.stem for p in config_path("rviz").glob("*.rviz")}
    assert on_disk == set(PROFILES), "run `captain-ros rviz-config` (and remove stale files)"


@pytest.mark.parametrize("name", PROFILES)
def test_the_checked_in_configuration_is_the_generated_one(name: str):
    path = rviz_config.rviz_path(name)
    assert path.read_text() == rviz_config.render(robot.load_profile(name)), (
        f"{path.name} is out of date: run `captain-ros rviz-config`"
    )


@pytest.mark.parametrize("name", PROFILES)
def test_the_configuration_shows_the_robot_its_cameras_and_the_operator_view(name: str):
    profile = robot.load_profile(name)
    doc = yaml.safe_load(rviz_config.rviz_path(name).read_text())
    assert {p["Class"] for p in doc["Panels"]} >= {"rviz_common/Displays", "rviz_common/Views"}
    manager = doc["Visualization Manager"]
    assert manager["Global Options"]["Fixed Frame"] == profile.base_frame
    shown = displays(doc)
    assert set(shown) == {"Grid", "RobotModel", "TF", "Image", "MarkerArray"} - (
        set() if profile.interfaces.cameras else {"Image"}
    )
    (model,) = shown["RobotModel"]
    assert model["Description Source"] == "Topic"
    assert model["Description Topic"]["Value"] == "/robot_description"
    assert model["Description Topic"]["Durability Policy"] == "Transient Local"  # the description is latched
    images = sorted(d["Topic"]["Value"] for d in shown.get("Image", []))
    assert images == sorted(cam.color_topic for cam in profile.interfaces.cameras.values())
    assert all(d["Topic"]["Reliability Policy"] == "Best Effort" for d in shown.get("Image", []))
    (markers,) = shown["MarkerArray"]
    assert markers["Topic"]["Value"] == "/captain/markers"
    assert all(d["Enabled"] is True for group in shown.values() for d in group)
    assert manager["Views"]["Current"]["Target Frame"] == "<Fixed Frame>"


def test_both_twins_show_two_cameras_and_the_demo_none():
    counts = {name: len(displays(yaml.safe_load(rviz_config.render(robot.load_profile(name)))).get("Image", []))
              for name in ("panda_twin", "ur5e_twin", "franka_fr3", "ur5e", "ros2_control_demo")}  # fmt: skip
    assert counts == {"panda_twin": 2, "ur5e_twin": 2, "franka_fr3": 2, "ur5e": 2, "ros2_control_demo": 0}


def test_check_mode_reports_an_out_of_date_file_and_writes_nothing(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(rviz_config, "rviz_path", lambda name: tmp_path / f"{name}.rviz")
    assert rviz_config.write_all(check=True) == PROFILES and not list(tmp_path.iterdir())
    assert rviz_config.write_all() == PROFILES
    assert rviz_config.write_all(check=True) == []
    assert captain_ros(["rviz-config", "--check"]) == 0
    (tmp_path / "ur5e.rviz").write_text("stale")
    assert captain_ros(["rviz-config", "--check"]) == 1
    assert (tmp_path / "ur5e.rviz").read_text() == "stale"

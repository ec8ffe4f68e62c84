"""A profile without a URDF file takes it from robot_description (latched, as a vendor's robot_state_publisher
publishes it) and checks its names against it; nothing published, or a URDF that lacks the profile's joints,
is a clear ProfileError."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import rclpy
import yaml
from std_msgs.msg import String

from captain_ros.core import robot
from captain_ros.paths import config_path
from captain_ros.ros.description import LATCHED, resolve_profile

pytestmark = pytest.mark.ros
_NAMESPACES = itertools.count()


@pytest.fixture
def node(client_node):
    """A node in a namespace of its own: no other robot_description (a twin's, say) is in its way."""
    namespace = f"/description_test_{os.getpid()}_{next(_NAMESPACES)}"
    arm = rclpy.create_node("arm", namespace=namespace, context=client_node.context)
    yield arm
    arm.destroy_node()


def bare_profile(tmp_path: Path) -> Path:
    """The Panda twin's profile with `description.urdf: ""` (what franka_fr3 and ur5e ship)."""
    doc = yaml.safe_load(config_path("robots/panda_twin.yaml").read_text())
    doc["description"]["urdf"] = ""
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_urdf_comes_from_the_latched_robot_description(node, tmp_path):
    urdf = robot.default_profile().urdf_text
    publisher = node.create_publisher(String, "robot_description", LATCHED)
    publisher.publish(String(data=urdf))  # before the reader exists: transient local delivers it late
    profile = resolve_profile(node, str(bare_profile(tmp_path)), timeout_s=60.0)
    assert profile.urdf_text == urdf and profile.max_jaw_opening_m() == pytest.approx(0.08)
    node.destroy_publisher(publisher)


def test_a_description_without_the_profiles_joints_is_refused(node, tmp_path):
    publisher = node.create_publisher(String, "robot_description", LATCHED)
    publisher.publish(String(data=robot.default_profile().urdf_text.replace('"panda_joint3"', '"joint_3"')))
    with pytest.raises(robot.ProfileError, match="arm_joints 'panda_joint3' is not a movable joint"):
        resolve_profile(node, str(bare_profile(tmp_path)), timeout_s=60.0)
    node.destroy_publisher(publisher)


def test_no_robot_description_is_a_clear_error(node, tmp_path):
    with pytest.raises(
        robot.ProfileError, match=r"nothing was published on /description_test_\d+_\d+/robot_description within 1 s"
    ):
        resolve_profile(node, str(bare_profile(tmp_path)), timeout_s=1.0)


def test_a_profile_with_a_urdf_file_does_not_wait(node):
    assert resolve_profile(node, "panda_twin", timeout_s=0.0) is robot.default_profile()

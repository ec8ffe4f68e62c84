"""The worlds registry (captain_ros.worlds): every built-in world resolves by name to one unit (backend, link,
privileged-state source, options), an unknown name is refused naming the known ones, and importing the registry
imports no simulator, LIBERO or rclpy."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from captain_ros.worlds import UnknownWorld, World, WorldOptions, register_world, world, world_entry, world_names


def test_an_unknown_world_is_refused_naming_the_known_ones():
    assert world_names() == ["twin", "libero", "ros2_control"]
    assert world_names(in_process=True) == ["twin", "libero"]
    for ask in (world, world_entry):
        with pytest.raises(UnknownWorld, match="world must be one of twin, libero, ros2_control, got 'robosuite'"):
            ask("robosuite")
    assert issubclass(UnknownWorld, ValueError)  # the CLI and plan_groups report it as a bad argument


def test_every_registered_world_resolves_to_its_parts():
    from captain_ros.agent.link import HarnessLink
    from captain_ros.harness.backend import ArmBackend

    for name in world_names(in_process=True):
        place = world(name)
        assert place.name == name and world(name) is place and place.summary == world_entry(name).summary
        assert issubclass(place.backend_class(), ArmBackend)
        assert issubclass(place.link_class(), HarnessLink)
    ros = world("ros2_control")
    assert ros.name == "ros2_control" and not ros.in_process
    for refused in (
        lambda: ros.tasks("all", WorldOptions()),
        lambda: ros.start_states("t", "eval", 1, np.random.default_rng(0)),
        lambda: ros.link(None, WorldOptions(), "w1"),
        lambda: ros.privileged(None),
    ):
        with pytest.raises(ValueError, match=r"the ros2_control world .* runs through the ROS nodes"):
            refused()


def test_the_ros2_control_world_names_the_nodes_backend_and_link():
    pytest.importorskip("rclpy")
    ros = world("ros2_control")
    assert ros.backend_class().__name__ == "Ros2ControlBackend"
    assert ros.link_class().__name__ == "RosLink"


def test_each_world_answers_for_its_tasks_starts_groups_labels_and_clock():
    twin, libero = world("twin"), world("libero")
    assert twin.tasks("put_red_cube_in_bowl, open_drawer", WorldOptions()) == ["put_red_cube_in_bowl", "open_drawer"]
    with pytest.raises(ValueError, match="unknown task\\(s\\) no_such_task; known: put_red_cube_in_bowl"):
        twin.tasks("no_such_task", WorldOptions())
    assert twin.group_id("open_drawer", "open_drawer/official/3") == "open_drawer/official/3"
    assert libero.group_id("libero_goal/3", "11") == "libero_goal/3/11"
    assert twin.defaults("eval") == twin.defaults("train") == libero.defaults("train") == (2, 4)
    assert libero.defaults("eval") == (6, 1)  # CaPtain's protocol: every held-out state once
    from captain_ros.libero.world import SUITES

    assert SUITES == ("libero_spatial", "libero_object", "libero_goal")  # the suites when none are named
    assert twin.label(WorldOptions(segmentation="oracle")) == "twin"  # the twin has no segmentation variants
    assert libero.label(WorldOptions()) == "libero/appearance"
    assert libero.label(WorldOptions(segmentation="oracle")) == "libero/oracle"
    assert twin.describe(WorldOptions()) == "the twin"
    assert libero.describe(WorldOptions(segmentation="colour_shape")) == "LIBERO (colour_shape segmentation)"
    with pytest.raises(ValueError, match="segmentation must be one of appearance, colour_shape, oracle, got 'sam'"):
        libero.label(WorldOptions(segmentation="sam"))
    assert libero.clock(SimpleNamespace()) is time.monotonic
    link = SimpleNamespace(twin=None)
    clock = twin.clock(link)  # the twin's simulated time (tests/captain_ros/bridge/test_rollout.py: its resets)
    assert clock() == 0.0
    link.twin = SimpleNamespace(time_s=1.5)
    assert clock() == 1.5


def test_a_world_registers_itself_by_name():
    from captain_ros import worlds

    @register_world("test_world_ab", summary="a world of this test")
    class _Test(World):
        pass

    try:
        assert "test_world_ab" in world_names(in_process=True)
        assert world("test_world_ab").name == "test_world_ab" and world_entry("test_world_ab").module == __name__
    finally:
        worlds._ENTRIES.pop("test_world_ab")
        worlds._WORLDS.pop("test_world_ab")


def test_importing_the_registry_imports_no_simulator_libero_or_rclpy():
    code = (
        "import sys; import captain_ros.worlds as w; w.world_names(); w.world_entry('libero'); "
        "heavy = [m for m in ('mujoco', 'rclpy', 'captain_ros.libero', 'captain_ros.ros', 'captain_ros.twin', "
        "'captain_ros.bridge', 'captain_ros.harness') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    assert out.stdout.strip() == "[]"

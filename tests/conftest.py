"""Test-session setup: every ROS process started by the tests gets an isolated DDS domain."""

from __future__ import annotations

import os
import tempfile

# Set before anything imports rclpy. Child processes inherit these.
# A domain id derived from the pid keeps concurrent test sessions on one machine apart;
# 1..100 stays inside the range Fast DDS maps to valid ports.
os.environ.setdefault("ROS_DOMAIN_ID", str(1 + os.getpid() % 100))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
os.environ.setdefault("ROS_HOME", tempfile.mkdtemp(prefix="captain-ros-home-"))
os.environ.setdefault("MUJOCO_GL", "egl")


import pytest


@pytest.fixture(autouse=True, scope="session")
def _work_in_a_scratch_directory(tmp_path_factory):
    """MuJoCo writes MUJOCO_LOG.TXT into the working directory on warnings; keep it out of the repo."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


from tests.vllm_server import vllm_server  # noqa: E402,F401 - the session fixture, for every test folder

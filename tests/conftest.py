"""Test-session setup: every ROS process started by the tests gets an isolated DDS domain."""

from __future__ import annotations

import os
import tempfile

from captain_ros.core.domains import claim_ros_domain, fast_dds_profile_env

# Set before anything imports rclpy. Child processes inherit these.
# Each test process (a pytest-xdist worker, a stress run, a concurrent session) claims a domain id no other live
# process on this machine holds (captain_ros.core.domains), so their DDS graphs never meet.
# A pytest-xdist worker inherits its controller's environment, the controller's claim included: it claims its own.
if "PYTEST_XDIST_WORKER" in os.environ or "ROS_DOMAIN_ID" not in os.environ:
    os.environ["ROS_DOMAIN_ID"] = str(claim_ros_domain(1, 100))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
os.environ.update(fast_dds_profile_env(os.environ))  # service responses survive slow discovery (config/fastdds.xml)
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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `--dist loadgroup`), each test file runs whole on one worker, so its
    module fixtures (node processes, twins) start once; every test that uses the session's vLLM server runs on one
    worker, so the server starts once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "vllm" if "vllm_server" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))

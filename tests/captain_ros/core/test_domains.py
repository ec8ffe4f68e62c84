"""ROS domain ids claimed with lock files: never the same id for two live processes, free again once one exits; the
Fast DDS profiles file every captain_ros process is pointed at, and that Fast DDS reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from captain_ros.core.domains import PROFILE_VARIABLES, claim_ros_domain, fast_dds_profile_env, isolated_ros_env

CLAIM = "from captain_ros.core.domains import claim_ros_domain; import sys; print(claim_ros_domain({}, {}), flush=True)"


def _holder(first: int, last: int) -> tuple[subprocess.Popen, int]:
    """A process that claims an id and holds it until its stdin closes."""
    code = CLAIM.format(first, last) + "; sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_live_processes_never_share_an_id_and_an_exit_frees_it():
    first, last = 220, 222
    holders = [_holder(first, last) for _ in range(3)]
    try:
        assert sorted(domain for _, domain in holders) == [220, 221, 222]
        done = subprocess.run([sys.executable, "-c", CLAIM.format(first, last)], capture_output=True, text=True)
        assert done.returncode != 0 and "every ROS domain id from 220 to 222 is held" in done.stderr
        proc, freed = holders.pop(1)
        proc.stdin.close()
        proc.wait(timeout=30)
        again = subprocess.run([sys.executable, "-c", CLAIM.format(first, last)], capture_output=True, text=True)
        assert int(again.stdout) == freed
    finally:
        for proc, _ in holders:
            proc.stdin.close()
            proc.wait(timeout=30)


def test_ids_outside_what_dds_maps_are_refused():
    with pytest.raises(ValueError):
        claim_ros_domain(200, 300)


def test_the_profiles_file_goes_in_the_variable_the_distros_fast_dds_reads_and_never_over_the_operators():
    assert set(fast_dds_profile_env({"ROS_DISTRO": "jazzy"})) == {"FASTRTPS_DEFAULT_PROFILES_FILE"}  # Fast DDS 2
    assert set(fast_dds_profile_env({"ROS_DISTRO": "kilted"})) == {"FASTDDS_DEFAULT_PROFILES_FILE"}  # Fast DDS 3
    path = fast_dds_profile_env({"ROS_DISTRO": "kilted"})["FASTDDS_DEFAULT_PROFILES_FILE"]
    assert path.endswith("config/fastdds.xml") and os.path.isfile(path)
    for name in PROFILE_VARIABLES:
        assert fast_dds_profile_env({"ROS_DISTRO": "kilted", name: "/opt/site/dds.xml"}) == {}
    added = isolated_ros_env({"ROS_DOMAIN_ID": "7", "ROS_DISTRO": "jazzy"}, 1, 100)
    assert added == {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "FASTRTPS_DEFAULT_PROFILES_FILE": path}


SERVE_ONCE = """
import rclpy
from std_srvs.srv import Trigger
rclpy.init()
node = rclpy.create_node("profiles_check")
node.create_service(Trigger, "/profiles_check", lambda _, response: setattr(response, "success", True) or response)
client = node.create_client(Trigger, "/profiles_check")
assert client.wait_for_service(timeout_sec=60)
future = client.call_async(Trigger.Request())
rclpy.spin_until_future_complete(node, future, timeout_sec=60)
print("answered", future.result().success)
"""


@pytest.mark.ros
def test_fast_dds_parses_the_profiles_file_and_services_answer_with_it(tmp_path):
    """A process started with the variables this ROS install's Fast DDS reads: a service answers and the XML parser
    reports nothing. The same process with a broken file beside it does report (the check can fail)."""
    pytest.importorskip("rclpy")
    env = {k: v for k, v in os.environ.items() if k not in PROFILE_VARIABLES}
    variables = fast_dds_profile_env(env)
    broken = tmp_path / "broken.xml"
    broken.write_text("<dds><profiles><data_writer profile_name='service'><qos>")
    for profiles, parses in ((variables, True), ({name: str(broken) for name in variables}, False)):
        run = subprocess.run(
            [sys.executable, "-c", SERVE_ONCE], env=env | profiles, capture_output=True, text=True, timeout=300
        )
        output = run.stdout + run.stderr  # (Fast DDS 2 logs to stdout, 3 to stderr)
        assert "answered True" in run.stdout, output
        assert ("XMLPARSER" not in output) == parses, output

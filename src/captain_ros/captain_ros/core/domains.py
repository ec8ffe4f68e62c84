"""ROS 2 domain ids that no other process on this machine is using (tests, benchmarks, the main job), and the
Fast DDS profiles every captain_ros process runs with.

A DDS domain isolates a graph only if nothing else joins it: test workers that run side by side, a main job started
while the tests run, a stress run. An id drawn from the pid (or at random) collides now and then; here each id is
a lock file, held with flock(2) for as long as the process that claimed it lives (the kernel drops the lock when it
exits, however it exits), and the first id not locked is taken. Child processes get the id through ROS_DOMAIN_ID
and share their parent's claim.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_HELD: list[int] = []  # fds of the locks this process holds: open until it exits


def claim_ros_domain(first: int, last: int) -> int:
    """An id in [first, last] that no other live process on this machine has claimed (Fast DDS maps ids up to 232
    to valid ports); RuntimeError when every one is taken."""
    if not 0 <= first <= last <= 232:
        raise ValueError(f"ROS domain ids run from 0 to 232; got {first}..{last}")
    folder = Path(tempfile.gettempdir()) / f"captain-ros-domains-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    count = last - first + 1
    for offset in range(count):
        domain = first + (os.getpid() + offset) % count  # start where the pid points, to spread concurrent claims
        fd = os.open(folder / f"{domain}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD.append(fd)
        return domain
    raise RuntimeError(f"every ROS domain id from {first} to {last} is held by another process on this machine")


# rmw_fastrtps's profile for service response writers (config/fastdds.xml says why). Fast DDS 3 (Kilted on) reads
# FASTDDS_DEFAULT_PROFILES_FILE and warns on the old name; Fast DDS 2 (Humble, Jazzy) reads only FASTRTPS_...
PROFILE_VARIABLES = ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE")


def fast_dds_profile_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that point Fast DDS at captain_ros's profiles file, for processes started with `env`: none
    when `env` names a profiles file already (the operator's own DDS set-up wins)."""
    if any(env.get(name) for name in PROFILE_VARIABLES):
        return {}
    from captain_ros.paths import config_path

    path = str(config_path("fastdds.xml"))
    return {PROFILE_VARIABLES[0] if _fast_dds_3(env) else PROFILE_VARIABLES[1]: path}


def _fast_dds_3(env: Mapping[str, str]) -> bool:
    distro = env.get("ROS_DISTRO", "")
    if distro:  # a sourced workspace
        return distro not in ("humble", "iron", "jazzy")
    try:  # PyPI's ROS wheels: rclpy 9 is Kilted's
        return int(version("rclpy").split(".")[0]) >= 9
    except (PackageNotFoundError, ValueError):
        return True


def isolated_ros_env(env: Mapping[str, str], first: int, last: int) -> dict[str, str]:
    """What to add to `env` (os.environ, or a child's) for a ROS graph of its own on this machine: a domain id
    claimed in [first, last] unless one is set, discovery on this host only, and captain_ros's Fast DDS profiles."""
    added = {} if env.get("ROS_DOMAIN_ID") else {"ROS_DOMAIN_ID": str(claim_ros_domain(first, last))}
    if "ROS_AUTOMATIC_DISCOVERY_RANGE" not in env:
        added["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    return added | fast_dds_profile_env(env)

"""ROS 2 domain ids that no other process on this machine is using (tests, benchmarks, the main job).

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

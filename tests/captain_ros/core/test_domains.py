"""ROS domain ids claimed with lock files: never the same id for two live processes, free again once one exits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from captain_ros.core.domains import claim_ros_domain

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

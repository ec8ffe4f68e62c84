"""Fixtures for tests that talk over DDS: peer processes and a client node spun in a thread."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")

from .helpers import spinning, start_script, stop  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture
def start_peer() -> Iterator:
    """Start a Python script as a separate OS process; waits for it to print READY."""
    procs: list[subprocess.Popen] = []

    def start(script: Path, *args: str, ready_timeout_s: float = 60.0) -> subprocess.Popen:
        procs.append(start_script(script, *args, ready_timeout_s=ready_timeout_s))
        return procs[-1]

    yield start
    for proc in procs:
        stop(proc)


@pytest.fixture
def client_node() -> Iterator:
    """A node in this process, spun by a background executor."""
    with spinning(lambda context: rclpy.create_node(f"test_client_{os.getpid()}", context=context)) as (node, _):
        yield node

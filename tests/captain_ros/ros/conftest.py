"""Fixtures for tests that talk over DDS: peer processes and a client node spun in a thread."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.executors import MultiThreadedExecutor  # noqa: E402

from captain_ros.ros.spin import shutdown_executor  # noqa: E402

from .helpers import start_script, stop  # noqa: E402

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
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node(f"test_client_{os.getpid()}", context=context)
    executor = MultiThreadedExecutor(num_threads=2, context=context)
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    yield node
    shutdown_executor(executor)
    thread.join(timeout=5)
    node.destroy_node()
    rclpy.shutdown(context=context)

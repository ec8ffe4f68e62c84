"""Fixtures for tests that talk over DDS: peer processes and a client node spun in a thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.executors import MultiThreadedExecutor  # noqa: E402

from .helpers import stop  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture
def start_peer() -> Iterator:
    """Start a Python script as a separate OS process; waits for it to print READY."""
    procs: list[subprocess.Popen] = []

    def start(script: Path, *args: str, ready_timeout_s: float = 60.0) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ),
        )
        procs.append(proc)
        deadline = time.monotonic() + ready_timeout_s
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.strip() == "READY":
                # keep draining output so the peer never blocks on a full pipe
                threading.Thread(target=proc.stdout.read, daemon=True).start()
                return proc
        proc.kill()
        raise RuntimeError(f"{script.name} did not become ready:\n{''.join(lines)}")

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
    executor.shutdown()
    thread.join(timeout=5)
    node.destroy_node()
    rclpy.shutdown(context=context)

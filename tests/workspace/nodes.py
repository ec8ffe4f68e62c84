"""Nodes started as processes the way `ros2 run` starts them, with their output collected."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class NodeProcess:
    """A node's process and everything it printed so far (collected in the background)."""

    name: str
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout_s: float = 120.0) -> None:
        """Wait until the node prints `text`; fail early, with its output, if it exits first."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader thread take the last lines
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} printed no '{text}' in {timeout_s} s:\n{self.output()}")
            time.sleep(0.05)

    def interrupt(self, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
        """Send `sig` (Ctrl-C by default) and return the exit code."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_node(executable: Path, *params: tuple[str, object], env: dict[str, str] | None = None) -> NodeProcess:
    """Run a node's executable with `--ros-args -p name:=value ...`, as `ros2 run` would."""
    args = [str(executable), "--ros-args"]
    for name, value in params:
        args += ["-p", f"{name}:={value}"]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ) if env is None else env,
    )
    node = NodeProcess(executable.name, proc)
    threading.Thread(target=lambda: node.lines.extend(proc.stdout), daemon=True).start()
    return node


@contextmanager
def client_node(name: str) -> Iterator:
    """A node of this interpreter's rclpy in its own context, spun by a background executor.

    rclpy.init() / try_shutdown() rather than `with rclpy.init()`, which Jazzy does not have."""
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    from captain_ros.ros.spin import shutdown_executor

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node(f"{name}_{os.getpid()}", context=context)
    executor = MultiThreadedExecutor(num_threads=2, context=context)
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        shutdown_executor(executor)
        thread.join(timeout=10)
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def result_of(future, timeout_s: float = 60.0, what: str = "a reply"):
    """Wait for a future completed by the background executor (the wait is only a bound)."""
    done = threading.Event()
    future.add_done_callback(lambda _f: done.set())
    if not done.wait(timeout_s):
        raise AssertionError(f"no {what} within {timeout_s} s")
    return future.result()


def wait_for_server(client, node: NodeProcess, timeout_s: float = 180.0) -> None:
    """Wait until a service or action server is discovered; fail early, with its output, if the node died."""
    deadline = time.monotonic() + timeout_s
    ready = client.wait_for_service if hasattr(client, "wait_for_service") else client.wait_for_server
    while not ready(timeout_sec=1.0):
        if node.proc.poll() is not None:
            time.sleep(0.2)
            raise AssertionError(f"{node.name} exited with {node.proc.returncode}:\n{node.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.name}: no server after {timeout_s} s:\n{node.output()}")

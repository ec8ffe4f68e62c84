"""Small waiting helpers for DDS tests (tests never judge timing; these only bound waits), and node start-up written
once: node processes (`launch_node`, `launch_module`, `launch_twin`, `launch_motion_node`, `launch_perception_node`,
stopped together by `node_processes`) and a node of the test's own process spun in a background thread
(`spinning`; conftest's `client_node` is one; the fakes of a vendor's bring-up and of move_group start and stop their
executors with its `spin_in_background` and `stop_spinning`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Link-loss limit for ros2_control backends in tests: CI runs on a shared 2-core machine where a process
# can stall for longer than the production 0.5 s. Link loss itself is tested by freezing the twin process.
LOADED_MACHINE_STATE_TIMEOUT_S = 5.0
# Likewise for the largest gap between the stamps of the latest wrench and joint state that a client accepts
# (production 0.25 s): a starved client can fall behind on one topic's queue. Late wrenches are tested far later.
LOADED_MACHINE_WRENCH_LAG_S = 2.0
# And for how much of a sweep a controller that runs at real time (the fake vendor bring-ups; the twin in lockstep
# waits for its commander instead) is given beyond the newest stretch (production 0.05 s: a motion loop that stalls
# 0.03 s stops the arm). Stalls themselves are tested in test_sweep_horizon.py and test_kill_stop.py.
LOADED_MACHINE_SWEEP_HORIZON_S = 3.0
# The perception node's wall-clock limits (production: camera streams older than 2 s are gone, a colour and depth
# pair is awaited 1 s, /tf at an image's stamp 0.5 s): a loaded machine can stall the twin's cameras longer (2.1 s
# seen in a stress run) and deliver its /tf late. The first two are tested on their own in
# test_perception_node_dds.py by freezing the twin.
LOADED_MACHINE_PERCEPTION = (("stale_after_s", 30.0), ("pair_wait_s", 30.0), ("tf_wait_s", 30.0))


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def result_of(future, timeout_s: float = 10.0):
    wait_for(future.done, timeout_s, "a future")
    return future.result()


def stop(proc: subprocess.Popen) -> None:
    """Terminate a peer process, killing it if it does not exit in 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def start_script(script: Path, *args: str, ready_timeout_s: float = 60.0) -> subprocess.Popen:
    """A Python script as a separate OS process, once it prints READY (its output is drained from then on)."""
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),  # a crash prints where it happened
    )
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
    code = proc.poll()
    proc.kill()
    ended = "still running" if code is None else f"exited with {code}"
    raise RuntimeError(f"{script.name} did not become ready ({ended}):\n{''.join(lines)}")


def set_parameters(client, **values: float | str | bool) -> None:
    """Set parameters (floats, strings, booleans) through a node's SetParameters client; every one must be
    accepted."""
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    def value(v: float | str | bool) -> ParameterValue:
        if isinstance(v, bool):
            return ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=v)
        if isinstance(v, str):
            return ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=v)
        return ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=float(v))

    assert client.wait_for_service(timeout_sec=30)
    request = SetParameters.Request(parameters=[Parameter(name=n, value=value(v)) for n, v in values.items()])
    assert all(r.successful for r in result_of(client.call_async(request), 30).results)


def _launch(command: list[str], params: tuple[tuple[str, object], ...]) -> tuple[subprocess.Popen, list[str]]:
    args = [*command, "--ros-args"]
    for name, value in params:
        args += ["-p", f"{name}:={value}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def launch_node(executable: str, *params: tuple[str, object]) -> tuple[subprocess.Popen, list[str]]:
    """A node's console script in its own process with `-p name:=value` parameters; returns the process
    and its output lines (collected in the background)."""
    return _launch([shutil.which(executable) or str(Path(sys.executable).with_name(executable))], params)


def launch_module(module: str, *params: tuple[str, object]) -> tuple[subprocess.Popen, list[str]]:
    """A node module in its own process (`python -m`), like launch_node for console scripts."""
    return _launch([sys.executable, "-m", module], params)


def launch_motion_node(*params: tuple[str, object]) -> tuple[subprocess.Popen, list[str]]:
    """motion_node in its own process with the loaded machine's link-loss and wrench-lag limits (above), and
    `params`."""
    return launch_node(
        "motion_node",
        ("state_timeout_s", LOADED_MACHINE_STATE_TIMEOUT_S),
        ("wrench_max_lag_s", LOADED_MACHINE_WRENCH_LAG_S),
        *params,
    )


def launch_perception_node() -> tuple[subprocess.Popen, list[str]]:
    """perception_node in its own process with the loaded machine's camera limits (above)."""
    return launch_node("perception_node", *LOADED_MACHINE_PERCEPTION)


def launch_twin(
    task: str, start_id: str, real_time_factor: float, camera_rate_hz: float, robot_profile: str = "panda_twin"
) -> tuple:
    """twin_node in its own process, running the twin of `robot_profile`; returns (process, output lines)."""
    return launch_node(
        "twin_node",
        ("task", task),
        ("start_id", start_id),
        ("real_time_factor", real_time_factor),
        ("camera_rate_hz", camera_rate_hz),
        ("robot_profile", robot_profile),
    )


@contextmanager
def node_processes() -> Iterator[dict[str, tuple[subprocess.Popen, list[str]]]]:
    """Node processes, started into the dict this yields (a name -> the launch functions' (process, lines)); on
    exit every one still in it is stopped, the newest first, also when a later one failed to start."""
    nodes: dict[str, tuple[subprocess.Popen, list[str]]] = {}
    try:
        yield nodes
    finally:
        for proc, _ in reversed(nodes.values()):
            stop(proc)


def spin_in_background(executor) -> threading.Thread:
    """Spin `executor` (its nodes added) in a daemon thread of its own, started; stop it with `stop_spinning`."""
    # stop_spinning's module (it imports rclpy) is loaded now: a stop must not wait for an import, or the context of
    # a script's fake that Ctrl-C shuts down (rclpy's handler) ends the spin first, with ExternalShutdownException
    import captain_ros.ros.spin  # noqa: F401

    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    return thread


def stop_spinning(executor, thread: threading.Thread) -> None:
    """Shut `executor` down and wait until its spin in `thread` has ended and none of its callbacks still runs: only
    then may its nodes be destroyed. A callback that runs until told to stop (an action being executed) must be told
    first, or this waits for it."""
    from captain_ros.ros.spin import shutdown_executor

    shutdown_executor(executor)
    # the spin ends once its running callbacks return (a service response may wait up to config/fastdds.xml's
    # 15 s for a client): destroying the node while they still use it spun in rclpy's destroy_node for good
    thread.join(timeout=120)
    if thread.is_alive():
        raise RuntimeError("the executor's spin did not end within 120 s of its shutdown")


@contextmanager
def spinning(make_node: Callable) -> Iterator[tuple]:
    """A node of this process (`make_node(context)`) in an rclpy context of its own, spun by a two-thread executor
    in a background thread; yields (node, thread). On exit the executor stops, its thread ends, the node is
    destroyed and the context shut down."""
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    context = rclpy.Context()
    rclpy.init(context=context)
    node = make_node(context)
    executor = MultiThreadedExecutor(num_threads=2, context=context)
    executor.add_node(node)
    thread = spin_in_background(executor)
    try:
        yield node, thread
    finally:
        stop_spinning(executor, thread)
        node.destroy_node()
        rclpy.shutdown(context=context)


def fresh(backend) -> bool:
    """Whether an arm backend has a full, fresh state (joint states and usable force data)."""
    from captain_ros.harness.backend import BackendError

    try:
        backend.read_state()
    except BackendError:
        return False
    return True

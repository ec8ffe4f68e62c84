"""`captain-ros doctor`: checks that this machine can run the stack, and says what is missing."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _check(name: str, fn: Callable[[], str]) -> Check:
    try:
        return Check(name, True, fn())
    except Exception as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}")


def _python() -> str:
    return f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"


def _rclpy() -> str:
    import rclpy
    from rclpy.utilities import get_rmw_implementation_identifier

    rclpy.init()
    try:
        return f"rmw {get_rmw_implementation_identifier()}, ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0')}"
    finally:
        rclpy.shutdown()


def _interfaces() -> str:
    from captain_interfaces.action import MoveTo
    from captain_interfaces.msg import CallResult as CallResultMsg
    from captain_ros.core.contract import FailureCategory

    declared = {getattr(CallResultMsg, n) for n in dir(CallResultMsg) if n.startswith("FAILURE_")}
    python = {c.value for c in FailureCategory}
    if declared != python:
        raise RuntimeError(f"CallResult.msg and core.contract disagree: {sorted(declared ^ python)}")
    goal_fields = len(MoveTo.Goal.get_fields_and_field_types())
    return f"captain_interfaces built; {len(python) - 1} failure categories agree; MoveTo goal has {goal_fields} fields"


def _dds_loopback() -> str:
    """A HarnessCall service and client on two nodes in this process, over the configured RMW."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from captain_interfaces.srv import HarnessCall

    rclpy.init()
    try:
        server = rclpy.create_node("captain_doctor_server")
        client_node = rclpy.create_node("captain_doctor_client")

        def handle(request: HarnessCall.Request, response: HarnessCall.Response) -> HarnessCall.Response:
            response.result.capability = request.capability
            response.result.success = True
            return response

        server.create_service(HarnessCall, "doctor_call", handle)
        client = client_node.create_client(HarnessCall, "doctor_call")
        executor = SingleThreadedExecutor()
        executor.add_node(server)
        executor.add_node(client_node)
        deadline = time.monotonic() + 10.0
        while not client.service_is_ready():
            if time.monotonic() > deadline:
                raise TimeoutError("service not discovered within 10 s")
            executor.spin_once(timeout_sec=0.05)
        rtts = []
        for _ in range(20):
            t0 = time.perf_counter()
            future = client.call_async(HarnessCall.Request(capability="get_robot_state", args_json="{}"))
            executor.spin_until_future_complete(future, timeout_sec=5.0)
            if not future.done() or future.result().result.capability != "get_robot_state":
                raise RuntimeError("service call did not complete")
            rtts.append((time.perf_counter() - t0) * 1e3)
        executor.shutdown()
        server.destroy_node()
        client_node.destroy_node()
        return f"HarnessCall round trip median {statistics.median(rtts):.2f} ms over {len(rtts)} calls"
    finally:
        rclpy.shutdown()


def _mujoco_render() -> str:
    os.environ.setdefault("MUJOCO_GL", "egl")
    import mujoco

    model = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><light pos='0 0 1'/><geom type='box' size='.1 .1 .1' rgba='1 0 0 1'/>"
        "<camera name='c' pos='0 -1 0.3' xyaxes='1 0 0 0 0.3 1'/></worldbody></mujoco>"
    )
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    renderer = mujoco.Renderer(model, 64, 64)
    try:
        renderer.update_scene(data, camera="c")
        image = renderer.render()
    finally:
        renderer.close()
    if image[..., 0].max() == 0:
        raise RuntimeError("the render is black")
    return f"mujoco {mujoco.__version__}, offscreen render through MUJOCO_GL={os.environ['MUJOCO_GL']}"


def _vision() -> str:
    import cv2
    import open3d

    return f"open3d {open3d.__version__}, opencv {cv2.__version__}"


def _torch() -> str:
    import torch

    build = "CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build"
    return f"torch {torch.__version__} ({build})"


CHECKS: list[tuple[str, Callable[[], str]]] = [
    ("python", _python),
    ("rclpy", _rclpy),
    ("interfaces", _interfaces),
    ("dds loopback", _dds_loopback),
    ("mujoco render", _mujoco_render),
    ("vision", _vision),
    ("torch", _torch),
]


def run_doctor() -> int:
    print("captain_ros doctor: can this machine run the stack?\n")
    results = []
    for name, fn in CHECKS:
        result = _check(name, fn)
        results.append(result)
        print(f"  {'ok  ' if result.ok else 'FAIL'}  {name:<14} {result.detail}", flush=True)
    failed = [r.name for r in results if not r.ok]
    if failed:
        print(f"\n{len(failed)} check(s) failed: {', '.join(failed)}. `make setup` installs what is missing.")
        return 1
    print("\nAll checks passed. The twin, motion and perception nodes run today; the agent arrives with its issue.")
    return 0

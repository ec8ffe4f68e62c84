"""How long `observe` takes and where the time goes (issue 24), for bench/perception.py.

Three measurements in one run, on one start state with the arm at home, so that they share the machine's load:
  raw render      both cameras (head + wrist, RGB + depth, 512x512) rendered by the twin, nothing else: the anchor
  in-process      the observe capability through the harness core (render, then the images handed to the background
                  build of both clouds: back-projection, table plane, robot mask, colour names), as the in-process
                  link and the sim bridge call it; then a first segment on it, which waits for what of the clouds
                  is not built yet (observe_then_segment: the two together)
  over ROS        as the agent node calls it: /perception/call observe on the perception node, which takes the
                  newest images twin_node published (in another process, at real time) and answers while the
                  clouds are built; then, as the agent does when it attaches images, /perception/get_observation for
                  both colour images and their PNG encoding; then a first segment
and the stages of the cloud build one by one (the breakdown).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

CALLS = 60
TASK, START = "put_red_cube_in_bowl", "put_red_cube_in_bowl/wide/3"


def _p50(samples: list[float]) -> float:
    return float(np.percentile(np.asarray(samples) * 1e3, 50))


def in_process() -> dict[str, float]:
    from captain_ros.agent.context import image_part
    from captain_ros.core.config import load_config
    from captain_ros.perception import cloud
    from captain_ros.worlds.twin.link import InProcessLink

    link = InProcessLink(load_config())
    link.reset(TASK, START, "any", "speed")
    harness = link.harness
    perception, twin = harness.perception, link.twin
    stages: dict[str, list[float]] = {
        k: [] for k in ("render", "observe", "first_segment", "backproject", "table", "robot_mask", "colours", "png")
    }
    harness.call("observe")  # warm: the renderer and the table plane exist
    table = perception._table
    for _ in range(CALLS):
        t0 = time.perf_counter()
        twin.observe()  # both cameras, RGB + depth: the raw render
        stages["render"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert harness.call("observe").success
        t1 = time.perf_counter()
        assert harness.call("segment", text="red cube").success
        stages["observe"].append(t1 - t0)
        stages["first_segment"].append(time.perf_counter() - t1)
    _, images, q, _ = perception.capture(("head", "wrist"))
    for _ in range(CALLS // 3):
        for image in images.values():
            t0 = time.perf_counter()
            points = cloud.backproject(image)
            t1 = time.perf_counter()
            normal, d = cloud.fit_table(points, hint=table)
            height = points @ normal.astype(np.float32) + np.float32(d)
            t2 = time.perf_counter()
            cloud.robot_mask(points, perception.kin, q, np.isfinite(height) & (height > cloud.OBJECT_MIN_HEIGHT_M))
            t3 = time.perf_counter()
            cloud.color_names(image.rgb)
            t4 = time.perf_counter()
            image_part(image.rgb)
            t5 = time.perf_counter()
            for key, seconds in zip(
                ("backproject", "table", "robot_mask", "colours", "png"),
                (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4),
                strict=True,
            ):
                stages[key].append(seconds)
    link.close()
    out = {f"{k}_ms_p50": _p50(v) for k, v in stages.items()}
    out["clouds_per_camera_ms_p50"] = sum(out[f"{k}_ms_p50"] for k in ("backproject", "table", "robot_mask", "colours"))
    return out


def _executable(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def over_ros() -> dict[str, float]:
    """twin_node and perception_node in their own processes; this process calls the perception node."""
    from captain_ros.core.domains import isolated_ros_env

    os.environ.update(isolated_ros_env(os.environ, 151, 230))
    import rclpy

    from captain_interfaces.srv import GetObservation, HarnessCall
    from captain_ros.agent.context import image_part
    from captain_ros.ros.convert import call_result_from_msg
    from captain_ros.stack import TWIN_PERCEPTION_LIMITS

    procs = [
        subprocess.Popen(
            [_executable(exe), "--ros-args", *[a for k, v in params for a in ("-p", f"{k}:={v}")]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for exe, params in (
            ("twin_node", (("task", TASK), ("start_id", START), ("real_time_factor", 1.0))),
            ("perception_node", TWIN_PERCEPTION_LIMITS),  # as `captain-ros run` starts it
        )
    ]
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("observe_speed", context=context)
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()

    def call(client, request, timeout_s: float = 60.0):
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(timeout_s):
            raise RuntimeError(f"{client.srv_name} did not answer within {timeout_s} s")
        return future.result()

    try:
        observe = node.create_client(HarnessCall, "/perception/call")
        images = node.create_client(GetObservation, "/perception/get_observation")
        if not (observe.wait_for_service(timeout_sec=120) and images.wait_for_service(timeout_sec=60)):
            raise RuntimeError("the perception node did not come up")
        request = HarnessCall.Request(capability="observe", args_json="{}")
        deadline = time.monotonic() + 120
        while not call_result_from_msg(call(observe, request).result).success:  # until both cameras streamed
            if time.monotonic() > deadline:
                raise RuntimeError("observe over ROS never succeeded")
            time.sleep(0.5)
        rows: dict[str, list[float]] = {"observe_ros": [], "images_ros": [], "segment_ros": []}
        segment = HarnessCall.Request(capability="segment", args_json='{"text": "red cube"}')
        for _ in range(CALLS):
            t0 = time.perf_counter()
            result = call_result_from_msg(call(observe, request).result)
            t1 = time.perf_counter()
            assert result.success, result.message
            handle = result.value["observation_handle"]
            answer = call(images, GetObservation.Request(handle=handle, include_depth=False))  # as RosLink asks
            for image in answer.observation.color:
                rgb = np.frombuffer(bytes(image.data), dtype=np.uint8).reshape(image.height, image.width, 3)
                image_part(rgb)
            t2 = time.perf_counter()
            assert call_result_from_msg(call(observe, segment).result).success
            rows["observe_ros"].append(t1 - t0)
            rows["images_ros"].append(t2 - t1)
            rows["segment_ros"].append(time.perf_counter() - t2)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=context)
        for proc in procs:
            proc.send_signal(2)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {f"{k}_ms_p50": _p50(v) for k, v in rows.items()}


def measure() -> dict[str, object]:
    speed = in_process()
    speed.update(over_ros())
    render = speed["render_ms_p50"]
    return {
        "raw_render_ms_p50": render,
        "observe_inprocess_ms_p50": speed["observe_ms_p50"],
        "observe_inprocess_ratio_to_render": speed["observe_ms_p50"] / render,
        "observe_ros_ms_p50": speed["observe_ros_ms_p50"],
        "observe_ros_ratio_to_render": speed["observe_ros_ms_p50"] / render,
        "observe_ros_images_ms_p50": speed["images_ros_ms_p50"],
        "first_segment_inprocess_ms_p50": speed["first_segment_ms_p50"],
        "first_segment_ros_ms_p50": speed["segment_ros_ms_p50"],
        "observe_breakdown_ms_p50": {k: round(v, 2) for k, v in speed.items() if not k.endswith("ros_ms_p50")},
        "observe_speed_calls": CALLS,
        "observe_speed_load_average_1min": os.getloadavg()[0],
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))

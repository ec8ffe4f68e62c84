#!/usr/bin/env python3
"""Round trip of a harness-call-sized service versus std_srvs/Trigger, between two processes.

A server process (this script with --serve) answers `captain_interfaces/HarnessCall` with a
realistic result (a get_robot_state value, a full receipt, diagnostics, budgets) and
`std_srvs/Trigger` with a short message. The client calls both in interleaved blocks on an
isolated ROS domain on loopback and reports p50/p90 of each and the ratio (target <= 1.5).

    python bench/ros_rtt.py            # prints a table, writes bench/results/ros_rtt.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from captain_ros.core.domains import isolated_ros_env

os.environ.update(isolated_ros_env(os.environ, 101, 200))

import rclpy
from _common import percentiles_ms, print_table, write_results
from rclpy.executors import SingleThreadedExecutor
from std_srvs.srv import Trigger

from captain_interfaces.srv import HarnessCall
from captain_ros.core.contract import Budget, CallResult
from captain_ros.ros.convert import call_result_to_msg
from captain_ros.ros.spin import spin

TARGET_RATIO = 1.5


def harness_result() -> CallResult:
    """A get_robot_state-sized result: joints, TCP pose, jaw, wrist wrench, a full receipt."""
    value = {
        "joint_names": [f"panda_joint{i}" for i in range(1, 8)],
        "q_rad": [0.0123456789, -0.785398163, 0.0, -2.35619449, 0.0, 1.57079633, 0.785398163],
        "dq_radps": [0.0] * 7,
        "tcp_pose": {"position_m": [0.30689, 0.0, 0.48688], "quat_xyzw": [1.0, 0.0, 0.0, 0.0]},
        "jaw_opening_m": 0.08,
        "wrench": {"force_n": [0.12, -0.08, 9.81], "torque_nm": [0.01, 0.0, -0.02]},
        "frame": "panda_link0",
    }
    receipt = (
        "get_robot_state: tcp (0.307, 0.000, 0.487) m in panda_link0, yaw 0.0 deg, jaw 80.0 mm open, "
        "wrist force 9.8 N (baseline 9.8 N), joints within limits, no motion in progress, "
        "last motion stopped by target_reached after 12.4 cm, peak force 2.1 N, budget 3/60 requests, "
        "2/150 actions"
    )
    return CallResult.ok(
        "get_robot_state",
        value=value,
        receipt=receipt[:300],
        diagnostics={"backend": "mujoco_twin", "sim_time_s": 12.345},
        budget=Budget(requests_used=3, actions_used=2, wall_time_used_s=41.5),
        episode_id="ep-000123",
    )


def serve() -> None:
    spin(_server)  # rclpy.init() + try_shutdown(): Jazzy has no `with rclpy.init()`


def _server() -> rclpy.node.Node:
    """The server node: answers HarnessCall and Trigger with a fixed, realistic result."""
    node = rclpy.create_node("rtt_server")
    prototype = call_result_to_msg(harness_result())

    def on_call(request: HarnessCall.Request, response: HarnessCall.Response) -> HarnessCall.Response:
        response.result = prototype
        response.result.call_id = request.call_id
        return response

    def on_trigger(_: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = True, "ok"
        return response

    node.create_service(HarnessCall, "rtt/harness_call", on_call)
    node.create_service(Trigger, "rtt/trigger", on_trigger)
    print("READY", flush=True)
    return node


def measure(calls: int, warmup: int, block: int) -> dict[str, object]:
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "READY":
            raise RuntimeError("the server process did not start")
        rclpy.init()  # with try_shutdown() below: Jazzy has no `with rclpy.init()`
        try:
            node = rclpy.create_node("rtt_client")
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            harness = node.create_client(HarnessCall, "rtt/harness_call")
            trigger = node.create_client(Trigger, "rtt/trigger")
            for client in (harness, trigger):
                if not client.wait_for_service(timeout_sec=30):
                    raise RuntimeError(f"service {client.srv_name} not discovered within 30 s")
            args = json.dumps(
                {
                    "pose": {"position_m": [0.45, -0.1, 0.12], "quat_xyzw": [1, 0, 0, 0]},
                    "mode": "guarded",
                    "speed_mps": 0.05,
                }
            )

            def once(client, request) -> float:
                t0 = time.perf_counter()
                future = client.call_async(request)
                executor.spin_until_future_complete(future, timeout_sec=5.0)
                if not future.done():
                    raise RuntimeError(f"{client.srv_name}: no response within 5 s")
                return time.perf_counter() - t0

            samples: dict[str, list[float]] = {"harness": [], "trigger": []}
            requests = {
                "harness": lambda i: HarnessCall.Request(
                    capability="move_to", args_json=args, call_id=f"c{i}", episode_id="ep-000123"
                ),
                "trigger": lambda i: Trigger.Request(),
            }
            clients = {"harness": harness, "trigger": trigger}
            for name, client in clients.items():  # warm both paths
                for i in range(warmup):
                    once(client, requests[name](i))
            i = 0
            while len(samples["harness"]) < calls:  # interleaved blocks: both see the same machine state
                for name, client in clients.items():
                    for _ in range(block):
                        samples[name].append(once(client, requests[name](i)))
                        i += 1
            executor.shutdown()
            node.destroy_node()
        finally:
            rclpy.try_shutdown()
        return samples
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per service (default 1000)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured calls per service first")
    parser.add_argument("--block", type=int, default=50, help="calls per interleaved block")
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    samples = measure(args.calls, args.warmup, args.block)
    harness, trigger = percentiles_ms(samples["harness"]), percentiles_ms(samples["trigger"])
    ratio = harness["p50"] / trigger["p50"]
    print_table(
        "ROS 2 service round trip between two processes (loopback, Fast DDS)",
        ["service", "p50 ms", "p90 ms", "p99 ms", "calls"],
        [
            ["captain_interfaces/HarnessCall", harness["p50"], harness["p90"], harness["p99"], harness["n"]],
            ["std_srvs/Trigger", trigger["p50"], trigger["p90"], trigger["p99"], trigger["n"]],
        ],
    )
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f"\nratio HarnessCall/Trigger p50 = {ratio:.2f} ({verdict} the target <= {TARGET_RATIO})")
    response_bytes = len(json.dumps(harness_result().to_dict()))
    write_results(
        "ros_rtt",
        {
            "harness_call_rtt_ms_p50": harness["p50"],
            "harness_call_rtt_ms_p90": harness["p90"],
            "trigger_rtt_ms_p50": trigger["p50"],
            "trigger_rtt_ms_p90": trigger["p90"],
            "rtt_ratio": ratio,
        },
        {
            "target_rtt_ratio_max": TARGET_RATIO,
            "calls_per_service": args.calls,
            "harness_result_json_bytes": response_bytes,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The robot profile a node runs with, completed by /robot_description where the profile carries no URDF.

Vendor bring-ups (franka_bringup, ur_robot_driver) publish their URDF on robot_description, latched (transient
local, reliable): a profile with `description.urdf: ""` takes it from there, and every name the profile gives is
then checked against it (RobotProfile.with_urdf_text) before the node serves anything.
"""

from __future__ import annotations

import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from captain_ros.core import robot

LATCHED = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)


def resolve_profile(node: Node, name_or_path: str, timeout_s: float = 30.0) -> robot.RobotProfile:
    """`load_profile(name_or_path)`, with the URDF from `node`'s robot_description topic (resolved in its
    namespace) when the profile names no file. Waits at most `timeout_s`; ProfileError says what is missing.
    Works before `node` is spun: the topic is read by a private node of the same context."""
    profile = robot.load_profile(name_or_path)
    if profile.urdf_text:
        return profile
    topic = node.resolve_topic_name("robot_description")
    reader = rclpy.create_node(
        f"{node.get_name()}_description_reader", context=node.context, start_parameter_services=False
    )
    received: list[str] = []
    executor = SingleThreadedExecutor(context=node.context)
    try:
        reader.create_subscription(String, topic, lambda msg: received.append(msg.data), LATCHED)
        executor.add_node(reader)
        deadline = time.monotonic() + timeout_s
        while not received and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=min(0.1, max(deadline - time.monotonic(), 0.0)))
    finally:
        executor.shutdown()
        reader.destroy_node()
    if not received:
        raise robot.ProfileError(
            f"{profile.source}: description.urdf is empty and nothing was published on {topic} within "
            f"{timeout_s:.0f} s: start the arm's bring-up (its robot_state_publisher) first, or name a URDF file"
        )
    node.get_logger().info(f"robot profile '{profile.name}': URDF from {topic} ({len(received[-1])} characters)")
    return profile.with_urdf_text(received[-1])

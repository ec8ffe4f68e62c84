"""The console-script entry of a node: init, spin on a multi-threaded executor, clean shutdown."""

from __future__ import annotations

from collections.abc import Callable

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node


def spin(make_node: Callable[[], Node], args: list[str] | None = None, num_threads: int = 4) -> None:
    try:
        with rclpy.init(args=args):
            node = make_node()
            executor = MultiThreadedExecutor(num_threads=num_threads)
            executor.add_node(node)
            try:
                executor.spin()
            finally:
                node.destroy_node()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass

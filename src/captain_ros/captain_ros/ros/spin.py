"""The console-script entry of a node: init, spin on a multi-threaded executor, clean shutdown.

Written the way ros2/examples are, so it runs on Jazzy as well as Kilted: `with rclpy.init()` exists
only from Kilted on (Jazzy's `rclpy.init()` returns None), so the context is shut down in `finally`
with `rclpy.try_shutdown()`, which is a no-op when Ctrl-C or SIGTERM already shut it down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import rclpy
from rclpy._rclpy_pybind11 import RCLError
from rclpy.action import ActionClient
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node


def spin_until_shutdown(executor: Executor) -> None:
    """`executor.spin()` that returns once the context is shut down (Ctrl-C, SIGTERM, rclpy.shutdown()).

    A shutdown from a signal races with the executor's wait: rclpy then raises ExternalShutdownException,
    or RCLError 'the given context is not valid' when the wait set is made just after the context went
    away (ros2/rclpy#398; still seen in 2026). Both mean "shut down"; any other RCLError is re-raised.
    """
    try:
        executor.spin()
    except ExternalShutdownException:
        pass
    except RCLError:
        if executor.context.ok():
            raise


def spin(make_node: Callable[[], Node], args: list[str] | None = None, num_threads: int = 4) -> None:
    """Run one node until Ctrl-C, SIGTERM or an external shutdown; always release the context."""
    rclpy.init(args=args)
    node: Node | None = None
    try:
        node = make_node()
        executor = MultiThreadedExecutor(num_threads=num_threads)
        executor.add_node(node)
        spin_until_shutdown(executor)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


class SpunActionClient(ActionClient):
    """An rclpy ActionClient that may be created on a node an executor is already spinning in another thread.

    rclpy's ActionClient adds itself to its node before it creates its lock, so that executor can meet it
    without one (AttributeError '_lock', which ends the executor's thread and leaves every later future
    pending: seen on a loaded CI machine). The lock exists before the client is registered here. Every action
    client in the product (grippers, the ros2_control backend) and in the DDS tests is one of these."""

    def __init__(self, *args, **kwargs) -> None:
        self._lock = threading.Lock()
        super().__init__(*args, **kwargs)

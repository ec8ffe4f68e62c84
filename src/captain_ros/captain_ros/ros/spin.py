"""The console-script entry of a node: init, spin on a multi-threaded executor, an orderly exit.

Ctrl-C and SIGTERM are handled here, not by rclpy: rclpy's own handlers shut the context down at once, from
their own thread, and every node, publisher and action client was then destroyed after its context. On Jazzy
that crashed the motion node now and then (SIGSEGV in Publisher.destroy inside Fast DDS: 1 exit in ~30 on a
loaded 2-core machine). Here a signal only asks the spin to end; then, in order: the node ends the work its
callbacks are doing (`stop_work`: a motion halts, the twin's loops end), the executor's threads finish, the
node is destroyed, and last the context shuts down. A second Ctrl-C interrupts a stop that hangs.

Written the way ros2/examples are, so it runs on Jazzy as well as Kilted: `with rclpy.init()` exists only from
Kilted on (Jazzy's `rclpy.init()` returns None), so the context is shut down at the end with
`rclpy.try_shutdown()`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import rclpy
from rclpy._rclpy_pybind11 import RCLError
from rclpy.action import ActionClient
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from captain_ros.ros.guard import GuardedNode

POLL_S = 0.1  # how soon a spin sees a stop request (a Python signal handler runs between the executor's waits)
_stop = threading.Event()


def init(args: list[str] | None = None) -> None:
    """rclpy.init() with this module's Ctrl-C and SIGTERM handling (see the module's docstring)."""
    _stop.clear()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


def _on_signal(signum: int, _frame) -> None:
    if _stop.is_set() and signum == signal.SIGINT:
        raise KeyboardInterrupt  # a second Ctrl-C: the orderly exit hangs, leave now
    _stop.set()


def request_stop() -> None:
    """End the spin as Ctrl-C would (a node that has finished its job, or failed to start)."""
    _stop.set()


def stopping() -> bool:
    """Whether a stop was requested (Ctrl-C, SIGTERM, request_stop): work in the node's own threads ends."""
    return _stop.is_set()


def spin_until_stopped(executor: Executor) -> None:
    """Spin until Ctrl-C, SIGTERM, request_stop() or a shutdown of the context."""
    try:
        while not _stop.is_set() and executor.context.ok():
            executor.spin_once(timeout_sec=POLL_S)
    except ExternalShutdownException:
        pass
    except RCLError:  # the wait set was made just as the context went away (ros2/rclpy#398)
        if executor.context.ok():
            raise


def spin_until_shutdown(executor: Executor) -> None:
    """`executor.spin()` that returns once the executor or its context is shut down: for an executor spun in a
    thread of its own (the ros2_control backend's), which its owner shuts down.

    A shutdown of the context races with the executor's wait: rclpy then raises ExternalShutdownException, or
    RCLError 'the given context is not valid' when the wait set is made just after the context went away
    (ros2/rclpy#398; still seen in 2026). Both mean "shut down"; any other RCLError is re-raised.
    """
    try:
        executor.spin()
    except ExternalShutdownException:
        pass
    except RCLError:
        if executor.context.ok():
            raise


def shutdown_executor(executor: Executor) -> None:
    """Shut `executor` down and wait until none of its threads still runs a callback, on Jazzy as on Kilted.

    Only then may the caller destroy its nodes. Kilted's MultiThreadedExecutor.shutdown() joins its thread pool;
    Jazzy's returns at once (its Executor.shutdown() never waits on outstanding work, and the pool is left
    running), so a worker could still be using a node while it was destroyed. The pool is joined here on both.
    """
    executor.shutdown()
    pool = getattr(executor, "_executor", None)  # MultiThreadedExecutor's workers (rclpy 7 and 9 alike)
    if isinstance(pool, ThreadPoolExecutor):
        pool.shutdown(wait=True)


def close(executor: Executor | None, node: Node | None) -> None:
    """The orderly exit: the node's `stop_work()` (where it has one), the executor's threads, the node, the
    context. Callbacks that run long (a motion, a goal being followed) must end on `stop_work`, or the wait
    for the executor's threads waits for them."""
    if node is not None and hasattr(node, "stop_work"):
        node.stop_work()
    if executor is not None:
        shutdown_executor(executor)
    if node is not None:
        node.destroy_node()
    rclpy.try_shutdown()


def spin(make_node: Callable[[], Node], args: list[str] | None = None, num_threads: int = 4) -> None:
    """Run one node until Ctrl-C, SIGTERM or request_stop(); always exit in order (`close`)."""
    init(args)
    node: Node | None = None
    executor: Executor | None = None
    try:
        node = make_node()
        executor = MultiThreadedExecutor(num_threads=num_threads)
        executor.add_node(node)
        spin_until_stopped(executor)
    except KeyboardInterrupt:
        pass
    finally:
        close(executor, node)


class SideNode(GuardedNode, Node):
    """A node of a node's own for its high-rate subscriptions (camera images, joint states, /tf), spun in a thread of
    its own by a SingleThreadedExecutor.

    rclpy's Python executors rebuild their wait set and hand each callback to a thread pool at every wake: a
    MultiThreadedExecutor that 200 messages a second wake cost the perception node most of a core, while it was doing
    nothing else, and its service calls waited on the interpreter lock behind that. A single-threaded executor runs
    the callbacks in its own thread, without the pool; the host keeps its own executor (and its threads) for its
    services, whose callbacks may wait on what the side node's subscriptions fill in. (rclpy's EventsExecutor would
    take the messages from a C++ queue, but adding a subscription to a node it spins hangs on its wake, and it kept a
    core busy while idle, in rclpy 7 and 9.) Topic names are the host's resolved ones, so its namespace and
    remappings hold. Make every subscription, then start(); close() stops the thread and destroys the node."""

    def __init__(self, host: Node, suffix: str) -> None:
        super().__init__(
            f"{host.get_name()}_{suffix}",
            context=host.context,
            use_global_arguments=False,  # the host's remappings are in the names it resolves
            start_parameter_services=False,
        )
        self.host = host
        self._executor = SingleThreadedExecutor(context=host.context)
        self._thread = threading.Thread(
            target=spin_until_shutdown, args=(self._executor,), name=f"{suffix}-spin", daemon=True
        )

    def start(self) -> None:
        """Start spinning, once every subscription is made."""
        self._executor.add_node(self)
        self._thread.start()

    def subscribe(self, msg_type, topic: str, callback: Callable, qos, **kwargs):
        """A subscription to the host's `topic` (resolved as the host resolves it)."""
        return self.create_subscription(msg_type, self.host.resolve_topic_name(topic), callback, qos, **kwargs)

    def close(self) -> None:
        self._executor.shutdown()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        self.destroy_node()


class SpunActionClient(ActionClient):
    """An rclpy ActionClient that may be created on a node an executor is already spinning in another thread.

    rclpy's ActionClient adds itself to its node before it creates its lock, so that executor can meet it
    without one (AttributeError '_lock', which ends the executor's thread and leaves every later future
    pending: seen on a loaded CI machine). The lock exists before the client is registered here. Every action
    client in the product (grippers, the ros2_control backend) and in the DDS tests is one of these."""

    def __init__(self, *args, **kwargs) -> None:
        self._lock = threading.Lock()
        super().__init__(*args, **kwargs)

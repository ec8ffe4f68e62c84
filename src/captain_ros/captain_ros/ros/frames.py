"""A transform buffer fed from /tf and /tf_static: where a frame was at a given time, as tf2 answers it.

`FrameBuffer.lookup(target, source, stamp)` is tf2's `lookup_transform(target, source, time)`: the pose of
`source` in `target` (it maps points in `source` into `target`), interpolated at `stamp` between the samples
around it (position linearly, rotation by slerp), through every frame between the two. It fails with a
`FrameError` that says why: a frame nobody publishes (`UnknownFrameError`), frames in trees /tf does not join
(`DisconnectedFramesError`), or a stamp outside what the buffer holds (`ExtrapolationError`, which says whether
the data has not arrived yet or has been dropped).

Where `tf2_ros` is installed (a ROS workspace: package.xml declares it) its `Buffer` does the work. Where it is
not (the PyPI-wheel setups: there is no tf2_ros wheel), pytransform3d's `TemporalTransformManager` holds the
frame graph (paths, inversion, chaining) with each /tf edge as a time series of its own that interpolates as
tf2 does (pytransform3d's `pq_slerp`). (Its own `NumpyTimeseriesTransform` interpolates by screw motion, not as
tf2, is rebuilt on every new sample, and reports a missing stamp only as "out of range".)

Both engines are fed from this module's own subscriptions, with TransformListener's QoS, so they share one input
path, a lookup can wait on arriving data (a condition, not tf2's polling loop on the system clock: see
docs/vendor_interfaces.md, tf2 in Python), and the /tf_static transforms are also kept as they came: `static_chain` and
`lookup_with` use them to hang a hand-eye calibration on an arm link whose pose the caller computes itself (the
link at an image's joint state). As tf2 has it, a frame has one parent: a transform that names another parent
for a frame replaces the old one, with a warning (two nodes publishing one frame is a misconfiguration). When a
frame's stamps jump back by more than a second (a simulator reset), the /tf history is cleared and the static
transforms kept, as tf2_ros does when its clock jumps back.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import numpy as np
from geometry_msgs.msg import TransformStamped
from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from scipy.spatial.transform import Rotation
from tf2_msgs.msg import TFMessage

CACHE_S = 10.0  # history kept per /tf edge (tf2's default cache time)
JUMP_BACK_S = 1.0  # a frame's stamps going back further than this is a clock reset: the /tf history is cleared
AUTHORITY = "captain_ros"  # who fed tf2_ros's Buffer (its warnings name it)
# TransformListener's QoS: /tf deep enough for a burst, /tf_static latched so late joiners get every static frame
TF_QOS = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE)
TF_STATIC_QOS = QoSProfile(
    depth=100,
    history=HistoryPolicy.KEEP_LAST,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
    reliability=ReliabilityPolicy.RELIABLE,
)


class FrameError(Exception):
    """A lookup that cannot be answered; the message says which frames and why."""


class UnknownFrameError(FrameError):
    """A frame that nothing has published on /tf or /tf_static."""


class DisconnectedFramesError(FrameError):
    """Both frames exist, but in trees that no transform joins."""


class ExtrapolationError(FrameError):
    """The stamp is outside the samples the buffer holds: `future` when they have not arrived yet (waiting may
    help), else they are older than the buffer keeps (it will not)."""

    def __init__(self, message: str, future: bool):
        super().__init__(message)
        self.future = future


@dataclass(frozen=True)
class Transform:
    """The pose of `source` in `target` (it maps points in `source` into `target`), at `stamp_ns` (None: a chain
    of static transforms, valid at any time)."""

    target: str
    source: str
    position_m: np.ndarray  # (3,)
    rotation: np.ndarray  # (3, 3)
    stamp_ns: int | None

    def as_matrix(self) -> np.ndarray:
        matrix = np.eye(4)
        matrix[:3, :3], matrix[:3, 3] = self.rotation, self.position_m
        return matrix


def stamp_ns(stamp) -> int | None:
    """A stamp as integer nanoseconds, from a builtin_interfaces/Time or an rclpy Time (exactly) or seconds (a
    number); None stays None."""
    if stamp is None:
        return None
    if hasattr(stamp, "sec") and hasattr(stamp, "nanosec"):
        return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
    if hasattr(stamp, "nanoseconds"):
        return int(stamp.nanoseconds)
    return round(float(stamp) * 1e9)


def _seconds(ns: int) -> str:
    return f"{ns * 1e-9:.3f} s"


def _pq(t: TransformStamped) -> np.ndarray | None:
    """(x, y, z, qw, qx, qy, qz) with a unit quaternion, or None for a transform that is not one (NaN, zero)."""
    p, r = t.transform.translation, t.transform.rotation
    values = (p.x, p.y, p.z, r.w, r.x, r.y, r.z)
    norm = math.sqrt(r.w * r.w + r.x * r.x + r.y * r.y + r.z * r.z)  # plain floats: /tf brings thousands a second
    if not all(map(math.isfinite, values)) or not norm > 1e-6:
        return None
    return np.array([*values[:3], *(v / norm for v in values[3:])])


def transform_msg(parent: str, child: str, position_m, rotation, stamp=None) -> TransformStamped:
    """A TransformStamped of `child` in `parent` (position (3,), rotation (3, 3))."""
    t = TransformStamped(child_frame_id=child)
    t.header.frame_id = parent
    ns = stamp_ns(stamp) or 0
    t.header.stamp.sec, t.header.stamp.nanosec = divmod(ns, 1_000_000_000)
    x, y, z = (float(v) for v in position_m)
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = x, y, z
    qx, qy, qz, qw = Rotation.from_matrix(np.asarray(rotation, dtype=float)).as_quat()
    t.transform.rotation.x, t.transform.rotation.y = float(qx), float(qy)
    t.transform.rotation.z, t.transform.rotation.w = float(qz), float(qw)
    return t


# ---------------------------------------------------------------------------------------------- engines
@cache
def _samples_class():
    """The /tf edge type for pytransform3d's TemporalTransformManager (imported only where tf2_ros is not)."""
    from pytransform3d.transform_manager import TimeVaryingTransform
    from pytransform3d.transformations import pq_slerp, transform_from_pq

    class Samples(TimeVaryingTransform):
        """One /tf edge over time, interpolated as tf2 does between the samples around the query time."""

        def __init__(self, child: str, parent: str, cache_ns: int):
            self.child, self.parent, self.cache_ns = child, parent, cache_ns
            self.times: list[int] = []  # sorted stamps, ns
            self.pqs: list[np.ndarray] = []  # (x, y, z, qw, qx, qy, qz) at each stamp

        def add(self, t_ns: int, pq: np.ndarray) -> None:
            i = bisect.bisect_left(self.times, t_ns)
            if i < len(self.times) and self.times[i] == t_ns:
                self.pqs[i] = pq  # the same stamp again: the newer message wins
            else:
                self.times.insert(i, t_ns)
                self.pqs.insert(i, pq)
            first = bisect.bisect_left(self.times, self.times[-1] - self.cache_ns)
            if first:
                del self.times[:first], self.pqs[:first]

        def as_matrix(self, query_time) -> np.ndarray:
            t = int(query_time)
            i = bisect.bisect_left(self.times, t)
            if i < len(self.times) and self.times[i] == t:
                return transform_from_pq(self.pqs[i])
            if i == 0 or i == len(self.times):
                future = i == len(self.times)
                kept = f"past (older than the {self.cache_ns * 1e-9:.0f} s kept)"
                raise ExtrapolationError(
                    f"'{self.child}' in '{self.parent}' is on /tf from {_seconds(self.times[0])} to "
                    f"{_seconds(self.times[-1])}: {_seconds(t)} would need extrapolation into the "
                    + ("future (not received yet)" if future else kept),
                    future=future,
                )
            t0, t1 = self.times[i - 1], self.times[i]
            return transform_from_pq(pq_slerp(self.pqs[i - 1], self.pqs[i], (t - t0) / (t1 - t0)))

        def check_transforms(self):
            return self  # samples are normalised as they arrive

    return Samples


class _GraphEngine:
    """pytransform3d's TemporalTransformManager, one edge per child frame (tf's one parent per frame)."""

    name = "pytransform3d"

    def __init__(self, cache_s: float):
        try:
            from pytransform3d.transform_manager import StaticTransform, TemporalTransformManager
            from pytransform3d.transformations import transform_from_pq
        except ImportError as exc:
            raise ImportError(
                f"neither tf2_ros nor pytransform3d is installed ({exc}): in a ROS workspace source it (tf2_ros), "
                "elsewhere pip install -r requirements/pip-only.in (pytransform3d)"
            ) from exc

        self._static_cls, self._from_pq, self._samples_cls = StaticTransform, transform_from_pq, _samples_class()
        self._cache_ns = round(cache_s * 1e9)
        self._graph = TemporalTransformManager(strict_check=True, check=True)
        self._parent: dict[str, str] = {}  # child -> parent
        self._edge: dict[str, object] = {}  # child -> its Samples or StaticTransform

    def set(self, t: TransformStamped, pq: np.ndarray, static: bool) -> str:
        """Add one transform; returns a warning ('' if none)."""
        child, parent = t.child_frame_id, t.header.frame_id
        old, warning = self._parent.get(child), ""
        if old is not None and old != parent:
            warning = f"frame '{child}' now has parent '{parent}' (was '{old}'): a frame has one parent"
        if old is not None and (old != parent or static != isinstance(self._edge[child], self._static_cls)):
            self._graph.remove_transform(child, old)
            del self._edge[child], self._parent[child]
        if static:
            self._edge[child] = self._static_cls(self._from_pq(pq))
            self._graph.add_transform(child, parent, self._edge[child])
        else:
            if child not in self._edge:
                self._edge[child] = self._samples_cls(child, parent, self._cache_ns)
                self._graph.add_transform(child, parent, self._edge[child])
            self._edge[child].add(stamp_ns(t.header.stamp), pq)
        self._parent[child] = parent
        return warning

    def clear_dynamic(self) -> None:
        for child in [c for c, e in self._edge.items() if not isinstance(e, self._static_cls)]:
            self._graph.remove_transform(child, self._parent.pop(child))
            del self._edge[child]
        linked = set(self._parent) | set(self._parent.values())
        for frame in [f for f in self._graph.nodes if f not in linked]:
            self._graph.remove_frame(frame)  # a frame only /tf had is unknown again, not disconnected

    def _root(self, frame: str) -> str:
        seen = {frame}
        while frame in self._parent and self._parent[frame] not in seen:
            frame = self._parent[frame]
            seen.add(frame)
        return frame

    def lookup(self, target: str, source: str, t_ns: int | None) -> tuple[np.ndarray, int | None]:
        graph = self._graph
        for role, frame in (("target", target), ("source", source)):
            if not graph.has_frame(frame):
                known = ", ".join(sorted(graph.nodes)[:12]) or "none yet"
                raise UnknownFrameError(
                    f"frame '{frame}' ({role}) is not on /tf or /tf_static: nothing publishes it (frames known: "
                    f"{known}{', ...' if len(graph.nodes) > 12 else ''})"
                )
        i, j = graph.nodes.index(source), graph.nodes.index(target)
        if not np.isfinite(graph.dist[i, j]):
            raise DisconnectedFramesError(
                f"'{source}' and '{target}' are in trees that no transform joins (one rooted at "
                f"'{self._root(source)}', the other at '{self._root(target)}')"
            )
        path, k = [source], i
        while k != j:  # the graph's shortest path (a tree's only path), as pytransform3d walks it
            k = graph.predecessors[j, k]
            path.append(graph.nodes[k])
        dynamic = [
            edge
            for a, b in itertools.pairwise(path)
            if not isinstance(edge := self._edge[a if self._parent.get(a) == b else b], self._static_cls)
        ]
        if t_ns is None and dynamic:  # tf2's time 0: the newest time every edge of the chain has
            t_ns = min(edge.times[-1] for edge in dynamic)
        stamp = t_ns if dynamic else None
        return graph.get_transform_at_time(source, target, 0 if t_ns is None else t_ns), stamp


class _Tf2Engine:
    """tf2_ros's Buffer (its C++ BufferCore)."""

    name = "tf2_ros"

    def __init__(self, cache_s: float):
        import tf2_ros
        from rclpy.duration import Duration

        self._tf2 = tf2_ros
        self._buffer = tf2_ros.Buffer(cache_time=Duration(nanoseconds=round(cache_s * 1e9)))

    def set(self, t: TransformStamped, pq: np.ndarray, static: bool) -> str:
        normalised = TransformStamped(header=t.header, child_frame_id=t.child_frame_id)  # tf2 refuses others
        p, q = normalised.transform.translation, normalised.transform.rotation
        p.x, p.y, p.z = (float(v) for v in pq[:3])
        q.w, q.x, q.y, q.z = (float(v) for v in pq[3:])
        (self._buffer.set_transform_static if static else self._buffer.set_transform)(normalised, AUTHORITY)
        return ""  # tf2 logs its own warnings (TF_OLD_DATA, TF_REPEATED_DATA)

    def clear_dynamic(self) -> None:
        self._buffer.clear()  # the caller inserts the static transforms again

    def lookup(self, target: str, source: str, t_ns: int | None) -> tuple[np.ndarray, int | None]:
        from rclpy.time import Time

        tf2 = self._tf2
        try:
            t = self._buffer.lookup_transform_core(target, source, Time(nanoseconds=t_ns or 0))
        except tf2.LookupException as exc:
            raise UnknownFrameError(str(exc)) from None
        except tf2.ConnectivityException as exc:
            raise DisconnectedFramesError(str(exc)) from None
        except tf2.ExtrapolationException as exc:
            raise ExtrapolationError(str(exc), future="future" in str(exc)) from None
        except tf2.TransformException as exc:
            raise FrameError(str(exc)) from None
        p, r = t.transform.translation, t.transform.rotation
        matrix = np.eye(4)
        matrix[:3, :3] = Rotation.from_quat([r.x, r.y, r.z, r.w]).as_matrix()
        matrix[:3, 3] = p.x, p.y, p.z
        stamp = stamp_ns(t.header.stamp)
        return matrix, stamp or None


def default_engine() -> str:
    """'tf2_ros' where it is installed, else 'pytransform3d'."""
    try:
        import tf2_ros  # noqa: F401
    except ImportError:
        return "pytransform3d"
    return "tf2_ros"


ENGINES = {"tf2_ros": _Tf2Engine, "pytransform3d": _GraphEngine}


# ---------------------------------------------------------------------------------------------- the buffer
class FrameBuffer:
    """/tf and /tf_static of one node, answering where a frame was at a given time (see the module docstring).

    Without a node (or with `subscribe=False` until `subscribe()`), transforms come only through `add`."""

    def __init__(
        self,
        node: Node | None = None,
        *,
        callback_group: CallbackGroup | None = None,
        cache_s: float = CACHE_S,
        engine: str | None = None,
        subscribe: bool = True,
    ):
        self.engine_name = engine or default_engine()
        self._cache_s = cache_s
        self._engine = ENGINES[self.engine_name](cache_s)
        self._node, self._group = node, callback_group
        self._cond = threading.Condition()
        self._static: dict[str, TransformStamped] = {}  # child -> its latest /tf_static transform
        self._newest: dict[str, int] = {}  # child -> newest /tf stamp, ns (to notice clock resets)
        self._warned: set[str] = set()
        self._subscriptions: list = []
        if node is not None and subscribe:
            self.subscribe()

    # ------------------------------------------------------------------------------ input
    @property
    def subscribed(self) -> bool:
        return bool(self._subscriptions)

    def subscribe(self) -> None:
        """Start listening to /tf and /tf_static (once; /tf_static's latched transforms arrive at once)."""
        if self._node is None or self._subscriptions:
            return
        node, group = self._node, self._group
        self._subscriptions = [
            node.create_subscription(TFMessage, "/tf", lambda m: self.add(m.transforms), TF_QOS, callback_group=group),
            node.create_subscription(
                TFMessage,
                "/tf_static",
                lambda m: self.add(m.transforms, static=True),
                TF_STATIC_QOS,
                callback_group=group,
            ),
        ]

    def add(self, transforms: Iterable[TransformStamped], static: bool = False) -> None:
        """Transforms as /tf (or /tf_static) delivers them."""
        warnings = []
        with self._cond:
            for t in transforms:
                child, parent = t.child_frame_id, t.header.frame_id
                pq = _pq(t)
                if not child or not parent or child == parent or pq is None:
                    warnings.append(f"ignored an invalid transform '{parent}' -> '{child}' (empty, self or NaN)")
                    continue
                if static:
                    self._static[child] = t
                else:
                    t_ns = stamp_ns(t.header.stamp)
                    newest = self._newest.get(child)
                    if newest is not None and t_ns < newest - JUMP_BACK_S * 1e9:
                        warnings.append(
                            f"the stamps of '{child}' jumped back from {_seconds(newest)} to {_seconds(t_ns)} (a "
                            "clock reset): the /tf history is cleared"
                        )
                        self._clear_dynamic()
                    self._newest[child] = max(t_ns, self._newest.get(child, t_ns))
                warnings.append(self._engine.set(t, pq, static))
            self._cond.notify_all()
        for warning in warnings:
            if warning and warning not in self._warned and self._node is not None:
                self._warned.add(warning)  # once each: a frame with two publishers flips at their rates
                self._node.get_logger().warning(warning)

    def _clear_dynamic(self) -> None:
        self._engine.clear_dynamic()
        self._newest.clear()
        for t in self._static.values():  # tf2_ros's clear() may drop them too
            self._engine.set(t, _pq(t), static=True)

    # ------------------------------------------------------------------------------ lookups
    def lookup(self, target: str, source: str, stamp=None) -> Transform:
        """The pose of `source` in `target` at `stamp` (a builtin_interfaces/Time, or seconds; None: the newest
        time the whole chain has, as tf2's time 0). Raises FrameError."""
        with self._cond:
            return self._lookup(target, source, stamp_ns(stamp))

    def _lookup(self, target: str, source: str, t_ns: int | None) -> Transform:
        if not target or not source:
            raise UnknownFrameError(f"an empty frame name (target '{target}', source '{source}')")
        if target == source:
            return Transform(target, source, np.zeros(3), np.eye(3), t_ns)
        matrix, stamp = self._engine.lookup(target, source, t_ns)
        return Transform(target, source, matrix[:3, 3].copy(), matrix[:3, :3].copy(), stamp)

    def wait_for(self, target: str, source: str, stamp, timeout_s: float) -> Transform:
        """`lookup` that waits up to `timeout_s` (wall clock) while the transform at `stamp` has not arrived yet;
        any other failure, or still none at the deadline, raises at once."""
        deadline = time.monotonic() + timeout_s
        t_ns = stamp_ns(stamp)
        with self._cond:
            while True:
                try:
                    return self._lookup(target, source, t_ns)
                except ExtrapolationError as exc:
                    left = deadline - time.monotonic()
                    if not exc.future or left <= 0:
                        raise
                self._cond.wait(left)

    def static_chain(self, frame: str) -> list[str]:
        """`frame`'s ancestors through /tf_static alone, its parent first."""
        chain: list[str] = []
        with self._cond:
            while frame in self._static and (frame := self._static[frame].header.frame_id) not in chain:
                chain.append(frame)
        return chain

    def lookup_with(self, target: str, source: str, anchor: str, anchor_pose: Transform) -> Transform:
        """The pose of `source` in `target`, with `source` hung on `anchor` through its /tf_static chain and
        `anchor` placed in `target` by the caller (e.g. an arm link at an image's joint state): the calibration
        and the given pose are chained by the buffer's engine, in a graph of their own."""
        chain = self.static_chain(source)
        if anchor not in chain:
            raise DisconnectedFramesError(f"'{source}' does not hang on '{anchor}' through /tf_static")
        scratch = ENGINES[self.engine_name](self._cache_s)
        with self._cond:
            links = [self._static[f] for f in [source, *chain[: chain.index(anchor)]]]
        if anchor != target:  # (an anchor that is the target itself, a camera calibrated on the base: given)
            links.append(transform_msg(target, anchor, anchor_pose.position_m, anchor_pose.rotation))
        for t in links:
            scratch.set(t, _pq(t), static=True)
        matrix, _ = scratch.lookup(target, source, None)
        return Transform(target, source, matrix[:3, 3].copy(), matrix[:3, :3].copy(), anchor_pose.stamp_ns)

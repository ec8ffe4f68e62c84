"""Episode time on any clock, never running backwards.

The ROS clock with `use_sim_time` is the twin's simulated time, which restarts at 0 when the twin resets
(and a node may read it just before or just after that). Budgets and watchdogs measure how much time
passed, so they use `ForwardClock`: it adds up the clock's forward steps and ignores its jumps back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class ForwardClock:
    """Seconds elapsed on `source` since construction, counting only forward steps (thread-safe)."""

    def __init__(self, source: Callable[[], float]):
        self._source = source
        self._lock = threading.Lock()
        self._last = source()
        self._elapsed = 0.0

    def __call__(self) -> float:
        with self._lock:
            now = self._source()
            if now > self._last:
                self._elapsed += now - self._last
            self._last = now
            return self._elapsed

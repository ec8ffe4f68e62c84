"""Episode time on any clock, never running backwards.

The ROS clock with `use_sim_time` is the twin's simulated time, which restarts at 0 when the twin resets
(and a node may read it just before or just after that). Budgets and watchdogs measure how much time
passed, so they use `ForwardClock`: it adds up the clock's forward steps and ignores its jumps back.

`StampedHistory` keeps a stream's last seconds by the messages' own stamps, whatever the publisher's rate: two
seconds of joint states are 200 messages from the twin at 100 Hz and 2,000 from a Franka at 1 kHz.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any


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


class StampedHistory(deque):
    """A deque that keeps the items stamped within `window_s` of the newest (`stamp_of(item)`, seconds on the
    publisher's clock), oldest first. A stamp older than the newest kept means that clock went back (the twin
    reset, a bag looped): what came before is forgotten. `max_items` bounds memory whatever the stamps say (a
    publisher stamping every message alike never ages out). Not thread-safe: guard it as the deque it replaces."""

    def __init__(self, window_s: float, stamp_of: Callable[[Any], float], max_items: int = 20_000) -> None:
        if not window_s > 0 or max_items < 1:
            raise ValueError(f"a history needs window_s > 0 and max_items >= 1, got {window_s} and {max_items}")
        super().__init__(maxlen=max_items)
        self.window_s, self.stamp_of = window_s, stamp_of

    def append(self, item: Any) -> None:
        stamp = self.stamp_of(item)
        if self and stamp < self.stamp_of(self[-1]):
            self.clear()
        super().append(item)
        while stamp - self.stamp_of(self[0]) > self.window_s:
            self.popleft()

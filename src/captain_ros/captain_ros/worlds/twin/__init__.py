"""The twin world: the MuJoCo twin in-process. Its backend is `TwinBackend` (`harness/twin_backend.py`: the harness's
shadow check builds one too, so it stays below the harness), its link `InProcessLink` (the harness core on the twin,
one twin at a time), its privileged-state source `TwinPrivileged` (`privileged.py`: CaPtain App. A.2's features).
Tasks are config/tasks.yaml's; start states are drawn from a split's generator (`twin/start_states.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from captain_ros.worlds import World, WorldOptions, register_world


@register_world("twin")
class TwinWorld(World):
    def describe(self, options: WorldOptions) -> str:
        return "the twin"

    def tasks(self, selection: str, options: WorldOptions) -> list[str]:
        from captain_ros.twin.tasks import default_suite

        suite = default_suite()
        names = list(suite) if selection.strip() == "all" else [t.strip() for t in selection.split(",") if t.strip()]
        unknown = [t for t in names if t not in suite]
        if unknown:
            raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(suite)}")
        return names

    def start_states(self, task: str, split: str, count: int, rng: np.random.Generator) -> list[str]:
        from captain_ros.twin.start_states import sample_start_id

        return [str(sample_start_id(task, split, rng)) for _ in range(count)]

    def backend_class(self) -> type:
        from captain_ros.harness.twin_backend import TwinBackend

        return TwinBackend

    def link_class(self) -> type:
        from captain_ros.worlds.twin.link import InProcessLink

        return InProcessLink

    def link(self, harness: Any, options: WorldOptions, worker: str) -> Any:
        return self.link_class()(harness)

    def privileged(self, link: Any) -> Any:
        from captain_ros.worlds.twin.privileged import TwinPrivileged

        return TwinPrivileged(lambda: link.twin)

    def clock(self, link: Any) -> Callable[[], float]:
        """The twin's simulated time, as in the agent node on the twin (its ROS clock), so a slow model server (vLLM
        on 2 CPU cores writes 8 tokens/s per request) spends no robot time."""
        from captain_ros.core.clock import ForwardClock

        return ForwardClock(lambda: link.twin.time_s if link.twin is not None else 0.0)  # resets only step back

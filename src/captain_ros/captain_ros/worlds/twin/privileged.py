"""The twin's privileged state as the episode recorder stores it (TRAINING ONLY): CaPtain App. A.2's critic features
plus raw poses (`twin/privileged_state.py`), and the robot's joints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from captain_ros.worlds.privileged import robot_payload


def snapshot_payload(twin: Any) -> dict[str, Any]:
    """The twin's hidden state as stored (TRAINING ONLY): its PrivilegedState plus the robot's joints."""
    snap = twin.snapshot().as_dict()
    snap["robot"] = robot_payload(twin.profile, twin.arm_q(), twin.jaw_opening_m())
    return snap


class TwinPrivileged:
    """The twin's privileged state. `twin_of` returns the in-process twin the link drives (None before a reset)."""

    def __init__(self, twin_of: Callable[[], Any]):
        self.twin_of = twin_of

    def family(self, task: str) -> str:
        return self.twin_of().task.family

    def snapshot(self) -> dict[str, Any]:
        return snapshot_payload(self.twin_of())

    def ladder(self) -> tuple[int, bool]:
        twin = self.twin_of()
        return (0, False) if twin is None else (len(twin.task.ladder()), bool(twin.task.hard))

    def reached(self) -> int:
        """d of the staged reward at the episode's end: rungs reached, place and move rungs still holding."""
        return self.twin_of().subgoals_credited()

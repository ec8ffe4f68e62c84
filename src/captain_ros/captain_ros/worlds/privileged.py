"""What the episode recorder reads of a world (TRAINING AND SCORING ONLY, never the policy's): the protocol every
world's privileged-state source follows, and the robot part of a stored snapshot they share."""

from __future__ import annotations

from typing import Any, Protocol


class PrivilegedSource(Protocol):
    """What the recorder reads of the simulator an episode runs on: TRAINING AND SCORING ONLY, never the policy's."""

    def family(self, task: str) -> str:
        """The task family evaluation groups by."""

    def snapshot(self) -> dict[str, Any]:
        """The hidden state now, JSON-able, with `success`: whether the scene is solved."""

    def ladder(self) -> tuple[int, bool]:
        """(sub-goals of the task, whether the task is hard), without reading the simulator; (0, False) without one."""

    def reached(self) -> int:
        """d of the staged sub-goal reward on the state now (read at the episode's end): the rungs reached, with
        place and move rungs still holding (CaPtain App. A.2; reads the simulator)."""


def robot_payload(profile: Any, arm_q_rad: Any, jaw_opening_m: float) -> dict[str, Any]:
    """The robot part of a stored snapshot: its profile, joint names and positions."""
    return {
        "profile": profile.name,
        "arm_joint_names": list(profile.arm_joints),
        "finger_joint_names": list(profile.finger_joints),
        "arm_q_rad": [float(q) for q in arm_q_rad],
        "jaw_opening_m": float(jaw_opening_m),
    }

"""LIBERO's privileged state as the episode recorder stores it (TRAINING AND SCORING ONLY, never the policy's)."""

from __future__ import annotations

from typing import Any

from captain_ros.libero.link import parse_task
from captain_ros.worlds.privileged import robot_payload


class LiberoPrivileged:
    """The episode recorder's view of LIBERO (TRAINING AND SCORING ONLY, never the policy's): object poses in the
    robot's base frame, fixture joints, each goal predicate and the arm's joints, read from the LIBERO server."""

    def __init__(self, link: Any):
        self.link = link  # a LiberoLink

    def family(self, task: str) -> str:
        return parse_task(task)[0]  # the suite: evaluation reports per suite

    def snapshot(self) -> dict[str, Any]:
        backend = self.link.backend
        hidden, verdict, arm = backend.privileged(), backend.success(), backend.read_state(require_force=False)
        return {
            "sim_time_s": hidden["time_s"],
            "object_poses": hidden["objects"],
            "fixture_joints": hidden["fixture_joints"],
            "success": bool(verdict["success"]),
            "goals": [
                {"predicate": goal, "held": held} for goal, held in zip(verdict["goals"], verdict["held"], strict=True)
            ],
            "robot": robot_payload(backend.profile, arm.q_rad, arm.jaw_opening_m),
        }

    def ladder(self) -> tuple[int, bool]:
        return 0, False  # LIBERO's tasks have no sub-goal ladder; their goal predicates are in each snapshot

    def reached(self) -> int:
        return 0

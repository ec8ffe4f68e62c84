"""The tests' handle on the fake (not part of moveit-py): the robot, the world's boxes, failures to raise, and what
was called."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from captain_ros.core.moveit_scene import SceneBox

PLAN_POINTS = 25  # a fake plan's points, as tests/captain_ros/ros/fake_move_group.py's
OBSTACLES_ENV = "FAKE_MOVEIT_OBSTACLES"  # "x,y,z,sx,sy,sz;...": boxes in the world of a fake in another process


def _obstacles() -> dict[str, SceneBox]:
    specs = [s for s in os.environ.get(OBSTACLES_ENV, "").split(";") if s.strip()]
    boxes = [[float(v) for v in spec.split(",")] for spec in specs]
    return {f"obstacle_{k}": SceneBox(f"obstacle_{k}", tuple(v[:3]), tuple(v[3:6]), 0.0) for k, v in enumerate(boxes)}


@dataclass
class FakeState:
    profile: str = "panda_twin"  # the robot profile whose URDF and kinematics stand for the MoveIt configuration
    group: str = "panda_arm"  # the SRDF group the fake's robot model has
    tcp_radius_m: float = 0.03
    contacts_readable: bool = False  # True: CollisionResult.contacts reads (the real binding cannot: README.md)
    body: str = ""  # the robot link the TCP's sphere stands for in contacts and the ACM ("" = the TCP link)
    world: dict[str, SceneBox] = field(default_factory=_obstacles)
    fail: dict[str, Exception] = field(default_factory=dict)  # method name -> what it raises
    started: list[dict] = field(default_factory=list)  # MoveItPy's arguments, one per instance
    checked: int = 0  # states checked
    acm_checks: int = 0  # of them, checked with an AllowedCollisionMatrix passed (check_collision's acm)
    clones: int = 0  # PlanningScene.__copy__ calls (PlanningScene::clone)
    groups: set[str] = field(default_factory=set)  # check_collision's joint_model_group_name
    plans: list[dict] = field(default_factory=list)  # what each plan() was asked
    shutdown: int = 0

    def maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]


STATE = FakeState()


def reset() -> FakeState:
    """A fresh fake (one per test): STATE itself, emptied, since the fake's modules hold it."""
    STATE.__init__()
    return STATE

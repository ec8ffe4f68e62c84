"""TRAINING ONLY: the twin's hidden state snapshot and the 36 critic features x(s_t).

CaPtain App. A.2: before every request the twin records a snapshot the policy cannot access;
the simulator critic reads 36 features in five groups (end-effector and jaw; goal bookkeeping;
distances; target lift and displacement; articulated joint and held flags). No counters of the
policy's own behaviour are included. `PrivilegedState` is deliberately a type of its own that
nothing on the policy side accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captain_ros.twin.features import FEATURE_NAMES
from captain_ros.twin.state import SceneReader
from captain_ros.twin.tasks import TaskSpec, goals_status


@dataclass(frozen=True)
class PrivilegedState:
    """TRAINING ONLY. Never passed to, rendered for, or serialized into anything the policy sees."""

    task: str
    start_id: str
    sim_time_s: float
    features: np.ndarray  # (36,) float64, in FEATURE_NAMES order
    object_poses: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]  # name -> (xyz_m, quat_wxyz)
    joint_positions: dict[str, float]  # articulated scene joints
    goals_satisfied: tuple[bool, ...]
    success: bool
    subgoals_reached: tuple[str, ...]
    unstable: bool = False
    fault: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def feature(self, name: str) -> float:
        return float(self.features[FEATURE_NAMES.index(name)])

    def as_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "start_id": self.start_id,
            "sim_time_s": self.sim_time_s,
            "features": dict(zip(FEATURE_NAMES, map(float, self.features), strict=True)),
            "object_poses": {
                k: {"position_m": list(p), "quat_wxyz": list(q)} for k, (p, q) in self.object_poses.items()
            },
            "joint_positions": self.joint_positions,
            "goals_satisfied": list(self.goals_satisfied),
            "success": self.success,
            "subgoals_reached": list(self.subgoals_reached),
            "unstable": self.unstable,
            "fault": self.fault,
        }


@dataclass
class EpisodeMemory:
    """What the features need to remember from the start of the episode."""

    positions: dict[str, np.ndarray]
    drawer_m: float
    ever_held: set[str] = field(default_factory=set)

    def as_start(self) -> dict[str, Any]:
        return {"positions": self.positions, "drawer_m": self.drawer_m}


def _goal_point(task: TaskSpec, reader: SceneReader, goal_index: int) -> np.ndarray:
    """Where the active goal wants its target: placement point, drawer interior, or handle at goal."""
    goal = task.goals[goal_index]
    if goal.type == "in_drawer":
        return reader.drawer_interior_position(goal.dest)
    if goal.is_joint:
        return reader.handle_position(goal.object)
    dest = task.object(goal.dest)
    return reader.position(dest.name) + np.array([0.0, 0.0, reader.resting_height(dest)])


def compute_features(
    task: TaskSpec, reader: SceneReader, memory: EpisodeMemory, ladder_fraction: float
) -> tuple[np.ndarray, list[bool]]:
    status = goals_status(task, reader)
    n = len(task.goals)
    active = next((i for i, ok in enumerate(status) if not ok), n - 1)
    goal = task.goals[active]
    ee = reader.tcp_position()
    target_name = goal.object
    target = reader.handle_position(target_name) if goal.is_joint else reader.position(target_name)
    dest_point = _goal_point(task, reader, active)
    start_target = memory.positions[target_name]

    q = q0 = travel = 0.0
    cabinet = task.cabinet
    if cabinet is not None:
        q, q0, travel = reader.drawer_position(cabinet.name), memory.drawer_m, cabinet.drawer_travel_m
    if goal.is_joint:
        q_goal = travel if goal.type == "joint_open" else 0.0
        dist = abs(q_goal - q)
        initial = abs(q_goal - q0)
        progress = (1.0 - dist / initial) if initial > 1e-6 else 1.0
    else:
        dist = float(np.linalg.norm(target - dest_point))
        initial = float(np.linalg.norm(start_target - dest_point))
        progress = 0.0
    norm = float(np.clip(dist / initial, 0.0, 2.0)) if initial > 1e-6 else 0.0

    movable = [o.name for o in task.objects if o.movable]
    others = [m for m in movable if m != target_name]
    max_other = max((float(np.linalg.norm(reader.position(m) - memory.positions[m])) for m in others), default=0.0)
    nearest = (
        min((float(np.linalg.norm(reader.position(m) - reader.position(target_name))) for m in others), default=1.0)
        if not goal.is_joint
        else 1.0
    )
    left, right = reader.pad_contacts(target_name)
    held = left and right
    if held:
        memory.ever_held.add(target_name)
    tcp_local = reader.data.site_xmat[reader._tcp_site].reshape(3, 3).T @ (target - ee)
    between = (
        abs(tcp_local[1]) <= reader.jaw_opening() / 2 + 0.005 and abs(tcp_local[0]) < 0.02 and abs(tcp_local[2]) < 0.03
    )

    f = [
        *ee,
        reader.jaw_opening(),
        float(reader.jaw_commanded_closed()),
        float(n),
        float(sum(status)),
        sum(status) / n,
        float(active),
        float(goal.is_joint),
        float(not goal.is_joint),
        dist,
        norm,
        float(np.linalg.norm(ee - target)),
        float(np.linalg.norm((ee - target)[:2])),
        float(ee[2] - target[2]),
        float(np.linalg.norm((target - dest_point)[:2])),
        float(target[2] - dest_point[2]),
        float(target[2] - start_target[2]),
        float(np.linalg.norm(target - start_target)),
        max_other,
        nearest,
        reader.bottom_z(target_name) if not goal.is_joint else float(target[2]),
        reader.tilt(target_name) if not goal.is_joint else 0.0,
        reader.speed(target_name),
        reader.tcp_speed(),
        q,
        q / travel if travel else 0.0,
        q - q0,
        progress if goal.is_joint else 0.0,
        float(held),
        float(target_name in memory.ever_held),
        float(left),
        float(right),
        float(between),
        ladder_fraction,
    ]
    features = np.asarray(f, dtype=np.float64)
    if not np.all(np.isfinite(features)):
        bad = [FEATURE_NAMES[i] for i in np.flatnonzero(~np.isfinite(features))]
        raise FloatingPointError(f"non-finite privileged features: {bad}")
    return features, status


def object_poses(task: TaskSpec, reader: SceneReader) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    return {
        o.name: (tuple(map(float, reader.position(o.name))), tuple(map(float, reader.quaternion(o.name))))
        for o in task.objects
    }

"""The task suite: definitions loaded from config/tasks.yaml, goal predicates and sub-goal ladders.

A task has a language instruction, the objects of its scene, goals that must all hold on the
final state (with the tolerances of the suite), an official nominal layout, and for spatial
tasks a relation that every layout respects. Predicates read the scene through a
`SceneReader` (captain_ros.twin.state), so they are evaluated on privileged simulator state
only, never on anything the policy produced.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from captain_ros.paths import config_path
from captain_ros.twin.objects import SceneObject

if TYPE_CHECKING:
    from captain_ros.twin.state import SceneReader

FAMILIES = ("pick_place", "stack", "spatial", "articulated")
GOAL_TYPES = ("on", "in", "in_drawer", "joint_open", "joint_closed")
RELATION_TYPES = ("between", "left_of", "nearest")
SUPPORT_KINDS = ("cube", "block", "plate", "box")
CONTAINER_KINDS = ("bowl", "box", "cup")


class TaskError(ValueError):
    """A task name, start id or task definition is wrong; the message says what and where."""


@dataclass(frozen=True)
class Tolerances:
    on_xy_margin_m: float = 0.01
    on_z_tol_m: float = 0.015
    in_xy_margin_m: float = 0.005
    in_floor_tol_m: float = 0.015
    max_speed_mps: float = 0.05
    open_fraction: float = 0.75
    closed_max_m: float = 0.01
    lift_m: float = 0.05
    lift_ee_within_m: float = 0.13
    joint_moved_fraction: float = 0.2
    reach_handle_m: float = 0.03


@dataclass(frozen=True)
class Goal:
    type: str
    object: str
    dest: str = ""  # support (on), container (in, in_drawer); "" for joint goals

    @property
    def is_joint(self) -> bool:
        return self.type in ("joint_open", "joint_closed")

    def describe(self) -> str:
        if self.type == "on":
            return f"{self.object} on {self.dest}"
        if self.type in ("in", "in_drawer"):
            return f"{self.object} in {self.dest}{' drawer' if self.type == 'in_drawer' else ''}"
        return f"{self.object} drawer {'open' if self.type == 'joint_open' else 'closed'}"


@dataclass(frozen=True)
class Relation:
    type: str
    object: str
    distractor: str
    reference: str = ""
    a: str = ""
    b: str = ""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    family: str
    instruction: str
    objects: tuple[SceneObject, ...]
    goals: tuple[Goal, ...]
    layout: dict[str, tuple[float, float, float]]
    relation: Relation | None = None
    drawer_start_m: float = 0.0
    hard: bool = False
    tolerances: Tolerances = field(default_factory=Tolerances)

    def object(self, name: str) -> SceneObject:
        for obj in self.objects:
            if obj.name == name:
                return obj
        raise TaskError(f"task '{self.name}' has no object '{name}'")

    @property
    def cabinet(self) -> SceneObject | None:
        return next((o for o in self.objects if o.kind == "cabinet"), None)

    def spoken(self, name: str) -> str:
        """How the instruction names an object: 'the red cube', 'the cabinet'."""
        obj = self.object(name)
        return "the cabinet" if obj.kind == "cabinet" else f"the {obj.color} {obj.kind}"

    def success_criteria(self) -> list[str]:
        """What the host checks on the final scene, in words and with the suite's tolerances (for TASK.md)."""
        t, lines = self.tolerances, []
        for goal in self.goals:
            obj = self.spoken(goal.object)
            if goal.type == "on":
                lines.append(
                    f"{obj} rests on {self.spoken(goal.dest)}: its footprint inside the support's top by at least "
                    f"{t.on_xy_margin_m * 1000:.0f} mm, its bottom within {t.on_z_tol_m * 1000:.0f} mm of that top"
                )
            elif goal.type in ("in", "in_drawer"):
                where = "the cabinet's drawer" if goal.type == "in_drawer" else self.spoken(goal.dest)
                lines.append(
                    f"{obj} is inside {where}: its footprint inside the inner footprint by at least "
                    f"{t.in_xy_margin_m * 1000:.0f} mm, resting within {t.in_floor_tol_m * 1000:.0f} mm of the floor"
                )
            elif goal.type == "joint_open":
                lines.append(f"the drawer of {obj} is open by at least {t.open_fraction:.0%} of its travel")
            else:
                lines.append(f"the drawer of {obj} is closed to within {t.closed_max_m * 1000:.0f} mm")
        lines.append(f"the objects named above are at rest (slower than {t.max_speed_mps:.2f} m/s)")
        return lines

    def ladder(self) -> list[str]:
        """Names of the staged sub-goal rungs, in order (CaPtain App. E)."""
        rungs = []
        for goal in self.goals:
            if goal.is_joint:
                verb = "open" if goal.type == "joint_open" else "close"
                rungs += [f"reach {goal.object} handle", f"move {goal.object} drawer", f"{verb} {goal.object} drawer"]
            else:
                rungs += [f"grasp {goal.object}", f"lift {goal.object}", f"place {goal.object}"]
        return rungs


# ------------------------------------------------------------------------------------ loading


def _require(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise TaskError(f"{where}: {msg}")


def _finite(value: Any, where: str, what: str) -> float:
    _require(
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
        where,
        f"{what} must be a finite number, got {value!r}",
    )
    return float(value)


def _tolerances(raw: dict, where: str) -> Tolerances:
    flat = {}
    mapping = {
        ("on_support", "xy_margin_m"): "on_xy_margin_m",
        ("on_support", "z_tol_m"): "on_z_tol_m",
        ("on_support", "max_speed_mps"): "max_speed_mps",
        ("in_container", "xy_margin_m"): "in_xy_margin_m",
        ("in_container", "floor_tol_m"): "in_floor_tol_m",
        ("in_container", "max_speed_mps"): "max_speed_mps",
        ("joint", "open_fraction"): "open_fraction",
        ("joint", "closed_max_m"): "closed_max_m",
        ("ladder", "lift_m"): "lift_m",
        ("ladder", "lift_ee_within_m"): "lift_ee_within_m",
        ("ladder", "joint_moved_fraction"): "joint_moved_fraction",
        ("ladder", "reach_handle_m"): "reach_handle_m",
    }
    for group, values in (raw or {}).items():
        _require(isinstance(values, dict), where, f"tolerances.{group} must be a mapping")
        for key, value in values.items():
            _require((group, key) in mapping, where, f"unknown tolerance '{group}.{key}'")
            v = _finite(value, where, f"tolerance {group}.{key}")
            _require(v >= 0, where, f"tolerance {group}.{key} must be >= 0, got {v}")
            flat[mapping[(group, key)]] = v
    return Tolerances(**flat)


def _object(name: str, raw: Any, where: str) -> SceneObject:
    _require(isinstance(raw, dict), where, f"object '{name}' must be a mapping")
    unknown = set(raw) - {"kind", "color", "size_m", "mass_kg"}
    _require(not unknown, where, f"object '{name}' has unknown keys {sorted(unknown)}")
    size = raw.get("size_m")
    _require(isinstance(size, list) and len(size) == 3, where, f"object '{name}': size_m must be [x, y, z]")
    try:
        return SceneObject(
            name,
            str(raw.get("kind")),
            str(raw.get("color")),
            tuple(_finite(s, where, f"object '{name}' size") for s in size),
            _finite(raw.get("mass_kg", 0.1), where, f"object '{name}' mass_kg"),
        )
    except ValueError as exc:
        raise TaskError(f"{where}: {exc}") from None


def _goal(raw: Any, where: str, objects: dict[str, SceneObject]) -> Goal:
    _require(isinstance(raw, dict), where, "a goal must be a mapping")
    kind = raw.get("type")
    _require(kind in GOAL_TYPES, where, f"goal type must be one of {', '.join(GOAL_TYPES)}, got {kind!r}")
    obj = raw.get("object")
    _require(obj in objects, where, f"goal object {obj!r} is not among the task's objects {sorted(objects)}")
    if kind == "on":
        dest = raw.get("support")
        _require(dest in objects, where, f"support {dest!r} is not among the task's objects")
        _require(objects[dest].kind in SUPPORT_KINDS, where, f"'{dest}' ({objects[dest].kind}) cannot support objects")
    elif kind == "in":
        dest = raw.get("container")
        _require(dest in objects, where, f"container {dest!r} is not among the task's objects")
        _require(objects[dest].kind in CONTAINER_KINDS, where, f"'{dest}' ({objects[dest].kind}) is not a container")
    elif kind == "in_drawer":
        dest = raw.get("container")
        _require(dest in objects and objects[dest].kind == "cabinet", where, f"{dest!r} is not a cabinet")
    else:
        dest = ""
        _require(objects[obj].kind == "cabinet", where, f"joint goals need a cabinet, '{obj}' is a {objects[obj].kind}")
    _require(obj != dest, where, f"goal places '{obj}' on or in itself")
    _require(kind.startswith("joint") or objects[obj].movable, where, f"'{obj}' cannot be moved")
    return Goal(kind, obj, dest)


def _relation(raw: Any, where: str, objects: dict[str, SceneObject]) -> Relation:
    _require(isinstance(raw, dict), where, "relation must be a mapping")
    kind = raw.get("type")
    _require(kind in RELATION_TYPES, where, f"relation type must be one of {', '.join(RELATION_TYPES)}")
    rel = Relation(
        kind,
        raw.get("object", ""),
        raw.get("distractor", ""),
        raw.get("reference", ""),
        raw.get("a", ""),
        raw.get("b", ""),
    )
    needed = [rel.object, rel.distractor] + ([rel.a, rel.b] if kind == "between" else [rel.reference])
    for name in needed:
        _require(name in objects, where, f"relation names {name!r}, which is not among the task's objects")
    target, distractor = objects[rel.object], objects[rel.distractor]
    _require(
        (target.kind, target.color) == (distractor.kind, distractor.color),
        where,
        f"distractor '{rel.distractor}' must look like '{rel.object}' (same kind and colour)",
    )
    return rel


def _task(name: str, raw: Any, catalogue: dict[str, SceneObject], tolerances: Tolerances) -> TaskSpec:
    where = f"task '{name}'"
    _require(isinstance(raw, dict), where, "must be a mapping")
    allowed = {"family", "instruction", "objects", "goals", "layout", "relation", "drawer_start_m", "hard"}
    unknown = set(raw) - allowed
    _require(not unknown, where, f"unknown keys {sorted(unknown)}")
    family = raw.get("family")
    _require(family in FAMILIES, where, f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    instruction = raw.get("instruction")
    _require(isinstance(instruction, str) and instruction.strip(), where, "needs a non-empty instruction")
    names = raw.get("objects")
    _require(isinstance(names, list) and names, where, "needs a non-empty list of objects")
    _require(len(set(names)) == len(names), where, "lists an object twice")
    for n in names:
        _require(n in catalogue, where, f"unknown object {n!r} (the catalogue has {', '.join(sorted(catalogue))})")
    objects = {n: catalogue[n] for n in names}
    _require(sum(o.kind == "cabinet" for o in objects.values()) <= 1, where, "at most one cabinet")
    goals = raw.get("goals")
    _require(isinstance(goals, list) and goals, where, "needs at least one goal")
    parsed_goals = tuple(_goal(g, f"{where} goal {i + 1}", objects) for i, g in enumerate(goals))
    layout_raw = raw.get("layout")
    _require(isinstance(layout_raw, dict), where, "needs a layout mapping object -> [x_m, y_m, yaw_rad]")
    _require(
        set(layout_raw) == set(names),
        where,
        f"layout must place exactly the task's objects; differs by {sorted(set(layout_raw) ^ set(names))}",
    )
    layout = {}
    for n, pose in layout_raw.items():
        _require(isinstance(pose, list) and len(pose) == 3, where, f"layout of '{n}' must be [x_m, y_m, yaw_rad]")
        layout[n] = tuple(_finite(v, where, f"layout of '{n}'") for v in pose)
    relation = _relation(raw["relation"], where, objects) if raw.get("relation") else None
    _require(family != "spatial" or relation is not None, where, "spatial tasks need a relation")
    cabinet = next((o for o in objects.values() if o.kind == "cabinet"), None)
    drawer = _finite(raw.get("drawer_start_m", 0.0), where, "drawer_start_m")
    _require(
        0.0 <= drawer <= (cabinet.drawer_travel_m if cabinet else 0.0),
        where,
        f"drawer_start_m {drawer} is outside the drawer's travel",
    )
    return TaskSpec(
        name,
        family,
        instruction.strip(),
        tuple(objects.values()),
        parsed_goals,
        layout,
        relation,
        drawer,
        bool(raw.get("hard", False)),
        tolerances,
    )


class _StrictBoolLoader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false; `on`, `off`, `yes`, `no` stay strings (goal type `on`)."""


_StrictBoolLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictBoolLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_suite(path: Path | None = None) -> dict[str, TaskSpec]:
    """Parse and validate a task suite file; raise TaskError naming the first problem."""
    path = path or config_path("tasks.yaml")
    try:
        raw = yaml.load(Path(path).read_text(), Loader=_StrictBoolLoader)
    except (OSError, yaml.YAMLError) as exc:
        raise TaskError(f"{path}: cannot read the task suite: {exc}") from None
    where = str(path)
    _require(isinstance(raw, dict), where, "must be a mapping with 'objects' and 'tasks'")
    tolerances = _tolerances(raw.get("tolerances", {}), where)
    objects_raw = raw.get("objects")
    _require(isinstance(objects_raw, dict) and objects_raw, where, "needs an 'objects' catalogue")
    catalogue = {n: _object(n, o, f"{where}: objects") for n, o in objects_raw.items()}
    tasks_raw = raw.get("tasks")
    _require(isinstance(tasks_raw, dict) and tasks_raw, where, "needs a 'tasks' mapping")
    return {n: _task(n, t, catalogue, tolerances) for n, t in tasks_raw.items()}


@cache
def default_suite() -> dict[str, TaskSpec]:
    return load_suite()


def get_task(name: str, suite: dict[str, TaskSpec] | None = None) -> TaskSpec:
    suite = suite if suite is not None else default_suite()
    if not isinstance(name, str) or name not in suite:
        raise TaskError(f"unknown task {name!r}; known tasks: {', '.join(sorted(suite))}")
    return suite[name]


# ---------------------------------------------------------------------------------- predicates


def _inside_footprint(
    reader: SceneReader, obj: str, dest: SceneObject, margin_m: float, round_r_m: float | None
) -> bool:
    local = reader.in_object_frame(dest.name, reader.position(obj))
    if round_r_m is not None:
        return math.hypot(local[0], local[1]) <= round_r_m - margin_m
    return abs(local[0]) <= dest.size_m[0] / 2 - margin_m and abs(local[1]) <= dest.size_m[1] / 2 - margin_m


def _settled(reader: SceneReader, obj: str, tol: Tolerances) -> bool:
    return reader.speed(obj) <= tol.max_speed_mps and not reader.held(obj)


def goal_satisfied(task: TaskSpec, goal: Goal, reader: SceneReader) -> bool:
    tol = task.tolerances
    if goal.type == "joint_open":
        cab = task.object(goal.object)
        return reader.drawer_position(goal.object) >= tol.open_fraction * cab.drawer_travel_m
    if goal.type == "joint_closed":
        return reader.drawer_position(goal.object) <= tol.closed_max_m
    if goal.type == "in_drawer":
        return reader.in_drawer(goal.object, goal.dest, tol.in_floor_tol_m) and _settled(reader, goal.object, tol)
    dest = task.object(goal.dest)
    bottom = reader.bottom_z(goal.object)
    base_z = reader.position(dest.name)[2]
    if goal.type == "on":
        round_r = dest.size_m[0] / 2 - dest.wall_m if dest.kind == "plate" else None
        top = base_z + reader.resting_height(dest)
        return (
            _inside_footprint(reader, goal.object, dest, tol.on_xy_margin_m, round_r)
            and abs(bottom - top) <= tol.on_z_tol_m
            and _settled(reader, goal.object, tol)
        )
    # in: within the container's inner footprint, below its rim, not below its floor
    if dest.kind == "box":
        inner = SceneObject(
            dest.name,
            dest.kind,
            dest.color,
            (dest.size_m[0] - 2 * dest.wall_m, dest.size_m[1] - 2 * dest.wall_m, dest.size_m[2]),
        )
        inside = _inside_footprint(reader, goal.object, inner, tol.in_xy_margin_m, None)
    else:
        ratio = 0.78 if dest.kind == "bowl" else 1.0
        inside = _inside_footprint(
            reader, goal.object, dest, tol.in_xy_margin_m, dest.size_m[0] / 2 * ratio - dest.wall_m
        )
    return (
        inside
        and base_z - tol.in_floor_tol_m <= bottom <= base_z + dest.size_m[2]
        and _settled(reader, goal.object, tol)
    )


def goals_status(task: TaskSpec, reader: SceneReader) -> list[bool]:
    return [goal_satisfied(task, g, reader) for g in task.goals]


def success(task: TaskSpec, reader: SceneReader) -> bool:
    """Host success: every goal holds on this state."""
    return all(goals_status(task, reader))


def rungs_now(task: TaskSpec, reader: SceneReader, start: dict[str, Any]) -> list[bool]:
    """Which ladder rungs hold on this state (the ladder itself is monotone: see LadderTracker)."""
    tol = task.tolerances
    out = []
    for goal in task.goals:
        if goal.is_joint:
            cab = task.object(goal.object)
            q, q0 = reader.drawer_position(goal.object), start["drawer_m"]
            q_goal = cab.drawer_travel_m if goal.type == "joint_open" else 0.0
            initial = abs(q_goal - q0)
            moved = initial > 0 and (abs(q - q0) >= tol.joint_moved_fraction * initial and abs(q_goal - q) < initial)
            out += [reader.tcp_to_handle(goal.object) <= tol.reach_handle_m, moved, goal_satisfied(task, goal, reader)]
        else:
            grasped = reader.held(goal.object)
            lifted = (
                reader.position(goal.object)[2] - start["positions"][goal.object][2] >= tol.lift_m
                and float(np.linalg.norm(reader.tcp_position() - reader.position(goal.object))) <= tol.lift_ee_within_m
            )
            out += [grasped, lifted, goal_satisfied(task, goal, reader)]
    return out


def rungs_held_at_end(task: TaskSpec) -> list[bool]:
    """Which ladder rungs must still hold on the final state to earn the staged reward (CaPtain App. A.2: "place
    rungs and rungs for moving an object toward its goal must still hold at the end"): an object goal's place rung,
    a joint goal's move and open/close rungs. Grasp, lift and reach rungs count once reached."""
    out = []
    for goal in task.goals:
        out += [False, True, True] if goal.is_joint else [False, False, True]
    return out


def credited_rungs(reached: list[bool], holds_now: list[bool], must_hold: list[bool]) -> int:
    """d of the staged reward 0.15 d / (n + 1): the leading rungs that were reached (the monotone ladder) and, where
    they must hold at the end, hold on the final state. The count stops at the first rung that fails either: a
    block placed and knocked off again earns its grasp and lift, not its place nor anything after it."""
    if not len(reached) == len(holds_now) == len(must_hold):
        raise ValueError(f"ladder lengths differ: {len(reached)}, {len(holds_now)}, {len(must_hold)}")
    d = 0
    for was, now, hold in zip(reached, holds_now, must_hold, strict=True):
        if not was or (hold and not now):
            break
        d += 1
    return d


class LadderTracker:
    """One-shot, monotone staged sub-goal ladder: rung d counts once rungs 1..d have been reached."""

    def __init__(self, task: TaskSpec):
        self.names = task.ladder()
        self.reached = [False] * len(self.names)

    def update(self, now: list[bool]) -> list[str]:
        for i, ok in enumerate(now):
            if ok and (i == 0 or self.reached[i - 1]):
                self.reached[i] = True
        return [n for n, r in zip(self.names, self.reached, strict=True) if r]

"""MoveIt 2's planning scene as a second opinion on every sweep, without ROS: what to ask and how to judge the answers.

With `use_moveit:=true` the motion node asks move_group, before a planned sweep runs, whether each sampled joint
configuration of the sweep is valid in MoveIt's planning scene (`/check_state_validity`, moveit_msgs
`GetStateValidity`: collisions with the world and the robot itself, as move_group's state_validation_service
capability checks them; not joint limits, which the planner checks). The sweep's own joint path is
checked, not a path MoveIt would re-plan, so what was checked is what runs. Any invalid state refuses the whole
sweep, naming the colliding pair and where along the sweep (a guarded sweep's gripper may touch a measured object:
`touch_rule`, the same rule on both ROS sides); a move_group that does not answer refuses it too
(fail closed): `SceneCheckError`.

Objects that perception measured (`measure_object_geometry`: centre, extents and yaw of a fitted box or cylinder) go
into the scene as collision boxes (`SceneObjects`), and out of it once their measurement is stale: the perception
store's scene version moved on (something physical happened since) or the object was measured anew.

The ROS side is `captain_ros.ros.move_group_scene` (move_group's services) or `captain_ros.ros.moveit_py_scene`
(moveit-py in the motion node's process), as the profile's `interfaces.moveit.api` chooses (`choose_api`); this module
is what both and the tests share.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_MAX_STATES = 64  # sampled configurations per sweep (its ends always among them)


class SceneCheckError(RuntimeError):
    """The planning-scene check could not be made (move_group absent, slow or failing): the sweep is refused."""


def choose_api(setting: str, moveit_py_importable: bool) -> str:
    """interfaces.moveit.api -> what the motion node uses: "moveit_py" or "services". "auto" takes moveit_py where
    `moveit.planning.MoveItPy` imports, move_group's services otherwise; "moveit_py" where it does not import is a
    SceneCheckError (configure fails naming it)."""
    if setting == "services" or (setting == "auto" and not moveit_py_importable):
        return "services"
    if setting not in ("auto", "moveit_py"):
        raise SceneCheckError(f"interfaces.moveit.api '{setting}' is not auto, moveit_py or services")
    if not moveit_py_importable:
        raise SceneCheckError(
            "interfaces.moveit.api is moveit_py, but moveit.planning.MoveItPy does not import here (install "
            "ros-<distro>-moveit-py and source its workspace, or set api: services)"
        )
    return "moveit_py"


def sample_indices(n_waypoints: int, max_states: int = DEFAULT_MAX_STATES) -> list[int]:
    """Which of a sweep's `n_waypoints` joint waypoints to check: all of them up to `max_states`, else
    `max_states` evenly spread ones, the first and last always included."""
    if n_waypoints <= 0:
        return []
    if n_waypoints <= max_states:
        return list(range(n_waypoints))
    picks = np.linspace(0, n_waypoints - 1, max(2, max_states)).round().astype(int)
    return sorted({int(i) for i in picks})


@dataclass(frozen=True)
class StateVerdict:
    """move_group's answer for one sampled configuration."""

    index: int  # the waypoint's index in the sweep
    valid: bool
    contacts: tuple[tuple[str, str], ...] = ()  # (body, body) pairs in contact, as MoveIt names them


def judge(verdicts: list[StateVerdict], n_waypoints: int, may_touch: Callable[[str, str], bool] | None = None) -> str:
    """'' when every sampled configuration is valid, else the refusal: the first invalid one, what collides there
    and how far along the sweep it is. A configuration whose every contact `may_touch` allows counts as valid (a
    guarded sweep's gripper reaching a measured object: the force guard stops it at the touch)."""

    def refused(v: StateVerdict) -> StateVerdict | None:
        if v.valid:
            return None
        kept = tuple(c for c in v.contacts if may_touch is None or not may_touch(*c))
        return StateVerdict(v.index, False, kept) if kept or not v.contacts else None

    bad = [b for v in sorted(verdicts, key=lambda v: v.index) if (b := refused(v)) is not None]
    if not bad:
        return ""
    first = bad[0]
    where = 100.0 * first.index / max(n_waypoints - 1, 1)
    what = (
        f"{first.contacts[0][0]} collides with {first.contacts[0][1]}"
        if first.contacts
        else "the configuration is invalid (no contact reported: a path constraint)"
    )
    more = f"; {len(bad) - 1} more of {len(verdicts)} checked states invalid" if len(bad) > 1 else ""
    return f"MoveIt planning scene: {what} at {where:.0f}% of the sweep{more}"


def joint_path(names: list[str], points: list[list[float]], arm_joints: tuple[str, ...]) -> np.ndarray:
    """A planned trajectory's positions (its joint order) -> (M, n) in `arm_joints`' order; ValueError when an arm
    joint is missing or a point is short."""
    missing = [j for j in arm_joints if j not in names]
    if missing:
        raise ValueError(f"the planned trajectory has no {', '.join(missing)}")
    columns = [names.index(j) for j in arm_joints]
    if not points or any(len(p) < len(names) for p in points):
        raise ValueError("the planned trajectory has no points, or points without every joint's position")
    return np.array([[float(p[c]) for c in columns] for p in points])


def links_below(urdf_text: str, link: str) -> frozenset[str]:
    """`link` and every link below it in the URDF (the hand: its fingers and pads)."""
    children: dict[str, list[str]] = {}
    for joint in ET.fromstring(urdf_text).iter("joint"):
        children.setdefault(joint.find("parent").get("link"), []).append(joint.find("child").get("link"))
    out, todo = set(), [link]
    while todo:
        name = todo.pop()
        out.add(name)
        todo.extend(children.get(name, []))
    return frozenset(out)


@dataclass(frozen=True)
class TouchRule:
    """The contacts a guarded sweep may make: a gripper link with one of the measured objects (what the robot is
    there to grasp or push; the force guard stops the sweep at the touch). The arm's other links touching them,
    and anything touching what the integrator put in MoveIt's scene (table, fixtures), still refuse the sweep.

    One rule, used two ways: called with a contact pair `(a, b)` it says whether that contact may happen (judge
    filters the contacts move_group names: ros/move_group_scene.py); `pairs()` lists every allowed (link, object) pair,
    which moveit-py's check allows in a copy of the scene's AllowedCollisionMatrix (ros/moveit_py_scene.py)."""

    gripper_links: frozenset[str]
    objects: frozenset[str]

    def __call__(self, a: str, b: str) -> bool:
        return (a in self.gripper_links and b in self.objects) or (b in self.gripper_links and a in self.objects)

    def pairs(self) -> list[tuple[str, str]]:
        """Every (gripper link, measured object) pair the rule allows, sorted."""
        return [(link, obj) for link in sorted(self.gripper_links) for obj in sorted(self.objects)]


def touch_rule(gripper_links: frozenset[str], objects: frozenset[str]) -> TouchRule:
    """The touch rule of a guarded sweep (TouchRule): `gripper_links` (links_below the hand) may touch `objects`
    (the ids of the measured objects in the scene)."""
    return TouchRule(frozenset(gripper_links), frozenset(objects))


@dataclass(frozen=True)
class SceneBox:
    """A measured object as a collision box in the base frame."""

    id: str
    center_m: tuple[float, float, float]
    extents_m: tuple[float, float, float]  # x (long side), y, z before the yaw
    yaw_rad: float

    def quaternion_xyzw(self) -> tuple[float, float, float, float]:
        return (0.0, 0.0, math.sin(self.yaw_rad / 2), math.cos(self.yaw_rad / 2))

    def contains(self, point_m: np.ndarray, margin_m: float = 0.0) -> bool:
        """Whether `point_m` lies within `margin_m` of the box (a sphere of that radius touches it)."""
        d = np.asarray(point_m, dtype=float) - np.asarray(self.center_m)
        c, s = math.cos(-self.yaw_rad), math.sin(-self.yaw_rad)
        local = np.array([c * d[0] - s * d[1], s * d[0] + c * d[1], d[2]])
        outside = np.maximum(np.abs(local) - np.asarray(self.extents_m) / 2, 0.0)
        return float(np.linalg.norm(outside)) <= margin_m


def box_from_measurement(object_id: str, value: dict[str, Any], padding_m: float = 0.0) -> SceneBox:
    """measure_object_geometry's result value (centre, extents, yaw; a cylinder as its bounding box) -> SceneBox,
    each extent grown by 2 * padding_m."""
    center = tuple(float(v) for v in value["center_m"])
    extents = tuple(max(float(v), 0.0) + 2 * padding_m for v in value["extents_m"])
    if len(center) != 3 or len(extents) != 3:
        raise ValueError(f"{object_id}: a measurement needs 3 centre and 3 extent values")
    return SceneBox(object_id, center, extents, math.radians(float(value.get("yaw_deg", 0.0))))


class SceneObjects:
    """Which measured objects the planning scene should hold. `measured` records a measurement at the perception
    store's scene version; `update(scene_version)` says what to add (new or re-measured) and what to remove (stale:
    measured at an older scene version). The caller applies both and then calls `applied`."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[SceneBox, int]] = {}  # measured, not yet in the scene
        self.in_scene: dict[str, tuple[SceneBox, int]] = {}

    def measured(self, box: SceneBox, scene_version: int) -> None:
        self._pending[box.id] = (box, scene_version)

    def update(self, scene_version: int) -> tuple[list[SceneBox], list[str]]:
        add = [box for box, version in self._pending.values() if version == scene_version]
        again = {box.id for box in add}  # re-measured: MoveIt's ADD replaces an object of the same id
        remove = [oid for oid, (_, version) in self.in_scene.items() if version != scene_version and oid not in again]
        return add, remove

    def applied(self, add: list[SceneBox], remove: list[str], scene_version: int) -> None:
        for oid in remove:
            self.in_scene.pop(oid, None)
        for box in add:
            self.in_scene[box.id] = (box, scene_version)
        self._pending = {k: v for k, v in self._pending.items() if v[1] == scene_version and k not in self.in_scene}

    def clear(self) -> list[str]:
        """Forget everything (a new episode); returns the ids to remove from the scene."""
        ids = list(self.in_scene)
        self._pending.clear()
        self.in_scene.clear()
        return ids

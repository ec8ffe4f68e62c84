"""Start states with stable ids, reproducible bit-exactly from the id, and a declared split.

An id is `<task>/<kind>/<index>`:
  wide/<0..9999999>   wide-layout randomization: object poses over the whole workspace, lighting,
                      head-camera placement and colours, all drawn from a generator seeded by
                      the SHA-256 of the id;
  official/<0..49>    the task's nominal layout with centimetre noise (LIBERO-style official starts).
Both kinds also draw each camera's hand-eye calibration error (`calibration_errors`): the robot knows
the calibrated camera pose (the URDF's, moved by the wide layout's head-camera placement), the rendered
camera sits a few millimetres and tenths of a degree away from it, as a real calibrated camera does.
Split: official 11..16 and every wide index ending in 9 are held out for evaluation; training
tools ask with split "train" and are refused those ids.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from captain_ros.twin.objects import COLORS
from captain_ros.twin.tasks import TaskError, TaskSpec, get_task

KINDS = {"wide": 10_000_000, "official": 50}
OFFICIAL_EVAL = range(11, 17)
SPLITS = ("train", "eval", "any")
WORKSPACE_X_M = (0.32, 0.72)
WORKSPACE_Y_M = (-0.36, 0.36)
TABLE_COLORS = [(0.62, 0.50, 0.38), (0.55, 0.42, 0.30), (0.70, 0.62, 0.50), (0.50, 0.50, 0.52)]
# Residual hand-eye / extrinsic calibration error per camera: (translation m, rotation deg), each a
# uniform magnitude in [lo, hi] about a uniformly random axis, so the error is never zero and bounded.
# Published RGB-D calibrations on cobots reach 0.93 mm / 0.27 deg (eye-in-hand, structured light,
# arXiv:2311.01335) and 0.28 mm / 0.25 deg (industrial scanner, arXiv:2407.16041); vendors expect
# sub-millimetre to millimetre residuals and sub-degree rotation (Zivid's hand-eye guide). A consumer
# RGB-D camera calibrated on a marker does worse, more so at the head camera's 1 m range: head 1-4 mm
# and 0.1-0.5 deg (eye-to-hand), wrist 0.5-2 mm and 0.1-0.4 deg (eye-in-hand, close to its target).
CALIBRATION_ERROR_RANGES = {
    "head": ((0.001, 0.004), (0.1, 0.5)),
    "wrist": ((0.0005, 0.002), (0.1, 0.4)),
}


class SplitError(TaskError):
    """A tool asked for a start id outside the split it may draw from."""


@dataclass(frozen=True)
class StartId:
    task: str
    kind: str
    index: int

    def __str__(self) -> str:
        return f"{self.task}/{self.kind}/{self.index}"

    @property
    def split(self) -> str:
        if self.kind == "official":
            return "eval" if self.index in OFFICIAL_EVAL else "train"
        return "eval" if self.index % 10 == 9 else "train"

    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(str(self).encode()).digest()[:8], "little")

    @classmethod
    def parse(cls, text: str, known_tasks: dict[str, TaskSpec] | None = None) -> StartId:
        if not isinstance(text, str):
            raise TaskError(f"start id must be a string like 'open_drawer/wide/42', got {type(text).__name__}")
        parts = text.split("/")
        if len(parts) != 3:
            raise TaskError(f"start id {text!r} must look like '<task>/<wide|official>/<index>'")
        task, kind, index = parts
        get_task(task, known_tasks)
        if kind not in KINDS:
            raise TaskError(f"start id {text!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not index.isdigit() or (len(index) > 1 and index.startswith("0")):
            raise TaskError(f"start id {text!r}: index must be a non-negative integer without leading zeros")
        if int(index) >= KINDS[kind]:
            raise TaskError(f"start id {text!r}: {kind} indices go from 0 to {KINDS[kind] - 1}")
        return cls(task, kind, int(index))


def check_split(start: StartId, requester_split: str) -> None:
    if requester_split not in SPLITS:
        raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {requester_split!r}")
    if requester_split not in ("any", start.split):
        raise SplitError(
            f"start id '{start}' belongs to the {start.split} split; a {requester_split} tool may not "
            f"use it" + (" (evaluation ids are held out from training)" if start.split == "eval" else "")
        )


def sample_start_id(task: str, split: str, rng: np.random.Generator, kind: str = "wide") -> StartId:
    """Draw an id of `kind` from `split` (never an evaluation id for split 'train')."""
    if split not in SPLITS:
        raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if kind not in KINDS:
        raise TaskError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    get_task(task)
    while True:
        candidate = StartId(task, kind, int(rng.integers(KINDS[kind])))
        if split in ("any", candidate.split):
            return candidate


@dataclass(frozen=True)
class CalibrationError:
    """Where a camera really is relative to its calibrated pose: a rigid motion expressed in the
    calibrated optical frame (translate by `offset_m`, rotate by `rotvec_rad`). Known only to the
    renderer and to evaluation code; perception is given the calibrated pose."""

    offset_m: tuple[float, float, float]
    rotvec_rad: tuple[float, float, float]

    @property
    def translation_m(self) -> float:
        return float(np.linalg.norm(self.offset_m))

    @property
    def rotation_deg(self) -> float:
        return math.degrees(float(np.linalg.norm(self.rotvec_rad)))


def _random_vector(rng: np.random.Generator, lo: float, hi: float) -> tuple[float, float, float]:
    axis = rng.normal(size=3)
    return tuple(float(x) for x in axis / np.linalg.norm(axis) * rng.uniform(lo, hi))


def calibration_errors(start: StartId) -> dict[str, CalibrationError]:
    """Each camera's calibration error, bit-exact from the id (its own generator, so the rest of the
    layout does not depend on it). Official starts have one too: a real camera is never calibrated exactly."""
    digest = hashlib.sha256(f"{start}#calibration".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:8], "little")))
    return {
        camera: CalibrationError(_random_vector(rng, *t_m), _random_vector(rng, *np.radians(r_deg)))
        for camera, (t_m, r_deg) in CALIBRATION_ERROR_RANGES.items()
    }


@dataclass(frozen=True)
class Layout:
    """Everything a start id determines about the scene."""

    poses: dict[str, tuple[float, float, float]]  # object -> (x_m, y_m, yaw_rad)
    drawer_m: float
    key_light_dir: tuple[float, float, float]
    key_light_diffuse: float
    fill_light_diffuse: float
    # the head camera's calibrated placement: offset (m, in the URDF's optical frame) and rotation from the
    # URDF pose; wide layouts move the camera (then calibrate it), official ones keep the URDF pose
    head_camera_offset_m: tuple[float, float, float]
    head_camera_rotvec_rad: tuple[float, float, float]
    object_rgb: dict[str, tuple[float, float, float]]
    table_rgb: tuple[float, float, float]
    calibration_error: dict[str, CalibrationError]  # camera -> true pose relative to the calibrated one


def make_layout(task: TaskSpec, start: StartId) -> Layout:
    rng = np.random.Generator(np.random.PCG64(start.seed()))
    if start.kind == "official":
        poses = {}
        for name, (x, y, yaw) in task.layout.items():
            if task.object(name).movable:
                poses[name] = (
                    x + rng.uniform(-0.015, 0.015),
                    y + rng.uniform(-0.015, 0.015),
                    yaw + rng.uniform(-0.1, 0.1),
                )
            else:
                poses[name] = (x, y, yaw)
        return Layout(
            poses,
            task.drawer_start_m,
            (0.0, 0.15, -1.0),
            0.6,
            0.25,
            (0.0, 0.0, 0.0),
            (0.0, 0.0, 0.0),
            {o.name: COLORS[o.color] for o in task.objects},
            TABLE_COLORS[0],
            calibration_errors(start),
        )
    poses = _wide_poses(task, rng)
    key_dir = (rng.uniform(-0.35, 0.35), rng.uniform(-0.35, 0.35), -1.0)
    cam_offset = tuple(rng.uniform(-0.02, 0.02, 3))
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    rotvec = tuple(axis * math.radians(rng.uniform(0.0, 2.0)))
    # brightness changes a lot, hue barely: a red cube stays red
    object_rgb = {
        o.name: tuple(np.clip(np.array(COLORS[o.color]) * rng.uniform(0.8, 1.15) + rng.uniform(-0.02, 0.02, 3), 0, 1))
        for o in task.objects
    }
    drawer = task.drawer_start_m
    if drawer > 0:
        drawer = float(np.clip(drawer + rng.uniform(-0.02, 0.01), 0.0, task.cabinet.drawer_travel_m))
    return Layout(
        poses,
        drawer,
        key_dir,
        rng.uniform(0.45, 0.75),
        rng.uniform(0.15, 0.35),
        cam_offset,
        rotvec,
        object_rgb,
        TABLE_COLORS[int(rng.integers(len(TABLE_COLORS)))],
        calibration_errors(start),
    )


def _wide_poses(task: TaskSpec, rng: np.random.Generator) -> dict[str, tuple[float, float, float]]:
    """Rejection-sample a collision-free layout over the workspace that respects the task's relation."""
    for _ in range(2000):
        poses: dict[str, tuple[float, float, float]] = {}
        cabinet = task.cabinet
        if cabinet is not None:
            x, y, yaw = task.layout[cabinet.name]
            poses[cabinet.name] = (x + rng.uniform(-0.06, 0.06), y + rng.uniform(-0.03, 0.02), yaw)
        order = [o for o in task.objects if o.movable]
        rel = task.relation
        if rel is not None:  # place the relation's anchors first, then the target where the relation holds
            anchors = [rel.a, rel.b] if rel.type == "between" else [rel.reference]
            order.sort(key=lambda o: (o.name not in anchors, o.name in (rel.object, rel.distractor)))
        ok = True
        for obj in order:
            pose = _place(task, obj.name, poses, rng)
            if pose is None:
                ok = False
                break
            poses[obj.name] = pose
        if ok and (rel is None or relation_holds(task, poses)):
            return poses
    raise TaskError(
        f"task '{task.name}': could not sample a layout that fits the workspace (too many or too large objects?)"
    )


def _clear(task: TaskSpec, name: str, x: float, y: float, poses: dict) -> bool:
    r = task.object(name).footprint_radius_m
    for other, (ox, oy, oyaw) in poses.items():
        o = task.object(other)
        if o.kind == "cabinet":
            # keep out of the cabinet and of the drawer's path (the drawer opens along the cabinet's -x)
            c, s = math.cos(oyaw), math.sin(oyaw)
            lx, ly = c * (x - ox) + s * (y - oy), -s * (x - ox) + c * (y - oy)
            sx, sy = o.size_m[0], o.size_m[1]
            if -sx / 2 - o.drawer_travel_m - r - 0.05 < lx < sx / 2 + r + 0.03 and abs(ly) < sy / 2 + r + 0.03:
                return False
        elif math.hypot(x - ox, y - oy) < r + o.footprint_radius_m + 0.02:
            return False
    return True


def _place(task: TaskSpec, name: str, poses: dict, rng: np.random.Generator) -> tuple[float, float, float] | None:
    rel = task.relation
    for _ in range(200):
        yaw = rng.uniform(-math.pi, math.pi)
        if rel is not None and name == rel.object and rel.type == "between":
            ax, ay, _ = poses[rel.a]
            bx, by, _ = poses[rel.b]
            s = rng.uniform(0.4, 0.6)
            x, y = ax + s * (bx - ax) + rng.uniform(-0.015, 0.015), ay + s * (by - ay) + rng.uniform(-0.015, 0.015)
        else:
            x, y = rng.uniform(*WORKSPACE_X_M), rng.uniform(*WORKSPACE_Y_M)
        if _clear(task, name, x, y, poses):
            return (x, y, yaw)
    return None


def relation_holds(task: TaskSpec, poses: dict[str, tuple[float, float, float]]) -> bool:
    """Whether the layout makes the instruction's relation pick out exactly the target."""
    rel = task.relation
    t = np.array(poses[rel.object][:2])
    d = np.array(poses[rel.distractor][:2])
    if rel.type == "between":
        a, b = np.array(poses[rel.a][:2]), np.array(poses[rel.b][:2])

        def between(p: np.ndarray) -> float:
            ab = b - a
            s = float(np.dot(p - a, ab) / np.dot(ab, ab))
            return float(np.linalg.norm(p - (a + np.clip(s, 0, 1) * ab))) if 0.15 < s < 0.85 else math.inf

        return between(t) < 0.04 and between(d) > 0.12 and float(np.linalg.norm(b - a)) > 0.3
    ref = np.array(poses[rel.reference][:2])
    if rel.type == "left_of":  # the robot's left is +y
        return t[1] > ref[1] + 0.08 and d[1] < ref[1] - 0.08
    # nearest
    return float(np.linalg.norm(d - ref)) - float(np.linalg.norm(t - ref)) > 0.1

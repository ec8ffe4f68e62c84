"""What the twin and the harness need to know about the robot, read from the URDF.

The URDF (urdf/panda.urdf) is the single source of truth; nothing here restates its numbers.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from captain_ros.paths import urdf_path

URDF_FILE = "panda.urdf"
ARM_JOINTS = tuple(f"panda_joint{i}" for i in range(1, 8))
FINGER_JOINTS = ("panda_finger_joint1", "panda_finger_joint2")
BASE_FRAME = "panda_link0"
TCP_FRAME = "panda_tcp"
HAND_FRAME = "panda_hand"
CAMERA_FRAMES = {"head": "head_camera_optical_frame", "wrist": "wrist_camera_optical_frame"}
# A folded, top-down ready pose inside the joint limits (the usual Panda "ready" configuration).
HOME_Q_RAD = np.array([0.0, -math.pi / 4, 0.0, -3 * math.pi / 4, 0.0, math.pi / 2, math.pi / 4])


@dataclass(frozen=True)
class JointLimits:
    name: str
    lower: float
    upper: float
    velocity: float
    effort: float


@cache
def description_path() -> Path:
    return urdf_path(URDF_FILE)


@cache
def joint_limits() -> dict[str, JointLimits]:
    """Limits of every non-fixed joint of the URDF, by joint name."""
    root = ET.parse(description_path()).getroot()
    limits = {}
    for joint in root.iter("joint"):
        if joint.get("type") == "fixed":
            continue
        lim = joint.find("limit")
        limits[joint.get("name")] = JointLimits(
            joint.get("name"),
            float(lim.get("lower")),
            float(lim.get("upper")),
            float(lim.get("velocity")),
            float(lim.get("effort")),
        )
    return limits


@dataclass(frozen=True)
class GripperGeometry:
    """Gripper dimensions along the hand axis (z) and the finger pad box, read from the URDF."""

    tcp_from_flange_m: float
    fingertips_below_tcp_m: float
    finger_pad_size_m: tuple[float, float, float]


def _origin_xyz(element: ET.Element | None) -> np.ndarray:
    origin = None if element is None else element.find("origin")
    return np.zeros(3) if origin is None else np.array([float(v) for v in origin.get("xyz", "0 0 0").split()])


@cache
def gripper_geometry() -> GripperGeometry:
    root = ET.parse(description_path()).getroot()
    joints = {j.get("name"): j for j in root.iter("joint")}
    links = {link.get("name"): link for link in root.iter("link")}
    tcp_z = float(_origin_xyz(joints["panda_tcp_joint"])[2])
    finger_z = float(_origin_xyz(joints[FINGER_JOINTS[0]])[2])
    collision = links["panda_leftfinger"].find("collision")
    box = [float(v) for v in collision.find("geometry/box").get("size").split()]
    tip_z = finger_z + float(_origin_xyz(collision)[2]) + box[2] / 2
    return GripperGeometry(tcp_z, tip_z - tcp_z, (box[0], box[1], box[2]))


def arm_limits_rad() -> tuple[np.ndarray, np.ndarray]:
    lim = joint_limits()
    return np.array([lim[j].lower for j in ARM_JOINTS]), np.array([lim[j].upper for j in ARM_JOINTS])


def max_jaw_opening_m() -> float:
    """Finger gap when fully open: both fingers at their upper limit."""
    lim = joint_limits()
    return lim[FINGER_JOINTS[0]].upper + lim[FINGER_JOINTS[1]].upper

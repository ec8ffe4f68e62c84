"""Validation of policy-supplied arguments. Every function raises ArgumentError with a message
that names the argument and says what was wrong; nothing downstream sees unchecked input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from captain_ros.core.contract import CallFailure, FailureCategory
from captain_ros.core.kinematics import top_down_rotation


class ArgumentError(CallFailure, ValueError):
    """Bad input from the policy: failure category invalid_argument; nothing moves."""

    def __init__(self, message: str):
        super().__init__(FailureCategory.INVALID_ARGUMENT, message)


def number(name: str, value: Any, *, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ArgumentError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an integer beyond any float (JSON allows any number of digits)
        raise ArgumentError(f"{name} must be finite, got an integer of {int(value).bit_length()} bits") from None
    if not math.isfinite(v):
        raise ArgumentError(f"{name} must be finite, got {v}")
    if lo is not None and v < lo:
        raise ArgumentError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ArgumentError(f"{name} must be <= {hi}, got {v}")
    return v


def integer(name: str, value: Any, *, lo: int, hi: int) -> int:
    v = number(name, value)
    if v != int(v):
        raise ArgumentError(f"{name} must be a whole number, got {value!r}")
    return int(number(name, v, lo=lo, hi=hi))


def vector(name: str, value: Any, n: int) -> np.ndarray:
    if isinstance(value, str | bytes | dict) or not hasattr(value, "__len__"):
        raise ArgumentError(f"{name} must be a list of {n} numbers, got {type(value).__name__}")
    if len(value) != n:
        raise ArgumentError(f"{name} must have {n} numbers, got {len(value)}")
    return np.array([number(f"{name}[{i}]", v) for i, v in enumerate(value)])


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ArgumentError(f"{name} must be one of {', '.join(repr(o) for o in options)}, got {value!r}")
    return value


def quaternion_xyzw(name: str, value: Any) -> np.ndarray:
    q = vector(name, value, 4)
    norm = float(np.linalg.norm(q))
    if abs(norm - 1.0) > 1e-3:
        raise ArgumentError(f"{name} must be a unit quaternion [x, y, z, w]; its norm is {norm:.4f}")
    return q / norm


POSE_HELP = (
    "a pose is {'position': [x, y, z] (m, base frame), and one of 'quaternion': [x, y, z, w], "
    "'rpy_deg': [roll, pitch, yaw], 'yaw_deg': yaw (fingers pointing down)}, or [x, y, z, qx, qy, qz, qw]"
)


def pose(name: str, value: Any) -> tuple[np.ndarray, np.ndarray]:
    """(position (3,), rotation (3, 3)) from the pose forms the policy may use."""
    if isinstance(value, dict):
        unknown = set(value) - {"position", "quaternion", "rpy_deg", "yaw_deg"}
        if unknown:
            raise ArgumentError(f"{name} has unknown keys {sorted(unknown)}; {POSE_HELP}")
        if "position" not in value:
            raise ArgumentError(f"{name} needs 'position'; {POSE_HELP}")
        position = vector(f"{name}.position", value["position"], 3)
        given = [k for k in ("quaternion", "rpy_deg", "yaw_deg") if k in value]
        if len(given) != 1:
            raise ArgumentError(
                f"{name} needs exactly one of 'quaternion', 'rpy_deg', 'yaw_deg'; got {given or 'none'}"
            )
        key = given[0]
        if key == "quaternion":
            rotation = Rotation.from_quat(quaternion_xyzw(f"{name}.quaternion", value[key])).as_matrix()
        elif key == "rpy_deg":
            rotation = Rotation.from_euler("xyz", vector(f"{name}.rpy_deg", value[key], 3), degrees=True).as_matrix()
        else:
            rotation = top_down_rotation(math.radians(number(f"{name}.yaw_deg", value[key])))
        return position, rotation
    flat = (
        vector(name, value, 7) if hasattr(value, "__len__") and not isinstance(value, str) and len(value) == 7 else None
    )
    if flat is None:
        raise ArgumentError(f"{name} is not a pose; {POSE_HELP}")
    return flat[:3], Rotation.from_quat(quaternion_xyzw(f"{name}[3:7]", flat[3:])).as_matrix()


def pose_dict(position: np.ndarray, rotation: np.ndarray) -> dict[str, Any]:
    """The pose form results use: position, quaternion [x, y, z, w], and yaw of the fingers' x axis."""
    quat = Rotation.from_matrix(rotation).as_quat()
    return {
        "position": [round(float(v), 5) for v in position],
        "quaternion": [round(float(v), 5) for v in quat],
        "yaw_deg": round(math.degrees(math.atan2(rotation[1, 0], rotation[0, 0])), 2),
    }


def no_extra(name: str, kwargs: dict[str, Any], allowed: set[str]) -> None:
    extra = set(kwargs) - allowed
    if extra:
        takes = ", ".join(sorted(allowed)) or "no arguments"
        raise ArgumentError(f"{name}() got unexpected arguments {sorted(extra)}; it takes {takes}")

"""The cameras' hand-eye calibration a real arm's launch publishes: one file per robot profile.

`config/camera_calibration/<profile>.yaml` holds, per camera, its optical frame (`child_frame`) in a frame of the
arm (`parent_frame`), as a translation in metres and a unit quaternion [x, y, z, w]. real_arm.launch.py publishes
each entry as a static transform; this module picks the file and checks it against the profile first, so a file
written for another arm (its frames on a Panda, say) stops the launch with the reason instead of leaving the
cameras hanging on frames no one publishes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from captain_ros.core.robot import RobotProfile
from captain_ros.paths import config_path


class CalibrationError(ValueError):
    """A calibration file that is missing or does not fit the profile."""


@dataclass(frozen=True)
class CameraMount:
    parent_frame: str
    child_frame: str
    translation_m: tuple[float, float, float]
    rotation_xyzw: tuple[float, float, float, float]


def calibration_path(profile: RobotProfile, given: str = "") -> Path:
    """The file to publish: `given` (a path) where one is given, else the profile's shipped one."""
    if given:
        return Path(given).expanduser()
    path = config_path(f"camera_calibration/{profile.name}.yaml")
    if not path.is_file():
        shipped = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise CalibrationError(
            f"no camera calibration for robot profile '{profile.name}' (shipped: {', '.join(shipped)}): give "
            "yours with camera_calibration:=<file> (the format: any of config/camera_calibration/*.yaml)"
        )
    return path


def load_calibration(path: Path, profile: RobotProfile) -> dict[str, CameraMount]:
    """The cameras of a calibration file, each hung on a frame the profile's arm publishes (its base, flange or
    hand frame) with a finite translation and a unit quaternion."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CalibrationError(f"camera calibration {path} cannot be read: {exc}") from exc
    cameras = doc.get("cameras") if isinstance(doc, dict) else None
    if not isinstance(cameras, dict) or not cameras:
        raise CalibrationError(f"{path}: no 'cameras' mapping")
    frames = {profile.base_frame, profile.flange_frame, profile.hand_frame}
    out = {}
    for name, cam in cameras.items():
        where = f"{path}: cameras.{name}"
        try:
            mount = CameraMount(
                str(cam["parent_frame"]),
                str(cam["child_frame"]),
                tuple(float(v) for v in cam["translation_m"]),
                tuple(float(v) for v in cam["rotation_xyzw"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(
                f"{where} needs parent_frame, child_frame, translation_m [x, y, z] and rotation_xyzw: {exc!r}"
            ) from exc
        if mount.parent_frame not in frames:
            raise CalibrationError(
                f"{where}: parent_frame {mount.parent_frame} is not a frame of robot profile '{profile.name}' "
                f"(its base {profile.base_frame}, flange {profile.flange_frame}, hand {profile.hand_frame}): a "
                "calibration of another arm?"
            )
        values = (*mount.translation_m, *mount.rotation_xyzw)
        if len(mount.translation_m) != 3 or len(mount.rotation_xyzw) != 4 or not all(map(math.isfinite, values)):
            raise CalibrationError(f"{where}: translation_m must be 3 and rotation_xyzw 4 finite numbers")
        if abs(math.hypot(*mount.rotation_xyzw) - 1.0) > 1e-3:
            raise CalibrationError(f"{where}: rotation_xyzw {list(mount.rotation_xyzw)} is not a unit quaternion")
        out[str(name)] = mount
    return out

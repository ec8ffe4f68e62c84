"""Metric object geometry from a detection's points: the footprint on the table (OpenCV minimum-area
rectangle or enclosing circle of the points projected onto the table plane — the top face and the
visible sides of an upright object cover its whole footprint, which completes the hidden far side by
symmetry), top height, extents, yaw, and a simple shape name."""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

SHAPES = ("auto", "box", "cylinder")
RESTING_ON_TABLE_M = 0.012  # lowest visible point below this height: the object stands on the table


@dataclass(frozen=True)
class Geometry:
    center_m: np.ndarray  # (3,) footprint centre at half height, base frame
    extents_m: np.ndarray  # (3,) footprint long side, short side (or diameter twice), height
    yaw_deg: float  # of the long side, in [-90, 90); for squares and circles in [-45, 45) and 0
    top_z_m: float  # highest point (98th percentile) in the base frame
    bottom_z_m: float  # lowest point of the object (its resting height)
    footprint_xy_m: np.ndarray  # (K, 2) polygon of the footprint
    shape: str  # "box" or "cylinder" (what was fitted)
    kind: str  # named shape: cube, block, box, bowl, plate, cup, cabinet, object
    concave: bool  # open top (bowl, open box, cup): the centre is lower than the rim
    points: int

    def to_value(self) -> dict:
        return {
            "center_m": [round(float(v), 4) for v in self.center_m],
            "extents_m": [round(float(v), 4) for v in self.extents_m],
            "yaw_deg": round(self.yaw_deg, 1),
            "top_z_m": round(self.top_z_m, 4),
            "bottom_z_m": round(self.bottom_z_m, 4),
            "footprint_xy_m": [[round(float(x), 4), round(float(y), 4)] for x, y in self.footprint_xy_m],
            "fitted_shape": self.shape,
            "kind": self.kind,
            "open_top": self.concave,
            "points": self.points,
        }


def _table_frame(normal: np.ndarray) -> np.ndarray:
    """Rows: two in-plane axes (x-like, y-like) and the normal."""
    ex = np.array([1.0, 0.0, 0.0]) - normal[0] * normal
    ex /= np.linalg.norm(ex)
    return np.stack([ex, np.cross(normal, ex), normal])


def measure(points: np.ndarray, table_normal: np.ndarray, table_d: float, shape: str = "auto") -> Geometry:
    """Geometry of an upright object from its points (N, 3) in the base frame; raises ValueError when
    there are too few points."""
    points = points[np.isfinite(points).all(axis=1)]
    if len(points) < 10:
        raise ValueError(f"only {len(points)} points with depth: too few to measure")
    frame = _table_frame(table_normal)
    local = points @ frame.T
    local[:, 2] += table_d  # height above the table
    height = float(np.percentile(local[:, 2], 98))
    bottom = float(max(np.percentile(local[:, 2], 1), 0.0))
    if bottom < RESTING_ON_TABLE_M:  # the lowest visible points are just above the table: it stands on it
        bottom = 0.0
    xy = local[:, :2].astype(np.float32)
    (cx, cy), (w, d), angle = cv2.minAreaRect(xy)
    rect_area = max(w * d, 1e-9)
    hull_area = float(cv2.contourArea(cv2.convexHull(xy)))
    (ccx, ccy), radius = cv2.minEnclosingCircle(xy)
    roundness = hull_area / (math.pi * radius**2)
    fitted = shape if shape != "auto" else ("cylinder" if roundness > 0.86 and hull_area / rect_area < 0.86 else "box")
    if fitted == "cylinder":
        center_xy, ext, yaw = np.array([ccx, ccy]), (2 * radius, 2 * radius), 0.0
        t = np.linspace(0, 2 * math.pi, 24, endpoint=False)
        footprint = np.stack([ccx + radius * np.cos(t), ccy + radius * np.sin(t)], axis=1)
    else:
        long_first = w >= d
        ext = (max(w, d), min(w, d))
        yaw = angle if long_first else angle + 90.0
        yaw = (yaw + 90.0) % 180.0 - 90.0
        if ext[0] - ext[1] < 0.1 * ext[0]:  # square: yaw is only defined modulo 90
            yaw = (yaw + 45.0) % 90.0 - 45.0
        center_xy = np.array([cx, cy])
        footprint = cv2.boxPoints(((cx, cy), (w, d), angle))
    # open top: points near the footprint centre sit well below the rim
    near_center = np.linalg.norm(local[:, :2] - center_xy, axis=1) < 0.25 * min(ext)
    concave = bool(near_center.sum() >= 5 and np.median(local[near_center, 2]) < 0.6 * height and height > 0.015)
    center_local = np.array([center_xy[0], center_xy[1], (height + bottom) / 2 - table_d])
    center = frame.T @ center_local
    foot3 = np.column_stack([footprint, np.full(len(footprint), -table_d)]) @ frame
    return Geometry(
        center,
        np.array([ext[0], ext[1], height - bottom]),
        float(yaw),
        float((frame.T @ np.array([*center_xy, height - table_d]))[2]),
        float((frame.T @ np.array([*center_xy, bottom - table_d]))[2]),
        foot3[:, :2],
        fitted,
        _kind(ext, height - bottom, concave, fitted),
        concave,
        len(points),
    )


def _kind(ext: tuple[float, float], height: float, concave: bool, fitted: str) -> str:  # noqa: PLR0911 - a rule table
    long, short = ext
    if height > 0.15 and long > 0.2:
        return "cabinet"
    if height < 0.03 and long > 0.1:
        return "plate"
    if concave:
        if fitted == "cylinder":
            return "cup" if height > 0.8 * long else "bowl"
        return "box"
    if long < 0.07 and short > 0.6 * long:
        return "cube" if 0.75 <= height / long <= 1.3 else "block"
    if fitted == "cylinder" and height > long:
        return "cup"
    return "box" if long > 0.1 else "object"

"""Point clouds from one RGB-D image: back-projection into the robot base frame, the table plane
(RANSAC, open3d), the robot's own body (removed using its joint state) and per-pixel colour names."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import open3d as o3d

from captain_ros.core.kinematics import Kinematics
from captain_ros.perception.observation import CameraImage

OBJECT_MIN_HEIGHT_M = 0.005  # above the table plane: an object (or the robot), not the table
COLOR_NAMES = ("none", "red", "orange", "brown", "yellow", "green", "blue", "purple", "white", "grey", "black")


def backproject(image: CameraImage) -> np.ndarray:
    """(H, W, 3) float32 points in the base frame; NaN where there is no depth."""
    h, w = image.shape
    k = image.K
    u = ((np.arange(w, dtype=np.float32) - k[0, 2]) / k[0, 0])[None, :]
    v = ((np.arange(h, dtype=np.float32) - k[1, 2]) / k[1, 1])[:, None]
    depth = np.where(np.isfinite(image.depth_m) & (image.depth_m > 0), image.depth_m, np.nan).astype(np.float32)
    r = image.rotation.astype(np.float32)
    # p = R @ (depth * [u, v, 1]) + t, one column of R at a time
    out = np.empty((h, w, 3), dtype=np.float32)
    for i in range(3):
        out[..., i] = depth * (r[i, 0] * u + r[i, 1] * v + r[i, 2]) + np.float32(image.position_m[i])
    return out


def pixel_ray_point(image: CameraImage, u_px: float, v_px: float, depth_m: float) -> np.ndarray:
    k = image.K
    cam = np.array([(u_px - k[0, 2]) * depth_m / k[0, 0], (v_px - k[1, 2]) * depth_m / k[1, 1], depth_m])
    return image.rotation @ cam + image.position_m


TABLE_INLIER_M = 0.004  # a point this close to the table plane lies on it
TABLE_HINT_MIN_FRACTION = 0.25  # a known plane is taken again when this share of the depth samples lies on it


def _table_sample(points: np.ndarray) -> np.ndarray:
    grid = points[::4, ::4].reshape(-1, 3)  # every 16th pixel: plenty for a plane, 16x less work
    sample = grid[np.isfinite(grid).all(axis=1)].astype(np.float64)
    if len(sample) < 100:
        raise ValueError("too few depth points to find the table")
    return sample


def fit_table(
    points: np.ndarray, max_tilt_deg: float = 15.0, seed: int = 0, hint: tuple[np.ndarray, float] | None = None
) -> tuple[np.ndarray, float]:
    """The dominant near-horizontal plane (normal pointing up, offset d: n.p + d = height above it).

    `hint`: the table found in an earlier image, in the same (base) frame. The table does not move, so when at least
    TABLE_HINT_MIN_FRACTION of this image's depth samples lie on it, it is refined by least squares on those points
    instead of searched for again (RANSAC is most of the cost); otherwise the search runs as without a hint."""
    sample = _table_sample(points)
    if hint is not None:
        refined = _refine(sample, *hint, max_tilt_deg)
        if refined is not None:
            return refined
    o3d.utility.random.seed(seed)
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(sample))
    for _ in range(3):
        if len(cloud.points) < 100:  # what is left after the planes removed so far is no table
            break
        (a, b, c, d), inliers = cloud.segment_plane(distance_threshold=TABLE_INLIER_M, ransac_n=3, num_iterations=200)
        normal = np.array([a, b, c])
        if normal[2] < 0:
            normal, d = -normal, -d
        if np.degrees(np.arccos(min(1.0, normal[2]))) <= max_tilt_deg:
            return normal, float(d)
        cloud = cloud.select_by_index(inliers, invert=True)  # a wall or a box side: try the next plane
    raise ValueError("no horizontal plane (table) found in the depth image")


def _refine(sample: np.ndarray, normal: np.ndarray, d: float, max_tilt_deg: float) -> tuple[np.ndarray, float] | None:
    """The plane through the samples within TABLE_INLIER_M of (normal, d), or None when too few lie there."""
    on = np.abs(sample @ normal + d) < TABLE_INLIER_M
    if on.sum() < max(100, TABLE_HINT_MIN_FRACTION * len(sample)):
        return None
    inliers = sample[on]
    centre = inliers.mean(axis=0)
    refined = np.linalg.svd(inliers - centre, full_matrices=False)[2][-1]
    if refined[2] < 0:
        refined = -refined
    if np.degrees(np.arccos(min(1.0, refined[2]))) > max_tilt_deg:
        return None
    return refined, float(-refined @ centre)


def robot_mask(points: np.ndarray, kinematics: Kinematics, q_rad: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Candidate pixels whose points lie within the padded segments of the arm's kinematic chain (the robot
    profile's `self_filter_chain_m`: links from base to TCP, each with a radius). All segments at once: the squared
    distance to segment a-b is |p-a|^2 - 2t (p-a).(b-a) + t^2 |b-a|^2 with t the clipped projection, from two small
    matrix products (float32: millimetres at metre scale lose nothing)."""
    chain = list(kinematics.profile.self_filter_chain_m.items())
    ends = np.array([kinematics.forward(q_rad, frame)[0] for frame, _ in chain], dtype=np.float32)
    radius = np.array([r for _, r in chain], dtype=np.float32)
    a, ab = ends[:-1], ends[1:] - ends[:-1]
    reach = np.maximum(radius[:-1], radius[1:])
    index = np.flatnonzero(candidates)
    p = points.reshape(-1, 3)[index].astype(np.float32, copy=False)
    if not len(p):
        return np.zeros(candidates.shape, dtype=bool)
    # only the segments whose padded box meets the candidates' box (a wrist camera sees the hand, not the shoulder)
    low, high = p.min(axis=0), p.max(axis=0)
    seg_low, seg_high = np.minimum(a, a + ab) - reach[:, None], np.maximum(a, a + ab) + reach[:, None]
    seen = np.all((seg_low <= high) & (seg_high >= low), axis=1)
    a, ab, reach = a[seen], ab[seen], reach[seen]
    ab_ab = np.maximum((ab * ab).sum(axis=1), np.float32(1e-12))
    along = p @ ab.T  # (N, segments), then (p - a).(b - a)
    along -= (a * ab).sum(axis=1)
    t = np.clip(along / ab_ab, 0.0, 1.0)
    d2 = p @ (-2 * a.T)  # |p - a|^2 = |p|^2 - 2 p.a + |a|^2, in place
    d2 += np.einsum("ij,ij->i", p, p)[:, None]
    d2 += (a * a).sum(axis=1)
    along *= 2
    t *= ab_ab * t - along  # t^2 |b-a|^2 - 2 t (p-a).(b-a)
    d2 += t
    near = (d2 < reach * reach).any(axis=1)
    out = np.zeros(candidates.size, dtype=bool)
    out[index[near]] = True
    return out.reshape(candidates.shape)


def color_names(rgb: np.ndarray) -> np.ndarray:
    """Per-pixel index into COLOR_NAMES from hue, saturation and value (robust to shading)."""
    hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
    h, s, v = (hsv[..., i].astype(np.int16) for i in range(3))
    out = np.zeros(h.shape, dtype=np.uint8)
    chroma = (s >= 70) & (v >= 50)
    hue_bins = [
        ((h < 8) | (h >= 165), "red"),
        ((h >= 8) & (h < 22) & (s >= 215), "orange"),
        ((h >= 8) & (h < 22) & (s < 215), "brown"),
        ((h >= 22) & (h < 40), "yellow"),
        ((h >= 40) & (h < 90), "green"),
        ((h >= 90) & (h < 130), "blue"),
        ((h >= 130) & (h < 165), "purple"),
    ]
    for mask, name in hue_bins:
        out[chroma & mask] = COLOR_NAMES.index(name)
    grey = ~chroma
    out[grey & (v >= 200)] = COLOR_NAMES.index("white")
    out[grey & (v >= 60) & (v < 200)] = COLOR_NAMES.index("grey")
    out[(v < 60)] = COLOR_NAMES.index("black")
    return out


@dataclass
class CameraCloud:
    """Everything the segmenter and the measurements need from one image, computed once."""

    image: CameraImage
    points: np.ndarray  # (H, W, 3) base frame
    table_normal: np.ndarray
    table_d: float
    height_m: np.ndarray  # (H, W) above the table plane (NaN without depth)
    robot: np.ndarray  # (H, W) bool
    colors: np.ndarray  # (H, W) index into COLOR_NAMES

    @classmethod
    def build(
        cls,
        image: CameraImage,
        kinematics: Kinematics,
        q_rad: np.ndarray,
        table: tuple[np.ndarray, float] | None = None,
    ) -> CameraCloud:
        """`table`: the table plane found in an earlier image, tried first (fit_table's hint)."""
        points = backproject(image)
        normal, d = fit_table(points, hint=table)
        height = points @ normal.astype(np.float32) + np.float32(d)
        above = np.isfinite(height) & (height > OBJECT_MIN_HEIGHT_M)  # only these can be robot or object
        robot = robot_mask(points, kinematics, q_rad, above)
        return cls(image, points, normal, d, height, robot, color_names(image.rgb))

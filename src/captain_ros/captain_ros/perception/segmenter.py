"""The built-in RGB-D segmenter: what stands on the table, split by depth edges and colour, named by
colour and shape, matched against a text query. Works on the twin and on plain real tabletop scenes."""

from __future__ import annotations

import re
from dataclasses import dataclass

import cv2
import numpy as np

from captain_ros.perception.cloud import COLOR_NAMES, OBJECT_MIN_HEIGHT_M, CameraCloud
from captain_ros.perception.geometry import Geometry, measure

MAX_HEIGHT_M = 0.45
DEPTH_EDGE_M = 0.015
KIND_WORDS = {
    "cube": "cube",
    "block": "block",
    "bowl": "bowl",
    "plate": "plate",
    "dish": "plate",
    "cup": "cup",
    "mug": "cup",
    "box": "box",
    "tray": "box",
    "container": "box",
    "cabinet": "cabinet",
    "drawer": "cabinet",
}
ACHROMATIC = [COLOR_NAMES.index(c) for c in ("white", "grey", "black")]
COLOR_WORDS = {name: name for name in COLOR_NAMES[1:]} | {"gray": "grey"}


@dataclass
class Segment:
    mask: np.ndarray  # (H, W) bool
    color: str
    geometry: Geometry

    @property
    def label(self) -> str:
        return f"{self.color} {self.geometry.kind}"

    @property
    def bbox_px(self) -> tuple[int, int, int, int]:
        v, u = np.nonzero(self.mask)
        return int(u.min()), int(v.min()), int(u.max()), int(v.max())


def object_pixels(cloud: CameraCloud) -> np.ndarray:
    """Pixels of things standing on the table: above it, not the robot, minus the far side of depth edges."""
    h = cloud.height_m
    valid = np.isfinite(h)
    mask = valid & (h > OBJECT_MIN_HEIGHT_M) & (h < MAX_HEIGHT_M) & ~cloud.robot
    depth = np.where(valid, cloud.image.depth_m, 1e6)  # no depth: far away (finite, so differences are defined)
    far = np.zeros_like(mask)
    for axis in (0, 1):
        a = np.take(depth, np.arange(depth.shape[axis] - 1), axis=axis)
        b = np.take(depth, np.arange(1, depth.shape[axis]), axis=axis)
        jump = np.abs(a - b) > DEPTH_EDGE_M
        a_far, b_far = jump & (a > b), jump & (b > a)
        if axis == 0:
            far[:-1] |= a_far
            far[1:] |= b_far
        else:
            far[:, :-1] |= a_far
            far[:, 1:] |= b_far
    return mask & ~far


def segments(cloud: CameraCloud, min_pixels: int = 40) -> list[Segment]:
    """Connected regions of one colour among the object pixels, each measured."""
    mask = object_pixels(cloud)
    kernel = np.ones((3, 3), np.uint8)
    out = []
    # chromatic colours split regions; white, grey and black are one family (shading turns white into grey)
    family = np.where(np.isin(cloud.colors, ACHROMATIC), 255, cloud.colors)
    for c in np.unique(family[mask]):
        region = cv2.morphologyEx((mask & (family == c)).astype(np.uint8), cv2.MORPH_OPEN, kernel)
        n, labels, stats, _ = cv2.connectedComponentsWithStats(region, connectivity=8)
        for i in range(1, n):
            if stats[i, cv2.CC_STAT_AREA] < min_pixels:
                continue
            m = labels == i
            try:
                geometry = measure(cloud.points[m], cloud.table_normal, cloud.table_d)
            except ValueError:
                continue
            names = np.bincount(cloud.colors[m], minlength=len(COLOR_NAMES))
            out.append(Segment(m, COLOR_NAMES[int(np.argmax(names))], geometry))
    return out


def parse_query(text: str) -> tuple[str | None, str | None]:
    """(colour, kind) named in a text query; either may be None."""
    words = re.findall(r"[a-z]+", text.lower())
    color = next((COLOR_WORDS[w] for w in words if w in COLOR_WORDS), None)
    kind = next((KIND_WORDS[w.rstrip("s")] for w in words if w.rstrip("s") in KIND_WORDS), None)
    return color, kind


def match(segs: list[Segment], text: str) -> list[tuple[float, Segment]]:
    """Segments answering `text`, best first: the colour must match when one is named; a named kind
    that matches ranks first; larger regions break ties."""
    color, kind = parse_query(text)
    scored = []
    for seg in segs:
        if color is not None and seg.color != color:
            continue
        if kind is not None and seg.geometry.kind != kind:
            score = 0.5 if color is not None else 0.0
        else:
            score = 1.0 if (color or kind) else 0.0
        if score > 0:
            scored.append((score, seg))
    scored.sort(key=lambda item: (-item[0], -int(item[1].mask.sum())))
    return scored

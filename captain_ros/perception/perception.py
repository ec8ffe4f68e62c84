"""The perception capabilities of the policy-facing API (CaPtain Table 4), ROS-free.

observe, segment, select_detection, mark_point, measure_object_geometry and measure_image_points.
The Harness dispatches to the `_<capability>` methods here exactly as to its own, so results,
receipts, budgets and failure categories are the same as for motion. Detection ids are valid for the
episode; a detection (or handle) from before the last physical action is stale and refused.
Pixel coordinates are normalised: u across, v down, both in [0, 1] (resolution independent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.harness import args as A  # noqa: N812
from captain_ros.perception.cloud import OBJECT_MIN_HEIGHT_M, CameraCloud
from captain_ros.perception.geometry import SHAPES, Geometry, measure
from captain_ros.perception.observation import CameraImage, Observation, ObservationStore, PerceptionError
from captain_ros.perception.segmenter import Segment, match, object_pixels, segments

CAMERAS = ("head", "wrist")
POINT_RADIUS_M = 0.01  # mark_point granularity "point": object pixels within this distance of the point
GRANULARITIES = ("object", "point")


@dataclass
class Detection:
    id: str
    label: str
    observation: Observation
    camera: str
    mask: np.ndarray
    score: float
    pixel: tuple[int, int] | None = None  # (u, v) px the detection was made from (mark_point)

    def summary(self, geometry: Geometry) -> dict:
        v, u = np.nonzero(self.mask)
        return {
            "detection_id": self.id,
            "label": self.label,
            "score": round(self.score, 3),
            "observation_handle": self.observation.handle,
            "camera": self.camera,
            "position_m": [round(float(x), 4) for x in geometry.center_m],
            "extents_m": [round(float(x), 4) for x in geometry.extents_m],
            "bbox_px": [int(u.min()), int(v.min()), int(u.max()), int(v.max())],
            "mask_pixels": int(self.mask.sum()),
        }


def _xyz(p: np.ndarray) -> str:
    return f"({p[0]:.3f}, {p[1]:.3f}, {p[2]:.3f}) m"


class Perception:
    def __init__(
        self,
        kinematics: Kinematics,
        capture: Callable[[tuple[str, ...]], tuple[float, dict[str, CameraImage], np.ndarray, float]],
    ):
        """`capture(cameras)` returns (time, images by camera, arm joint positions, jaw opening)."""
        self.kin = kinematics
        self.capture = capture
        self.new_episode()

    def new_episode(self) -> None:
        self.store = ObservationStore()
        self.detections: dict[str, Detection] = {}

    def scene_changed(self) -> None:
        self.store.scene_changed()

    # ------------------------------------------------------------------------------ helpers
    def _cloud(self, obs: Observation, camera: str) -> CameraCloud:
        if camera not in obs.images:
            raise PerceptionError(
                FailureCategory.INVALID_ARGUMENT,
                f"{obs.handle} has no {camera!r} camera (it has {', '.join(obs.images)})",
            )
        key = ("cloud", camera)
        if key not in obs.cache:
            try:
                obs.cache[key] = CameraCloud.build(obs.images[camera], self.kin, obs.q_rad)
            except ValueError as exc:
                raise PerceptionError(FailureCategory.NO_DEPTH, f"{camera} camera of {obs.handle}: {exc}") from None
        return obs.cache[key]

    def _segments(self, obs: Observation, camera: str) -> list[Segment]:
        key = ("segments", camera)
        if key not in obs.cache:
            obs.cache[key] = segments(self._cloud(obs, camera))
        return obs.cache[key]

    def _detection(self, name: str, value: Any) -> Detection:
        if not isinstance(value, str) or not value:
            raise A.ArgumentError(f"{name} must be a detection id like 'det-3', got {value!r}")
        det = self.detections.get(value)
        if det is None:
            known = ", ".join(self.detections) or "none yet: segment() or mark_point() first"
            raise A.ArgumentError(f"unknown detection id {value!r} for {name} (known: {known})")
        if self.store.is_stale(det.observation):
            raise PerceptionError(
                FailureCategory.STALE_OBSERVATION,
                f"{value} comes from {det.observation.handle}, taken before the last physical action: "
                "observe() again and re-detect",
            )
        return det

    def _add(  # noqa: PLR0917 - internal
        self, label: str, obs: Observation, camera: str, mask: np.ndarray, score: float, pixel=None
    ) -> Detection:
        det = Detection(f"det-{len(self.detections) + 1}", label, obs, camera, mask, score, pixel)
        self.detections[det.id] = det
        return det

    def _geometry(self, det: Detection, shape: str = "auto") -> Geometry:
        cloud = self._cloud(det.observation, det.camera)
        try:
            return measure(cloud.points[det.mask], cloud.table_normal, cloud.table_d, shape)
        except ValueError as exc:
            raise PerceptionError(FailureCategory.NO_DEPTH, f"{det.id}: {exc}") from None

    def _pixel(self, obs: Observation, camera: str, u: Any, v: Any) -> tuple[int, int]:
        A.choice("camera", camera, CAMERAS)
        fu, fv = A.number("u", u, lo=0.0, hi=1.0), A.number("v", v, lo=0.0, hi=1.0)
        if camera not in obs.images:
            raise A.ArgumentError(f"{obs.handle} has no {camera!r} camera (it has {', '.join(obs.images)})")
        h, w = obs.images[camera].shape
        return round(fu * (w - 1)), round(fv * (h - 1))

    # ------------------------------------------------------------------------------ capabilities
    def _observe(self, cameras: Any = CAMERAS) -> CallResult:
        if isinstance(cameras, str):
            cameras = (cameras,)
        if not isinstance(cameras, list | tuple) or not cameras:
            raise A.ArgumentError(f"cameras must be a non-empty list of {CAMERAS}, got {cameras!r}")
        names = tuple(dict.fromkeys(A.choice("cameras[]", c, CAMERAS) for c in cameras))
        time_s, images, q, jaw = self.capture(names)
        obs = self.store.add(time_s, images, q, jaw)
        for name in names:  # build the clouds now: later calls on this handle are fast
            self._cloud(obs, name)
        value = {
            "observation_handle": obs.handle,
            "cameras": {
                n: {"width": im.shape[1], "height": im.shape[0], "K": np.round(im.K, 3).tolist()}
                for n, im in images.items()
            },
            "time_s": round(time_s, 3),
            "jaw_opening_m": round(jaw, 4),
        }
        size = next(iter(images.values())).shape
        receipt = f"observe: {obs.handle}, {'+'.join(names)} RGB-D {size[1]}x{size[0]}, jaw {jaw * 1000:.0f} mm"
        return CallResult.ok("observe", value=value, receipt=receipt)

    def _segment(self, text: Any = None, camera: str = "head", observation_handle: Any = None) -> CallResult:
        if not isinstance(text, str) or not text.strip():
            raise A.ArgumentError(f"segment needs text naming the object, e.g. 'red cube'; got {text!r}")
        A.choice("camera", camera, CAMERAS)
        obs = self._observation(observation_handle)
        found = match(self._segments(obs, camera), text)
        if not found:
            seen = ", ".join(sorted({s.label for s in self._segments(obs, camera)})) or "nothing"
            raise PerceptionError(
                FailureCategory.NOT_FOUND,
                f"nothing matches {text!r} in the {camera} camera of {obs.handle} (seen: {seen})",
            )
        results = []
        for score, seg in found[:5]:
            det = self._add(text.strip(), obs, camera, seg.mask, score)
            results.append(det.summary(seg.geometry) | {"named": seg.label})
        best = results[0]
        receipt = (
            f"segment({text.strip()!r}): {len(results)} detection(s); best {best['detection_id']} "
            f"{best['named']} at {_xyz(best['position_m'])}"
        )
        return CallResult.ok("segment", value={"detections": results}, receipt=receipt)

    def _observation(self, handle: Any) -> Observation:
        if handle is None:
            latest = self.store.latest()
            if latest is None:
                raise A.ArgumentError("no observation yet: call observe() first")
            handle = latest.handle
        return self.store.get(handle)

    def _mark_point(  # noqa: PLR0917 - the policy calls it positionally (handle, camera, u, v, ...)
        self,
        observation_handle: Any = None,
        camera: Any = "head",
        u: Any = None,
        v: Any = None,
        label: Any = "",
        granularity: Any = "object",
    ) -> CallResult:
        if u is None or v is None:
            raise A.ArgumentError("mark_point needs u and v: the pixel as fractions of the image width and height")
        if not isinstance(label, str):
            raise A.ArgumentError(f"label must be a string, got {type(label).__name__}")
        A.choice("granularity", granularity, GRANULARITIES)
        obs = self._observation(observation_handle)
        pu, pv = self._pixel(obs, camera, u, v)
        cloud = self._cloud(obs, camera)
        if not np.isfinite(cloud.height_m[pv, pu]):
            raise PerceptionError(FailureCategory.NO_DEPTH, f"pixel ({u}, {v}) = ({pu}, {pv}) px has no depth")
        if cloud.robot[pv, pu]:
            raise PerceptionError(FailureCategory.NOT_FOUND, f"pixel ({pu}, {pv}) px is on the robot, not an object")
        if cloud.height_m[pv, pu] <= OBJECT_MIN_HEIGHT_M:
            raise PerceptionError(
                FailureCategory.NOT_FOUND,
                f"pixel ({pu}, {pv}) px is on the table (background), "
                f"{cloud.height_m[pv, pu] * 1000:.1f} mm above it: mark a pixel on the object",
            )
        if granularity == "point":
            objects = object_pixels(cloud)
            near = np.linalg.norm(cloud.points - cloud.points[pv, pu], axis=-1) < POINT_RADIUS_M
            mask = objects & near
        else:
            seg = next((s for s in self._segments(obs, camera) if s.mask[pv, pu]), None)
            if seg is None:  # an edge pixel or a speck: grow from the point in depth instead
                mask = object_pixels(cloud) & (np.linalg.norm(cloud.points - cloud.points[pv, pu], axis=-1) < 0.03)
            else:
                mask = seg.mask
        mask = mask.copy()
        mask[pv, pu] = True
        det = self._add(label or "marked point", obs, camera, mask, 1.0, (pu, pv))
        geometry = self._geometry(det)
        value = det.summary(geometry) | {
            "pixel_px": [pu, pv],
            "point_m": [round(float(x), 4) for x in cloud.points[pv, pu]],
        }
        receipt = (
            f"mark_point: {det.id} {label or ''} at {_xyz(geometry.center_m)} ({int(mask.sum())} px, "
            f"{geometry.kind} {geometry.extents_m[0] * 100:.1f}x{geometry.extents_m[1] * 100:.1f}x"
            f"{geometry.extents_m[2] * 100:.1f} cm)"
        )
        return CallResult.ok("mark_point", value=value, receipt=receipt.replace("  ", " "))

    def _select_detection(self, candidates: Any = None, evidence: Any = None) -> CallResult:
        if isinstance(candidates, str):
            candidates = [candidates]
        if not isinstance(candidates, list | tuple) or not candidates:
            raise A.ArgumentError("candidates must be a list of detection ids (e.g. from segment)")
        dets = [self._detection(f"candidates[{i}]", c) for i, c in enumerate(candidates)]
        point = self._detection("evidence", evidence)
        if point.pixel is None:
            raise A.ArgumentError(f"evidence {point.id} has no marked pixel: use a detection from mark_point")
        pu, pv = point.pixel
        for det in dets:
            if det.observation is point.observation and det.camera == point.camera and det.mask[pv, pu]:
                geometry = self._geometry(det)
                value = det.summary(geometry) | {"evidence": point.id}
                receipt = f"select_detection: {det.id} contains {point.id}'s pixel; at {_xyz(geometry.center_m)}"
                return CallResult.ok("select_detection", value=value, receipt=receipt)
        raise PerceptionError(
            FailureCategory.NOT_FOUND,
            f"{point.id}'s pixel ({pu}, {pv}) lies outside every candidate mask "
            "(or they come from another observation or camera)",
        )

    def _measure_object_geometry(self, object: Any = None, destination: Any = None, shape: Any = "auto") -> CallResult:
        A.choice("shape", shape, SHAPES)
        det = self._detection("object", object)
        g = self._geometry(det, shape)
        value = {"object": det.id, **g.to_value()}
        receipt = (
            f"measure_object_geometry: {det.id} {g.kind} centre {_xyz(g.center_m)}, "
            f"{g.extents_m[0] * 100:.1f}x{g.extents_m[1] * 100:.1f}x{g.extents_m[2] * 100:.1f} cm, "
            f"yaw {g.yaw_deg:.0f} deg"
        )
        if destination is not None:
            dest_det = self._detection("destination", destination)
            d = self._geometry(dest_det)
            offset = d.center_m[:2] - g.center_m[:2]
            inside = (
                cv2.pointPolygonTest(d.footprint_xy_m.astype(np.float32), tuple(map(float, g.center_m[:2])), False) >= 0
            )
            support = d.bottom_z_m + 0.01 if d.concave else d.top_z_m  # the floor of an open container
            resting = bool((inside and abs(g.bottom_z_m - support) < 0.015) or (not inside and g.bottom_z_m < 0.01))
            value["destination"] = {
                "detection_id": dest_det.id,
                **d.to_value(),
                "offset_xy_m": [round(float(x), 4) for x in offset],
                "center_inside_footprint": inside,
                "resting_height_consistent": resting,
            }
            receipt += (
                f"; to {dest_det.id}: offset ({offset[0] * 100:+.1f}, {offset[1] * 100:+.1f}) cm, "
                f"{'inside' if inside else 'outside'} footprint, resting {'ok' if resting else 'inconsistent'}"
            )
        return CallResult.ok("measure_object_geometry", value=value, receipt=receipt)

    def _measure_image_points(
        self, observation_handle: Any = None, camera: Any = "head", points: Any = None
    ) -> CallResult:
        if not isinstance(points, list | tuple) or not points:
            raise A.ArgumentError("points must be a non-empty list of [u, v] pairs (fractions of width and height)")
        obs = self._observation(observation_handle)
        cloud = None
        out = []
        for i, p in enumerate(points):
            uv = A.vector(f"points[{i}]", p, 2)
            pu, pv = self._pixel(obs, camera, uv[0], uv[1])
            cloud = cloud or self._cloud(obs, camera)
            xyz = cloud.points[pv, pu]
            ok = bool(np.isfinite(xyz).all())
            out.append(
                {
                    "pixel_px": [pu, pv],
                    "point_m": [round(float(x), 4) for x in xyz] if ok else None,
                    "height_above_table_m": round(float(cloud.height_m[pv, pu]), 4) if ok else None,
                }
            )
        missing = sum(p["point_m"] is None for p in out)
        receipt = f"measure_image_points: {len(out) - missing} of {len(out)} points with depth in {obs.handle} {camera}"
        if missing == len(out):
            raise PerceptionError(FailureCategory.NO_DEPTH, "none of the points has depth")
        return CallResult.ok("measure_image_points", value={"points": out}, receipt=receipt)

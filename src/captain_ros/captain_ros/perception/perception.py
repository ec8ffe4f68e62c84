"""The perception capabilities of the policy-facing API (CaPtain Table 4), ROS-free.

observe, segment, select_detection, mark_point, measure_object_geometry and measure_image_points.
The Harness dispatches to the `_<capability>` methods here exactly as to its own, so results,
receipts, budgets and failure categories are the same as for motion. Detection ids are valid for the
episode; a detection (or handle) from before the last physical action is stale and refused.
Pixel coordinates are normalised: u across, v down, both in [0, 1] (resolution independent).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from captain_ros.core import args as A  # noqa: N812
from captain_ros.core.config import PerceptionConfig
from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.perception.appearance import AppearanceLibrary, regions
from captain_ros.perception.cloud import OBJECT_MIN_HEIGHT_M, CameraCloud
from captain_ros.perception.geometry import SHAPES, Geometry, measure
from captain_ros.perception.observation import CameraImage, Observation, ObservationStore, PerceptionError
from captain_ros.perception.remote import HttpPointer, HttpSegmenter
from captain_ros.perception.segmenter import Segment, match, object_pixels, segments

CAMERAS = ("head", "wrist")
CONTAINER_WALL_M = 0.008  # wall thickness assumed for open containers (inner floor = footprint less this)
POINT_RADIUS_M = 0.01  # mark_point granularity "point": object pixels within this distance of the point
PALM_MIN_POINTS = 3  # inspect_contact_geometry: obstacle points under the hand that block a grasp (fewer: noise)
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
        config: PerceptionConfig = PerceptionConfig(),
    ):
        """`capture(cameras)` returns (time, images by camera, arm joint positions, jaw opening). The
        segmenter is the built-in one unless the config names an HTTP server; `point` uses a pointing
        server when one is configured and falls back to the segmenter otherwise."""
        self.kin = kinematics
        self.capture = capture
        self.remote_segmenter = (
            HttpSegmenter(config.segment_url, config.http_timeout_s) if config.segmenter == "http" else None
        )
        self.pointer = HttpPointer(config.pointing_url, config.http_timeout_s) if config.pointing_url else None
        # names regions by their look where colour and shape do not name the objects (LIBERO); None: not used
        self.appearance: AppearanceLibrary | None = None
        self.config = config
        # builds every point cloud, in the background after an observe (one at a time: each starts from the last
        # table plane; the numpy work releases the GIL, so the caller's threads keep going meanwhile). A Kinematics
        # owns an MjData and is not shared across threads: the worker has its own (the harness plans with the other).
        self._clouds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perception-clouds")
        self._cloud_kin = Kinematics(kinematics.config, kinematics.profile)
        self._last_build: Future | None = None
        self.new_episode()

    def new_episode(self) -> None:
        c = self.config
        if self._last_build is not None:  # the last episode's clouds are built before it resets (one worker, FIFO)
            futures.wait([self._last_build])
        self.store = ObservationStore(c.max_observations_kept, round(c.max_observations_mb * 1024**2))
        self.detections: dict[str, Detection] = {}
        self._detections_made = 0
        self._table: tuple[np.ndarray, float] | None = None  # the table plane of the last cloud, base frame

    def scene_changed(self) -> None:
        """After a physical action: every observation so far is stale. Their point clouds and segments
        (about 5 MB per camera) are dropped; the images stay, and a cloud is rebuilt if a stale
        detection is still compared or tracked."""
        self.store.scene_changed()
        for obs in self.store.all():
            obs.cache.clear()

    # ------------------------------------------------------------------------------ helpers
    def _cloud(self, obs: Observation, camera: str) -> CameraCloud:
        if camera not in obs.images:
            raise PerceptionError(
                FailureCategory.INVALID_ARGUMENT,
                f"{obs.handle} has no {camera!r} camera (it has {', '.join(obs.images)})",
            )
        key = ("cloud", camera)
        entry = obs.cache.get(key)
        if isinstance(entry, Future):  # built in the background since the observe answered: wait for it
            try:
                entry = entry.result()
            except ValueError as exc:
                raise PerceptionError(FailureCategory.NO_DEPTH, f"{camera} camera of {obs.handle}: {exc}") from None
            if isinstance(obs.cache.get(key), Future):  # not dropped meanwhile (scene_changed clears the cache)
                obs.cache[key] = entry
        if entry is None:
            try:
                entry = obs.cache[key] = self._submit_build(obs.images[camera], obs.q_rad).result()
            except ValueError as exc:
                raise PerceptionError(FailureCategory.NO_DEPTH, f"{camera} camera of {obs.handle}: {exc}") from None
        return entry

    def _submit_build(self, image: CameraImage, q_rad: np.ndarray) -> Future:
        self._last_build = self._clouds.submit(self._build_cloud, image, q_rad)
        return self._last_build

    def _build_cloud(self, image: CameraImage, q_rad: np.ndarray) -> CameraCloud:
        """Runs on the worker thread only."""
        cloud = CameraCloud.build(image, self._cloud_kin, q_rad, self._table)
        self._table = (cloud.table_normal, cloud.table_d)  # the table does not move: the next fit starts here
        return cloud

    def _segments(self, obs: Observation, camera: str) -> list[Segment]:
        key = ("segments", camera)
        if key not in obs.cache:
            obs.cache[key] = segments(self._cloud(obs, camera))
        return obs.cache[key]

    def _regions(self, obs: Observation, camera: str) -> list[np.ndarray]:
        key = ("regions", camera)
        if key not in obs.cache:
            obs.cache[key] = regions(self._cloud(obs, camera))
        return obs.cache[key]

    def _detection(self, name: str, value: Any, *, allow_stale: bool = False) -> Detection:
        if not isinstance(value, str) or not value:
            raise A.ArgumentError(f"{name} must be a detection id like 'det-3', got {value!r}")
        det = self.detections.get(value)
        if det is None or det.observation not in self.store:
            self.detections.pop(value, None)
            number = value.removeprefix("det-")
            if number.isdigit() and 0 < int(number) <= self._detections_made:
                raise PerceptionError(
                    FailureCategory.INVALID_ARGUMENT,
                    f"{value} was dropped with older observations or detections (an episode keeps its "
                    f"{self.store.max_kept} most recent observations and {self.config.max_detections_kept} "
                    "detections): observe() again and re-detect",
                )
            known = ", ".join(list(self.detections)[-10:]) or "none yet: segment() or mark_point() first"
            raise A.ArgumentError(f"unknown detection id {value!r} for {name} (known: {known})")
        if not allow_stale and self.store.is_stale(det.observation):
            raise PerceptionError(
                FailureCategory.STALE_OBSERVATION,
                f"{value} comes from {det.observation.handle}, taken before the last physical action: "
                "observe() again and re-detect",
            )
        return det

    def _add(  # noqa: PLR0917 - internal
        self, label: str, obs: Observation, camera: str, mask: np.ndarray, score: float, pixel=None
    ) -> Detection:
        self._detections_made += 1
        det = Detection(f"det-{self._detections_made}", label, obs, camera, mask, score, pixel)
        self.detections[det.id] = det
        while len(self.detections) > max(1, self.config.max_detections_kept):
            del self.detections[next(iter(self.detections))]
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
        for name in names:  # the clouds are built after the answer, while the policy reads it (_cloud waits)
            obs.cache[("cloud", name)] = self._submit_build(images[name], obs.q_rad)
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
        if self.store.dropped:
            value["dropped_observations"] = list(self.store.dropped)
            receipt += f"; dropped {', '.join(self.store.dropped)} (the {self.store.max_kept} most recent are kept)"
            live = {d for d, det in self.detections.items() if det.observation in self.store}
            self.detections = {d: det for d, det in self.detections.items() if d in live}
        return CallResult.ok("observe", value=value, receipt=receipt)

    def _segment(self, text: Any = None, camera: str = "head", observation_handle: Any = None) -> CallResult:
        if not isinstance(text, str) or not text.strip():
            raise A.ArgumentError(f"segment needs text naming the object, e.g. 'red cube'; got {text!r}")
        A.choice("camera", camera, CAMERAS)
        obs = self._observation(observation_handle)
        found = self._find(obs, camera, text.strip())
        results = []
        for score, mask, named in found[:5]:
            det = self._add(text.strip(), obs, camera, mask, score)
            results.append(det.summary(self._geometry(det)) | {"named": named})
        best = results[0]
        receipt = (
            f"segment({text.strip()!r}): {len(results)} detection(s); best {best['detection_id']} "
            f"{best['named']} at {_xyz(best['position_m'])}"
        )
        return CallResult.ok("segment", value={"detections": results}, receipt=receipt)

    def _find(self, obs: Observation, camera: str, text: str) -> list[tuple[float, np.ndarray, str]]:
        """(score, mask, name) answering `text`, best first; raises not_found. A remote segmenter answers when one is
        set; else the appearance library when it names the query's object; else the built-in segmenter."""
        named = self.appearance is not None and self.remote_segmenter is None and self.appearance.models_for(text)
        if named:
            areas = self._regions(obs, camera)
            found = self.appearance.find(obs.images[camera].rgb, areas, text, self._cloud(obs, camera))
            seen = f"{len(areas)} region(s), none that looks like a {text!r} in the library of {self.appearance.source}"
        elif self.remote_segmenter is None:
            found = [(score, seg.mask, seg.label) for score, seg in match(self._segments(obs, camera), text)]
            seen = ", ".join(sorted({s.label for s in self._segments(obs, camera)})) or "nothing"
        else:
            cloud = self._cloud(obs, camera)
            masks = self.remote_segmenter.masks(obs.images[camera].rgb, text)
            usable = np.isfinite(cloud.height_m) & ~cloud.robot
            found = [(score, m & usable, text) for score, m in masks if (m & usable).sum() >= 10]
            seen = f"{len(masks)} mask(s) from {self.remote_segmenter.url}, none with depth off the robot"
        if not found:
            raise PerceptionError(
                FailureCategory.NOT_FOUND,
                f"nothing matches {text!r} in the {camera} camera of {obs.handle} (seen: {seen})",
            )
        return found

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
        det, geometry = self._mark(obs, camera, pu, pv, label or "marked point", granularity)
        value = det.summary(geometry) | {
            "pixel_px": [pu, pv],
            "point_m": [round(float(x), 4) for x in self._cloud(obs, camera).points[pv, pu]],
        }
        receipt = (
            f"mark_point: {det.id} {label} at {_xyz(geometry.center_m)} ({int(det.mask.sum())} px, "
            f"{geometry.kind} {geometry.extents_m[0] * 100:.1f}x{geometry.extents_m[1] * 100:.1f}x"
            f"{geometry.extents_m[2] * 100:.1f} cm)"
        )
        return CallResult.ok("mark_point", value=value, receipt=receipt.replace("  ", " "))

    def _mark(  # noqa: PLR0917 - internal
        self, obs: Observation, camera: str, pu: int, pv: int, label: str, granularity: str
    ) -> tuple[Detection, Geometry]:
        """Validate a pixel and grow the object's region from it (same segment, else nearby in depth)."""
        cloud = self._cloud(obs, camera)
        if not np.isfinite(cloud.height_m[pv, pu]):
            raise PerceptionError(FailureCategory.NO_DEPTH, f"pixel ({pu}, {pv}) px has no depth")
        if cloud.robot[pv, pu]:
            raise PerceptionError(FailureCategory.NOT_FOUND, f"pixel ({pu}, {pv}) px is on the robot, not an object")
        if cloud.height_m[pv, pu] <= OBJECT_MIN_HEIGHT_M:
            raise PerceptionError(
                FailureCategory.NOT_FOUND,
                f"pixel ({pu}, {pv}) px is on the table (background), "
                f"{cloud.height_m[pv, pu] * 1000:.1f} mm above it: mark a pixel on the object",
            )
        distance = None
        if granularity == "object":
            seg = next((s for s in self._segments(obs, camera) if s.mask[pv, pu]), None)
            if seg is not None:
                mask = seg.mask.copy()
            else:  # an edge pixel or a speck: grow from the point in depth instead
                distance = 0.03
        else:
            distance = POINT_RADIUS_M
        if distance is not None:
            mask = object_pixels(cloud) & (np.linalg.norm(cloud.points - cloud.points[pv, pu], axis=-1) < distance)
        mask[pv, pu] = True
        det = self._add(label, obs, camera, mask, 1.0, (pu, pv))
        return det, self._geometry(det)

    def _point(self, text: Any = None, camera: Any = "head", observation_handle: Any = None) -> CallResult:
        if not isinstance(text, str) or not text.strip():
            raise A.ArgumentError(f"point needs text naming the object, e.g. 'red cube'; got {text!r}")
        A.choice("camera", camera, CAMERAS)
        obs = self._observation(observation_handle)
        if camera not in obs.images:
            raise A.ArgumentError(f"{obs.handle} has no {camera!r} camera (it has {', '.join(obs.images)})")
        h, w = obs.images[camera].shape
        if self.pointer is not None:
            points = self.pointer.points(obs.images[camera].rgb, text.strip())
            if not points:
                raise PerceptionError(FailureCategory.NOT_FOUND, f"the pointing model found no {text.strip()!r}")
            _, fu, fv = points[0]
            pu, pv, source = round(fu * (w - 1)), round(fv * (h - 1)), f"pointing model {self.pointer.url}"
        else:
            _, mask, _ = self._find(obs, camera, text.strip())[0]
            v, u = np.nonzero(mask)
            i = int(np.argmin((u - u.mean()) ** 2 + (v - v.mean()) ** 2))  # the mask pixel nearest its centre
            pu, pv, source = int(u[i]), int(v[i]), "segmenter (no pointing model configured)"
        det, geometry = self._mark(obs, camera, pu, pv, text.strip(), "object")
        value = det.summary(geometry) | {"pixel_px": [pu, pv], "uv": [pu / (w - 1), pv / (h - 1)], "source": source}
        receipt = f"point({text.strip()!r}): {det.id} at pixel ({pu}, {pv}), {_xyz(geometry.center_m)}; by {source}"
        return CallResult.ok("point", value=value, receipt=receipt[:300])

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

    def _track_target(self, detection: Any = None, observation_handle: Any = None) -> CallResult:
        """Follow a detection (from any earlier observation, stale allowed) into a newer observation of the
        same camera with pyramidal Lucas-Kanade optical flow, then re-grow the object's region there."""
        src = self._detection("detection", detection, allow_stale=True)
        dst_obs = self._observation(observation_handle)
        if dst_obs is src.observation:
            raise A.ArgumentError(f"{src.id} is already in {dst_obs.handle}: observe() again, then track")
        if src.camera not in dst_obs.images:
            raise A.ArgumentError(f"{dst_obs.handle} has no {src.camera!r} camera to track {src.id} into")
        before = cv2.cvtColor(src.observation.images[src.camera].rgb, cv2.COLOR_RGB2GRAY)
        after = cv2.cvtColor(dst_obs.images[src.camera].rgb, cv2.COLOR_RGB2GRAY)
        features = cv2.goodFeaturesToTrack(before, 40, 0.01, 3, mask=src.mask.astype(np.uint8) * 255)
        v, u = np.nonzero(src.mask)
        anchor = np.array([[[u.mean(), v.mean()]]], dtype=np.float32)
        start = anchor if features is None else np.concatenate([features.astype(np.float32), anchor])
        moved, status, _ = cv2.calcOpticalFlowPyrLK(before, after, start, None, winSize=(21, 21), maxLevel=3)
        ok = status.ravel() == 1
        if not ok.any():
            raise PerceptionError(FailureCategory.NOT_FOUND, f"optical flow lost {src.id} between the observations")
        flow = np.median((moved - start)[ok].reshape(-1, 2), axis=0)
        h, w = src.mask.shape
        pu = int(np.clip(round(anchor[0, 0, 0] + flow[0]), 0, w - 1))
        pv = int(np.clip(round(anchor[0, 0, 1] + flow[1]), 0, h - 1))
        if not src.mask[v, u].any() or src.pixel is not None:
            pass  # the anchor is the mask centroid; for a marked point, follow the marked pixel's flow too
        det, geometry = self._mark(dst_obs, src.camera, pu, pv, src.label, "object")
        old = self._geometry(src)
        shift = geometry.center_m - old.center_m
        value = det.summary(geometry) | {
            "from_detection": src.id,
            "flow_px": [round(float(x), 1) for x in flow],
            "displacement_m": [round(float(x), 4) for x in shift],
            "tracked_features": int(ok.sum()),
        }
        receipt = (
            f"track_target: {src.id} -> {det.id} in {dst_obs.handle}, moved {np.linalg.norm(shift) * 100:.1f} cm "
            f"to {_xyz(geometry.center_m)}"
        )
        return CallResult.ok("track_target", value=value, receipt=receipt)

    def _compare_object_observations(self, before: Any = None, after: Any = None) -> CallResult:
        """How an object moved between two detections of it (the earlier one may be stale)."""
        a = self._detection("before", before, allow_stale=True)
        b = self._detection("after", after, allow_stale=True)
        ga, gb = self._geometry(a), self._geometry(b)
        shift = gb.center_m - ga.center_m
        period = 90.0 if abs(gb.extents_m[0] - gb.extents_m[1]) < 0.1 * gb.extents_m[0] else 180.0
        turn = (gb.yaw_deg - ga.yaw_deg + period / 2) % period - period / 2
        moved = bool(np.linalg.norm(shift) > 0.01 or abs(turn) > 10.0)
        value = {
            "before": a.id,
            "after": b.id,
            "displacement_m": [round(float(x), 4) for x in shift],
            "distance_m": round(float(np.linalg.norm(shift)), 4),
            "yaw_change_deg": round(float(turn), 1),
            "top_height_change_m": round(gb.top_z_m - ga.top_z_m, 4),
            "seconds_apart": round(b.observation.time_s - a.observation.time_s, 3),
            "moved": moved,
        }
        receipt = (
            f"compare_object_observations: {a.id} -> {b.id}: {'moved' if moved else 'still'} "
            f"({shift[0] * 100:+.1f}, {shift[1] * 100:+.1f}, {shift[2] * 100:+.1f}) cm, yaw {turn:+.0f} deg"
        )
        return CallResult.ok("compare_object_observations", value=value, receipt=receipt)

    def _inspect_contact_geometry(self, object: Any = None, pose: Any = None, jaw_opening_m: Any = None) -> CallResult:
        """Project the finger pads' closing volume at a grasp pose (default: the TCP when the observation was
        taken) onto the target's points: what lies between the pads, how wide it is along the jaw axis, and
        whether other objects or the table are in the pads' way."""
        det = self._detection("object", object)
        obs = det.observation
        opening = (
            self.kin.profile.max_jaw_opening_m()
            if jaw_opening_m is None
            else A.number("jaw_opening_m", jaw_opening_m, lo=0.0, hi=self.kin.profile.max_jaw_opening_m())
        )
        position, rotation = self.kin.forward(obs.q_rad) if pose is None else A.pose("pose", pose)
        cloud = self._cloud(obs, det.camera)
        g = self.kin.profile.gripper_geometry
        pad_x, pad_y, pad_z = g.finger_pad_size_m
        z_lo, z_hi = g.fingertips_below_tcp_m - pad_z, g.fingertips_below_tcp_m

        def in_tcp(mask: np.ndarray) -> np.ndarray:
            pts = cloud.points[mask].astype(np.float64)
            return (pts - position) @ rotation  # rows: coordinates in the TCP frame

        target = in_tcp(det.mask)
        band = (np.abs(target[:, 0]) <= pad_x / 2) & (target[:, 2] >= z_lo) & (target[:, 2] <= z_hi)
        between = band & (np.abs(target[:, 1]) <= opening / 2)
        width = float(np.ptp(target[band, 1])) if band.sum() >= 3 else 0.0
        centre_offset = float((target[band, 1].max() + target[band, 1].min()) / 2) if band.sum() >= 3 else math.nan
        others = in_tcp(object_pixels(cloud) & ~det.mask)
        in_pads = (
            (np.abs(others[:, 0]) <= pad_x / 2)
            & (others[:, 2] >= z_lo)
            & (others[:, 2] <= z_hi)
            & (np.abs(others[:, 1]) > opening / 2)
            & (np.abs(others[:, 1]) <= opening / 2 + pad_y)
        )
        # the hand itself comes down too: what stands under its underside meets the palm before the pads reach the
        # grasp (libero_object/1: the palm on a can 11 cm from the cream cheese). Its outline from above is taken
        # as the URDF box with round ends (a hand's are; the box's corners would refuse grasps whose palm passes a
        # neighbour's corner by a few millimetres, as libero_10/1's past the milk carton)
        under_palm = np.zeros(len(others), dtype=bool)
        if g.palm_size_m is not None and g.palm_above_tcp_m is not None:
            half_across, half_along = g.palm_size_m[0] / 2, g.palm_size_m[1] / 2
            beyond = np.maximum(np.abs(others[:, 1]) - (half_along - half_across), 0.0)  # past the straight sides
            under_palm = (np.hypot(others[:, 0], beyond) <= half_across) & (others[:, 2] <= -g.palm_above_tcp_m)
        palm_blocked = int(under_palm.sum()) >= PALM_MIN_POINTS
        corners = np.array([[sx * pad_x / 2, sy * (opening / 2 + pad_y / 2), z_hi] for sx in (-1, 1) for sy in (-1, 1)])
        tips = corners @ rotation.T + position
        fingertip_height = float((tips @ cloud.table_normal + cloud.table_d).min())
        fits = bool(band.sum() >= 3 and width < opening)
        clear = not in_pads.any() and not palm_blocked
        ok = bool(between.sum() >= 10 and fits and clear and fingertip_height >= -0.002)
        value = {
            "object": det.id,
            "points_between_pads": int(between.sum()),
            "width_along_jaw_m": round(width, 4),
            "jaw_opening_m": round(opening, 4),
            "fits_between_pads": fits,
            "center_offset_along_jaw_m": None if math.isnan(centre_offset) else round(centre_offset, 4),
            "obstacle_points_in_pad_paths": int(in_pads.sum()),
            "obstacle_points_under_palm": int(under_palm.sum()),
            "fingertip_height_above_table_m": round(fingertip_height, 4),
            "graspable": ok,
        }
        receipt = (
            f"inspect_contact_geometry: {det.id} {'GRASPABLE' if ok else 'not graspable'}: {int(between.sum())} pts "
            f"between pads, width {width * 100:.1f} cm of {opening * 100:.1f}, {int(in_pads.sum())} obstacle pts, "
            f"{int(under_palm.sum())} under the palm, "
            f"tips {fingertip_height * 100:.1f} cm above table"
        )
        return CallResult.ok("inspect_contact_geometry", value=value, receipt=receipt)

    def _inspect_release_geometry(
        self, object: Any = None, destination: Any = None, position: Any = None
    ) -> CallResult:
        """Signed clearance of the object's footprint, moved to the proposed release point (default: the
        destination's centre), inside the destination's support area (its inner floor for open containers):
        positive = every corner inside by that much, negative = the worst corner is outside by that much."""
        obj, dest = self._detection("object", object), self._detection("destination", destination)
        go, gd = self._geometry(obj), self._geometry(dest)
        if position is None:
            target = gd.center_m[:2]
        elif isinstance(position, list | tuple) and len(position) in (2, 3):
            target = A.vector("position", position, len(position))[:2]
        else:
            raise A.ArgumentError(f"position must be [x, y] or [x, y, z] in metres, got {position!r}")
        footprint = go.footprint_xy_m - go.center_m[:2] + target
        support = gd.footprint_xy_m
        if gd.concave:  # the inner floor: the rim's inside, one wall thickness in
            scale = max(0.0, 1.0 - 2 * CONTAINER_WALL_M / max(float(gd.extents_m[1]), 1e-6))
            support = gd.center_m[:2] + (support - gd.center_m[:2]) * scale
        poly = support.astype(np.float32).reshape(-1, 1, 2)
        clearances = [cv2.pointPolygonTest(poly, (float(x), float(y)), True) for x, y in footprint]
        clearance = float(min(clearances))
        support_top = gd.bottom_z_m + CONTAINER_WALL_M if gd.concave else gd.top_z_m
        value = {
            "object": obj.id,
            "destination": dest.id,
            "release_xy_m": [round(float(x), 4) for x in target],
            "signed_clearance_m": round(clearance, 4),
            "footprint_inside": clearance >= 0,
            "support_top_z_m": round(support_top, 4),
            "object_height_m": round(float(go.extents_m[2]), 4),
        }
        receipt = (
            f"inspect_release_geometry: {obj.id} over {dest.id} at ({target[0]:.3f}, {target[1]:.3f}) m: "
            f"clearance {clearance * 100:+.1f} cm ({'inside' if clearance >= 0 else 'OUTSIDE'}), "
            f"support top {support_top * 100:.1f} cm"
        )
        return CallResult.ok("inspect_release_geometry", value=value, receipt=receipt)

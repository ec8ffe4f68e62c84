"""Observations under handles. An observation keeps its images, calibration and the robot state for
the episode; it goes stale as soon as the scene may have changed (any executed physical action),
and stale use is refused with `stale_observation`, never silently accepted."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from captain_ros.core.contract import CallFailure, FailureCategory


class PerceptionError(CallFailure):
    """A perception call failed (nothing found, no depth, stale observation, ...)."""


@dataclass(frozen=True)
class CameraImage:
    """One camera's aligned RGB-D pair with calibration. `rotation`/`position_m`: optical frame in the base
    frame (z forward, x right, y down). Depth is metres along z; 0 or NaN = no depth."""

    name: str
    rgb: np.ndarray  # (H, W, 3) uint8
    depth_m: np.ndarray  # (H, W) float32
    K: np.ndarray  # (3, 3)
    position_m: np.ndarray
    rotation: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.depth_m.shape


@dataclass
class Observation:
    handle: str
    time_s: float
    images: dict[str, CameraImage]
    q_rad: np.ndarray
    jaw_opening_m: float
    scene_version: int
    cache: dict = field(default_factory=dict, repr=False)  # per-camera segmentation, computed on first use


class ObservationStore:
    """Observations of one episode. `scene_changed()` is called after every executed physical action."""

    def __init__(self) -> None:
        self._observations: dict[str, Observation] = {}
        self.scene_version = 0

    def add(
        self, time_s: float, images: dict[str, CameraImage], q_rad: np.ndarray, jaw_opening_m: float
    ) -> Observation:
        handle = f"obs-{len(self._observations) + 1}"
        obs = Observation(handle, time_s, images, np.asarray(q_rad, dtype=float), jaw_opening_m, self.scene_version)
        self._observations[handle] = obs
        return obs

    def scene_changed(self) -> None:
        self.scene_version += 1

    def is_stale(self, obs: Observation) -> bool:
        return obs.scene_version != self.scene_version

    def all(self) -> list[Observation]:
        return list(self._observations.values())

    def latest(self) -> Observation | None:
        return next(reversed(self._observations.values()), None)

    def get(self, handle: object, *, allow_stale: bool = False) -> Observation:
        if not isinstance(handle, str) or not handle:
            raise PerceptionError(
                FailureCategory.INVALID_ARGUMENT, f"observation handle must be a string like 'obs-1', got {handle!r}"
            )
        obs = self._observations.get(handle)
        if obs is None:
            known = ", ".join(list(self._observations)[-5:]) or "none yet: call observe()"
            raise PerceptionError(
                FailureCategory.INVALID_ARGUMENT, f"unknown observation handle {handle!r} (known: {known})"
            )
        if not allow_stale and self.is_stale(obs):
            raise PerceptionError(
                FailureCategory.STALE_OBSERVATION,
                f"{handle} was taken before the last physical action; the scene may have changed: observe() again",
            )
        return obs

"""Observations under handles. An observation keeps its images, calibration and the robot state; it goes
stale as soon as the scene may have changed (any executed physical action), and stale use is refused
with `stale_observation`, never silently accepted. An episode keeps a bounded number of observations
(by count and by bytes, images and cached clouds counted): the oldest are dropped first, the receipt of
the `observe` that dropped them says so, and using a dropped handle is refused with a message that says
why."""

from __future__ import annotations

from concurrent.futures import Future
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
    # per-camera clouds (built in the background after observe) and segmentation (computed on first use)
    cache: dict = field(default_factory=dict, repr=False)


def observation_bytes(obs: Observation) -> int:
    """The memory an observation holds: its images and the numpy arrays in its cache (clouds, masks)."""
    total = sum(image.rgb.nbytes + image.depth_m.nbytes for image in obs.images.values())
    pending = list(obs.cache.values())
    while pending:
        item = pending.pop()
        if isinstance(item, np.ndarray):
            total += item.nbytes
        elif isinstance(item, list | tuple):
            pending += item
        elif isinstance(item, dict):
            pending += item.values()
        elif isinstance(item, Future):  # a cloud still being built counts once it is
            if item.done() and item.exception() is None:
                pending.append(item.result())
        elif hasattr(item, "__dict__"):
            pending += vars(item).values()
    return total


class ObservationStore:
    """Observations of one episode. `scene_changed()` is called after every executed physical action. At most
    `max_kept` observations and `max_bytes` of them are kept; the newest is always kept."""

    def __init__(self, max_kept: int = 8, max_bytes: int = 512 * 1024**2) -> None:
        if max_kept < 1 or max_bytes <= 0:
            raise ValueError(f"an observation store keeps at least one observation, got {max_kept} / {max_bytes} B")
        self.max_kept, self.max_bytes = max_kept, max_bytes
        self._observations: dict[str, Observation] = {}
        self._count = 0  # handles are never reused
        self.scene_version = 0
        self.dropped: list[str] = []  # the handles the last add() dropped

    def add(
        self, time_s: float, images: dict[str, CameraImage], q_rad: np.ndarray, jaw_opening_m: float
    ) -> Observation:
        self._count += 1
        handle = f"obs-{self._count}"
        obs = Observation(handle, time_s, images, np.asarray(q_rad, dtype=float), jaw_opening_m, self.scene_version)
        self.dropped = []
        kept = [(h, observation_bytes(o)) for h, o in self._observations.items()]
        total = observation_bytes(obs) + sum(size for _, size in kept)
        while kept and (len(kept) >= self.max_kept or total > self.max_bytes):
            oldest, size = kept.pop(0)
            del self._observations[oldest]
            self.dropped.append(oldest)
            total -= size
        self._observations[handle] = obs
        return obs

    def __contains__(self, obs: Observation) -> bool:
        return self._observations.get(obs.handle) is obs

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
            number = handle.removeprefix("obs-")
            if number.isdigit() and 0 < int(number) <= self._count:
                raise PerceptionError(
                    FailureCategory.INVALID_ARGUMENT,
                    f"{handle} was dropped: an episode keeps its {self.max_kept} most recent observations "
                    f"(kept: {', '.join(self._observations)}); observe() again",
                )
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

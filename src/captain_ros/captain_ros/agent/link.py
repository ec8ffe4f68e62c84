"""How the agent reaches the harness: one interface (`HarnessLink`), one link per world (`captain_ros.worlds`).
`CoreLink` is the harness core in this process, the base of the twin world's `InProcessLink` (worlds/twin/link.py:
unit tests, benchmarks, rollouts) and LIBERO's `LiberoLink`; the agent node's `RosLink` goes through the motion and
perception nodes' ROS interfaces. Scoring (`score`) is the host's: ground truth scores
the result and never enters the episode's decisions, except the missed-finish stop, which is the
host ending an episode the policy already solved (CaPtain App. E).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captain_ros.core.contract import CallResult


class LinkError(RuntimeError):
    """Infrastructure: the harness, the simulator or the ROS link failed. Never a task outcome."""


@dataclass
class EpisodeStart:
    episode_id: str
    task: str
    start_id: str
    instruction: str
    criteria: list[str] = field(default_factory=list)  # the host's success criteria in words (TASK.md)
    task_md: str = ""  # a TASK.md the host generated (twin_node's reset answer); "" = the agent builds it


@dataclass
class Score:
    success: bool  # every goal holds on the current state (host success)
    subgoals: list[str] = field(default_factory=list)


def call_dict(result: CallResult) -> dict[str, Any]:
    """What a cell's robot call returns, plus the receipt and name the agent keeps for the transcript."""
    return {**result.to_dict(), "capability": result.capability, "receipt": result.receipt}


class HarnessLink(ABC):
    """Physical time (`physical_s`): seconds the arm spent executing motions, which is the motions' own
    duration on a real arm; the agent subtracts it when it measures its own overhead."""

    physical_s: float = 0.0

    @abstractmethod
    def reset(self, task: str, start_id: str | None, split: str, episode_id: str) -> EpisodeStart: ...

    @abstractmethod
    def call(self, capability: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Run one capability; a result dict (never raises for the policy's mistakes; LinkError when the
        harness cannot be reached)."""

    @abstractmethod
    def images(self, handle: str) -> list[tuple[str, np.ndarray]]:
        """(camera, RGB array) of an observation, for attaching to the next request."""

    def note_request(self) -> None:  # noqa: B027 - only a harness that counts requests needs it
        """The agent issued one model request."""

    @abstractmethod
    def score(self) -> Score | None:
        """The host's verdict on the current scene; None where there is no scorer (a real arm)."""

    @abstractmethod
    def settle(self, seconds: float) -> None:
        """Let the scene come to rest with the arm holding (before scoring the final state)."""

    def close(self) -> None:  # noqa: B027
        pass


class _MotionTimer:
    """Times the arm's own motion in-process: a motion's control loop (the executor, and the jaw's settle
    loop) is paced by the arm on real hardware and lasts the motion's duration there; here the twin runs it
    as fast as it can. Planning before it (IK, checks) stays outside: that is the harness's overhead."""

    def __init__(self, link: CoreLink):
        self.link, self.depth = link, 0

    def timed(self, fn):
        def wrapper(*args, **kwargs):
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.link.physical_s += time.perf_counter() - t0

        return wrapper


class _TimedBackend:
    """The backend with its control-period wait timed (the jaw's settle loop waits on it)."""

    def __init__(self, backend, timer: _MotionTimer):
        self._backend = backend
        self.wait_period = timer.timed(backend.wait_period)

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


class CoreLink(HarnessLink):
    """A link to a harness core in this process (`self.harness`, made by the subclass at reset): the calls, images
    and request counts go straight to it."""

    harness = None

    def _timed_harness(self, backend, kinematics):
        """The harness core on `backend`, with the arm's own motion time counted in `physical_s`."""
        from captain_ros.harness.harness import Harness

        timer = _MotionTimer(self)
        harness = Harness(_TimedBackend(backend, timer), self.config, kinematics)
        harness.executor.execute = timer.timed(harness.executor.execute)
        return harness

    def call(self, capability: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        return call_dict(self.harness.call(capability, **kwargs))

    def images(self, handle: str) -> list[tuple[str, np.ndarray]]:
        obs = self.harness.perception.store.get(handle, allow_stale=True)
        return [(name, image.rgb) for name, image in obs.images.items()]

    def note_request(self) -> None:
        self.harness.note_request()

    def settle(self, seconds: float) -> None:
        """Hold the arm for `seconds` of the backend's time; the jaw keeps its command (a held object stays held)."""
        backend = self.harness.backend
        backend.hold()
        for _ in range(max(1, round(seconds / backend.control_period_s))):
            backend.wait_period()

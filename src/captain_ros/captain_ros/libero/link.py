"""LIBERO episodes for the agent: the harness core on the LIBERO backend, scored by the benchmark's own goal predicates.

Tasks are named `<suite>/<index>` (`libero_spatial/0` ... `libero_goal/9`), start ids are the official initial
states of that task (`0` ... `49`). The evaluation split is the initial states 11-16 that CaPtain holds out (§4:
"the official held-out initial states 11-16 of all 40 tasks"); the training split is every other official state,
so nothing drawn for training is ever evaluated on.

The policy sees what it sees on the twin: the same API, receipts and generated TASK.md, images of LIBERO's two
cameras with their depth and calibration. Host success is LIBERO's `_eval_predicate` over the task's goal, read on
the final state; the policy never sees it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from captain_ros.agent.link import CoreLink, EpisodeStart, LinkError, Score
from captain_ros.core.config import HarnessConfig
from captain_ros.harness.backend import BackendError

EVAL_STATES = tuple(range(11, 17))  # CaPtain's held-out official initial states
N_STATES = 50  # official initial states per task
SPLITS = ("train", "eval", "any")


def parse_task(task: str) -> tuple[str, int]:
    """`libero_spatial/3` -> ("libero_spatial", 3); ValueError naming the expected form otherwise."""
    match = re.fullmatch(r"(libero_[a-z0-9_]+)/(\d+)", task.strip())
    if match is None:
        raise ValueError(f"a LIBERO task is '<suite>/<index>' (e.g. libero_spatial/0), got {task!r}")
    return match.group(1), int(match.group(2))


def split_states(split: str) -> tuple[int, ...]:
    """The official initial states of a split: eval = 11-16, train = the other 44, any = all 50."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "eval":
        return EVAL_STATES
    if split == "train":
        return tuple(i for i in range(N_STATES) if i not in EVAL_STATES)
    return tuple(range(N_STATES))


def start_states(split: str, count: int, rng: np.random.Generator) -> list[str]:
    """`count` official initial states of a split for one task, each at most once. The evaluation split gives its
    first `count` in order (all six is CaPtain's protocol; fewer nest, so a short run is a prefix of a long one);
    the others a seeded draw."""
    states = split_states(split)
    if not 1 <= count <= len(states):
        raise ValueError(
            f"a LIBERO task has {len(states)} official initial states in the {split} split, so 1..{len(states)} "
            f"start states per task, got {count}"
        )
    chosen = states[:count] if split == "eval" else sorted(rng.choice(states, size=count, replace=False).tolist())
    return [str(s) for s in chosen]


def list_tasks(suites: list[str], selection: str = "all", log_dir: Path | None = None) -> list[str]:
    """The tasks `<suite>/<index>` of LIBERO suites, as the benchmark lists them (asked of a LIBERO server).
    `selection`: "all", or comma-separated task names (`libero_goal/3`) or indices taken in every suite (`0,4`).
    ValueError naming the known suites or tasks for anything unknown."""
    from captain_ros.libero.libero_backend import LiberoArgumentError, LiberoProcess

    with LiberoProcess(64, 64, log_dir=log_dir) as process:
        try:
            known = [f"{suite}/{t['index']}" for suite in suites for t in process.call("tasks", suite=suite)]
        except LiberoArgumentError as exc:
            raise ValueError(str(exc).removeprefix("ArgumentError: ")) from None
    if selection.strip() == "all":
        return known
    wanted = [t.strip() for t in selection.split(",") if t.strip()]
    chosen = [t for t in known if t in wanted or t.split("/")[1] in wanted]
    unknown = [w for w in wanted if not any(w in (t, t.split("/")[1]) for t in known)]
    if unknown or not chosen:
        raise ValueError(
            f"unknown LIBERO task(s) {', '.join(unknown) or selection!r}; the suites have {', '.join(known)}"
        )
    return chosen


def spoken(name: str) -> str:
    """`akita_black_bowl_1` -> 'the akita black bowl'; `wooden_cabinet_1_top_region` -> 'the wooden cabinet top
    region'."""
    words = [w for w in name.split("_") if not w.isdigit()]
    return "the " + " ".join(words)


def criteria(goal: list[list[str]]) -> list[str]:
    """LIBERO's goal predicates in words, with the tolerances its checks use (libero.libero.envs.predicates)."""
    lines = []
    for predicate, *args in goal:
        p = predicate.lower()
        if p == "on" and len(args) == 2:
            lines.append(
                f"{spoken(args[0])} rests on {spoken(args[1])} and touches it (on an object: centred within 3 cm "
                "of it and not below it)"
            )
        elif p == "in" and len(args) == 2:
            lines.append(f"{spoken(args[0])} is inside {spoken(args[1])} and touches it")
        elif p == "open" and len(args) == 1:
            lines.append(f"{spoken(args[0])} is open (a drawer pulled out 14 cm or more)")
        elif p == "close" and len(args) == 1:
            lines.append(f"{spoken(args[0])} is closed (a drawer pushed fully in)")
        elif p == "turnon" and len(args) == 1:
            lines.append(f"{spoken(args[0])} is turned on (its knob turned past 0.5 rad)")
        elif p == "turnoff" and len(args) == 1:
            lines.append(f"{spoken(args[0])} is turned off")
        else:
            lines.append(f"the benchmark's predicate ({' '.join([predicate, *args])}) holds")
    return lines


class LiberoLink(CoreLink):
    """The harness core on LIBERO scenes, in this process; the simulator in the LIBERO server it starts."""

    def __init__(
        self,
        config: HarnessConfig,
        *,
        image_size_px: int = 512,
        log_dir: Path | None = None,
        seed: int = 0,
        oracle_segmentation: bool = False,
        appearance: bool = True,
    ):
        """`appearance`: perception names LIBERO's objects by their look (libero/appearance_library.py: a
        library rendered from the benchmark's asset models, no simulator state); false: colour and shape only.
        `oracle_segmentation`: segment with the simulator's object ids instead (libero/oracle.py), a labelled oracle."""
        self.config = config
        self.oracle_segmentation, self.appearance = oracle_segmentation, appearance
        self.image_size_px, self.log_dir = image_size_px, log_dir
        self.rng = np.random.default_rng(seed)
        self.backend = self.harness = None

    def _reset_scene(self, *scene) -> dict[str, Any]:
        """Start the LIBERO server and the harness on the first reset; load (suite, task, initial state)."""
        from captain_ros.core.kinematics import Kinematics
        from captain_ros.libero.libero_backend import LiberoBackend, LiberoProcess

        if self.backend is None:
            process = LiberoProcess(self.image_size_px, self.image_size_px, log_dir=self.log_dir)
            safety = self.config.safety
            self.backend = LiberoBackend(
                process,
                safety.control_period_s,
                stop_decel_radps2=safety.stop_decel_radps2,
                oracle_segmentation=self.oracle_segmentation,
            )
        self.backend.reset(*scene)
        if self.harness is None:  # the harness reads the arm's state when it is made: after the first reset
            self.harness = self._timed_harness(self.backend, Kinematics(profile=self.backend.profile))
            if self.oracle_segmentation:
                from captain_ros.libero.oracle import OracleSegmenter

                self.harness.perception.remote_segmenter = OracleSegmenter(self.backend)
            elif self.appearance:
                from captain_ros.libero.appearance_library import library

                self.harness.perception.appearance = library()
        return self.backend.episode

    def reset(self, task: str, start_id: str | None, split: str, episode_id: str) -> EpisodeStart:
        from captain_ros.libero.libero_backend import LiberoArgumentError

        suite, index = parse_task(task)
        states = split_states(split)
        if start_id in (None, ""):
            state = int(self.rng.choice(states))
        elif not str(start_id).isdigit():
            raise ValueError(
                f"a LIBERO start id is an official initial state index 0..{N_STATES - 1}, got {start_id!r}"
            )
        else:
            state = int(start_id)
            if state not in states:
                raise ValueError(f"initial state {state} is not in the {split} split ({split_states(split)})")
        try:
            info = self._reset_scene(suite, index, state)
            self.harness.new_episode(episode_id)
        except LiberoArgumentError as exc:
            raise ValueError(str(exc)) from None
        except BackendError as exc:
            raise LinkError(f"LIBERO at reset: {exc}") from exc
        return EpisodeStart(episode_id, f"{suite}/{index}", str(state), info["instruction"], criteria(info["goal"]))

    def score(self) -> Score:
        try:
            verdict = self.backend.success()
        except BackendError as exc:
            raise LinkError(f"LIBERO while scoring: {exc}") from exc
        held = [" ".join(g) for g, ok in zip(verdict["goals"], verdict["held"], strict=True) if ok]
        return Score(bool(verdict["success"]), held)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
        self.backend = self.harness = None

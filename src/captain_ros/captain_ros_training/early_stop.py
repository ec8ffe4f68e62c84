"""The critic's early stop of hopeless RL rollouts (CaPtain App. E, §3.3 "Training distribution"), worker side.

    "An episode is cut when V < 0.02 for 5 consecutive requests after request 5. A deterministic 5% control slice is
    never cut."  "... except in a 5% control slice and on the hard tasks. A cut episode settles as budget-exhausted
    (R = -0.1), so the critic also shapes returns."

Where it runs: the critic is trained in the driver (captain_ros_training.rl_host), the episodes run in the rollout
workers (captain_ros.bridge.rollout, one process each). The driver publishes its critic to one file after the warm
start and after every round (`publish`: written beside, then renamed over, so a reader never sees half a file); each
worker's `CriticEarlyStop` reloads it when the file changes and evaluates V(s_t, t) itself on CPU, from the
privileged snapshot the episode recorder takes before request t (the same x(s_t) and request index the critic is
trained on: captain_ros_training.credit). No request waits on the driver, and a worker never sees the policy's
weights or the trainer's state. Until a critic is published (the warm-start waves: the SFT policy's episodes the
critic is fitted on) nothing is cut.

The rule's timing, where the paper is silent: V(s_t, t) is taken on the state before request t (after request t-1),
the way `credit.cut_request` indexes it; when the 5th consecutive value below the threshold among t = 6, 7, ... is
seen, request t is not sent and the episode ends as budget-exhausted (so the earliest cut leaves 9 requests run).
The episode is scored by the host as any other (its `host_success` is the truth), its outcome is budget_exhausted
(R = -0.1 plus its costs) and it is trained on like any other valid episode, as the paper says.

The control slice (`credit.in_control_slice`: sha256 of the episode id, deterministic) and the hard tasks (the
twin's tasks with `hard: true` in config/tasks.yaml) are never cut; for them the rule still runs, and the episode's
end record says at which request it *would* have been cut, so `early_stop_counts` can report the false-stop rate: a
control episode that would have been cut and ended in host success.

Each episode's `episode_end` record carries `early_stop` (`EpisodeStop.record`): the rule, whether it cut the
episode and before which request, whether the episode was in the control slice or a hard task, the request at which
the rule alone would have cut, the critic's version and the values it saw. Evaluation never stops early (CaPtain §4:
"no early stopping"): its rollouts have no stopper, and captain_ros_training.student_eval refuses a cut episode.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from captain_ros_training.credit import EarlyStopConfig, in_control_slice, rule_cut_request

RULE = "critic"  # the only early-stop rule here (the missed-finish stop is the episode loop's, an outcome of its own)


def publish(critic: Any, path: Path) -> Path:
    """Write the critic where the workers read it: beside, then renamed over (atomic on one file system)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    critic.save(partial)
    os.replace(partial, path)
    return path


class EpisodeStop:
    """One episode's early-stop state: the values seen, whether and where it was cut (the recorder's `early_stop`).
    `value_of(snapshot, t, task) -> (V, critic_version)` or None while no critic is published."""

    def __init__(self, episode_id: str, value_of: Any, config: EarlyStopConfig = EarlyStopConfig()):
        self.episode_id, self.value_of, self.config = episode_id, value_of, config
        self.control = in_control_slice(episode_id, config.control_fraction)
        self.task = ""
        self.hard = False
        self.values: list[float] = []  # V(s_t, t) for t = 1, 2, ...
        self.versions: set[str] = set()
        self.would_cut: int | None = None
        self.cut: int | None = None

    def begin(self, task: str, hard: bool) -> None:
        self.task, self.hard = task, bool(hard)

    def check(self, index: int, snapshot: dict[str, Any]) -> str | None:
        """V(s_index, index) from the snapshot taken before request `index`; a reason when the episode is cut."""
        if index != len(self.values) + 1:
            raise ValueError(f"early stop: request {index} after {len(self.values)} values (out of order)")
        got = self.value_of(snapshot, index, self.task)
        if got is None:  # no critic yet: this episode is never cut (its values would have gaps)
            self.values.append(float("nan"))
            return None
        value, version = got
        self.values.append(float(value))
        self.versions.add(str(version))
        if self.would_cut is None and not any(math.isnan(v) for v in self.values):  # no NaN: a critic saw every state
            self.would_cut = rule_cut_request(self.values, self.config)
        if self.would_cut is not None and not self.control and not self.hard and self.cut is None:
            self.cut = self.would_cut
            c = self.config
            return (
                f"the critic's V < {c.value_threshold} for {c.consecutive_n} consecutive requests after request "
                f"{c.after_request_n} (CaPtain App. E)"
            )
        return None

    def record(self) -> dict[str, Any]:
        """The end record's `early_stop`."""
        return {
            "rule": RULE,
            "stopped": self.cut is not None,
            "stopped_before_request": self.cut,
            "would_stop_before_request": self.would_cut,
            "control_slice": self.control,
            "hard_task": self.hard,
            "critic_versions": sorted(self.versions),
            "values": [None if math.isnan(v) else round(v, 6) for v in self.values],
            "config": asdict(self.config),
        }


class CriticEarlyStop:
    """A worker's stopper: the critic the driver published at `path`, reloaded when the file changes."""

    def __init__(self, path: Path, config: EarlyStopConfig = EarlyStopConfig()):
        self.path, self.config = Path(path), config
        self._critic: Any = None
        self._stamp: tuple[int, int] | None = None

    def critic(self) -> tuple[Any, str] | None:
        """The published critic and its version (the file's mtime and size), None while there is none."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            from captain_ros_training.critic import Critic

            self._critic, self._stamp = Critic.load(self.path), stamp
        return self._critic, f"{self._stamp[0]}-{self._stamp[1]}"

    def value(self, snapshot: dict[str, Any], t: int, task: str) -> tuple[float, str] | None:
        """V(s, t) of CaPtain Eq. 3 for one privileged snapshot, with the critic's version."""
        got = self.critic()
        if got is None:
            return None
        critic, version = got
        import torch

        from captain_ros_training.critic import features_of

        if task not in critic.tasks:
            raise KeyError(f"task {task!r} is not in the published critic's vocabulary")
        # one thread: this worker is one of many on the host's cores. Set around the call only: a process-wide
        # setting would change the reduction order, and so the low bits, of every later torch computation here
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            v = critic.value_of(
                torch.tensor([features_of({"snapshot": snapshot})], dtype=torch.float32),
                torch.tensor([float(t)]),
                torch.tensor([critic.tasks.index(task)]),
            )
        finally:
            torch.set_num_threads(threads)
        return float(v[0]), version

    def episode(self, episode_id: str) -> EpisodeStop:
        return EpisodeStop(episode_id, self.value, self.config)


def early_stop_counts(ends: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-round counts from episodes' end records (rl_rounds.jsonl): episodes cut, and the control slice's
    would-have-been-cut episodes with how many of those ended in host success (App. E's false stops)."""
    records = [(e, e.get("early_stop")) for e in ends]
    watched = [(e, r) for e, r in records if r]
    control = [(e, r) for e, r in watched if r.get("control_slice")]
    would = [(e, r) for e, r in control if r.get("would_stop_before_request") is not None]
    false_stops = sum(1 for e, _ in would if e.get("host_success"))
    return {
        "early_stop_watched": len(watched),
        "early_stopped": sum(1 for _, r in watched if r.get("stopped")),
        "early_stop_control": len(control),
        "early_stop_control_would_stop": len(would),
        "early_stop_control_false_stops": false_stops,  # would have been cut, yet ended in host success
        "early_stop_hard_would_stop": sum(
            1 for _, r in watched if r.get("hard_task") and r.get("would_stop_before_request") is not None
        ),
    }

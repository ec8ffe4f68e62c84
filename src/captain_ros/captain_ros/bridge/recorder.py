"""The episode adapter on a simulator: writes an episode's start, one `step` per request and its end into the
episode store, beside the `model_call` records the recording proxy writes for the same requests.

Before every request it takes the simulator's privileged snapshot from the world's privileged-state source
(`captain_ros.worlds`: on the twin, CaPtain App. A.2: the 36 critic features plus raw poses; on LIBERO, object
poses, fixture joints and the goal predicates; TRAINING ONLY). The
snapshot goes to the store and nowhere else: nothing of it reaches the messages, so the policy never sees it.
After the request it stores that request's robot calls with their receipts, the images the policy was shown
(content-addressed), its timing and its App. E costs. At the end it stores the adapter's values: outcome,
reward R_i (Eq. 7), the staged sub-goal reward of hard tasks, the return G_i = R_i + sum c_t, and validity
(infrastructure failures and incomplete records are invalid).
"""

from __future__ import annotations

import base64
import platform
import time
from dataclasses import dataclass, field
from typing import Any

from captain_ros.bridge.rewards import CostTracker, RewardConfig, subgoal_reward, terminal_reward
from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeStore
from captain_ros.core.contract import PHYSICAL_CAPABILITIES, _json_safe
from captain_ros.worlds.privileged import PrivilegedSource


@dataclass
class EpisodeMeta:
    """Who runs an episode and as which attempt of which group."""

    attempt: int = 0
    group_id: str = ""
    policy_version: int = 0
    policy: str = ""  # a label: "expert", a model name or checkpoint
    worker: str = ""
    split: str = "any"
    host: str = field(default_factory=platform.node)
    backend: str = "twin"  # the simulator the episode ran on (LIBERO: with its segmentation, e.g. "libero/appearance")


def _shadow_of(call: dict[str, Any]) -> dict[str, Any]:
    """A shadow-checked call's prediction beside its outcome (harness/shadow.py), when it has one."""
    value = call.get("value")
    return {"shadow": value["shadow"]} if isinstance(value, dict) and "shadow" in value else {}


class EpisodeRecorder:
    """One episode's records (the agent's `Recorder` hooks). `source` reads the simulator the link drives
    (directly: the link's policy-facing side never carries it).
    `expect_model_calls`: the policy's requests go through the recording proxy into the same store, so an
    episode missing any request's model_call is incomplete and invalid."""

    def __init__(
        self,
        store: EpisodeStore,
        episode_id: str,
        source: PrivilegedSource,
        meta: EpisodeMeta,
        *,
        rewards: RewardConfig = RewardConfig(),
        expect_model_calls: bool = True,
        early_stop: Any = None,
    ):
        self.store, self.episode_id, self.source, self.meta = store, episode_id, source, meta
        self.rewards, self.expect_model_calls = rewards, expect_model_calls
        # CaPtain App. E (RL rollouts only; None never stops): an object with begin(task, hard),
        # check(index, snapshot) -> str | None and record() -> dict (captain_ros_training.early_stop.EpisodeStop)
        self.early_stop = early_stop
        self.costs: CostTracker | None = None
        self._snapshot: dict[str, Any] | None = None
        self._snapshot_s = 0.0
        self.first_solved: int | None = None
        self.cost_total = 0.0
        self.record_s = 0.0  # the recorder's own time (snapshots, encoding, durable writes)
        self.steps = 0

    def _append(self, kind: str, index: int, payload: dict[str, Any]) -> None:
        self.store.append(Record(self.episode_id, kind, index, _json_safe(payload)))

    def started(self, start: Any) -> None:
        t0 = time.perf_counter()
        self.costs = CostTracker(start.task, self.rewards)
        if self.early_stop is not None:
            self.early_stop.begin(start.task, self.source.ladder()[1])
        self._append(
            "episode_start",
            0,
            {
                "task": start.task,
                "family": self.source.family(start.task),
                "backend": self.meta.backend,
                "start_id": start.start_id,
                "split": self.meta.split,
                "attempt": self.meta.attempt,
                "group_id": self.meta.group_id or f"{start.task}/{start.start_id}",
                "policy_version": self.meta.policy_version,
                "policy": self.meta.policy,
                "worker": self.meta.worker,
                "host": self.meta.host,
                "instruction": start.instruction,
                "started_unix_s": time.time(),
            },
        )
        self.record_s += time.perf_counter() - t0

    def before_request(self, index: int) -> None:
        t0 = time.perf_counter()
        self._snapshot = self.source.snapshot()
        self._snapshot_s = time.perf_counter() - t0
        self._started_unix_s = time.time()
        if self._snapshot["success"] and self.first_solved is None:
            self.first_solved = index
        self.record_s += self._snapshot_s

    def stop_early(self, index: int) -> str | None:
        """The episode loop asks after `before_request(index)`: the early-stop rule's verdict on the state just
        snapshotted (the privileged x(s_t) the critic reads; it never reaches the policy). None: go on."""
        if self.early_stop is None or self._snapshot is None:
            return None
        return self.early_stop.check(index, self._snapshot)

    def after_request(
        self, index: int, timing: Any, calls: list[dict], images: list[tuple], cells: list[dict] | None = None
    ) -> None:
        t0 = time.perf_counter()
        solved_before = self.first_solved is not None and index >= self.first_solved
        physical = [c for c in calls if c.get("capability") in PHYSICAL_CAPABILITIES]
        costs = self.costs.request(physical, solved_before)
        self.cost_total += costs["total"]
        shown = []
        for label, part in images:
            header, _, data = part["image_url"]["url"].partition(",")
            media_type = header.removeprefix("data:").split(";")[0]
            digest = self.store.put_blob(base64.b64decode(data), media_type)
            shown.append({"label": label, "media_type": media_type, "sha256": digest})
        self._append(
            "step",
            index,
            {
                "snapshot": self._snapshot,
                "calls": [
                    {
                        "capability": c.get("capability"),
                        "arguments": c.get("arguments", {}),
                        "success": bool(c.get("success")),
                        "executed": bool(c.get("executed")),
                        "failure_category": c.get("failure_category"),
                        "message": c.get("message", ""),
                        "receipt": c.get("receipt") or "",
                        "physical": c.get("capability") in PHYSICAL_CAPABILITIES,
                        **_shadow_of(c),
                    }
                    for c in calls
                ],
                "images": shown,
                "cells": list(cells or []),  # per cell of the reply: source, status, the error's last line
                "timing": {
                    "started_unix_s": self._started_unix_s,
                    "total_s": timing.total_s,
                    "generation_s": timing.generation_s,
                    "physical_s": timing.physical_s,
                    "overhead_s": timing.overhead_s,
                    "snapshot_s": self._snapshot_s,
                },
                "costs": costs,
                "solved_before": solved_before,
            },
        )
        self.steps = index
        self.record_s += time.perf_counter() - t0

    def ended(self, result: Any) -> None:
        t0 = time.perf_counter()
        outcome = result.outcome.value
        valid, invalid_reason = result.valid, "" if result.valid else result.reason
        if valid and self.expect_model_calls:
            calls = self.store.record_ids(self.episode_id, "model_call")
            missing = [t for t in range(1, result.requests + 1) if t not in calls]
            if missing:
                valid, invalid_reason = False, f"incomplete record: no model_call for request(s) {missing[:5]}"
        rungs, hard = self.source.ladder()
        reached = self.source.reached() if valid and rungs else 0
        bonus = subgoal_reward(outcome, hard, reached, rungs, self.rewards)
        reward = terminal_reward(outcome) + bonus
        self._append(
            "episode_end",
            0,
            {
                "outcome": outcome,
                "host_success": result.host_success,
                "finished": result.finished,
                "requests": result.requests,
                "actions": result.actions,
                "wall_time_s": result.wall_time_s,
                "reason": result.reason,
                "reward": reward,
                "subgoal_reward": bonus,
                "return": reward + self.cost_total,
                "costs_total": self.cost_total,
                "valid": valid,
                "invalid_reason": invalid_reason,
                "first_solved_request": self.first_solved,
                "rungs_reached": reached,
                "rungs": rungs,
                "early_stop": None if self.early_stop is None else self.early_stop.record(),
                "ended_unix_s": time.time(),
            },
        )
        self.record_s += time.perf_counter() - t0

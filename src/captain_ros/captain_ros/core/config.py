"""Harness configuration: dataclasses with units in the names, loaded from config/safety.yaml and
config/harness.yaml. Invalid files fail with the file, the key and what is wrong."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from captain_ros.paths import config_path


class ConfigError(ValueError):
    """A configuration file is missing, malformed or out of range."""


@dataclass(frozen=True)
class SafetyConfig:
    workspace_min_m: tuple[float, float, float] = (0.15, -0.55, 0.0)
    workspace_max_m: tuple[float, float, float] = (0.85, 0.55, 0.75)
    max_tcp_speed_mps: float = 0.25
    default_tcp_speed_mps: float = 0.10
    max_joint_speed_radps: float = 1.0
    stop_decel_radps2: float = 3.0  # every commanded stop decelerates each joint at most this hard
    force_limit_n: float = 40.0
    arm_reflex_force_n: float = 40.0
    contact_threshold_n: float = 3.0
    control_period_s: float = 0.002
    watchdog_timeout_s: float = 1.0

    def inside_workspace(self, point: np.ndarray) -> bool:
        return bool(
            np.all(point >= np.asarray(self.workspace_min_m)) and np.all(point <= np.asarray(self.workspace_max_m))
        )


@dataclass(frozen=True)
class MotionConfig:
    waypoint_spacing_m: float = 0.01
    max_rotation_step_rad: float = 0.05
    trajectory_spacing_s: float = 0.01
    baseline_periods: int = 10
    settle_timeout_s: float = 1.0
    target_tolerance_m: float = 0.002
    gripper_speed_mps: float = 0.1
    gripper_settle_s: float = 0.6
    grasp_min_width_m: float = 0.003
    release_max_opening_m: float = 0.03
    recover_max_m: float = 0.10
    surface_clearance_m: float = 0.0
    trace_page_size: int = 50


@dataclass(frozen=True)
class BudgetConfig:
    requests: int = 60
    physical_actions: int = 150
    rl_selectable_actions: int = 120  # RL selects among the first 120 physical actions (CaPtain App. A.1)
    wall_time_s: float = 1080.0  # on the clock the episode runs on (the ROS clock: sim time with the twin)
    perception_calls_per_request: int = 40  # perception and measurement calls of one request (0: no limit)


@dataclass(frozen=True)
class GateConfig:
    max_rejections: int = 2


@dataclass(frozen=True)
class PerceptionConfig:
    segmenter: str = "builtin"  # builtin | http
    segment_url: str = ""  # text-prompted segmentation server (segmenter: http)
    pointing_url: str = ""  # pointing model server; empty: point() falls back to segment()
    http_timeout_s: float = 10.0
    max_observations_kept: int = 8  # an episode's observations (images and clouds: ~14 MB each); oldest dropped first
    max_observations_mb: float = 512.0  # and at most this much memory for them
    max_detections_kept: int = 200  # detections (each holds a mask); oldest dropped first


@dataclass(frozen=True)
class AgentConfig:
    """The episode loop's context and pacing (CaPtain Appendix A.1; ARCHITECTURE.md "Episode loop")."""

    max_new_tokens: int = 4096  # per request
    temperature: float = 1.0
    tool_output_max_tokens: int = 1500  # a cell's printed output is cut to this (head and tail kept)
    chars_per_token: float = 3.5  # the estimate used until the server reports measured prompt lengths
    max_receipt_lines: int = 20  # receipts appended to one cell's output
    max_images_per_cell: int = 4
    max_images_kept: int = 12  # older images are replaced by a one-line note
    send_images: bool = True  # off for text-only policy models
    context_limit_tokens: int = 65536
    compaction_at_tokens: int = 60000  # compact older turns when the next prompt would exceed this
    keep_recent_turns: int = 4  # turns kept verbatim by compaction (besides the task context)
    missed_finish_requests: int = 15  # all goals held this many consecutive requests without finish: stop
    end_on_no_tool_call: bool = True  # a reply with no tool call ends the episode (CaPtain §3); false: nudge
    accept_fenced_code: bool = True  # a reply with no tool call but a ```python block runs that block as the cell
    cell_timeout_s: float = 120.0  # wall time of one cell, robot calls included
    settle_s: float = 1.0  # the scene settles this long (arm holding) before the host scores it


@dataclass(frozen=True)
class ShadowConfig:
    """The shadow check (harness/shadow.py): each physical action is first played in a twin built from what the robot
    measured, and refused when the twin predicts a collision of the arm, a contact force over the limit or an object
    pushed off the table. The motion node's `shadow_check` parameter overrides `enabled`."""

    enabled: bool = False
    object_density_kgpm3: float = 400.0  # a measured object's assumed mass: its box's volume times this
    max_objects: int = 24  # measured objects kept (the oldest is forgotten first)
    same_object_m: float = 0.03  # a measurement centred this close to a kept one is the same object, measured again


@dataclass(frozen=True)
class HarnessConfig:
    safety: SafetyConfig = SafetyConfig()
    motion: MotionConfig = MotionConfig()
    budgets: BudgetConfig = BudgetConfig()
    gate: GateConfig = GateConfig()
    perception: PerceptionConfig = PerceptionConfig()
    agent: AgentConfig = AgentConfig()
    shadow: ShadowConfig = ShadowConfig()


def _section(cls: type, raw: Any, where: str) -> Any:  # noqa: PLR0912 - one check per value type
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    values = {}
    for key, given in raw.items():
        default = getattr(cls(), key)
        value = given
        if isinstance(default, bool):
            if not isinstance(given, bool):
                raise ConfigError(f"{where}.{key}: must be true or false, got {given!r}")
            values[key] = given
            continue
        if isinstance(default, str):
            if not isinstance(given, str):
                raise ConfigError(f"{where}.{key}: must be a string, got {given!r}")
            values[key] = given
            continue
        if isinstance(default, tuple):
            if not (isinstance(given, list) and len(given) == len(default)):
                raise ConfigError(f"{where}.{key}: must be a list of {len(default)} numbers")
            value = tuple(given)
            items = value
        else:
            items = (value,)
        for v in items:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{where}.{key}: {value!r} is not a finite number")
        if not isinstance(default, tuple) and value < 0:
            raise ConfigError(f"{where}.{key}: must be >= 0, got {value}")
        if isinstance(default, int) and not isinstance(default, bool):
            if value != int(value):
                raise ConfigError(f"{where}.{key}: must be an integer, got {value}")
            value = int(value)
        values[key] = value
    return cls(**values)


def load_config(safety_path: Path | None = None, harness_path: Path | None = None) -> HarnessConfig:
    safety_path = Path(safety_path or config_path("safety.yaml"))
    harness_path = Path(harness_path or config_path("harness.yaml"))
    docs = {}
    for path in (safety_path, harness_path):
        try:
            docs[path] = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from None
        if not isinstance(docs[path], dict):
            raise ConfigError(f"{path}: must be a mapping")
    safety = _section(SafetyConfig, docs[safety_path].get("safety"), f"{safety_path.name}: safety")
    h = docs[harness_path]
    config = HarnessConfig(
        safety=safety,
        motion=_section(MotionConfig, h.get("motion"), f"{harness_path.name}: motion"),
        budgets=_section(BudgetConfig, h.get("budgets"), f"{harness_path.name}: budgets"),
        gate=_section(GateConfig, h.get("gate"), f"{harness_path.name}: gate"),
        perception=_section(PerceptionConfig, h.get("perception"), f"{harness_path.name}: perception"),
        agent=_section(AgentConfig, h.get("agent"), f"{harness_path.name}: agent"),
        shadow=_section(ShadowConfig, h.get("shadow"), f"{harness_path.name}: shadow"),
    )
    p = config.perception
    if p.segmenter not in ("builtin", "http") or (p.segmenter == "http" and not p.segment_url):
        raise ConfigError(f"{harness_path.name}: perception.segmenter must be builtin, or http with a segment_url")
    a, b = config.agent, config.budgets
    if a.compaction_at_tokens + a.max_new_tokens > a.context_limit_tokens or a.keep_recent_turns < 1:
        raise ConfigError(
            f"{harness_path.name}: agent.compaction_at_tokens + max_new_tokens must fit context_limit_tokens, "
            "and keep_recent_turns must be at least 1"
        )
    w = config.shadow
    if not (w.object_density_kgpm3 > 0 and w.max_objects >= 1 and w.same_object_m >= 0):
        raise ConfigError(
            f"{harness_path.name}: shadow needs object_density_kgpm3 > 0, max_objects >= 1 and same_object_m >= 0"
        )
    if b.rl_selectable_actions > b.physical_actions:
        raise ConfigError(f"{harness_path.name}: budgets.rl_selectable_actions exceeds physical_actions")
    s = config.safety
    if np.any(np.asarray(s.workspace_min_m) >= np.asarray(s.workspace_max_m)):
        raise ConfigError(f"{safety_path.name}: workspace_min_m must be below workspace_max_m on every axis")
    if s.arm_reflex_force_n > 0 and s.arm_reflex_force_n < s.contact_threshold_n:
        raise ConfigError(f"{safety_path.name}: arm_reflex_force_n must be 0 (off) or at least contact_threshold_n")
    if s.default_tcp_speed_mps > s.max_tcp_speed_mps or s.contact_threshold_n > s.force_limit_n:
        raise ConfigError(
            f"{safety_path.name}: default speed above the limit, or contact threshold above the force limit"
        )
    if min(s.control_period_s, s.max_tcp_speed_mps, s.max_joint_speed_radps, s.watchdog_timeout_s) <= 0:
        raise ConfigError(f"{safety_path.name}: periods, speeds and timeouts must be positive")
    if s.stop_decel_radps2 <= 0:
        raise ConfigError(f"{safety_path.name}: stop_decel_radps2 must be positive (a stop must decelerate)")
    return config

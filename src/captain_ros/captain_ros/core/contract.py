"""The policy-facing contract: capabilities, failure categories, budgets and call results.

Every harness call returns a `CallResult` (ARCHITECTURE.md, "The policy-facing API";
CaPtain Appendix A.1): robot calls never raise, failures carry a category from the closed
set `FailureCategory` and a message that says what was wrong, and a text receipt of at most
`RECEIPT_MAX_CHARS` characters is appended to the cell output.

This module is the single Python source of truth; `captain_interfaces/msg/CallResult.msg`
mirrors the failure categories as constants and a test keeps the two equal.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

RECEIPT_MAX_CHARS = 300


class FailureCategory(StrEnum):
    """Closed set of failure categories. `NONE` (empty string) means success."""

    NONE = ""
    INVALID_ARGUMENT = "invalid_argument"
    UNREACHABLE = "unreachable"
    SELF_COLLISION = "self_collision"
    WORKSPACE_LIMIT = "workspace_limit"
    CONTACT_STOP = "contact_stop"
    FORCE_LIMIT = "force_limit"
    STALE_OBSERVATION = "stale_observation"
    NOT_FOUND = "not_found"
    NO_DEPTH = "no_depth"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELED = "canceled"
    SAFETY_STOP = "safety_stop"
    TIMEOUT = "timeout"
    GATE_REJECTED = "gate_rejected"
    UNSUPPORTED = "unsupported"
    BACKEND_ERROR = "backend_error"


FAILURE_DESCRIPTIONS: dict[FailureCategory, str] = {
    FailureCategory.INVALID_ARGUMENT: "NaN, wrong shape or type, out of range or unknown id; nothing moved",
    FailureCategory.UNREACHABLE: "no IK solution, or the sweep leaves the reachable set",
    FailureCategory.SELF_COLLISION: "the planned motion would make the robot collide with itself",
    FailureCategory.WORKSPACE_LIMIT: "the target or the sweep leaves the configured workspace box",
    FailureCategory.CONTACT_STOP: "a guarded motion stopped at first contact before its target",
    FailureCategory.FORCE_LIMIT: "the load exceeded the force limit and the motion stopped",
    FailureCategory.STALE_OBSERVATION: "the observation handle predates a change of the scene",
    FailureCategory.NOT_FOUND: "perception found nothing matching the request",
    FailureCategory.NO_DEPTH: "the pixel or region has no valid depth",
    FailureCategory.BUDGET_EXHAUSTED: "a request, action or wall-time budget is spent",
    FailureCategory.CANCELED: "the caller canceled the call",
    FailureCategory.SAFETY_STOP: "stop service, e-stop, watchdog, operator rejection or safety state: the arm holds",
    FailureCategory.TIMEOUT: "the call did not complete within its time limit (or no operator approval in time)",
    FailureCategory.GATE_REJECTED: "finish() was rejected by the completion gate",
    FailureCategory.UNSUPPORTED: "the capability is not available on this backend",
    FailureCategory.BACKEND_ERROR: "infrastructure fault (simulator, driver, server); not a task outcome",
}


@dataclass(frozen=True)
class Capability:
    """One entry of the policy-facing API (CaPtain Table 4)."""

    name: str
    group: str  # perception | measurement | motion | planning | state | episode
    physical: bool  # counts against the action budget
    summary: str


CAPABILITIES: tuple[Capability, ...] = (
    Capability("observe", "perception", False, "head + wrist RGB-D (512x512), calibration, robot state"),
    Capability("segment", "perception", False, "text segmentation -> depth-backed detections"),
    Capability("select_detection", "perception", False, "bind a chosen detection to identity evidence"),
    Capability("point", "perception", False, "pointing -> deprojected, point-segmented evidence"),
    Capability("mark_point", "perception", False, "validate and back-project a chosen pixel -> detection id"),
    Capability("track_target", "perception", False, "optical-flow tracking of a detection into a newer observation"),
    Capability(
        "measure_object_geometry",
        "measurement",
        False,
        "symmetry-completed centre, extents, yaw, offset to a destination",
    ),
    Capability("measure_image_points", "measurement", False, "metric points at pixels"),
    Capability(
        "inspect_contact_geometry", "measurement", False, "finger-pad closing volume against the target's RGB-D points"
    ),
    Capability("inspect_release_geometry", "measurement", False, "signed footprint clearance at a proposed release"),
    Capability("compare_object_observations", "measurement", False, "target motion in the robot frame across time"),
    Capability("move_to", "motion", True, "absolute TCP pose or one jaw command; guarded or manipulation mode"),
    Capability("hold", "motion", True, "keep the current pose"),
    Capability("recover", "motion", True, "bounded reversal along the last executed trace"),
    Capability("release", "motion", True, "bounded jaw opening under load"),
    Capability("preview_motion", "planning", False, "read-only timing of a motion"),
    Capability("check_motion", "planning", False, "read-only IK, self-collision and surface check"),
    Capability("get_robot_state", "state", False, "measured TCP pose, joints, aperture, wrist force"),
    Capability("gripper_state", "state", False, "jaw opening, grasp width and force"),
    Capability("robot_geometry", "state", False, "TCP/pad reference, pad envelope, gripper limits"),
    Capability("read_motion_trajectory", "state", False, "page through the measured trace of a motion"),
    Capability("transform_pose", "state", False, "pose arithmetic between frames"),
    Capability("finish", "episode", False, "end the episode; the host scores the final state"),
)
CAPABILITY_BY_NAME: dict[str, Capability] = {c.name: c for c in CAPABILITIES}
PHYSICAL_CAPABILITIES: frozenset[str] = frozenset(c.name for c in CAPABILITIES if c.physical)


@dataclass
class Budget:
    """Episode budgets (CaPtain App. A.1: 60 requests, 150 actions, 1,080 s). 0 = no limit."""

    requests_used: int = 0
    requests_limit: int = 60
    actions_used: int = 0
    actions_limit: int = 150
    wall_time_used_s: float = 0.0
    wall_time_limit_s: float = 1080.0

    def exhausted(self) -> str | None:
        """Name of the first exhausted budget, or None."""
        if self.requests_limit and self.requests_used >= self.requests_limit:
            return "requests"
        if self.actions_limit and self.actions_used >= self.actions_limit:
            return "physical actions"
        if self.wall_time_limit_s and self.wall_time_used_s >= self.wall_time_limit_s:
            return "wall time"
        return None


def _json_safe(value: Any) -> Any:
    """Convert numpy scalars/arrays and tuples to JSON types; non-finite floats become None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _wire_text(text: str) -> str:
    """`text` as valid UTF-8: lone surrogates (which JSON can carry) become backslash escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class CallFailure(Exception):
    """A capability failed in a known way; the call returns a result with `category` and this message."""

    def __init__(self, category: FailureCategory, message: str):
        super().__init__(message)
        self.category = category


def new_call_id() -> str:
    return uuid.uuid4().hex


@dataclass
class CallResult:
    """Result of one harness call; `to_dict()` is what the policy's Python session receives."""

    capability: str
    success: bool
    executed: bool = False
    failure_category: FailureCategory = FailureCategory.NONE
    message: str = ""
    receipt: str = ""
    value: Any = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    call_id: str = field(default_factory=new_call_id)
    episode_id: str = ""
    duration_s: float = 0.0
    frame_id: str = ""

    def __post_init__(self) -> None:
        self.failure_category = FailureCategory(self.failure_category)
        if self.success and self.failure_category is not FailureCategory.NONE:
            raise ValueError(f"a successful result cannot carry failure category {self.failure_category!r}")
        if not self.success and self.failure_category is FailureCategory.NONE:
            raise ValueError("a failed result needs a failure category")
        # receipts and messages go into UTF-8 string fields: text that cannot be encoded is escaped
        self.message, self.receipt = _wire_text(self.message), _wire_text(self.receipt)
        if len(self.receipt) > RECEIPT_MAX_CHARS:
            self.receipt = self.receipt[: RECEIPT_MAX_CHARS - 3] + "..."

    @classmethod
    def ok(cls, capability: str, value: Any = None, receipt: str = "", **kwargs: Any) -> CallResult:
        return cls(capability=capability, success=True, value=value, receipt=receipt, **kwargs)

    @classmethod
    def fail(cls, capability: str, category: FailureCategory, message: str, **kwargs: Any) -> CallResult:
        kwargs.setdefault("receipt", f"{capability}: FAILED {category.value}: {message}")
        return cls(capability=capability, success=False, failure_category=category, message=message, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The dict the policy sees: {success, executed, failure_category, message, value, diagnostics, budget}."""
        return {
            "success": self.success,
            "executed": self.executed,
            "failure_category": self.failure_category.value or None,
            "message": self.message,
            "value": _json_safe(self.value),
            "diagnostics": _json_safe(self.diagnostics),
            "budget": asdict(self.budget),
        }

    def value_json(self) -> str:
        return json.dumps(_json_safe(self.value), allow_nan=False)

    def diagnostics_json(self) -> str:
        return json.dumps(_json_safe(self.diagnostics), allow_nan=False)

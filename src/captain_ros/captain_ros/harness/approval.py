"""The operator's say over physical actions: a latched e-stop and an approver (ROS-free).

`EStop` is the emergency stop, kept apart from the agent's own stop/resume: any source may engage it (a
service, a button's topic), only an operator clears it, and it cannot be cleared while an input that engaged
it still reads pressed (as with a hardware e-stop, releasing the button alone restarts nothing, and a reset
with the button still pressed is refused).

`OperatorApprover` is approval mode: the harness asks it before every physical action, with what the
action will do (capability, arguments, the planned target), and the action runs only once an operator has
approved it. A rejection, no answer within `timeout_s` or a withdrawal (stop, e-stop, cancel) fails the call
and the arm holds: it has not been commanded since the last motion ended in a hold. Waiting is in wall time
(an operator's seconds, whatever clock the episode runs on). The harness calls one action at a time, so at
most one request is pending; the approver does not rely on it.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import yaml

from captain_ros.core.config import ConfigError, _section
from captain_ros.paths import config_path


@dataclass(frozen=True)
class SupervisorConfig:
    """The `supervisor:` section of config/safety.yaml."""

    approval_timeout_s: float = 30.0  # approval mode: no answer within this (wall time) = timeout, the arm holds


def load_supervisor_config(path: Path | None = None) -> SupervisorConfig:
    """The `supervisor:` section of a safety file (defaults where the file has none)."""
    path = Path(path or config_path("safety.yaml"))
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: must be a mapping")
    config = _section(SupervisorConfig, doc.get("supervisor"), f"{path.name}: supervisor")
    if config.approval_timeout_s <= 0:
        raise ConfigError(f"{path.name}: supervisor.approval_timeout_s must be positive")
    return config


# ------------------------------------------------------------------------------ e-stop
class EStop:
    """Latched emergency stop. Thread-safe; `engagements` counts engage() calls that latched it, so a caller
    can tell whether it was engaged during a call even if an operator cleared it since.

    An input can carry a deadline (`watch`): a button's bridge that says nothing for longer than that is as good
    as a pressed button (a dead bridge would otherwise mean no stop), so `lapse` engages the e-stop in its name,
    and it cannot be cleared until the input speaks again and reads released. Times are the caller's monotonic
    seconds (the ROS shell: the steady clock, not sim time: a bridge's silence is real time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.engaged = False
        self.source = ""  # who engaged it: "the /safety/estop service", "the /safety/estop topic", ...
        self.reason = ""
        self.last_source = ""  # who engaged it last (kept after a clear: for results of calls it stopped)
        self.engagements = 0
        self._pressed: set[str] = set()  # inputs whose last reading was "engaged"
        self._deadline_s: dict[str, float] = {}  # watched inputs: the longest silence each is allowed
        self._heard_s: dict[str, float] = {}  # when each input last spoke (or its watch began)
        self._silent: set[str] = set()  # watched inputs past their deadline and not heard since

    def watch(self, source: str, deadline_s: float, now_s: float) -> None:
        """Require a reading from `source` at least every `deadline_s` from `now_s` on (its first one included:
        an input that never speaks lapses too); 0 ends the watch (and its silence no longer blocks a clear)."""
        if not math.isfinite(deadline_s) or deadline_s < 0:
            raise ValueError(f"an e-stop input's deadline must be a finite number of seconds >= 0, got {deadline_s}")
        with self._lock:
            if deadline_s == 0:
                self._deadline_s.pop(source, None)
                self._silent.discard(source)
                return
            self._deadline_s[source] = deadline_s
            self._heard_s[source] = now_s

    def deadline_s(self, source: str) -> float:
        """`source`'s deadline (0: not watched)."""
        with self._lock:
            return self._deadline_s.get(source, 0.0)

    def lapse(self, now_s: float) -> list[str]:
        """Engage the e-stop for each watched input silent past its deadline at `now_s`; returns those that
        lapsed just now (each lapses once per silence)."""
        lapsed = []
        with self._lock:
            for source, deadline in self._deadline_s.items():
                silent_s = now_s - self._heard_s[source]
                if silent_s > deadline and source not in self._silent:
                    self._silent.add(source)
                    lapsed.append((source, f"silent for {silent_s:.2f} s, past its {deadline:g} s deadline"))
        for source, reason in lapsed:
            self.engage(source, reason)
        return [source for source, _ in lapsed]

    def engage(self, source: str, reason: str = "") -> bool:
        """Latch the e-stop; True if this engaged it (False: it already was, by the first source)."""
        with self._lock:
            if self.engaged:
                return False
            self.engaged, self.source, self.reason, self.last_source = True, source, reason, source
            self.engagements += 1
            return True

    def set_input(self, source: str, pressed: bool, reason: str = "", now_s: float | None = None) -> bool:
        """A latching input's reading (a button bridge's topic) at `now_s` (default: time.monotonic()): pressed
        engages; released only allows an operator to clear (it clears nothing). Returns whether this engaged the
        e-stop."""
        with self._lock:
            self._heard_s[source] = time.monotonic() if now_s is None else now_s
            self._silent.discard(source)
            if not pressed:
                self._pressed.discard(source)
                return False
            self._pressed.add(source)
        return self.engage(source, reason)

    def pressed_inputs(self) -> list[str]:
        with self._lock:
            return sorted(self._pressed)

    def clear(self) -> str:
        """Operator reset: '' when cleared (or not engaged), else why it was refused."""
        with self._lock:
            if self._silent:
                return (
                    f"{', '.join(sorted(self._silent))} went silent past its deadline: restore its bridge (it must "
                    "publish again, reading false) before clearing"
                )
            if self._pressed:
                return (
                    f"{', '.join(sorted(self._pressed))} still reads engaged: release the e-stop "
                    "(its last message must read false) before clearing"
                )
            self.engaged, self.source, self.reason = False, "", ""
            return ""

    def refusal(self) -> str:
        """Why motions are refused now ('' = the e-stop is clear)."""
        with self._lock:
            if not self.engaged:
                return ""
            why = f" ({self.reason})" if self.reason else ""
            return f"e-stop engaged by {self.source}{why}: nothing moves until an operator clears it"


# ------------------------------------------------------------------------------ approval
class Decision(StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    WITHDRAWN = "withdrawn"  # stop, e-stop, cancel or shutdown while the operator was asked


@dataclass(frozen=True)
class PendingAction:
    """What an operator is asked to approve: the call as the agent made it and what it will do."""

    capability: str
    args: dict[str, Any]  # the call's keyword arguments as given
    description: str  # in words: planned distance, duration, target
    frame_id: str = ""  # frame of the target pose
    target_position_m: tuple[float, float, float] | None = None  # motions: where the TCP ends
    target_quaternion_xyzw: tuple[float, float, float, float] | None = None
    target_jaw_opening_m: float | None = None  # jaw commands: the opening it goes to
    tcp_path_m: tuple[tuple[float, float, float], ...] = ()  # motions: the planned TCP sweep (to draw it)
    episode_id: str = ""

    def args_json(self) -> str:
        """The arguments as JSON (numpy values as lists, anything else by its repr)."""
        return json.dumps(self.args, default=lambda v: v.tolist() if hasattr(v, "tolist") else repr(v))


@dataclass(frozen=True)
class ApprovalRequest:
    request_id: str
    action: PendingAction
    timeout_s: float
    deadline_unix_s: float  # wall clock (time.time()): no answer by then = timeout


@dataclass(frozen=True)
class Approval:
    decision: Decision
    note: str = ""  # the operator's note, or why the request was withdrawn
    request_id: str = ""  # '' = nobody was asked (approval mode off)

    @property
    def approved(self) -> bool:
        return self.decision is Decision.APPROVED

    @property
    def asked(self) -> bool:
        return bool(self.request_id)


class Approver(Protocol):
    """What the harness asks before every physical action (OperatorApprover, or a policy of your own)."""

    def ask(self, action: PendingAction) -> Approval: ...

    def withdraw(self, reason: str) -> int: ...


@dataclass
class _Slot:
    request: ApprovalRequest
    answer: Approval | None = None
    done: threading.Event = field(default_factory=threading.Event)


class OperatorApprover:
    """Approval mode. `ask()` blocks the calling (harness) thread until an operator answers (`answer()`, from
    another thread), the request is withdrawn or `timeout_s` passes; with `enabled` false it approves at
    once without asking. `on_request` (a new request) and `on_change` (the pending list changed) let a shell
    publish them; they are called outside the lock and must not raise."""

    def __init__(
        self,
        timeout_s: float = SupervisorConfig.approval_timeout_s,
        *,
        enabled: bool = False,
        on_request: Callable[[ApprovalRequest], None] | None = None,
        on_change: Callable[[list[ApprovalRequest]], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ):
        if not timeout_s > 0:
            raise ValueError(f"approval timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.enabled = enabled
        self.on_request, self.on_change = on_request, on_change
        self.last: tuple[ApprovalRequest, Approval] | None = None  # the latest request that was resolved
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}

    def pending(self) -> list[ApprovalRequest]:
        with self._lock:
            return [slot.request for slot in self._slots.values()]

    def ask(self, action: PendingAction) -> Approval:
        """Block until the action is approved, rejected, withdrawn or timed out."""
        if not self.enabled:
            return Approval(Decision.APPROVED, "approval mode is off")
        timeout_s = self.timeout_s
        request = ApprovalRequest(uuid.uuid4().hex[:8], action, timeout_s, self._wall_clock() + timeout_s)
        slot = _Slot(request)
        with self._lock:
            self._slots[request.request_id] = slot
        try:
            self._changed()
            if self.on_request is not None:
                self.on_request(request)
            slot.done.wait(timeout_s)
        finally:  # whatever happened, the request is pending no more (a late answer() is refused)
            with self._lock:
                del self._slots[request.request_id]
                answer = slot.answer or Approval(
                    Decision.TIMED_OUT, f"no answer within {timeout_s:g} s", request.request_id
                )
                self.last = (request, answer)
        self._changed()
        return answer

    def answer(self, request_id: str, approve: bool, note: str = "") -> str:
        """An operator's answer; '' when it was taken, else why not. An empty id answers the only pending
        request."""
        with self._lock:
            if not request_id and len(self._slots) == 1:
                request_id = next(iter(self._slots))
            slot = self._slots.get(request_id)
            if slot is None or slot.answer is not None:
                pending = ", ".join(self._slots) or "none"
                if request_id:
                    return f"no pending approval request '{request_id}' (pending: {pending})"
                return f"give a request id (pending: {pending})"
            slot.answer = Approval(Decision.APPROVED if approve else Decision.REJECTED, note.strip(), request_id)
            slot.done.set()
        return ""

    def withdraw(self, reason: str) -> int:
        """Withdraw every pending request (the harness then fails the call); returns how many."""
        with self._lock:
            slots = [s for s in self._slots.values() if s.answer is None]
            for slot in slots:
                slot.answer = Approval(Decision.WITHDRAWN, reason, slot.request.request_id)
                slot.done.set()
        return len(slots)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.pending())


class Answer(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


def parse_answer(line: str) -> tuple[Answer, str] | None:
    """An operator's typed answer: 'y' / 'yes' [note] approves, 'n' / 'no' [note] rejects (the rest of the line
    is the note); anything else is None (ask again)."""
    word, _, note = line.strip().partition(" ")
    word = word.lower().rstrip(":,")
    if word in ("y", "yes", "approve"):
        return Answer.APPROVE, note.strip()
    if word in ("n", "no", "reject"):
        return Answer.REJECT, note.strip()
    return None


def describe_request(request: ApprovalRequest, now_unix_s: float | None = None) -> str:
    """A request as an operator reads it in a terminal (several lines)."""
    action = request.action
    now = time.time() if now_unix_s is None else now_unix_s
    lines = [f"[{request.request_id}] {action.description}", f"    call: {action.capability}({_call_args(action)})"]
    if action.target_position_m is not None:
        x, y, z = action.target_position_m
        lines.append(f"    TCP target: ({x:.3f}, {y:.3f}, {z:.3f}) m in {action.frame_id or 'the base frame'}")
    if action.target_jaw_opening_m is not None:
        lines.append(f"    jaw target: {action.target_jaw_opening_m * 1000:.0f} mm")
    lines.append(f"    answer within {max(0.0, request.deadline_unix_s - now):.0f} s, or the arm holds")
    return "\n".join(lines)


def _call_args(action: PendingAction) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=repr)}" for k, v in action.args.items())

"""What the operator sees in rviz besides the robot and the camera images: the episode's status and its latest
receipts as text next to the robot's base, every contact with its force, and every sweep as planned before it runs.

ROS-free: markers are plain data (`MarkerSpec`, the fields of a visualization_msgs/Marker that rviz uses), built
from plain values, so the geometry and the wording are tested without DDS. The operator_view node feeds
`OperatorView` with what the stack publishes (/agent/status, /harness/receipts, the motion node's planned sweeps)
and publishes its markers; the motion node draws each plan with `planned_sweep_marker`.

Namespaces on /captain/markers (rviz lists them and can hide each one):
  status, receipts   text (operator_view)
  contacts           spheres, force arrows and labels (operator_view)
  planned            the planned TCP sweep of motion <id>, published just before it runs (motion node)
  motions            the executed TCP path of motion <id> (motion node)
  detections         boxes and labels (perception node)
  workspace, safety  the workspace box, e-stop and pending approvals (the motion node's safety supervisor)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from captain_ros.core.contract import Budget, CallResult

NS_STATUS = "status"
NS_RECEIPTS = "receipts"
NS_CONTACTS = "contacts"
NS_PLANNED = "planned"
NS_MOTIONS = "motions"
EPISODE_NAMESPACES = (NS_CONTACTS, NS_PLANNED, NS_MOTIONS)  # drawn per episode: cleared when a new one starts
DOWN = (0.0, 0.0, -1.0)  # the approach assumed for a contact whose sweep was not seen (most are descents)

Point3 = tuple[float, float, float]
Rgba = tuple[float, float, float, float]


class Shape(StrEnum):
    """The visualization_msgs/Marker types used here."""

    ARROW = "arrow"
    SPHERE = "sphere"
    LINE_STRIP = "line_strip"
    SPHERE_LIST = "sphere_list"
    TEXT = "text_view_facing"


@dataclass(frozen=True)
class MarkerSpec:
    """One rviz marker. `scale` follows visualization_msgs/Marker: a sphere's diameters; a line's width in x; an
    arrow given by two points: shaft diameter, head diameter, head length; text: the letter height in z."""

    ns: str
    id: int
    shape: Shape
    frame_id: str
    position_m: Point3 = (0.0, 0.0, 0.0)
    points_m: tuple[Point3, ...] = ()
    scale: Point3 = (1.0, 1.0, 1.0)
    rgba: Rgba = (1.0, 1.0, 1.0, 1.0)
    text: str = ""


@dataclass(frozen=True)
class MarkerUpdate:
    """What to publish: first clear these namespaces (a new episode), then add or replace these markers."""

    clear: tuple[str, ...]
    markers: tuple[MarkerSpec, ...]


@dataclass(frozen=True)
class OperatorViewConfig:
    """Where and how large the operator's text and contact markers are drawn (base frame, metres)."""

    text_anchor_m: Point3 = (-0.45, 0.0, 1.0)  # centre of the status text: behind and above the base
    status_height_m: float = 0.045  # letter height of the status text
    receipt_height_m: float = 0.03  # letter height of the receipt lines
    line_spacing: float = 1.3  # line pitch / letter height (rviz centres a text block on its position)
    receipt_lines: int = 6  # latest receipts shown
    receipt_chars: int = 96  # a longer receipt line is cut (receipts are at most 300 characters)
    contact_sphere_m: float = 0.02  # diameter of a contact point
    arrow_m_per_n: float = 0.01  # force arrow length per newton
    arrow_min_m: float = 0.03
    arrow_max_m: float = 0.3

    def __post_init__(self) -> None:
        if self.receipt_lines < 1 or self.receipt_chars < 10:
            raise ValueError(
                f"receipt_lines must be >= 1 and receipt_chars >= 10, got {self.receipt_lines}, {self.receipt_chars}"
            )
        if len(self.text_anchor_m) != 3 or not all(math.isfinite(v) for v in self.text_anchor_m):
            raise ValueError(f"text_anchor_m must be three finite numbers, got {self.text_anchor_m}")


# ---------------------------------------------------------------------------------------------- text
@dataclass(frozen=True)
class EpisodeView:
    """The fields of captain_interfaces/EpisodeStatus that the operator reads."""

    episode_id: str = ""
    task: str = ""
    state: str = ""  # idle | running | finished | aborted
    request_index: int = 0
    budget: Budget = field(default_factory=Budget)
    outcome: str = ""


def _of(used: float, limit: float) -> str:
    return f"{used:g} of {limit:g}" if limit else f"{used:g} (no limit)"


def status_text(view: EpisodeView | None) -> str:
    """'request n of 60, actions a of A, budget left, outcome', one line each, for a TEXT_VIEW_FACING marker."""
    if view is None:
        return "no episode status yet (/agent/status)"
    if not view.episode_id and view.state in ("", "idle"):
        return "waiting for the agent's first episode"
    b = view.budget
    left = []
    if b.requests_limit:
        left.append(f"{max(0, b.requests_limit - b.requests_used)} requests")
    if b.actions_limit:
        left.append(f"{max(0, b.actions_limit - b.actions_used)} actions")
    if b.wall_time_limit_s:
        left.append(f"{max(0.0, b.wall_time_limit_s - b.wall_time_used_s):.0f} s")
    lines = [
        f"{view.task or 'episode'} {view.episode_id}: {view.state or 'unknown'}".strip(),
        f"request {_of(view.request_index, b.requests_limit)}, actions {_of(b.actions_used, b.actions_limit)}",
        "budget left: " + (", ".join(left) if left else "no limits"),
    ]
    if view.outcome:
        lines.append(f"outcome: {view.outcome}")
    return "\n".join(lines)


def status_rgba(view: EpisodeView | None) -> Rgba:
    """White while running; green for strict success, red for an infrastructure failure, orange otherwise."""
    if view is None or view.state not in ("finished", "aborted"):
        return (1.0, 1.0, 1.0, 1.0)
    if view.outcome == "success":
        return (0.3, 1.0, 0.3, 1.0)
    if view.state == "aborted" or view.outcome == "infrastructure_failure":
        return (1.0, 0.3, 0.3, 1.0)
    return (1.0, 0.65, 0.2, 1.0)


def receipt_line(result: CallResult) -> str:
    """A result's receipt as the policy reads it (a failure without one: the agent's wording), on one line."""
    text = result.receipt or f"{result.capability}: FAILED {result.failure_category.value}: {result.message}"
    return ("ok  " if result.success else "ERR ") + " ".join(text.split())


def receipts_text(lines: Sequence[str], total: int, max_chars: int) -> str:
    """The latest receipt lines, each cut to `max_chars`, under a heading that says how many there were."""
    shown = [line if len(line) <= max_chars else line[: max_chars - 3] + "..." for line in lines]
    heading = f"receipts: latest {len(shown)} of {total}" if total > len(shown) else f"receipts: {total}"
    return "\n".join([heading, *shown]) if shown else "receipts: none yet (/harness/receipts)"


# ---------------------------------------------------------------------------------------------- contacts
@dataclass(frozen=True)
class Contact:
    """Where the hand touched something, from a result's value. `kind`: contact (a guarded motion stopped at
    first contact), force_limit (the load passed the force limit) or grasp (the jaw closed on an object)."""

    kind: str
    point_m: Point3  # the TCP where the motion stopped or the jaw closed (base frame)
    force_n: float  # peak force above the motion's baseline; nan for a grasp (the jaw's force is not measured)
    capability: str
    motion_id: int | None = None
    width_m: float = math.nan  # grasp: the jaw opening on the object


def _point(value: object) -> Point3 | None:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        return None
    try:
        point = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        return None
    return point if all(math.isfinite(v) for v in point) else None


def contact_from_result(result: CallResult) -> Contact | None:
    """The contact a physical action's result reports, if any. A motion's value gives the stop reason, the peak
    force and the TCP where it stopped (within one control period of the contact); a jaw action's gives whether
    it holds an object, the opening and the TCP."""
    value, capability = result.value, result.capability
    if not result.executed or not isinstance(value, dict):
        return None
    point = _point(value.get("tcp_position_m"))
    if point is None:
        return None
    stop = value.get("stop_reason")
    if stop in ("contact", "force_limit"):
        force = value.get("peak_force_n")
        force_n = float(force) if isinstance(force, (int, float)) else math.nan
        motion_id = value.get("motion_id")
        return Contact(stop, point, force_n, capability, motion_id if isinstance(motion_id, int) else None)
    if value.get("holding_object") is True:
        width = value.get("jaw_after_m")
        return Contact("grasp", point, math.nan, capability, None, float(width) if width is not None else math.nan)
    return None


def _unit(v: np.ndarray) -> np.ndarray | None:
    n = float(np.linalg.norm(v))
    return v / n if n > 1e-6 else None


def contact_markers(
    contacts: Sequence[Contact], directions: dict[int, Point3], frame_id: str, config: OperatorViewConfig
) -> list[MarkerSpec]:
    """Per contact (ids 3i, 3i+1, 3i+2 in ns 'contacts'): a sphere at the point, an arrow for the force the hand
    pressed with, ending at the point along the direction its sweep travelled (`directions[motion_id]`, straight
    down when the sweep was not seen), and a label. A grasp gets a sphere the size of the opening and a label."""
    out = []
    for i, c in enumerate(contacts):
        p = np.array(c.point_m)
        label_at = tuple(float(v) for v in p + [0.0, 0.0, 0.04])
        if c.kind == "grasp":
            width = c.width_m if math.isfinite(c.width_m) and c.width_m > 0 else config.contact_sphere_m
            out.append(
                MarkerSpec(
                    NS_CONTACTS, 3 * i, Shape.SPHERE, frame_id, c.point_m, scale=(width,) * 3, rgba=(0.2, 0.9, 0.3, 0.5)
                )
            )
            label = f"grasp {c.width_m * 1000:.0f} mm" if math.isfinite(c.width_m) else "grasp"
            text = f"{label} ({c.capability})"
        else:
            rgba = (1.0, 0.55, 0.0, 0.9) if c.kind == "contact" else (1.0, 0.1, 0.1, 0.9)
            out.append(
                MarkerSpec(
                    NS_CONTACTS,
                    3 * i,
                    Shape.SPHERE,
                    frame_id,
                    c.point_m,
                    scale=(config.contact_sphere_m,) * 3,
                    rgba=rgba,
                )
            )
            if math.isfinite(c.force_n):
                travel = _unit(np.array(directions.get(c.motion_id, DOWN) if c.motion_id is not None else DOWN))
                travel = np.array(DOWN) if travel is None else travel
                length = min(max(c.force_n * config.arrow_m_per_n, config.arrow_min_m), config.arrow_max_m)
                tail = tuple(float(v) for v in p - travel * length)
                out.append(
                    MarkerSpec(
                        NS_CONTACTS,
                        3 * i + 1,
                        Shape.ARROW,
                        frame_id,
                        points_m=(tail, c.point_m),
                        scale=(0.006, 0.014, 0.02),
                        rgba=rgba,
                    )
                )
            force = f"{c.force_n:.1f} N" if math.isfinite(c.force_n) else "force unknown"
            name = "contact" if c.kind == "contact" else "force limit"
            motion = f" motion {c.motion_id}" if c.motion_id is not None else ""
            text = f"{name} {force}{motion}"
        out.append(
            MarkerSpec(NS_CONTACTS, 3 * i + 2, Shape.TEXT, frame_id, label_at, scale=(0.0, 0.0, 0.025), text=text)
        )
    return out


# ---------------------------------------------------------------------------------------------- planned sweeps
def planned_sweep_marker(motion_id: int, tcp_waypoints_m: np.ndarray, frame_id: str) -> MarkerSpec:
    """The TCP path a motion is about to sweep (ns 'planned', id = the motion id its result will carry): a thin
    blue line under the executed path, or a dot where the arm will hold still."""
    points = tuple(tuple(float(v) for v in row) for row in np.asarray(tcp_waypoints_m, dtype=float).reshape(-1, 3))
    if not points:
        raise ValueError("a planned sweep needs at least one TCP waypoint")
    moving = len(points) > 1 and any(np.linalg.norm(np.subtract(q, points[0])) > 1e-4 for q in points[1:])
    if moving:
        return MarkerSpec(
            NS_PLANNED,
            motion_id,
            Shape.LINE_STRIP,
            frame_id,
            points_m=points,
            scale=(0.002, 0.0, 0.0),
            rgba=(0.2, 0.5, 1.0, 0.9),
        )
    return MarkerSpec(
        NS_PLANNED,
        motion_id,
        Shape.SPHERE_LIST,
        frame_id,
        points_m=points[:1],
        scale=(0.012, 0.012, 0.012),
        rgba=(0.2, 0.5, 1.0, 0.9),
    )


def sweep_direction(points_m: Sequence[Point3]) -> Point3 | None:
    """Unit direction from the first to the last point of a sweep (None when it does not move)."""
    if len(points_m) < 2:
        return None
    d = _unit(np.subtract(points_m[-1], points_m[0]))
    return None if d is None else tuple(float(v) for v in d)


# ---------------------------------------------------------------------------------------------- the view
class OperatorView:
    """The operator's markers, kept up to date from what the stack publishes. Not thread-safe: one caller."""

    def __init__(self, frame_id: str, config: OperatorViewConfig | None = None):
        self.frame_id = frame_id
        self.config = config or OperatorViewConfig()
        self.status: EpisodeView | None = None
        self.receipts: deque[str] = deque(maxlen=self.config.receipt_lines)
        self.receipt_count = 0
        self.contacts: list[Contact] = []
        self.directions: dict[int, Point3] = {}  # motion id -> direction of its planned sweep
        self._clear: set[str] = set()

    def on_status(self, view: EpisodeView) -> None:
        """A new episode id starts a new page: receipts, contacts and the last episode's sweeps are cleared."""
        if self.status is not None and view.episode_id and view.episode_id != self.status.episode_id:
            self.receipts.clear()
            self.receipt_count = 0
            self.contacts.clear()
            self.directions.clear()
            self._clear.update(EPISODE_NAMESPACES)
        self.status = view

    def on_receipt(self, result: CallResult) -> None:
        self.receipts.append(receipt_line(result))
        self.receipt_count += 1
        contact = contact_from_result(result)
        if contact is not None:
            self.contacts.append(contact)

    def on_planned(self, motion_id: int, points_m: Sequence[Point3]) -> None:
        direction = sweep_direction(points_m)
        if direction is None:
            self.directions.pop(motion_id, None)
        else:
            self.directions[motion_id] = direction

    def text_positions(self) -> tuple[Point3, Point3]:
        """Centres of the status block and, under it, the receipts block (rviz centres a text on its position)."""
        c = self.config
        x, y, z = c.text_anchor_m
        status_lines = status_text(self.status).count("\n") + 1
        receipt_lines = c.receipt_lines + 1  # with the heading
        drop = (status_lines * c.status_height_m + receipt_lines * c.receipt_height_m) * c.line_spacing / 2 + 0.03
        return (x, y, z), (x, y, z - drop)

    def update(self) -> MarkerUpdate:
        """Everything to publish now (the node republishes it periodically, so a late rviz catches up); the
        namespaces to clear are handed out once."""
        c = self.config
        at_status, at_receipts = self.text_positions()
        markers = [
            MarkerSpec(
                NS_STATUS,
                0,
                Shape.TEXT,
                self.frame_id,
                at_status,
                scale=(0.0, 0.0, c.status_height_m),
                rgba=status_rgba(self.status),
                text=status_text(self.status),
            ),
            MarkerSpec(
                NS_RECEIPTS,
                0,
                Shape.TEXT,
                self.frame_id,
                at_receipts,
                scale=(0.0, 0.0, c.receipt_height_m),
                rgba=(0.85, 0.85, 0.85, 1.0),
                text=receipts_text(list(self.receipts), self.receipt_count, c.receipt_chars),
            ),
            *contact_markers(self.contacts, self.directions, self.frame_id, c),
        ]
        clear, self._clear = tuple(sorted(self._clear)), set()
        return MarkerUpdate(clear, tuple(markers))

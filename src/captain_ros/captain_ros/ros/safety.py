"""The motion node's safety supervisor (ROS shell over harness/approval.py) and the operator's approval prompt.

Served by the motion node from start-up, in every lifecycle state (relative names: /safety/... in the root
namespace):

  /safety/estop              std_srvs/Trigger                       engage the e-stop (latched)
  /safety/estop              std_msgs/Bool (reliable, volatile)     an e-stop input, e.g. a button's bridge:
                                                                   true engages; the latest reading is kept
                                                                   (a best-effort publisher is not heard: the
                                                                   node logs an error when one appears)
  /safety/clear_estop        std_srvs/Trigger                       an operator's reset
  /safety/approve            captain_interfaces/srv/Approve         answer a pending approval request
  /safety/approval_requests  captain_interfaces/msg/ApprovalRequest each physical action waiting for approval
  /safety/state              captain_interfaces/msg/SafetyState     latched (transient local): e-stop, approval
                                                                   mode, the pending request
  /captain/markers           visualization_msgs/MarkerArray         latched (transient local, depth 1) and
                                                                   again every second: the workspace box
                                                                   (namespace "workspace"), the supervisor's
                                                                   state as text ("safety") and the sweep
                                                                   waiting for approval ("approval")

The e-stop is not the agent's stop (/harness/stop, /harness/resume cannot clear it): engaged, it halts a
running motion within one control period, withdraws a pending approval request and refuses every physical
action ("e-stop engaged by <source>") until an operator calls /safety/clear_estop. A reset is refused while
the /safety/estop topic's latest message reads true: a button still pressed must be released (its bridge
publishes false) first, and its release alone clears nothing. A bridge should publish the button's state
periodically (a late-starting motion node then learns it). To clear after a bridge that died pressed:
`ros2 topic pub --once /safety/estop std_msgs/msg/Bool "{data: false}"`, then clear.

The topic's deadline (parameter `estop_deadline_s`, settable at run time; real_arm.launch.py sets 0.5): with it, a
bridge that says nothing for longer (steady time; from the node's start for its first message) engages the e-stop
in the topic's name ("silent for 0.62 s, past its 0.5 s deadline"), exactly as a pressed button does, and the reset
is refused until the bridge publishes again, reading false: a dead bridge fails closed instead of leaving the arm
without its stop. 0 (the twin's launch) waives it, with a warning in the log. This is a software stop over DDS: a
safety-rated stop (a category 0/1 stop wired to the arm's controller, the vendor's own e-stop input) still needs
hardware; docs/first_real_run.md says which.

Approval mode (parameter `approval_mode`, settable at run time: `ros2 param set /motion approval_mode true`):
every physical action waits for an operator's answer through /safety/approve or `captain-ros approve`
(`ApprovalPrompt` below); no answer within `approval_timeout_s` (wall time) fails the call as a timeout and
the arm holds.
"""

from __future__ import annotations

import json
import math
import os
import select
import sys
import threading
import time
from collections.abc import Callable

from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool
from std_srvs.srv import Trigger
from visualization_msgs.msg import Marker, MarkerArray

from captain_interfaces.msg import ApprovalRequest as ApprovalRequestMsg
from captain_interfaces.msg import SafetyState
from captain_interfaces.srv import Approve
from captain_ros.core.config import SafetyConfig
from captain_ros.core.contract import RECEIPT_MAX_CHARS, CallResult, FailureCategory
from captain_ros.harness.approval import (
    Answer,
    ApprovalRequest,
    EStop,
    OperatorApprover,
    PendingAction,
    SupervisorConfig,
    describe_request,
    parse_answer,
)

ESTOP = "safety/estop"  # the service and the topic
CLEAR_ESTOP = "safety/clear_estop"
APPROVE = "safety/approve"
REQUESTS = "safety/approval_requests"
STATE = "safety/state"
MARKERS = "captain/markers"
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
MARKERS_EVERY_S = 1.0
STEADY = Clock(clock_type=ClockType.STEADY_TIME)  # the e-stop topic's deadline: a bridge's silence is real time
DEADLINE_CHECK_S = 0.02  # how often the e-stop topic's deadline is checked while it has one
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)


def box_edges(lo: tuple[float, float, float], hi: tuple[float, float, float]) -> list[tuple[tuple, tuple]]:
    """The 12 edges of an axis-aligned box, as pairs of corners."""
    corners = [(x, y, z) for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])]
    return [
        (a, b)
        for i, a in enumerate(corners)
        for b in corners[i + 1 :]
        if sum(u != v for u, v in zip(a, b, strict=True)) == 1
    ]


def workspace_marker(frame_id: str, safety: SafetyConfig) -> Marker:
    """The workspace box the TCP must stay in (safety.yaml, base frame) as a LINE_LIST."""
    marker = Marker(ns="workspace", id=0, type=Marker.LINE_LIST, action=Marker.ADD)
    marker.header.frame_id = frame_id
    marker.frame_locked = True
    marker.points = [
        Point(x=float(p[0]), y=float(p[1]), z=float(p[2]))
        for edge in box_edges(safety.workspace_min_m, safety.workspace_max_m)
        for p in edge
    ]
    marker.scale.x = 0.003
    marker.color.r, marker.color.g, marker.color.b, marker.color.a = 1.0, 0.8, 0.0, 0.8
    return marker


def request_to_msg(request: ApprovalRequest, stamp) -> ApprovalRequestMsg:
    action = request.action
    msg = ApprovalRequestMsg(
        request_id=request.request_id,
        episode_id=action.episode_id,
        capability=action.capability,
        args_json=action.args_json(),
        description=action.description,
        timeout_s=float(request.timeout_s),
    )
    msg.header.stamp, msg.header.frame_id = stamp, action.frame_id
    if action.target_position_m is not None:
        msg.has_target_pose = True
        p, q = msg.target_pose.position, msg.target_pose.orientation
        p.x, p.y, p.z = (float(v) for v in action.target_position_m)
        q.x, q.y, q.z, q.w = (float(v) for v in action.target_quaternion_xyzw or (0.0, 0.0, 0.0, 1.0))
    if action.target_jaw_opening_m is not None:
        msg.target_jaw_opening_m = float(action.target_jaw_opening_m)
    seconds = math.floor(request.deadline_unix_s)
    msg.deadline = Time(sec=int(seconds), nanosec=int((request.deadline_unix_s - seconds) * 1e9))
    return msg


def request_from_msg(msg: ApprovalRequestMsg) -> ApprovalRequest:
    """The core's request (for describe_request) from its message."""
    try:
        args = json.loads(msg.args_json or "{}")
    except ValueError:
        args = {"args_json": msg.args_json}
    p, q = msg.target_pose.position, msg.target_pose.orientation
    action = PendingAction(
        msg.capability,
        args if isinstance(args, dict) else {"args": args},
        msg.description,
        frame_id=msg.header.frame_id,
        target_position_m=(p.x, p.y, p.z) if msg.has_target_pose else None,
        target_quaternion_xyzw=(q.x, q.y, q.z, q.w) if msg.has_target_pose else None,
        target_jaw_opening_m=msg.target_jaw_opening_m if msg.target_jaw_opening_m >= 0 else None,
        episode_id=msg.episode_id,
    )
    return ApprovalRequest(msg.request_id, action, msg.timeout_s, msg.deadline.sec + msg.deadline.nanosec * 1e-9)


class SafetySupervisor:
    """The e-stop latch and the approver of one motion node, with their services, topics and markers.

    `on_engage(source)` is the node's halt: called once each time the e-stop latches, after the latch is set
    and any pending approval request withdrawn. The harness gate checks the latch before and after it
    clears its stop signal, so the node only needs to signal the running motion and hold an idle arm."""

    def __init__(self, node: Node, on_engage: Callable[[str], None], callback_group) -> None:
        self.node = node
        self.on_engage = on_engage
        self.estop = EStop()
        self.approver = OperatorApprover(on_request=self._publish_request, on_change=lambda _: self.publish())
        self.config = SupervisorConfig()
        self.cell_timeout_s = math.inf  # the agent's per-cell wall time (harness.yaml), once configured
        self.frame_id = ""  # the base frame, once configured (the workspace box is drawn from then on)
        self.safety = SafetyConfig()
        self._last_decision = ""
        self._state_pub = node.create_publisher(SafetyState, STATE, LATCHED)
        self._requests_pub = node.create_publisher(ApprovalRequestMsg, REQUESTS, RELIABLE)
        self._markers_pub = node.create_publisher(MarkerArray, MARKERS, LATCHED)
        group = callback_group
        self._estop_service = self.node.resolve_service_name(ESTOP)
        self._estop_topic = self.node.resolve_topic_name(ESTOP)
        node.create_service(Trigger, ESTOP, self._on_estop_service, callback_group=group)
        node.create_service(Trigger, CLEAR_ESTOP, self._on_clear, callback_group=group)
        node.create_service(Approve, APPROVE, self._on_approve, callback_group=group)
        unheard = SubscriptionEventCallbacks(incompatible_qos=self._on_unheard_estop)
        node.create_subscription(
            Bool, ESTOP, self._on_estop_topic, RELIABLE, callback_group=group, event_callbacks=unheard
        )
        node.add_on_set_parameters_callback(self._on_parameters)
        # the e-stop topic's deadline check (set_estop_deadline): one timer, cancelled while there is no deadline
        # (destroying and recreating it under a multi-threaded executor races the executor's wait set)
        self._deadline_timer = node.create_timer(
            DEADLINE_CHECK_S, self._check_estop_deadline, callback_group=group, clock=STEADY, autostart=False
        )
        # again every second: a volatile subscriber (rviz's default) started later cannot read a latched topic's
        # history, and one that is transient local does not match the volatile publishers of the same topic
        node.create_timer(MARKERS_EVERY_S, self._publish_markers, callback_group=group)
        self.publish()

    # ------------------------------------------------------------------------------ configuration
    def configure(
        self,
        config: SupervisorConfig,
        safety: SafetyConfig,
        frame_id: str,
        *,
        approval_mode: bool,
        approval_timeout_s: float,
        cell_timeout_s: float = math.inf,
    ) -> None:
        """At the node's configure: the file's settings, the parameters and the workspace box to draw.
        `cell_timeout_s` is the agent's wall-time limit per cell (harness.yaml): an approval wait must end before
        it, or an action could be approved after the agent killed the cell that asked for it."""
        if approval_timeout_s < 0:
            raise ValueError(f"approval_timeout_s must be >= 0 (0 = safety.yaml's), got {approval_timeout_s}")
        self.cell_timeout_s = cell_timeout_s
        problem = self._timeout_problem(approval_timeout_s or config.approval_timeout_s)
        if problem:
            raise ValueError(problem)
        self.config, self.safety, self.frame_id = config, safety, frame_id
        self.approver.timeout_s = approval_timeout_s or config.approval_timeout_s
        self.approver.enabled = approval_mode
        self.publish()

    def _timeout_problem(self, timeout_s: float) -> str:
        if timeout_s >= self.cell_timeout_s:
            return (
                f"approval timeout {timeout_s:g} s must be shorter than the agent's cell time limit "
                f"{self.cell_timeout_s:g} s "
                "(harness.yaml agent.cell_timeout_s): an action could be approved after its cell was killed"
            )
        return ""

    def _on_parameters(self, parameters) -> SetParametersResult:
        """approval_mode and approval_timeout_s take effect at once (a request already pending keeps its own
        timeout); other parameters are the node's business."""
        for p in parameters:
            if p.name == "approval_timeout_s" and not (isinstance(p.value, float) and p.value >= 0):
                return SetParametersResult(successful=False, reason="approval_timeout_s must be a float >= 0")
            if p.name == "approval_timeout_s":
                problem = self._timeout_problem(p.value or self.config.approval_timeout_s)
                if problem:
                    return SetParametersResult(successful=False, reason=problem)
            if p.name == "approval_mode" and not isinstance(p.value, bool):
                return SetParametersResult(successful=False, reason="approval_mode must be true or false")
            if p.name == "estop_deadline_s" and not (
                isinstance(p.value, float) and math.isfinite(p.value) and p.value >= 0
            ):
                return SetParametersResult(successful=False, reason="estop_deadline_s must be a float >= 0 (0: none)")
        for p in parameters:
            if p.name == "approval_timeout_s":
                self.approver.timeout_s = p.value or self.config.approval_timeout_s
            elif p.name == "approval_mode":
                self.approver.enabled = p.value
                self.node.get_logger().warning(f"approval mode {'on' if p.value else 'off'}")
            elif p.name == "estop_deadline_s":
                self.set_estop_deadline(p.value)
        if any(p.name in ("approval_timeout_s", "approval_mode") for p in parameters):
            self.publish()
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------------------ e-stop
    def engage(self, source: str, reason: str = "", *, pressed: bool | None = None) -> bool:
        """Latch the e-stop (or note an input's reading, `pressed`); True if this engaged it. The state is
        published when something changed (a bridge repeating its button's state publishes nothing new)."""
        inputs = self.estop.pressed_inputs()
        engaged = self.estop.engage(source, reason) if pressed is None else self.estop.set_input(source, pressed)
        if engaged:
            self._engaged(source)
        elif inputs != self.estop.pressed_inputs():
            self.publish()
        return engaged

    def _engaged(self, source: str) -> None:
        """What follows each latch: the pending request withdrawn, the log, the node's halt, the new state."""
        self.approver.withdraw(f"e-stop engaged by {source}")
        clear = self.node.resolve_service_name(CLEAR_ESTOP)
        self.node.get_logger().error(f"E-STOP engaged by {source}: motions refused until {clear}")
        self.on_engage(source)
        self.publish()

    def set_estop_deadline(self, deadline_s: float) -> None:
        """The e-stop topic's deadline (module doc): watched from now, checked on the steady clock every
        DEADLINE_CHECK_S (a lapse latches at most that late); 0 waives it."""
        source = f"the {self._estop_topic} topic"
        self.estop.watch(source, deadline_s, time.monotonic())
        if deadline_s == 0:
            self._deadline_timer.cancel()
            self.node.get_logger().warning(
                f"{self._estop_topic} has no deadline (estop_deadline_s 0): a button bridge that dies goes unnoticed"
            )
            return
        self._deadline_timer.reset()
        self.node.get_logger().info(f"{self._estop_topic} must speak at least every {deadline_s:g} s")

    def _check_estop_deadline(self) -> None:
        latches = self.estop.engagements
        lapsed = self.estop.lapse(time.monotonic())
        for source in lapsed:
            self.node.get_logger().error(
                f"{source} went silent past its {self.estop.deadline_s(source):g} s deadline: is its bridge alive?"
            )
        if self.estop.engagements != latches and self.estop.source in lapsed:  # it latched now, in the lapse's name
            self._engaged(self.estop.source)

    def _on_estop_service(self, _request, response: Trigger.Response) -> Trigger.Response:
        source = f"the {self._estop_service} service"
        if self.engage(source):
            response.message = f"e-stop engaged: motions refused until {self.node.resolve_service_name(CLEAR_ESTOP)}"
        else:
            response.message = f"e-stop already engaged by {self.estop.source}"
        response.success = True
        return response

    def _on_estop_topic(self, msg: Bool) -> None:
        self.engage(f"the {self._estop_topic} topic", pressed=bool(msg.data))

    def _on_unheard_estop(self, event) -> None:
        """A publisher on the e-stop topic whose QoS cannot reach this (reliable) subscription: say so loudly,
        its e-stops would go unheard."""
        self.node.get_logger().error(
            f"an e-stop publisher on {self._estop_topic} offers QoS this node cannot receive (policy "
            f"{event.last_policy_kind}): its e-stops are NOT heard; publish reliable"
        )

    def _on_clear(self, _request, response: Trigger.Response) -> Trigger.Response:
        was = self.estop.source
        refusal = self.estop.clear()
        if refusal:
            response.success, response.message = False, f"e-stop not cleared: {refusal}"
            self.node.get_logger().warning(response.message)
            return response
        self.publish()
        response.success = True
        response.message = f"e-stop cleared (it was engaged by {was})" if was else "the e-stop was not engaged"
        self.node.get_logger().warning(response.message)
        return response

    def annotate(self, result: CallResult, engagements_before: int) -> None:
        """A call stopped while the e-stop was (or got) engaged says so in its message and receipt."""
        estop = self.estop
        if result.failure_category is not FailureCategory.SAFETY_STOP or not (
            estop.engaged or estop.engagements != engagements_before
        ):
            return
        note = f"e-stop engaged by {estop.last_source}"
        if note in result.message:
            return
        result.message = f"{result.message} ({note})"
        tail = f" ({note})"
        receipt = result.receipt
        if len(receipt) + len(tail) > RECEIPT_MAX_CHARS:
            receipt = receipt[: RECEIPT_MAX_CHARS - len(tail) - 3] + "..."
        result.receipt = receipt + tail

    # ------------------------------------------------------------------------------ approval
    def _publish_request(self, request: ApprovalRequest) -> None:
        self.node.get_logger().warning(f"approval needed: {describe_request(request)}")
        self._requests_pub.publish(request_to_msg(request, self.node.get_clock().now().to_msg()))

    def _on_approve(self, request: Approve.Request, response: Approve.Response) -> Approve.Response:
        refusal = self.approver.answer(request.request_id, request.approve, request.note)
        note = request.note.strip()
        response.success = not refusal
        response.message = refusal or ("approved" if request.approve else "rejected") + (f": {note}" if note else "")
        self.node.get_logger().warning(f"approval {request.request_id or '(the pending one)'}: {response.message}")
        return response

    # ------------------------------------------------------------------------------ state and markers
    def publish(self) -> None:
        """The supervisor's state (latched) and, once configured, the markers: the workspace box, the state as
        text and the planned sweep of the action waiting for approval."""
        last = self.approver.last
        if last is not None:
            request, approval = last
            self._last_decision = f"{request.request_id} {request.action.capability}: {approval.decision.value}" + (
                f" ({approval.note})" if approval.note else ""
            )
        stamp = self.node.get_clock().now().to_msg()
        state = SafetyState(
            estop_engaged=self.estop.engaged,
            estop_source=self.estop.source,
            estop_reason=self.estop.reason,
            estop_inputs_pressed=self.estop.pressed_inputs(),
            approval_mode=self.approver.enabled,
            approval_timeout_s=float(self.approver.timeout_s),
            pending=[request_to_msg(r, stamp) for r in self.approver.pending()],
            last_decision=self._last_decision,
        )
        state.header.stamp = stamp
        self._state_pub.publish(state)
        self._publish_markers()

    def _publish_markers(self) -> None:
        if self.frame_id:
            markers = [workspace_marker(self.frame_id, self.safety), self._text(), self._pending_sweep()]
            self._markers_pub.publish(MarkerArray(markers=markers))

    def _pending_sweep(self) -> Marker:
        """The TCP sweep an operator is asked to approve (namespace "approval"; deleted once answered)."""
        marker = Marker(ns="approval", id=0, type=Marker.LINE_STRIP, action=Marker.DELETE)
        marker.header.frame_id = self.frame_id
        path = next((r.action.tcp_path_m for r in self.approver.pending() if r.action.tcp_path_m), ())
        if len(path) >= 2:
            marker.action = Marker.ADD
            marker.points = [Point(x=float(x), y=float(y), z=float(z)) for x, y, z in path]
            marker.scale.x = 0.006
            marker.color.r, marker.color.g, marker.color.b, marker.color.a = 1.0, 0.8, 0.0, 1.0
        return marker

    def _text(self) -> Marker:
        """The supervisor's state as text above the workspace box (deleted when there is nothing to say)."""
        marker = Marker(ns="safety", id=0, type=Marker.TEXT_VIEW_FACING)
        marker.header.frame_id = self.frame_id
        pending = self.approver.pending()
        if self.estop.engaged:
            marker.text = f"E-STOP engaged by {self.estop.source}"
            marker.color.r, marker.color.g, marker.color.b = 1.0, 0.1, 0.1
        elif pending:
            marker.text = f"waiting for approval: {pending[0].action.description}"
            marker.color.r, marker.color.g, marker.color.b = 1.0, 0.8, 0.0
        else:
            marker.action = Marker.DELETE
            return marker
        lo, hi = self.safety.workspace_min_m, self.safety.workspace_max_m
        marker.pose.position.x, marker.pose.position.y = (lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2
        marker.pose.position.z = hi[2] + 0.05
        marker.pose.orientation.w = 1.0
        marker.scale.z, marker.color.a = 0.04, 1.0
        return marker


# ------------------------------------------------------------------------------ the operator's prompt
class ApprovalPrompt:
    """`captain-ros approve`: shows each pending approval request (from the latched /safety/state, so a
    prompt started late sees the current one), asks y/n and answers through /safety/approve. A request
    answered elsewhere, timed out or withdrawn while the prompt waits is reported and dropped.

    `read_line(timeout_s)` returns a typed line, or None when nothing was typed in time, and raises EOFError
    at the end of input; `write(text)` shows text (a terminal: stdin and stdout; tests: scripted)."""

    def __init__(
        self, node: Node, read_line: Callable[[float], str | None], write: Callable[[str], None], namespace: str = ""
    ) -> None:
        self.node, self.read_line, self.write = node, read_line, write
        prefix = f"/{namespace.strip('/')}/" if namespace.strip("/") else "/"
        self._lock = threading.Lock()
        self._state: SafetyState | None = None
        self._changed = threading.Event()
        self._handled: set[str] = set()
        self._stop = threading.Event()  # run()'s
        node.create_subscription(SafetyState, prefix + STATE, self._on_state, LATCHED)
        self.client = node.create_client(Approve, prefix + APPROVE)

    def _on_state(self, state: SafetyState) -> None:
        with self._lock:
            before, self._state = self._state, state
        if before is None or (before.estop_engaged, before.approval_mode) != (state.estop_engaged, state.approval_mode):
            if state.estop_engaged:
                self.write(f"\n!! e-stop engaged by {state.estop_source}: nothing moves until it is cleared\n")
            elif before is not None and before.estop_engaged:
                self.write("\ne-stop cleared\n")
            if not state.approval_mode:
                self.write(
                    "approval mode is off: the motion node asks nothing (ros2 param set /motion approval_mode true)\n"
                )
        self._changed.set()

    def pending_ids(self) -> set[str]:
        with self._lock:
            return {r.request_id for r in self._state.pending} if self._state is not None else set()

    def next_request(self, timeout_s: float) -> ApprovalRequestMsg | None:
        """The first pending request not yet answered here (waits up to timeout_s for one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._changed.clear()
            with self._lock:
                pending = list(self._state.pending) if self._state is not None else []
            for request in pending:
                if request.request_id not in self._handled:
                    return request
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.wait(min(left, 0.5))

    def handle(self, msg: ApprovalRequestMsg) -> bool | None:
        """Ask about one request; True/False = approved/rejected here, None = not answered (it went, or the
        motion node did not take the answer). EOFError at the end of input."""
        self._handled.add(msg.request_id)
        self.write("\n" + describe_request(request_from_msg(msg)) + "\napprove? [y/n, then an optional note]: ")
        while self.node.context.ok() and not self._stop.is_set():
            if msg.request_id not in self.pending_ids():
                self.write(f"\n[{msg.request_id}] is no longer pending (answered elsewhere, timed out or withdrawn)\n")
                return None
            line = self.read_line(0.2)
            if line is None:
                continue
            parsed = parse_answer(line)
            if parsed is None:
                self.write("answer y or n (optionally followed by a note): ")
                continue
            answer, note = parsed
            approve = answer is Answer.APPROVE
            if not self.client.wait_for_service(timeout_sec=5.0):
                self.write(f"{self.client.srv_name} is not there: is the motion node running?\n")
                return None
            future = self.client.call_async(Approve.Request(request_id=msg.request_id, approve=approve, note=note))
            deadline = time.monotonic() + 10.0
            while not future.done() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not future.done():
                self.write("no reply from the motion node within 10 s\n")
                return None
            reply = future.result()
            self.write(f"[{msg.request_id}] {reply.message}\n")
            return approve if reply.success else None
        return None

    def run(self, stop: threading.Event | None = None) -> None:
        """Answer requests until end of input, `stop` (also ends a question being asked) or the node's shutdown."""
        stop = self._stop = stop or threading.Event()
        self.write(f"waiting for approval requests (answer with y or n; Ctrl-C to quit) on {self.client.srv_name}\n")
        while not stop.is_set() and self.node.context.ok():
            request = self.next_request(0.5)
            try:
                if request is not None:
                    self.handle(request)
                elif (self.read_line(0.0) or "").strip():  # typed before any request: answers nothing shown
                    self.write("no request is pending: nothing to answer\n")
            except EOFError:  # end of input
                return


def _stdin_line(timeout_s: float) -> str | None:
    """A line typed on stdin (an empty one asks again: there is no default answer), None if nothing was
    typed within timeout_s; EOFError at the end of input."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not ready:
        return None
    line = sys.stdin.readline()
    if line == "":
        raise EOFError
    return line.rstrip("\n")


def run_approve_prompt(namespace: str = "") -> int:
    """`captain-ros approve`: the prompt on this terminal until Ctrl-C, SIGTERM or end of input.

    The main thread spins, the prompt runs in a helper thread (a spinner thread of its own made the process abort at
    Ctrl-C, "terminate called without an active exception"). Either end stops the other, and the exit is the nodes'
    (captain_ros.ros.spin): the prompt ends, then the executor, the node, and the context last."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from captain_ros.ros import spin

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    spin.init()
    node = executor = worker = None
    done = threading.Event()
    try:
        node = rclpy.create_node(f"approve_prompt_{os.getpid()}")
        prompt = ApprovalPrompt(node, _stdin_line, write, namespace)
        executor = SingleThreadedExecutor()
        executor.add_node(node)

        def answer() -> None:
            try:
                prompt.run(done)
            finally:
                spin.request_stop()

        worker = threading.Thread(target=answer, name="prompt", daemon=True)
        worker.start()
        spin.spin_until_stopped(executor)
    except KeyboardInterrupt:
        pass
    finally:
        done.set()
        if worker is not None:
            worker.join(timeout=5.0)  # it sees `done` within a second
        spin.close(executor, node)
    write("\n")
    return 0

"""The physical half of the policy-facing API (CaPtain Table 4), over one ArmBackend.

Every capability validates its arguments, checks budgets, runs, and returns a CallResult with a
receipt; none raises. Physical actions (move_to, hold, recover, release) count against the
action budget once their arguments are valid, whether or not the motion then succeeds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from captain_ros.core import args as A  # noqa: N812 - A.number(...) reads as "argument"
from captain_ros.core import robot
from captain_ros.core.config import HarnessConfig
from captain_ros.core.contract import CAPABILITY_BY_NAME, RECEIPT_MAX_CHARS, Budget, CallResult, FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.moveit_scene import (
    SceneCheckError,
    SceneObjects,
    StateVerdict,
    TouchRule,
    box_from_measurement,
    judge,
    links_below,
    touch_rule,
)
from captain_ros.harness.approval import Approver, Decision, EStop, PendingAction
from captain_ros.harness.backend import ArmBackend
from captain_ros.harness.dispatch import dispatch
from captain_ros.harness.motion import (
    Executor,
    MotionOutcome,
    MotionProgress,
    PlanError,
    Planner,
    StopReason,
    StopSignal,
    SweepPlan,
    Watchdog,
)
from captain_ros.harness.shadow import Prediction, ShadowError, ShadowTwin, outcome_of
from captain_ros.perception.perception import Perception


def policy_frames(profile: robot.RobotProfile) -> dict[str, str]:
    """The frame names the policy uses (the same on every arm) -> the profile's URDF frames."""
    frames = {
        "base": profile.base_frame,
        "tcp": profile.tcp_frame,
        "hand": profile.hand_frame,
        "flange": profile.flange_frame,
    }
    return frames | {f"{cam}_camera": frame for cam, frame in profile.camera_frames.items()}


VERIFYING = {
    "observe",
    "segment",
    "point",
    "mark_point",
    "track_target",
    "measure_object_geometry",
    "measure_image_points",
    "inspect_contact_geometry",
    "inspect_release_geometry",
    "compare_object_observations",
}  # scene measurements (perception): robot state alone does not show where the objects are


def _with_tail(receipt: str, tail: str) -> str:
    """A receipt with `tail` appended, its own text shortened so that both fit the receipt limit."""
    return receipt[: max(0, RECEIPT_MAX_CHARS - len(tail))] + tail


def _is_physical(capability: str) -> bool:
    """Whether a name is a physical action of the contract (False for any other name)."""
    known = CAPABILITY_BY_NAME.get(capability)
    return known is not None and known.physical


@dataclass
class MotionRecord:
    motion_id: int
    capability: str
    outcome: MotionOutcome


@dataclass
class EpisodeLog:
    """What the completion gate may look at: the agent's own calls, never simulator state."""

    calls: list[tuple[str, bool]] = field(default_factory=list)  # (capability, success)
    finish_rejections: int = 0
    finished: bool = False

    def record(self, capability: str, success: bool) -> None:
        """Log a call of a capability of the contract. A name outside it ran nothing, moved nothing and
        verified nothing (its result and receipt still say so), so the gate has nothing to learn from it."""
        if capability in CAPABILITY_BY_NAME:
            self.calls.append((capability, success))


class PlanningScene(Protocol):
    """MoveIt's planning scene as the harness uses it (ros/move_group_scene.MoveItScene over move_group's services,
    ros/moveit_py_scene.MoveItPyScene through moveit-py, or a test's)."""

    def check(self, q_waypoints: np.ndarray, may_touch: TouchRule | None = None) -> list[StateVerdict]:
        """The scene's verdict on sampled configurations of the joint path (core/moveit_scene.sample_indices);
        raises SceneCheckError without an answer. `may_touch` (a guarded sweep's touch rule) is the harness's
        judge's too: a scene whose contacts are named may leave it to judge, one whose are not (moveit-py) must
        allow its pairs in the check itself."""
        ...

    def apply(self, add: list, remove: list[str]) -> None:
        """Add SceneBoxes to the scene and remove objects by id; raises SceneCheckError when not applied."""
        ...

    # free_space_min_m: float, and plan(q_start, q_goal) -> (joint path | None, refusal): free-space planning, used
    # by move_to when free_space_min_m > 0 (ros/move_group_scene.MoveItScene)


class Harness:
    def __init__(
        self,
        backend: ArmBackend,
        config: HarnessConfig,
        kinematics: Kinematics | None = None,
        clock: Callable[[], float] = time.monotonic,
        watchdog: Watchdog | None = None,
        *,
        approver: Approver | None = None,
        estop: EStop | None = None,
    ):
        """`watchdog`: fed by the agent's heartbeats (the motion node makes one); in-process callers
        are alive by construction and need none. `approver`: asked before every physical action (approval
        mode; harness/approval.py); `estop`: a latch shared with whoever engages it (the motion node's
        e-stop service and topic), checked by the physical-action gate."""
        self.backend, self.config = backend, config
        self.kin = kinematics or Kinematics(profile=backend.profile)
        if (self.kin.profile.urdf_text, self.kin.profile.arm_joints) != (
            backend.profile.urdf_text,
            backend.profile.arm_joints,
        ):
            raise ValueError(
                f"the kinematics are of robot profile '{self.kin.profile.name}', the backend drives "
                f"'{backend.profile.name}'"
            )
        self.profile = backend.profile
        self.frames = policy_frames(self.profile)
        self.planner, self.executor = Planner(config, self.kin), Executor(config, self.kin)
        self.stop_signal = StopSignal()
        self.watchdog = watchdog
        self.stopped = False  # set by the stop service; cleared by resume()
        self.approver = approver
        self.estop = estop if estop is not None else EStop()
        self._call_args: dict[str, Any] = {}  # the running call's arguments as given (what an approver sees)
        self.on_progress: Callable[[MotionProgress], None] | None = None  # e.g. the MoveTo action's feedback
        self._clock = clock
        self.perception = Perception(self.kin, self._capture, config.perception)
        # MoveIt's planning scene (core/moveit_scene.py; the motion node sets it with use_moveit): every sweep is
        # checked in it right before it runs, and measured objects are kept in it while their measurement is fresh
        self.scene: PlanningScene | None = None
        self.scene_objects = SceneObjects()
        self._gripper_links: frozenset[str] | None = None  # the hand and below: may touch measured objects
        # the motion node feeds measurements from its receipts thread while a call may be syncing before a sweep
        self._scene_lock = threading.RLock()
        self.shadow: ShadowTwin | None = None  # the shadow check (harness/shadow.py): enable_shadow()
        self._prediction: Prediction | None = None  # the shadow's prediction for the running call
        self.new_episode()
        if config.shadow.enabled:
            self.enable_shadow()

    def enable_shadow(self) -> None:
        """Play every physical action first in a twin built from this episode's measurements; refuse what it
        predicts harmful (harness/shadow.py). Raises ShadowError for a robot without a twin section."""
        if self.shadow is None:
            self.shadow = ShadowTwin(self)

    # ------------------------------------------------------------------------------ episode
    def new_episode(self, episode_id: str = "") -> None:
        b = self.config.budgets
        self.episode_id = episode_id
        self.budget = Budget(
            requests_limit=b.requests, actions_limit=b.physical_actions, wall_time_limit_s=b.wall_time_s
        )
        self._t0 = self._clock()
        self.motions: list[MotionRecord] = []
        self.log = EpisodeLog()
        self.backend.resync()
        self.perception.new_episode()
        with self._scene_lock:
            stale = self.scene_objects.clear()
        if self.scene is not None and stale:
            try:
                self.scene.apply([], stale)
            except SceneCheckError:
                pass  # they stay in MoveIt's scene: a check then refuses more, never less
        self.jaw_command_m = self.backend.read_state(require_force=False).jaw_opening_m
        if self.shadow is not None:
            self.shadow.reset()

    def note_external_call(self, capability: str, success: bool) -> None:
        """A call served elsewhere (the perception node) that the completion gate should see."""
        if not _is_physical(capability):  # physical actions count only where they ran (here)
            self.log.record(capability, success)

    def note_request(self) -> None:
        """The agent issued one model request (counted against the request budget)."""
        self.budget.requests_used += 1

    def stop(self) -> None:
        """Stop service: halt any motion within one control period and refuse motions until resume()."""
        self.stopped = True
        self.stop_signal.request(StopReason.SAFETY_STOP)
        if self.approver is not None:
            self.approver.withdraw("the stop service was called")

    def cancel(self) -> None:
        """Action cancel: halt the current motion within one control period."""
        self.stop_signal.request(StopReason.CANCELED)
        if self.approver is not None:
            self.approver.withdraw("the call was canceled")

    def resume(self) -> None:
        self.stopped = False
        self.stop_signal.clear()

    # ------------------------------------------------------------------------------ dispatch
    def call(self, capability: str, /, **kwargs: Any) -> CallResult:
        """Run one capability by name. Never raises (`capability` is positional-only, so an argument of
        that name reaches the handler's validation instead of Python's call machinery)."""
        self.budget.wall_time_used_s = self._clock() - self._t0
        self._call_args, self._prediction = kwargs, None
        result = dispatch(capability, kwargs, self._handler(capability), self.capabilities())
        if self.shadow is not None:
            self._shadow_after(result)
        self.budget.wall_time_used_s = self._clock() - self._t0
        result.budget = Budget(**vars(self.budget))
        result.episode_id = self.episode_id
        result.frame_id = self.profile.base_frame
        self.log.record(capability, result.success)
        if result.executed:  # the scene may have changed: earlier observations are stale
            self.perception.scene_changed()
        if self.scene is not None:
            if result.success:
                self.note_measurement(capability, result.value)
            try:
                self.sync_scene()
            except SceneCheckError:
                pass  # kept pending: the next sweep's check syncs first and is refused if it still fails
        return result

    # ------------------------------------------------------------------------------ MoveIt's planning scene
    def note_measurement(self, capability: str, value: Any) -> None:
        """A measure_object_geometry result (this harness's or the perception node's): its object, and its
        destination if one was measured, become collision boxes in MoveIt's scene at the next sync."""
        if capability != "measure_object_geometry" or not isinstance(value, dict):
            return
        version = self.perception.store.scene_version
        for part, key in ((value, "object"), (value.get("destination"), "detection_id")):
            if isinstance(part, dict) and "center_m" in part and "extents_m" in part:
                oid = str((value if key == "object" else part).get(key) or f"object_{len(self.scene_objects.in_scene)}")
                with self._scene_lock:
                    self.scene_objects.measured(box_from_measurement(oid, part), version)

    def sync_scene(self) -> None:
        """Add fresh measurements to MoveIt's scene and remove stale ones (measured before the last physical
        action). Raises SceneCheckError when move_group does not take them."""
        if self.scene is None:
            return
        with self._scene_lock:
            version = self.perception.store.scene_version
            add, remove = self.scene_objects.update(version)
            if add or remove:
                self.scene.apply(add, remove)
                self.scene_objects.applied(add, remove, version)

    def _scene_check(self, plan: SweepPlan, *, guarded: bool) -> None:
        """With MoveIt's planning scene on: the sweep's joint path checked there right before it runs, after the
        scene is brought up to date. A collision, or a move_group that does not answer, refuses it (fail closed). A
        guarded sweep's gripper may touch the objects measured into the scene (core/moveit_scene.touch_rule)."""
        if self.scene is None or len(plan.q_waypoints) < 2:
            return
        may_touch = None
        if guarded and self.profile.urdf_text and self._gripper_links is None:
            self._gripper_links = links_below(self.profile.urdf_text, self.profile.hand_frame)
        try:
            self.sync_scene()
            if guarded and self._gripper_links:
                with self._scene_lock:  # the objects in the scene now, as this check sees it
                    may_touch = touch_rule(self._gripper_links, frozenset(self.scene_objects.in_scene))
            verdicts = self.scene.check(plan.q_waypoints, may_touch)  # moveit-py allows its pairs in the check
            refusal = judge(verdicts, len(plan.q_waypoints), may_touch)
        except SceneCheckError as exc:
            raise PlanError(
                FailureCategory.SAFETY_STOP, f"MoveIt planning-scene check failed: {exc}; refused, nothing moved"
            ) from exc
        if refusal:
            raise PlanError(FailureCategory.SAFETY_STOP, f"{refusal}; refused, nothing moved")

    def capabilities(self) -> list[str]:
        return [name for name in CAPABILITY_BY_NAME if self._handler(name) is not None]

    def _handler(self, capability: str) -> Callable[..., CallResult] | None:
        if capability not in CAPABILITY_BY_NAME:
            return None
        return getattr(self, f"_{capability}", None) or getattr(self.perception, f"_{capability}", None)

    def _capture(self, cameras: tuple[str, ...]):
        images = self.backend.capture(cameras)
        state = self.backend.read_state(require_force=False)
        return state.time_s, images, state.q_rad, state.jaw_opening_m

    def _physical(self, capability: str) -> None:
        """Budget and safety gate for a physical action whose arguments are valid. Its second half,
        `_approve`, runs right before the action commands the arm."""
        self._check_latches()
        exhausted = self.budget.exhausted()
        if exhausted:
            raise PlanError(FailureCategory.BUDGET_EXHAUSTED, f"the {exhausted} budget is spent")
        self.budget.actions_used += 1
        self.stop_signal.clear()
        if self.watchdog is not None:
            self.watchdog.feed()

    def _require_gripper(self, capability: str) -> None:
        """Gripper capabilities on an arm without a gripper: refused before anything is counted or moves."""
        if not self.profile.has_gripper:
            raise PlanError(
                FailureCategory.UNSUPPORTED,
                f"{capability}: this robot profile ('{self.profile.name}') has no gripper; nothing moved",
            )

    def _check_latches(self) -> None:
        """The e-stop, then the stop service: either refuses every physical action."""
        refusal = self.estop.refusal()
        if refusal:
            raise PlanError(FailureCategory.SAFETY_STOP, refusal)
        if self.stopped:
            raise PlanError(
                FailureCategory.SAFETY_STOP,
                "the arm is stopped (stop service); nothing moves until an operator resumes",
            )

    def _shadow_check(self, capability: str) -> None:
        """The shadow check, right before the arm is commanded: refused (SAFETY_STOP, nothing moves) when the shadow
        twin predicts harm."""
        if self.shadow is None:
            return
        state = self.backend.read_state(require_force=False)
        self._prediction = self.shadow.predict(capability, self._call_args, state)
        if self._prediction.refusal:
            raise PlanError(
                FailureCategory.SAFETY_STOP, f"shadow check: {self._prediction.refusal}; refused, nothing moved"
            )

    def _shadow_after(self, result: CallResult) -> None:
        """The shadow learns from the result (measurements, grasps); a checked action's result carries the
        prediction beside the outcome, in its value and receipt."""
        try:
            self.shadow.note(result.capability, result.value)
        except ShadowError as exc:  # a measurement it cannot use is left out, said in the receipt
            result.receipt = _with_tail(result.receipt, f"; shadow ignored it: {exc}")
        p = self._prediction
        if p is None:
            return
        value = result.value if isinstance(result.value, dict) else {}
        value["shadow"] = {"predicted": p.as_value(), "actual": outcome_of(result)}
        result.value = value
        if not p.refusal:
            result.receipt = _with_tail(result.receipt, f"; twin predicted {p.summary()}")

    def _approve(self, action: PendingAction, *, shadow: bool = True) -> bool:
        """The gate's last step, right before the arm is commanded: the approver's answer (approval mode),
        then the e-stop and stop latches again, which may have been engaged while the operator was asked or
        since the gate cleared the stop signal (they latch before they signal, so nothing slips between).
        Returns whether an operator was asked (the arm may have been moved meanwhile: plan again). The
        watchdog is not fed here: an agent that went silent during the wait stops the motion at once."""
        self._check_latches()  # also before asking: no operator is asked to approve what is refused anyway
        if shadow:  # an action that moves the arm (a vendor's recovery does not: nothing to predict)
            self._shadow_check(action.capability)
        if self.approver is None:
            return False
        action = PendingAction(**{**vars(action), "args": self._call_args, "episode_id": self.episode_id})
        approval = self.approver.ask(action)
        note = f": {approval.note}" if approval.note else ""
        if approval.decision is Decision.REJECTED:
            raise PlanError(
                FailureCategory.SAFETY_STOP, f"the operator rejected {action.capability}{note}; the arm holds"
            )
        if approval.decision is Decision.TIMED_OUT:
            raise PlanError(
                FailureCategory.TIMEOUT, f"no operator approval for {action.capability}{note}; the arm holds"
            )
        self._check_latches()
        if approval.decision is Decision.WITHDRAWN:
            if self.stop_signal.is_set() and self.stop_signal.reason is StopReason.CANCELED:
                raise PlanError(FailureCategory.CANCELED, f"canceled while waiting for approval{note}")
            raise PlanError(FailureCategory.SAFETY_STOP, f"the approval request was withdrawn{note}; the arm holds")
        return approval.asked

    def _target(
        self, capability: str, description: str, position: np.ndarray, rotation: np.ndarray, path: Any = ()
    ) -> PendingAction:
        """A motion's PendingAction: where the TCP will end and the planned sweep (`path`), in the base frame."""
        pose = A.pose_dict(position, rotation)
        return PendingAction(
            capability,
            {},
            description,
            frame_id=self.profile.base_frame,
            target_position_m=tuple(pose["position"]),
            target_quaternion_xyzw=tuple(pose["quaternion"]),
            tcp_path_m=tuple(tuple(round(float(v), 4) for v in p) for p in path),
        )

    # ------------------------------------------------------------------------------ motion
    def _move_to(
        self,
        pose: Any = None,
        gripper: Any = None,
        *,
        mode: str = "guarded",
        speed_mps: Any = None,
        duration_s: Any = None,
        force_limit_n: Any = None,
    ) -> CallResult:
        safety = self.config.safety
        if (pose is None) == (gripper is None):
            raise A.ArgumentError(
                "move_to takes exactly one of pose=... (a TCP pose) or gripper=... "
                "('open', 'close' or an opening in metres)"
            )
        A.choice("mode", mode, ("guarded", "manipulation"))
        speed = None if speed_mps is None else A.number("speed_mps", speed_mps, lo=1e-3, hi=safety.max_tcp_speed_mps)
        duration = None if duration_s is None else A.number("duration_s", duration_s, lo=0.0, hi=60.0)
        limit = (
            safety.force_limit_n
            if force_limit_n is None
            else A.number("force_limit_n", force_limit_n, lo=safety.contact_threshold_n, hi=safety.force_limit_n)
        )
        if gripper is not None:
            self._require_gripper("move_to(gripper=...)")
            if isinstance(gripper, str):
                target = {"open": self.profile.max_jaw_opening_m(), "close": 0.0}.get(gripper)
                if target is None:
                    raise A.ArgumentError(f"gripper must be 'open', 'close' or an opening in metres, got {gripper!r}")
            else:
                target = A.number("gripper", gripper, lo=0.0, hi=self.profile.max_jaw_opening_m())
            self._physical("move_to")
            return self._jaw("move_to", target)
        position, rotation = A.pose("pose", pose)
        self._physical("move_to")
        state = self.backend.read_state()
        plan = self._plan_move(state, position, rotation, speed, duration)
        start = plan.tcp_waypoints[0]
        description = (
            f"move_to ({mode}): TCP ({start[0]:.3f}, {start[1]:.3f}, {start[2]:.3f}) -> ({position[0]:.3f}, "
            f"{position[1]:.3f}, {position[2]:.3f}) m, {plan.distance_m * 100:.1f} cm and "
            f"{math.degrees(plan.rotation_rad):.0f} deg in {plan.duration_s:.1f} s, force limit {limit:.0f} N"
        )
        self._scene_check(plan, guarded=mode == "guarded")  # before an operator is asked to approve it
        if self._approve(self._target("move_to", description, position, rotation, plan.tcp_waypoints)):
            state = self.backend.read_state()  # planned again from where the arm is after the wait
            plan = self._plan_move(state, position, rotation, speed, duration)
            self._scene_check(plan, guarded=mode == "guarded")
        outcome = self.executor.execute(
            self.backend,
            plan,
            guarded=mode == "guarded",
            force_limit_n=limit,
            stop=self.stop_signal,
            watchdog=self.watchdog,
            on_progress=self.on_progress,
        )
        return self._motion_result("move_to", outcome, plan.notes, target=position)

    def _plan_move(self, state, position: np.ndarray, rotation: np.ndarray, speed, duration) -> SweepPlan:
        """move_to's plan: a straight sweep, or, with MoveIt's free-space planning on (PlanningScene.free_space_min_m)
        and the target at least that far from the TCP, move_group's joint path to the target's IK solution, timed
        within this stack's limits (it then runs guarded and checked like a sweep)."""
        far = getattr(self.scene, "free_space_min_m", 0.0) if self.scene is not None else 0.0
        tcp = self.kin.forward(state.q_rad)[0]
        if not far or float(np.linalg.norm(position - tcp)) < far:
            return self.planner.plan_pose(
                state.q_rad, position, rotation, speed_mps=speed, duration_s=duration, jaw_opening_m=state.jaw_opening_m
            )
        safety = self.config.safety
        if not safety.inside_workspace(position):
            raise PlanError(
                FailureCategory.WORKSPACE_LIMIT,
                f"target {np.round(position, 3).tolist()} m is outside the workspace box "
                f"{list(safety.workspace_min_m)}..{list(safety.workspace_max_m)}",
            )
        goal = self.kin.solve(position, rotation, state.q_rad)
        if not goal.converged:
            raise PlanError(
                FailureCategory.UNREACHABLE,
                f"no IK solution at the target ({np.round(position, 3).tolist()} m): position error "
                f"{goal.position_error_m * 1000:.1f} mm",
            )
        try:
            path, refusal = self.scene.plan(state.q_rad, goal.q_rad)
        except SceneCheckError as exc:
            raise PlanError(FailureCategory.UNREACHABLE, f"free-space planning failed: {exc}; nothing moved") from exc
        if path is None:
            raise PlanError(FailureCategory.UNREACHABLE, f"{refusal}; nothing moved")
        path[0] = state.q_rad  # from where the arm is (the plan starts there within the planner's tolerance)
        for k, q in enumerate(path):
            collisions = self.kin.self_collisions(q, state.jaw_opening_m)
            if collisions:
                raise PlanError(
                    FailureCategory.SELF_COLLISION,
                    f"move_group's free-space path: self-collision {collisions[0][0]}/{collisions[0][1]} at "
                    f"waypoint {k} of {len(path)}",
                )
        plan = self.planner.plan_path(path, speed_mps=speed)
        if duration is not None and duration > plan.duration_s:
            plan.duration_s = duration
        plan.notes.append(f"free-space path planned by move_group ({len(path)} waypoints)")
        return plan

    def _hold(self, duration_s: Any = 1.0, force_limit_n: Any = None) -> CallResult:
        seconds = A.number("duration_s", duration_s, lo=0.0, hi=30.0)
        limit = (
            self.config.safety.force_limit_n
            if force_limit_n is None
            else A.number(
                "force_limit_n",
                force_limit_n,
                lo=self.config.safety.contact_threshold_n,
                hi=self.config.safety.force_limit_n,
            )
        )
        self._physical("hold")
        position, rotation = self.kin.forward(self.backend.read_state().q_rad)
        self._approve(self._target("hold", f"hold the current pose for {seconds:.1f} s", position, rotation))
        q = self.backend.read_state().q_rad
        plan = self.planner.plan_path(np.array([q]))
        plan.duration_s = seconds
        outcome = self.executor.execute(
            self.backend,
            plan,
            guarded=False,
            force_limit_n=limit,
            stop=self.stop_signal,
            watchdog=self.watchdog,
            on_progress=self.on_progress,
        )
        return self._motion_result("hold", outcome, [])

    def _recover(self, distance_m: Any = 0.05, speed_mps: Any = None) -> CallResult:
        motion_cfg = self.config.motion
        distance = A.number("distance_m", distance_m, lo=0.001, hi=motion_cfg.recover_max_m)
        speed = (
            None
            if speed_mps is None
            else A.number("speed_mps", speed_mps, lo=1e-3, hi=self.config.safety.max_tcp_speed_mps)
        )
        fault = self.backend.vendor_fault(ask_controllers=True)
        if fault:
            return self._recover_vendor(fault)
        last = next(
            (m for m in reversed(self.motions) if m.capability in ("move_to", "recover") and m.outcome.trace), None
        )
        if last is None:
            raise PlanError(FailureCategory.INVALID_ARGUMENT, "there is no executed motion to reverse")
        self._physical("recover")
        trace = last.outcome.trace
        path, travelled = [self.backend.read_state().q_rad], 0.0
        previous = self.kin.forward(path[0])[0]
        for row in reversed(trace):
            step = float(np.linalg.norm(row.tcp_m - previous))
            if travelled + step > distance:
                # rows can lie far apart (a stalled client): end part-way to this row, at exactly `distance`
                left = distance - travelled
                if left >= 0.002:
                    path.append(path[-1] + (left / step) * (row.q_rad - path[-1]))
                    travelled = distance
                break
            if step >= 0.002:
                path.append(row.q_rad)
                previous = row.tcp_m
                travelled += step
        if len(path) < 2:
            raise PlanError(
                FailureCategory.INVALID_ARGUMENT, "the last motion moved less than 2 mm: nothing to reverse"
            )
        end, rotation = self.kin.forward(path[-1])
        description = f"recover: reverse {travelled * 100:.1f} cm of motion {last.motion_id}"
        tcp_path = [self.kin.forward(q)[0] for q in path] if self.approver is not None else ()
        if self._approve(self._target("recover", description, end, rotation, tcp_path)):
            path[0] = self.backend.read_state().q_rad  # from where the arm is after the wait
        plan = self.planner.plan_path(np.array(path), speed_mps=speed)
        self._scene_check(plan, guarded=False)
        outcome = self.executor.execute(
            self.backend,
            plan,
            guarded=False,
            force_limit_n=self.config.safety.force_limit_n,
            stop=self.stop_signal,
            watchdog=self.watchdog,
            on_progress=self.on_progress,
        )
        return self._motion_result(
            "recover", outcome, [f"reversed {travelled * 100:.1f} cm of motion {last.motion_id}"]
        )

    def _recover_vendor(self, fault: str) -> CallResult:
        """`recover` on an arm whose own controller is in an error state (a Franka after a reflex: `fault` says why):
        its vendor's recovery (ArmBackend.recover_vendor) instead of a reversal, which the stopped controller could
        not run. The arm does not move; a second `recover` then reverses the last motion (backs away from what it
        hit). A step that fails is a backend_error naming it; the arm holds."""
        self._physical("recover")
        description = f"recover: the arm's error recovery ({fault}); the arm does not move"
        self._approve(PendingAction("recover", {}, description), shadow=False)
        steps = self.backend.recover_vendor()
        receipt = (
            f"recover: arm error recovery: {'; '.join(steps)}; the arm did not move (recover again to reverse the last "
            "motion)"
        )
        value = {"vendor_recovery": steps, "fault": fault}
        return CallResult.ok("recover", value=value, receipt=receipt, diagnostics={"notes": steps})

    def _release(self, opening_m: Any = None) -> CallResult:
        self._require_gripper("release")
        motion_cfg = self.config.motion
        current = self.backend.read_state(require_force=False).jaw_opening_m
        bound = min(current + motion_cfg.release_max_opening_m, self.profile.max_jaw_opening_m())
        target = bound if opening_m is None else A.number("opening_m", opening_m, lo=0.0, hi=bound)
        if target < current:
            raise A.ArgumentError(f"release opens the jaw: opening_m {target:.3f} is below the current {current:.3f} m")
        self._physical("release")
        return self._jaw("release", target)

    def _jaw(self, capability: str, target_m: float) -> CallResult:
        """Move the jaw to target_m at the gripper speed, then let it settle (closes onto objects)."""
        motion_cfg = self.config.motion
        current = self.backend.read_state(require_force=False).jaw_opening_m
        self._approve(
            PendingAction(
                capability,
                {},
                f"{capability}: jaw {current * 1000:.0f} -> {target_m * 1000:.0f} mm",
                target_jaw_opening_m=round(target_m, 4),
            )
        )
        start = self.backend.read_state(require_force=False)
        before = start.jaw_opening_m
        ramp_s = abs(target_m - self.jaw_command_m) / motion_cfg.gripper_speed_mps
        self.jaw_command_m = self.backend.move_gripper(target_m, ramp_s)
        stopped = None
        while self.backend.read_state(require_force=False).time_s - start.time_s < ramp_s + motion_cfg.gripper_settle_s:
            if self.stop_signal.is_set():
                stopped = self.stop_signal.reason
                self.jaw_command_m = self.backend.hold_gripper()
                break
            self.backend.wait_period()
        end = self.backend.read_state(require_force=False)
        after = end.jaw_opening_m
        holding = target_m < after - 0.002 and after > motion_cfg.grasp_min_width_m
        value = {
            "jaw_before_m": round(before, 4),
            "jaw_after_m": round(after, 4),
            "jaw_command_m": round(target_m, 4),
            "holding_object": holding,
            "tcp_position_m": [round(float(v), 4) for v in self.kin.forward(end.q_rad)[0]],  # where it grasped
        }
        if stopped is not None:
            return CallResult.fail(
                capability,
                FailureCategory.CANCELED if stopped == StopReason.CANCELED else FailureCategory.SAFETY_STOP,
                f"jaw motion stopped: {stopped.value}",
                executed=True,
                value=value,
            )
        verb = "closed" if target_m < before else "opened"
        grasp = f", holding an object {after * 1000:.0f} mm wide" if holding else ""
        receipt = (
            f"{capability}: jaw {verb} {before * 1000:.0f}->{after * 1000:.0f} mm "
            f"(command {target_m * 1000:.0f} mm){grasp}"
        )
        return CallResult.ok(capability, value=value, receipt=receipt, executed=True)

    def _motion_result(
        self, capability: str, outcome: MotionOutcome, notes: list[str], target: np.ndarray | None = None
    ) -> CallResult:
        motion_id = len(self.motions) + 1
        self.motions.append(MotionRecord(motion_id, capability, outcome))
        value = {
            "motion_id": motion_id,
            "stop_reason": outcome.stop_reason.value,
            "executed_distance_m": round(outcome.executed_distance_m, 4),
            "peak_force_n": round(outcome.peak_force_n, 2),
            "jaw_before_m": round(outcome.jaw_before_m, 4),
            "jaw_after_m": round(outcome.jaw_after_m, 4),
            "tcp_position_m": [round(float(v), 4) for v in outcome.end_tcp_m],
            "duration_s": round(outcome.duration_s, 3),
        }
        if outcome.speed_scaling_range != (1.0, 1.0):  # an arm slowed from its pendant (UR's speed slider)
            value["speed_scaling_range"] = [round(float(v), 3) for v in outcome.speed_scaling_range]
        if target is not None:
            value["distance_to_target_m"] = round(float(np.linalg.norm(target - outcome.end_tcp_m)), 4)
        receipt = (
            f"{capability}: {outcome.stop_reason.value} after {outcome.executed_distance_m * 100:.1f} cm, "
            f"peak {outcome.peak_force_n:.1f} N, jaw {outcome.jaw_before_m * 1000:.0f}->"
            f"{outcome.jaw_after_m * 1000:.0f} mm" + (f"; {'; '.join(notes)}" if notes else "")
        )
        executed = outcome.executed_distance_m > 1e-4 or bool(outcome.trace)
        if outcome.category is FailureCategory.NONE:
            return CallResult.ok(
                capability, value=value, receipt=receipt, executed=executed, diagnostics={"notes": notes}
            )
        return CallResult.fail(
            capability,
            outcome.category,
            outcome.message,
            value=value,
            receipt=receipt,
            executed=executed,
            diagnostics={"notes": notes},
        )

    # ------------------------------------------------------------------------------ read-only planning
    def _plan_for(self, pose: Any, speed_mps: Any, duration_s: Any):
        safety = self.config.safety
        position, rotation = A.pose("pose", pose)
        speed = None if speed_mps is None else A.number("speed_mps", speed_mps, lo=1e-3, hi=safety.max_tcp_speed_mps)
        duration = None if duration_s is None else A.number("duration_s", duration_s, lo=0.0, hi=60.0)
        state = self.backend.read_state(require_force=False)
        return self.planner.plan_pose(
            state.q_rad, position, rotation, speed_mps=speed, duration_s=duration, jaw_opening_m=state.jaw_opening_m
        )

    def _check_motion(self, pose: Any = None, speed_mps: Any = None, duration_s: Any = None) -> CallResult:
        if pose is None:
            raise A.ArgumentError("check_motion needs pose=...; " + A.POSE_HELP)
        try:
            plan = self._plan_for(pose, speed_mps, duration_s)
        except PlanError as exc:
            value = {"feasible": False, "failure_category": exc.category.value, "reason": str(exc)}
            return CallResult.ok(
                "check_motion", value=value, receipt=f"check_motion: NOT feasible ({exc.category.value}): {exc}"
            )
        fingertips = plan.tcp_waypoints[:, 2] - self.profile.gripper_geometry.fingertips_below_tcp_m
        lowest = float(fingertips.min())
        clear = lowest >= self.config.motion.surface_clearance_m
        value = {
            "feasible": clear,
            "reason": "" if clear else f"the fingertips would go {abs(lowest) * 100:.1f} cm below the table top",
            "lowest_fingertip_z_m": round(lowest, 4),
            "distance_m": round(plan.distance_m, 4),
            "duration_s": round(plan.duration_s, 3),
            "self_collision": False,
            "ik": "ok",
        }
        receipt = (
            f"check_motion: {'feasible' if clear else 'NOT feasible (surface)'}, {plan.distance_m * 100:.1f} cm, "
            f"{plan.duration_s:.1f} s, lowest fingertip {lowest * 100:.1f} cm"
        )
        return CallResult.ok("check_motion", value=value, receipt=receipt)

    def _preview_motion(self, pose: Any = None, speed_mps: Any = None, duration_s: Any = None) -> CallResult:
        if pose is None:
            raise A.ArgumentError("preview_motion needs pose=...; " + A.POSE_HELP)
        plan = self._plan_for(pose, speed_mps, duration_s)
        joint_travel = np.abs(plan.q_waypoints[-1] - plan.q_waypoints[0])
        value = {
            "duration_s": round(plan.duration_s, 3),
            "distance_m": round(plan.distance_m, 4),
            "rotation_deg": round(math.degrees(plan.rotation_rad), 2),
            "peak_speed_mps": round(plan.peak_speed_mps, 4),
            "max_joint_travel_rad": round(float(joint_travel.max()), 4),
            "notes": plan.notes,
        }
        receipt = (
            f"preview_motion: {plan.distance_m * 100:.1f} cm and {math.degrees(plan.rotation_rad):.0f} deg "
            f"in {plan.duration_s:.2f} s, peak {plan.peak_speed_mps:.3f} m/s"
        )
        return CallResult.ok("preview_motion", value=value, receipt=receipt)

    # ------------------------------------------------------------------------------ state
    def _get_robot_state(self) -> CallResult:
        state = self.backend.read_state()
        position, rotation = self.kin.forward(state.q_rad)
        value = {
            "tcp_pose": A.pose_dict(position, rotation),
            "q_rad": [round(float(v), 5) for v in state.q_rad],
            "jaw_opening_m": round(state.jaw_opening_m, 4),
            "wrist_force_n": [round(float(v), 3) for v in state.force_n],
            "wrist_torque_nm": [round(float(v), 4) for v in state.torque_nm],
            "stopped": self.stopped,
        }
        p = value["tcp_pose"]
        receipt = (
            f"get_robot_state: tcp ({p['position'][0]:.3f}, {p['position'][1]:.3f}, {p['position'][2]:.3f}) m, "
            f"yaw {p['yaw_deg']:.0f} deg, jaw {state.jaw_opening_m * 1000:.0f} mm, "
            f"|F| {np.linalg.norm(state.force_n):.1f} N"
        )
        fault = self.backend.vendor_fault()
        if fault:  # the arm's own controller says it cannot move (a Franka's robot mode): `recover` clears it
            value["arm_fault"] = fault
            receipt = _with_tail(receipt, f"; arm fault: {fault}")
        return CallResult.ok("get_robot_state", value=value, receipt=receipt)

    def _gripper_state(self) -> CallResult:
        self._require_gripper("gripper_state")
        opening = self.backend.read_state(require_force=False).jaw_opening_m
        holding = self.jaw_command_m < opening - 0.002 and opening > self.config.motion.grasp_min_width_m
        value = {
            "opening_m": round(opening, 4),
            "command_m": round(self.jaw_command_m, 4),
            "max_opening_m": self.profile.max_jaw_opening_m(),
            "holding_object": holding,
        }
        receipt = f"gripper_state: {opening * 1000:.0f} mm open (command {self.jaw_command_m * 1000:.0f} mm)" + (
            ", holding an object" if holding else ""
        )
        return CallResult.ok("gripper_state", value=value, receipt=receipt)

    def _robot_geometry(self) -> CallResult:
        self._require_gripper("robot_geometry")
        s, g = self.config.safety, self.profile.gripper_geometry
        value = {
            "base_frame": self.profile.base_frame,
            "tcp_frame": self.profile.tcp_frame,
            "tcp_from_flange_m": g.tcp_from_flange_m,
            "fingertips_below_tcp_m": round(g.fingertips_below_tcp_m, 4),
            "finger_pad_size_m": list(g.finger_pad_size_m),
            "max_jaw_opening_m": self.profile.max_jaw_opening_m(),
            "jaw_axis": "TCP y",
            "approach_axis": "TCP z (fingers point along +z)",
            "workspace_min_m": list(s.workspace_min_m),
            "workspace_max_m": list(s.workspace_max_m),
            "max_tcp_speed_mps": s.max_tcp_speed_mps,
            "force_limit_n": s.force_limit_n,
            "contact_threshold_n": s.contact_threshold_n,
        }
        receipt = (
            f"robot_geometry: jaw 0-{self.profile.max_jaw_opening_m() * 1000:.0f} mm along TCP y, fingertips "
            f"{g.fingertips_below_tcp_m * 1000:.0f} mm past the TCP, "
            f"workspace {list(s.workspace_min_m)}..{list(s.workspace_max_m)} m"
        )
        return CallResult.ok("robot_geometry", value=value, receipt=receipt)

    def _read_motion_trajectory(self, motion_id: Any = None, page: Any = 0) -> CallResult:
        if not self.motions:
            raise A.ArgumentError("no motion has been executed in this episode")
        n = len(self.motions)
        mid = n if motion_id is None else A.integer("motion_id", motion_id, lo=1, hi=n)
        trace = self.motions[mid - 1].outcome.trace
        size = self.config.motion.trace_page_size
        pages = max(1, math.ceil(len(trace) / size))
        p = A.integer("page", page, lo=0, hi=pages - 1)
        rows = trace[p * size : (p + 1) * size]
        value = {
            "motion_id": mid,
            "page": p,
            "pages": pages,
            "rows": [
                {
                    "t_s": round(r.t_s, 4),
                    "tcp_m": [round(float(v), 4) for v in r.tcp_m],
                    "contact_force_n": round(r.contact_force_n, 2),
                    "jaw_m": round(r.jaw_opening_m, 4),
                    "q_rad": [round(float(v), 4) for v in r.q_rad],
                }
                for r in rows
            ],
        }
        receipt = f"read_motion_trajectory: motion {mid} page {p + 1}/{pages}, {len(rows)} of {len(trace)} samples"
        return CallResult.ok("read_motion_trajectory", value=value, receipt=receipt)

    def _frame_pose(self, frame: str) -> tuple[np.ndarray, np.ndarray]:
        name = self.frames[A.choice("frame", frame, tuple(self.frames))]
        if name == self.profile.base_frame:
            return np.zeros(3), np.eye(3)
        if name not in self.kin.links:  # a camera placed by /tf only (a real arm's calibration): not in the URDF
            raise PlanError(
                FailureCategory.UNSUPPORTED,
                f"frame '{frame}' is '{name}', which is not a link of the arm's URDF (only /tf knows it): "
                "transform_pose cannot place it; perception's results are already in the base frame",
            )
        return self.kin.forward(self.backend.read_state(require_force=False).q_rad, name)

    def _transform_pose(
        self, pose: Any = None, from_frame: str = "base", to_frame: str = "base", offset_m: Any = None
    ) -> CallResult:
        if pose is None:
            raise A.ArgumentError("transform_pose needs pose=...; " + A.POSE_HELP)
        position, rotation = A.pose("pose", pose)
        A.choice("from_frame", from_frame, tuple(self.frames))
        A.choice("to_frame", to_frame, tuple(self.frames))
        if offset_m is not None:  # a translation in the pose's own frame (e.g. 5 cm along the approach axis)
            position = position + rotation @ A.vector("offset_m", offset_m, 3)
        pa, ra = self._frame_pose(from_frame)
        pb, rb = self._frame_pose(to_frame)
        world_p, world_r = pa + ra @ position, ra @ rotation
        out_p, out_r = rb.T @ (world_p - pb), rb.T @ world_r
        value = {"pose": A.pose_dict(out_p, out_r), "frame": to_frame}
        receipt = f"transform_pose: {from_frame} -> {to_frame}: ({out_p[0]:.3f}, {out_p[1]:.3f}, {out_p[2]:.3f}) m"
        return CallResult.ok("transform_pose", value=value, receipt=receipt)

    # ------------------------------------------------------------------------------ finish and the gate
    def _finish(self, note: Any = "") -> CallResult:
        if not isinstance(note, str):
            raise A.ArgumentError(f"note must be a string, got {type(note).__name__}")
        reasons = self.gate_objections()
        if reasons and self.log.finish_rejections < self.config.gate.max_rejections:
            self.log.finish_rejections += 1
            left = self.config.gate.max_rejections - self.log.finish_rejections
            return CallResult.fail(
                "finish",
                FailureCategory.GATE_REJECTED,
                "finish rejected: " + "; ".join(reasons) + f" ({left} rejection(s) left)",
                value={"reasons": reasons},
            )
        self.log.finished = True
        return CallResult.ok(
            "finish",
            value={"accepted": True, "note": note[:500]},
            receipt="finish: accepted; the host scores the final scene",
        )

    def gate_objections(self) -> list[str]:
        """Objections from the agent's own record: never from simulator state."""
        calls = self.log.calls
        physical = [i for i, (name, _) in enumerate(calls) if _is_physical(name)]
        reasons = []
        if not physical:
            reasons.append("no physical action was executed in this episode")
            return reasons
        last = physical[-1]
        checked = any(name in VERIFYING and ok for name, ok in calls[last + 1 :])
        if not calls[last][1]:
            since = "" if checked else " and nothing was re-checked since"
            reasons.append(f"the last physical action ({calls[last][0]}) failed{since}")
        if not checked:
            reasons.append("no observation or measurement after the last physical action: verify the scene first")
        opening = self.backend.read_state(require_force=False).jaw_opening_m
        if self.jaw_command_m < opening - 0.002 and opening > self.config.motion.grasp_min_width_m:
            reasons.append("the gripper is still holding an object")
        return reasons

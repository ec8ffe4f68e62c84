"""Straight Cartesian sweeps: planning (IK along the line, reachability, self-collision, workspace,
speed limits) and guarded execution with per-control-period force monitoring.

Force monitoring compares the wrist force with the baseline measured just before the motion,
rotated with the hand, so a payload's weight and the hand's own weight are not mistaken for
contact when the hand turns. Before each motion the arm's own force reflex (where the backend can
set it) is set to what this monitor would stop at: the contact threshold for guarded motions, the
force limit otherwise. The reflex stops the arm in its own control loop, whatever this process is
doing; this monitor is the second layer.

Every stop this monitor commands (contact, force limit, cancel, the stop service, the watchdog, a pause that
lasts too long) is the backend's ramped stop: from the next control period on the arm decelerates within
`stop_decel_radps2` to rest, and the executor rides the ramp out before it reports where the arm ended.

Progress is measured on the trajectory's own time as the backend reports it (`ArmBackend.trajectory_time_s`):
an arm with speed scaling (UR's pendant slider) runs the sweep at that fraction of the clock, so at 30 % it takes
1/0.3 as long and is neither "stalled" nor timed out for it. At scaling 0 (paused on the pendant) the sweep
waits; a pause longer than `settle_timeout_s` (the slack a motion already has to settle) ends the motion with a
clear message and a ramped stop, which the arm completes when it is resumed. The receipt says the scaling.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import mujoco
import numpy as np
from scipy.interpolate import CubicSpline

from captain_ros.core.config import HarnessConfig
from captain_ros.core.contract import CallFailure, FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.trajectory import REST_RADPS, JointTrajectory
from captain_ros.core.wrench import external_force_n
from captain_ros.harness.backend import ArmBackend, ArmReflexStop, ArmState, BackendError

MIN_JERK_PEAK = 1.875  # peak / mean speed of a minimum-jerk profile
FOREIGN_MOTION_RAD = 0.05  # setpoint-to-measured gap above which the arm was moved by someone else
PAUSED_SCALING = 1e-3  # speed scaling at or below this: the arm's controller is paused
SETTLED_RADPS = 0.01  # measured joint speeds below this on every joint: the arm has come to rest


class StopReason(StrEnum):
    TARGET_REACHED = "target_reached"
    CONTACT = "contact"
    FORCE_LIMIT = "force_limit"
    CANCELED = "canceled"
    SAFETY_STOP = "safety_stop"
    WATCHDOG = "watchdog"
    STALLED = "stalled"
    BACKEND_ERROR = "backend_error"


STOP_CATEGORY = {
    StopReason.TARGET_REACHED: FailureCategory.NONE,
    StopReason.CONTACT: FailureCategory.CONTACT_STOP,
    StopReason.FORCE_LIMIT: FailureCategory.FORCE_LIMIT,
    StopReason.CANCELED: FailureCategory.CANCELED,
    StopReason.SAFETY_STOP: FailureCategory.SAFETY_STOP,
    StopReason.WATCHDOG: FailureCategory.SAFETY_STOP,
    StopReason.STALLED: FailureCategory.TIMEOUT,
    StopReason.BACKEND_ERROR: FailureCategory.BACKEND_ERROR,
}


class PlanError(CallFailure):
    """The motion cannot be executed; nothing moved."""


class StopSignal:
    """Thread-safe stop request (action cancel or the stop service), checked every control period."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = StopReason.CANCELED
        self.requested_at_s = math.nan

    def request(self, reason: StopReason = StopReason.CANCELED) -> None:
        self.reason = reason
        self.requested_at_s = time.monotonic()
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()


class Watchdog:
    """Expires when nobody has fed it for `timeout_s` (the agent or the command link went silent)."""

    def __init__(self, timeout_s: float, clock=time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._last = clock()

    def feed(self) -> None:
        self._last = self._clock()

    def silent_for_s(self) -> float:
        return self._clock() - self._last

    def expired(self) -> bool:
        return self.silent_for_s() > self.timeout_s


@dataclass
class SweepPlan:
    q_waypoints: np.ndarray  # (M, n) arm joints
    tcp_waypoints: np.ndarray  # (M, 3)
    duration_s: float
    distance_m: float
    rotation_rad: float
    peak_speed_mps: float
    notes: list[str] = field(default_factory=list)

    @cached_property
    def _path(self) -> CubicSpline | None:
        """The joint path through the waypoints as a cubic spline over the waypoint index: continuous in velocity and
        acceleration. Straight segments between waypoints would turn the joints' direction at every waypoint (and
        zigzag with the IK solutions' millirad scatter): a kink the controller follows with a spike of acceleration,
        which a wrist force sensor reads as a contact (LIBERO's arm read 3.7 N mid-transit)."""
        q = self.q_waypoints
        return CubicSpline(np.arange(len(q)), q, axis=0) if len(q) > 1 else None

    def setpoints(self, t_s: np.ndarray) -> np.ndarray:
        """Joint setpoints (len(t_s), n) at times `t_s` along a minimum-jerk profile over the waypoint path."""
        q = self.q_waypoints
        if self._path is None:
            return np.repeat(q[:1], len(t_s), axis=0)
        tau = np.clip(t_s / self.duration_s, 0.0, 1.0) if self.duration_s > 0 else np.ones(len(t_s))
        return self._path(tau**3 * (10 - 15 * tau + 6 * tau**2) * (len(q) - 1))

    def to_trajectory(self, spacing_s: float, joint_names: tuple[str, ...]) -> JointTrajectory:
        """The sweep as the controller takes it: minimum-jerk samples every `spacing_s` with their
        velocities (the controller interpolates cubically between them)."""
        n = max(1, math.ceil(self.duration_s / spacing_s))
        times = np.linspace(self.duration_s / n, self.duration_s, n) if self.duration_s > 0 else np.array([spacing_s])
        h = 1e-4
        positions = self.setpoints(times)
        velocities = (self.setpoints(times + h) - self.setpoints(times - h)) / (2 * h)
        velocities[-1] = 0.0  # a minimum-jerk profile ends at rest (the difference quotient leaves a residue)
        return JointTrajectory(joint_names, times, positions, velocities)


@dataclass
class TraceRow:
    t_s: float
    q_rad: np.ndarray
    q_cmd_rad: np.ndarray
    tcp_m: np.ndarray
    contact_force_n: float
    jaw_opening_m: float


@dataclass(frozen=True)
class MotionProgress:
    """Reported every control period while a motion runs (the MoveTo action's feedback)."""

    executed_distance_m: float
    remaining_distance_m: float
    current_force_n: float
    peak_force_n: float
    jaw_opening_m: float
    progress: float  # 0..1 of the planned duration


@dataclass
class MotionOutcome:
    stop_reason: StopReason
    message: str
    start_tcp_m: np.ndarray
    end_tcp_m: np.ndarray
    peak_force_n: float
    jaw_before_m: float
    jaw_after_m: float
    trace: list[TraceRow]
    duration_s: float
    stop_latency_periods: int | None = None  # control periods from a stop request to the start of the stop ramp
    speed_scaling_range: tuple[float, float] = (1.0, 1.0)  # lowest and highest speed scaling during the motion

    @property
    def executed_distance_m(self) -> float:
        return float(np.linalg.norm(self.end_tcp_m - self.start_tcp_m))

    @property
    def category(self) -> FailureCategory:
        return STOP_CATEGORY[self.stop_reason]


def _angle_between(r0: np.ndarray, r1: np.ndarray) -> float:
    return float(math.acos(np.clip((np.trace(r0.T @ r1) - 1) / 2, -1.0, 1.0)))


def _slerp(r0: np.ndarray, r1: np.ndarray, s: float) -> np.ndarray:
    q0, q1, out = np.zeros(4), np.zeros(4), np.zeros(4)
    mujoco.mju_mat2Quat(q0, r0.ravel())
    mujoco.mju_mat2Quat(q1, r1.ravel())
    if np.dot(q0, q1) < 0:
        q1 = -q1
    angle = math.acos(np.clip(np.dot(q0, q1), -1.0, 1.0))
    if angle < 1e-9:
        out[:] = q0
    else:
        out[:] = (math.sin((1 - s) * angle) * q0 + math.sin(s * angle) * q1) / math.sin(angle)
    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, out / np.linalg.norm(out))
    return mat.reshape(3, 3)


class Planner:
    def __init__(self, config: HarnessConfig, kinematics: Kinematics | None = None):
        self.config = config
        self.kin = kinematics or Kinematics()

    def plan_pose(
        self,
        q_start: np.ndarray,
        position_m: np.ndarray,
        rotation: np.ndarray,
        *,
        speed_mps: float | None = None,
        duration_s: float | None = None,
        jaw_opening_m: float | None = None,
    ) -> SweepPlan:
        """IK along the straight line from the current TCP pose to the target; raises PlanError. Self-collisions
        are checked with the jaw at `jaw_opening_m` (default: fully open)."""
        safety, motion = self.config.safety, self.config.motion
        if not safety.inside_workspace(position_m):
            raise PlanError(
                FailureCategory.WORKSPACE_LIMIT,
                f"target {np.round(position_m, 3).tolist()} m is outside the workspace box "
                f"{list(safety.workspace_min_m)}..{list(safety.workspace_max_m)}",
            )
        p0, r0 = self.kin.forward(q_start)
        distance = float(np.linalg.norm(position_m - p0))
        angle = _angle_between(r0, rotation)
        n = max(1, math.ceil(distance / motion.waypoint_spacing_m), math.ceil(angle / motion.max_rotation_step_rad))
        qs, tcps = [np.asarray(q_start, dtype=float)], [p0]
        q = qs[0]
        for k in range(1, n + 1):
            s = k / n
            p = p0 + s * (position_m - p0)
            r = _slerp(r0, rotation, s)
            res = self.kin.solve(p, r, q)
            if not res.converged:
                where = "the target" if k == n else f"{100 * s:.0f}% of the sweep"
                raise PlanError(
                    FailureCategory.UNREACHABLE,
                    f"no IK solution at {where} ({np.round(p, 3).tolist()} m): position error "
                    f"{res.position_error_m * 1000:.1f} mm, rotation error "
                    f"{math.degrees(res.rotation_error_rad):.1f} deg",
                )
            if np.abs(res.q_rad - q).max() > 0.5:
                raise PlanError(
                    FailureCategory.UNREACHABLE,
                    f"the straight sweep needs a joint flip near {np.round(p, 3).tolist()} m "
                    "(choose another orientation or an intermediate pose)",
                )
            collisions = self.kin.self_collisions(res.q_rad, jaw_opening_m)
            if collisions:
                raise PlanError(
                    FailureCategory.SELF_COLLISION,
                    f"self-collision {collisions[0][0]}/{collisions[0][1]} at {100 * s:.0f}% of the sweep",
                )
            q = res.q_rad
            qs.append(q)
            tcps.append(p)
        return self._timed(
            qs=np.array(qs),
            tcps=np.array(tcps),
            distance=distance,
            angle=angle,
            speed_mps=speed_mps,
            duration_s=duration_s,
        )

    def plan_path(self, q_path: np.ndarray, *, speed_mps: float | None = None) -> SweepPlan:
        """Time a joint path (e.g. the reverse of an executed trace) within the speed limits."""
        tcps = np.array([self.kin.forward(q)[0] for q in q_path])
        distance = float(np.sum(np.linalg.norm(np.diff(tcps, axis=0), axis=1))) if len(tcps) > 1 else 0.0
        return self._timed(
            qs=np.asarray(q_path, dtype=float),
            tcps=tcps,
            distance=distance,
            angle=0.0,
            speed_mps=speed_mps,
            duration_s=None,
        )

    def _timed(
        self,
        *,
        qs: np.ndarray,
        tcps: np.ndarray,
        distance: float,
        angle: float,
        speed_mps: float | None,
        duration_s: float | None,
    ) -> SweepPlan:
        safety = self.config.safety
        notes = []
        speed = safety.default_tcp_speed_mps if speed_mps is None else speed_mps
        if speed > safety.max_tcp_speed_mps:
            notes.append(f"speed clipped to the limit {safety.max_tcp_speed_mps} m/s")
            speed = safety.max_tcp_speed_mps
        joint_travel = float(np.abs(np.diff(qs, axis=0)).sum(axis=0).max()) if len(qs) > 1 else 0.0
        needed = max(
            MIN_JERK_PEAK * distance / speed,
            MIN_JERK_PEAK * joint_travel / safety.max_joint_speed_radps,
            MIN_JERK_PEAK * angle / 1.0,
        )
        duration = needed
        if duration_s is not None:
            if duration_s < needed:
                notes.append(f"duration raised from {duration_s:.2f} s to {needed:.2f} s by the speed limits")
            duration = max(duration_s, needed)
        duration = max(duration, 2 * safety.control_period_s) if distance or joint_travel else 0.0
        peak = MIN_JERK_PEAK * distance / duration if duration else 0.0
        return SweepPlan(qs, tcps, duration, distance, angle, peak, notes)


_DONE = "done"


@dataclass
class _SweepClock:
    """A running sweep's progress on the trajectory's own time (`ArmBackend.trajectory_time_s`), and when it has
    taken too long: settle_timeout_s after the sweep's end without reaching the target, or that long paused (speed
    scaling 0) before it. A hold (no travel) runs on the arm's clock: a paused arm holds as well."""

    plan: SweepPlan
    settle_timeout_s: float
    last_s: float  # arm time of the last tick
    scalings: list[float]
    tau_s: float = 0.0
    ended_at_s: float | None = None  # arm time at which the sweep's time ran out
    paused_s: float = 0.0
    now_s: float = 0.0

    def __post_init__(self) -> None:
        self.start_s = self.last_s
        self.stationary = self.plan.distance_m == 0 and not np.any(np.diff(self.plan.q_waypoints, axis=0))

    def tick(self, time_s: float, trajectory_time_s: float | None, scaling: float) -> None:
        dt, self.last_s, self.now_s = time_s - self.last_s, time_s, time_s
        self.scalings.append(scaling)
        self.tau_s = time_s - self.start_s if trajectory_time_s is None or self.stationary else trajectory_time_s
        paused = scaling <= PAUSED_SCALING and not self.stationary
        self.paused_s = self.paused_s + dt if paused else 0.0
        if self.tau_s >= self.plan.duration_s and self.ended_at_s is None:
            self.ended_at_s = time_s

    @property
    def progress(self) -> float:
        return min(1.0, max(0.0, self.tau_s) / self.plan.duration_s) if self.plan.duration_s > 0 else 1.0

    def verdict(self, miss_m: float, tolerance_m: float) -> str | tuple[StopReason, str] | None:
        """_DONE (at the target after the sweep), a reason to stop with its message, or None (carry on)."""
        if self.ended_at_s is not None:
            if miss_m <= tolerance_m:
                return _DONE
            if self.now_s - self.ended_at_s >= self.settle_timeout_s:
                return StopReason.STALLED, (
                    f"did not reach the target within {self.settle_timeout_s:.1f} s after the sweep "
                    f"({miss_m * 1000:.0f} mm short)"
                )
            return None
        if self.paused_s > self.settle_timeout_s:
            return StopReason.STALLED, (
                f"paused: the arm's speed scaling has been 0 for {self.paused_s:.1f} s (paused on the pendant, or a "
                f"protective stop?) at {100 * self.progress:.0f}% of the sweep; the motion ends here and the arm "
                "completes its stop when it is resumed"
            )
        return None


class Executor:
    """Hands a plan to the backend as one trajectory and watches every control period for contact,
    the force limit, cancel, the stop service and the watchdog; any of them holds the arm."""

    def __init__(self, config: HarnessConfig, kinematics: Kinematics | None = None):
        self.config = config
        self.kin = kinematics or Kinematics()
        # shown each plan just before it runs (the motion node draws the planned sweep in rviz); must not raise
        self.on_plan: Callable[[SweepPlan], None] | None = None

    def baseline(self, backend: ArmBackend) -> tuple[np.ndarray, np.ndarray]:
        """Mean wrist force while holding still, and the hand rotation it was measured at. The arm holds
        its current setpoint (re-commanding the measured position would kick the servos and fake a force)
        and is first allowed to come to rest, e.g. after a stop. If the arm is far from that setpoint
        (someone else moved it), it holds where it is instead of going back."""
        commanded, measured = backend.commanded()[0], backend.read_state().q_rad
        if np.abs(commanded - measured).max() <= FOREIGN_MOTION_RAD:
            backend.hold()  # its setpoint: nothing moves at rest, a setpoint still moving is ramped to rest
        else:
            backend.hold(measured)
        deadline = backend.read_state().time_s + self.config.motion.settle_timeout_s
        while (
            float(np.abs(backend.read_state().qd_radps).max()) >= SETTLED_RADPS
            and backend.read_state().time_s < deadline
        ):
            backend.wait_period()
        forces = []
        for _ in range(max(1, self.config.motion.baseline_periods)):
            backend.wait_period()
            state = backend.read_state()
            forces.append(state.force_n)
        return np.mean(forces, axis=0), self.kin.forward(state.q_rad, self.kin.profile.hand_frame)[1]

    def contact_force(self, state: ArmState, f0: np.ndarray, r0: np.ndarray) -> float:
        return external_force_n(state.force_n, self.kin.forward(state.q_rad, self.kin.profile.hand_frame)[1], f0, r0)

    def execute(
        self,
        backend: ArmBackend,
        plan: SweepPlan,
        *,
        guarded: bool,
        force_limit_n: float,
        stop: StopSignal,
        watchdog: Watchdog | None = None,
        on_progress: Callable[[MotionProgress], None] | None = None,
    ) -> MotionOutcome:
        """Run `plan` with the arm's reflex lowered to this motion's stop force, then restore the arm's idle
        reflex (config: arm_reflex_force_n), so a grasp or a wait after a guarded motion cannot trip it."""
        if self.on_plan is not None:
            self.on_plan(plan)
        try:
            return self._execute(
                backend,
                plan,
                guarded=guarded,
                force_limit_n=force_limit_n,
                stop=stop,
                watchdog=watchdog,
                on_progress=on_progress,
            )
        finally:
            try:
                backend.set_force_reflex(self.config.safety.arm_reflex_force_n)
            except BackendError:
                pass  # the arm keeps this motion's threshold; the next motion sets its own or fails clearly

    def _execute(
        self,
        backend: ArmBackend,
        plan: SweepPlan,
        *,
        guarded: bool,
        force_limit_n: float,
        stop: StopSignal,
        watchdog: Watchdog | None,
        on_progress: Callable[[MotionProgress], None] | None,
    ) -> MotionOutcome:
        safety, motion = self.config.safety, self.config.motion
        try:
            f0, r0 = self.baseline(backend)
            start = backend.read_state()
            backend.set_force_reflex(safety.contact_threshold_n if guarded else force_limit_n)
        except BackendError as exc:
            return self._error(exc)
        start_tcp = self.kin.forward(start.q_rad)[0]
        trace: list[TraceRow] = []
        peak = 0.0
        reason, message = StopReason.TARGET_REACHED, "reached the target"
        latency = None
        state = start
        target_tcp = plan.tcp_waypoints[-1]
        t0 = start.time_s
        try:
            backend.follow(plan.to_trajectory(motion.trajectory_spacing_s, self.kin.profile.arm_joints))
            t0 = backend.read_state().time_s  # the controller starts the trajectory on receipt
            clock = _SweepClock(plan, motion.settle_timeout_s, t0, [backend.speed_scaling()])
            while True:
                if stop.is_set():
                    backend.hold()
                    reason, message, latency = stop.reason, f"stopped: {stop.reason.value} requested", 1
                    break
                if watchdog is not None and watchdog.expired():
                    backend.hold()
                    reason = StopReason.WATCHDOG
                    message = f"watchdog: no heartbeat for {watchdog.silent_for_s():.1f} s; holding"
                    break
                try:
                    backend.wait_period()
                except ArmReflexStop as exc:  # the arm stopped itself, within its own control period
                    peak = max(peak, exc.force_n)
                    backend.hold()  # nothing is sent: the arm already holds where its reflex stopped it
                    reason = StopReason.CONTACT if guarded else StopReason.FORCE_LIMIT
                    message = f"{'contact' if guarded else 'force limit'}: the arm's {exc}"
                    break
                state = backend.read_state()
                clock.tick(state.time_s, backend.trajectory_time_s(), backend.speed_scaling())
                force = self.contact_force(state, f0, r0)
                peak = max(peak, force)
                tcp = self.kin.forward(state.q_rad)[0]
                t = state.time_s - t0
                trace.append(TraceRow(t, state.q_rad, backend.commanded()[0], tcp, force, state.jaw_opening_m))
                if on_progress is not None:
                    on_progress(
                        MotionProgress(
                            float(np.linalg.norm(tcp - start_tcp)),
                            float(np.linalg.norm(target_tcp - tcp)),
                            force,
                            peak,
                            state.jaw_opening_m,
                            clock.progress,
                        )
                    )
                miss_m = float(np.linalg.norm(tcp - target_tcp))
                verdict = self._force_verdict(force, guarded, force_limit_n) or clock.verdict(
                    miss_m, motion.target_tolerance_m
                )
                if verdict == _DONE:
                    break
                if verdict is not None:
                    backend.hold()
                    reason, message = verdict
                    break
            state, peak = self._ride_out_stop(backend, trace, t0=t0, f0=f0, r0=r0, peak=peak)
        except BackendError as exc:
            backend_hold_quietly(backend)
            return self._error(exc, start_tcp, start, trace)
        scaling_range = (float(min(clock.scalings)), float(max(clock.scalings)))
        note = _scaling_note(scaling_range, state.time_s - t0, plan.duration_s)
        if note:
            plan.notes.append(note)  # the move_to receipt lists the plan's notes
            if reason is not StopReason.TARGET_REACHED:
                message = f"{message} ({note})"
        return MotionOutcome(
            reason,
            message,
            start_tcp,
            self.kin.forward(state.q_rad)[0],
            peak,
            start.jaw_opening_m,
            state.jaw_opening_m,
            trace,
            state.time_s - t0,
            latency,
            scaling_range,
        )

    def _force_verdict(self, force: float, guarded: bool, force_limit_n: float) -> tuple[StopReason, str] | None:
        if guarded and force > self.config.safety.contact_threshold_n:
            return StopReason.CONTACT, f"contact: {force:.1f} N above the baseline"
        if force > force_limit_n:
            return StopReason.FORCE_LIMIT, f"force {force:.1f} N exceeded the limit {force_limit_n:.0f} N"
        return None

    def _ride_out_stop(
        self, backend: ArmBackend, trace: list[TraceRow], *, t0: float, f0: np.ndarray, r0: np.ndarray, peak: float
    ) -> tuple[ArmState, float]:
        """After the motion ended (reached, or stopped with a ramp): wait until the setpoint is at rest and the arm
        has followed it there (its servos lag the setpoint), at least one period and at most settle_timeout_s, so
        the reported end state is where the arm stays; the ramp is traced like the sweep. A paused arm (speed
        scaling 0) is not waited for: it does not move, and finishes its ramp when resumed."""
        deadline = backend.read_state().time_s + self.config.motion.settle_timeout_s
        while True:
            try:
                backend.wait_period()
            except ArmReflexStop as exc:  # the stop's own deceleration tripped it: the arm holds either way
                peak = max(peak, exc.force_n)
                return backend.read_state(), peak
            state = backend.read_state()
            force = self.contact_force(state, f0, r0)
            peak = max(peak, force)
            commanded_q, commanded_qd = backend.commanded()
            tcp = self.kin.forward(state.q_rad)[0]
            trace.append(TraceRow(state.time_s - t0, state.q_rad, commanded_q, tcp, force, state.jaw_opening_m))
            at_rest = (
                float(np.abs(commanded_qd).max(initial=0.0)) <= REST_RADPS
                and float(np.abs(state.qd_radps).max(initial=0.0)) < SETTLED_RADPS
            )
            if at_rest or backend.speed_scaling() <= PAUSED_SCALING or state.time_s >= deadline:
                return state, peak

    def _error(self, exc: Exception, start_tcp=None, start: ArmState | None = None, trace=None) -> MotionOutcome:
        tcp = np.zeros(3) if start_tcp is None else start_tcp
        jaw = start.jaw_opening_m if start is not None else math.nan
        return MotionOutcome(
            StopReason.BACKEND_ERROR, f"backend error: {exc}", tcp, tcp, 0.0, jaw, jaw, trace or [], 0.0
        )


def _scaling_note(scaling_range: tuple[float, float], took_s: float, planned_s: float) -> str:
    """What the receipt says about speed scaling: nothing at full speed."""
    low, high = scaling_range
    if low >= 0.995:
        return ""
    pct = f"{100 * low:.0f}%" if high - low < 0.01 else f"{100 * low:.0f}-{100 * high:.0f}%"
    return f"the arm's speed scaling was {pct}: {took_s:.2f} s for a {planned_s:.2f} s sweep"


def backend_hold_quietly(backend: ArmBackend) -> None:
    """After a backend error: try to hold the arm; the original error is what gets reported."""
    try:
        backend.hold()
    except Exception:  # the command path may be gone too: the controller then finishes its last goal
        pass

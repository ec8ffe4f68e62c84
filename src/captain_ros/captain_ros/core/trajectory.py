"""Joint trajectories as ros2_control's joint_trajectory_controller executes them (ROS-free).

A trajectory is validated once (names, shapes, finite values, strictly increasing times,
positions inside the joint limits) and then sampled at any time: cubic Hermite between
points when velocities are given, linear otherwise, starting from the joint state at the
moment it was accepted. After the last point it holds the last position.

`TrajectoryFollower` is the controller itself, modelled: the twin runs it at every physics step;
the ros2_control backend runs a copy to know what the real controller is being told. It runs a trajectory on
a clock of its own that advances at the arm's speed scaling (UR's scaled_joint_trajectory_controller: at 30 %
a sweep takes 1/0.3 as long, at 0 it stands still), so "how far along" is always in the trajectory's own time.

`stop_ramp` is how every stop is commanded: not a jump of the setpoint to rest (a velocity step that real arms'
reflexes reject) but a short constant-deceleration trajectory, within the arm's deceleration limit on every
joint, whose first point is one control period ahead.

`horizon_piece` is how a sweep reaches a real controller: a short stretch of it that ends in such a stop, renewed
while its commander is alive, so an arm whose commander dies stops by itself a bounded time later.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class TrajectoryError(ValueError):
    """The trajectory cannot be executed; the message says why (becomes INVALID_GOAL/INVALID_JOINTS)."""

    def __init__(self, message: str, *, bad_joint_names: bool = False):
        super().__init__(message)
        self.bad_joint_names = bad_joint_names


@dataclass(frozen=True)
class JointTrajectory:
    joint_names: tuple[str, ...]
    times_s: np.ndarray  # (N,) time from start of each point, strictly increasing, > 0 for the first
    positions: np.ndarray  # (N, J)
    velocities: np.ndarray | None  # (N, J) or None

    @classmethod
    def build(
        cls,
        joint_names: Sequence[str],
        times_s: Sequence[float],
        positions: Sequence[Sequence[float]],
        velocities: Sequence[Sequence[float]] | None,
        *,
        controlled: Sequence[str],
        lower: np.ndarray,
        upper: np.ndarray,
    ) -> JointTrajectory:
        """Validate a trajectory for the `controlled` joints and reorder it to their order."""
        names = list(joint_names)
        if len(set(names)) != len(names):
            raise TrajectoryError(f"joint names repeat: {names}", bad_joint_names=True)
        missing, unknown = set(controlled) - set(names), set(names) - set(controlled)
        if unknown:
            raise TrajectoryError(
                f"unknown joints {sorted(unknown)}; this controller drives {list(controlled)}", bad_joint_names=True
            )
        if missing:
            raise TrajectoryError(
                f"joints {sorted(missing)} are missing; goals must command all of {list(controlled)}",
                bad_joint_names=True,
            )
        if len(times_s) == 0:
            raise TrajectoryError("the trajectory has no points")
        times = np.asarray(times_s, dtype=float)
        if not np.all(np.isfinite(times)) or times[0] < 0 or np.any(np.diff(times) <= 0):
            raise TrajectoryError("time_from_start must be finite, non-negative and strictly increasing")
        order = [names.index(j) for j in controlled]
        pos = np.asarray(positions, dtype=float)
        if pos.ndim != 2 or pos.shape != (len(times), len(names)):
            raise TrajectoryError(f"every point needs {len(names)} positions")
        if not np.all(np.isfinite(pos)):
            raise TrajectoryError("positions must be finite (NaN or infinity found)")
        pos = pos[:, order]
        below, above = pos < lower - 1e-9, pos > upper + 1e-9
        if np.any(below | above):
            point, joint = np.argwhere(below | above)[0]
            raise TrajectoryError(
                f"point {point}: {controlled[joint]} = {pos[point, joint]:.4f} is outside its limits "
                f"[{lower[joint]:.4f}, {upper[joint]:.4f}]"
            )
        vel = None
        if velocities is not None and len(velocities) and any(len(v) for v in velocities):
            vel = np.asarray(velocities, dtype=float)
            if vel.shape != pos.shape or not np.all(np.isfinite(vel)):
                raise TrajectoryError("velocities must be finite and given for every joint of every point")
            vel = vel[:, order]
        return cls(tuple(controlled), times, pos, vel)

    @property
    def duration_s(self) -> float:
        return float(self.times_s[-1])

    def sample(
        self, t_s: float, start_q: np.ndarray, start_qd: np.ndarray | None = None, start_at_s: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Desired (position, velocity) at `t_s` of the trajectory's time, starting from `start_q` moving at
        `start_qd` (at rest when None), so streamed trajectories join without a velocity jump. The start state
        sits at `start_at_s`: 0 for a trajectory begun on receipt, earlier for one stamped in the future, later
        for one stamped in the past, which begins part-way along; points at or before it are passed (as
        joint_trajectory_controller does). A controller samples the same start many times: `from_start` once,
        then `_Knots.at` (what this does)."""
        return self.from_start(start_q, start_qd, start_at_s).at(t_s)

    def from_start(self, start_q: np.ndarray, start_qd: np.ndarray | None = None, start_at_s: float = 0.0) -> _Knots:
        """The knots this trajectory is interpolated through from a start state (see `sample`)."""
        before = self.times_s[0] > start_at_s
        times = np.concatenate([[start_at_s], self.times_s]) if before else self.times_s
        pos = np.vstack([start_q, self.positions]) if before else self.positions
        if self.velocities is None:
            vel = None
        else:
            v0 = np.zeros_like(start_q) if start_qd is None else start_qd
            vel = np.vstack([v0, self.velocities]) if before else self.velocities
        return _Knots(times, pos, vel)


class _Knots:
    """A trajectory's points with its start state in front: sampled at every control or physics step. Each segment's
    cubic Hermite (linear without velocities) is turned into power-basis coefficients once, so a sample is one small
    product: [1, s, s^2, s^3] @ C[i] gives the position and the velocity together (s: the fraction of segment i)."""

    def __init__(self, times: np.ndarray, pos: np.ndarray, vel: np.ndarray | None):
        self.times, self.pos, self.vel = times, pos, vel
        self._times = [float(t) for t in times]  # bisect on a list: the per-sample search without numpy's overhead
        n, dof = len(times) - 1, pos.shape[1]
        h = np.diff(times)[:, None]  # (n, 1)
        p0, p1 = pos[:-1], pos[1:]
        coef = np.zeros((n, 4, 2 * dof))
        if vel is None:
            coef[:, 0, :dof], coef[:, 1, :dof] = p0, p1 - p0
            coef[:, 0, dof:] = (p1 - p0) / h
        else:
            m0, m1 = vel[:-1] * h, vel[1:] * h  # tangents in the segment's fraction
            a, b = 2 * (p0 - p1) + m0 + m1, 3 * (p1 - p0) - 2 * m0 - m1  # q = a s^3 + b s^2 + m0 s + p0
            coef[:, 0, :dof], coef[:, 1, :dof], coef[:, 2, :dof], coef[:, 3, :dof] = p0, m0, b, a
            coef[:, 0, dof:], coef[:, 1, dof:], coef[:, 2, dof:] = m0 / h, 2 * b / h, 3 * a / h  # dq/dt
        self._coef, self._dof = coef, dof

    def at(self, t_s: float) -> tuple[np.ndarray, np.ndarray]:
        times = self._times
        t_s = max(t_s, times[0])
        if t_s >= times[-1]:
            return self.pos[-1].copy(), (np.zeros_like(self.pos[-1]) if self.vel is None else self.vel[-1].copy())
        i = bisect.bisect_right(times, t_s) - 1
        s = (t_s - times[i]) / (times[i + 1] - times[i])
        out = np.array((1.0, s, s * s, s * s * s)) @ self._coef[i]
        return out[: self._dof], out[self._dof :]


@dataclass
class _Active:
    trajectory: JointTrajectory
    start_at_s: float  # trajectory time at which the start state sits (> 0: stamped in the past, < 0: future)
    start_q: np.ndarray
    start_qd: np.ndarray
    token: int
    elapsed_s: float  # how far along the trajectory is, in its own time
    clock_s: float  # the clock time elapsed_s was last brought up to
    knots: _Knots | None = None  # the trajectory from its start state, prepared once
    ended: bool = False  # past its last point: the setpoint stays there (updates skip the spline)

    def __post_init__(self) -> None:
        self.knots = self.trajectory.from_start(self.start_q, self.start_qd, self.start_at_s)


class TrajectoryFollower:
    """A joint_trajectory_controller, modelled. `desired_qd` is the velocity along the trajectory's own time (what
    the controller's desired state holds); the arm moves at `speed_scaling` times it."""

    def __init__(self, joint_names: tuple[str, ...], lower: np.ndarray, upper: np.ndarray, initial_q: np.ndarray):
        self.joint_names = joint_names
        self.lower, self.upper = lower, upper
        self._lock = threading.Lock()
        self._active: _Active | None = None
        self._hold_q = np.asarray(initial_q, dtype=float).copy()
        self._next_token = 1
        self._scaling = 1.0
        self.desired_q = self._hold_q.copy()
        self.desired_qd = np.zeros_like(self._hold_q)

    def start(self, trajectory: JointTrajectory, now_s: float, start_time_s: float | None = None) -> int:
        """Begin `trajectory` from the current desired position and velocity (as joint_trajectory_controller
        does); returns a token that identifies it. `start_time_s` is the clock time of the trajectory's time zero
        (its header stamp; None: now). One stamped in the past begins part-way along (as far as the current speed
        scaling would have taken it), so a stop computed at a state's stamp runs as computed however late it
        arrives. One stamped in the future goes from the current desired state at receipt to its first point
        at the stamp plus that point's time_from_start, as joint_trajectory_controller interpolates it. The
        current desired state is the running trajectory's at `now_s` (a state last sampled a step earlier would
        hold the setpoint still for that step: a jolt on every trajectory that takes over a moving one)."""
        with self._lock:
            self._sample(now_s)
            token = self._next_token
            self._next_token += 1
            offset = 0.0 if start_time_s is None else (now_s - start_time_s) * self._scaling
            self._active = _Active(
                trajectory, offset, self.desired_q.copy(), self.desired_qd.copy(), token, offset, now_s
            )
            return token

    def hold(self, q: np.ndarray) -> None:
        """Stop any trajectory and hold `q` at once (a cancel, a reset, the arm's own reflex; stops that the
        client commands are ramps: `stop_ramp`)."""
        with self._lock:
            self._active = None
            self._hold_q = np.clip(np.asarray(q, dtype=float), self.lower, self.upper)
            self.desired_q = self._hold_q.copy()
            self.desired_qd = np.zeros_like(self._hold_q)

    @property
    def speed_scaling(self) -> float:
        with self._lock:
            return self._scaling

    def set_speed_scaling(self, scaling: float, now_s: float) -> None:
        """From `now_s` on, the trajectory's time advances at `scaling` (0..1) times the clock (UR's speed slider
        and hardware scaling); the time up to `now_s` ran at the previous scaling."""
        scaling = float(scaling)
        if not (math.isfinite(scaling) and 0.0 <= scaling <= 1.0):
            raise ValueError(f"speed scaling must be a fraction in [0, 1], got {scaling}")
        with self._lock:
            self._advance(now_s)
            self._scaling = scaling

    def _advance(self, now_s: float) -> None:
        a = self._active
        if a is not None and now_s > a.clock_s:  # an older time (a late message, a reset clock) moves nothing
            a.elapsed_s += (now_s - a.clock_s) * self._scaling
            a.clock_s = now_s

    def active_token(self) -> int | None:
        with self._lock:
            return None if self._active is None else self._active.token

    def elapsed_s(self, token: int | None = None, now_s: float | None = None) -> float | None:
        """How far along (in its own time) the running trajectory is at `now_s` (default: the last update);
        None when none runs, or when `token` was replaced."""
        with self._lock:
            a = self._active
            if a is None or (token is not None and a.token != token):
                return None
            if now_s is not None:
                self._advance(now_s)
            return a.elapsed_s

    def finished(self, token: int, now_s: float) -> bool:
        """Whether trajectory `token` has reached its last point (or was replaced)."""
        with self._lock:
            a = self._active
            if a is None or a.token != token:
                return True
            self._advance(now_s)
            return a.elapsed_s >= a.trajectory.duration_s

    def update(self, now_s: float) -> np.ndarray:
        """Desired position at `now_s` (clipped to the joint limits)."""
        with self._lock:
            self._sample(now_s)
            return self.desired_q.copy()

    def _sample(self, now_s: float) -> None:
        """Bring the desired state up to `now_s` (under the lock)."""
        a = self._active
        if a is None:
            return
        self._advance(now_s)
        if not a.ended:
            q, qd = a.knots.at(a.elapsed_s)
            self.desired_q = np.minimum(np.maximum(q, self.lower), self.upper)  # np.clip, without its overhead
            self.desired_qd = qd
            a.ended = a.elapsed_s >= a.trajectory.duration_s


MAX_RAMP_POINTS = 100  # a longer stop is sampled more sparsely (the cubic interpolation is exact on it anyway)
REST_RADPS = 1e-6  # a setpoint slower than this on every joint is at rest: its stop is one hold point


def stop_ramp(
    joint_names: Sequence[str],
    q_rad: Sequence[float],
    qd_radps: Sequence[float],
    *,
    decel_radps2: float | Sequence[float],
    period_s: float,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
) -> JointTrajectory:
    """The stop of a setpoint at `q_rad` moving at `qd_radps`, as a trajectory its controller can follow.

    Every joint decelerates at a constant rate to rest, all arriving together (time-synchronised, so the path
    keeps its shape: the joint that needs longest sets the time, the others decelerate more gently), never faster
    than `decel_radps2` (one value, or one per joint). The first point is one control period ahead and the stop
    takes a whole number of periods. Points carry exact positions and velocities of that constant deceleration
    (every control period, sparser beyond MAX_RAMP_POINTS): a controller's cubic interpolation reproduces it exactly,
    starting from `q_rad`, `qd_radps` without a velocity step. A setpoint at rest stops with a single hold point.

    The setpoint, not the measured state, is what is ramped: it is what the controller continues from, and a
    command that starts where the last one was is what a real arm's reflexes accept (Franka rejects command
    discontinuities). Positions stay inside [`lower`, `upper`] where given: a joint whose stop would cross its
    limit stops at the limit, as the controller clips it there anyway. Raises TrajectoryError on non-finite or
    mismatched input and on limits or periods that are not positive.
    """
    names = tuple(joint_names)
    q = np.asarray(q_rad, dtype=float)
    qd = np.asarray(qd_radps, dtype=float)
    if q.shape != (len(names),) or qd.shape != (len(names),):
        raise TrajectoryError(
            f"stop ramp: {len(names)} joints need {len(names)} positions and velocities, got {q.shape} and {qd.shape}"
        )
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(qd))):
        raise TrajectoryError(f"stop ramp: positions and velocities must be finite, got {q.tolist()}, {qd.tolist()}")
    try:
        decel = np.broadcast_to(np.asarray(decel_radps2, dtype=float), q.shape)
    except ValueError:
        raise TrajectoryError(
            f"stop ramp: decel_radps2 must be one value or one per joint ({len(names)}), got {decel_radps2!r}"
        ) from None
    if not np.all(np.isfinite(decel) & (decel > 0)):
        raise TrajectoryError(f"stop ramp: decel_radps2 must be finite and > 0 rad/s^2 on every joint, got {decel}")
    if not (math.isfinite(period_s) and period_s > 0):
        raise TrajectoryError(f"stop ramp: the control period must be finite and > 0 s, got {period_s}")
    lo = np.full(q.shape, -np.inf) if lower is None else np.asarray(lower, dtype=float)
    hi = np.full(q.shape, np.inf) if upper is None else np.asarray(upper, dtype=float)
    if np.abs(qd).max(initial=0.0) <= REST_RADPS:
        return JointTrajectory(names, np.array([period_s]), np.clip(q, lo, hi)[None], np.zeros((1, len(names))))
    periods = max(1, math.ceil(float(np.max(np.abs(qd) / decel)) / period_s - 1e-9))
    stop_s = periods * period_s
    if periods <= MAX_RAMP_POINTS:
        t = period_s * np.arange(1, periods + 1)
    else:
        t = np.concatenate([[period_s], np.linspace(period_s, stop_s, MAX_RAMP_POINTS)[1:]])
    t = t[:, None]
    positions = q + qd * t - 0.5 * (qd / stop_s) * t**2
    velocities = qd * (1.0 - t / stop_s)
    velocities[-1] = 0.0
    clipped = (positions < lo) | (positions > hi)
    positions = np.clip(positions, lo, hi)
    velocities[clipped] = 0.0
    return JointTrajectory(names, t[:, 0].copy(), positions, velocities)


@dataclass(frozen=True)
class HorizonPiece:
    trajectory: JointTrajectory  # times from `from_s`: the sweep's points in (from_s, cut_s], then the stop
    cut_s: float  # the sweep's time of its last point in the piece (where the stop begins)
    final: bool  # the piece reaches the sweep's end (which is at rest): no stop is appended


def horizon_piece(
    sweep: JointTrajectory,
    from_s: float,
    horizon_s: float,
    *,
    decel_radps2: float | Sequence[float],
    period_s: float,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
) -> HorizonPiece | None:
    """The stretch of `sweep` a controller is given at `from_s` of the sweep's time: its points after `from_s` up
    to the first one at or past `from_s + horizon_s`, then `stop_ramp` from that point's position and velocity.

    Renewed before the controller reaches the cut (each piece replaces the last from its own start), the arm
    follows the sweep exactly: the pieces are the sweep's own points, so the controller's cubic interpolation
    between them is the sweep's, and a piece that starts part-way into a segment continues it without a step.
    Not renewed, the arm runs at most `horizon_s` (plus one point spacing) further along the sweep and then
    stops within the deceleration limit. None when the sweep has no point after `from_s` (it has ended)."""
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise TrajectoryError(f"horizon_s must be finite and > 0 s, got {horizon_s}")
    if sweep.velocities is None:
        raise TrajectoryError("a horizon piece needs the sweep's velocities (its stop begins at the cut's velocity)")
    times = sweep.times_s
    first = int(np.searchsorted(times, from_s + 1e-9, side="right"))
    if first == len(times):
        return None
    last = max(first, min(int(np.searchsorted(times, from_s + horizon_s - 1e-9)), len(times) - 1))
    piece_t = times[first : last + 1] - from_s
    pos, vel = sweep.positions[first : last + 1], sweep.velocities[first : last + 1]
    if last == len(times) - 1:
        return HorizonPiece(JointTrajectory(sweep.joint_names, piece_t, pos, vel), float(times[last]), True)
    ramp = stop_ramp(
        sweep.joint_names, pos[-1], vel[-1], decel_radps2=decel_radps2, period_s=period_s, lower=lower, upper=upper
    )
    piece = JointTrajectory(
        sweep.joint_names,
        np.concatenate([piece_t, piece_t[-1] + ramp.times_s]),
        np.vstack([pos, ramp.positions]),
        np.vstack([vel, ramp.velocities]),
    )
    return HorizonPiece(piece, float(times[last]), False)


def duration_to_s(sec: int, nanosec: int) -> float:
    value = sec + nanosec * 1e-9
    return value if math.isfinite(value) else math.inf

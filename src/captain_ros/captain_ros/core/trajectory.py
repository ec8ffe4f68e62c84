"""Joint trajectories as ros2_control's joint_trajectory_controller executes them (ROS-free).

A trajectory is validated once (names, shapes, finite values, strictly increasing times,
positions inside the joint limits) and then sampled at any time: cubic Hermite between
points when velocities are given, linear otherwise, starting from the joint state at the
moment it was accepted. After the last point it holds the last position.

`TrajectoryFollower` is the controller itself, modelled: the twin runs it at every physics step;
the ros2_control backend runs a copy to know what the real controller is being told.
"""

from __future__ import annotations

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
        self, t_s: float, start_q: np.ndarray, start_qd: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Desired (position, velocity) at `t_s` after acceptance, starting from `start_q` moving at
        `start_qd` (at rest when None), so streamed trajectories join without a velocity jump."""
        times = np.concatenate([[0.0], self.times_s]) if self.times_s[0] > 0 else self.times_s
        pos = np.vstack([start_q, self.positions]) if self.times_s[0] > 0 else self.positions
        if self.velocities is None:
            vel = None
        else:
            v0 = np.zeros_like(start_q) if start_qd is None else start_qd
            vel = np.vstack([v0, self.velocities]) if self.times_s[0] > 0 else self.velocities
        if t_s >= times[-1]:
            return pos[-1].copy(), (np.zeros_like(pos[-1]) if vel is None else vel[-1].copy())
        t_s = max(t_s, 0.0)
        i = int(np.searchsorted(times, t_s, side="right") - 1)
        h = times[i + 1] - times[i]
        s = (t_s - times[i]) / h
        if vel is None:
            return pos[i] + s * (pos[i + 1] - pos[i]), (pos[i + 1] - pos[i]) / h
        h00, h10, h01, h11 = 2 * s**3 - 3 * s**2 + 1, s**3 - 2 * s**2 + s, -2 * s**3 + 3 * s**2, s**3 - s**2
        q = h00 * pos[i] + h10 * h * vel[i] + h01 * pos[i + 1] + h11 * h * vel[i + 1]
        d00, d10, d01, d11 = 6 * s**2 - 6 * s, 3 * s**2 - 4 * s + 1, -6 * s**2 + 6 * s, 3 * s**2 - 2 * s
        qd = (d00 * pos[i] + d10 * h * vel[i] + d01 * pos[i + 1] + d11 * h * vel[i + 1]) / h
        return q, qd


@dataclass
class _Active:
    trajectory: JointTrajectory
    start_time_s: float
    start_q: np.ndarray
    start_qd: np.ndarray
    token: int


class TrajectoryFollower:
    def __init__(self, joint_names: tuple[str, ...], lower: np.ndarray, upper: np.ndarray, initial_q: np.ndarray):
        self.joint_names = joint_names
        self.lower, self.upper = lower, upper
        self._lock = threading.Lock()
        self._active: _Active | None = None
        self._hold_q = np.asarray(initial_q, dtype=float).copy()
        self._next_token = 1
        self.desired_q = self._hold_q.copy()
        self.desired_qd = np.zeros_like(self._hold_q)

    def start(self, trajectory: JointTrajectory, now_s: float) -> int:
        """Begin `trajectory` from the current desired position and velocity (as joint_trajectory_controller
        does); returns a token that identifies it."""
        with self._lock:
            token = self._next_token
            self._next_token += 1
            self._active = _Active(trajectory, now_s, self.desired_q.copy(), self.desired_qd.copy(), token)
            return token

    def hold(self, q: np.ndarray) -> None:
        """Stop any trajectory and hold `q` (used on cancel and on reset)."""
        with self._lock:
            self._active = None
            self._hold_q = np.clip(np.asarray(q, dtype=float), self.lower, self.upper)
            self.desired_q = self._hold_q.copy()
            self.desired_qd = np.zeros_like(self._hold_q)

    def active_token(self) -> int | None:
        with self._lock:
            return None if self._active is None else self._active.token

    def finished(self, token: int, now_s: float) -> bool:
        """Whether trajectory `token` has reached its last point (or was replaced)."""
        with self._lock:
            a = self._active
            return a is None or a.token != token or now_s - a.start_time_s >= a.trajectory.duration_s

    def update(self, now_s: float) -> np.ndarray:
        """Desired position at `now_s` (clipped to the joint limits)."""
        with self._lock:
            a = self._active
            if a is None:
                return self.desired_q.copy()
            q, qd = a.trajectory.sample(now_s - a.start_time_s, a.start_q, a.start_qd)
            self.desired_q = np.clip(q, self.lower, self.upper)
            self.desired_qd = qd
            return self.desired_q.copy()


def duration_to_s(sec: int, nanosec: int) -> float:
    value = sec + nanosec * 1e-9
    return value if math.isfinite(value) else math.inf

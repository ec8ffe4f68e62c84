"""Joint trajectory following for the twin, as a ros2_control joint_trajectory_controller would do it.

ROS-free: the twin node feeds it accepted trajectories and asks for the command at each
physics step. A new trajectory preempts the running one; `hold` stops at the given position.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from captain_ros.core.trajectory import JointTrajectory


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

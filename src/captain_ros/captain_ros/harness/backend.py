"""One arm backend interface for the twin and the real arm.

The motion executor hands the backend a whole joint trajectory (as a ros2_control
joint_trajectory_controller takes it), then watches the measured state one control period at
a time and stops it with `hold` on contact, force, cancel, the stop service or the watchdog.
A stop is a ramp, not a jump: from the next control period on, every joint decelerates to rest within the
safety config's `stop_decel_radps2` (core.trajectory.stop_ramp); only the arm's own force reflex stops it at once.
The backend reports what the controller is actually being told (`commanded`, after clipping
to the joint limits), so the harness records what the arm was really commanded, and how far along its
trajectory the controller is (`trajectory_time_s`): an arm with speed scaling (UR) runs trajectories slower than
planned, or not at all while paused.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from captain_ros.core.robot import RobotProfile
from captain_ros.core.trajectory import JointTrajectory, TrajectoryError, stop_ramp
from captain_ros.perception.observation import CameraImage


class BackendError(RuntimeError):
    """The backend cannot serve (simulator fault, lost link, driver error): infrastructure, not the task."""


class ArmReflexStop(BackendError):
    """The arm's own force reflex stopped the motion (a task outcome, like the harness's force limit)."""

    def __init__(self, message: str, force_n: float = 0.0):
        super().__init__(message)
        self.force_n = force_n


@dataclass(frozen=True)
class ArmState:
    time_s: float
    q_rad: np.ndarray  # (n,) the profile's arm joints, in its order
    qd_radps: np.ndarray  # (n,)
    jaw_opening_m: float
    force_n: np.ndarray  # (3,) wrist force in the hand frame
    torque_nm: np.ndarray  # (3,)


class ArmBackend(ABC):
    """A serial arm (the joints of its robot profile) with a parallel gripper and a wrist force/torque sensor."""

    name: str = "backend"
    profile: RobotProfile  # the arm this backend drives (set by every backend)
    stop_decel_radps2: float  # the stop ramps' deceleration limit (set by every backend that ramps its stops)

    @property
    @abstractmethod
    def control_period_s(self) -> float:
        """Period at which the state is read and the force is monitored."""

    def _stop_ramp(self, q_rad, qd_radps, lower: np.ndarray, upper: np.ndarray) -> JointTrajectory | None:
        """The stop of a setpoint at `q_rad` moving at `qd_radps` (core.trajectory.stop_ramp at this backend's
        deceleration limit and control period); None for a setpoint gone non-finite, which cannot be ramped (the
        caller holds where the arm is instead)."""
        try:
            return stop_ramp(
                self.profile.arm_joints,
                q_rad,
                qd_radps,
                decel_radps2=self.stop_decel_radps2,
                period_s=self.control_period_s,
                lower=lower,
                upper=upper,
            )
        except TrajectoryError:
            return None

    @abstractmethod
    def read_state(self, require_force: bool = True) -> ArmState:
        """The latest measured state. Raises BackendError when there is none or it is stale, and, unless the
        caller does not use the force (`require_force=False`: its force and torque are then NaN when force
        sensing is unavailable), when the wrench is missing, stale or unusable: force sensing fails closed."""

    @abstractmethod
    def follow(self, trajectory: JointTrajectory) -> None:
        """Start the arm on `trajectory` (the profile's arm joints, times from now), preempting any running one.
        Raises BackendError when the controller refuses it."""

    @abstractmethod
    def hold(self, q_rad: np.ndarray | None = None) -> np.ndarray:
        """Stop. Without `q_rad` (every stop: cancel, contact, force limit, stop service, watchdog, e-stop): the
        setpoint decelerates from the next control period on, within `stop_decel_radps2` on every joint, to rest
        (at once if it is at rest); returns where it comes to rest. After the arm's own reflex stopped it, it
        already holds where it stopped and nothing is sent. With `q_rad`: hold that position from the next period
        on (for an arm at rest whose setpoint must move to where someone else left it). Positions are clipped to
        the joint limits."""

    @abstractmethod
    def commanded(self) -> tuple[np.ndarray, np.ndarray]:
        """The arm setpoint (position, velocity) the controller follows at the latest state's time. The velocity
        is along the trajectory's own time: the arm moves at speed_scaling() times it."""

    def speed_scaling(self) -> float:
        """The fraction of planned speed the arm's trajectory controller runs at now: 1 = as planned, 0 = paused
        (UR: the pendant's speed slider times the hardware's own scaling). Arms without speed scaling run at 1."""
        return 1.0

    def trajectory_time_s(self) -> float | None:
        """How far along the trajectory it follows (the last follow() or stop) the controller is, in the
        trajectory's own time, at the latest state's time (negative before a goal stamped ahead of the clock
        starts); None when this backend cannot tell (the harness then takes the time since follow() on the arm's
        clock).

        Why the backend measures it: with speed scaling the controller advances the trajectory at the scaling
        times the clock, so the planned duration is only meaningful on that scaled time. The backend integrates the
        scaling as the controller does (the twin exactly, the ros2_control backend from the scaling topic, on the
        joint states' stamps), so progress, "done" and "stalled" are judged against the sweep itself, never
        against a wall or arm clock that a slowed or paused arm would overrun."""
        return None

    @abstractmethod
    def move_gripper(self, opening_m: float, duration_s: float) -> float:
        """Move the jaw to `opening_m` in `duration_s` (the gripper's own force limit applies); returns
        the target actually sent after clipping. `hold_gripper` stops it where it is."""

    def hold_gripper(self) -> float:
        return self.move_gripper(self.read_state(require_force=False).jaw_opening_m, 0.0)

    @abstractmethod
    def wait_period(self) -> None:
        """Let one control period pass (simulate it, or wait for it)."""

    def set_force_reflex(self, threshold_n: float) -> bool:
        """Set the arm's own force reflex (the vendor's collision/force threshold, acting in the arm's control
        loop) for the motions that follow; 0 switches it off. Returns False when this arm's reflex cannot be
        set from here (the harness monitor is then the only force stop). Raises BackendError when it can be
        but the arm did not accept it."""
        return False

    def vendor_fault(self, ask_controllers: bool = False) -> str:
        """Why the arm's own controller is in an error state that its vendor's recovery clears ('' = it is not, or
        this arm has no such recovery here): a Franka stopped by a reflex. The policy's `recover` then runs
        `recover_vendor` instead of reversing the last motion. `ask_controllers`: also ask the arm's controller
        manager (a service call; `recover` does, `get_robot_state` does not)."""
        return ""

    def recover_vendor(self) -> list[str]:
        """Run the vendor's recovery (see vendor_fault); returns what was done, step by step. The arm does not
        move. Raises BackendError naming the step that failed."""
        raise BackendError(f"the {self.name} backend has no vendor recovery")

    def capture(self, cameras: tuple[str, ...]) -> dict[str, CameraImage]:
        """Aligned RGB-D images of the named cameras, now. Raises BackendError when there are none."""
        raise BackendError(f"the {self.name} backend has no cameras")

    def resync(self) -> None:  # noqa: B027 - only backends with a world that can be reset need it
        """The world was reset under the backend (a new episode): hold wherever the arm is now."""

    def close(self) -> None:  # noqa: B027 - optional for backends that own nothing
        """Release connections and resources."""

"""The twin's controllers, as ros2_control would run them on the real arm: one joint trajectory
follower for the arm joints and one for the gripper's (first) finger joint (its share of the jaw opening),
updated at every physics step, and the arm's own force reflex. Used by twin_node and by the
in-process twin backend, so both move (and stop) the arm exactly the same way.

The arm's controller honours a speed scaling (UR's scaled_joint_trajectory_controller, driven by the pendant's speed
slider): trajectories advance at that fraction of the clock. A new slider value is approached at
SPEED_SCALING_SLEW_PER_S, as UR's controller ramps the factor (a pause is a smooth stop, not a jump)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from captain_ros.core.trajectory import JointTrajectory, TrajectoryFollower
from captain_ros.core.wrench import REFLEX_ABORT_PREFIX, force_beyond_n
from captain_ros.twin.sim import Twin

SPEED_SCALING_SLEW_PER_S = 2.0  # fraction of full speed per second: a pause from full speed takes 0.5 s


@dataclass(frozen=True)
class ReflexTrip:
    time_s: float
    force_n: float
    threshold_n: float

    @property
    def message(self) -> str:
        return (
            f"{REFLEX_ABORT_PREFIX}: external force {self.force_n:.1f} N over the {self.threshold_n:.1f} N "
            f"threshold at t={self.time_s:.3f} s; the arm holds where it stopped"
        )


class ForceReflex:
    """The arm's force reflex, checked at every physics step inside the controller, as vendors build it
    (Franka's collision thresholds, UR's protective stop): it does not depend on any client keeping up.

    The external force is the wrist force minus the load measured while the arm rested just before the
    current motion began, rotated with the hand (`core.wrench.force_beyond_n`, the harness monitor's
    own measure). Above `threshold_n` the arm stops where it is and stays tripped until the next motion
    arms the reflex again. A threshold of 0 switches the reflex off."""

    def __init__(self, threshold_n: float, baseline_steps: int = 10):
        if not (math.isfinite(threshold_n) and threshold_n >= 0):
            raise ValueError(f"reflex threshold must be a finite force >= 0 N, got {threshold_n}")
        self.threshold_n = threshold_n
        self._recent: deque[tuple[list[float], list[float]]] = deque(maxlen=baseline_steps)  # (force, rotation)
        self._baseline: list[float] | None = None  # the rest load, base frame
        self.tripped: ReflexTrip | None = None
        self.external_force_n = 0.0
        self.peak_force_n = 0.0  # largest external force since the reflex was last armed

    @property
    def armed(self) -> bool:
        """Whether the reflex has its rest load (the first steps after start-up or a reset measure it)."""
        return self._baseline is not None

    def arm(self) -> None:
        """A motion begins: the load is the mean wrist force of the last steps (the arm was at rest)."""
        if self._recent:
            forces = np.mean([f for f, _ in self._recent], axis=0)
            rotation = np.reshape(self._recent[-1][1], (3, 3))
            self._baseline = (rotation @ forces).tolist()  # the load in the base frame: it turns with the hand
        self.tripped, self.peak_force_n = None, 0.0

    def check(self, force_hand_n: list[float], r_hand_rows: list[float], now_s: float) -> ReflexTrip | None:
        """Feed one physics step (the wrist force, hand frame, and the hand's rotation, its nine entries row by row);
        returns the trip when this step crosses the threshold."""
        self._recent.append((force_hand_n, r_hand_rows))
        if self._baseline is None:
            if len(self._recent) < self._recent.maxlen:
                return None
            self.arm()  # the first steps after start-up or a reset: the load the arm carries at rest
        self.external_force_n = force_beyond_n(force_hand_n, r_hand_rows, self._baseline)
        self.peak_force_n = max(self.peak_force_n, self.external_force_n)
        if self.tripped is None and self.threshold_n > 0 and self.external_force_n > self.threshold_n:
            self.tripped = ReflexTrip(now_s, self.external_force_n, self.threshold_n)
            return self.tripped
        return None


class TwinControllers:
    def __init__(self, twin: Twin, reflex_threshold_n: float = 0.0, speed_scaling: float = 1.0):
        """`speed_scaling`: the arm's speed slider (0..1) to start with (applied at once)."""
        profile = twin.profile
        lower, upper = profile.arm_limits_rad()
        self._profile = profile  # the gripper joint <-> jaw opening mapping
        self.gripper_joints = profile.finger_joints[:1]
        finger = profile.joint_limits[self.gripper_joints[0]]
        self.arm = TrajectoryFollower(profile.arm_joints, lower, upper, twin.arm_q())
        self.gripper = TrajectoryFollower(
            self.gripper_joints,
            np.array([finger.lower]),
            np.array([finger.upper]),
            np.array([profile.finger_joint_position(twin.jaw_opening_m())]),
        )
        self.reflex = ForceReflex(reflex_threshold_n)
        self._hand = twin.model.body(profile.hand_frame).id
        self.arm.set_speed_scaling(speed_scaling, twin.time_s)
        self.speed_scaling_target = float(speed_scaling)  # the slider; the arm's factor follows it at the slew rate
        self._dt = float(twin.model.opt.timestep)
        self._finger_commanded = math.nan  # the finger position last commanded to the twin (none yet)

    def __getitem__(self, name: str) -> TrajectoryFollower:
        return {"arm": self.arm, "gripper": self.gripper}[name]

    def start_motion(self, trajectory: JointTrajectory, now_s: float, start_time_s: float | None = None) -> int:
        """Start an arm motion (a trajectory goal): arms the reflex with the load measured at rest, then
        follows `trajectory`. Stops and holds sent on the controller's topic go to `arm.start` directly and
        leave the reflex as it is (a hold after a trip must not re-arm it against the contact force)."""
        self.reflex.arm()
        return self.arm.start(trajectory, now_s, start_time_s)

    def jaw_trajectory(self, opening_m: float, duration_s: float) -> JointTrajectory:
        """Move the jaw to `opening_m` (clipped to the finger's range) in `duration_s`."""
        share = float(
            np.clip(self._profile.finger_joint_position(opening_m), self.gripper.lower[0], self.gripper.upper[0])
        )
        return JointTrajectory(self.gripper_joints, np.array([max(duration_s, 1e-3)]), np.array([[share]]), None)

    def step(self, twin: Twin, n: int = 1, after_step: Callable[[], None] | None = None) -> ReflexTrip | None:
        """Advance n physics steps, updating both controllers' setpoints before each and checking the
        reflex after each (and calling `after_step`, an observer's hook). Returns the reflex trip if one happened
        (the arm then holds where it was)."""
        trip = None
        data, hand = twin.data, self._hand
        arm, gripper, reflex = self.arm, self.gripper, self.reflex  # looked up once: this loop runs every 2 ms step
        for _ in range(n):
            now_s = float(data.time)
            scaling = arm.speed_scaling
            if scaling != self.speed_scaling_target:
                step = SPEED_SCALING_SLEW_PER_S * self._dt
                scaling = float(np.clip(self.speed_scaling_target, scaling - step, scaling + step))
                arm.set_speed_scaling(scaling, now_s)
            twin.set_arm_command(arm.update(now_s))
            finger = float(gripper.update(now_s)[0])
            if finger != self._finger_commanded:  # the jaw's command changes only while it moves or is stopped
                twin.set_gripper_command(self._profile.jaw_opening_at(finger))
                self._finger_commanded = finger
            twin.step()
            tripped = reflex.check(twin.wrist_force_n(), data.xmat[hand].tolist(), float(data.time))
            if tripped is not None:
                self.arm.hold(twin.arm_q())
                trip = tripped
            if after_step is not None:
                after_step()
        return trip

"""The twin as an arm backend, in-process: the same trajectory controllers twin_node runs, updated at
every physics step; the state is read back from the simulator's sensors. Stops are the same ramps the
ros2_control backend sends (core.trajectory.stop_ramp), started on the twin's arm controller; the controller's
speed scaling (`controllers.speed_scaling_target`, the simulated pendant slider) is honoured and reported."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from captain_ros.core.config import load_config
from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.backend import ArmBackend, ArmReflexStop, ArmState, BackendError
from captain_ros.perception.observation import CameraImage
from captain_ros.twin.controller import TwinControllers
from captain_ros.twin.sim import SimulationFault, Twin


class TwinBackend(ArmBackend):
    name = "mujoco_twin"

    def __init__(
        self,
        twin: Twin,
        control_period_s: float = 0.002,
        reflex_threshold_n: float = 0.0,
        stop_decel_radps2: float | None = None,
    ):
        """`reflex_threshold_n`: the arm's force reflex until the harness sets it per motion (0: off).
        `stop_decel_radps2`: the stop ramps' deceleration limit (default: config/safety.yaml's)."""
        self.twin, self.profile = twin, twin.profile
        decel = load_config().safety.stop_decel_radps2 if stop_decel_radps2 is None else float(stop_decel_radps2)
        if not decel > 0:  # also refuses NaN
            raise ValueError(f"stop_decel_radps2 must be > 0 rad/s^2, got {stop_decel_radps2}")
        self.stop_decel_radps2 = decel
        steps = control_period_s / twin.model.opt.timestep
        if steps < 1 or abs(steps - round(steps)) > 1e-9:
            raise ValueError(
                f"control period {control_period_s} s must be a multiple of the physics step "
                f"{twin.model.opt.timestep} s"
            )
        self._steps = round(steps)
        self._period = control_period_s
        self.controllers = TwinControllers(twin, reflex_threshold_n)

    @property
    def control_period_s(self) -> float:
        return self._period

    def read_state(self, require_force: bool = True) -> ArmState:  # the simulated sensor never fails
        w = self.twin.wrist_wrench()
        return ArmState(
            self.twin.time_s, self.twin.arm_q(), self.twin.arm_qd(), self.twin.jaw_opening_m(), w.force_n, w.torque_nm
        )

    def follow(self, trajectory: JointTrajectory) -> None:
        self.controllers.start_motion(trajectory, self.twin.time_s)

    def hold(self, q_rad: np.ndarray | None = None) -> np.ndarray:
        arm = self.controllers.arm
        if q_rad is not None:
            arm.hold(q_rad)
            return arm.desired_q.copy()
        if self.controllers.reflex.tripped is not None and arm.active_token() is None:
            return arm.desired_q.copy()  # the reflex stopped the arm and it holds there (see Ros2ControlBackend.hold)
        now = self.twin.time_s
        q = arm.update(now)  # the setpoint the controller is at now, and its velocity
        ramp = self._stop_ramp(q, arm.desired_qd, arm.lower, arm.upper)
        if ramp is None:  # a setpoint gone non-finite cannot be ramped: hold where the arm is
            arm.hold(self.twin.arm_q())
            return arm.desired_q.copy()
        arm.start(ramp, now)
        return ramp.positions[-1].copy()

    def commanded(self) -> tuple[np.ndarray, np.ndarray]:
        arm = self.controllers.arm
        return arm.desired_q.copy(), arm.desired_qd.copy()

    def speed_scaling(self) -> float:
        return self.controllers.arm.speed_scaling

    def trajectory_time_s(self) -> float | None:
        return self.controllers.arm.elapsed_s(now_s=self.twin.time_s)

    def move_gripper(self, opening_m: float, duration_s: float) -> float:
        trajectory = self.controllers.jaw_trajectory(opening_m, duration_s)
        self.controllers.gripper.start(trajectory, self.twin.time_s)
        return self.profile.jaw_opening_at(float(trajectory.positions[-1, 0]))  # the profile's joint -> opening

    def capture(self, cameras: tuple[str, ...]) -> dict[str, CameraImage]:
        return {name: CameraImage(**vars(frame)) for name, frame in self.twin.observe(cameras).items()}

    def set_force_reflex(self, threshold_n: float) -> bool:
        self.controllers.reflex.threshold_n = threshold_n
        return True

    def resync(self) -> None:
        old = self.controllers
        self.controllers = TwinControllers(self.twin, old.reflex.threshold_n, old.speed_scaling_target)

    on_physics_step: Callable[[], None] | None = None  # an observer called after every physics step

    def wait_period(self) -> None:
        try:
            trip = self.controllers.step(self.twin, self._steps, self.on_physics_step)
        except SimulationFault as exc:
            raise BackendError(f"simulation fault: {exc}") from exc
        if trip is not None:
            raise ArmReflexStop(trip.message, trip.force_n)

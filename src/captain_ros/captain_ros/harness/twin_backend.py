"""The twin as an arm backend, in-process: the same trajectory controllers twin_node runs, updated at
every physics step; the state is read back from the simulator's sensors."""

from __future__ import annotations

import numpy as np

from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.backend import ArmBackend, ArmReflexStop, ArmState, BackendError
from captain_ros.perception.observation import CameraImage
from captain_ros.twin.controller import TwinControllers
from captain_ros.twin.sim import SimulationFault, Twin


class TwinBackend(ArmBackend):
    name = "mujoco_twin"

    def __init__(self, twin: Twin, control_period_s: float = 0.002, reflex_threshold_n: float = 0.0):
        """`reflex_threshold_n`: the arm's force reflex until the harness sets it per motion (0: off)."""
        self.twin, self.profile = twin, twin.profile
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
        if q_rad is None and self.controllers.reflex.tripped is not None and arm.active_token() is None:
            return arm.desired_q.copy()  # the reflex stopped the arm and it holds there (see Ros2ControlBackend.hold)
        arm.hold(self.twin.arm_q() if q_rad is None else q_rad)
        return arm.desired_q.copy()

    def commanded(self) -> tuple[np.ndarray, np.ndarray]:
        arm = self.controllers.arm
        return arm.desired_q.copy(), arm.desired_qd.copy()

    def move_gripper(self, opening_m: float, duration_s: float) -> float:
        trajectory = self.controllers.jaw_trajectory(opening_m, duration_s)
        self.controllers.gripper.start(trajectory, self.twin.time_s)
        return len(self.profile.finger_joints) * float(trajectory.positions[-1, 0])  # as the controller sums them

    def capture(self, cameras: tuple[str, ...]) -> dict[str, CameraImage]:
        return {name: CameraImage(**vars(frame)) for name, frame in self.twin.observe(cameras).items()}

    def set_force_reflex(self, threshold_n: float) -> bool:
        self.controllers.reflex.threshold_n = threshold_n
        return True

    def resync(self) -> None:
        self.controllers = TwinControllers(self.twin, self.controllers.reflex.threshold_n)

    def wait_period(self) -> None:
        try:
            trip = self.controllers.step(self.twin, self._steps)
        except SimulationFault as exc:
            raise BackendError(f"simulation fault: {exc}") from exc
        if trip is not None:
            raise ArmReflexStop(trip.message, trip.force_n)

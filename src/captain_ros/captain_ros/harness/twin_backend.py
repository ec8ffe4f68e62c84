"""The twin as an arm backend, in-process: the same trajectory controllers twin_node runs, updated at
every physics step; the state is read back from the simulator's sensors."""

from __future__ import annotations

import numpy as np

from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.backend import ArmBackend, ArmState, BackendError
from captain_ros.perception.observation import CameraImage
from captain_ros.twin.controller import TwinControllers
from captain_ros.twin.sim import SimulationFault, Twin


class TwinBackend(ArmBackend):
    name = "mujoco_twin"

    def __init__(self, twin: Twin, control_period_s: float = 0.002):
        self.twin = twin
        steps = control_period_s / twin.model.opt.timestep
        if steps < 1 or abs(steps - round(steps)) > 1e-9:
            raise ValueError(
                f"control period {control_period_s} s must be a multiple of the physics step "
                f"{twin.model.opt.timestep} s"
            )
        self._steps = round(steps)
        self._period = control_period_s
        self.controllers = TwinControllers(twin)

    @property
    def control_period_s(self) -> float:
        return self._period

    def read_state(self) -> ArmState:
        w = self.twin.wrist_wrench()
        return ArmState(
            self.twin.time_s, self.twin.arm_q(), self.twin.arm_qd(), self.twin.jaw_opening_m(), w.force_n, w.torque_nm
        )

    def follow(self, trajectory: JointTrajectory) -> None:
        self.controllers.arm.start(trajectory, self.twin.time_s)

    def hold(self, q_rad: np.ndarray | None = None) -> np.ndarray:
        self.controllers.arm.hold(self.twin.arm_q() if q_rad is None else q_rad)
        return self.controllers.arm.desired_q.copy()

    def commanded(self) -> tuple[np.ndarray, np.ndarray]:
        arm = self.controllers.arm
        return arm.desired_q.copy(), arm.desired_qd.copy()

    def move_gripper(self, opening_m: float, duration_s: float) -> float:
        trajectory = self.controllers.jaw_trajectory(opening_m, duration_s)
        self.controllers.gripper.start(trajectory, self.twin.time_s)
        return 2.0 * float(trajectory.positions[-1, 0])

    def capture(self, cameras: tuple[str, ...]) -> dict[str, CameraImage]:
        return {name: CameraImage(**vars(frame)) for name, frame in self.twin.observe(cameras).items()}

    def resync(self) -> None:
        self.controllers = TwinControllers(self.twin)

    def wait_period(self) -> None:
        try:
            self.controllers.step(self.twin, self._steps)
        except SimulationFault as exc:
            raise BackendError(f"simulation fault: {exc}") from exc

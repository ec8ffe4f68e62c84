"""Forward and inverse kinematics of the arm, from the URDF (via MuJoCo's URDF compiler).

The kinematic model is the robot alone (no scene), compiled from the robot profile's URDF, so the IK,
the twin and rviz share one description; any serial arm works (the profile names its joints). The IK is
damped least squares on the TCP pose with joint-limit clamping and a null-space pull toward a rest posture.

Only kinematics are computed here (positions, Jacobians; self-collision is FCL's, core/collision.py): masses never
enter, so a vendor's description with massless moving links (the Robotiq Hand-E's fingers) compiles with placeholder
ones.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cache

import mujoco
import numpy as np

from captain_ros.core import robot
from captain_ros.core.collision import SelfCollisionModel

# Placeholder mass and inertia for moving links a URDF gives none (MuJoCo refuses massless moving bodies: "mass and
# inertia of moving bodies must be larger than mjMINVAL"). MuJoCo's compiler bounds (boundmass, boundinertia) raise
# only bodies below them, so every link with a real <inertial> keeps it; nothing here uses masses anyway.
PLACEHOLDER_MASS_KG = 1e-3
PLACEHOLDER_INERTIA_KGM2 = 1e-9


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


def kinematic_urdf(text: str) -> str:
    """The URDF without visuals and collisions: a vendor's description points at meshes by package:// URIs that only
    a ROS install resolves, and the kinematics need none of them (self-collision is core/collision.py's, on FCL)."""
    root = ET.fromstring(text)
    for link in root.iter("link"):
        for element in list(link):
            if element.tag in ("visual", "collision"):
                link.remove(element)
    return ET.tostring(root, encoding="unicode")


@cache
def _kinematic_model(profile: robot.RobotProfile) -> mujoco.MjModel:
    spec = mujoco.MjSpec.from_string(kinematic_urdf(profile.urdf_text))
    spec.compiler.fusestatic = False
    spec.compiler.boundmass = PLACEHOLDER_MASS_KG  # links without <inertial>: see PLACEHOLDER_MASS_KG
    spec.compiler.boundinertia = PLACEHOLDER_INERTIA_KGM2
    spec.body(profile.tcp_frame).add_site(name="tcp")
    return spec.compile()


def _joint_mimics(model: mujoco.MjModel) -> list[tuple[int, int, float, float, np.ndarray]]:
    """(follower qpos address, leader qpos address, follower ref, leader ref, polynomial) of every joint coupling:
    MuJoCo compiles a URDF <mimic> into one (an equality of type joint: follower - ref = poly(leader - ref)).
    Kinematics alone does not enforce equalities, so link_poses places the followers itself."""
    out = []
    for i in range(model.neq):
        if model.eq_type[i] != mujoco.mjtEq.mjEQ_JOINT or model.eq_obj2id[i] < 0:
            continue
        follower, leader = int(model.jnt_qposadr[model.eq_obj1id[i]]), int(model.jnt_qposadr[model.eq_obj2id[i]])
        poly = model.eq_data[i, :5].copy()
        out.append((follower, leader, float(model.qpos0[follower]), float(model.qpos0[leader]), poly))
    return out


class Kinematics:
    """FK/IK for the arm joints of a robot profile (any serial arm). One instance per thread (it owns an MjData)."""

    def __init__(self, config: IKConfig = IKConfig(), profile: robot.RobotProfile | None = None):
        self.profile = profile or robot.default_profile()
        self.model = _kinematic_model(self.profile)
        self.data = mujoco.MjData(self.model)
        self.config = config
        self._qadr = np.array([self.model.joint(j).qposadr[0] for j in self.profile.arm_joints])
        self._dof = np.array([self.model.joint(j).dofadr[0] for j in self.profile.arm_joints])
        self._site = self.model.site("tcp").id
        self.lower, self.upper = self.profile.arm_limits_rad()
        self.n = self.profile.dof
        self.links = frozenset(self.model.body(b).name for b in range(1, self.model.nbody))  # frames forward() knows
        self._fingers = np.array([self.model.joint(j).qposadr[0] for j in self.profile.finger_joints], dtype=int)
        self._mimics = _joint_mimics(self.model)
        self._bodies: dict[str, int] = {}  # link name -> body id, looked up once (forward runs every control period)
        self._collision: SelfCollisionModel | None = None

    def link_poses(self, q_rad: np.ndarray, jaw_opening_m: float | None = None) -> dict[str, np.ndarray]:
        """Every link's pose in the base frame (4x4) at arm joints q, with the jaw at `jaw_opening_m` (default:
        fully open; mimicking finger joints follow their leader)."""
        if jaw_opening_m is None:
            jaw_opening_m = self.profile.max_jaw_opening_m()
        self.data.qpos[self._qadr] = q_rad
        if self.profile.has_gripper:
            self.data.qpos[self._fingers] = self.profile.finger_joint_position(jaw_opening_m)
        for follower, leader, follower_ref, leader_ref, poly in self._mimics:  # fingers mimicking the driven joint
            x = self.data.qpos[leader] - leader_ref
            self.data.qpos[follower] = follower_ref + sum(c * x**k for k, c in enumerate(poly))
        mujoco.mj_kinematics(self.model, self.data)
        poses = {}
        for b in range(1, self.model.nbody):
            t = np.eye(4)
            t[:3, :3], t[:3, 3] = self.data.xmat[b].reshape(3, 3), self.data.xpos[b]
            poses[self.model.body(b).name] = t
        return poses

    @property
    def collision(self) -> SelfCollisionModel:
        """The description's collision geometry (core/collision.py), built on first use: meshes are loaded then."""
        if self._collision is None:
            model = SelfCollisionModel.from_urdf(
                self.profile.urdf_text, srdf_text=self.profile.srdf_text, pad_links=self.profile.pad_links
            )
            if not self.profile.srdf_text:
                model.disable_touching(self.link_poses(self.profile.home_q), "Default: in contact at the home pose")
            self._collision = model
        return self._collision

    def self_collisions(self, q_rad: np.ndarray, jaw_opening_m: float | None = None) -> list[tuple[str, str]]:
        """Pairs of robot links whose collision geometry overlaps at q (pairs that are not checked: see
        core/collision.py), with the jaw at `jaw_opening_m` (default: fully open)."""
        model = self.collision
        return model.collisions(self.link_poses(q_rad, jaw_opening_m)) if model.pairs else []

    def forward(self, q_rad: np.ndarray, frame: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pose of `frame` (a URDF link; default the TCP) in the base frame: position (3,), rotation (3, 3)."""
        self.data.qpos[self._qadr] = q_rad
        mujoco.mj_kinematics(self.model, self.data)
        if frame is None or frame == self.profile.tcp_frame:
            return self.data.site_xpos[self._site].copy(), self.data.site_xmat[self._site].reshape(3, 3).copy()
        body = self._bodies.get(frame)
        if body is None:
            if frame not in self.links:
                raise KeyError(
                    f"'{frame}' is not a link of robot profile '{self.profile.name}''s URDF (a frame only /tf knows, "
                    "such as a calibrated camera, is looked up there)"
                )
            body = self._bodies[frame] = self.model.body(frame).id
        return self.data.xpos[body].copy(), self.data.xmat[body].reshape(3, 3).copy()

    def solve(
        self, position_m: np.ndarray, rotation: np.ndarray, q_seed_rad: np.ndarray, q_rest_rad: np.ndarray | None = None
    ) -> IKResult:
        cfg = self.config
        position_m, rotation = np.asarray(position_m, dtype=float), np.asarray(rotation, dtype=float)
        if position_m.shape != (3,) or rotation.shape != (3, 3) or np.shape(q_seed_rad) != (self.n,):
            raise ValueError(
                f"IK needs a (3,) position, a (3, 3) rotation and a ({self.n},) seed; got "
                f"{position_m.shape}, {rotation.shape}, {np.shape(q_seed_rad)}"
            )
        q = np.clip(np.asarray(q_seed_rad, dtype=float), self.lower, self.upper)
        rest = self.profile.home_q if q_rest_rad is None else q_rest_rad
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
            null = np.eye(self.n) - np.linalg.pinv(jac) @ jac
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

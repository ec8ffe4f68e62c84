"""The twin: one task's compiled scene, reset to start states by id, stepped under position
control, observed through its cameras, and checked for simulation faults.

Cameras are calibrated, not perfect: `observe()` and `camera_pose()` give each camera's calibrated
pose (what a calibrated robot knows), while the renderer draws from the true pose, which differs by
the start state's hand-eye calibration error. Only evaluation code asks for `true_camera_pose()`.

A fault (NaN state, exploding contact forces, an object through the table) raises
`SimulationFault`: an infrastructure failure, never a task outcome.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import mujoco
import numpy as np

from captain_ros.core import robot
from captain_ros.twin.cameras import CameraFrame, CameraRig
from captain_ros.twin.privileged_state import EpisodeMemory, PrivilegedState, compute_features, object_poses
from captain_ros.twin.scene import TABLE_CENTER_XY_M, TABLE_HALF_M, PhysicsConfig, compile_model
from captain_ros.twin.start_states import Layout, StartId, check_split, make_layout, sample_start_id
from captain_ros.twin.state import SceneReader
from captain_ros.twin.tasks import (
    LadderTracker,
    TaskError,
    TaskSpec,
    credited_rungs,
    get_task,
    rungs_held_at_end,
    rungs_now,
    success,
)

SETTLE_S = 0.3
MAX_CONTACT_FORCE_N = 1.0e4
# Speeds no real tabletop scene reaches: beyond them the integration has blown up.
MAX_LINEAR_SPEED_MPS = 10.0
MAX_ANGULAR_SPEED_RADPS = 150.0
MAX_JOINT_SPEED = 10.0  # arm rad/s, fingers and drawer m/s
OPTICAL_FROM_MUJOCO = np.diag([1.0, -1.0, -1.0])  # MuJoCo camera (x right, y up, z back) -> optical frame
THROUGH_TABLE_M = 0.03
_DIVERGENCE_WARNINGS = np.array(
    [
        int(mujoco.mjtWarning.mjWARN_BADQPOS),
        int(mujoco.mjtWarning.mjWARN_BADQVEL),
        int(mujoco.mjtWarning.mjWARN_BADQACC),
    ]
)
CHECK_EVERY_STEPS = 5  # faults are detected within 10 ms of simulated time


class SimulationFault(RuntimeError):
    """The simulation became invalid (infrastructure failure, not a task outcome)."""


@dataclass(frozen=True)
class Wrench:
    force_n: np.ndarray  # in the hand frame
    torque_nm: np.ndarray


def _yaw_quat(yaw: float) -> np.ndarray:
    return np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def rotvec_matrix(rotvec) -> np.ndarray:
    """Rotation matrix of a rotation vector (axis times angle, rad)."""
    r = np.asarray(rotvec, dtype=float)
    angle = float(np.linalg.norm(r))
    if angle < 1e-15:
        return np.eye(3)
    k = r / angle
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + math.sin(angle) * kx + (1.0 - math.cos(angle)) * kx @ kx


def quat_of(rotation: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z) of a rotation matrix."""
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.ascontiguousarray(rotation, dtype=float).ravel())
    return quat


class Twin:
    def __init__(
        self,
        task: str | TaskSpec,
        physics: PhysicsConfig = PhysicsConfig(),
        suite=None,
        profile: robot.RobotProfile | None = None,
    ):
        self.task = task if isinstance(task, TaskSpec) else get_task(task, suite)
        self._suite = suite
        self.physics = physics
        self.profile = profile or robot.default_profile()
        self.model = compile_model(self.task.objects, physics, self.profile)
        self.data = mujoco.MjData(self.model)
        self.reader = SceneReader(self.model, self.data, self.task.objects, self.profile)
        m = self.model
        self._arm_qpos = np.array([m.joint(j).qposadr[0] for j in self.profile.arm_joints])
        self._arm_dof = np.array([m.joint(j).dofadr[0] for j in self.profile.arm_joints])
        self._finger_qpos = np.array([m.joint(j).qposadr[0] for j in self.profile.finger_joints])
        self._arm_act = np.array([m.actuator(f"{j}_servo").id for j in self.profile.arm_joints])
        self._grip_act = m.actuator("gripper_servo").id
        self._jaw_range = self.profile.jaw_opening_range_m()
        adr = {name: int(m.sensor(name).adr[0]) for name in ("wrist_force", "wrist_torque")}
        self._force_at = slice(adr["wrist_force"], adr["wrist_force"] + 3)  # read at every physics step
        self._torque_at = slice(adr["wrist_torque"], adr["wrist_torque"] + 3)
        self._movable = [o for o in self.task.objects if o.movable]
        self._movable_ids = np.array([m.body(o.name).id for o in self._movable], dtype=int)
        self._cams = {cam: m.cam(cam).id for cam in self.profile.camera_frames}
        # camera -> calibrated optical-frame pose (position, rotation) in its body's frame, set at reset
        self._calibrated: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._key_light = m.light("key").id
        self._fill_light = m.light("fill").id
        self._table_geom = m.geom("table").id
        self._nominal = {
            k: getattr(m, k).copy() for k in ("light_dir", "light_diffuse", "cam_pos", "cam_quat", "geom_rgba")
        }
        self._object_geoms = {o.name: np.flatnonzero(m.geom_bodyid == m.body(o.name).id) for o in self.task.objects}
        self._rig: CameraRig | None = None
        self.start_id: StartId | None = None
        self.memory: EpisodeMemory | None = None
        self.ladder = LadderTracker(self.task)
        self._warnings = 0
        self._since_check = 0
        self._speed_limit = np.full(m.nv, MAX_JOINT_SPEED)
        for j in range(m.njnt):
            if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
                adr = m.jnt_dofadr[j]
                self._speed_limit[adr : adr + 3] = MAX_LINEAR_SPEED_MPS
                self._speed_limit[adr + 3 : adr + 6] = MAX_ANGULAR_SPEED_RADPS

    # ------------------------------------------------------------------------------- reset
    def reset(
        self, start_id: str | StartId | None = None, *, split: str = "any", rng: np.random.Generator | None = None
    ) -> StartId:
        """Reset to a start state. With no id, draw a wide-layout id from `split`."""
        if start_id is None:
            start = sample_start_id(self.task.name, split, rng or np.random.default_rng())
        else:
            start = start_id if isinstance(start_id, StartId) else StartId.parse(start_id, self._suite)
        if start.task != self.task.name:
            raise TaskError(f"start id '{start}' is for task '{start.task}', but this twin runs '{self.task.name}'")
        check_split(start, split)
        self._apply(make_layout(self.task, start))
        self.start_id = start
        return start

    def _apply(self, layout: Layout) -> None:
        m, d = self.model, self.data
        for key, value in self._nominal.items():
            getattr(m, key)[:] = value
        # the model's cameras and lights before mj_resetData: MuJoCo 4 computes the poses of what is fixed to
        # the world (the head camera, the lights) there and nowhere else, so a change after it never renders
        self._place_cameras(layout)
        key_dir = np.asarray(layout.key_light_dir)
        m.light_dir[self._key_light] = key_dir / np.linalg.norm(key_dir)
        m.light_diffuse[self._key_light] = layout.key_light_diffuse
        m.light_diffuse[self._fill_light] = layout.fill_light_diffuse
        m.geom_rgba[self._table_geom, :3] = layout.table_rgb
        mujoco.mj_resetData(m, d)
        poses = {}
        for obj in self.task.objects:
            x, y, yaw = layout.poses[obj.name]
            poses[obj.name] = (x, y, 0.0005 if obj.movable else 0.0, yaw)
        self._set_bodies(self.profile.home_q, self.profile.max_jaw_opening_m(), poses, layout.drawer_m)
        for obj in self.task.objects:
            m.geom_rgba[self._object_geoms[obj.name], :3] = layout.object_rgb[obj.name]
        mujoco.mj_forward(m, d)
        self._warnings = 0
        self.step(round(SETTLE_S / m.opt.timestep))
        d.time = 0.0
        self.memory = EpisodeMemory(
            {o.name: self.reader.position(o.name) for o in self.task.objects},
            layout.drawer_m if self.task.cabinet else 0.0,
        )
        self.ladder = LadderTracker(self.task)

    def _set_bodies(
        self, arm_q_rad: np.ndarray, jaw_opening_m: float, poses: dict[str, tuple[float, ...]], drawer_m: float
    ) -> None:
        """Arm joints (and their servo targets), jaw, each object at (x, y, z, yaw) and the drawer; no forward pass."""
        m, d = self.model, self.data
        d.qpos[self._arm_qpos] = arm_q_rad
        d.ctrl[self._arm_act] = arm_q_rad
        finger = self.profile.finger_joint_position(float(jaw_opening_m))  # each gripper joint's
        d.qpos[self._finger_qpos] = finger
        d.ctrl[self._grip_act] = finger
        for obj in self.task.objects:
            x, y, z, yaw = poses[obj.name]
            if obj.movable:
                adr = m.joint(f"{obj.name}_free").qposadr[0]
                d.qpos[adr : adr + 3] = (x, y, z)
                d.qpos[adr + 3 : adr + 7] = _yaw_quat(yaw)
            else:
                mocap = m.body_mocapid[m.body(obj.name).id]
                d.mocap_pos[mocap] = (x, y, z)
                d.mocap_quat[mocap] = _yaw_quat(yaw)
                d.qpos[m.joint(f"{obj.name}_drawer").qposadr[0]] = drawer_m

    def place(
        self, arm_q_rad: np.ndarray, jaw_opening_m: float, poses: dict[str, tuple[float, float, float, float]]
    ) -> None:
        """The scene as something else measured it (the shadow twin, harness/shadow.py): the arm at `arm_q_rad` and
        held there, the jaw at `jaw_opening_m`, each object at (x, y, z of its bottom, yaw), time 0. The start state's
        lights, cameras and colours stay as they are."""
        q = np.asarray(arm_q_rad, dtype=float)
        if q.shape != (self.profile.dof,) or not np.all(np.isfinite(q)) or not math.isfinite(jaw_opening_m):
            raise ValueError(f"place needs {self.profile.dof} finite joint positions and a finite jaw opening")
        missing = {o.name for o in self.task.objects} - set(poses)
        if missing:
            raise ValueError(f"place needs a pose for every object; missing {sorted(missing)}")
        mujoco.mj_resetData(self.model, self.data)
        self._set_bodies(q, jaw_opening_m, poses, 0.0)
        mujoco.mj_forward(self.model, self.data)
        self._warnings = 0

    def _place_cameras(self, layout: Layout) -> None:
        """Calibrated pose = the URDF's optical frame moved by the layout's placement (head only); the
        rendered camera = the calibrated pose moved by the layout's calibration error."""
        m = self.model
        for cam, cid in self._cams.items():
            rot = np.zeros(9)
            mujoco.mju_quat2Mat(rot, self._nominal["cam_quat"][cid])
            pos, rot = self._nominal["cam_pos"][cid].copy(), rot.reshape(3, 3) @ OPTICAL_FROM_MUJOCO
            if cam == "head":
                pos = pos + rot @ np.asarray(layout.head_camera_offset_m)
                rot = rot @ rotvec_matrix(layout.head_camera_rotvec_rad)
            self._calibrated[cam] = (pos, rot)
            error = layout.calibration_error[cam]
            m.cam_pos[cid] = pos + rot @ np.asarray(error.offset_m)
            m.cam_quat[cid] = quat_of(rot @ rotvec_matrix(error.rotvec_rad) @ OPTICAL_FROM_MUJOCO)

    # ------------------------------------------------------------------------------- cameras
    def camera_pose(self, camera: str) -> tuple[np.ndarray, np.ndarray]:
        """The camera's optical frame (position, rotation) in the base frame AS CALIBRATED: what the robot
        knows, and all perception is given. For a camera on the arm it follows the arm's links."""
        if not self._calibrated:
            raise RuntimeError("reset the twin before asking for camera poses")
        body = int(self.model.cam_bodyid[self._cams[camera]])
        xmat = self.data.xmat[body].reshape(3, 3)
        pos, rot = self._calibrated[camera]
        return self.data.xpos[body] + xmat @ pos, xmat @ rot

    def true_camera_pose(self, camera: str) -> tuple[np.ndarray, np.ndarray]:
        """EVALUATION ONLY: where the rendered camera really is (calibrated pose plus the calibration error).
        Never handed to perception."""
        cid = self._cams[camera]
        return self.data.cam_xpos[cid].copy(), self.data.cam_xmat[cid].reshape(3, 3) @ OPTICAL_FROM_MUJOCO

    def camera_transforms(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Calibrated base-frame poses (position, rotation) of every camera's link and optical frame, by URDF
        frame name, for /tf: each camera's link moves with its calibrated optical frame."""
        out = {}
        for cam, frame in self.profile.camera_frames.items():
            body = int(self.model.cam_bodyid[self._cams[cam]])
            pos, rot = self.camera_pose(cam)
            # the rigid correction from the URDF's optical frame to the calibrated one, applied to its parent too
            r_fix = rot @ self.data.xmat[body].reshape(3, 3).T
            t_fix = pos - r_fix @ self.data.xpos[body]
            link = int(self.model.body_parentid[body])
            link_rot = r_fix @ self.data.xmat[link].reshape(3, 3)
            out[self.model.body(link).name] = (r_fix @ self.data.xpos[link] + t_fix, link_rot)
            out[frame] = (pos, rot)
        return out

    # ------------------------------------------------------------------------------- control
    def set_arm_command(self, q_rad: np.ndarray) -> None:
        q = np.asarray(q_rad, dtype=float)
        n = self.profile.dof
        if q.shape != (n,) or not math.isfinite(float(q.sum())):  # the sum: NaN or inf in any, cheaply
            raise ValueError(f"arm command must be {n} finite joint positions, got shape {q.shape}")
        self.data.ctrl[self._arm_act] = q

    def set_gripper_command(self, opening_m: float) -> None:
        if not math.isfinite(opening_m):
            raise ValueError(f"gripper command must be finite, got {opening_m}")
        shut, full = self._jaw_range
        self.data.ctrl[self._grip_act] = self.profile.finger_joint_position(min(max(opening_m, shut), full))

    def step(self, n: int = 1) -> None:
        """Advance n physics steps; the state is checked for faults every CHECK_EVERY_STEPS steps."""
        for _ in range(n):
            mujoco.mj_step(self.model, self.data)
            self._since_check += 1
            if self._since_check >= CHECK_EVERY_STEPS:
                self.check_stable()

    # ------------------------------------------------------------------------------- state
    @property
    def time_s(self) -> float:
        return float(self.data.time)

    def arm_q(self) -> np.ndarray:
        return self.data.qpos[self._arm_qpos].copy()

    def arm_qd(self) -> np.ndarray:
        return self.data.qvel[self._arm_dof].copy()

    def arm_command(self) -> np.ndarray:
        return self.data.ctrl[self._arm_act].copy()

    def jaw_opening_m(self) -> float:
        return self.reader.jaw_opening()

    def wrist_force_n(self) -> list[float]:
        """The wrist force sensor's reading alone (the reflex's per-step input), hand frame, as plain floats."""
        return self.data.sensordata[self._force_at].tolist()

    def wrist_wrench(self) -> Wrench:
        return Wrench(self.data.sensordata[self._force_at].copy(), self.data.sensordata[self._torque_at].copy())

    def tcp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        site = self.model.site("tcp").id
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, self.data.site_xmat[site])
        return self.data.site_xpos[site].copy(), quat

    def check_stable(self) -> None:
        """Raise SimulationFault on NaN state, unstable accelerations, exploding speeds or contact
        forces, or an object that went through the table. Cheap common path, details on failure."""
        self._since_check = 0
        d = self.data
        if not math.isfinite(float(d.qpos.sum()) + float(d.qvel.sum())):
            raise SimulationFault("simulation state became NaN or infinite")
        warnings = int(d.warning.number[_DIVERGENCE_WARNINGS].sum())
        if warnings > self._warnings:
            raise SimulationFault("MuJoCo reported a diverged state (bad qpos, qvel or qacc)")
        too_fast = np.abs(d.qvel) > self._speed_limit
        if too_fast.any():
            dof = int(np.flatnonzero(too_fast)[0])
            joint = self.model.joint(int(self.model.dof_jntid[dof])).name
            raise SimulationFault(
                f"joint '{joint}' moves at {abs(d.qvel[dof]):.1f} (m or rad)/s, beyond "
                f"{self._speed_limit[dof]:.0f}: the simulation exploded"
            )
        if d.nefc:
            peak = float(np.abs(d.efc_force[: d.nefc]).max())
            if peak > MAX_CONTACT_FORCE_N:
                raise SimulationFault(f"constraint force {peak:.0f} N exceeds {MAX_CONTACT_FORCE_N:.0f} N: exploding")
        if len(self._movable_ids):
            pos = d.xpos[self._movable_ids]
            if pos[:, 2].min() < -THROUGH_TABLE_M:
                on_table = (np.abs(pos[:, 0] - TABLE_CENTER_XY_M[0]) < TABLE_HALF_M[0] - 0.05) & (
                    np.abs(pos[:, 1] - TABLE_CENTER_XY_M[1]) < TABLE_HALF_M[1] - 0.05
                )
                sunk = on_table & (pos[:, 2] < -THROUGH_TABLE_M)
                if sunk.any():
                    names = [self._movable[i].name for i in np.flatnonzero(sunk)]
                    raise SimulationFault(f"object(s) {', '.join(names)} passed through the table")

    # ------------------------------------------------------------------------------- outputs
    def observe(self, cameras: tuple[str, ...] = ("head", "wrist")) -> dict[str, CameraFrame]:
        """Images rendered from the true camera poses, labelled with the calibrated ones (as a real
        camera's images come with its calibration, not with where it really is)."""
        if self._rig is None:
            self._rig = CameraRig(self.model)
        frames = {}
        for cam in cameras:
            position, rotation = self.camera_pose(cam)
            frames[cam] = replace(self._rig.render(self.data, cam), position_m=position, rotation=rotation)
        return frames

    def success(self) -> bool:
        return success(self.task, self.reader)

    def subgoals_credited(self) -> int:
        """TRAINING ONLY: d of the staged sub-goal reward on the state now, the episode's end (tasks.credited_rungs:
        the ladder's rungs reached, with place and move rungs still holding)."""
        if self.memory is None or self.start_id is None:
            raise RuntimeError("reset the twin before scoring its sub-goals")
        now = rungs_now(self.task, self.reader, self.memory.as_start())
        self.ladder.update(now)
        return credited_rungs(self.ladder.reached, now, rungs_held_at_end(self.task))

    def snapshot(self) -> PrivilegedState:
        """TRAINING ONLY: the hidden state and its 36 features (updates the sub-goal ladder)."""
        if self.memory is None or self.start_id is None:
            raise RuntimeError("reset the twin before taking a snapshot")
        reached = self.ladder.update(rungs_now(self.task, self.reader, self.memory.as_start()))
        features, status = compute_features(self.task, self.reader, self.memory, len(reached) / len(self.ladder.names))
        joints = {
            f"{c.name}_drawer": self.reader.drawer_position(c.name) for c in self.task.objects if c.kind == "cabinet"
        }
        return PrivilegedState(
            self.task.name,
            str(self.start_id),
            self.time_s,
            features,
            object_poses(self.task, self.reader),
            joints,
            tuple(status),
            all(status),
            tuple(reached),
        )

    def close(self) -> None:
        if self._rig is not None:
            self._rig.close()
            self._rig = None

    def __enter__(self) -> Twin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The LIBERO server: one LIBERO (or LIBERO-PRO) scene, driven joint by joint for the harness. Runs in .venv-libero.

Started by `LiberoBackend` (never by hand) as `python -m captain_ros.libero.server --fd N`, with `N` its end of a
socket pair (`protocol.py`). It imports numpy, the benchmark (robosuite 1.4, MuJoCo < 4) and
`captain_ros.core.trajectory` only, so it runs from the package source without the rest of captain_ros installed.

How the arm is driven. LIBERO's own step (`env.step`) takes end-effector deltas at 20 Hz through robosuite's OSC
controller; the harness commands joint trajectories, as ros2_control's joint_trajectory_controller takes them. So
the server bypasses `env.step` (CaPtain App. L does the same on SimplerEnv: "arm joint targets through the robot's
own drives instead of the delta end-effector controller"): at every physics step (LIBERO's 2 ms) the arm's
trajectory follower gives the setpoint, and a computed-torque law on the model's own torque motors tracks it,
tau = M(q) (qdd_ref + Kp e + Kd de) + bias(q, qd), clipped to the motors' limits; the fingers are LIBERO's
position servos, commanded from a second follower. The goal predicates (`check_success`) read the simulator state,
so they judge the result exactly as under `env.step`; the environment's step counter and horizon are not used.

Frames: everything the harness sees is in the robot base frame (robot0_base, = robot0_link0); images are upright
(robosuite renders them bottom-up), depth in metres along the optical axis, camera poses in REP-103 optical axes.
The second finger's joint is reported negated (the URDF's convention: both fingers 0..0.04 m).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from captain_ros.core.trajectory import JointTrajectory, TrajectoryFollower
from captain_ros.libero.protocol import PROTOCOL_VERSION, dumps, loads

CAMERAS = {"head": "agentview", "wrist": "robot0_eye_in_hand"}  # harness name -> LIBERO camera
OMEGA_RADPS = 40.0  # closed-loop bandwidth of the joint tracking law (Kp = w^2, Kd = 2 w: critically damped)
OPTICAL_FROM_MUJOCO = np.diag([1.0, -1.0, -1.0])  # MuJoCo cameras look along -z with y up; REP 103: +z, y down


class ArgumentError(ValueError):
    """The client asked for something the server cannot do (unknown suite, bad index): not a simulator fault."""


def _quat_wxyz(rotation: np.ndarray) -> np.ndarray:
    import mujoco

    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.asarray(rotation, dtype=float).reshape(9))
    return quat


class LiberoScene:
    """One LIBERO task's environment with the arm under joint-trajectory control."""

    def __init__(self, suite: str, task_index: int, width: int, height: int):
        import mujoco
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        benchmarks = benchmark.get_benchmark_dict()
        if suite not in benchmarks:
            raise ArgumentError(f"unknown LIBERO suite {suite!r}; known: {', '.join(sorted(benchmarks))}")
        self.suite_name, self.task_index = suite, task_index
        self.suite = benchmarks[suite]()
        n = self.suite.get_num_tasks()
        if not 0 <= task_index < n:
            raise ArgumentError(f"{suite} has tasks 0..{n - 1}, not {task_index}")
        self.task = self.suite.get_task(task_index)
        self.init_states = self.suite.get_task_init_states(task_index)
        bddl = os.path.join(get_libero_path("bddl_files"), self.task.problem_folder, self.task.bddl_file)
        self.width, self.height = width, height
        self.env = OffScreenRenderEnv(
            bddl_file_name=bddl, camera_heights=height, camera_widths=width, camera_depths=True
        )
        self.env.seed(0)
        self.env.reset()
        self.env.env.hard_reset = False  # later resets reuse the compiled model (0.6 s instead of 4 s)
        self.sim = self.env.env.sim
        self.m, self.d = self.sim.model._model, self.sim.data._data
        self.mujoco = mujoco
        robot = self.env.env.robots[0]
        self.qi = np.array(robot._ref_joint_pos_indexes)
        self.vi = np.array(robot._ref_joint_vel_indexes)
        self.ai = np.array(robot._ref_joint_actuator_indexes)
        self.gi = np.array(robot._ref_joint_gripper_actuator_indexes)
        self.gq = np.array(robot._ref_gripper_joint_pos_indexes)
        self.tau_lo, self.tau_hi = self.m.actuator_ctrlrange[self.ai].T
        self.arm_joints = tuple(robot.robot_joints)
        self.finger_joints = tuple(robot.gripper.joints)
        lower, upper = self.m.jnt_range[[self.m.joint(j).id for j in self.arm_joints]].T
        self.arm_lower, self.arm_upper = lower.copy(), upper.copy()
        f_lower, f_upper = self.m.jnt_range[self.m.joint(self.finger_joints[0]).id]
        self.finger_lower, self.finger_upper = float(f_lower), float(f_upper)
        self.base_body = self.m.body(robot.robot_model.root_body).id
        self.hand_body = self.m.body("robot0_right_hand").id  # the URDF's gripper0_hand frame
        self.ft_site = self.m.site("gripper0_ft_frame").id
        self.force_adr = self.m.sensor_adr[self.m.sensor("gripper0_force_ee").id]
        self.torque_adr = self.m.sensor_adr[self.m.sensor("gripper0_torque_ee").id]
        self.dt = float(self.m.opt.timestep)
        self._labels: tuple[np.ndarray, list[str]] | None = None
        self.arm: TrajectoryFollower | None = None
        self.gripper: TrajectoryFollower | None = None
        self._accel, self._force = np.zeros(self.m.nv), np.zeros(self.m.nv)

    # ------------------------------------------------------------------------------------------ reset
    def reset(self, init_state: int) -> dict[str, Any]:
        n = len(self.init_states)
        if not 0 <= init_state < n:
            raise ArgumentError(
                f"{self.suite_name} task {self.task_index} has initial states 0..{n - 1}, not {init_state}"
            )
        self.env.reset()
        self.env.set_init_state(self.init_states[init_state])
        self.d.time = 0.0
        q = self.d.qpos[self.qi].copy()
        self.arm = TrajectoryFollower(self.arm_joints, self.arm_lower, self.arm_upper, q)
        self._last_qd_des = np.zeros(len(self.arm_joints))
        finger = float(np.clip(self.d.qpos[self.gq[0]], self.finger_lower, self.finger_upper))
        self.gripper = TrajectoryFollower(
            self.finger_joints[:1], np.array([self.finger_lower]), np.array([self.finger_upper]), np.array([finger])
        )
        self.mujoco.mj_forward(self.m, self.d)
        parsed = self.env.env.parsed_problem
        return {
            "suite": self.suite_name,
            "task_index": self.task_index,
            "task_name": self.task.name,
            "instruction": self.task.language,
            "init_state": init_state,
            "init_states": n,
            "goal": [list(g) for g in parsed["goal_state"]],
            "objects": sorted(self.env.env.objects_dict),
            "fixtures": sorted(self.env.env.fixtures_dict),
            "arm_joints": list(self.arm_joints),
            "finger_joints": list(self.finger_joints),
            "dt": self.dt,
            "state": self.state(),
        }

    def _require_reset(self) -> None:
        if self.arm is None:
            raise ArgumentError("reset the scene first")

    # ------------------------------------------------------------------------------------------ control
    def state(self) -> dict[str, Any]:
        d = self.d
        r_hand = d.xmat[self.hand_body].reshape(3, 3)
        r_site = d.site_xmat[self.ft_site].reshape(3, 3)
        to_hand = r_hand.T @ r_site
        fingers = d.qpos[self.gq].copy()
        fingers[1] = -fingers[1]  # the URDF's convention: both fingers open positive
        out = {
            "time_s": float(d.time),
            "q": d.qpos[self.qi].copy(),
            "qd": d.qvel[self.vi].copy(),
            "fingers": fingers,
            "force_hand": to_hand @ d.sensordata[self.force_adr : self.force_adr + 3],
            "torque_hand": to_hand @ d.sensordata[self.torque_adr : self.torque_adr + 3],
        }
        if self.arm is not None:
            out["desired_q"] = self.arm.desired_q.copy()
            out["desired_qd"] = self.arm.desired_qd.copy()
            out["elapsed_s"] = self.arm.elapsed_s(now_s=float(d.time))
        return out

    def follow(self, joints: list[str], times: np.ndarray, positions: np.ndarray, velocities: np.ndarray | None):
        self._require_reset()
        trajectory = JointTrajectory.build(
            joints, times, positions, velocities, controlled=self.arm_joints, lower=self.arm_lower, upper=self.arm_upper
        )
        self.arm.start(trajectory, float(self.d.time))

    def hold(self, q: np.ndarray) -> np.ndarray:
        self._require_reset()
        self.arm.hold(np.asarray(q, dtype=float))
        return self.arm.desired_q.copy()

    def move_gripper(self, finger_m: float, duration_s: float) -> float:
        self._require_reset()
        target = float(np.clip(finger_m, self.finger_lower, self.finger_upper))
        trajectory = JointTrajectory(
            self.finger_joints[:1], np.array([max(duration_s, 1e-3)]), np.array([[target]]), None
        )
        self.gripper.start(trajectory, float(self.d.time))
        return target

    def step(self, n: int) -> dict[str, Any]:
        """n physics steps under the arm's and the fingers' followers. Raises FloatingPointError on a diverged
        state (a simulator fault)."""
        self._require_reset()
        m, d, mujoco = self.m, self.d, self.mujoco
        kp, kd = OMEGA_RADPS**2, 2.0 * OMEGA_RADPS
        for _ in range(n):
            now = float(d.time)
            q_des = self.arm.update(now)
            qd_des = self.arm.desired_qd
            qdd_ff = (qd_des - self._last_qd_des) / self.dt  # the setpoint's acceleration, one step back
            self._last_qd_des = qd_des.copy()
            finger = float(self.gripper.update(now)[0])
            mujoco.mj_forward(m, d)  # current mass matrix and bias forces (robosuite forwards every substep too)
            self._accel[self.vi] = qdd_ff + kp * (q_des - d.qpos[self.qi]) + kd * (qd_des - d.qvel[self.vi])
            mujoco.mj_mulM(m, d, self._force, self._accel)  # M(q) times the arm's desired acceleration
            tau = self._force[self.vi] + d.qfrc_bias[self.vi]
            d.ctrl[self.ai] = np.clip(tau, self.tau_lo, self.tau_hi)
            d.ctrl[self.gi] = [finger, -finger]
            mujoco.mj_step(m, d)
        if not (math.isfinite(float(d.qpos.sum())) and math.isfinite(float(d.qvel.sum()))):
            raise FloatingPointError("the LIBERO simulation state became NaN or infinite")
        self.env.env._post_process()  # LIBERO's tracked object states (the stove's flame) follow the sim
        return self.state()

    # ------------------------------------------------------------------------------------------ sensing
    def base_pose(self) -> tuple[np.ndarray, np.ndarray]:
        return self.d.xpos[self.base_body].copy(), self.d.xmat[self.base_body].reshape(3, 3).copy()

    def _geom_labels(self) -> tuple[np.ndarray, list[str]]:
        """Per geom, the index of the LIBERO object or fixture it belongs to (-1: none), and their names."""
        if self._labels is None:
            env, m = self.env.env, self.m
            names = sorted(env.objects_dict) + sorted(env.fixtures_dict)
            owners = {**env.objects_dict, **env.fixtures_dict}
            roots = {m.body(owners[name].root_body).id: i for i, name in enumerate(names)}
            body_label = np.full(m.nbody, -1)
            for b in range(m.nbody):
                a = b
                while a > 0 and a not in roots:
                    a = int(m.body_parentid[a])
                body_label[b] = roots.get(a, -1)
            self._labels = (body_label[m.geom_bodyid], names)
        return self._labels

    def capture(self, cameras: list[str], segmentation: bool = False) -> dict[str, Any]:
        """Images of the named cameras; with `segmentation`, also each pixel's LIBERO object (ORACLE: only for the
        labelled oracle-segmentation variant, never for the default perception path)."""
        self._require_reset()
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ArgumentError(f"unknown camera(s) {unknown}; LIBERO has {sorted(CAMERAS)}")
        m, d = self.m, self.d
        p_base, r_base = self.base_pose()
        extent = float(m.stat.extent)
        near, far = float(m.vis.map.znear) * extent, float(m.vis.map.zfar) * extent
        out = {}
        for name in cameras:
            cam = CAMERAS[name]
            rgb, depth = self.sim.render(camera_name=cam, width=self.width, height=self.height, depth=True)
            depth_m = near / (1.0 - depth * (1.0 - near / far))  # OpenGL's normalised depth -> metres along z
            cam_id = m.camera(cam).id
            f = 0.5 * self.height / math.tan(math.radians(float(m.cam_fovy[cam_id])) / 2)
            intrinsics = np.array([[f, 0.0, self.width / 2], [0.0, f, self.height / 2], [0.0, 0.0, 1.0]])
            r_world = d.cam_xmat[cam_id].reshape(3, 3) @ OPTICAL_FROM_MUJOCO
            out[name] = {
                "rgb": np.ascontiguousarray(rgb[::-1]),  # rendered bottom-up
                "depth_m": np.ascontiguousarray(depth_m[::-1]).astype(np.float32),
                "K": intrinsics,
                "position_m": r_base.T @ (d.cam_xpos[cam_id] - p_base),
                "rotation": r_base.T @ r_world,
            }
            if segmentation:
                seg = self.sim.render(camera_name=cam, width=self.width, height=self.height, segmentation=True)
                geom_label, names = self._geom_labels()
                kind, ids = seg[::-1, :, 0], seg[::-1, :, 1]
                is_geom = (kind == self.mujoco.mjtObj.mjOBJ_GEOM) & (ids >= 0) & (ids < m.ngeom)
                labels = np.full(kind.shape, -1, dtype=np.int16)
                labels[is_geom] = geom_label[ids[is_geom]]
                out[name]["labels"], out[name]["label_names"] = labels, names
        return out

    def pose(self, kind: str, name: str) -> dict[str, Any]:
        """A site's or body's pose in the base frame (calibration checks: the URDF against the simulator)."""
        self._require_reset()
        objtype = {"site": self.mujoco.mjtObj.mjOBJ_SITE, "body": self.mujoco.mjtObj.mjOBJ_BODY}.get(kind)
        if objtype is None:
            raise ArgumentError(f"pose: kind must be 'site' or 'body', got {kind!r}")
        i = self.mujoco.mj_name2id(self.m, objtype, name)
        if i < 0:
            raise ArgumentError(f"pose: no {kind} named {name!r}")
        if kind == "site":
            p, r = self.d.site_xpos[i], self.d.site_xmat[i].reshape(3, 3)
        else:
            p, r = self.d.xpos[i], self.d.xmat[i].reshape(3, 3)
        p_base, r_base = self.base_pose()
        return {"position_m": r_base.T @ (p - p_base), "rotation": r_base.T @ r}

    def success(self) -> dict[str, Any]:
        """The benchmark's goal predicates on the current state (host success is all of them)."""
        self._require_reset()
        env = self.env.env
        goals = env.parsed_problem["goal_state"]
        held = [bool(env._eval_predicate(g)) for g in goals]
        return {"success": all(held), "goals": [list(g) for g in goals], "held": held}

    def privileged(self) -> dict[str, Any]:
        """TRAINING AND SCORING ONLY: object poses (base frame) and fixture joint positions."""
        self._require_reset()
        env, m, d = self.env.env, self.m, self.d
        p_base, r_base = self.base_pose()
        objects = {}
        for name in sorted(env.objects_dict):
            body = env.obj_body_id[name]
            objects[name] = {
                "position_m": r_base.T @ (d.xpos[body] - p_base),
                "quat_wxyz": _quat_wxyz(r_base.T @ d.xmat[body].reshape(3, 3)),
            }
        joints = {}
        for j in range(m.njnt):
            name = m.joint(j).name
            if m.jnt_type[j] in (2, 3) and not name.startswith(("robot0_", "gripper0_")):  # slide, hinge
                joints[name] = float(d.qpos[m.jnt_qposadr[j]])
        return {"time_s": float(d.time), "objects": objects, "fixture_joints": joints}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.env.close()


class Server:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.scene: LiberoScene | None = None

    def tasks(self, suite: str) -> list[dict[str, Any]]:
        from libero.libero import benchmark

        benchmarks = benchmark.get_benchmark_dict()
        if suite not in benchmarks:
            raise ArgumentError(f"unknown LIBERO suite {suite!r}; known: {', '.join(sorted(benchmarks))}")
        s = benchmarks[suite]()
        return [
            {"index": i, "name": s.get_task(i).name, "instruction": s.get_task(i).language}
            for i in range(s.get_num_tasks())
        ]

    def hello(self) -> dict[str, Any]:
        import libero
        import mujoco
        import robosuite

        return {
            "protocol": PROTOCOL_VERSION,
            "mujoco": mujoco.__version__,
            "robosuite": robosuite.__version__,
            "libero": getattr(libero, "__version__", "unknown"),
            "pid": os.getpid(),
        }

    def reset(self, suite: str, task_index: int, init_state: int) -> dict[str, Any]:
        key = (suite, int(task_index))
        if self.scene is None or (self.scene.suite_name, self.scene.task_index) != key:
            if self.scene is not None:
                self.scene.close()
                self.scene = None
            self.scene = LiberoScene(suite, int(task_index), self.width, self.height)
        return self.scene.reset(int(init_state))

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        served = {"hello": self.hello, "tasks": lambda: self.tasks(args["suite"])}
        if op == "reset":
            return self.reset(args["suite"], args["task_index"], args["init_state"])
        if op in served:
            return served[op]()
        scene = self.scene
        if scene is None:
            raise ArgumentError(f"'{op}' needs a scene: reset first")
        on_scene = {
            "state": scene.state,
            "step": lambda: scene.step(int(args.get("n", 1))),
            "follow": lambda: (
                scene.follow(args["joints"], args["times"], args["positions"], args.get("velocities")),
                scene.state(),
            )[1],
            "hold": lambda: (scene.hold(args["q"]), scene.state())[1],
            "gripper": lambda: scene.move_gripper(float(args["finger_m"]), float(args["duration_s"])),
            "capture": lambda: scene.capture(list(args["cameras"]), bool(args.get("segmentation", False))),
            "success": scene.success,
            "pose": lambda: scene.pose(args["kind"], args["name"]),
            "privileged": scene.privileged,
        }
        if op not in on_scene:
            raise ArgumentError(f"unknown operation {op!r}")
        return on_scene[op]()


def serve(conn: Connection, width: int, height: int) -> None:
    server = Server(width, height)
    try:
        while True:
            try:
                request = loads(conn.recv_bytes())
            except EOFError:
                return  # the client went away: nothing to keep running for
            op = request.pop("op", "")
            if op == "close":
                conn.send_bytes(dumps({"ok": True}))
                return
            try:
                reply = {"ok": server.handle(op, request)}
            except (ArgumentError, KeyError, TypeError, ValueError) as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}", "kind": "argument"}
            except Exception as exc:  # the simulator failed: infrastructure, reported with its traceback
                trace = traceback.format_exc(limit=6)
                reply = {"error": f"{type(exc).__name__}: {exc}\n{trace}", "kind": "backend"}
            conn.send_bytes(dumps(reply))
    finally:
        if server.scene is not None:
            server.scene.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fd", type=int, required=True, help="this server's end of the client's socket pair")
    parser.add_argument("--width", type=int, default=512, help="camera image width, px")
    parser.add_argument("--height", type=int, default=512, help="camera image height, px")
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    sock = socket.socket(fileno=args.fd)
    conn = Connection(sock.detach())
    t0 = time.monotonic()
    try:
        serve(conn, args.width, args.height)
    finally:
        conn.close()
    print(f"libero server: closed after {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

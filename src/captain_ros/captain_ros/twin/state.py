"""Named, read-only accessors of the twin's simulator state (dm_control style).

Task predicates and the privileged features read the scene only through this class, so they
can be tested on constructed states and cannot reach anything policy-facing.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from captain_ros.core import robot
from captain_ros.twin.objects import SceneObject, drawer_geometry


class SceneReader:
    def __init__(
        self,
        model: mujoco.MjModel,
        data: mujoco.MjData,
        objects: tuple[SceneObject, ...],
        profile: robot.RobotProfile | None = None,
    ):
        self.model, self.data = model, data
        self.profile = profile or robot.default_profile()
        self.objects = {o.name: o for o in objects}
        self._pad_ids = [model.body(b).id for b in self.profile.pad_links]
        self._tcp_site = model.site("tcp").id
        self._finger_qpos = {j: model.joint(j).qposadr[0] for j in self.profile.finger_joints}
        self._body_ids = {n: model.body(n).id for n in self.objects}
        self._drawer_body = {
            n: model.body(f"{n}_drawer_body").id for n, o in self.objects.items() if o.kind == "cabinet"
        }
        self._drawer_qpos = {n: model.joint(f"{n}_drawer").qposadr[0] for n in self._drawer_body}
        self._handle_site = {n: model.site(f"{n}_handle_site").id for n in self._drawer_body}

    # -- robot -----------------------------------------------------------------------------
    def tcp_position(self) -> np.ndarray:
        return self.data.site_xpos[self._tcp_site].copy()

    def tcp_speed(self) -> float:
        vel = np.zeros(6)
        mujoco.mj_objectVelocity(self.model, self.data, mujoco.mjtObj.mjOBJ_SITE, self._tcp_site, vel, 0)
        return float(np.linalg.norm(vel[3:]))

    def jaw_opening(self) -> float:
        return self.profile.jaw_opening_m({j: float(self.data.qpos[a]) for j, a in self._finger_qpos.items()})

    def jaw_commanded_closed(self) -> bool:
        return bool(self.data.ctrl[self.model.actuator("gripper_servo").id] < 0.01)

    # -- objects ---------------------------------------------------------------------------
    def position(self, name: str) -> np.ndarray:
        return self.data.xpos[self._body_ids[name]].copy()

    def rotation(self, name: str) -> np.ndarray:
        return self.data.xmat[self._body_ids[name]].reshape(3, 3).copy()

    def quaternion(self, name: str) -> np.ndarray:
        return self.data.xquat[self._body_ids[name]].copy()

    def in_object_frame(self, name: str, point: np.ndarray) -> np.ndarray:
        return self.rotation(name).T @ (np.asarray(point) - self.position(name))

    def bottom_z(self, name: str) -> float:
        """Lowest point of the object's bounding box (its frame is at the footprint centre)."""
        obj = self.objects[name]
        sx, sy, sz = obj.size_m
        corners = np.array([[x, y, z] for x in (-sx / 2, sx / 2) for y in (-sy / 2, sy / 2) for z in (0.0, sz)])
        return float((corners @ self.rotation(name).T + self.position(name))[:, 2].min())

    def tilt(self, name: str) -> float:
        """Angle between the object's up axis and the world's, radians."""
        return float(math.acos(np.clip(self.rotation(name)[2, 2], -1.0, 1.0)))

    def speed(self, name: str) -> float:
        vel = np.zeros(6)
        mujoco.mj_objectVelocity(self.model, self.data, mujoco.mjtObj.mjOBJ_BODY, self._body_ids[name], vel, 0)
        return float(np.linalg.norm(vel[3:]))

    @staticmethod
    def resting_height(support: SceneObject) -> float:
        """Height above the support's frame at which objects placed on it rest."""
        if support.kind == "plate":
            return support.size_m[2] * 0.6
        if support.kind in ("bowl", "box", "cup"):
            return support.wall_m
        return support.size_m[2]

    def pad_contacts(self, name: str) -> tuple[bool, bool]:
        """Whether the left and right finger pads touch the object (any of its bodies)."""
        target_bodies = {self._body_ids[name], *([self._drawer_body[name]] if name in self._drawer_body else [])}
        touching = [False, False]
        for c in self.data.contact[: self.data.ncon]:
            b1, b2 = self.model.geom_bodyid[c.geom1], self.model.geom_bodyid[c.geom2]
            for i, pad in enumerate(self._pad_ids):
                if (b1 == pad and b2 in target_bodies) or (b2 == pad and b1 in target_bodies):
                    touching[i] = True
        return touching[0], touching[1]

    def held(self, name: str) -> bool:
        left, right = self.pad_contacts(name)
        return left and right

    # -- articulated ---------------------------------------------------------------------------
    def drawer_position(self, cabinet: str) -> float:
        return float(self.data.qpos[self._drawer_qpos[cabinet]])

    def handle_position(self, cabinet: str) -> np.ndarray:
        return self.data.site_xpos[self._handle_site[cabinet]].copy()

    def tcp_to_handle(self, cabinet: str) -> float:
        return float(np.linalg.norm(self.tcp_position() - self.handle_position(cabinet)))

    def in_drawer(self, obj: str, cabinet: str, floor_tol_m: float) -> bool:
        geo = drawer_geometry(self.objects[cabinet])
        body = self._drawer_body[cabinet]
        rot = self.data.xmat[body].reshape(3, 3)
        local = rot.T @ (self.position(obj) - self.data.xpos[body])
        bottom_local = self.bottom_z(obj) - self.data.xpos[body][2]
        return (
            abs(local[0]) <= geo["half_x_m"]
            and abs(local[1]) <= geo["half_y_m"]
            and geo["floor_z_m"] - floor_tol_m <= bottom_local <= geo["rim_z_m"]
        )

    def drawer_interior_position(self, cabinet: str) -> np.ndarray:
        """World position of the centre of the drawer's floor."""
        geo = drawer_geometry(self.objects[cabinet])
        body = self._drawer_body[cabinet]
        return self.data.xpos[body] + self.data.xmat[body].reshape(3, 3) @ np.array([0.0, 0.0, geo["floor_z_m"]])

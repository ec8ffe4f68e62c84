"""The object library of the tabletop scene: coloured primitives and compound shapes.

Every movable object is a free body whose frame sits at the centre of its footprint on the
surface it rests on (so a resting object has z = support height). Compound shapes (bowl,
plate, cup, open box, drawer cabinet) are unions of primitive geoms, which MuJoCo collides
cheaply and exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mujoco
import numpy as np

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.80, 0.10, 0.10),
    "green": (0.10, 0.60, 0.20),
    "blue": (0.10, 0.25, 0.80),
    "yellow": (0.92, 0.80, 0.10),
    "orange": (0.95, 0.45, 0.05),
    "purple": (0.50, 0.15, 0.65),
    "white": (0.90, 0.90, 0.88),
    "black": (0.12, 0.12, 0.12),
    "brown": (0.50, 0.30, 0.15),
    "grey": (0.55, 0.55, 0.55),
}
KINDS = ("cube", "block", "bowl", "plate", "cup", "box", "cabinet")

# Object contact parameters. Objects use condim 3 (sliding friction) against the table and each
# other; the finger pads use condim 4, and MuJoCo takes the larger, so grasps get torsional friction.
OBJECT_FRICTION = (1.0, 0.01, 0.001)
OBJECT_CONDIM = 3


@dataclass(frozen=True)
class SceneObject:
    """One object of a scene. `size_m` is the full outer size (x, y, z) of its bounding box."""

    name: str
    kind: str
    color: str
    size_m: tuple[float, float, float]
    mass_kg: float = 0.1
    drawer_travel_m: float = 0.16  # cabinet only
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"object '{self.name}': unknown kind '{self.kind}' (known: {', '.join(KINDS)})")
        if self.color not in COLORS:
            raise ValueError(f"object '{self.name}': unknown colour '{self.color}' (known: {', '.join(COLORS)})")
        if len(self.size_m) != 3 or not all(math.isfinite(s) and 0.005 <= s <= 0.6 for s in self.size_m):
            raise ValueError(f"object '{self.name}': size_m must be three sizes in [0.005, 0.6] m, got {self.size_m}")
        if not (math.isfinite(self.mass_kg) and 0.001 <= self.mass_kg <= 5.0):
            raise ValueError(f"object '{self.name}': mass_kg must be in [0.001, 5] kg, got {self.mass_kg}")

    @property
    def movable(self) -> bool:
        return self.kind != "cabinet"

    @property
    def footprint_radius_m(self) -> float:
        return 0.5 * math.hypot(self.size_m[0], self.size_m[1])

    @property
    def height_m(self) -> float:
        return self.size_m[2]

    @property
    def wall_m(self) -> float:
        return 0.008

    def describe(self) -> str:
        """The words an instruction uses for this object ("red cube", "black bowl")."""
        return f"{self.color} {self.kind}"


def _rgba(color: str, alpha: float = 1.0) -> list[float]:
    return [*COLORS[color], alpha]


def _add_box(body: mujoco.MjsBody, name: str, half: tuple[float, float, float], pos, **kw) -> mujoco.MjsGeom:
    return body.add_geom(name=name, type=mujoco.mjtGeom.mjGEOM_BOX, size=[*half], pos=[*pos], **kw)


def _ring(
    body: mujoco.MjsBody, prefix: str, *, radius: float, z0: float, height: float, wall: float, segments: int, **kw
) -> None:
    """Vertical wall of a round vessel as `segments` boxes tangent to a circle."""
    seg_len = 2 * radius * math.tan(math.pi / segments) + 0.002
    for i in range(segments):
        a = 2 * math.pi * i / segments
        q = np.zeros(4)
        mujoco.mju_axisAngle2Quat(q, [0, 0, 1], a)
        body.add_geom(
            name=f"{prefix}_wall{i}",
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=[wall / 2, seg_len / 2, height / 2],
            pos=[radius * math.cos(a), radius * math.sin(a), z0 + height / 2],
            quat=q,
            **kw,
        )


def build_object(parent: mujoco.MjsBody, obj: SceneObject) -> mujoco.MjsBody:
    """Add `obj` under `parent` (the world body). Movable objects get a free joint."""
    body = parent.add_body(name=obj.name)
    if obj.movable:
        body.add_freejoint(name=f"{obj.name}_free")
    else:  # static furniture is posed per start state through mocap (data, not model)
        body.mocap = True
    rgba = _rgba(obj.color)
    contact = {"friction": list(OBJECT_FRICTION), "condim": OBJECT_CONDIM}
    sx, sy, sz = obj.size_m
    w = obj.wall_m
    if obj.kind in ("cube", "block"):
        _add_box(body, f"{obj.name}_geom", (sx / 2, sy / 2, sz / 2), (0, 0, sz / 2), rgba=rgba, **contact)
    elif obj.kind == "bowl":
        r = sx / 2
        body.add_geom(
            name=f"{obj.name}_base",
            type=mujoco.mjtGeom.mjGEOM_CYLINDER,
            size=[r * 0.6, w / 2, 0],
            pos=[0, 0, w / 2],
            rgba=rgba,
            **contact,
        )
        # a flared wall: a lower ring at 75% of the radius and an upper ring at full radius
        _ring(
            body, f"{obj.name}_low", radius=r * 0.78, z0=w, height=sz * 0.45, wall=w, segments=10, rgba=rgba, **contact
        )
        _ring(
            body,
            f"{obj.name}_up",
            radius=r - w / 2,
            z0=w + sz * 0.45,
            height=sz * 0.55 - w,
            wall=w,
            segments=14,
            rgba=rgba,
            **contact,
        )
    elif obj.kind == "plate":
        r = sx / 2
        body.add_geom(
            name=f"{obj.name}_base",
            type=mujoco.mjtGeom.mjGEOM_CYLINDER,
            size=[r, sz * 0.3, 0],
            pos=[0, 0, sz * 0.3],
            rgba=rgba,
            **contact,
        )
        _ring(
            body,
            f"{obj.name}_rim",
            radius=r - w / 2,
            z0=sz * 0.6,
            height=sz * 0.4,
            wall=w,
            segments=16,
            rgba=rgba,
            **contact,
        )
    elif obj.kind == "cup":
        r = sx / 2
        body.add_geom(
            name=f"{obj.name}_base",
            type=mujoco.mjtGeom.mjGEOM_CYLINDER,
            size=[r, w / 2, 0],
            pos=[0, 0, w / 2],
            rgba=rgba,
            **contact,
        )
        _ring(body, f"{obj.name}", radius=r - w / 2, z0=w, height=sz - w, wall=w, segments=10, rgba=rgba, **contact)
    elif obj.kind == "box":
        _add_box(body, f"{obj.name}_floor", (sx / 2, sy / 2, w / 2), (0, 0, w / 2), rgba=rgba, **contact)
        for i, sgn in enumerate((1, -1)):
            _add_box(
                body,
                f"{obj.name}_wallx{i}",
                (w / 2, sy / 2, sz / 2),
                (sgn * (sx - w) / 2, 0, sz / 2),
                rgba=rgba,
                **contact,
            )
            _add_box(
                body,
                f"{obj.name}_wally{i}",
                (sx / 2, w / 2, sz / 2),
                (0, sgn * (sy - w) / 2, sz / 2),
                rgba=rgba,
                **contact,
            )
    elif obj.kind == "cabinet":
        _build_cabinet(body, obj, rgba, contact)
    if obj.movable:
        _set_mass(body, obj.mass_kg)
    return body


def _geom_volume(geom: mujoco.MjsGeom) -> float:
    s = geom.size
    if geom.type == mujoco.mjtGeom.mjGEOM_BOX:
        return 8 * s[0] * s[1] * s[2]
    if geom.type == mujoco.mjtGeom.mjGEOM_CYLINDER:
        return math.pi * s[0] ** 2 * 2 * s[1]
    raise ValueError(f"no volume rule for geom type {geom.type}")


def _set_mass(body: mujoco.MjsBody, mass_kg: float) -> None:
    """Spread `mass_kg` over the body's geoms by volume (uniform density)."""
    geoms = body.geoms
    density = mass_kg / sum(_geom_volume(g) for g in geoms)
    for g in geoms:
        g.density = density


def _build_cabinet(body: mujoco.MjsBody, obj: SceneObject, rgba, contact: dict) -> None:
    """A static cabinet whose front faces -x (toward the robot) with one drawer at the top.

    The drawer slides out along -x by up to `drawer_travel_m`; its joint is `<name>_drawer`.
    """
    sx, sy, sz = obj.size_m
    w = 0.012
    shell = {**contact, "rgba": rgba}
    _add_box(body, f"{obj.name}_top", (sx / 2, sy / 2, w / 2), (0, 0, sz - w / 2), **_kw(shell))
    _add_box(body, f"{obj.name}_bottom", (sx / 2, sy / 2, w / 2), (0, 0, w / 2), **_kw(shell))
    _add_box(body, f"{obj.name}_back", (w / 2, sy / 2, sz / 2), (sx / 2 - w / 2, 0, sz / 2), **_kw(shell))
    for i, sgn in enumerate((1, -1)):
        _add_box(
            body, f"{obj.name}_side{i}", (sx / 2, w / 2, sz / 2), (0, sgn * (sy / 2 - w / 2), sz / 2), **_kw(shell)
        )
    drawer = body.add_body(name=f"{obj.name}_drawer_body", pos=[0, 0, 0])
    drawer.add_joint(
        name=f"{obj.name}_drawer",
        type=mujoco.mjtJoint.mjJNT_SLIDE,
        axis=[-1, 0, 0],
        range=[0.0, obj.drawer_travel_m],
        damping=[8.0, 0.0, 0.0],
        frictionloss=0.5,
        armature=0.05,
    )
    dx, dy = sx - 2 * w - 0.004, sy - 2 * w - 0.006
    dz0, dh = sz * 0.45, sz * 0.5 - w - 0.004
    inner = {**contact, "rgba": _rgba("white")}
    front = {**contact, "rgba": rgba}
    _add_box(drawer, f"{obj.name}_drawer_floor", (dx / 2, dy / 2, 0.004), (0, 0, dz0 + 0.004), **_kw(inner))
    _add_box(
        drawer,
        f"{obj.name}_drawer_front",
        (w / 2, sy / 2 - w - 0.003, dh / 2 + 0.004),
        (-sx / 2 + w / 2, 0, dz0 + dh / 2),
        **_kw(front),
    )
    _add_box(
        drawer, f"{obj.name}_drawer_back", (0.004, dy / 2, dh / 2), (dx / 2 - 0.004, 0, dz0 + dh / 2), **_kw(inner)
    )
    for i, sgn in enumerate((1, -1)):
        _add_box(
            drawer,
            f"{obj.name}_drawer_side{i}",
            (dx / 2, 0.004, dh / 2),
            (0, sgn * (dy / 2 - 0.004), dz0 + dh / 2),
            **_kw(inner),
        )
    # handle: a horizontal bar in front of the drawer face, on two standoffs
    hx = -sx / 2 - 0.03
    _add_box(
        drawer,
        f"{obj.name}_handle",
        (0.008, 0.05, 0.008),
        (hx, 0, dz0 + dh / 2),
        **_kw({**contact, "rgba": _rgba("grey")}),
    )
    for i, sgn in enumerate((1, -1)):
        _add_box(
            drawer,
            f"{obj.name}_handle_post{i}",
            (0.012, 0.005, 0.005),
            (hx + 0.016, sgn * 0.04, dz0 + dh / 2),
            **_kw({**contact, "rgba": _rgba("grey")}),
        )
    drawer.add_site(name=f"{obj.name}_handle_site", pos=[hx, 0, dz0 + dh / 2])
    drawer.add_site(name=f"{obj.name}_drawer_inside", pos=[0, 0, dz0 + 0.008])
    _set_mass(drawer, 0.5)


def _kw(d: dict) -> dict:
    return {k: v for k, v in d.items() if k in ("friction", "condim", "density", "rgba")}


def drawer_geometry(obj: SceneObject) -> dict[str, float]:
    """Interior of a cabinet's drawer in the cabinet frame (closed drawer), for predicates."""
    sx, sy, sz = obj.size_m
    w = 0.012
    dx, dy = sx - 2 * w - 0.004, sy - 2 * w - 0.006
    return {
        "floor_z_m": sz * 0.45 + 0.008,
        "rim_z_m": sz * 0.45 + sz * 0.5 - w - 0.004,
        "half_x_m": dx / 2 - 0.008,
        "half_y_m": dy / 2 - 0.008,
        "handle_x_m": -sx / 2 - 0.03,
        "handle_z_m": sz * 0.45 + (sz * 0.5 - w - 0.004) / 2,
    }

"""The shadow twin: every physical action is first played in a MuJoCo twin built only from what the robot measured,
and refused when the twin predicts harm; after the action, the prediction is kept beside what happened.

What the shadow knows is what a real robot can provide: its joint positions and jaw opening (the backend's state),
the table plane (the twin's table top is the robot's z = 0, where perception fits the table), and every object
perception has measured this episode (`measure_object_geometry`: centre, extents, yaw, bottom height, shape), each
as a primitive body of the measured size with a mass from its volume. It never reads a simulator's state: on the twin
itself the shadow is a second Twin, built from the harness's own measurements.

The check runs the same capability with the same arguments on a harness over the shadow twin (the same planner,
guarded-motion executor and jaw logic) from the measured state, and watches every contact the robot makes. It
refuses (SAFETY_STOP, nothing moves) when the twin predicts
  - a contact of an arm link the wrist force/torque sensor cannot feel (the links before the hand): a collision the
    plan did not ask for, which a guarded motion would not stop;
  - a force over the call's force limit, at the wrist sensor or in any contact of the robot (a guard that cannot
    stop in time: an impact at speed);
  - a measured object pushed off the table (its centre beyond the workspace's x-y box, or fallen below the table).
Contacts already there when the action starts (the hand resting on what it touched) are not new collisions.

Limits, by construction: an object never measured is not in the shadow (the check is as good as the scene the
policy measured); an object in the hand is dropped from the shadow when the jaw reports holding it; a measured box
the arm stands in (a cabinet's box around the handle the hand holds: a box is coarser than its object) is left out of
that check, and the prediction says so; a measurement goes stale when something moves it until it is measured again.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from captain_ros.core.config import HarnessConfig
from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.harness.twin_backend import TwinBackend

if TYPE_CHECKING:
    from captain_ros.harness.backend import ArmState

SETTLE_S = 0.1  # the shadow scene settles this long, the arm held, before the action is played
OVERLAP_M = 0.003  # a measured box the arm stands in deeper than this is coarser than its object: left out
FALLEN_Z_M = -0.02  # an object's centre below this has fallen off the table
SOLID_KINDS = {"bowl": "bowl", "plate": "plate", "cup": "cup", "box": "box"}  # measured kind -> twin kind; else block
SIZE_M = (0.005, 0.6)  # the twin's object size bounds
MASS_KG = (0.02, 5.0)
KINEMATICS_SAMPLES = 16  # random configurations a shadow_twin's kinematics are checked at


class ShadowError(ValueError):
    """A measurement the shadow cannot use (the message says which field)."""


@dataclass(frozen=True)
class Measured:
    """One measured object as the shadow places it: a primitive of the measured size, bottom at the measured height."""

    name: str  # the detection id it was measured as
    kind: str  # the twin's object kind
    size_m: tuple[float, float, float]  # long side, short side, height
    pose: tuple[float, float, float, float]  # x, y, z of its bottom, yaw (rad), robot base frame

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> Measured:
        """From a `measure_object_geometry` value (or its `destination`); ShadowError for anything not finite."""
        try:
            centre = np.asarray(value["center_m"], dtype=float)
            extents = np.asarray(value["extents_m"], dtype=float)
            yaw = math.radians(float(value["yaw_deg"]))
            bottom = float(value["bottom_z_m"])
            name = str(value.get("object") or value.get("detection_id") or "")
            kind = SOLID_KINDS.get(str(value.get("kind", "")), "block")
        except (KeyError, TypeError, ValueError) as exc:
            raise ShadowError(f"not an object measurement: {type(exc).__name__}: {exc}") from None
        if centre.shape != (3,) or extents.shape != (3,) or not name:
            raise ShadowError("an object measurement needs a detection id, a 3-d centre and 3 extents")
        if not (np.isfinite(centre).all() and np.isfinite(extents).all() and math.isfinite(yaw + bottom)):
            raise ShadowError(f"measurement of {name} is not finite")
        size = tuple(float(np.clip(e, *SIZE_M)) for e in extents)
        return cls(name, kind, size, (float(centre[0]), float(centre[1]), max(bottom, 0.0), yaw))

    def covers(self, xy: np.ndarray, margin_m: float = 0.0) -> bool:
        """Whether a point of the table plane lies within this object's footprint (grown by `margin_m`)."""
        c, s = math.cos(self.pose[3]), math.sin(self.pose[3])
        d = np.asarray(xy, dtype=float)[:2] - np.array(self.pose[:2])
        local = np.array([c * d[0] + s * d[1], -s * d[0] + c * d[1]])
        return bool(np.all(np.abs(local) <= np.array(self.size_m[:2]) / 2 + margin_m))


@dataclass
class Prediction:
    """What the shadow twin predicts for one action, and whether it refuses it (`refusal` non-empty)."""

    capability: str
    outcome: str  # a motion's stop reason; a jaw command's holding / not_holding; or the failure category
    executed_distance_m: float | None = None
    peak_force_n: float | None = None  # as the wrist sensor reports it (the receipt's peak)
    jaw_after_m: float | None = None
    peak_contact_n: float = 0.0  # the largest contact force between the robot and anything, any link
    contacts: dict[str, float] = field(default_factory=dict)  # "link ~ object" -> peak N, new during the action
    arm_contacts: list[str] = field(default_factory=list)  # those of links the wrist sensor cannot feel
    pushed_off: list[str] = field(default_factory=list)
    objects: int = 0  # measured objects in the shadow scene
    left_out: list[str] = field(default_factory=list)  # measured boxes the arm stood in: left out of this check
    check_ms: float = 0.0
    simulated_s: float = 0.0  # the shadow twin's time the check played (settling, then the action)
    refusal: str = ""

    def as_value(self) -> dict[str, Any]:
        value = {
            "outcome": self.outcome,
            "executed_distance_m": _round(self.executed_distance_m),
            "peak_force_n": _round(self.peak_force_n, 2),
            "jaw_after_m": _round(self.jaw_after_m),
            "peak_contact_n": round(self.peak_contact_n, 2),
            "contacts": {k: round(v, 2) for k, v in self.contacts.items()},
            "objects": self.objects,
            "check_ms": round(self.check_ms, 1),
            "simulated_s": round(self.simulated_s, 3),
        }
        if self.pushed_off:
            value["pushed_off"] = list(self.pushed_off)
        if self.left_out:
            value["left_out"] = list(self.left_out)
        if self.refusal:
            value["refusal"] = self.refusal
        return value

    def summary(self) -> str:
        """A few words for the receipt: the predicted outcome, distance and force."""
        parts = [self.outcome]
        if self.executed_distance_m is not None:
            parts.append(f"{self.executed_distance_m * 100:.1f} cm")
        if self.peak_force_n is not None:
            parts.append(f"peak {self.peak_force_n:.1f} N")
        if self.jaw_after_m is not None:
            parts.append(f"jaw {self.jaw_after_m * 1000:.0f} mm")
        return " ".join(parts)


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def outcome_of(result: CallResult) -> dict[str, Any]:
    """The comparable part of a call's result: the same fields a Prediction carries."""
    value = result.value if isinstance(result.value, dict) else {}
    if "stop_reason" in value:
        outcome = str(value["stop_reason"])
    elif "holding_object" in value and result.success:
        outcome = "holding" if value["holding_object"] else "not_holding"
    else:
        outcome = result.failure_category.value if not result.success else "done"
    return {
        "outcome": outcome,
        "executed_distance_m": value.get("executed_distance_m"),
        "peak_force_n": value.get("peak_force_n"),
        "jaw_after_m": value.get("jaw_after_m"),
    }


class Witness:
    """Watches one twin while an action runs there: the peak force of every contact between a robot link and anything
    else (MuJoCo's contact forces, after every control period), and the objects that leave the table. Its verdict on
    the action is a Prediction, refusal included. The shadow watches its own twin; bench/shadow.py watches the "real"
    twin with one to score the outcome (ground truth, never in the check's path)."""

    def __init__(self, twin: Any, safety: Any):
        model = twin.model
        self.twin, self.safety = twin, safety
        self.objects = [o.name for o in twin.task.objects]
        object_ids = {model.body(n).id for n in self.objects}
        hand = model.body(twin.profile.hand_frame).id
        self.kind = np.zeros(model.nbody, dtype=int)  # 0: world (table, floor), 1: object, 2: arm link, 3: hand side
        for b in range(1, model.nbody):
            if b in object_ids:
                self.kind[b] = 1
                continue
            a = b  # on the hand's side of the wrist sensor when the hand is among its ancestors
            while a not in (0, hand):
                a = model.body_parentid[a]
            self.kind[b] = 3 if a == hand else 2
        self.names = ["table", *(model.body(b).name for b in range(1, model.nbody))]
        self.peaks: dict[tuple[int, int], float] = {}
        self._already: set[tuple[int, int]] = set()
        self._inside: set[str] = set()
        self._force = np.zeros(6)

    def scan(self) -> None:
        """Record the contacts of this instant (called after every control period)."""
        model, data = self.twin.model, self.twin.data
        n = data.ncon
        if n == 0:
            return
        bodies = model.geom_bodyid
        g1, g2 = data.contact.geom1[:n], data.contact.geom2[:n]
        for i in np.flatnonzero((self.kind[bodies[g1]] >= 2) != (self.kind[bodies[g2]] >= 2)):
            b1, b2 = int(bodies[g1[i]]), int(bodies[g2[i]])
            key = (b1, b2) if self.kind[b1] >= 2 else (b2, b1)
            mujoco.mj_contactForce(model, data, int(i), self._force)
            self.peaks[key] = max(self.peaks.get(key, 0.0), float(abs(self._force[0])))

    def overlapping(self, depth_m: float) -> list[str]:
        """Objects the robot penetrates deeper than `depth_m` in the current state (after a forward pass)."""
        model, data = self.twin.model, self.twin.data
        deep = set()
        for i in range(data.ncon):
            c = data.contact[i]
            kinds = self.kind[model.geom_bodyid[[c.geom1, c.geom2]]]
            if c.dist < -depth_m and 1 in kinds and kinds.max() >= 2:
                body = model.geom_bodyid[c.geom1 if kinds[0] == 1 else c.geom2]
                deep.add(self.names[body])
        return sorted(deep)

    def begin(self) -> None:
        """The action starts: contacts there now are not new collisions; objects on the table now must stay."""
        self._already = set(self.peaks)
        self.peaks = {}
        self.scan()
        self._already |= set(self.peaks)
        self._inside = {n for n in self.objects if not self._off_table(n)}

    def _off_table(self, name: str) -> bool:
        """An object whose centre has left the workspace's x-y box or fallen below the table top."""
        lo, hi = self.safety.workspace_min_m, self.safety.workspace_max_m
        p = self.twin.data.xpos[self.twin.model.body(name).id]
        return bool(p[2] < FALLEN_Z_M or np.any(p[:2] < lo[:2]) or np.any(p[:2] > hi[:2]))

    def verdict(self, result: CallResult, force_limit_n: float) -> Prediction:
        """The action's outcome as this twin saw it, and what about it calls for a refusal ("" when nothing)."""
        seen = outcome_of(result)
        p = Prediction(
            result.capability, seen["outcome"], seen["executed_distance_m"], seen["peak_force_n"], seen["jaw_after_m"]
        )
        label = lambda k: f"{self.names[k[0]]} ~ {self.names[k[1]]}"  # noqa: E731 - a one-line name
        new = {k: f for k, f in self.peaks.items() if k not in self._already}
        arm = {k: f for k, f in new.items() if self.kind[k[0]] == 2}
        p.peak_contact_n = max(self.peaks.values(), default=0.0)
        p.contacts = {label(k): f for k, f in sorted(new.items(), key=lambda kv: -kv[1])}
        p.arm_contacts = [label(k) for k in arm]
        p.pushed_off = [n for n in sorted(self._inside) if self._off_table(n)]
        force = max(p.peak_contact_n, p.peak_force_n or 0.0)
        if result.failure_category is FailureCategory.BACKEND_ERROR:
            p.refusal = f"the twin failed while playing it: {result.message}"
        elif arm:
            worst = max(arm, key=arm.get)
            p.refusal = (
                f"{label(worst)} touching ({arm[worst]:.1f} N): a collision of an arm link, which the wrist force "
                "sensor cannot feel"
            )
        elif force > force_limit_n:
            p.refusal = f"a force of {force:.1f} N, over the {force_limit_n:.0f} N limit"
        elif p.pushed_off:
            p.refusal = f"{', '.join(p.pushed_off)} pushed off the table"
        return p


class WatchedBackend(TwinBackend):
    """A twin backend whose witness sees every physics step (an impact lasts one: a scan per control period of a
    real arm's 10 ms would miss it)."""

    def __init__(self, twin: Any, witness: Witness, control_period_s: float):
        super().__init__(twin, control_period_s)
        self.witness = witness
        self.on_physics_step = witness.scan


def force_limit(safety: Any, kwargs: dict[str, Any]) -> float:
    """The force limit of a call: its force_limit_n when it gives one below the safety limit."""
    limit = float(safety.force_limit_n)
    given = kwargs.get("force_limit_n")
    if isinstance(given, int | float) and not isinstance(given, bool) and math.isfinite(given):
        limit = min(limit, float(given))
    return limit


def shadow_profile(profile: Any) -> Any:
    """The robot profile whose twin stands in for the arm: its own when it has a twin section, else the twin profile
    its `shadow_twin` names, which must put the TCP where the arm's own kinematics do for the same joints (checked at
    home and at KINEMATICS_SAMPLES random configurations, within 2 mm and 1 degree). ShadowError otherwise."""
    from captain_ros.core.kinematics import Kinematics
    from captain_ros.core.robot import ProfileError, load_profile

    if profile.twin is not None:
        return profile
    if not profile.shadow_twin:
        raise ShadowError(
            f"robot profile '{profile.name}' has no twin section and names no shadow_twin: there is no twin to play "
            "its actions in (give the profile a shadow_twin with the arm's kinematics, or turn the shadow check off)"
        )
    try:
        twin = load_profile(profile.shadow_twin)
    except ProfileError as exc:
        raise ShadowError(f"robot profile '{profile.name}': shadow_twin: {exc}") from None
    if twin.twin is None or twin.dof != profile.dof:
        raise ShadowError(f"shadow_twin '{twin.name}' must be a twin profile with {profile.dof} arm joints")
    ours, theirs = Kinematics(profile=profile), Kinematics(profile=twin)
    (lo0, hi0), (lo1, hi1) = profile.arm_limits_rad(), twin.arm_limits_rad()
    lower, upper = np.maximum(lo0, lo1), np.minimum(hi0, hi1)  # where both arms can go
    rng = np.random.default_rng(0)
    for q in [profile.home_q, *rng.uniform(lower, upper, size=(KINEMATICS_SAMPLES, profile.dof))]:
        (p0, r0), (p1, r1) = ours.forward(q), theirs.forward(q)
        angle = math.degrees(math.acos(float(np.clip((np.trace(r0.T @ r1) - 1) / 2, -1.0, 1.0))))
        if np.linalg.norm(p0 - p1) > 0.002 or angle > 1.0:
            raise ShadowError(
                f"shadow_twin '{twin.name}' does not move like '{profile.name}': at joints {np.round(q, 3).tolist()} "
                f"its TCP is {np.linalg.norm(p0 - p1) * 1000:.1f} mm and {angle:.1f} deg away"
            )
    return twin


class ShadowTwin:
    """The shadow of one real-arm harness: its measurements, a twin built from them, and a harness over that twin."""

    def __init__(self, harness: Any):
        """`harness`: the real arm's Harness (its robot profile, configuration and kinematics; read, never changed)."""
        from captain_ros.core.kinematics import Kinematics

        self.real = harness
        self.profile = shadow_profile(harness.profile)
        self.kin = harness.kin if self.profile is harness.profile else Kinematics(profile=self.profile)
        self.config: HarnessConfig = replace(harness.config, shadow=replace(harness.config.shadow, enabled=False))
        self.measured: dict[str, Measured] = {}  # detection id -> measurement, oldest first
        self._built: tuple | None = None  # (the measurements it was built from, twin, backend, harness)
        self._collision: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))  # the built twin's geom flags

    # ------------------------------------------------------------------------------------------ measurements
    def reset(self) -> None:
        """A new episode: nothing measured yet."""
        self.measured = {}

    def note(self, capability: str, value: Any) -> None:
        """Learn from a call's result: object measurements, and objects taken into the hand."""
        if not isinstance(value, dict):
            return
        if capability == "measure_object_geometry":
            for part in (value, value.get("destination")):
                if isinstance(part, dict) and "center_m" in part:
                    self.add(Measured.from_value(part))
        elif value.get("holding_object") and "tcp_position_m" in value:
            tcp = np.asarray(value["tcp_position_m"], dtype=float)
            for name in [n for n, m in self.measured.items() if m.covers(tcp, margin_m=0.02)]:
                del self.measured[name]  # in the hand now: it moves with it, and its measurement is stale

    def add(self, m: Measured) -> None:
        """Keep a measurement; one centred on a kept object's footprint (within `same_object_m`) replaces it."""
        same = self.config.shadow.same_object_m
        xy = np.array(m.pose[:2])
        for name in [n for n, k in self.measured.items() if k.covers(xy, same) or m.covers(np.array(k.pose[:2]), same)]:
            del self.measured[name]
        self.measured[m.name] = m
        while len(self.measured) > self.config.shadow.max_objects:
            del self.measured[next(iter(self.measured))]

    # ------------------------------------------------------------------------------------------ the twin
    def _scene(self):
        """The shadow twin of the current measurements (built again only when they changed)."""
        from captain_ros.twin.objects import SceneObject
        from captain_ros.twin.sim import Twin
        from captain_ros.twin.tasks import TaskSpec

        key = tuple(self.measured.values())
        if self._built is not None and self._built[0] == key:
            return self._built[1:]
        if self._built is not None:
            self._built[1].close()
        density = self.config.shadow.object_density_kgpm3
        objects = tuple(
            SceneObject(m.name, m.kind, "grey", m.size_m, float(np.clip(density * np.prod(m.size_m), *MASS_KG)))
            for m in key
        )
        task = TaskSpec("shadow", "shadow", "", objects, (), {o.name: (0.0, 0.0, 0.0) for o in objects})
        twin = Twin(task, profile=self.profile)
        # the real harness's own period (a real arm's joint-state period): the shadow's harness monitors as it does
        period = self.real.backend.control_period_s
        backend = WatchedBackend(twin, Witness(twin, self.config.safety), period)
        self._collision = (twin.model.geom_contype.copy(), twin.model.geom_conaffinity.copy())
        # a harness of the real one's own class: this module imports nothing of harness.py (which imports it)
        self._built = (key, twin, backend, type(self.real)(backend, self.config, self.kin))
        return self._built[1:]

    def predict(self, capability: str, kwargs: dict[str, Any], state: ArmState) -> Prediction:
        """Play `capability(**kwargs)` in the shadow twin from the measured state; the prediction says whether to
        refuse it. Never raises: a shadow that cannot play the action refuses it (the arm holds)."""
        t0 = time.perf_counter()
        try:
            prediction = self._predict(capability, kwargs, state)
        except Exception as exc:  # a shadow that cannot predict must not let the arm move unchecked
            prediction = Prediction(
                capability,
                FailureCategory.BACKEND_ERROR.value,
                objects=len(self.measured),
                refusal=f"the shadow twin could not play it ({type(exc).__name__}: {exc})",
            )
        prediction.check_ms = 1e3 * (time.perf_counter() - t0)
        return prediction

    def _predict(self, capability: str, kwargs: dict[str, Any], state: ArmState) -> Prediction:
        twin, backend, harness = self._scene()
        twin.place(state.q_rad, state.jaw_opening_m, {m.name: m.pose for m in self.measured.values()})
        placed_s = twin.time_s
        ghosts = self._ghost(twin, backend.witness.overlapping(OVERLAP_M))
        backend.resync()  # the controllers hold the arm and jaw where they were placed
        backend.set_force_reflex(0.0)  # the scene settling is no motion: each motion arms the reflex itself
        for _ in range(round(SETTLE_S / backend.control_period_s)):
            backend.wait_period()
        backend.witness.begin()
        harness.new_episode(self.real.episode_id)
        harness.motions = list(self.real.motions)  # recover() reverses the real arm's last motion
        harness.jaw_command_m = self.real.jaw_command_m
        prediction = backend.witness.verdict(
            harness.call(capability, **kwargs), force_limit(self.config.safety, kwargs)
        )
        prediction.objects, prediction.left_out = len(self.measured) - len(ghosts), ghosts
        prediction.simulated_s = twin.time_s - placed_s
        if prediction.refusal and prediction.outcome != FailureCategory.BACKEND_ERROR.value:
            prediction.refusal = f"the twin predicts {prediction.refusal}"
        return prediction

    def _ghost(self, twin: Any, names: list[str]) -> list[str]:
        """Leave `names` out of this check (no contacts, no weight) and every other object in; the arm stands where
        the real arm stands, so a measured box it is inside is coarser than its object (a cabinet's box around the
        handle the hand holds), and would only push the arm away."""
        model = twin.model
        contype, conaffinity = self._collision
        model.geom_contype[:], model.geom_conaffinity[:] = contype, conaffinity
        for name in names:
            geoms = model.geom_bodyid == model.body(name).id
            model.geom_contype[geoms] = model.geom_conaffinity[geoms] = 0
            model.body_gravcomp[model.body(name).id] = 1.0
        for name in set(self.measured) - set(names):
            model.body_gravcomp[model.body(name).id] = 0.0
        mujoco.mj_forward(model, twin.data)
        return names

    def close(self) -> None:
        if self._built is not None:
            self._built[1].close()
            self._built = None

"""Self-collision of a robot description, checked by FCL (python-fcl) on the description's own collision geometry.

Every `<collision>` of every link is used: boxes, cylinders, spheres and meshes. Vendors' descriptions (Franka's,
UR's) give meshes only, by `package://` URIs that a ROS install resolves through its ament prefixes: resolved the
same way here (`resolve_uri`), loaded by trimesh, checked as FCL's bounding-volume hierarchies of their triangles.

Pairs that are not checked, as MoveIt's planning scene does not check them:
- a link and its nearest ancestor with geometry ("Adjacent": links between them without geometry, such as Franka's
  `fr3_link8` flange frame, are passed through), and two finger pads (they close onto each other);
- every `<disable_collisions>` pair of the robot's SRDF, where one is given (MoveIt Setup Assistant's output:
  pairs that never collide, or always do);
- without an SRDF, pairs already in contact at the profile's home pose (Setup Assistant's "Default" rule: Franka's
  SRDF lists panda_hand/panda_link5 as one): a check that reported them would refuse every motion.

Geometry that cannot be used (a mesh that does not resolve here, a malformed shape) and a description with fewer
than two links of geometry are `coverage_problems()`: the motion node refuses such a description unless the
operator waives the check by name.
"""

from __future__ import annotations

import itertools
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import fcl
import numpy as np
from scipy.spatial.transform import Rotation


class CollisionError(ValueError):
    """A description or SRDF that cannot be read."""


def package_prefixes() -> list[Path]:
    """Where `package://` URIs are looked for: each AMENT_PREFIX_PATH entry's `share/`, in order (where ROS 2's
    ament index puts a package), then ROS_PACKAGE_PATH's folders (ROS 1's variable: a package folder or its parent)."""
    out = [Path(p) / "share" for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    for p in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep):
        if p:
            out += [Path(p), Path(p).parent]
    return out


def resolve_uri(uri: str) -> Path | None:
    """The file a URDF mesh `filename` names (`package://pkg/path`, `file:///path`, or a path), or None."""
    parsed = urlparse(uri)
    if parsed.scheme == "package":
        rel = unquote(parsed.path).lstrip("/")
        for prefix in package_prefixes():
            path = prefix / parsed.netloc / rel
            if path.is_file():
                return path
        return None
    path = Path(unquote(parsed.path) if parsed.scheme == "file" else uri)
    return path if path.is_file() else None


def _origin(element: ET.Element | None) -> np.ndarray:
    """The 4x4 transform of a URDF <origin> (identity where absent): xyz, then rpy about the fixed x, y, z axes."""
    t = np.eye(4)
    if element is not None:
        t[:3, :3] = Rotation.from_euler("xyz", [float(v) for v in element.get("rpy", "0 0 0").split()]).as_matrix()
        t[:3, 3] = [float(v) for v in element.get("xyz", "0 0 0").split()]
    return t


def _mesh_geometry(shape: ET.Element) -> tuple[fcl.BVHModel | None, str]:
    """A <mesh>'s triangles (at its scale) as FCL's bounding-volume hierarchy, or None and why not."""
    import trimesh

    uri = shape.get("filename", "")
    path = resolve_uri(uri)
    if path is None:
        return None, f"mesh {uri} is not found (package:// is looked up under AMENT_PREFIX_PATH's share/)"
    try:
        mesh = trimesh.load(path, force="mesh", process=False)
        vertices = np.asarray(mesh.vertices, dtype=float) * [float(v) for v in shape.get("scale", "1 1 1").split()]
        faces = np.asarray(mesh.faces, dtype=np.int64)
    except Exception as exc:  # trimesh raises many types for broken files
        return None, f"mesh {path} cannot be loaded: {exc}"
    if len(faces) == 0:
        return None, f"mesh {path} has no triangles"
    model = fcl.BVHModel()
    model.beginModel(len(vertices), len(faces))
    model.addSubModel(vertices, faces)
    model.endModel()
    return model, ""


PRIMITIVES = {  # URDF primitive -> its FCL shape (FCL's cylinder, like URDF's, is centred on its z axis)
    "box": lambda e: fcl.Box(*(float(v) for v in e.get("size").split())),
    "cylinder": lambda e: fcl.Cylinder(float(e.get("radius")), float(e.get("length"))),
    "sphere": lambda e: fcl.Sphere(float(e.get("radius"))),
}


def _geometry(element: ET.Element) -> tuple[fcl.CollisionGeometry | None, str]:
    """FCL geometry of a <geometry> element, or None and why not."""
    shape = next(iter(element), None)
    if shape is None:
        return None, "an empty <geometry>"
    if shape.tag in PRIMITIVES:
        try:
            return PRIMITIVES[shape.tag](shape), ""
        except (AttributeError, TypeError, ValueError) as exc:
            return None, f"<{shape.tag} {shape.attrib}> is malformed: {exc}"
    if shape.tag == "mesh":
        return _mesh_geometry(shape)
    return None, f"<{shape.tag}> is not a URDF geometry"


@dataclass
class _Part:
    offset: np.ndarray  # the collision origin in the link frame (4x4)
    obj: fcl.CollisionObject


@dataclass
class SelfCollisionModel:
    """A description's collision geometry and the pairs of links to check (see the module's docstring)."""

    parts: dict[str, list[_Part]]  # link -> its collision parts
    pairs: list[tuple[str, str]]  # checked link pairs, sorted names
    disabled: dict[tuple[str, str], str]  # unchecked pair -> why (Adjacent, SRDF reason, pads, Default at home)
    problems: list[str] = field(default_factory=list)  # geometry that could not be used, one line each

    @classmethod
    def from_urdf(
        cls,
        urdf_text: str,
        *,
        srdf_text: str = "",
        pad_links: tuple[str, ...] = (),
    ) -> SelfCollisionModel:
        try:
            root = ET.fromstring(urdf_text)
        except ET.ParseError as exc:
            raise CollisionError(f"the URDF is not XML: {exc}") from exc
        parts: dict[str, list[_Part]] = {}
        problems: list[str] = []
        for link in root.iter("link"):
            name = link.get("name", "")
            for k, col in enumerate(link.findall("collision")):
                geometry = col.find("geometry")
                geom, why = (None, "no <geometry>") if geometry is None else _geometry(geometry)
                if geom is None:
                    problems.append(f"link {name}, collision {k}: {why}")
                    continue
                parts.setdefault(name, []).append(_Part(_origin(col.find("origin")), fcl.CollisionObject(geom)))
        parent = {j.find("child").get("link"): j.find("parent").get("link") for j in root.iter("joint")}
        disabled: dict[tuple[str, str], str] = {}
        for link in parts:  # Adjacent: the nearest ancestor with geometry
            up = parent.get(link)
            while up is not None and up not in parts:
                up = parent.get(up)
            if up is not None:
                disabled[_pair(link, up)] = "Adjacent"
        if len(pad_links) == 2:
            disabled[_pair(*pad_links)] = "finger pads"
        disabled.update(srdf_disabled_pairs(srdf_text) if srdf_text else {})
        pairs = [p for p in itertools.combinations(sorted(parts), 2) if p not in disabled]
        return cls(parts=parts, pairs=pairs, disabled=disabled, problems=problems)

    def coverage_problems(self) -> list[str]:
        """Why this check cannot be trusted on its description ([] = it can): geometry that did not load leaves its
        link unchecked, and with fewer than two links with geometry there is nothing to check."""
        out = list(self.problems)
        if len(self.parts) < 2:
            out.append(f"{len(self.parts)} link(s) have collision geometry: there is nothing to check")
        return out

    def disable_touching(self, link_poses: dict[str, np.ndarray], reason: str) -> None:
        """Stop checking the pairs in contact at these link poses (4x4 each), for `reason`."""
        for pair in self.collisions(link_poses):
            self.disabled[pair] = reason
        self.pairs = [p for p in self.pairs if p not in self.disabled]

    def collisions(self, link_poses: dict[str, np.ndarray]) -> list[tuple[str, str]]:
        """Checked pairs whose geometry overlaps at these link poses (link -> 4x4 in any one frame), sorted."""
        for link, parts in self.parts.items():
            pose = link_poses[link]
            for part in parts:
                t = pose @ part.offset
                part.obj.setTransform(fcl.Transform(t[:3, :3], t[:3, 3]))
        request, out = fcl.CollisionRequest(), []
        for a, b in self.pairs:
            objects = itertools.product((p.obj for p in self.parts[a]), (p.obj for p in self.parts[b]))
            if any(fcl.collide(oa, ob, request, fcl.CollisionResult()) for oa, ob in objects):
                out.append((a, b))
        return out


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def srdf_disabled_pairs(srdf_text: str) -> dict[tuple[str, str], str]:
    """The `<disable_collisions link1 link2 reason>` pairs of an SRDF."""
    try:
        root = ET.fromstring(srdf_text)
    except ET.ParseError as exc:
        raise CollisionError(f"the SRDF is not XML: {exc}") from exc
    out = {}
    for element in root.iter("disable_collisions"):
        a, b = element.get("link1"), element.get("link2")
        if not (a and b):
            raise CollisionError(f"an SRDF <disable_collisions> needs link1 and link2, got {element.attrib}")
        out[_pair(a, b)] = f"SRDF: {element.get('reason', 'disabled')}"
    return out

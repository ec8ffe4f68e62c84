"""core/collision.py: FCL self-collision on a description's own geometry, primitives and vendor meshes.

The mesh cases use Franka's Panda description as example-robot-data ships it on PyPI (URDF with package:// collision
STLs, and MoveIt's SRDF), found the way a ROS install finds it: through AMENT_PREFIX_PATH.
"""

from __future__ import annotations

import importlib.metadata
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import mujoco
import numpy as np
import pytest
import trimesh
from scipy.spatial.transform import Rotation

from captain_ros.core import robot
from captain_ros.core.collision import SelfCollisionModel, _origin, resolve_uri, srdf_disabled_pairs
from captain_ros.core.kinematics import PLACEHOLDER_INERTIA_KGM2, PLACEHOLDER_MASS_KG, Kinematics

DATA = Path(__file__).with_name("data")
PREFIX = Path(importlib.metadata.distribution("example-robot-data").locate_file("cmeel.prefix"))
PANDA = PREFIX / "share" / "example-robot-data" / "robots" / "panda_description"


@pytest.fixture
def ament(monkeypatch):
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(PREFIX))


def mesh_profile(srdf: bool = True) -> robot.RobotProfile:
    profile = robot.load_profile(DATA / "panda_franka_meshes.yaml")
    profile = profile.with_urdf_text((PANDA / "urdf" / "panda.urdf").read_text())
    return profile if srdf else replace(profile, srdf_file="", srdf_text="")


def mujoco_contacts(profile: robot.RobotProfile, kin: Kinematics, q: np.ndarray) -> list[tuple[str, str]]:
    """The same check by MuJoCo's own collision detection on the same primitive geometry (parents and children
    excluded, the two pads excluded): an independent library to agree with."""
    spec = mujoco.MjSpec.from_string(profile.urdf_text)
    spec.compiler.fusestatic = False
    spec.compiler.boundmass, spec.compiler.boundinertia = PLACEHOLDER_MASS_KG, PLACEHOLDER_INERTIA_KGM2
    spec.add_exclude(bodyname1=profile.pad_links[0], bodyname2=profile.pad_links[1])
    model = spec.compile()
    data = mujoco.MjData(model)
    kin.link_poses(q)  # places the fingers (and their mimics) in kin.data: the same joint vector for both
    data.qpos[:] = kin.data.qpos
    mujoco.mj_kinematics(model, data)
    mujoco.mj_collision(model, data)
    names = [model.body(b).name for b in model.geom_bodyid]
    return sorted({tuple(sorted((names[c.geom1], names[c.geom2]))) for c in data.contact[: data.ncon]})


@pytest.mark.parametrize("name", ["panda_twin", "ur5e_twin"])
def test_fcl_agrees_with_mujoco_on_the_twins_primitive_geometry(name):
    profile = robot.load_profile(name)
    kin = Kinematics(profile=profile)
    lower, upper = profile.arm_limits_rad()
    rng = np.random.default_rng(0)
    colliding = 0
    for _ in range(60):
        q = rng.uniform(lower, upper)
        ours = kin.self_collisions(q)
        assert ours == mujoco_contacts(profile, kin, q), q
        colliding += bool(ours)
    assert 0 < colliding < 60  # both kinds of configuration were met


def test_franka_meshes_load_and_the_srdf_pairs_are_left_out(ament):
    kin = Kinematics(profile=mesh_profile())
    model = kin.collision
    assert model.coverage_problems() == []
    assert set(model.parts) >= {f"panda_link{i}" for i in range(8)} | {"panda_hand", "panda_leftfinger"}
    assert len(model.parts["panda_leftfinger"]) == 4  # every <collision> of a link
    disabled = srdf_disabled_pairs((PANDA / "srdf" / "panda.srdf").read_text())
    assert model.disabled[("panda_hand", "panda_link5")] == "SRDF: Default"
    assert not set(model.pairs) & set(disabled)
    assert ("panda_hand", "panda_link7") in model.disabled  # adjacent through panda_link8, which has no geometry
    home = np.array(mesh_profile().home_q)
    assert kin.self_collisions(home) == []
    bent = home.copy()
    bent[1] = 1.76  # shoulder forward with the elbow folded: the hand comes down onto the base
    assert ("panda_hand", "panda_link0") in kin.self_collisions(bent)


def test_without_an_srdf_the_pairs_touching_at_home_are_left_out_and_more_pairs_are_checked(ament):
    with_srdf, without = Kinematics(profile=mesh_profile()).collision, Kinematics(profile=mesh_profile(False)).collision
    assert len(without.pairs) > len(with_srdf.pairs)
    assert all(why in ("Adjacent", "finger pads") or why.startswith("Default") for why in without.disabled.values())


def test_a_mesh_that_does_not_resolve_is_a_problem_named_by_its_uri(monkeypatch):
    monkeypatch.setenv("AMENT_PREFIX_PATH", "/nonexistent")
    model = SelfCollisionModel.from_urdf((PANDA / "urdf" / "panda.urdf").read_text())
    problems = model.coverage_problems()
    assert any(
        "link panda_link3, collision 0: mesh package://example-robot-data/robots/panda_description/meshes/collision/"
        "link3.stl is not found" in p
        for p in problems
    ), problems
    assert set(model.parts) == {"panda_leftfinger", "panda_rightfinger"}  # only the fingers' boxes loaded


def test_geometry_that_cannot_be_used_is_named(tmp_path):
    broken = tmp_path / "broken.stl"
    broken.write_text("solid nothing\nendsolid nothing\n")
    urdf = f"""<robot name="r"><link name="a"><collision><geometry><mesh filename="{broken}"/></geometry></collision>
      <collision><geometry/></collision><collision><geometry><capsule radius="1" length="1"/></geometry></collision>
      <collision><geometry><box size="0.1 nan-ish"/></geometry></collision>
      </link><link name="b"><collision><geometry><sphere radius="0.1"/></geometry></collision></link>
      <joint name="j" type="fixed"><parent link="a"/><child link="b"/></joint></robot>"""
    problems = SelfCollisionModel.from_urdf(urdf).coverage_problems()
    assert problems[0] == f"link a, collision 0: mesh {broken} has no triangles"
    assert problems[1] == "link a, collision 1: an empty <geometry>"
    assert problems[2] == "link a, collision 2: <capsule> is not a URDF geometry"
    assert problems[3].startswith("link a, collision 3: <box {'size': '0.1 nan-ish'}> is malformed")
    assert problems[4] == "1 link(s) have collision geometry: there is nothing to check"


def test_scaled_meshes_collide_at_their_scaled_size(tmp_path, ament):
    """Two copies of a link's mesh, half its width apart: they overlap at the URDF's scale 1, not at 0.3."""
    stl = PANDA / "meshes" / "collision" / "link1.stl"
    width = np.ptp(np.asarray(trimesh.load(stl).vertices)[:, 0])

    def urdf(scale: float) -> str:
        mesh = f'<mesh filename="file://{stl}" scale="{scale} {scale} {scale}"/>'
        return f"""<robot name="r"><link name="a"><collision><geometry>{mesh}</geometry></collision></link>
          <link name="m"/><link name="b"><collision><geometry>{mesh}</geometry></collision></link>
          <joint name="j1" type="fixed"><parent link="a"/><child link="m"/></joint>
          <joint name="j2" type="fixed"><parent link="m"/><child link="b"/></joint></robot>"""

    apart = np.eye(4)
    apart[0, 3] = 0.5 * width
    for scale, expected in ((1.0, [("a", "b")]), (0.3, [])):
        model = SelfCollisionModel.from_urdf(urdf(scale))
        model.disabled.pop(("a", "b"))  # adjacent through m: checked here on purpose
        model.pairs = [("a", "b")]
        assert model.collisions({"a": np.eye(4), "b": apart}) == expected, scale


def test_uris_resolve_like_a_ros_install(tmp_path, monkeypatch):
    share = tmp_path / "install" / "share" / "pkg" / "meshes"
    share.mkdir(parents=True)
    (share / "m.stl").write_text("x")
    monkeypatch.setenv("AMENT_PREFIX_PATH", f"/nowhere:{tmp_path / 'install'}")
    assert resolve_uri("package://pkg/meshes/m.stl") == share / "m.stl"
    assert resolve_uri("package://other/meshes/m.stl") is None
    assert resolve_uri(f"file://{share}/m.stl") == share / "m.stl"
    assert resolve_uri(str(share / "m.stl")) == share / "m.stl"
    monkeypatch.setenv("AMENT_PREFIX_PATH", "")
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(tmp_path / "install" / "share"))
    assert resolve_uri("package://pkg/meshes/m.stl") == share / "m.stl"


def test_urdf_origins_are_fixed_axis_roll_pitch_yaw():
    element = ET.fromstring('<origin xyz="0.1 -0.2 0.3" rpy="0.4 -1.1 2.5"/>')
    t = _origin(element)
    np.testing.assert_allclose(t[:3, :3], Rotation.from_euler("xyz", [0.4, -1.1, 2.5]).as_matrix(), atol=1e-12)
    np.testing.assert_allclose(t[:3, 3], [0.1, -0.2, 0.3])
    np.testing.assert_array_equal(_origin(None), np.eye(4))


def test_a_profile_names_its_srdf_and_a_missing_one_is_refused(tmp_path, ament):
    profile = mesh_profile()
    assert profile.srdf_file.startswith("package://example-robot-data/") and "disable_collisions" in profile.srdf_text
    doc = (DATA / "panda_franka_meshes.yaml").read_text().replace("srdf/panda.srdf", "srdf/absent.srdf")
    (tmp_path / "p.yaml").write_text(doc)
    with pytest.raises(robot.ProfileError, match=r"srdf 'package://example-robot-data/.*absent\.srdf' cannot be read"):
        robot.load_profile(tmp_path / "p.yaml")


FR3_PREFIX = Path(__file__).resolve().parents[3] / "third_party" / "franka_description"


def test_the_fr3s_own_mesh_description_loads_and_the_hand_meets_the_base_when_folded(monkeypatch):
    """franka_description's FR3 (its xacro output, collision STLs and the hand's finger boxes, kept in third_party as
    an install prefix): every link with geometry is checked; with no SRDF, the pairs touching at home are left
    out; home is free and the shoulder folded forward brings the hand down onto the base, as on the Panda."""
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(FR3_PREFIX))
    profile = robot.load_profile(DATA / "fr3_franka_meshes.yaml")
    profile = profile.with_urdf_text((FR3_PREFIX / "share" / "franka_description" / "urdf" / "fr3.urdf").read_text())
    kin = Kinematics(profile=profile)
    model = kin.collision
    assert model.coverage_problems() == []
    assert set(model.parts) == {f"fr3_link{i}" for i in range(8)} | {"fr3_hand", "fr3_leftfinger", "fr3_rightfinger"}
    assert len(model.parts["fr3_leftfinger"]) == 4  # the hand's four finger boxes
    assert all(reason != "SRDF" and not reason.startswith("SRDF") for reason in model.disabled.values())
    home = np.array(profile.home_q)
    assert kin.self_collisions(home) == []
    bent = home.copy()
    bent[1] = 1.76
    assert ("fr3_hand", "fr3_link0") in kin.self_collisions(bent)

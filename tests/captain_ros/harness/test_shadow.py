"""The shadow check: a "real" twin with hidden differences (an obstacle the policy measured but no plan avoids, heavier
and slipperier than measured) and a shadow twin built only from the harness's measurements."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import mujoco
import numpy as np
import pytest

from captain_ros.agent.link import call_dict
from captain_ros.agent.transcript import Transcript
from captain_ros.cli import gap_cli
from captain_ros.core.config import ConfigError, load_config
from captain_ros.core.contract import CallResult, FailureCategory
from captain_ros.core.robot import load_profile
from captain_ros.harness.harness import Harness
from captain_ros.harness.shadow import (
    Measured,
    Prediction,
    ShadowError,
    ShadowTwin,
    Witness,
    outcome_of,
    shadow_profile,
)
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.objects import SceneObject
from captain_ros.twin.sim import Twin
from captain_ros.twin.tasks import get_task

START = (0.45, -0.25, 0.12)  # a sweep along y at 12 cm: the hand clears the post beside it, the forearm does not
END = (0.45, 0.25, 0.12)
POST_XY = (0.35, 0.0)
BOX = {"center_m": [0.5, 0.1, 0.02], "extents_m": [0.06, 0.04, 0.04], "yaw_deg": 30.0, "bottom_z_m": 0.0}


def pose(xyz) -> dict:
    return {"position": list(xyz), "yaw_deg": 0.0}


@pytest.fixture
def real():
    """The "real" arm: the twin of put_red_cube_in_bowl with a green post beside the sweep, 1 kg (the shadow assumes
    its volume at 400 kg/m^3: 0.3 kg) and half the friction the shadow's objects have."""
    base = get_task("put_red_cube_in_bowl")
    post = SceneObject("green_post", "block", "green", (0.05, 0.05, 0.3), mass_kg=1.0)
    task = replace(base, objects=(*base.objects, post), layout={**base.layout, "green_post": (*POST_XY, 0.0)})
    twin = Twin(task)
    twin.reset("put_red_cube_in_bowl/official/11")
    twin.model.geom_friction[:, 0] *= np.where(twin.model.geom_bodyid == twin.model.body("green_post").id, 0.5, 1.0)
    config = load_config()
    harness = Harness(TwinBackend(twin), replace(config, shadow=replace(config.shadow, enabled=True)))
    yield twin, harness
    harness.shadow.close()
    twin.close()


def measure(harness: Harness, text: str) -> dict:
    found = harness.call("segment", text=text)
    assert found.success, found.message
    measured = harness.call("measure_object_geometry", object=found.value["detections"][0]["detection_id"])
    assert measured.success, measured.message
    return measured.value


def test_a_motion_into_an_obstacle_no_plan_avoids_is_refused_and_the_arm_does_not_move(real):
    twin, harness = real
    assert harness.call("move_to", pose=pose(START)).success
    assert harness.call("observe").success
    measure(harness, "green block")
    assert [m.kind for m in harness.shadow.measured.values()] == ["block"]
    q, post = twin.arm_q(), twin.reader.position("green_post")  # the test knows; the shadow never looks
    refused = harness.call("move_to", pose=pose(END))
    assert not refused.success and refused.failure_category is FailureCategory.SAFETY_STOP and not refused.executed
    assert refused.message.startswith("shadow check: the twin predicts panda_link")
    assert "wrist force sensor cannot feel" in refused.message and "nothing moved" in refused.message
    predicted = refused.value["shadow"]["predicted"]
    assert predicted["refusal"] and any(k.startswith("panda_link") for k in predicted["contacts"])
    assert refused.value["shadow"]["actual"]["outcome"] == "safety_stop"
    np.testing.assert_allclose(twin.arm_q(), q, atol=1e-3)  # the arm did not move, the post stands where it was
    np.testing.assert_allclose(twin.reader.position("green_post"), post, atol=1e-3)
    # without the shadow the same motion runs into the post: the forearm strikes it (the ground truth of the "real"
    # arm, read only to score) and the guard, which feels the hand only, stops the arm late
    shadow, harness.shadow = harness.shadow, None
    ran = harness.call("move_to", pose=pose(END))
    harness.shadow = shadow
    assert ran.executed and ran.value["executed_distance_m"] > 0.05, ran.receipt
    assert twin.reader.tilt("green_post") > 0.03  # knocked askew (4 degrees here) before the guard stopped the arm


def test_a_safe_motion_runs_with_its_prediction_beside_the_outcome(real, tmp_path):
    _, harness = real
    assert harness.call("move_to", pose=pose(START)).success
    assert harness.call("observe").success
    measure(harness, "green block")
    measure(harness, "red cube")
    up = harness.call("move_to", pose=pose((0.45, -0.25, 0.3)))
    assert up.success, up.message
    shadow = up.value["shadow"]
    assert shadow["predicted"]["outcome"] == shadow["actual"]["outcome"] == "target_reached"
    assert shadow["predicted"]["objects"] == 2 and shadow["predicted"]["check_ms"] > 0
    assert abs(shadow["predicted"]["executed_distance_m"] - shadow["actual"]["executed_distance_m"]) < 0.005
    assert "twin predicted target_reached" in up.receipt
    closed = harness.call("move_to", gripper="close")  # a jaw command is checked too
    assert closed.success and closed.value["shadow"]["predicted"]["outcome"] == "not_holding"
    assert closed.value["shadow"]["actual"]["outcome"] == "not_holding"
    # the sim-to-real gap report of these calls, from the agent's transcript
    transcript = Transcript(tmp_path / "episode")
    for i, (name, result) in enumerate((("move_to", up), ("move_to", closed)), start=1):
        transcript.call(i, name, {}, call_dict(result))
    assert gap_cli.main([str(tmp_path / "episode"), "--out", str(tmp_path / "gap")]) == 0
    report = (tmp_path / "gap" / "gap.md").read_text()
    assert "2 actions checked by the shadow twin, 0 refused, 2 ran" in report and "100%" in report
    assert json.loads((tmp_path / "gap" / "gap.json").read_text())["summary"]["outcome_agreement"] == 1.0
    assert (tmp_path / "gap" / "gap.png").stat().st_size > 0


def test_the_shadow_never_reads_the_simulator_it_shadows(real, monkeypatch):
    twin, harness = real
    assert harness.call("observe").success
    measure(harness, "green block")

    def privileged(*_args, **_kwargs):
        raise AssertionError("the shadow read the real simulator's state")

    for name in ("position", "rotation", "quaternion", "bottom_z", "tilt", "held", "pad_contacts"):
        monkeypatch.setattr(twin.reader, name, privileged)
    monkeypatch.setattr(twin, "snapshot", privileged)
    up = harness.call("move_to", pose=pose((0.4, 0.0, 0.4)))
    assert up.success, up.message
    shadow_twin = harness.shadow._built[1]
    names = {shadow_twin.model.body(b).name for b in range(shadow_twin.model.nbody)}
    assert not names & {o.name for o in twin.task.objects}  # only what was measured, under its detection id
    assert set(harness.shadow.measured) <= names


def test_a_shadow_that_cannot_predict_refuses(real, monkeypatch):
    twin, harness = real
    q = twin.arm_q()

    def broken(*_args):
        raise RuntimeError("mesh cache gone")

    monkeypatch.setattr(harness.shadow, "_predict", broken)
    result = harness.call("move_to", pose=pose((0.4, 0.0, 0.3)))
    assert result.failure_category is FailureCategory.SAFETY_STOP and not result.executed
    assert "could not play it (RuntimeError: mesh cache gone)" in result.message
    np.testing.assert_allclose(twin.arm_q(), q, atol=1e-3)


def test_the_witness_calls_an_object_leaving_the_table_and_a_force_over_the_limit():
    twin = Twin("put_red_cube_in_bowl")
    twin.reset("put_red_cube_in_bowl/official/0")
    witness = Witness(twin, load_config().safety)
    witness.begin()
    done = CallResult.ok("move_to", value={"stop_reason": "target_reached", "peak_force_n": 12.0})
    assert witness.verdict(done, 40.0).refusal == ""
    assert witness.verdict(done, 10.0).refusal == "a force of 12.0 N, over the 10 N limit"
    adr = twin.model.joint("red_cube_free").qposadr[0]
    twin.data.qpos[adr : adr + 2] = (0.9, 0.6)  # beyond the workspace's x-y box
    mujoco.mj_forward(twin.model, twin.data)
    assert witness.verdict(done, 40.0).pushed_off == ["red_cube"]
    assert witness.verdict(done, 40.0).refusal == "red_cube pushed off the table"
    twin.close()


# --------------------------------------------------------------------------------------------- no simulation
def test_measurements_are_checked_merged_and_forgotten_when_taken_into_the_hand():
    m = Measured.from_value({"object": "det-1", **BOX})
    assert m.kind == "block" and m.size_m == (0.06, 0.04, 0.04) and m.pose[3] == pytest.approx(math.radians(30))
    assert m.covers(np.array([0.5, 0.1])) and not m.covers(np.array([0.6, 0.1]))
    assert Measured.from_value({"detection_id": "det-2", **BOX, "kind": "bowl"}).kind == "bowl"
    for bad, why in (
        ({**BOX, "object": "d"} | {"center_m": [0.5, float("nan"), 0.0]}, "not finite"),
        ({"object": "d", **BOX, "extents_m": [0.1, 0.1]}, "3 extents"),
        ({**BOX}, "detection id"),
        ({"object": "d"}, "not an object measurement"),
    ):
        with pytest.raises(ShadowError, match=why):
            Measured.from_value(bad)

    class FakeHarness:  # what ShadowTwin reads of a harness (no twin is built here)
        profile, config, kin = load_profile("panda_twin"), load_config(), None

    shadow = ShadowTwin(FakeHarness())
    shadow.note(
        "measure_object_geometry",
        {"object": "det-1", **BOX, "destination": {"detection_id": "det-9", **BOX, "center_m": [0.3, -0.2, 0.03]}},
    )
    assert list(shadow.measured) == ["det-1", "det-9"]
    shadow.note("measure_object_geometry", {"object": "det-4", **BOX, "center_m": [0.51, 0.1, 0.02]})  # again
    assert list(shadow.measured) == ["det-9", "det-4"]
    shadow.note("move_to", {"holding_object": True, "tcp_position_m": [0.505, 0.095, 0.03]})
    assert list(shadow.measured) == ["det-9"]  # in the hand now
    shadow.note("move_to", {"holding_object": False, "tcp_position_m": [0.3, -0.2, 0.03]})
    assert list(shadow.measured) == ["det-9"]
    shadow.reset()
    assert shadow.measured == {}
    with pytest.raises(ShadowError, match="no twin section"):
        ShadowTwin(type("Arm", (), {"profile": load_profile("ur5e"), "config": load_config()})())


def test_an_arm_without_a_twin_is_shadowed_by_a_twin_that_moves_like_it():
    panda = load_profile("panda_twin")
    assert shadow_profile(panda) is panda
    arm = replace(panda, name="my_panda", twin=None, shadow_twin="panda_twin")  # franka_fr3.yaml names it so
    assert shadow_profile(arm).name == "panda_twin"
    with pytest.raises(ShadowError, match="names no shadow_twin"):
        shadow_profile(replace(arm, shadow_twin=""))
    with pytest.raises(ShadowError, match="shadow_twin: no robot profile 'nowhere'"):
        shadow_profile(replace(arm, shadow_twin="nowhere"))
    with pytest.raises(ShadowError, match="with 7 arm joints"):
        shadow_profile(replace(arm, shadow_twin="ur5e_twin"))
    elbow = '<origin xyz="0.0825 0 0" rpy="1.5707963267948966 0 0"/>'  # panda_joint4's offset, 1 cm longer here
    longer = replace(arm, urdf_text=panda.urdf_text.replace(elbow, elbow.replace("0.0825", "0.0925")))
    with pytest.raises(ShadowError, match="does not move like 'my_panda'"):
        shadow_profile(longer)
    assert load_profile("franka_fr3").shadow_twin == "panda_twin"


def test_predictions_read_like_outcomes():
    p = Prediction("move_to", "contact", 0.031, 4.2, 0.08, objects=2, check_ms=12.0)
    assert p.summary() == "contact 3.1 cm peak 4.2 N jaw 80 mm"
    assert "refusal" not in p.as_value() and p.as_value()["objects"] == 2
    done = CallResult.ok("move_to", value={"stop_reason": "target_reached", "executed_distance_m": 0.2})
    assert outcome_of(done)["outcome"] == "target_reached"
    assert outcome_of(CallResult.ok("release", value={"holding_object": False}))["outcome"] == "not_holding"
    failed = CallResult.fail("move_to", FailureCategory.SAFETY_STOP, "no")
    assert outcome_of(failed) == {
        "outcome": "safety_stop",
        "executed_distance_m": None,
        "peak_force_n": None,
        "jaw_after_m": None,
    }


def test_a_bad_shadow_configuration_is_refused(tmp_path):
    harness_yaml = tmp_path / "harness.yaml"
    harness_yaml.write_text("shadow:\n  object_density_kgpm3: 0.0\n")
    with pytest.raises(ConfigError, match="shadow needs object_density_kgpm3 > 0"):
        load_config(harness_path=harness_yaml)

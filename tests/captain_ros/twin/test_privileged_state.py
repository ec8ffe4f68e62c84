"""The 36 privileged features on constructed states."""

import mujoco
import numpy as np
import pytest

from captain_ros.twin import privileged_state
from captain_ros.twin.privileged_state import FEATURE_NAMES, PrivilegedState
from captain_ros.twin.sim import Twin

from .test_tasks import _place


def test_there_are_36_named_features_and_no_policy_counters():
    assert len(FEATURE_NAMES) == 36 == len(set(FEATURE_NAMES))
    assert not any(w in n for n in FEATURE_NAMES for w in ("request", "call", "failed", "perception", "count"))


@pytest.fixture
def twin():
    t = Twin("put_red_cube_in_bowl")
    t.reset("put_red_cube_in_bowl/official/0")
    return t


def test_start_state_features(twin):
    snap = twin.snapshot()
    assert isinstance(snap, PrivilegedState) and snap.features.shape == (36,)
    tcp, _ = twin.tcp_pose()
    np.testing.assert_allclose([snap.feature(f"ee_{a}_m") for a in "xyz"], tcp, atol=1e-9)
    assert snap.feature("jaw_opening_m") == pytest.approx(0.08, abs=1e-3)
    assert snap.feature("n_goals") == 1 and snap.feature("frac_goals_satisfied") == 0
    assert snap.feature("active_goal_is_contact") == 1 and snap.feature("active_goal_is_joint") == 0
    cube = twin.reader.position("red_cube")
    assert snap.feature("ee_target_dist_m") == pytest.approx(np.linalg.norm(tcp - cube), abs=1e-9)
    assert snap.feature("target_goal_dist_norm") == pytest.approx(1.0, abs=1e-6)
    assert snap.feature("target_lift_m") == pytest.approx(0.0, abs=1e-6)
    assert snap.feature("target_held") == 0 and snap.feature("ladder_fraction") == 0
    assert snap.feature("joint_pos_m") == 0  # no articulated part in this task


def test_features_follow_a_constructed_lift_and_placement(twin):
    start = twin.reader.position("red_cube")
    _place(twin, "red_cube", start + [0.0, 0.1, 0.07])
    snap = twin.snapshot()
    assert snap.feature("target_lift_m") == pytest.approx(0.07, abs=1e-6)
    assert snap.feature("target_displacement_m") == pytest.approx(np.hypot(0.1, 0.07), abs=1e-6)
    bowl = twin.reader.position("black_bowl")
    _place(twin, "red_cube", bowl + [0.0, 0.0, 0.009])
    snap = twin.snapshot()
    assert snap.success and snap.feature("frac_goals_satisfied") == 1
    assert snap.feature("target_dest_dist_xy_m") == pytest.approx(0.0, abs=1e-6)
    assert snap.feature("target_goal_dist_norm") < 0.05
    assert "place red_cube" not in snap.subgoals_reached  # the ladder needs grasp and lift first


def test_drawer_features():
    t = Twin("open_drawer")
    t.reset("open_drawer/official/0")
    t.data.qpos[t.model.joint("cabinet_drawer").qposadr[0]] = 0.08
    mujoco.mj_forward(t.model, t.data)
    snap = t.snapshot()
    assert snap.feature("active_goal_is_joint") == 1
    assert snap.feature("joint_pos_m") == pytest.approx(0.08)
    assert snap.feature("joint_pos_norm") == pytest.approx(0.5)
    assert snap.feature("joint_goal_progress") == pytest.approx(0.5)
    assert snap.feature("target_goal_dist") == pytest.approx(0.08)
    assert snap.joint_positions == {"cabinet_drawer": pytest.approx(0.08)}


def test_grasp_and_hold_flags_from_a_real_grasp(twin):
    """Drive the arm down onto the cube, close, lift: held, ever-held and the ladder follow."""
    from captain_ros.core.kinematics import Kinematics, top_down_rotation

    kin = Kinematics()
    cube = twin.reader.position("red_cube")
    yaw = float(np.arctan2(twin.reader.rotation("red_cube")[1, 0], twin.reader.rotation("red_cube")[0, 0]))

    def go(p, seconds):
        q = kin.solve(np.asarray(p), top_down_rotation(yaw), twin.arm_command()).q_rad
        q0 = twin.arm_command()
        steps = int(seconds / twin.model.opt.timestep)
        for i in range(1, steps + 1):
            twin.set_arm_command(q0 + (q - q0) * i / steps)
            twin.step()

    go(cube + [0, 0, 0.1], 1.0)
    go(cube + [0, 0, 0.0225], 1.0)
    twin.set_gripper_command(0.0)
    twin.step(300)
    assert twin.snapshot().feature("target_held") == 1
    go(cube + [0, 0, 0.12], 1.0)
    snap = twin.snapshot()
    assert snap.feature("target_held") == 1 and snap.feature("target_ever_held") == 1
    assert snap.feature("target_lift_m") > 0.05
    assert snap.subgoals_reached == ("grasp red_cube", "lift red_cube")
    assert snap.feature("ladder_fraction") == pytest.approx(2 / 3)


def test_privileged_module_is_separate_from_what_the_policy_sees():
    # the policy-facing contract must not know the privileged type
    from captain_ros.core import contract

    assert "privileged_state" not in contract.__dict__ and "PrivilegedState" not in contract.__dict__
    assert privileged_state.PrivilegedState.__doc__.startswith("TRAINING ONLY")

"""Simulation faults are infrastructure failures, detected and reported; commands are validated."""

import mujoco
import numpy as np
import pytest

from captain_ros.twin.sim import SimulationFault, Twin


@pytest.fixture
def twin():
    t = Twin("stack_red_on_blue")
    t.reset("stack_red_on_blue/official/1")
    return t


def test_nan_state_is_a_fault(twin):
    twin.data.qvel[0] = np.nan
    with pytest.raises(SimulationFault, match="NaN"):
        twin.step(5)


def test_exploding_speed_is_a_fault(twin):
    dof = twin.model.joint("red_block_free").dofadr[0]
    twin.data.qvel[dof] = 300.0
    with pytest.raises(SimulationFault, match=r"red_block_free.*exploded"):
        twin.check_stable()


def test_object_through_the_table_is_a_fault(twin):
    adr = twin.model.joint("green_block_free").qposadr[0]
    twin.data.qpos[adr + 2] = -0.2
    mujoco.mj_forward(twin.model, twin.data)
    with pytest.raises(SimulationFault, match="green_block passed through the table"):
        twin.check_stable()


def test_exploding_contact_force_is_a_fault(twin):
    twin.step(5)
    assert twin.data.nefc > 0  # blocks resting on the table
    twin.data.efc_force[0] = 5.0e4  # a constructed contact force far beyond anything real
    with pytest.raises(SimulationFault, match="50000 N exceeds"):
        twin.check_stable()


def test_a_healthy_scene_runs_without_faults(twin):
    twin.step(1000)
    assert np.isfinite(twin.data.qpos).all()


@pytest.mark.parametrize("bad", [np.zeros(6), np.full(7, np.nan), np.array([0, 0, 0, np.inf, 0, 0, 0])])
def test_bad_arm_commands_are_refused(twin, bad):
    with pytest.raises(ValueError, match="7 finite joint positions"):
        twin.set_arm_command(bad)


def test_bad_gripper_command_is_refused(twin):
    with pytest.raises(ValueError, match="finite"):
        twin.set_gripper_command(float("nan"))


def test_snapshot_before_reset_is_refused():
    with pytest.raises(RuntimeError, match="reset the twin"):
        Twin("open_drawer").snapshot()


def test_place_puts_the_scene_where_it_was_measured_and_refuses_garbage(twin):
    poses = {o.name: (0.3 + 0.1 * i, 0.2, 0.0, 0.3) for i, o in enumerate(twin.task.objects)}
    q = twin.profile.home_q + 0.1
    twin.place(q, 0.05, poses)
    np.testing.assert_allclose(twin.arm_q(), q)
    first = twin.task.objects[0].name
    np.testing.assert_allclose(twin.reader.position(first)[:2], poses[first][:2], atol=1e-6)
    assert twin.jaw_opening_m() == pytest.approx(0.05, abs=1e-3) and twin.time_s == 0.0
    for bad_q, jaw in ((np.zeros(6), 0.05), (np.full(7, np.nan), 0.05), (q, float("inf"))):
        with pytest.raises(ValueError, match="7 finite joint positions and a finite jaw opening"):
            twin.place(bad_q, jaw, poses)
    with pytest.raises(ValueError, match=rf"missing \['{first}'\]"):
        twin.place(q, 0.05, {k: v for k, v in poses.items() if k != first})

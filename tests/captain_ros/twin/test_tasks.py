"""Task suite: definitions, malformed-definition errors, predicates on constructed states."""

from pathlib import Path

import mujoco
import numpy as np
import pytest
import yaml

from captain_ros.paths import config_path
from captain_ros.twin.sim import Twin
from captain_ros.twin.tasks import (
    LadderTracker,
    TaskError,
    _StrictBoolLoader,
    default_suite,
    get_task,
    goals_status,
    load_suite,
    success,
)


def test_suite_has_at_least_12_tasks_in_4_families():
    suite = default_suite()
    assert len(suite) >= 12
    assert {t.family for t in suite.values()} == {"pick_place", "stack", "spatial", "articulated"}
    for task in suite.values():
        assert task.instruction and task.goals and task.ladder()


def test_unknown_task_names_the_known_ones():
    with pytest.raises(TaskError, match=r"unknown task 'fly_to_mars'.*put_red_cube_in_bowl"):
        get_task("fly_to_mars")


def _write_suite(tmp_path: Path, mutate) -> Path:
    raw = yaml.load(config_path("tasks.yaml").read_text(), Loader=_StrictBoolLoader)
    mutate(raw)
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r["tasks"]["put_red_cube_in_bowl"]["goals"][0].update(object="purple_cube"),
            "task 'put_red_cube_in_bowl' goal 1: goal object 'purple_cube' is not among",
        ),
        (lambda r: r["tasks"]["put_red_cube_in_bowl"].update(family="juggling"), "family must be one of"),
        (lambda r: r["tasks"]["put_red_cube_in_bowl"].update(instruction=""), "needs a non-empty instruction"),
        (lambda r: r["tasks"]["put_red_cube_in_bowl"]["objects"].append("unicorn"), "unknown object 'unicorn'"),
        (lambda r: r["tasks"]["put_red_cube_in_bowl"]["layout"].pop("red_cube"), "layout must place exactly"),
        (
            lambda r: r["tasks"]["put_red_cube_in_bowl"]["layout"].update(red_cube=[0.4, float("nan"), 0]),
            "must be a finite number",
        ),
        (
            lambda r: r["tasks"]["put_green_cube_on_plate"]["goals"][0].update(support="black_bowl"),
            "cannot support objects",
        ),
        (lambda r: r["objects"]["red_cube"].update(size_m=[0.04, 0.04, 9.0]), "size_m must be three sizes"),
        (lambda r: r["objects"]["red_cube"].update(color="ultraviolet"), "unknown colour 'ultraviolet'"),
        (
            lambda r: r["tasks"]["red_cube_left_of_bowl_in_box"]["relation"].update(distractor="black_bowl"),
            "must look like 'red_cube'",
        ),
        (lambda r: r["tasks"]["close_drawer"].update(drawer_start_m=0.5), "outside the drawer's travel"),
        (lambda r: r["tolerances"]["on_support"].update(z_tol_m=-1), "must be >= 0"),
        (lambda r: r["tasks"]["open_drawer"].update(colour="red"), "unknown keys \\['colour'\\]"),
    ],
)
def test_malformed_definitions_name_what_is_wrong(tmp_path, mutate, message):
    with pytest.raises(TaskError, match=message):
        load_suite(_write_suite(tmp_path, mutate))


def test_unreadable_suite_file(tmp_path):
    bad = tmp_path / "tasks.yaml"
    bad.write_text("tasks: [unclosed")
    with pytest.raises(TaskError, match="cannot read the task suite"):
        load_suite(bad)


def _place(twin: Twin, name: str, xyz, yaw: float = 0.0) -> None:
    m, d = twin.model, twin.data
    adr = m.joint(f"{name}_free").qposadr[0]
    d.qpos[adr : adr + 3] = xyz
    d.qpos[adr + 3 : adr + 7] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
    dof = m.joint(f"{name}_free").dofadr[0]
    d.qvel[dof : dof + 6] = 0
    mujoco.mj_forward(m, d)


@pytest.fixture
def bowl_twin():
    twin = Twin("put_red_cube_in_bowl")
    twin.reset("put_red_cube_in_bowl/official/0")
    return twin


def test_in_predicate_true_inside_and_false_beside_above_or_moving(bowl_twin):
    twin = bowl_twin
    bowl = twin.reader.position("black_bowl")
    _place(twin, "red_cube", bowl + [0.0, 0.0, 0.009])
    assert success(twin.task, twin.reader)
    _place(twin, "red_cube", bowl + [0.12, 0.0, 0.0])  # beside the bowl
    assert not success(twin.task, twin.reader)
    _place(twin, "red_cube", bowl + [0.0, 0.0, 0.2])  # hovering above the rim
    assert not success(twin.task, twin.reader)
    _place(twin, "red_cube", bowl + [0.0, 0.0, 0.009])
    twin.data.qvel[twin.model.joint("red_cube_free").dofadr[0]] = 0.5  # sliding at 0.5 m/s
    mujoco.mj_forward(twin.model, twin.data)
    assert not success(twin.task, twin.reader)


def test_on_predicate_with_tolerances():
    twin = Twin("stack_red_on_blue")
    twin.reset("stack_red_on_blue/official/0")
    blue = twin.reader.position("blue_block")
    tol = twin.task.tolerances
    _place(twin, "red_block", blue + [0.0, 0.0, 0.04])  # resting on top
    assert success(twin.task, twin.reader)
    _place(twin, "red_block", blue + [0.0, 0.0, 0.04 + tol.on_z_tol_m * 2])  # too high above
    assert not success(twin.task, twin.reader)
    _place(twin, "red_block", blue + [0.0275 - tol.on_xy_margin_m + 0.003, 0, 0.04])  # centre off the top face
    assert not success(twin.task, twin.reader)
    _place(twin, "red_block", blue + [0.01, 0.005, 0.04], yaw=0.5)  # rotated but well on top
    assert success(twin.task, twin.reader)


def test_drawer_predicates_and_in_drawer():
    twin = Twin("put_cube_in_drawer")
    twin.reset("put_cube_in_drawer/official/0")
    m, d = twin.model, twin.data
    adr = m.joint("cabinet_drawer").qposadr[0]
    assert not success(twin.task, twin.reader)
    d.qpos[adr] = 0.15  # open beyond 75% of 0.16 m
    mujoco.mj_forward(m, d)
    assert goals_status(twin.task, twin.reader) == [True, False]
    _place(twin, "yellow_cube", twin.reader.drawer_interior_position("cabinet") + [0, 0, 0.001])
    assert goals_status(twin.task, twin.reader) == [True, True]
    closing = Twin("close_drawer")
    closing.reset("close_drawer/official/0")
    assert not success(closing.task, closing.reader)
    closing.data.qpos[closing.model.joint("cabinet_drawer").qposadr[0]] = 0.005
    mujoco.mj_forward(closing.model, closing.data)
    assert success(closing.task, closing.reader)


def test_ladder_is_monotone_and_ordered(bowl_twin):
    ladder = LadderTracker(bowl_twin.task)
    assert ladder.names == ["grasp red_cube", "lift red_cube", "place red_cube"]
    assert ladder.update([False, True, True]) == []  # lift without grasp does not count
    assert ladder.update([True, False, False]) == ["grasp red_cube"]
    assert ladder.update([False, True, False]) == ["grasp red_cube", "lift red_cube"]
    assert ladder.update([False, False, False]) == ["grasp red_cube", "lift red_cube"]  # one-shot


def test_the_staged_reward_counts_a_place_rung_only_while_it_holds_at_the_end(bowl_twin):
    """Twin.subgoals_credited (what the recorder's staged reward reads at an episode's end): the one-shot ladder's
    rungs, with the place rung checked on the state now (CaPtain App. A.2)."""
    twin = bowl_twin
    assert twin.subgoals_credited() == 0
    twin.ladder.reached = [True, True, True]  # grasped, lifted and placed earlier in the episode
    assert not success(twin.task, twin.reader)  # ... and no longer in the bowl
    assert twin.subgoals_credited() == 2
    _place(twin, "red_cube", twin.reader.position("black_bowl") + [0.0, 0.0, 0.009])
    assert twin.subgoals_credited() == 3

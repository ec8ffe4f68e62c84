"""The captain-ros command-line tool."""

from captain_ros.cli import main
from captain_ros.core.contract import CAPABILITIES, FailureCategory


def test_capabilities_lists_every_call_and_where_it_is_served(capsys):
    assert main(["capabilities"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    for cap in CAPABILITIES:
        assert cap.name in rows
    assert "/perception/call" in rows["mark_point"] and "/harness/call" in rows["move_to"]
    assert "yes" in rows["recover"] and "yes" not in rows["observe"]


def test_failures_lists_the_closed_set(capsys):
    assert main(["failures"]) == 0
    out = capsys.readouterr().out
    assert all(c.value in out for c in FailureCategory if c.value)


def test_rollout_and_eval_refuse_unknown_tasks_before_starting_anything(tmp_path):
    import pytest

    for argv in (["rollout"], ["eval", "run"]):
        with pytest.raises(SystemExit, match="unknown task\\(s\\) no_such_task; known: put_red_cube_in_bowl"):
            main([*argv, "--tasks", "no_such_task", "--runs-dir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # no run folder, no processes
    with pytest.raises(SystemExit, match="unknown task\\(s\\) no_such_task; known: put_red_cube_in_bowl"):
        main(["run", "--task", "no_such_task", "--runs-dir", str(tmp_path)])  # the main job asks the twin world too
    assert list(tmp_path.iterdir()) == []


def test_the_worlds_rollouts_may_run_in_are_the_registrys(capsys):
    import pytest

    from captain_ros.worlds import world_names

    with pytest.raises(SystemExit) as exit_:
        main(["rollout", "--backend", "ros2_control"])  # a world of the ROS nodes, not of in-process rollouts
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'ros2_control'" in err and all(repr(n) in err for n in world_names(in_process=True))


def test_the_delegated_commands_answer_help(capsys):
    import pytest

    for command in ("export", "transport", "eval"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0 and f"captain-ros {command}" in capsys.readouterr().out

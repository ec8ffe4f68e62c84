"""The captain-ros command-line tool, and the layout of the two CLI packages."""

import ast
import re
from pathlib import Path

from captain_ros.cli import main
from captain_ros.core.contract import CAPABILITIES, FailureCategory

ROOT = Path(__file__).resolve().parents[2]


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


# ---------------------------------------------------------------------------------------------- the CLI packages
def _sources(root, *, cli: bool):
    """(path, parsed module) of every module of captain_ros and captain_ros_training inside (cli) or outside their
    cli/ packages."""
    for package in ("captain_ros", "captain_ros_training"):
        for path in sorted((root / "src" / "captain_ros" / package).rglob("*.py")):
            if (path.relative_to(root / "src" / "captain_ros" / package).parts[0] == "cli") == cli:
                yield path, ast.parse(path.read_text())


def _imports(tree):
    """(line, imported module) of every absolute import in the tree, and the lines of its top-level
    `if __name__ == "__main__":` blocks."""
    main_lines = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            main_lines |= set(range(node.lineno, node.end_lineno + 1))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found, main_lines


def test_the_modules_the_commands_call_reach_the_cli_packages_only_from_their_main_blocks():
    """The work stays where it was; a module imports its command line only to run it under its documented name."""
    wrong = []
    for path, tree in _sources(ROOT, cli=False):
        found, main_lines = _imports(tree)
        wrong += [
            f"{path.relative_to(ROOT)}:{line} imports {name}"
            for line, name in found
            if name.split(".")[:2] in (["captain_ros", "cli"], ["captain_ros_training", "cli"])
            and line not in main_lines
            and path.name != "__main__.py"  # captain_ros_training/__main__.py: the trainer's entry runs its CLI
        ]
    assert not wrong, wrong


def test_the_robot_side_cli_imports_neither_the_trainer_nor_rclpy():
    wrong = []
    for path, tree in _sources(ROOT, cli=True):
        if "captain_ros_training" in path.parts:
            continue
        found, _ = _imports(tree)
        wrong += [
            f"{path.relative_to(ROOT)}:{n}" for _, n in found if n.split(".")[0] in ("captain_ros_training", "rclpy")
        ]
    assert not wrong, wrong


def test_every_python_dash_m_name_the_repository_gives_runs_a_command_line():
    """Each `python -m captain_ros...` that docs, scripts, tools, tests and docstrings name is a module (or a package
    with __main__.py) whose top-level `if __name__ == "__main__":` block runs it."""
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "tools").rglob("*.*")]
    texts += [
        *(ROOT / "src" / "captain_ros").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "bench").rglob("*.py"),
    ]
    named = set()
    for path in texts:
        if path.is_file() and path.suffix in (".md", ".py", ".sh"):
            named |= set(
                re.findall(r"-m[\"',\s]+(captain_ros(?:_training)?(?:\.\w+)*)(?=[\s\"'`)\\]|$)", path.read_text(), re.M)
            )
    assert {"captain_ros.cli", "captain_ros_training"} <= named, named
    missing = []
    for module in sorted(named):
        base = ROOT / "src" / "captain_ros" / module.replace(".", "/")
        path = base / "__main__.py" if base.is_dir() else base.with_suffix(".py")
        if not path.is_file():
            missing.append(f"{module}: no such module")
            continue
        _, main_lines = _imports(ast.parse(path.read_text()))
        if not main_lines:
            missing.append(f'{module}: no `if __name__ == "__main__":` block')
    assert not missing, missing

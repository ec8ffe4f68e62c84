"""The captain-ros command-line tool, and the layout of the two CLI packages."""

import ast
import re
from pathlib import Path

import pytest

from captain_ros.cli import DELEGATED, main
from captain_ros.core.contract import CAPABILITIES, FailureCategory

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "captain_ros"


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

    assert {"eval", "export", "transport", "gap", "proxy", "expert-server", "rviz-config", "appearance-library"} <= set(
        DELEGATED
    )
    for command in DELEGATED:
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0 and f"usage: captain-ros {command} " in capsys.readouterr().out, command


def test_the_trainer_commands_answer_help_under_their_name(capsys):
    import pytest

    from captain_ros_training.cli import COMMANDS
    from captain_ros_training.cli import main as trainer

    assert set(COMMANDS) == {"rl", "rl-host", "student", "student-eval", "token-rows", "sft-then-rl", "hf-serve"}
    with pytest.raises(SystemExit) as exit_:
        trainer(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: python -m captain_ros_training ")
    assert all(f"    {command}" in out for command in COMMANDS), out  # each with its one-line summary
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            trainer([command, "--help"])
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and out.startswith(f"usage: python -m captain_ros_training {command} "), out
    for argv in (["no-such-command"], ["rl_host", "run"]):  # a module's name is no command
        with pytest.raises(SystemExit) as exit_:
            trainer(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"invalid choice: {argv[0]!r}" in err, err
        assert all(repr(command) in err for command in COMMANDS), err  # the message names the valid ones
    with pytest.raises(SystemExit) as exit_:
        trainer([])
    assert exit_.value.code == 2 and "required: COMMAND" in capsys.readouterr().err


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


# the modules outside the CLI packages that run as `python -m` or as a console script: the trainer package's entry,
# the ROS nodes (console scripts launch files start), the sandbox's child and the LIBERO server (processes the agent and
# the LIBERO backend start)
ROS_NODES = ("twin_node", "motion_node", "perception_node", "agent_node", "operator_view")
ENTRY_POINTS = {
    "captain_ros_training/__main__.py",
    *(f"captain_ros/ros/{node}.py" for node in ROS_NODES),
    "captain_ros/agent/sandbox_child.py",
    "captain_ros/libero/server.py",
}


def test_no_module_outside_the_cli_packages_imports_them():
    """The arrows point down: the CLI packages import the modules that do the work, never the other way, not even
    in a `__main__` block. Only the trainer package's `__main__.py` runs its CLI package."""
    wrong = []
    for path, tree in _sources(ROOT, cli=False):
        found, _ = _imports(tree)
        wrong += [
            f"{path.relative_to(ROOT)}:{line} imports {name}"
            for line, name in found
            if name.split(".")[:2] in (["captain_ros", "cli"], ["captain_ros_training", "cli"])
            and str(path.relative_to(SRC)) != "captain_ros_training/__main__.py"
        ]
    assert not wrong, wrong


def _moved_notice(tree) -> str | None:
    """The command of a module whose `__main__` block only says where its command moved (raise SystemExit("... is
    now `<command>` ...")), else None."""
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            body = node.body
            if len(body) == 1 and isinstance(body[0], ast.Raise) and "SystemExit" in ast.unparse(body[0]):
                found = re.search(r"is now `([^`]+)`", ast.unparse(body[0]))
                return found.group(1) if found else None
    return None


def test_only_the_entry_points_have_main_blocks():
    """A command runs through `captain-ros` (`python -m captain_ros.cli`) or `python -m captain_ros_training`, not
    under a library module's name nor its CLI module's. A module whose old `python -m` name was documented keeps a
    block that says where its command went (exit 1), and that command is one the tools have."""
    from captain_ros_training.cli import COMMANDS

    with_main, moved = set(), {}
    for cli in (True, False):
        for path, tree in _sources(ROOT, cli=cli):
            if _imports(tree)[1]:
                name = str(path.relative_to(SRC))
                command = _moved_notice(tree)
                if command is None:
                    with_main.add(name)
                else:
                    moved[name] = command
    assert with_main <= {"captain_ros/cli/__main__.py", *ENTRY_POINTS}, with_main
    assert {"captain_ros/cli/__main__.py", "captain_ros_training/__main__.py"} <= with_main
    assert "captain_ros_training/rl_host.py" in moved, moved
    for command in moved.values():
        words = command.split()
        if words[:3] == ["python", "-m", "captain_ros_training"]:
            assert words[3] in COMMANDS, command
        else:
            assert words[0] == "captain-ros", command
            with pytest.raises(SystemExit) as exit_:
                main([words[1], "--help"])
            assert exit_.value.code == 0, command


def test_no_two_modules_share_a_file_name():
    """Outside the per-world modules (link, privileged, world: one of each per world), a module's file name says
    which it is: a CLI module is <name>_cli.py, never the name of the module it serves."""
    seen: dict[str, list[str]] = {}
    for package in ("captain_ros", "captain_ros_training"):
        for path in sorted((SRC / package).rglob("*.py")):
            if path.name not in ("__init__.py", "__main__.py", "link.py", "privileged.py", "world.py"):
                seen.setdefault(path.name, []).append(str(path.relative_to(SRC)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
    cli = [p for package in ("captain_ros", "captain_ros_training") for p in (SRC / package / "cli").glob("*.py")]
    assert all(p.name.endswith("_cli.py") for p in cli if not p.name.startswith("__")), cli


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


def _texts():
    """The text of every doc, script, tool, test, bench script and module of the repository."""
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "tools").rglob("*.*")]
    texts += [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    for path in texts:
        if path.is_file() and path.suffix in (".md", ".py", ".sh"):
            yield path, path.read_text()


def test_every_python_dash_m_name_the_repository_gives_runs_a_command_line():
    """Each `python -m captain_ros...` that docs, scripts, tools, tests and docstrings name is a module (or a package
    with __main__.py) whose top-level `if __name__ == "__main__":` block runs it."""
    named = set()
    for _, text in _texts():
        named |= set(re.findall(r"-m[\"',\s]+(captain_ros(?:_training)?(?:\.\w+)*)(?=[\s\"'`)\\]|$)", text, re.M))
    assert {"captain_ros.cli", "captain_ros_training"} <= named, named
    missing = []
    for module in sorted(named):
        base = SRC / module.replace(".", "/")
        path = base / "__main__.py" if base.is_dir() else base.with_suffix(".py")
        if not path.is_file():
            missing.append(f"{module}: no such module")
            continue
        _, main_lines = _imports(ast.parse(path.read_text()))
        if not main_lines:
            missing.append(f'{module}: no `if __name__ == "__main__":` block')
    assert not missing, missing


def test_every_command_the_repository_gives_the_two_entries_is_one_they_have():
    """`python -m captain_ros_training <command>` and `python -m captain_ros.cli <command>`, wherever the repository
    names them (torchrun's `-m captain_ros_training rl` too), name commands the entries have."""
    from captain_ros.cli import build_parser
    from captain_ros_training.cli import COMMANDS

    robot = next(action.choices for action in build_parser()._actions if action.dest == "command")
    entries = {"captain_ros_training": set(COMMANDS), "captain_ros.cli": set(robot)}
    apart = r"(?:\s+|[\"'],\s*[\"'])"  # a space, or list items: "-m", "captain_ros_training", "rl"
    pattern = re.compile(rf"-m{apart}(captain_ros_training|captain_ros\.cli){apart}([a-z][\w-]*)")
    named, wrong = set(), []
    for path, text in _texts():
        for entry, command in pattern.findall(text):
            named.add((entry, command))
            if command not in entries[entry]:
                wrong.append(f"{path.relative_to(ROOT)}: -m {entry} {command}")
    assert {("captain_ros_training", "rl"), ("captain_ros_training", "hf-serve"), ("captain_ros.cli", "proxy")} <= named
    assert not wrong, wrong

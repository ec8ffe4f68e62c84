"""docs/first_real_run.md names only what the code, launch files and robot profiles use.

From every inline code span and fenced code block of the guide this extracts: ROS names (`/topic`, `/service`,
`/action`, node names), launch arguments (`name:=value`, judged by the command they appear in), node parameters
(`ros2 param set`, `-p name:=`), interface types (`pkg/srv/Name`), controller names (`*_controller`,
`*_broadcaster`), `captain-ros` subcommands and the keys of its safety-limits table; each must exist where it
belongs. A name that is only in the guide is a typo or a name from another version of a vendor's driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "first_real_run.md"
PACKAGE = ROOT / "src" / "captain_ros"
LAUNCH = PACKAGE / "launch"
PROFILES = sorted((PACKAGE / "config" / "robots").glob("*.yaml"))
INTERFACES = ROOT / "src" / "captain_interfaces"

ROS_NAME = re.compile(r"/[A-Za-z_]\w*(?:/[A-Za-z_]\w*)*")
LAUNCH_ARG = re.compile(r"(?<![\w.-])([A-Za-z_][\w.]*):=")
INTERFACE_TYPE = re.compile(r"\b([a-z][a-z0-9_]*)/(msg|srv|action)/([A-Z]\w*)\b")
CONTROLLER = re.compile(r"^[a-z][a-z0-9_]*_(?:controller|broadcaster)$")


def _read(paths) -> str:
    return "\n".join(p.read_text() for p in paths)


PROFILE_TEXT = _read(PROFILES)
CODE_TEXT = _read(sorted((PACKAGE / "captain_ros").rglob("*.py")))
CONFIG_TEXT = _read(sorted((PACKAGE / "config").glob("*.yaml")))
LAUNCH_TEXT = {p.name: p.read_text() for p in sorted(LAUNCH.glob("*.launch.py"))}
CORPUS = "\n".join([PROFILE_TEXT, CODE_TEXT, CONFIG_TEXT, *LAUNCH_TEXT.values()])


# ---------------------------------------------------------------------------------------------- extraction
@dataclass
class Names:
    ros: set[str] = field(default_factory=set)
    launch_args: set[tuple[str, str, str]] = field(default_factory=set)  # (package, launch file or '', argument)
    parameters: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)
    controllers: set[str] = field(default_factory=set)
    subcommands: set[str] = field(default_factory=set)


def code_pieces(markdown: str) -> list[str]:
    """The guide's code: each fenced block's commands (continuation lines joined, comments dropped) and each
    inline code span."""
    pieces = []
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.M | re.S)
    for block in blocks:
        text = re.sub(r"\\\n\s*", " ", block)
        pieces += [re.sub(r"\s+#.*$", "", line) for line in text.splitlines() if line.strip()]
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", markdown, flags=re.M | re.S)
    pieces += re.findall(r"`([^`\n]+)`", prose)
    return pieces


def extract(markdown: str) -> Names:
    names = Names()
    for piece in code_pieces(markdown):
        words = piece.split()
        launch = ("", "")
        if len(words) >= 4 and words[:2] == ["ros2", "launch"]:
            launch = (words[2], words[3])
        for argument in LAUNCH_ARG.findall(piece):
            if re.search(rf"-p\s+{re.escape(argument)}:=", piece):  # ros2 run ... --ros-args -p name:=value
                names.parameters.add(argument)
            else:
                names.launch_args.add((*launch, argument))
        if words[:3] == ["ros2", "param", "set"] and len(words) >= 5:
            names.parameters.add(words[4])
        if words[:1] == ["captain-ros"] and len(words) >= 2:
            names.subcommands.add(words[1])
        names.types.update("/".join(t) for t in INTERFACE_TYPE.findall(piece))
        for token in re.split(r"[\s\"'(),\[\]{}]+", piece):
            word = token.split(":=", 1)[0].rstrip(":;.,")  # a launch argument's value is not a name
            if ROS_NAME.fullmatch(word):
                names.ros.add(word)
            elif CONTROLLER.fullmatch(word):
                names.controllers.add(word)
    return names


# ---------------------------------------------------------------------------------------------- where names live
def ros_name_known(name: str) -> bool:
    """Absolute (`/a/b`) or relative (`a/b`) in the profiles, config, launch files or code. A one-part name
    (`/motion`, `/tf`) must appear with its slash or as a quoted string, so that a plain word does not count."""
    bare = name.lstrip("/")
    if "/" in bare:
        return re.search(rf"(?<![\w/])/?{re.escape(bare)}(?![\w/])", CORPUS) is not None
    return re.search(rf"(?<![\w/])/{re.escape(bare)}(?![\w/])|[\"']{re.escape(bare)}[\"']", CORPUS) is not None


def declared_launch_arguments(launch_file: str) -> set[str]:
    """The arguments a captain_ros launch file declares, with those of the launch files it includes."""
    seen, todo, declared = set(), [launch_file], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in LAUNCH_TEXT:
            continue
        seen.add(name)
        text = LAUNCH_TEXT[name]
        declared |= set(re.findall(r"DeclareLaunchArgument\(\s*\"([^\"]+)\"", text))
        todo += [f for f in re.findall(r"\"(\w+\.launch\.py)\"", text) if f != name]
    return declared


def launch_argument_problem(package: str, launch_file: str, argument: str) -> str:
    if package == "captain_ros":
        if launch_file not in LAUNCH_TEXT:
            return f"ros2 launch captain_ros {launch_file}: no such launch file"
        if argument not in declared_launch_arguments(launch_file):
            return f"{launch_file} (and what it includes) declares no argument '{argument}'"
        return ""
    if package:  # a vendor's launch file: its arguments are the ones the profiles' bring-up notes give
        return "" if f"{argument}:=" in PROFILE_TEXT else f"'{argument}:=' ({package} {launch_file}) is in no profile"
    anywhere = set().union(*(declared_launch_arguments(f) for f in LAUNCH_TEXT))
    if argument in anywhere or f"{argument}:=" in PROFILE_TEXT:
        return ""
    return f"'{argument}:=' is declared by no captain_ros launch file and given in no profile"


def type_known(name: str) -> bool:
    package, kind, type_name = name.split("/")
    if package == "captain_interfaces":
        return (INTERFACES / kind / f"{type_name}.{kind}").is_file()
    imported = re.search(rf"from {package}\.{kind} import [^\n]*\b{type_name}\b", CODE_TEXT) is not None
    return imported or name in CORPUS


def problems(names: Names) -> list[str]:
    found = [f"ROS name {n} is not in the profiles, launch files or code" for n in names.ros if not ros_name_known(n)]
    found += [p for args in names.launch_args if (p := launch_argument_problem(*args))]
    found += [
        f"parameter '{p}' is declared by no node"
        for p in names.parameters
        if not re.search(rf"declare_parameter\(\s*\"{re.escape(p)}\"", CODE_TEXT)
    ]
    found += [f"interface type {t} is not used by the code or profiles" for t in names.types if not type_known(t)]
    found += [f"controller {c} is in no profile" for c in names.controllers if not re.search(rf"\b{c}\b", PROFILE_TEXT)]
    cli = (PACKAGE / "captain_ros" / "cli" / "__init__.py").read_text()
    found += [
        f"captain-ros has no subcommand '{s}'"
        for s in names.subcommands
        if not re.search(rf"add_parser\(\s*\"{re.escape(s)}\"", cli)
        and not re.search(rf"^    \"{re.escape(s)}\": \(\"", cli, re.M)  # DELEGATED: the module parses its arguments
    ]
    return sorted(found)


# ---------------------------------------------------------------------------------------------- tests
def test_every_name_in_the_first_real_run_guide_exists():
    names = extract(GUIDE.read_text())
    # the guide names the vendors' topics, services and actions, and the stack's launch arguments: if extraction
    # found few, it broke (and would pass anything)
    assert len(names.ros) >= 30 and len(names.launch_args) >= 15, names
    assert len(names.controllers) >= 8 and {"approval_mode"} <= names.parameters, names
    assert "std_srvs/srv/Trigger" in names.types and "approve" in names.subcommands
    assert {"/safety/estop", "/franka/joint_states", "/speed_scaling_state_broadcaster/speed_scaling"} <= names.ros
    assert ("captain_ros", "agent.launch.py", "use_twin") in names.launch_args
    assert problems(names) == []


def test_a_misspelt_or_foreign_name_is_caught():
    guide = """
```bash
ros2 launch captain_ros real_arm.launch.py robot_profil:=ur5e   # a typo in our argument
ros2 launch ur_robot_driver ur_control.launch.py ur_typ:=ur5e    # a typo in the vendor's
ros2 topic hz /franka/joint_statez
ros2 param set /motion approval_mod true
```
Start `fr4_arm_controller`, call `/safety/estopp` (`std_srvs/srv/Trigerr`), run `captain-ros aprove`, and pass
`aproval_mode:=true` to `ros2 launch captain_ros harness.launch.py autostart:=false`.
"""
    found = problems(extract(guide))
    expected = [
        "real_arm.launch.py (and what it includes) declares no argument 'robot_profil'",
        "'ur_typ:=' (ur_robot_driver ur_control.launch.py) is in no profile",
        "ROS name /franka/joint_statez",
        "parameter 'approval_mod'",
        "controller fr4_arm_controller",
        "ROS name /safety/estopp",
        "interface type std_srvs/srv/Trigerr",
        "captain-ros has no subcommand 'aprove'",
        "'aproval_mode:=' is declared by no captain_ros launch file",
    ]
    assert len(found) == len(expected), found
    assert all(any(e in f for f in found) for e in expected), found
    # and the correct spellings pass
    assert problems(extract("`ros2 launch captain_ros harness.launch.py autostart:=false` `/safety/estop`")) == []


def test_the_safety_table_covers_exactly_the_keys_of_safety_yaml():
    """Section 5's table: every limit the file sets is explained, and nothing the file lacks."""
    text = GUIDE.read_text()
    section = text.split("## 5. Safety limits", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    config = yaml.safe_load((PACKAGE / "config" / "safety.yaml").read_text())
    keys = [key for part in config.values() for key in part]
    assert len(documented) == len(set(documented)) and len(keys) >= 10
    assert sorted(documented) == sorted(keys)

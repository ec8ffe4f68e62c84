"""Launch files, checked by what can be checked without launch/launch_ros installed.

Every executable a launch file starts is a declared console script of captain_ros (or comes
from a package that package.xml declares), every shared file it references exists, every
launch argument has a description, and every argument that reaches a node parameter has that
parameter's type (launch_ros would otherwise parse it as YAML). Where launch_ros is installed
(a real ROS 2 workspace), the files are also loaded and their descriptions generated.
"""

from __future__ import annotations

import ast
import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.spatial.transform import Rotation

ROOT = Path(__file__).resolve().parents[2] / "src" / "captain_ros"  # the ROS package
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))
REQUIRED = {"sim_twin.launch.py", "real_arm.launch.py", "harness.launch.py", "agent.launch.py", "monitor.launch.py"}


def console_scripts() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="console_scripts") if ep.value.split(".")[0] == "captain_ros"}


def declared_dependencies() -> set[str]:
    root = ET.parse(ROOT / "package.xml").getroot()
    return {el.text for tag in ("depend", "exec_depend") for el in root.iter(tag)}


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    def called(node: ast.Call) -> str | None:
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None

    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and called(n) == name]


def node_actions(tree: ast.AST) -> list[ast.Call]:
    """launch_ros's Node and LifecycleNode actions (a managed node started either way is checked alike)."""
    return calls(tree, "Node") + calls(tree, "LifecycleNode")


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_required_launch_files_exist():
    assert {p.name for p in LAUNCH_FILES} >= REQUIRED


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_nodes_start_declared_executables(path: Path):
    tree = ast.parse(path.read_text())
    scripts = console_scripts()
    dependencies = declared_dependencies()
    for node in node_actions(tree):
        package, executable = keyword(node, "package"), keyword(node, "executable")
        assert isinstance(package, ast.Constant) and isinstance(executable, ast.Constant), (
            f"{path.name}:{node.lineno}: package and executable must be literal strings"
        )
        if package.value == "captain_ros":
            assert executable.value in scripts, f"{path.name}: '{executable.value}' is not a console script"
        else:
            assert package.value in dependencies, f"{path.name}: package '{package.value}' not in package.xml"


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_referenced_share_files_exist(path: Path):
    tree = ast.parse(path.read_text())
    for join in calls(tree, "PathJoinSubstitution"):
        parts = join.args[0]
        assert isinstance(parts, ast.List)
        head, *rest = parts.elts
        assert isinstance(head, ast.Call) and calls(head, "FindPackageShare"), "paths start at FindPackageShare"
        assert all(isinstance(p, ast.Constant) for p in rest), f"{path.name}:{join.lineno}: literal path parts"
        target = ROOT.joinpath(*(p.value for p in rest))
        assert target.is_file(), f"{path.name}:{join.lineno}: {target.relative_to(ROOT)} does not exist"


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_every_argument_has_a_description(path: Path):
    tree = ast.parse(path.read_text())
    arguments = calls(tree, "DeclareLaunchArgument")
    assert arguments, f"{path.name} declares no arguments"
    for arg in arguments:
        description = keyword(arg, "description")
        name = arg.args[0].value if arg.args and isinstance(arg.args[0], ast.Constant) else "?"
        assert isinstance(description, ast.Constant) and len(description.value) > 10, (
            f"{path.name}: argument '{name}' needs a description"
        )


@pytest.mark.skipif(
    importlib.util.find_spec("launch_ros") is None,
    reason="launch_ros is not installable from PyPI; covered by the static checks above",
)
@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_description_generates(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generate_launch_description().entities


# ------------------------------------------------------------------ parameter types
# Under launch_ros, a LaunchConfiguration that reaches a parameter as it is gets parsed as YAML: `0` becomes
# an integer, `true` a bool, `123` an integer even for a string parameter. A node then refuses it (a double
# parameter will not take an integer). Every argument that reaches a parameter must therefore be wrapped
# in ParameterValue(..., value_type=T) with T the parameter's declared type.
NODE_MODULES = ROOT / "captain_ros" / "ros"
# Parameters of nodes from other packages that launch files set, with their types.
EXTERNAL_PARAMETER_TYPES = {
    ("rviz2", "use_sim_time"): "bool",
    ("robot_state_publisher", "robot_description"): "str",
}


def declared_parameter_types(executable: str) -> dict[str, str]:
    """name -> 'float' | 'int' | 'bool' | 'str' from the node's declare_parameter(name, default) calls."""
    types = {}
    for call in calls(ast.parse((NODE_MODULES / f"{executable}.py").read_text()), "declare_parameter"):
        if len(call.args) < 2 or not isinstance(call.args[0], ast.Constant):
            continue
        default = call.args[1]
        if isinstance(default, ast.Constant):
            types[call.args[0].value] = type(default.value).__name__
        elif isinstance(default, ast.Call) and isinstance(default.func, ast.Name):
            types[call.args[0].value] = default.func.id  # str(...), float(...)
    return types


def typing_helpers(tree: ast.Module) -> dict[str, int]:
    """Module functions that return ParameterValue(..., value_type=<one of their parameters>): name -> that
    parameter's position (the launch files' `typed(name, value_type)`)."""
    helpers = {}
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = [a.arg for a in fn.args.args]
        for call in calls(fn, "ParameterValue"):
            value_type = keyword(call, "value_type")
            if isinstance(value_type, ast.Name) and value_type.id in params:
                helpers[fn.name] = params.index(value_type.id)
    return helpers


def parameter_type_problems(source: str, name: str = "<launch file>") -> list[str]:
    """What is wrong with how launch arguments reach node parameters in one launch file's source."""
    tree = ast.parse(source)
    helpers = typing_helpers(tree)
    problems = []
    for node in node_actions(tree):
        package = keyword(node, "package")
        executable = keyword(node, "executable")
        if not (isinstance(package, ast.Constant) and isinstance(executable, ast.Constant)):
            continue
        parameters = keyword(node, "parameters")
        if parameters is None:
            continue  # no parameters (the expert server is an HTTP process, not a ROS node)
        declared = declared_parameter_types(executable.value) if package.value == "captain_ros" else {}
        for entry in parameters.elts if isinstance(parameters, ast.List) else []:
            if isinstance(entry, ast.DictComp):
                problems.append(f"{name}:{entry.lineno}: write the parameters out one by one, each with its type")
                continue
            if not isinstance(entry, ast.Dict):
                continue  # a parameter file (LaunchConfiguration of a path) is typed by its YAML
            for key, value in zip(entry.keys, entry.values, strict=True):
                if not (isinstance(key, ast.Constant) and calls(value, "LaunchConfiguration")):
                    continue
                parameter = f"{name}:{value.lineno}: parameter '{key.value}' of {executable.value}"
                given = None
                if isinstance(value, ast.Call) and calls(value, "ParameterValue") and value.func.id == "ParameterValue":
                    given = keyword(value, "value_type")
                elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in helpers:
                    position = helpers[value.func.id]
                    given = value.args[position] if len(value.args) > position else None
                if not isinstance(given, ast.Name):
                    problems.append(f"{parameter} gets a launch argument without ParameterValue(..., value_type=...)")
                    continue
                expected = declared.get(key.value) or EXTERNAL_PARAMETER_TYPES.get((package.value, key.value))
                if expected and given.id != expected:
                    problems.append(f"{parameter} is declared {expected} but typed {given.id}")
    return problems


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_every_argument_reaches_a_parameter_with_its_declared_type(path: Path):
    assert parameter_type_problems(path.read_text(), path.name) == []


def test_the_type_check_catches_the_yaml_typing_bug():
    """The sim_twin.launch.py of before: `real_time_factor:=0` reached the float parameter as the integer 0."""
    untyped = """
twin = Node(package="captain_ros", executable="twin_node",
            parameters=[{"real_time_factor": LaunchConfiguration("real_time_factor"), "task": "fixed"}])
"""
    comprehension = """
motion = Node(package="captain_ros", executable="motion_node",
              parameters=[{n: LaunchConfiguration(n) for n in ("watchdog", "control_period_s")}])
"""
    mistyped = """
twin = Node(package="captain_ros", executable="twin_node",
            parameters=[{"real_time_factor": ParameterValue(LaunchConfiguration("rtf"), value_type=int)}])
"""
    assert "without ParameterValue" in " ".join(parameter_type_problems(untyped))
    assert "one by one" in " ".join(parameter_type_problems(comprehension))
    assert "declared float but typed int" in " ".join(parameter_type_problems(mistyped))
    managed = """
motion = LifecycleNode(package="captain_ros", executable="motion_node", name="motion", namespace="",
                       parameters=[{"autostart": LaunchConfiguration("autostart")}])
"""
    assert "without ParameterValue" in " ".join(parameter_type_problems(managed))


def test_the_nodes_declare_the_typed_parameters():
    """The check above compares against declare_parameter defaults; make sure it finds them."""
    assert declared_parameter_types("twin_node")["real_time_factor"] == "float"
    assert declared_parameter_types("motion_node")["watchdog"] == "bool"
    assert declared_parameter_types("motion_node")["robot_profile"] == "str"
    assert declared_parameter_types("motion_node")["autostart"] == "bool"


def test_the_harness_launch_lets_the_operator_manage_the_motion_node():
    """harness.launch.py starts the (lifecycle) motion node self-starting by default, and passes autostart:=false
    through for operators who step it with `ros2 lifecycle set /motion configure|activate`."""
    source = (ROOT / "launch" / "harness.launch.py").read_text()
    tree = ast.parse(source)
    arguments = {a.args[0].value: a for a in calls(tree, "DeclareLaunchArgument")}
    assert keyword(arguments["autostart"], "default_value").value == "true"
    (motion,) = [n for n in node_actions(tree) if keyword(n, "executable").value == "motion_node"]
    (parameters,) = keyword(motion, "parameters").elts
    given = dict(zip((k.value for k in parameters.keys), parameters.values, strict=True))
    value = given["autostart"]  # typed("autostart", bool): the launch argument of that name, as a bool
    assert [a.value for a in ast.walk(value) if isinstance(a, ast.Constant)] == ["autostart"]
    assert "ros2 lifecycle set /motion configure" in ast.get_docstring(tree)


def test_the_self_collision_waiver_is_off_unless_the_operator_names_it():
    """allow_unchecked_self_collision: a launch argument of harness.launch.py (so of real_arm.launch.py, whose
    arguments pass through), false by default, given to the motion node as its bool parameter."""
    tree = ast.parse((ROOT / "launch" / "harness.launch.py").read_text())
    arguments = {a.args[0].value: a for a in calls(tree, "DeclareLaunchArgument")}
    assert keyword(arguments["allow_unchecked_self_collision"], "default_value").value == "false"
    (motion,) = [n for n in node_actions(tree) if keyword(n, "executable").value == "motion_node"]
    (parameters,) = keyword(motion, "parameters").elts
    given = dict(zip((k.value for k in parameters.keys), parameters.values, strict=True))
    value = given["allow_unchecked_self_collision"]
    assert [a.value for a in ast.walk(value) if isinstance(a, ast.Constant)] == ["allow_unchecked_self_collision"]
    assert declared_parameter_types("motion_node")["allow_unchecked_self_collision"] == "bool"


# ------------------------------------------------------------------ real arm
@pytest.mark.parametrize(
    ("name", "real_default", "twin_default", "kind"),
    [
        ("shadow_check", "true", "false", "bool"),
        ("estop_deadline_s", "0.5", "0.0", "float"),
        ("use_moveit", "false", "false", "bool"),
    ],
)
def test_real_arm_safety_defaults_reach_the_motion_node(name, real_default, twin_default, kind):
    """real_arm.launch.py turns the shadow check on, gives the e-stop topic a 0.5 s deadline and leaves MoveIt's
    planning-scene check off unless asked (use_moveit:=true needs a running move_group); each is passed to
    harness.launch.py, whose motion node takes it as its typed parameter (off there by default: the twin's own
    launch)."""
    real = ast.parse((ROOT / "launch" / "real_arm.launch.py").read_text())
    arguments = {a.args[0].value: a for a in calls(real, "DeclareLaunchArgument")}
    assert keyword(arguments[name], "default_value").value == real_default
    (include,) = [i for i in calls(real, "IncludeLaunchDescription") if keyword(i, "launch_arguments") is not None]
    passed = [c.value for c in ast.walk(keyword(include, "launch_arguments")) if isinstance(c, ast.Constant)]
    assert passed.count(name) == 2  # the key and the LaunchConfiguration it takes
    harness = ast.parse((ROOT / "launch" / "harness.launch.py").read_text())
    arguments = {a.args[0].value: a for a in calls(harness, "DeclareLaunchArgument")}
    assert keyword(arguments[name], "default_value").value == twin_default
    assert declared_parameter_types("motion_node")[name] == kind


def test_real_arm_leaves_robot_state_publisher_to_the_vendor_by_default():
    tree = ast.parse((ROOT / "launch" / "real_arm.launch.py").read_text())
    arguments = {a.args[0].value: a for a in calls(tree, "DeclareLaunchArgument")}
    assert keyword(arguments["own_state_publisher"], "default_value").value == "false"
    (publisher,) = [n for n in calls(tree, "Node") if keyword(n, "package").value == "robot_state_publisher"]
    condition = keyword(publisher, "condition")
    assert isinstance(condition, ast.Call) and condition.func.id == "IfCondition"
    assert calls(condition, "LaunchConfiguration")[0].args[0].value == "own_state_publisher"
    (extrinsics,) = [n for n in calls(tree, "Node") if keyword(n, "package").value == "tf2_ros"]
    assert keyword(extrinsics, "executable").value == "static_transform_publisher"


def _urdf_joint(root: ET.Element, child: str) -> tuple[str, np.ndarray]:
    joint = next(j for j in root.iter("joint") if j.find("child").get("link") == child)
    origin = joint.find("origin")
    transform = np.eye(4)
    transform[:3, :3] = Rotation.from_euler("xyz", [float(v) for v in origin.get("rpy", "0 0 0").split()]).as_matrix()
    transform[:3, 3] = [float(v) for v in origin.get("xyz", "0 0 0").split()]
    return joint.find("parent").get("link"), transform


@pytest.mark.parametrize(
    ("profile", "urdf", "parents"),
    [
        ("panda_twin", "panda.urdf", {}),
        ("franka_fr3", "panda.urdf", {"panda_link0": "fr3_link0", "panda_hand": "fr3_hand"}),  # its shadow twin
        ("ur5e", "ur5e_twin.urdf", {"gripper_base_link": "hand_e_base_link"}),  # the twin's gripper -> the Hand-E
    ],
)
def test_camera_calibration_is_the_twins_mounting_until_calibrated(profile, urdf, parents):
    """config/camera_calibration/<profile>.yaml: each optical frame in the frame the twin's URDF mounts its camera
    on (the real arm's name for it), with the URDF's nominal values (camera joint composed with optical joint), so
    the twin and the arm agree until someone calibrates."""
    root = ET.parse(ROOT / "urdf" / urdf).getroot()
    cameras = yaml.safe_load((ROOT / "config" / "camera_calibration" / f"{profile}.yaml").read_text())["cameras"]
    assert set(cameras) == {"head", "wrist"}
    for name, cam in cameras.items():
        link, optical = _urdf_joint(root, cam["child_frame"])
        parent, mount = _urdf_joint(root, link)
        assert cam["parent_frame"] == parents.get(parent, parent), f"{name}: the URDF mounts {link} on {parent}"
        nominal = mount @ optical
        quat = np.array(cam["rotation_xyzw"], dtype=float)
        assert abs(np.linalg.norm(quat) - 1.0) < 1e-5, f"{name}: rotation_xyzw is not a unit quaternion"
        np.testing.assert_allclose(cam["translation_m"], nominal[:3, 3], atol=1e-6, err_msg=name)
        np.testing.assert_allclose(Rotation.from_quat(quat).as_matrix(), nominal[:3, :3], atol=1e-5, err_msg=name)


def test_real_arm_takes_the_profiles_calibration_unless_given_one():
    """camera_calibration defaults to "": camera_extrinsics then reads the profile's own file, through
    core/camera_calibration.py, which checks it against the profile (its tests: test_camera_calibration.py)."""
    tree = ast.parse((ROOT / "launch" / "real_arm.launch.py").read_text())
    arguments = {a.args[0].value: a for a in calls(tree, "DeclareLaunchArgument")}
    assert keyword(arguments["camera_calibration"], "default_value").value == ""
    (function,) = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "camera_extrinsics"]
    called = {c.func.id for c in ast.walk(function) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert {"load_profile", "calibration_path", "load_calibration"} <= called


def test_real_arm_names_its_profile_and_starts_with_approval_on():
    """No default arm on a physical robot (launch refuses to start without robot_profile:=...), the profile reaches
    the harness include, and every physical action waits for an operator unless approval_mode:=false."""
    tree = ast.parse((ROOT / "launch" / "real_arm.launch.py").read_text())
    arguments = {a.args[0].value: a for a in calls(tree, "DeclareLaunchArgument")}
    assert keyword(arguments["robot_profile"], "default_value") is None
    assert keyword(arguments["approval_mode"], "default_value").value == "true"
    (include,) = [i for i in calls(tree, "IncludeLaunchDescription") if keyword(i, "launch_arguments") is not None]
    passed = [c.value for c in ast.walk(keyword(include, "launch_arguments")) if isinstance(c, ast.Constant)]
    assert passed.count("robot_profile") == 2


def test_the_launch_shuts_down_when_the_motion_node_exits():
    tree = ast.parse((ROOT / "launch" / "harness.launch.py").read_text())
    (handler,) = calls(tree, "OnProcessExit")
    assert isinstance(keyword(handler, "target_action"), ast.Name) and keyword(handler, "target_action").id == "motion"
    (shutdown,) = calls(keyword(handler, "on_exit"), "Shutdown")
    assert "no longer guarded" in keyword(shutdown, "reason").value
    returned = calls(tree, "LaunchDescription")[-1]
    assert any(isinstance(n, ast.Name) and n.id == "motion_died" for n in ast.walk(returned))

"""The two ROS 2 packages are well-formed for colcon, and package.xml declares exactly what the code imports.

"What the nodes import" is the import graph of the three node modules, followed through every
first-party module they reach (module-level and deferred imports alike: a deferred import runs while the
node serves). Each third-party module maps to the rosdep key that provides it through ROSDEP_KEYS below;
a new import fails these tests until its key is looked up and added there and to package.xml.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "captain_ros"
FIRST_PARTY = {"captain_ros", "captain_ros_training"}
NODE_MODULES = [
    "captain_ros.ros.twin_node",
    "captain_ros.ros.motion_node",
    "captain_ros.ros.perception_node",
    "captain_ros.ros.agent_node",
    "captain_ros.ros.operator_view",
]
ROS_MODULE = re.compile(r"^(rclpy|ament_index_python|tf2_ros|launch|launch_ros|\w+_(msgs|srvs|interfaces))$")

# Python module -> rosdep key (ros/rosdistro: rosdep/python.yaml and base.yaml; ROS packages by name from
# <distro>/distribution.yaml). A ROS package's Python module has the package's name, so those map to
# themselves; the rest are looked up by hand.
ROSDEP_KEYS = {
    "numpy": "python3-numpy",
    "scipy": "python3-scipy",
    "yaml": "python3-yaml",  # PyYAML
    "cv2": "python3-opencv",
    # MuJoCo has no Debian/Ubuntu package: the pip key makes rosdep install it with pip.
    "mujoco": "python3-mujoco-pip",
    # python3-open3d is null on Ubuntu Noble (24.04, Jazzy's platform): the pip key installs `open3d`.
    "open3d": "python3-open3d-pip",
    "httpx": "python3-httpx",  # the agent's policy client (rosdep/python.yaml)
    "PIL": "python3-pil",  # images attached to model requests
    # self-collision (captain_ros.core.collision): no distro packages python-fcl or trimesh; both keys are pip keys
    "fcl": "python-fcl-pip",
    "trimesh": "python3-trimesh-pip",  # loads the description's collision meshes
}
# Imported somewhere in the package but by no node (or by a node only on an optional path, inside the function
# that needs it), and optional where it is imported: not declared.
NOT_DECLARED = {
    # moveit-py (rosdep key moveit_py) is optional: use_moveit takes it where it imports (interfaces.moveit.api auto,
    # captain_ros.ros.moveit_py_scene) and move_group's services otherwise; declaring it would install MoveIt always.
    "moveit": "optional: use_moveit through moveit-py where it is installed",
    # `captain-ros doctor` reports whether the CPU torch build is there; the trainer (a later issue)
    # installs it from requirements/pip-only.in, which pins the CPU build rosdep's key would not.
    "torch": "optional doctor check",
    # captain_ros.ros.frames uses tf2_ros.Buffer where tf2_ros is installed (every ROS workspace: tf2_ros_py is
    # declared) and pytransform3d only in the wheel setups without it; pytransform3d has no rosdep key.
    "pytransform3d": "tf buffer where tf2_ros is not installed (wheel setups); pip-only.in",
    # The sim bridge (captain_ros.bridge: rollouts, transport, exports, evaluation) and the trainer run off the robot;
    # no node imports them. Their dependencies come from requirements/pip-only.in (`make setup`), not rosdep.
    "tqdm": "sim bridge and trainer progress bars",
    "zmq": "sim bridge transport (pyzmq)",
    "pyarrow": "sim bridge Parquet export",
    "rosbags": "sim bridge MCAP export",
    "ray": "sim bridge rollouts across machines",
    "matplotlib": "evaluation and trainer plots",
    "triton": "the trainer's CUDA kernels (captain_ros_training.kernels; ships with CUDA builds of torch)",
    "transformers": "trainer",
    "peft": "trainer (LoRA)",
    "safetensors": "trainer (weight sync; comes with transformers)",
    # The LIBERO server runs in its own venv (.venv-libero: robosuite 1.4, MuJoCo < 4); no node imports it.
    "libero": "LIBERO server (captain_ros.libero.server), .venv-libero from requirements/libero-lock.txt",
    "robosuite": "LIBERO server (the same venv)",
}
# Packages a launch file starts (Node(package=...)) without importing them.
LAUNCHED = {"robot_state_publisher", "tf2_ros", "rviz2"}


def manifest(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "package" and root.get("format") == "3"
    return root


def deps(root: ET.Element, *tags: str) -> set[str]:
    return {el.text for tag in tags for el in root.iter(tag)}


def imported_top_level_modules(folder: Path) -> set[str]:
    modules = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules


def module_file(module: str) -> Path | None:
    path = PKG.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def node_imports() -> dict[str, set[str]]:
    """Third-party top-level module -> the first-party modules that import it, over everything the
    node modules reach through first-party imports (absolute or relative, module-level or deferred)."""
    third_party: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo = list(NODE_MODULES)
    while todo:
        module = todo.pop()
        path = module_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a module runs its packages
        package = parts if path.name == "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                names = [target] + [f"{target}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in FIRST_PARTY:
                    todo.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    third_party.setdefault(top, set()).add(module)
    return third_party


def rosdep_key(module: str) -> str:
    if ROS_MODULE.match(module):
        return "tf2_ros_py" if module == "tf2_ros" else module
    assert module in ROSDEP_KEYS, (
        f"'{module}' has no rosdep key in ROSDEP_KEYS: look it up in ros/rosdistro rosdep/python.yaml or base.yaml "
        "(a `python3-<name>-pip` key where no distro packages it), add it there and to package.xml"
    )
    return ROSDEP_KEYS[module]


def test_captain_ros_manifest():
    root = manifest(PKG / "package.xml")
    assert root.findtext("name") == "captain_ros"
    assert deps(root, "buildtool_depend") == {"ament_python"}
    assert root.find("export/build_type").text == "ament_python"
    assert (PKG / "resource" / "captain_ros").is_file()
    assert "script_dir=$base/lib/captain_ros" in (PKG / "setup.cfg").read_text()


def test_every_import_of_the_nodes_is_declared_with_its_rosdep_key():
    declared = deps(manifest(PKG / "package.xml"), "depend", "exec_depend")
    imports = node_imports()
    assert {"rclpy", "mujoco", "open3d"} <= set(imports), "the import graph lost the nodes' imports"
    missing = [
        f"{rosdep_key(m)} (import {m} in {min(imports[m])})"
        for m in imports
        if m not in NOT_DECLARED and rosdep_key(m) not in declared
    ]
    assert not missing, f"missing from package.xml: {sorted(missing)}"


def test_franka_msgs_is_declared_on_a_condition_a_ur_only_workspace_turns_off():
    """franka_msgs is built with franka_ros2 from source (no binary on Jazzy or Kilted): declared, but on a
    package.xml condition (REP 149) so that `CAPTAIN_ROS_FRANKA=0 rosdep install` resolves a UR-only workspace."""
    (franka,) = [el for el in manifest(PKG / "package.xml").iter("exec_depend") if el.text == "franka_msgs"]
    assert franka.get("condition") == "$CAPTAIN_ROS_FRANKA != 0"
    interfaces = manifest(ROOT / "src" / "captain_interfaces" / "package.xml")
    assert "action_msgs" in deps(interfaces, "depend")  # MoveTo.action's goal ids and status


def test_package_xml_declares_nothing_that_nothing_uses():
    declared = deps(manifest(PKG / "package.xml"), "depend", "exec_depend")
    used = {rosdep_key(m) for m in node_imports() if m not in NOT_DECLARED}
    for folder in ("captain_ros", "captain_ros_training", "launch"):
        for module in imported_top_level_modules(PKG / folder):
            if module in FIRST_PARTY or module in sys.stdlib_module_names or module in NOT_DECLARED:
                continue
            if module != "__future__":
                used.add(rosdep_key(module))
    unused = declared - used - LAUNCHED
    assert not unused, f"package.xml declares what nothing imports or launches: {sorted(unused)}"


def test_the_import_graph_sees_every_module_the_nodes_load_at_start_up():
    """The static graph above is checked against what really happens: import each node module in a fresh
    interpreter and record every import statement that first-party code executes."""
    probe = f"""
import builtins, json, sys
seen = set()
real_import = builtins.__import__
def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    caller = (globals or {{}}).get("__name__") or ""
    if level == 0 and caller.split(".")[0] in {sorted(FIRST_PARTY)!r}:
        seen.add(name.split(".")[0])
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = recording_import
for module in {NODE_MODULES!r}:
    __import__(module)
print(json.dumps(sorted(m for m in seen if m not in sys.stdlib_module_names and m not in {sorted(FIRST_PARTY)!r})))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    at_start_up = set(json.loads(proc.stdout.splitlines()[-1])) - {"__future__"}
    assert at_start_up, "recorded no imports"
    unseen = at_start_up - set(node_imports())
    assert not unseen, f"imported at start-up but not seen by the import graph: {sorted(unseen)}"


def test_interface_package_lists_every_interface_file():
    pkg = ROOT / "src" / "captain_interfaces"
    root = manifest(pkg / "package.xml")
    assert root.find("export/build_type").text == "ament_cmake"
    assert "rosidl_interface_packages" in {el.text for el in root.iter("member_of_group")}
    cmake = (pkg / "CMakeLists.txt").read_text()
    listed = set(re.findall(r'"((?:msg|srv|action)/\w+\.(?:msg|srv|action))"', cmake))
    on_disk = {str(p.relative_to(pkg)) for kind in ("msg", "srv", "action") for p in (pkg / kind).glob("*")}
    assert listed == on_disk


def test_setup_ships_launch_config_and_urdf():
    text = (PKG / "setup.py").read_text()
    for folder in ("launch", "config", "urdf"):
        assert f'share_tree("{folder}")' in text
    assert "captain-ros = captain_ros.cli:main" in text

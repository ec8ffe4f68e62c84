"""The two ROS 2 packages are well-formed for colcon and declare what the code imports."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "captain_ros"
ROS_MODULE = re.compile(r"^(rclpy|ament_index_python|tf2_ros|launch|launch_ros|\w+_(msgs|srvs|interfaces))$")


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


def test_captain_ros_manifest():
    root = manifest(PKG / "package.xml")
    assert root.findtext("name") == "captain_ros"
    assert deps(root, "buildtool_depend") == {"ament_python"}
    assert root.find("export/build_type").text == "ament_python"
    assert (PKG / "resource" / "captain_ros").is_file()
    assert "script_dir=$base/lib/captain_ros" in (PKG / "setup.cfg").read_text()


def test_every_ros_package_the_code_imports_is_declared():
    declared = deps(manifest(PKG / "package.xml"), "depend", "exec_depend")
    used = set()
    for folder in ("captain_ros", "sim_bridge", "training", "launch"):
        used |= {m for m in imported_top_level_modules(PKG / folder) if ROS_MODULE.match(m)}
    used.discard("tf2_ros")  # its rosdep key is tf2_ros_py
    assert used <= declared, f"missing from package.xml: {sorted(used - declared)}"


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

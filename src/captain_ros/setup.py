"""captain_ros: an ament_python package that also installs with plain pip (see README)."""

from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "captain_ros"
HERE = Path(__file__).parent


def share_tree(folder: str) -> list[tuple[str, list[str]]]:
    """data_files entries that install `folder` under share/captain_ros, keeping sub-folders."""
    entries: dict[str, list[str]] = {}
    for path in sorted((HERE / folder).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(HERE)
            entries.setdefault(str(Path("share", PACKAGE, rel.parent)), []).append(str(rel))
    return sorted(entries.items())


# One console script per node, plus the command-line tool. Launch files may start only these.
NODES = {
    "twin_node": "captain_ros.ros.twin_node:main",
    "motion_node": "captain_ros.ros.motion_node:main",
    "perception_node": "captain_ros.ros.perception_node:main",
    "agent_node": "captain_ros.ros.agent_node:main",
    "operator_view": "captain_ros.ros.operator_view:main",
    "expert_server": "captain_ros.cli.expert_server_cli:main",  # not a ROS node: the scripted expert's HTTP API
}

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=["captain_ros", "captain_ros.*", "captain_ros_training", "captain_ros_training.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        *share_tree("launch"),
        *share_tree("config"),
        *share_tree("urdf"),
    ],
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="captain_ros maintainers",
    maintainer_email="maintainers@captain-ros.dev",
    description="Code-as-policy robot agent stack on ROS 2 with a MuJoCo twin and a trainer.",
    license="Apache-2.0",
    python_requires=">=3.11",
    entry_points={
        "console_scripts": [
            "captain-ros = captain_ros.cli:main",
            *(f"{name} = {target}" for name, target in NODES.items()),
        ],
    },
)

"""A standard ROS 2 workspace builds this repository and starts a node from the install space.

A temporary workspace's src/ holds a copy of this working tree (tracked files and untracked ones git does
not ignore). colcon from PyPI runs there with the venv's interpreter, as `python -m colcon` does in a venv
on a ROS machine, against the ROS 2 wheels of the venv as the underlay (what `source
/opt/ros/<distro>/setup.bash` provides on a ROS install: AMENT_PREFIX_PATH, CMAKE_PREFIX_PATH, PATH).
`colcon list` must find both packages, `colcon build` with default arguments must build both, and twin_node
must start from install/ the way `ros2 run captain_ros twin_node` starts it: with the environment of
install/setup.sh, found through the ament index, and answering a service over DDS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .nodes import client_node, result_of, start_node, wait_for_server

pytest.importorskip("colcon_core", reason="colcon is installed into .venv by `make setup` (requirements/colcon.txt)")
rclpy = pytest.importorskip("rclpy")
from captain_interfaces.srv import ResetEpisode  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ros]

REPO = Path(__file__).resolve().parents[2]
UNDERLAY = Path(sys.prefix)  # the venv: ROS 2 wheels, captain_interfaces' dependencies, colcon


def copy_working_tree(dest: Path) -> int:
    """Copy tracked and untracked-but-not-ignored files (not .venv, build outputs, ...); returns the count."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    count = 0
    for raw in filter(None, listed):
        source = REPO / os.fsdecode(raw)
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            target = dest / os.fsdecode(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            count += 1
    return count


def underlay_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLCON_PREFIX_PATH")}
    env["PATH"] = f"{UNDERLAY / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["AMENT_PREFIX_PATH"] = str(UNDERLAY)
    env["CMAKE_PREFIX_PATH"] = str(UNDERLAY)
    return env


def colcon(workspace: Path, *args: str, timeout_s: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "colcon", *args],
        cwd=workspace,
        env=underlay_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def install_space_env(install: Path) -> dict[str, str]:
    """The environment `. install/setup.sh` gives (colcon writes setup.sh; setup.bash needs colcon-bash)."""
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    proc = subprocess.run(
        ["sh", "-c", '. "$1/setup.sh" && exec "$2" -c "$3"', "sh", str(install), sys.executable, dump],
        env=underlay_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def in_env(env: dict[str, str], code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("colcon_ws")
    assert copy_working_tree(ws / "src" / "captain_ros") > 50
    return ws


def test_colcon_lists_both_packages(workspace):
    proc = colcon(workspace, "list")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split("\t")[0]: line.split("\t")[-1] for line in proc.stdout.splitlines()}
    assert listed == {"captain_interfaces": "(ros.ament_cmake)", "captain_ros": "(ros.ament_python)"}, proc.stdout


def test_colcon_builds_both_and_twin_node_starts_from_the_install_space(workspace, node_processes):
    proc = colcon(workspace, "build")
    assert proc.returncode == 0, f"colcon build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    for package in ("captain_interfaces", "captain_ros"):
        assert f"Finished <<< {package}" in proc.stdout, proc.stdout[-2000:]
    install = workspace / "install"
    env = install_space_env(install)

    # what `ros2 run captain_ros twin_node` does: the package's prefix from the ament index, then lib/<pkg>/<exe>
    lookup = "from ament_index_python.packages import get_package_prefix; print(get_package_prefix('captain_ros'))"
    prefix = Path(in_env(env, lookup))
    assert prefix == install / "captain_ros"
    executable = prefix / "lib" / "captain_ros" / "twin_node"
    assert os.access(executable, os.X_OK)
    # the built copy is what runs, not the editable install of the checkout in .venv
    assert in_env(env, "import captain_ros; print(captain_ros.__file__)").startswith(str(install))
    assert in_env(env, "import captain_interfaces; print(captain_interfaces.__file__)").startswith(str(install))
    share = in_env(env, "from captain_ros.paths import config_path; print(config_path('robots/panda_twin.yaml'))")
    assert share.startswith(str(install / "captain_ros" / "share" / "captain_ros")), share

    twin = start_node(executable, ("camera_rate_hz", 0.0), env=env)
    node_processes.append(twin)
    twin.wait_for_line("twin ready")
    with client_node("colcon_client") as client:
        reset = client.create_client(ResetEpisode, "/twin/reset")
        wait_for_server(reset, twin)
        start = "put_red_cube_in_bowl/official/2"
        reply = result_of(reset.call_async(ResetEpisode.Request(task="put_red_cube_in_bowl", start_id=start)), 120)
    assert reply.success and reply.start_id == start, reply.message

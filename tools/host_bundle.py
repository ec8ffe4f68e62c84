#!/usr/bin/env python3
"""Build a bundle that lets the stack's rollouts run on a GPU host without network.

The host (this workplace's lent GPU machines) has Python 3.12 with torch, transformers, numpy, scipy, opencv,
httpx, pyyaml, ... but not MuJoCo, Open3D or pyzmq, no bubblewrap and maybe no GL loader libraries. The bundle
holds exactly what the rollout path (twin workers, harness, perception, the agent's episode loop and bwrap sandbox,
the recording proxy, transport, the episode store, captain_ros_training.student_eval and captain_ros_training.hf_serve)
needs beyond that:

  wheels/     cp312 manylinux x86_64 wheels, at the versions of requirements/lock.txt: the distributions those
              modules import (found by importing them in .venv and reading which files sys.modules holds) minus
              the host's, less those the imports succeed without (IPython under dash), plus any the smoke episode
              misses at run time (PyOpenGL, which MuJoCo loads for EGL only when it renders). Declared requirements
              that nothing imports (open3d's nbformat, ipywidgets, flask, ...) are left out; plan.json lists all of
              it with the reasons. open3d-cpu is carried without its GUI resources, TensorFlow/PyTorch ops,
              Open3D-ML, examples and Jupyter files (100 -> 71 MiB; --no-slim keeps them)
  debs/       Debian 12's GL loader packages (libegl1, libopengl0, libglvnd0, ...) for MuJoCo's EGL rendering
  bwrap/      bwrap (a wrapper script) with the real binary and its libs in bwrap/lib; the wrapper sets
              LD_LIBRARY_PATH for bwrap alone (the sandbox clears the environment of what runs inside)
  install.sh  on the host: installs the wheels into /tmp/site (once), unpacks the GL debs into / if a loader is
              missing, and prints the export lines (PYTHONPATH, PATH, MUJOCO_GL=egl, ...) to eval
  smoke.sh    on the host: install.sh, then ONE scripted-expert episode on the twin through `captain-ros rollout`
              (python3 -m captain_ros.cli, no images, no shipping), its summary, and one sandbox cell
  plan.json   what was chosen and why, with every file's size and sha256

The planning runs in a stand-in for the host: --python (.venv) with every distribution refused that is neither
the host's (the list read from KINDS.md, --host-packages) nor planned, in every process the rollout starts.

Commands:
  plan    work out the wheels (imports the rollout modules, tries leaving each candidate out; --run adds the
          episode) and print them; downloads nothing
  build   plan (with the episode), download the wheels and debs, copy bwrap, write the scripts and print the
          bundle's size, its contents and how to get it to the host
  check   a built bundle in the stand-in: the imports, and with --run the smoke episode (services and twin
          workers included)

Standard library only. Examples:
  python3 tools/host_bundle.py plan
  python3 tools/host_bundle.py build --out .cache/host_bundle
  python3 tools/host_bundle.py check --out .cache/host_bundle --run

  # on the host, from the checkout's root (the bundle travels inside it, or in tools/carry.py parts: build says):
  bash .cache/host_bundle/smoke.sh                          # install + one episode + one sandbox cell
  eval "$(bash .cache/host_bundle/install.sh)"              # install and set this shell's environment
  python3 -m captain_ros.cli rollout --tasks all --workers 8 --no-images --no-ship --runs-dir /tmp/runs

Exit status: 0 done, 1 a step failed (the message names it), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_SRC = ROOT / "src" / "captain_ros"
MIB = 1 << 20
BUNDLE_LIMIT_MIB = 56.0  # what one device call carries (64 MiB) less the working tree and some room

# The rollout path: what `captain-ros rollout` runs (cli, host, engine, twin workers, harness, perception, episode
# loop, sandbox and its child, proxy, expert server, transport, store) and the trainer-side evaluation and server.
ROLLOUT_MODULES = (
    "captain_ros.cli",
    "captain_ros.cli.rollout_cli",
    "captain_ros.cli.evaluation_cli",
    "captain_ros.bridge.host",
    "captain_ros.bridge.rollout",
    "captain_ros.bridge.services",
    "captain_ros.bridge.proxy",
    "captain_ros.cli.proxy_cli",
    "captain_ros.cli.transport_cli",
    "captain_ros.bridge.store",
    "captain_ros.bridge.recorder",
    "captain_ros.worlds",
    "captain_ros.worlds.twin",
    "captain_ros.worlds.twin.privileged",
    "captain_ros.worlds.twin.link",
    "captain_ros.bridge.evaluation",
    "captain_ros.agent.expert_server",
    "captain_ros.cli.expert_server_cli",
    "captain_ros.agent.episode",
    "captain_ros.agent.policy_client",
    "captain_ros.agent.link",
    "captain_ros.agent.sandbox",
    "captain_ros.agent.sandbox_child",
    "captain_ros.twin.sim",
    "captain_ros.twin.tasks",
    "captain_ros.twin.start_states",
    "captain_ros.twin.cameras",
    "captain_ros.harness.harness",
    "captain_ros.harness.twin_backend",
    "captain_ros.perception.perception",
    "captain_ros_training.student_eval",
    "captain_ros_training.cli",
    "captain_ros_training.cli.student_eval_cli",
    "captain_ros_training.serve",
    "captain_ros_training.hf_serve",
    "captain_ros_training.cli.hf_serve_cli",
)
# Modules that may not exist yet (being written elsewhere); their absence is reported, not an error.
OPTIONAL_MODULES: frozenset[str] = frozenset()
FIRST_PARTY = frozenset({"captain-ros", "captain_ros", "captain_ros_training"})
# Host packages carried anyway, at lock.txt's version, where the host's is too old for the rollout path
NEWER_THAN_HOST = {
    "transformers": "captain_ros_training.hf_serve drives transformers' continuous batching through internals of the "
    "locked version (the host has 5.17)",
}

# The 'cuda' image's Python packages (KINDS.md, "Python packages already there", read 2026-11-17). --host-packages
# takes a newer list (one name a line, or that section's "Packages: a, b, c." line).
HOST_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""

# The host's interpreter, for environment markers (Requires-Dist: foo; python_version < "3.13").
HOST_MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "platform_release": "",
    "platform_version": "",
    "extra": "",
}
VERSION_MARKERS = frozenset({"python_version", "python_full_version", "implementation_version"})

PIP_DOWNLOAD = (
    "download",
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--abi",
    "abi3",
    "--abi",
    "none",
)
# pip matches manylinux_2_N exactly: name every N up to the host's glibc (Ubuntu 24.04: 2.39)
WHEEL_PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Parts of wheels the rollout path never loads, dropped from the carried copy (--no-slim keeps them). open3d-cpu:
# the GUI's fonts and materials, the TensorFlow and PyTorch ops (open3d.ml.tf / .torch), Open3D-ML, the examples
# and the Jupyter extensions: 100 -> about 70 MiB. Perception uses PointCloud, segment_plane and select_by_index.
SLIM = {
    "open3d-cpu": (
        "open3d/resources/",
        "open3d/open3d_tf_ops.so",
        "open3d/open3d_torch_ops.so",
        "open3d/_ml3d/",
        "open3d/examples/",
        "open3d/labextension/",
        "open3d/nbextension/",
        "*.data/",
    ),
}
# Debian's packages for the libraries the host lacks: the GL loaders (MuJoCo's EGL rendering) and libusb (which
# open3d's extension links against; seen missing on the host 2026-12-05)
GL_DEBS = ("libvulkan1", "libegl1", "libglvnd0", "libopengl0", "libgl1", "libglx0", "libgles2", "libusb-1.0-0")
GL_SONAMES = (
    "libEGL.so.1",
    "libOpenGL.so.0",
    "libGLdispatch.so.0",
    "libGL.so.1",
    "libGLX.so.0",
    "libGLESv2.so.2",
    "libvulkan.so.1",
    "libusb-1.0.so.0",
)
BWRAP_LIBS = ("libselinux.so.1", "libcap.so.2", "libpcre2-8.so.0")
APT_OPTIONS = (
    "-oAPT::Architecture=amd64",
    "-oAPT::Architectures=amd64",
    "-oDir::State::Lists=/tmp/amd64",
)
SMOKE_ROLLOUT = (
    "rollout",
    "--tasks",
    "put_red_cube_in_bowl",
    "--split",
    "train",
    "--starts-per-task",
    "1",
    "--group-size",
    "1",
    "--workers",
    "1",
    "--no-images",
    "--no-ship",
)


class BundleError(Exception):
    """A step failed; the message says which and what to do."""


def say(msg: str = "") -> None:
    print(f"[host_bundle] {msg}" if msg else "", flush=True)


# ---------------------------------------------------------------------------------------------- names, markers
def normalize(name: str) -> str:
    """PEP 503: `Typing_Extensions` and `typing.extensions` are `typing-extensions`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_host_packages(text: str) -> frozenset[str]:
    """Names from one a line, a whitespace- or comma-separated list, or KINDS.md's section ("Packages: a, b.")."""
    match = re.search(r"\bPackages:\s*(.+)$", text, flags=re.M)
    if match:
        text = match.group(1)
    words = re.split(r"[\s,]+", text.strip().rstrip("."))
    return frozenset(normalize(w.rstrip(".")) for w in words if w and not w.startswith("#"))


def parse_lock(text: str) -> dict[str, str]:
    """requirements/lock.txt: `name==version` lines -> {normalized name: version}."""
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";")[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if match:
            pins[normalize(match.group(1))] = match.group(2)
    return pins


def _version_key(text: str) -> tuple:
    parts = []
    for piece in re.split(r"[.+-]", text):
        number = re.match(r"\d+", piece)
        parts.append((int(number.group()), piece) if number else (-1, piece))
    while parts and parts[-1] == (0, "0"):
        parts.pop()
    return tuple(parts)


def _compare(left: str, op: str, right: str, versions: bool) -> bool:
    if op in ("in", "not in"):
        return (left in right) == (op == "in")
    if op == "===":
        return left == right
    if versions:
        a, b = _version_key(left), _version_key(right)
        if op == "~=":
            prefix = _version_key(right)[:-1]
            return a >= b and a[: len(prefix)] == prefix
    else:
        a, b = left, right
        if op == "~=":
            return left == right
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


_MARKER_TOKEN = re.compile(
    r"""\s*("[^"]*"|'[^']*'|\(|\)|===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b|and\b|or\b|[A-Za-z_][\w.]*)"""
)


def marker_holds(marker: str, env: Mapping[str, str] = HOST_MARKER_ENV) -> bool:
    """Evaluates a PEP 508 environment marker for `env`. `extra == "..."` is false (extras are not installed)."""
    tokens: list[str] = []
    pos = 0
    marker = marker.strip()
    while pos < len(marker):
        match = _MARKER_TOKEN.match(marker, pos)
        if not match:
            raise ValueError(f"cannot read the marker {marker!r} at {marker[pos:]!r}")
        tokens.append(re.sub(r"\s+", " ", match.group(1)))
        pos = match.end()
        while pos < len(marker) and marker[pos].isspace():
            pos += 1
    at = 0

    def peek() -> str | None:
        return tokens[at] if at < len(tokens) else None

    def take() -> str:
        nonlocal at
        if at >= len(tokens):
            raise ValueError(f"the marker {marker!r} ends too early")
        at += 1
        return tokens[at - 1]

    def value() -> tuple[str, bool]:
        token = take()
        if token[0] in "\"'":
            return token[1:-1], False
        return env.get(token, ""), token in VERSION_MARKERS

    def atom() -> bool:
        if peek() == "(":
            take()
            result = expression()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in {marker!r}")
            return result
        left, left_version = value()
        op = take()
        right, right_version = value()
        if "extra" in (tokens[at - 3], tokens[at - 1]):
            return False
        return _compare(left, op, right, left_version or right_version)

    def conjunction() -> bool:
        result = atom()
        while peek() == "and":
            take()
            result = atom() and result
        return result

    def expression() -> bool:
        result = conjunction()
        while peek() == "or":
            take()
            result = conjunction() or result
        return result

    result = expression()
    if at != len(tokens):
        raise ValueError(f"cannot read the marker {marker!r}")
    return result


def requirement_name(requirement: str, env: Mapping[str, str] = HOST_MARKER_ENV) -> str | None:
    """`Flask<3.2,>=1.0.4` -> 'flask'; None when its marker does not hold on the host (or it needs an extra)."""
    spec, _, marker = requirement.partition(";")
    if marker.strip() and not marker_holds(marker, env):
        return None
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    return normalize(match.group(1)) if match else None


# ---------------------------------------------------------------------------------------------- planning
@dataclass
class Inventory:
    """What --python has installed: per distribution its version, Requires-Dist and module files."""

    versions: dict[str, str] = field(default_factory=dict)
    requires: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)  # dist -> absolute module files (.py, .so)

    def owner_map(self) -> dict[str, str]:
        return {path: dist for dist, paths in self.files.items() for path in paths}

    def dists_of(self, module_files: Iterable[str]) -> set[str]:
        owners = self.owner_map()
        return {owners[f] for f in module_files if f in owners}


@dataclass
class Plan:
    wheels: dict[str, str]  # dist -> version to download
    why: dict[str, str]  # dist -> why it is in the bundle
    left_out: dict[str, str]  # dist -> why not (declared but not imported, or optional)
    host_used: list[str]  # host packages the rollout path imports
    notes: list[str] = field(default_factory=list)


def declared_closure(
    roots: Iterable[str], requires: Mapping[str, Sequence[str]], host: frozenset[str], env=HOST_MARKER_ENV
) -> dict[str, str]:
    """The distributions `roots` need by their declared requirements, stopping at the host's (it has those and
    theirs): {dist: why}. Roots the host has are skipped."""
    why: dict[str, str] = {}
    queue = []
    for root in sorted(set(roots)):
        if root not in host and root not in FIRST_PARTY:
            why[root] = "imported by the rollout path"
            queue.append(root)
    while queue:
        dist = queue.pop(0)
        for requirement in requires.get(dist, ()):
            name = requirement_name(requirement, env)
            if name is None or name in host or name in why or name in FIRST_PARTY:
                continue
            why[name] = f"required by {dist}"
            queue.append(name)
    return why


def make_plan(
    imported: Iterable[str],
    direct: Iterable[str],
    inventory: Inventory,
    lock: Mapping[str, str],
    host: frozenset[str],
    *,
    optional: Iterable[str] = (),
    runtime: Iterable[str] = (),
    env=HOST_MARKER_ENV,
) -> Plan:
    """The wheels to carry: the distributions imported on the rollout path (`imported`, import-time, found in the
    stand-in interpreter) that the host lacks, less those shown `optional` (the path imports without them).
    `direct`: those the project's own modules import (the roots of the declared requirements, reported);
    `runtime`: those the episode missed at run time (carried even where an import made them look optional)."""
    runtime = set(runtime)
    imported, optional = set(imported) | runtime, set(optional) - runtime
    declared = declared_closure(direct, inventory.requires, host, env)
    wheels: dict[str, str] = {}
    why: dict[str, str] = {}
    notes: list[str] = []
    for dist in sorted(imported - host - FIRST_PARTY - optional):
        version = lock.get(dist) or inventory.versions.get(dist)
        if version is None:
            raise BundleError(f"{dist} is imported but neither requirements/lock.txt nor --python knows its version")
        if dist in lock and dist in inventory.versions and lock[dist] != inventory.versions[dist]:
            notes.append(
                f"{dist}: lock.txt pins {lock[dist]}, --python has {inventory.versions[dist]} (carrying the pin)"
            )
        wheels[dist] = version
        why[dist] = declared.get(dist, "imported (an undeclared import)")
        if dist in runtime:
            why[dist] += "; needed at run time (the episode failed without it)"
    for dist, reason in NEWER_THAN_HOST.items():  # imported lazily (the server, the trainer): carried regardless
        if dist in lock:
            wheels[dist], why[dist] = lock[dist], reason
    left_out: dict[str, str] = {}
    for dist, reason in sorted(declared.items()):
        if dist in wheels:
            continue
        if dist in optional:
            left_out[dist] = f"{reason}; imported only where optional: the rollout path imports without it"
        else:
            left_out[dist] = f"{reason}; not imported on the rollout path"
    for dist in sorted(optional - set(declared)):
        left_out[dist] = "imported only where optional (an undeclared import): the rollout path imports without it"
    host_used = sorted(imported & host)
    return Plan(wheels, why, left_out, host_used, notes)


# ---------------------------------------------------------------------------------------------- the stand-in
# Runs inside --python. `inventory`: every distribution's version, requirements and module files. `imports`: imports
# the modules, prints the module files sys.modules then holds (the blocker, if any, is in sitecustomize).
PROBE = r"""
import importlib, importlib.metadata as md, json, os, sys, traceback
mode, out = sys.argv[1], sys.argv[2]
if mode == "inventory":
    data = {"versions": {}, "requires": {}, "files": {}}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        data["versions"][name] = dist.version
        data["requires"][name] = list(dist.requires or [])
        paths = []
        for f in dist.files or []:
            s = str(f)
            if s.endswith((".py", ".so")) and "__pycache__" not in s:
                paths.append(os.path.realpath(str(dist.locate_file(f))))
        data["files"][name] = paths
else:
    errors = {}
    for module in sys.argv[3:]:
        try:
            importlib.import_module(module)
        except Exception as exc:
            errors[module] = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, ImportError):
                errors[module] += "\n" + traceback.format_exc(limit=-3)
    files = set()
    for name, mod in list(sys.modules.items()):
        origin = getattr(mod, "__file__", None)
        if origin:
            files.add(os.path.realpath(origin))
    data = {"errors": errors, "files": sorted(files), "direct": sorted(_DIRECT)}
with open(out, "w") as fh:
    json.dump(data, fh)
"""
# Records which top-level third-party modules the project's own modules import (the roots of the declared closure).
PROBE_HOOK = r"""
import builtins, os, sys
_DIRECT = set()
_orig_import = builtins.__import__
def _record(name, globals=None, locals=None, fromlist=(), level=0):
    module = _orig_import(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__") or ""
    if level == 0 and importer.split(".")[0] in ("captain_ros", "captain_ros_training"):
        top = sys.modules.get(name.split(".")[0])
        origin = getattr(top, "__file__", None)
        if origin:
            _DIRECT.add(os.path.realpath(origin))
        for sub in [name] + [name + "." + f for f in (fromlist or ()) if isinstance(f, str)]:
            m = sys.modules.get(sub)
            if getattr(m, "__file__", None):
                _DIRECT.add(os.path.realpath(m.__file__))
    return module
builtins.__import__ = _record
"""
# sitecustomize for the stand-in: refuses modules whose file belongs to a distribution that is neither the host's nor
# the bundle's (HOST_BUNDLE_BLOCK names a JSON list of such files). Every process inherits it through PYTHONPATH.
SITECUSTOMIZE = r"""
import json as _json, os as _os, sys as _sys
_BLOCKED = _json.load(open(_os.environ["HOST_BUNDLE_BLOCK"]))  # file -> its distribution
class _HostBundleBlock:
    def find_spec(self, name, path=None, target=None):
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        dist = _BLOCKED.get(_os.path.realpath(spec.origin)) if spec.origin else None
        if dist is not None:
            raise ModuleNotFoundError(
                f"No module named {name!r} (host_bundle check: {dist} is neither the host's nor in the bundle)",
                name=name,
            )
        return spec
_sys.meta_path.insert(0, _HostBundleBlock())
"""
MISSING = re.compile(r"host_bundle check: (\S+) is neither the host's nor in the bundle")


class StandIn:
    """--python (the project's .venv) as a stand-in for the host: imports with only some distributions allowed."""

    def __init__(self, python: str, work: Path):
        self.python = python
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "probe.py").write_text(PROBE_HOOK + PROBE)
        site = self.work / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self._inventory: Inventory | None = None

    def env(self, blocked_files: Mapping[str, str] | None) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(PACKAGE_SRC)]
        if blocked_files is not None:
            block = self.work / "blocked.json"
            block.write_text(json.dumps(dict(blocked_files)))
            env["HOST_BUNDLE_BLOCK"] = str(block)
            paths.insert(0, str(self.work / "site"))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.update(MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONHOME", None)
        return env

    def _run(self, args: list[str], env: dict[str, str], timeout: float = 600) -> dict:
        out = self.work / "probe-out.json"
        out.unlink(missing_ok=True)
        done = subprocess.run(
            [self.python, str(self.work / "probe.py"), args[0], str(out), *args[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
        if done.returncode != 0 or not out.exists():
            raise BundleError(f"the probe in {self.python} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())

    def inventory(self) -> Inventory:
        if self._inventory is None:
            data = self._run(["inventory"], self.env(None))
            names = {name: normalize(name) for name in data["versions"]}
            self._inventory = Inventory(
                versions={names[n]: v for n, v in data["versions"].items()},
                requires={names[n]: r for n, r in data["requires"].items()},
                files={names[n]: f for n, f in data["files"].items()},
            )
        return self._inventory

    def imports(self, modules: Sequence[str], allowed: frozenset[str] | None) -> tuple[dict, set[str], set[str]]:
        """Imports `modules`; with `allowed`, every other distribution's files are refused.
        Returns (errors by module, dists imported, dists the project's modules import directly)."""
        inventory = self.inventory()
        env = self.env(None if allowed is None else self.blocked(allowed))
        data = self._run(["imports", *modules], env)
        return data["errors"], inventory.dists_of(data["files"]), inventory.dists_of(data["direct"])

    def blocked(self, allowed: frozenset[str]) -> dict[str, str]:
        """{file: dist} of every distribution not `allowed`."""
        return {f: d for d, files in self.inventory().files.items() if d not in allowed for f in files}

    def episode(self, allowed: frozenset[str]) -> tuple[bool, str, set[str]]:
        """Runs the smoke episode (`captain-ros rollout`, its services and twin worker) with only `allowed`.
        Returns (it succeeded, what it said, the distributions it missed)."""
        runs = self.work / "runs"
        shutil.rmtree(runs, ignore_errors=True)
        argv = [self.python, "-m", "captain_ros.cli", *SMOKE_ROLLOUT, "--runs-dir", str(runs)]
        done = subprocess.run(
            argv, env=self.env(self.blocked(allowed)), capture_output=True, text=True, timeout=900, cwd=ROOT
        )
        summaries = sorted(runs.glob("*-rollout/summary.json"))
        summary = json.loads(summaries[-1].read_text()) if summaries else {}
        logs = "".join(p.read_text(errors="replace") for p in sorted(runs.glob("*-rollout/logs/*.log")))
        records = "".join(store_text(p) for p in sorted(runs.glob("*-rollout/rollout.sqlite")))
        missed = set(MISSING.findall("\n".join([done.stdout, done.stderr, logs, records])))
        episodes = summary.get("episodes", 0)
        ok = done.returncode == 0 and episodes and summary.get("strict") == episodes and not summary.get("errors")
        said = f"{episodes} episode(s), {summary.get('strict', 0)} strict success, outcomes {summary.get('outcomes')}"
        if not ok:
            ends = re.findall(r'"outcome": "[^"]*".{0,600}', records)
            said += f", exit {done.returncode}:\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}\n{logs[-2000:]}\n"
            said += "\n".join(e[:600] for e in ends[-2:])
        return bool(ok) and not missed, said, missed


def store_text(path: Path) -> str:
    """Every record of an episode store as text (payloads are JSON, maybe zlib-compressed): where a worker's
    failures end up."""
    import sqlite3
    import zlib

    texts = []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        for encoding, blob in db.execute("SELECT encoding, payload FROM records ORDER BY seq"):
            data = zlib.decompress(blob) if encoding.endswith("+zlib") else blob
            texts.append(data.decode(errors="replace") if isinstance(data, bytes) else str(data))
    return "\n".join(texts)


def module_exists(module: str) -> bool:
    parts = module.split(".")
    base = PACKAGE_SRC.joinpath(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _prune(
    stand_in: StandIn, modules: list[str], allowed: frozenset[str], candidates: list[str], imported: set[str]
) -> tuple[set[str], set[str]]:
    """Leaves out each candidate in turn while the imports still succeed: (imported, optional)."""
    optional: set[str] = set()
    for i, dist in enumerate(candidates, 1):
        if dist not in imported:
            continue  # nothing imports it any more: an optional import of something already left out
        t = time.monotonic()
        errors, trial_imported, _ = stand_in.imports(modules, frozenset(allowed - optional - {dist}))
        verdict = "needed" if errors else "optional: left out"
        say(f"  [{i:>2}/{len(candidates)}] without {dist:<24} {verdict} ({time.monotonic() - t:.0f} s)")
        if not errors:
            optional.add(dist)
            imported = trial_imported
    return imported, optional | (set(candidates) - imported)


def _runtime_needs(stand_in: StandIn, host: frozenset[str], imported: set[str], optional: set[str]) -> set[str]:
    """Runs the smoke episode with only the host's and the planned distributions; returns those it missed at run
    time (taken back one round at a time)."""
    runtime: set[str] = set()
    for _ in range(8):
        wheels = (imported | runtime) - host - FIRST_PARTY - (optional - runtime)
        t = time.monotonic()
        say(f"  one episode (python -m captain_ros.cli {' '.join(SMOKE_ROLLOUT)}) with only these {len(wheels)}")
        ok, said, missed = stand_in.episode(frozenset(host | FIRST_PARTY | wheels))
        if ok:
            say(f"  episode: {said} ({time.monotonic() - t:.0f} s)")
            return runtime
        back = missed - host - wheels
        if not back:
            raise BundleError(f"the episode failed, and not for a missing distribution: {said}")
        say(f"  the episode needs {', '.join(sorted(back))} at run time: back in ({time.monotonic() - t:.0f} s)")
        runtime |= back
    raise BundleError("the episode still misses distributions after 8 rounds")


def plan_bundle(
    stand_in: StandIn, lock: Mapping[str, str], host: frozenset[str], prune: bool = True, run: bool = True
) -> tuple[Plan, list[str]]:
    """Probe; (prune) leave out each candidate in turn while the imports still succeed without it; (run) run the
    smoke episode with only the host's and the planned distributions, taking back any it misses at run time (an
    import inside a function, or one that a library makes optional at import: MuJoCo's PyOpenGL for EGL)."""
    modules = [m for m in ROLLOUT_MODULES if module_exists(m)]
    absent = [m for m in ROLLOUT_MODULES if m not in modules]
    for module in absent:
        if module not in OPTIONAL_MODULES:
            raise BundleError(f"{module} is on the rollout path but not in {PACKAGE_SRC}")
        say(f"{module}: not in the checkout yet (assumed to need only torch, transformers, numpy: host packages)")
    t0 = time.monotonic()
    say(f"probing {len(modules)} modules in {stand_in.python} (inventory, then an unrestricted import)")
    inventory = stand_in.inventory()
    errors, imported, direct = stand_in.imports(modules, None)
    if errors:
        raise BundleError("the rollout modules do not import in --python:\n" + json.dumps(errors, indent=2))
    say(
        f"  {len(imported)} distributions imported ({len(imported - host - FIRST_PARTY)} not on the host), "
        f"{time.monotonic() - t0:.0f} s"
    )
    candidates = sorted(imported - host - FIRST_PARTY)
    allowed = frozenset(host | FIRST_PARTY | set(candidates))
    errors, imported, _ = stand_in.imports(modules, allowed)
    if errors:
        raise BundleError("with only the host's and the candidates' packages the imports fail:\n" + json.dumps(errors))
    optional: set[str] = set()
    if prune:
        imported, optional = _prune(stand_in, modules, allowed, candidates, imported)
    runtime = _runtime_needs(stand_in, host, imported, optional) if run else set()
    optional -= runtime
    plan = make_plan(imported | runtime, direct, inventory, lock, host, optional=optional, runtime=runtime)
    return plan, absent


# ---------------------------------------------------------------------------------------------- scripts
def bwrap_wrapper() -> str:
    """bwrap on PATH: runs the real binary with its libs, LD_LIBRARY_PATH set for bwrap alone (the sandbox starts
    bwrap with a fresh environment and bwrap --clearenv gives the child none of it)."""
    return (
        "#!/bin/sh\n"
        "# bubblewrap (Debian 12's) with its own libs; LD_LIBRARY_PATH is set for this bwrap process only.\n"
        'here="$(dirname "$(readlink -f "$0")")"\n'
        'LD_LIBRARY_PATH="$here/lib" exec "$here/lib/bwrap" "$@"\n'
    )


# Both scripts: where the bundle is, and the checkout (REPO; default: two folders above it, else the current folder)
_FIND_REPO = """BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -z "${REPO:-}" ]; then  # the checkout holding the bundle (.cache/host_bundle), else the current folder
  REPO="$(cd "$BUNDLE/../.." && pwd)"; [ -d "$REPO/src/captain_ros/captain_ros" ] || REPO="$PWD"
fi
"""


def install_script(wheels: Sequence[str], stamp: str, built: str) -> str:
    """install.sh: wheels into $SITE (once per bundle), GL loaders if missing, export lines on stdout."""
    sonames = " ".join(GL_SONAMES)
    return f"""#!/bin/bash
# Generated by tools/host_bundle.py ({built}). On the GPU host, as root:
#   eval "$(bash .cache/host_bundle/install.sh)"    # install (once) and set this shell's environment
# Progress goes to stderr; stdout holds only the export lines, also written to $ENV_FILE (/tmp/host_bundle.env).
# REPO (the checkout; default: two folders above this one, else the current folder), SITE (/tmp/site), PYTHON
# (python3) and HOST_BUNDLE_GL (auto: unpack the GL debs when a loader is missing; force; skip) can be set.
set -euo pipefail
{_FIND_REPO}SITE="${{SITE:-/tmp/site}}"
ENV_FILE="${{ENV_FILE:-/tmp/host_bundle.env}}"
PY="${{PYTHON:-python3}}"
say() {{ echo "[host_bundle] $*" >&2; }}
if [ ! -d "$REPO/src/captain_ros/captain_ros" ]; then
  say "no checkout at REPO=$REPO: set REPO to the captain_ros checkout"; exit 1
fi

# 1. the wheels ({len(wheels)}), into $SITE once per bundle
if [ -f "$SITE/.host_bundle-{stamp}" ]; then
  say "wheels: already in $SITE"
else
  say "wheels: installing {len(wheels)} into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \\
    "$BUNDLE"/wheels/*.whl >&2
  touch "$SITE/.host_bundle-{stamp}"
fi

# 2. GL loaders for MuJoCo's EGL rendering: Debian's packages unpacked into / when any is missing
have="$(ldconfig -p 2>/dev/null || true)"
missing=""
for lib in {sonames}; do
  case "$have" in *"$lib "*) ;; *) missing="$missing $lib" ;; esac
done
gl="${{HOST_BUNDLE_GL:-auto}}"  # auto: unpack when a loader is missing; force; skip
if [ "$gl" = force ] || {{ [ "$gl" = auto ] && [ -n "$missing" ]; }}; then
  say "system libraries missing (${{missing:- none; forced}}): unpacking $(ls "$BUNDLE"/debs/*.deb | wc -l) debs into /"
  for f in "$BUNDLE"/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
else
  say "system libraries: not unpacking (HOST_BUNDLE_GL=$gl; missing:${{missing:- none}})"
fi
exports=()
vendor_dirs="/usr/share/glvnd/egl_vendor.d /etc/glvnd/egl_vendor.d"
nv_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if ! ls $vendor_dirs 2>/dev/null | grep -q json && [ -f "$nv_egl" ]; then
  exports+=("__EGL_VENDOR_LIBRARY_FILENAMES=$nv_egl")
fi
nv_vk=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null | grep -q json && [ -f "$nv_vk" ]; then
  exports+=("VK_DRIVER_FILES=$nv_vk")
fi

# 3. bubblewrap: a wrapper that gives the real binary its libs (LD_LIBRARY_PATH for bwrap alone)
chmod +x "$BUNDLE/bwrap/bwrap" "$BUNDLE/bwrap/lib/bwrap"
say "bwrap: $("$BUNDLE/bwrap/bwrap" --version 2>&1)"

# 4. the environment
prepend() {{ case ":$2:" in *":$1:"*) printf '%s' "$2" ;; *) printf '%s' "$1${{2:+:$2}}" ;; esac; }}
pythonpath="$(prepend "$SITE" "${{PYTHONPATH:-}}")"
pythonpath="$(prepend "$REPO/src/captain_ros" "$pythonpath")"
exports+=("PYTHONPATH=$pythonpath" "PATH=$(prepend "$BUNDLE/bwrap" "$PATH")" "MUJOCO_GL=egl" "PYOPENGL_PLATFORM=egl")
: > "$ENV_FILE"
for e in "${{exports[@]}}"; do
  printf 'export %s=%q\\n' "${{e%%=*}}" "${{e#*=}}" | tee -a "$ENV_FILE"
done
say "environment: eval these lines, or: source $ENV_FILE"
"""


SMOKE_CHECK_IMPORTS = """
import importlib, os, sys
site = os.path.realpath(sys.argv[1])
for name in ("mujoco", "open3d", "zmq", "OpenGL", "cv2", "numpy", "scipy", "httpx", "yaml"):
    mod = importlib.import_module(name)
    where = "bundle" if os.path.realpath(getattr(mod, "__file__", "") or "").startswith(site) else "host"
    print(f"  {name:<8} {getattr(mod, '__version__', '?'):<12} ({where})")
import captain_ros.bridge.host, captain_ros.cli.transport_cli, captain_ros.perception.perception
import captain_ros_training.student_eval
print("  rollout modules import")
"""

SMOKE_SUMMARY = """
import json, sys
s = json.load(open(sys.argv[1]))
print(f"summary: {s['episodes']} episode(s) in {s['seconds']:.0f} s: {s['valid']} valid, {s['strict']} strict "
      f"success(es); outcomes {s['outcomes']}; errors {s['errors'] or 'none'}")
print("STRICT SUCCESS" if s["episodes"] and s["strict"] == s["episodes"] else "NO STRICT SUCCESS")
sys.exit(0 if s["episodes"] and not s["errors"] else 1)
"""

SMOKE_SANDBOX = """
import tempfile
from pathlib import Path
from captain_ros.agent.sandbox import Sandbox
with tempfile.TemporaryDirectory() as d:
    box = Sandbox(Path(d) / "scratch", on_call=lambda name, args, kwargs: {"ok": True}, allowed=["ping"])
    try:
        cell = box.run_cell("import math\\nprint('cell ran', math.sqrt(16))")
        print(f"sandbox cell: {cell.status} {cell.output.strip()!r} {cell.error or ''}")
        net = box.run_cell("import socket\\nsocket.create_connection(('127.0.0.1', 9), timeout=1)")
        print(f"sandbox network: {net.status} ({net.error.strip().splitlines()[-1] if net.error else 'no error'})")
        ok = cell.status == "ok" and "cell ran 4.0" in cell.output and net.status != "ok"
    finally:
        box.close()
print("SANDBOX OK" if ok else "SANDBOX FAILED")
raise SystemExit(0 if ok else 1)
"""


def smoke_script(built: str) -> str:
    """smoke.sh: install, one scripted-expert episode through the real rollout path, its summary, a sandbox cell."""
    rollout = " ".join(SMOKE_ROLLOUT)
    return f"""#!/bin/bash
# Generated by tools/host_bundle.py ({built}). On the GPU host, in the checkout, as root:
#   bash .cache/host_bundle/smoke.sh
# install.sh, then ONE scripted-expert episode on the twin through `captain-ros rollout` (python3 -m captain_ros.cli;
# no images, no shipping; records under $RUNS, default /tmp/runs), its summary, and one sandbox cell.
set -uo pipefail
{_FIND_REPO}RUNS="${{RUNS:-/tmp/runs}}"
say() {{ echo "[host_bundle] $*" >&2; }}
env_lines="$(REPO="$REPO" bash "$BUNDLE/install.sh")" || {{ say "install.sh failed"; exit 1; }}
eval "$env_lines"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
cd "$REPO"
say "python: $(command -v python3), $(python3 -V 2>&1); PYTHONPATH=$PYTHONPATH"
python3 - "${{SITE:-/tmp/site}}" <<'PY' || {{ say "imports failed"; exit 1; }}
{SMOKE_CHECK_IMPORTS.strip()}
PY

say "one episode: python3 -m captain_ros.cli {rollout} --runs-dir $RUNS"
start=$(date +%s)
timeout "${{SMOKE_TIMEOUT:-420}}" python3 -m captain_ros.cli {rollout} --runs-dir "$RUNS"
rc=$?
say "rollout exited $rc after $(( $(date +%s) - start )) s"
run="$(ls -td "$RUNS"/*-rollout 2>/dev/null | head -1)"
if [ -n "$run" ] && [ -f "$run/summary.json" ]; then
  python3 - "$run/summary.json" <<'PY' || rc=1
{SMOKE_SUMMARY.strip()}
PY
else
  say "no summary.json under $RUNS"; rc=1
fi
if [ "$rc" != 0 ] && [ -n "$run" ]; then
  for log in "$run"/logs/*.log; do [ -f "$log" ] && {{ say "--- $log"; tail -n 30 "$log" >&2; }}; done
fi

python3 - <<'PY' || rc=1
{SMOKE_SANDBOX.strip()}
PY
exit $rc
"""


# ---------------------------------------------------------------------------------------------- building
def run_cmd(argv: Sequence[str], what: str, timeout: float = 1800, cwd: Path | None = None) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        raise BundleError(
            f"{what} failed ({done.returncode}): {' '.join(argv)}\n{(done.stderr or done.stdout)[-3000:]}"
        )
    return done.stdout


def wheel_matches(filename: str, dist: str, version: str) -> bool:
    name, _, rest = filename.partition("-")
    return normalize(name) == dist and rest.split("-", 1)[0] == version


def download_wheels(wheels: Mapping[str, str], folder: Path, pip_python: str) -> dict[str, Path]:
    """One cp312 manylinux x86_64 wheel per distribution, at its pinned version (kept when already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    present = {p.name: p for p in folder.glob("*.whl")}
    for name, path in present.items():  # stale versions or packages no longer planned
        if not any(wheel_matches(name, d, v) for d, v in wheels.items()):
            say(f"  removing {name} (not in the plan)")
            path.unlink()
    todo = [f"{d}=={v}" for d, v in sorted(wheels.items()) if not any(wheel_matches(n, d, v) for n in present)]
    if todo:
        say(f"pip download: {len(todo)} wheels for cp312 manylinux x86_64 ({', '.join(todo)})")
        platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
        base = [pip_python, "-m", "pip", *PIP_DOWNLOAD, *platforms, "--disable-pip-version-check", "-d", str(folder)]
        try:
            run_cmd([*base, *todo], "pip download")
        except BundleError:
            for requirement in todo:  # one at a time, to name the one that fails
                run_cmd([*base, requirement], f"pip download of {requirement}")
    found: dict[str, Path] = {}
    for dist, version in wheels.items():
        matches = [p for p in folder.glob("*.whl") if wheel_matches(p.name, dist, version)]
        if len(matches) != 1:
            raise BundleError(f"expected one wheel of {dist}=={version} in {folder}, found {len(matches)}")
        found[dist] = matches[0]
    return found


def _dropped(name: str, drop: Sequence[str]) -> bool:
    top = name.split("/", 1)[0] + "/"
    return any(name.startswith(d) or (d == "*.data/" and top.endswith(".data/")) for d in drop)


def is_slimmed(wheel: Path, drop: Sequence[str]) -> bool:
    with zipfile.ZipFile(wheel) as src:
        return not any(_dropped(name, drop) for name in src.namelist())


def slim_wheel(wheel: Path, drop: Sequence[str]) -> tuple[int, int]:
    """Rewrites `wheel` without the entries under `drop` (prefixes; `*.data/` matches the wheel's data folder) and
    their RECORD lines. Returns (entries dropped, bytes saved); (0, 0) when there is nothing (left) to drop."""

    def dropped(name: str) -> bool:
        return _dropped(name, drop)

    with zipfile.ZipFile(wheel) as src:
        entries = src.infolist()
        gone = [e for e in entries if dropped(e.filename)]
        if not gone:
            return 0, 0
        gone_names = {e.filename for e in gone}
        tmp = wheel.with_name(wheel.name + ".slim")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for entry in entries:
                if entry.filename in gone_names:
                    continue
                data = src.read(entry)
                if entry.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if line.split(",", 1)[0] not in gone_names).encode()
                out.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
    before = wheel.stat().st_size
    tmp.replace(wheel)
    return len(gone), before - wheel.stat().st_size


def download_debs(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_", 1)[0]: p for p in folder.glob("*.deb")}
    todo = [name for name in GL_DEBS if name not in have]
    if todo:
        if shutil.which("apt-get") is None:
            raise BundleError(
                "apt-get is needed to download the GL loader debs (Debian/Ubuntu); or copy them into "
                f"{folder}: {' '.join(GL_DEBS)}"
            )
        lists = Path("/tmp/amd64")
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        if not any(lists.glob("*_Packages*")):
            say("apt-get update (amd64 lists in /tmp/amd64)")
            run_cmd(["apt-get", *APT_OPTIONS, "update"], "apt-get update", timeout=600)
        say(f"apt-get download {' '.join(todo)}")
        run_cmd(["apt-get", *APT_OPTIONS, "download", *todo], "apt-get download", timeout=600, cwd=folder)
    return sorted(folder.glob("*.deb"))


def copy_bwrap(folder: Path, bwrap: str) -> list[Path]:
    source = shutil.which(bwrap) if not os.path.isabs(bwrap) else bwrap
    if not source or not os.path.exists(source):
        raise BundleError(f"no bwrap at {bwrap!r}: install bubblewrap here (apt-get install bubblewrap) or name it")
    lib = folder / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, lib / "bwrap")
    (lib / "bwrap").chmod(0o755)
    ldd = run_cmd(["ldd", source], "ldd bwrap")
    copied = [lib / "bwrap"]
    for soname in BWRAP_LIBS:
        match = re.search(rf"^\s*{re.escape(soname)} => (\S+)", ldd, flags=re.M)
        if not match:
            raise BundleError(f"ldd {source} names no {soname}; the bundle expects Debian 12's bwrap")
        shutil.copyfile(os.path.realpath(match.group(1)), lib / soname)
        copied.append(lib / soname)
    wrapper = folder / "bwrap"
    wrapper.write_text(bwrap_wrapper())
    wrapper.chmod(0o755)
    return [wrapper, *copied]


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def contents_table(folder: Path) -> str:
    rows = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rows.append((path.relative_to(folder).as_posix(), path.stat().st_size))
    width = max((len(r[0]) for r in rows), default=10)
    lines = [f"  {'file':<{width}}  {'MiB':>7}"]
    lines += [f"  {name:<{width}}  {size / MIB:>7.2f}" for name, size in rows]
    lines.append(f"  {'total':<{width}}  {sum(s for _, s in rows) / MIB:>7.2f}")
    return "\n".join(lines)


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip() or "unknown"


def print_plan(plan: Plan) -> None:
    say(f"wheels to carry ({len(plan.wheels)}):")
    for dist, version in plan.wheels.items():
        say(f"  {dist + '==' + version:<28} {plan.why[dist]}")
    say(f"declared or imported but left out ({len(plan.left_out)}):")
    for dist, reason in plan.left_out.items():
        say(f"  {dist:<28} {reason}")
    say(f"host packages the rollout path imports: {', '.join(plan.host_used)}")
    for note in plan.notes:
        say(f"note: {note}")


def check(stand_in: StandIn, host: frozenset[str], wheels: Iterable[str], run: bool) -> None:
    """The stand-in with only the host's and the bundle's distributions: imports, and with `run` one episode."""
    allowed = frozenset(host | FIRST_PARTY | set(wheels))
    modules = [m for m in ROLLOUT_MODULES if module_exists(m)]
    errors, _, _ = stand_in.imports(modules, allowed)
    if errors:
        raise BundleError("check: the rollout modules do not import with host + bundle only:\n" + json.dumps(errors))
    say(f"check: {len(modules)} rollout modules import with only the host's packages and the bundle's")
    if not run:
        return
    t0 = time.monotonic()
    say(f"check: one episode that way: python -m captain_ros.cli {' '.join(SMOKE_ROLLOUT)}")
    ok, said, missed = stand_in.episode(allowed)
    if not ok:
        lacking = f" (it missed {', '.join(sorted(missed))})" if missed else ""
        raise BundleError(f"check: the episode failed{lacking}: {said}")
    say(f"check: {said} ({time.monotonic() - t0:.0f} s)")


def next_steps(rel: str, size: int, max_mib: float) -> list[str]:
    """How the bundle (`rel`, from the checkout's root) gets to the host and runs there: one device call when it fits
    `max_mib`, else tools/carry.py parts, one call each, back to back (the machine keeps /tmp while held)."""
    name = Path(rel).name
    if size <= max_mib * MIB:
        return [
            f"{size / MIB:.1f} MiB: fits one device call beside the tree. There, from the checkout's root, with "
            f'carry ["{rel}"]:',
            f"  bash {rel}/smoke.sh",
        ]
    return [
        f"{size / MIB:.1f} MiB: over {max_mib:g} MiB, more than one device call carries beside the tree. Split it:",
        f"  python3 tools/carry.py pack {rel} --out .cache/carry --name {name} --max-mib {max_mib:g} --force",
        f'then one device call per part, back to back, with carry [".cache/carry/{name}-partNN"]:',
        f"  mkdir -p /tmp/carry && cp -r .cache/carry/{name}-partNN /tmp/carry/",
        "and in the call with the last part, after that copy:",
        f"  python3 /tmp/carry/{name}-partNN/carry.py unpack /tmp/carry --to /tmp/hb && bash /tmp/hb/{name}/smoke.sh",
    ]


def build(args: argparse.Namespace, stand_in: StandIn, host: frozenset[str], lock: dict[str, str]) -> Path:
    out = Path(args.out).resolve()
    plan, absent = plan_bundle(stand_in, lock, host, prune=not args.no_prune, run=not args.no_run)
    print_plan(plan)
    out.mkdir(parents=True, exist_ok=True)
    for dist, drop in SLIM.items() if args.no_slim else ():  # a slimmed copy from an earlier build: fetch it again
        for wheel in (out / "wheels").glob("*.whl"):
            if wheel_matches(wheel.name, dist, plan.wheels.get(dist, "")) and is_slimmed(wheel, drop):
                wheel.unlink()
    wheels = download_wheels(plan.wheels, out / "wheels", args.pip_python)
    slimmed: dict[str, str] = {}
    for dist, drop in SLIM.items():
        if dist in wheels and not args.no_slim:
            count, saved = slim_wheel(wheels[dist], drop)
            slimmed[dist] = f"without {', '.join(drop)} (never loaded on the rollout path)"
            if count:
                say(f"slimmed {wheels[dist].name}: {count} entries, {saved / MIB:.1f} MiB less")
    debs = download_debs(out / "debs")
    bwrap_files = copy_bwrap(out / "bwrap", args.bwrap)
    built = f"{time.strftime('%Y-%m-%d')}, commit {git_commit()}"
    digests = {d: hashlib.sha256(w.read_bytes()).hexdigest() for d, w in sorted(wheels.items())}
    stamp = hashlib.sha256("".join(digests.values()).encode()).hexdigest()[:12]  # a changed wheel reinstalls
    for name, text in (
        ("install.sh", install_script(sorted(plan.wheels), stamp, built)),
        ("smoke.sh", smoke_script(built)),
    ):
        (out / name).write_text(text)
        (out / name).chmod(0o755)
    record = {
        "built": built,
        "host_python": "cp312 manylinux x86_64",
        "wheels": {
            d: {
                "version": v,
                "file": wheels[d].name,
                "bytes": wheels[d].stat().st_size,
                "sha256": digests[d],
                "why": plan.why[d],
                **({"slimmed": slimmed[d]} if d in slimmed else {}),
            }
            for d, v in plan.wheels.items()
        },
        "left_out": plan.left_out,
        "host_packages_used": plan.host_used,
        "modules_absent": absent,
        "debs": {p.name: p.stat().st_size for p in debs},
        "bwrap": {p.relative_to(out).as_posix(): p.stat().st_size for p in bwrap_files},
        "notes": plan.notes,
    }
    (out / "plan.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "README.txt").write_text(
        "Rollouts on a GPU host without network (tools/host_bundle.py; docs/gpu_host_without_network.md).\n"
        "In the checkout on the host, as root:\n"
        "  bash .cache/host_bundle/smoke.sh                # install + one episode + one sandbox cell\n"
        '  eval "$(bash .cache/host_bundle/install.sh)"    # install and set this shell\'s environment\n'
        "plan.json says what is here and why, and what was left out.\n"
    )
    size = folder_size(out)
    say(f"bundle: {out} ({size / MIB:.1f} MiB)")
    print(contents_table(out), flush=True)
    biggest = sorted(((p.stat().st_size, p.name) for p in wheels.values()), reverse=True)[:3]
    say("largest wheels: " + ", ".join(f"{n} {s / MIB:.1f} MiB" for s, n in biggest))
    for line in next_steps(os.path.relpath(out, ROOT), size, args.max_mib):
        say(line)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="host_bundle.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="plan|build|check")
    commands = {
        "plan": sub.add_parser("plan", help="work out the wheels; download nothing"),
        "build": sub.add_parser("build", help="download and write the bundle, check it, print its size"),
        "check": sub.add_parser("check", help="the rollout path with only the host's and a built bundle's packages"),
    }
    for name, p in commands.items():
        p.add_argument(
            "--python",
            default=str(ROOT / ".venv" / "bin" / "python"),
            help="the stand-in interpreter with the project's requirements installed (default: .venv)",
        )
        p.add_argument("--lock", default=str(ROOT / "requirements" / "lock.txt"), help="the versions to carry")
        p.add_argument(
            "--host-packages",
            default="",
            help="the host's package names (a file: one a line, or "
            "KINDS.md's 'Packages: a, b.' line); default: the list read on 2026-11-17",
        )
        p.add_argument("--work", default=str(ROOT / ".cache" / "host_bundle_work"), help="scratch folder")
        if name in ("build", "check"):
            p.add_argument("--out", default=str(ROOT / ".cache" / "host_bundle"), help="the bundle folder")
        if name in ("plan", "build"):
            p.add_argument("--no-prune", action="store_true", help="keep optional imports (faster planning)")
    build_p = commands["build"]
    build_p.add_argument("--pip-python", default=sys.executable, help="the Python whose pip downloads")
    build_p.add_argument("--bwrap", default="/usr/bin/bwrap", help="the bwrap binary to carry (Debian 12's)")
    build_p.add_argument("--max-mib", type=float, default=BUNDLE_LIMIT_MIB, help="warn above this size")
    build_p.add_argument("--no-run", action="store_true", help="plan by imports alone, without the episode")
    build_p.add_argument("--no-slim", action="store_true", help="carry open3d-cpu whole (100 MiB instead of ~70)")
    for name in ("plan", "check"):
        commands[name].add_argument("--run", action="store_true", help="also run the smoke episode that way")
    args = parser.parse_args(argv)
    try:
        host_text = Path(args.host_packages).read_text() if args.host_packages else HOST_PACKAGES
        host = parse_host_packages(host_text)
        lock = parse_lock(Path(args.lock).read_text())
        if not Path(args.python).exists():
            raise BundleError(f"no stand-in interpreter at {args.python}: make setup, or name one with --python")
        stand_in = StandIn(args.python, Path(args.work))
        if args.command == "plan":
            plan, _ = plan_bundle(stand_in, lock, host, prune=not args.no_prune, run=args.run)
            print_plan(plan)
        elif args.command == "build":
            build(args, stand_in, host, lock)
        else:
            record = json.loads((Path(args.out) / "plan.json").read_text())
            check(stand_in, host, record["wheels"], run=args.run)
    except BundleError as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

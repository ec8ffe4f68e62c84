"""tools/host_bundle.py: the plan (host packages, markers, optional imports), the scripts it writes for the GPU host,
the bwrap wrapper, the wheel slimming and the stand-in's import blocker. No network: nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("host_bundle", ROOT / "tools" / "host_bundle.py")
hb = importlib.util.module_from_spec(spec)
sys.modules["host_bundle"] = hb  # dataclasses look their module up there
spec.loader.exec_module(hb)

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


# ---------------------------------------------------------------------------------------------- names, markers
def test_host_packages_read_from_kinds_md_or_one_a_line_are_normalized():
    kinds = "## Python packages\n\nText. Packages: absl-py, Typing_Extensions, opencv-python-headless, zipp.\n"
    assert hb.parse_host_packages(kinds) == {"absl-py", "typing-extensions", "opencv-python-headless", "zipp"}
    assert hb.parse_host_packages("numpy\nPyYAML\n\n") == {"numpy", "pyyaml"}
    built_in = hb.parse_host_packages(hb.HOST_PACKAGES)
    assert {"numpy", "torch", "transformers", "httpx", "pyyaml", "werkzeug", "opencv-python-headless"} <= built_in
    assert not {"mujoco", "pyzmq", "pydantic", "open3d-cpu", "dash"} & built_in  # what the host lacks


def test_lock_pins_are_read_by_normalized_name():
    lock = "# generated\nPyYAML==6.0.4\nmujoco-core==4.0.0\nruamel.yaml==0.19.1  # comment\nnot a pin\nfoo>=1\n"
    assert hb.parse_lock(lock) == {"pyyaml": "6.0.4", "mujoco-core": "4.0.0", "ruamel-yaml": "0.19.1"}


@pytest.mark.parametrize(
    ("marker", "holds"),
    [
        ('python_version < "3.13"', True),
        ('python_version > "3.9"', True),  # as versions: a string comparison would say "3.12" < "3.9"
        ('python_version >= "3.13"', False),
        ('sys_platform == "win32" and python_version == "3.6"', False),
        ('extra == "dev"', False),
        ('python_version >= "3.8" and extra == "test"', False),
        ('(os_name == "nt" or platform_system == "Linux") and python_full_version >= "3.9.0"', True),
        ('platform_machine in "x86_64 aarch64"', True),
        ("implementation_name != 'pypy'", True),
        ('platform_python_implementation == "PyPy"', False),
    ],
)
def test_markers_are_evaluated_for_the_host(marker, holds):
    assert hb.marker_holds(marker) is holds


def test_requirement_names_drop_versions_and_requirements_whose_marker_fails():
    assert hb.requirement_name("Flask<3.2,>=1.0.4") == "flask"
    assert hb.requirement_name("typing_extensions>=4.1.1") == "typing-extensions"
    assert hb.requirement_name('pywinpty==2.0.2; sys_platform == "win32" and python_version == "3.6"') is None
    assert hb.requirement_name('pytest[cov]>=8 ; extra == "test"') is None
    assert hb.requirement_name('importlib-metadata; python_version < "3.10"') is None


# ---------------------------------------------------------------------------------------------- planning
HOST = frozenset({"numpy", "werkzeug", "typing-extensions", "requests", "packaging", "narwhals"})
REQUIRES = {
    "mujoco": ["glfw", "mujoco-core==4.0.0", "numpy", "pyopengl"],
    "mujoco-core": ["numpy"],
    "open3d-cpu": [
        "numpy>=1.18.0",
        "dash>=2.6.0",
        "werkzeug>=3.0.0",
        "nbformat>=5.7.0",
        'pywinpty; sys_platform == "win32"',
    ],
    "dash": ["Flask<3.2", "plotly>=5", "requests", "pydantic>=2.10", "comm", 'pytest; extra == "testing"'],
    "plotly": ["narwhals>=1.15.1", "packaging"],
    "pydantic": ["pydantic-core==2.50.5", "typing-extensions"],
    "nbformat": ["jsonschema"],
    "pyzmq": [],
}
VERSIONS = {name: "1.0" for name in [*REQUIRES, "glfw", "pyopengl", "flask", "comm", "pydantic-core", "jsonschema"]}
INVENTORY = hb.Inventory(versions=VERSIONS, requires=REQUIRES)


def test_declared_closure_stops_at_the_host_and_skips_markers_and_extras():
    why = hb.declared_closure({"mujoco", "open3d-cpu", "numpy", "captain_ros"}, REQUIRES, HOST)
    assert set(why) == {
        "mujoco", "mujoco-core", "glfw", "pyopengl", "open3d-cpu", "dash", "nbformat", "flask", "plotly",
        "pydantic", "pydantic-core", "comm", "jsonschema",
    }  # fmt: skip
    assert why["mujoco"] == "imported by the rollout path"
    assert why["dash"] == "required by open3d-cpu"
    assert "numpy" not in why and "narwhals" not in why and "pywinpty" not in why and "pytest" not in why


def test_plan_carries_imported_distributions_the_host_lacks_at_the_locked_versions():
    imported = {"mujoco", "mujoco-core", "open3d-cpu", "dash", "plotly", "pydantic", "pydantic-core", "comm", "numpy",
                "werkzeug", "narwhals", "pyzmq", "captain-ros"}  # fmt: skip
    lock = {"mujoco": "4.0.0", "mujoco-core": "4.0.0", "open3d-cpu": "0.20.0", "pyzmq": "27.3.0", "numpy": "2.4.6"}
    plan = hb.make_plan(imported, {"mujoco", "open3d-cpu", "pyzmq", "numpy"}, INVENTORY, lock, HOST, optional={"comm"})
    assert set(plan.wheels) == {"mujoco", "mujoco-core", "open3d-cpu", "dash", "plotly", "pydantic", "pydantic-core",
                                "pyzmq"}  # fmt: skip
    assert not set(plan.wheels) & HOST, "the host's packages are not carried (unless too old: below)"
    assert plan.wheels["mujoco"] == "4.0.0" and plan.wheels["dash"] == "1.0"  # the pin, else what .venv has
    assert any("mujoco: lock.txt pins 4.0.0, --python has 1.0" in n for n in plan.notes)
    assert plan.why["pydantic-core"] == "required by pydantic"
    left = plan.left_out
    assert "imported only where optional" in left["comm"]
    assert left["glfw"] == "required by mujoco; not imported on the rollout path"
    assert left["nbformat"].endswith("not imported on the rollout path") and "flask" in left and "jsonschema" in left
    assert plan.host_used == ["narwhals", "numpy", "werkzeug"]


def test_runtime_needs_override_an_optional_import():
    imported = {"mujoco", "mujoco-core", "pyopengl"}
    plan = hb.make_plan(imported, {"mujoco"}, INVENTORY, {}, HOST, optional={"pyopengl"}, runtime={"pyopengl"})
    assert "pyopengl" in plan.wheels and "pyopengl" not in plan.left_out
    assert plan.why["pyopengl"] == "required by mujoco; needed at run time (the episode failed without it)"


def test_a_host_package_too_old_for_the_rollout_path_is_carried_at_the_pin():
    plan = hb.make_plan({"mujoco"}, {"mujoco"}, INVENTORY, {"transformers": "5.24.0"}, HOST | {"transformers"})
    assert plan.wheels["transformers"] == "5.24.0" and "continuous batching" in plan.why["transformers"]
    assert "transformers" not in hb.make_plan({"mujoco"}, {"mujoco"}, INVENTORY, {}, HOST).wheels  # no pin: none


def test_an_imported_distribution_without_a_version_is_an_error():
    with pytest.raises(hb.BundleError, match="mystery"):
        hb.make_plan({"mystery"}, set(), hb.Inventory(), {}, HOST)


def test_every_module_on_the_rollout_path_exists_except_those_being_written():
    missing = [m for m in hb.ROLLOUT_MODULES if not hb.module_exists(m)]
    assert set(missing) <= hb.OPTIONAL_MODULES


# ---------------------------------------------------------------------------------------------- the scripts
def test_install_script_installs_offline_unpacks_the_gl_debs_and_prints_the_exports():
    text = hb.install_script(["mujoco", "pyzmq"], "abc123", "test")
    assert text.startswith("#!/bin/bash\n")
    assert '-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE"' in text
    assert 'SITE="${SITE:-/tmp/site}"' in text
    assert 'for f in "$BUNDLE"/debs/*.deb; do dpkg -x "$f" /; done' in text and "\n  ldconfig\n" in text
    assert "libEGL.so.1" in text and "libOpenGL.so.0" in text
    assert "__EGL_VENDOR_LIBRARY_FILENAMES=$nv_egl" in text and "VK_DRIVER_FILES=$nv_vk" in text
    assert '"PYTHONPATH=$pythonpath"' in text and '"$REPO/src/captain_ros"' in text
    assert '"PATH=$(prepend "$BUNDLE/bwrap" "$PATH")"' in text and '"MUJOCO_GL=egl"' in text
    assert "LD_LIBRARY_PATH=" not in text, "bwrap's libs must not reach other programs (the wrapper sets them)"
    assert ".host_bundle-abc123" in text


def test_smoke_script_runs_one_expert_episode_through_the_cli_and_a_sandbox_cell():
    text = hb.smoke_script("test")
    assert 'eval "$env_lines"' in text and 'bash "$BUNDLE/install.sh"' in text
    line = next(
        x for x in text.splitlines() if x.startswith('timeout "${SMOKE_TIMEOUT:-420}" python3 -m captain_ros.cli')
    )
    assert line.endswith('--runs-dir "$RUNS"')
    for flag in ("rollout", "--tasks put_red_cube_in_bowl", "--split train", "--starts-per-task 1", "--group-size 1",
                 "--no-images", "--no-ship"):  # fmt: skip
        assert flag in line
    assert "STRICT SUCCESS" in text and "from captain_ros.agent.sandbox import Sandbox" in text
    assert "SANDBOX OK" in text


def test_the_smoke_rollout_arguments_are_what_the_cli_takes():
    from captain_ros.cli import build_parser

    args = build_parser().parse_args([*hb.SMOKE_ROLLOUT, "--runs-dir", "/tmp/runs"])
    assert (args.tasks, args.split, args.starts_per_task, args.attempts) == ("put_red_cube_in_bowl", "train", 1, 1)
    assert args.no_images and args.no_ship and args.workers == 1 and args.engine == "local"
    cli = (ROOT / "src" / "captain_ros" / "captain_ros" / "cli" / "__main__.py").read_text()
    assert 'if __name__ == "__main__":\n    sys.exit(main())' in cli, "smoke.sh runs `python3 -m captain_ros.cli`"


@needs_bash
@pytest.mark.parametrize("which", ["install.sh", "smoke.sh"])
def test_scripts_are_valid_bash(tmp_path, which):
    text = hb.install_script(["x"], "s", "t") if which == "install.sh" else hb.smoke_script("t")
    (tmp_path / which).write_text(text)
    assert subprocess.run([BASH, "-n", str(tmp_path / which)], capture_output=True, text=True).returncode == 0


def make_wheel(path: Path, files: dict[str, str]) -> Path:
    """A small wheel with RECORD lines for its files."""
    name, version = path.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
        z.writestr(f"{info}/RECORD", record)
    return path


@needs_bash
def test_install_script_installs_once_and_its_exports_set_the_environment(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "bwrap" / "lib").mkdir(parents=True)
    make_wheel(bundle / "wheels" / "demo_pkg-1.0-py3-none-any.whl", {"demo_pkg/__init__.py": "VALUE = 42\n"})
    (bundle / "bwrap" / "bwrap").write_text(hb.bwrap_wrapper())
    (bundle / "bwrap" / "lib" / "bwrap").write_text('#!/bin/sh\necho "bubblewrap 0.0 (fake)"\n')
    (bundle / "install.sh").write_text(hb.install_script(["demo-pkg"], "s1", "test"))
    site = tmp_path / "site"
    env = {**os.environ, "REPO": str(ROOT), "SITE": str(site), "PYTHON": sys.executable, "HOST_BUNDLE_GL": "skip",
           "ENV_FILE": str(tmp_path / "env"), "PYTHONPATH": "/elsewhere", "PIP_NO_INDEX": "1"}  # fmt: skip
    env.pop("LD_LIBRARY_PATH", None)
    show = 'eval "$(bash "$1")" && printf "%s\\n" "$PYTHONPATH" "$PATH" "$MUJOCO_GL" "${LD_LIBRARY_PATH-unset}"'
    run = [BASH, "-c", show, "-", str(bundle / "install.sh")]
    first = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    pythonpath, path, gl, ld = first.stdout.splitlines()
    assert pythonpath == f"{ROOT}/src/captain_ros:{site}:/elsewhere"
    assert path.split(":")[0] == str(bundle / "bwrap") and gl == "egl" and ld == "unset"
    assert (site / "demo_pkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert "installing 1 into" in first.stderr and "not unpacking (HOST_BUNDLE_GL=skip" in first.stderr
    assert "bubblewrap 0.0 (fake)" in first.stderr
    assert (tmp_path / "env").read_text().startswith("export ")
    again = subprocess.run(
        [BASH, "-c", show, "-", str(bundle / "install.sh")],
        env={**env, "PYTHONPATH": pythonpath, "PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "already in" in again.stderr
    assert again.stdout.splitlines()[:2] == [pythonpath, path], "a second eval adds nothing twice"


@needs_bash
def test_bwrap_wrapper_gives_the_libs_to_bwrap_alone_and_passes_arguments_through(tmp_path):
    folder = tmp_path / "b"
    (folder / "lib").mkdir(parents=True)
    (folder / "bwrap").write_text(hb.bwrap_wrapper())
    (folder / "bwrap").chmod(0o755)
    (folder / "lib" / "bwrap").write_text(
        '#!/bin/sh\necho "LD=$LD_LIBRARY_PATH"\nfor a in "$@"; do echo "[$a]"; done\n'
    )
    (folder / "lib" / "bwrap").chmod(0o755)
    link = tmp_path / "on-path"
    link.mkdir()
    (link / "bwrap").symlink_to(folder / "bwrap")  # found through a link on PATH: the libs still resolve
    env = {"PATH": f"{link}:/usr/bin:/bin"}  # as the sandbox starts it: a fresh environment
    done = subprocess.run(["bwrap", "--ro-bind", "/a b", "/c"], env=env, capture_output=True, text=True)
    assert done.stdout.splitlines() == [f"LD={folder}/lib", "[--ro-bind]", "[/a b]", "[/c]"]


# ---------------------------------------------------------------------------------------------- wheels, blocker
def test_slimming_drops_the_listed_entries_and_their_record_lines(tmp_path):
    wheel = make_wheel(
        tmp_path / "open3d_cpu-0.20.0-py3-none-any.whl",
        {
            "open3d/__init__.py": "",
            "open3d/libOpen3D.so.0.20": "core",
            "open3d/resources/font.ttf": "x" * 1000,
            "open3d/open3d_tf_ops.so": "tf",
            "open3d_cpu-0.20.0.data/data/share/jupyter/x.json": "{}",
        },
    )
    assert not hb.is_slimmed(wheel, hb.SLIM["open3d-cpu"])
    count, saved = hb.slim_wheel(wheel, hb.SLIM["open3d-cpu"])
    assert count == 3 and saved > 0
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("open3d_cpu-0.20.0.dist-info/RECORD").decode()
    assert {"open3d/__init__.py", "open3d/libOpen3D.so.0.20"} <= names
    assert not any(n.startswith(("open3d/resources/", "open3d_cpu-0.20.0.data/")) or "tf_ops" in n for n in names)
    assert "resources" not in record and "tf_ops" not in record and "open3d/libOpen3D.so.0.20,," in record
    assert hb.is_slimmed(wheel, hb.SLIM["open3d-cpu"]) and hb.slim_wheel(wheel, hb.SLIM["open3d-cpu"]) == (0, 0)


def test_wheel_names_match_their_distribution_and_version():
    assert hb.wheel_matches("mujoco_core-4.0.0-cp312-cp312-manylinux_2_27_x86_64.whl", "mujoco-core", "4.0.0")
    assert not hb.wheel_matches("mujoco_core-4.0.0-cp312-cp312-manylinux_2_27_x86_64.whl", "mujoco", "4.0.0")
    assert not hb.wheel_matches("pyzmq-27.2.0-cp312-abi3-manylinux_2_28_x86_64.whl", "pyzmq", "27.3.0")


def test_the_stand_in_refuses_a_blocked_distribution_and_names_it(tmp_path):
    packages = tmp_path / "pkgs"
    (packages / "fakepkg").mkdir(parents=True)
    (packages / "fakepkg" / "__init__.py").write_text("")
    (packages / "allowedpkg.py").write_text("OK = 1\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(hb.SITECUSTOMIZE)
    block = tmp_path / "blocked.json"
    block.write_text(json.dumps({os.path.realpath(packages / "fakepkg" / "__init__.py"): "fake-dist"}))
    code = "import allowedpkg\ntry:\n    import fakepkg\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{packages}", "HOST_BUNDLE_BLOCK": str(block)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert hb.MISSING.findall(done.stdout) == ["fake-dist"]


def test_next_steps_name_one_call_or_the_carry_parts():
    fits = hb.next_steps(".cache/host_bundle", 30 * hb.MIB, 56)
    assert fits[-1] == "  bash .cache/host_bundle/smoke.sh"
    split = "\n".join(hb.next_steps(".cache/host_bundle", 105 * hb.MIB, 56))
    assert "python3 tools/carry.py pack .cache/host_bundle --out .cache/carry --name host_bundle --max-mib 56" in split
    assert "carry.py unpack /tmp/carry --to /tmp/hb && bash /tmp/hb/host_bundle/smoke.sh" in split


def test_help_explains_the_commands():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "host_bundle.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    for word in ("plan", "build", "check", "install.sh", "smoke.sh", "/tmp/site", "MUJOCO_GL=egl"):
        assert word in done.stdout

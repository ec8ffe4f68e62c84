"""The setup step: stamps, resume after failure, and messages that name the failed step."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("setup_env", ROOT / "tools" / "setup_env.py")
setup_env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_env)


def test_wrong_python_is_refused_with_a_step_name_and_a_remedy(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 12, 1, "final", 0))
    with pytest.raises(setup_env.SetupError) as err:
        setup_env.Setup(Path("/nonexistent"), set()).check_python()
    assert "step 'interpreter' failed" in str(err.value)
    assert "PYTHON=python3.11" in str(err.value)


def test_failed_command_names_step_command_hint_and_log_tail(tmp_path):
    log = tmp_path / "x.log"
    cmd = [sys.executable, "-c", "print('cmake error: Foo.msg line 3'); raise SystemExit(3)"]
    with pytest.raises(setup_env.SetupError) as err:
        setup_env.run(cmd, "interfaces", "fix the message file", logfile=log)
    text = str(err.value)
    assert "step 'interfaces' failed" in text and "exited with 3" in text
    assert "Foo.msg line 3" in text and "fix the message file" in text and str(log) in text


def test_stamps_skip_finished_work_and_force_redoes_it(tmp_path):
    s = setup_env.Setup(tmp_path / "venv", set())
    assert not s.done("packages", "k1")
    s.mark("packages", "k1")
    assert s.done("packages", "k1")
    assert not s.done("packages", "k2"), "a changed input must redo the step"
    forced = setup_env.Setup(tmp_path / "venv", {"interfaces"})
    forced.mark("interfaces-captain_interfaces", "k")
    assert not forced.done("interfaces-captain_interfaces", "k")


def test_digest_follows_file_content(tmp_path, monkeypatch):
    monkeypatch.setattr(setup_env, "ROOT", tmp_path)
    f = tmp_path / "lock.txt"
    f.write_text("a==1\n")
    before = setup_env.digest([f])
    f.write_text("a==2\n")
    assert setup_env.digest([f]) != before


def test_failure_stops_the_run_and_a_rerun_resumes_at_the_failed_step(tmp_path, monkeypatch, capsys):
    ran: list[str] = []
    fail = {"interfaces"}

    def step(name):
        def action(self, *_args):
            key = "k"
            if self.done(name, key):
                return
            ran.append(name)
            if name in fail:
                raise setup_env.SetupError(f"step '{name}' failed: boom")
            self.mark(name, key)

        return action

    for method, name in [
        ("check_python", "interpreter"),
        ("debian", "debian"),
        ("make_venv", "venv"),
        ("python_packages", "packages"),
        ("colcon", "colcon"),
        ("cmake_fix", "cmake-fix"),
        ("interfaces", "interfaces"),
        ("project", "project"),
        ("verify", "verify"),
        ("student", "student"),
        ("jazzy_wheels", "jazzy-wheels"),
        ("jazzy", "jazzy"),
        ("vllm", "vllm"),
        ("libero", "libero"),
    ]:
        monkeypatch.setattr(setup_env.Setup, method, step(name))

    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err
    assert "step 'interfaces' failed" in err and "rerun" in err
    beside = {step for group in setup_env.BESIDE for step in group}  # own threads: done whatever the main chain did
    assert [name for name in ran if name not in beside] == [
        "interpreter", "debian", "venv", "packages", "colcon", "cmake-fix", "interfaces"
    ]  # fmt: skip
    assert [name for name in ran if name in beside and name != "jazzy-wheels"] == ["vllm", "libero"]
    assert "jazzy-wheels" in ran and "jazzy" not in ran  # the Jazzy venv's project waits for the main chain's

    ran.clear()
    fail.clear()
    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 0
    assert ran == ["interfaces", "project", "verify", "student", "jazzy"], "finished steps must be skipped"


def test_the_jazzy_project_step_waits_for_the_jazzy_wheels_beside_the_main_chain(tmp_path, monkeypatch):
    """The Jazzy wheels build in their own thread from the start; the Jazzy project step runs after both them and
    the main chain's project (the same source folder), and not at all when the wheels failed."""
    import threading

    events: list[str] = []
    wheels_started, wheels_may_finish = threading.Event(), threading.Event()

    def step(name):
        def action(self, *_args):
            if name == "jazzy-wheels":
                events.append("wheels started")
                wheels_started.set()
                assert wheels_may_finish.wait(30), "the main chain never got to its project step"
            if name == "project":
                # the wheels' thread starts with the setup: it is under way by now (a loaded host may not have
                # scheduled it before the main chain's quick steps ran, hence the wait)
                assert wheels_started.wait(30), "the Jazzy wheels did not start beside the main chain"
                wheels_may_finish.set()  # the main chain reached its project while the wheels were still building
            events.append(name)

        return action

    methods = {"check_python": "interpreter", "debian": "debian", "make_venv": "venv", "python_packages": "packages",
               "colcon": "colcon", "cmake_fix": "cmake-fix", "interfaces": "interfaces", "project": "project",
               "verify": "verify", "student": "student", "jazzy_wheels": "jazzy-wheels", "jazzy": "jazzy",
               "vllm": "vllm", "libero": "libero"}  # fmt: skip
    for method, name in methods.items():
        monkeypatch.setattr(setup_env.Setup, method, step(name))
    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 0
    assert events.index("wheels started") < events.index("project") < events.index("jazzy-wheels")
    assert events.index("jazzy-wheels") < events.index("jazzy") and events.index("verify") < events.index("jazzy")

    def failing_wheels(self, *_args):
        raise setup_env.SetupError("step 'jazzy/packages' failed: no network")

    events.clear()
    monkeypatch.setattr(setup_env.Setup, "jazzy_wheels", failing_wheels)
    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 1
    assert "jazzy" not in events and "verify" in events and "libero" in events


def test_a_failure_beside_the_main_chain_is_reported_and_the_chain_still_runs(tmp_path, monkeypatch, capsys):
    ran: list[str] = []

    def step(name):
        def action(self, *_args):
            ran.append(name)
            if name == "vllm":
                raise setup_env.SetupError("step 'vllm/packages' failed: no network")

        return action

    for method in ("check_python", "debian", "make_venv", "python_packages", "colcon", "cmake_fix", "interfaces",
                   "project", "verify", "student", "jazzy_wheels", "jazzy", "vllm", "libero"):  # fmt: skip
        monkeypatch.setattr(setup_env.Setup, method, step(method))
    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 1
    assert "step 'vllm/packages' failed: no network" in capsys.readouterr().err
    assert "jazzy" in ran and "libero" not in ran  # the main chain went on; its own thread stopped at its failure


# ------------------------------------------------------------------ the Jazzy environment and colcon
def test_jazzy_step_runs_the_same_steps_on_its_own_venv_with_the_jazzy_wheels(tmp_path, monkeypatch):
    calls: list[tuple[str, Path, Path, str, frozenset]] = []
    for method in ("make_venv", "python_packages", "cmake_fix", "interfaces", "project", "verify"):
        monkeypatch.setattr(
            setup_env.Setup,
            method,
            lambda self, m=method: calls.append((m, self.venv, self.lock, self.verify_code, frozenset(self.force))),
        )
    main = setup_env.Setup(tmp_path / "main", set())
    main.jazzy_wheels(tmp_path / "jazzy")
    main.jazzy(tmp_path / "jazzy")
    assert [c[0] for c in calls] == ["make_venv", "python_packages", "cmake_fix", "interfaces", "project", "verify"]
    assert {c[1] for c in calls} == {tmp_path / "jazzy"}, "every Jazzy step works on the Jazzy venv"
    assert {c[2] for c in calls} == {setup_env.JAZZY_LOCK}
    assert {c[3] for c in calls} == {setup_env.VERIFY_JAZZY}
    assert {c[4] for c in calls} == {frozenset()}

    calls.clear()
    forced = setup_env.Setup(tmp_path / "main", {"jazzy"})
    forced.jazzy_wheels(tmp_path / "jazzy")
    forced.jazzy(tmp_path / "jazzy")
    assert {c[4] for c in calls} == {frozenset({"packages", "interfaces", "project", "verify"})}, "--force redoes them"

    calls.clear()
    main.jazzy(tmp_path / "jazzy")
    assert "verify" not in [c[0] for c in calls], "nothing changed: the (slow) import check is not repeated"
    (tmp_path / "jazzy" / ".captain_setup" / "packages.stamp").write_text("another lock")
    main.jazzy(tmp_path / "jazzy")
    assert [c[0] for c in calls][-1] == "verify", "a step did work: verify again"


def test_jazzy_failures_name_the_jazzy_step_and_its_remedy(tmp_path):
    jazzy = setup_env.Setup(tmp_path / "v", set(), lock=setup_env.JAZZY_LOCK, distro="jazzy", verify_code="")
    assert jazzy.step("packages") == "jazzy/packages"
    assert setup_env.Setup(tmp_path / "v", set()).step("packages") == "packages"
    jazzy.py = Path(sys.executable)
    jazzy.verify_code = "raise SystemExit('rclpy 9.1.2 is not the Jazzy build (7.x)')"
    with pytest.raises(setup_env.SetupError) as err:
        jazzy.verify()
    text = str(err.value)
    assert "step 'jazzy/verify' failed" in text and "not the Jazzy build" in text and "--force jazzy" in text


def test_the_jazzy_verification_checks_the_distro_and_the_node_imports():
    assert "startswith('7.')" in setup_env.VERIFY_JAZZY
    for node in ("twin_node", "motion_node", "perception_node"):
        assert f"captain_ros.ros.{node}" in setup_env.VERIFY_JAZZY


def test_changed_ros_wheels_rebuild_the_interfaces_and_other_pins_do_not(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("numpy==2.4.6\nros-rclpy==7.1.6\n")
    s = setup_env.Setup(tmp_path / "v", set(), lock=lock)
    s.rebuild_interfaces_if_ros_wheels_changed()  # first time: only records the ROS pins
    s.mark("interfaces-captain_interfaces", "k")
    lock.write_text("numpy==2.4.7\nros-rclpy==7.1.6\n")
    s.rebuild_interfaces_if_ros_wheels_changed()
    assert s.done("interfaces-captain_interfaces", "k"), "a non-ROS pin must not rebuild the interfaces"
    lock.write_text("numpy==2.4.7\nros-rclpy==7.1.7\n")
    s.rebuild_interfaces_if_ros_wheels_changed()
    assert not s.done("interfaces-captain_interfaces", "k"), "new ROS wheels must rebuild the interfaces"


def test_children_of_another_venv_lose_its_ros_library_paths(tmp_path):
    """Run from .venv, the setup must not hand Kilted's library path and bootstrap guard to .venv-jazzy."""
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages" / "ros_rclpy.libs").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    env = {
        "_ROS_WHEELS_BOOTSTRAP_COMPLETE": "1",
        "LD_LIBRARY_PATH": f"{venv / 'lib'}:/opt/vendor/lib:{venv / 'lib/python3.11/site-packages/ros_rclpy.libs'}",
        "HOME": "/root",
    }
    clean = setup_env.without_ros_wheel_paths(env)
    assert clean == {"LD_LIBRARY_PATH": "/opt/vendor/lib", "HOME": "/root"}
    assert "LD_LIBRARY_PATH" not in setup_env.without_ros_wheel_paths({"LD_LIBRARY_PATH": str(venv / "lib")})


def test_every_venv_gets_a_colcon_ignore(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # an existing 3.11 venv: make_venv keeps it
    setup_env.Setup(venv, set()).make_venv()
    assert (venv / "COLCON_IGNORE").is_file()


def _pins(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if "==" in line and not line.startswith("#")]
    return {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in lines}


def test_jazzy_lock_pins_jazzy_wheels_and_the_main_locks_other_versions():
    main, jazzy = _pins(setup_env.LOCK), _pins(setup_env.JAZZY_LOCK)
    assert jazzy["ros-jazzy-rclpy"] == "7.1.6" and jazzy["ros-rclpy"] == "7.1.6"
    assert main["ros-rclpy"].split(".")[0] == "9", "the main venv holds the Kilted wheels"
    differing = {n: (v, main[n]) for n, v in jazzy.items() if n in main and not n.startswith("ros-") and v != main[n]}
    assert not differing, f"jazzy-lock.txt and lock.txt pin these differently (run `make lock`): {differing}"


def test_colcon_pins_leave_out_its_pytest_plugins():
    colcon, main = _pins(setup_env.COLCON_LOCK), _pins(setup_env.LOCK)
    assert {"colcon-core", "colcon-ros", "colcon-cmake", "colcon-python-setup-py"} <= set(colcon)
    assert not {"pytest-cov", "pytest-repeat", "pytest-rerunfailures"} & (set(colcon) | set(main))
    assert not set(colcon) & set(main), "colcon.txt holds only what lock.txt lacks (it is installed --no-deps)"


@pytest.mark.slow
def test_no_pytest_plugin_of_colcon_is_loaded(pytestconfig):
    plugins = {name for name, _ in pytestconfig.pluginmanager.list_name_plugin()}
    assert not {"pytest_cov", "repeat", "rerunfailures"} & plugins, plugins


@pytest.mark.slow
def test_second_run_on_the_real_venv_does_nothing():
    venv = ROOT / ".venv"
    if not (venv / ".captain_setup").is_dir():
        pytest.skip("no set-up .venv in this checkout")
    if not (ROOT / ".venv-jazzy" / ".captain_setup").is_dir():
        pytest.skip("no set-up .venv-jazzy in this checkout")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "setup_env.py"), "--venv", str(venv)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stdout and "building" not in proc.stdout, proc.stdout
    assert "ready in" in proc.stdout

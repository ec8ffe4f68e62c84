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
        def action(self):
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
        ("cmake_fix", "cmake-fix"),
        ("interfaces", "interfaces"),
        ("project", "project"),
        ("verify", "verify"),
    ]:
        monkeypatch.setattr(setup_env.Setup, method, step(name))

    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err
    assert "step 'interfaces' failed" in err and "rerun" in err
    assert ran == ["interpreter", "debian", "venv", "packages", "cmake-fix", "interfaces"]

    ran.clear()
    fail.clear()
    assert setup_env.main(["--venv", str(tmp_path / "v")]) == 0
    assert ran == ["interfaces", "project", "verify"], "finished steps must be skipped on a rerun"


@pytest.mark.slow
def test_second_run_on_the_real_venv_does_nothing():
    venv = ROOT / ".venv"
    if not (venv / ".captain_setup").is_dir():
        pytest.skip("no set-up .venv in this checkout")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "setup_env.py"), "--venv", str(venv)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stdout and "building" not in proc.stdout, proc.stdout
    assert "ready in" in proc.stdout

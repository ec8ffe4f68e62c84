"""tools/student_gpu_host.sh refuses what it cannot do with a message, before starting anything."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "student_gpu_host.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def run(tmp_path, *stages):
    env = {**os.environ, "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "WAIT_S": "1"}
    env["FINE_TUNED"] = str(tmp_path / "none")  # not the student kept in models/
    return subprocess.run(["bash", str(SCRIPT), *stages], cwd=ROOT, env=env, capture_output=True, text=True)


def test_no_stage_prints_the_usage_and_makes_nothing(tmp_path):
    done = run(tmp_path)
    assert done.returncode == 2 and "stages: prepare sft bench eval dagger label stop rl" in done.stdout
    assert "RL_CARRY" in done.stdout and "$OUT/rl" in done.stdout  # how the rl stage resumes and what comes back
    assert not (tmp_path / "work").exists()


def test_an_unknown_stage_is_named(tmp_path):
    done = run(tmp_path, "train")
    assert (
        done.returncode == 2
        and "unknown stage train (prepare, sft, bench, eval, dagger, label, stop, rl)" in done.stderr
    )


def test_prepare_without_the_rollout_bundle_goes_on_to_the_student_and_says_the_eval_needs_it(tmp_path):
    """The SFT needs no bundle (the student's carry holds the locked transformers, which converts its tokenizer as
    here): prepare says the eval stage will need it and goes on to the student, whose missing parts stop it."""
    env_dirs = {"CARRY": tmp_path / "carry", "BUNDLE_CARRY": tmp_path / "carry_hb", "BUNDLE": tmp_path / "hb" / "b"}
    env = {**os.environ, "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out")}
    env.update({k: str(v) for k, v in env_dirs.items()})
    done = subprocess.run(["bash", str(SCRIPT), "prepare"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert f"no rollout bundle (carry its parts into {tmp_path / 'carry_hb'} for the eval stage)" in done.stdout
    assert str(tmp_path / "carry") in done.stdout + done.stderr  # the student's parts are not there
    assert not (tmp_path / "work" / "student").exists()  # the student was not built


def test_the_evaluation_without_a_fine_tuned_model_says_which_stage_makes_it(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "host.env").write_text("")  # as if the bundle were installed
    for stage in ("eval", "dagger", "rl"):  # the training-start rollouts and the RL rounds serve the same student
        done = run(tmp_path, stage)
        assert done.returncode == 1 and "no fine-tuned student: run the sft stage, or set FINE_TUNED" in done.stdout
        assert not (tmp_path / "work" / f"{stage}.log").exists()  # nothing started


def test_the_evaluation_without_the_rollout_bundle_says_so_before_starting(tmp_path):
    model = tmp_path / "work" / "sft" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    done = run(tmp_path, "eval")
    assert done.returncode == 1 and "no rollout bundle installed: carry its parts into" in done.stdout
    assert not (tmp_path / "work" / "eval.log").exists()  # nothing started


def test_the_rl_stage_packs_its_latest_checkpoint_and_unpacks_a_carried_one(tmp_path):
    """A finished run (its done file: nothing is started): each call packs the checkpoint LATEST names into
    $OUT/rl as flat files, which tools/carry.py puts back together as round-NNNNN/; files carried into $RL_CARRY are
    unpacked for the driver's --resume-from."""
    work = tmp_path / "work"
    (work / "sft" / "model").mkdir(parents=True)
    (work / "sft" / "model" / "config.json").write_text("{}")
    (work / "sft" / "sft_run.json").write_text('{"trained_rows": [151657, 151658]}')  # this host's SFT, done
    (work / "host.env").write_text("")  # as if the bundle were installed
    (work / "proj").mkdir()
    (work / "proj" / "tools").symlink_to(ROOT / "tools")
    checkpoint = work / "rl" / "checkpoints" / "round-00002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "ledger.json").write_text('{"ledger": {"rounds": 2}}')
    (checkpoint / "trainer.pt").write_bytes(bytes(range(256)) * 4096)
    (work / "rl" / "checkpoints" / "LATEST").write_text("round-00002\n")
    (work / "rl" / "done").write_text("2 rounds\n")
    env = {**os.environ, "WORK": str(work), "OUT": str(tmp_path / "out"), "WAIT_S": "1",
           "RL_CARRY": str(tmp_path / "carry_rl")}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT), "rl"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RL rounds done: 2 rounds" in done.stdout and "checkpoint round-00002 packed into" in done.stdout
    back = sorted(p.name for p in (tmp_path / "out" / "rl").iterdir())
    assert back == ["rl-part01", "rl.carry-manifest.json"]
    shutil.copytree(tmp_path / "out" / "rl", tmp_path / "carry_rl")  # the next host
    done = subprocess.run(["bash", str(SCRIPT), "rl"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    carried = work / "rl_carried" / "round-00002"
    assert (carried / "trainer.pt").read_bytes() == (checkpoint / "trainer.pt").read_bytes()
    assert (carried / "ledger.json").read_text() == (checkpoint / "ledger.json").read_text()


def test_stop_ends_this_hosts_runs_that_serve_a_student_and_no_others(tmp_path):
    """`label stop sft`: the SFT gets the GPU to itself. Only runs of this $WORK are ended (the pattern names it), so
    another user's server on the machine, here one of another WORK, goes on."""
    work, other = tmp_path / "work", tmp_path / "other"
    assert "nothing to stop" in run(tmp_path, "stop").stdout

    def fake(name: str, folder: Path) -> subprocess.Popen:  # a process whose command line reads as the real one's
        line = f"python3 -m captain_ros_training {name} --model {folder}/fine_tuned/model"
        return subprocess.Popen(["bash", "-c", f'exec -a "{line}" sleep 300'])

    ours = [fake("hf-serve", work), fake("student-eval run", work), fake("rl-host run", work)]
    theirs = fake("hf-serve", other)
    try:
        done = run(tmp_path, "stop")
        assert done.returncode == 0 and "stopped the background runs" in done.stdout, done.stdout + done.stderr
        assert [p.wait(timeout=30) for p in ours] == [-15, -15, -15]  # SIGTERM
        assert theirs.poll() is None
    finally:
        for p in (*ours, theirs):
            p.kill()
            p.wait()

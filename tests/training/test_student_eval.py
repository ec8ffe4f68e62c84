"""The student's evaluation read-back: behaviour counted from recorded model calls and step records, paired
comparison by hand, one row per start when a run was resumed, and the plan's held-out starts."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from captain_ros.bridge.evaluation import EvalRow, summarize
from captain_ros.bridge.store import Episode, RequestData
from captain_ros.twin.tasks import default_suite
from captain_ros_training import student_eval as ev
from captain_ros_training.cli import student_eval_cli as ev_cli


def _call(tool_calls=None, content="", tokens=10):
    return {"response": {"content": content, "tool_calls": tool_calls or []}, "token_ids": list(range(tokens))}


def _python(code="print(1)", name="python", raw=None):
    arguments = raw if raw is not None else json.dumps({"code": code})
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def _step(cells=(), calls=()):
    return {"cells": list(cells), "calls": list(calls)}


def test_behaviour_counts_parses_fenced_blocks_raising_cells_and_misuse_by_hand():
    one = Episode(
        "e1",
        {},
        {"valid": True},
        [
            RequestData(
                1, _call([_python()], tokens=30), _step([{"source": "tool_call", "status": "ok", "error": ""}])
            ),
            RequestData(
                2,
                _call([_python(raw="{code: 1")], tokens=20),
                _step([{"source": "tool_call", "status": "not_run", "error": "the tool arguments are not valid JSON"}]),
            ),
            RequestData(
                3,
                _call(content="```python\nrobot.move()\n```", tokens=50),
                _step(
                    [{"source": "fenced", "status": "error", "error": "AttributeError: no attribute 'move'"}],
                    [{"capability": "segment", "failure_category": "invalid_argument"}],
                ),
            ),
        ],
    )
    two = Episode(
        "e2",
        {},
        {"valid": True},
        [RequestData(1, _call(content="I am done.", tokens=100), _step())],
    )
    b = ev.behaviour([one, two])
    assert (b["episodes"], b["requests"]) == (2, 4)
    assert b["requests_per_episode"] == 2.0  # (3 + 1) / 2
    assert b["output_tokens_per_episode"] == 100.0  # (30 + 20 + 50 + 100) / 2
    assert b["replies_with_tool_call"] == 2 and b["tool_call_parse_rate"] == 0.5  # request 2's JSON is broken
    assert (b["replies_with_fenced_block_only"], b["replies_with_neither"]) == (1, 1)
    assert (b["cells"], b["cells_raised"]) == (3, 1) and b["cell_raise_rate"] == pytest.approx(1 / 3)
    assert b["cell_error_types"] == {"AttributeError": 1}
    assert b["robot_call_failures"] == {"segment: invalid_argument": 1}


def _row(task, start, strict, valid=True, episode_id="x"):
    return EvalRow(
        policy="p",
        task=task,
        family="f",
        start_id=start,
        attempt=0,
        outcome="success" if strict else "failure",
        host_success=strict,
        strict_success=strict,
        finished=strict,
        requests=1,
        actions=0,
        wall_time_s=1.0,
        valid=valid,
        episode_id=episode_id,
    )


def test_compare_pairs_common_valid_starts_and_counts_discordant_pairs_by_hand():
    a = [_row("t", "s1", True), _row("t", "s2", False), _row("t", "s3", False), _row("t", "s4", True, valid=False)]
    b = [_row("t", "s1", True), _row("t", "s2", True), _row("t", "s3", True), _row("t", "s4", True)]
    pair = ev.compare(a, b)
    assert pair["pairs"] == 3  # s4 is invalid in A
    assert (pair["a_only"], pair["b_only"]) == (0, 2)
    assert pair["a_rate"] == pytest.approx(1 / 3) and pair["b_rate"] == 1.0
    assert pair["mcnemar_p"] == 0.5  # two discordant pairs, both one way: 2 x (1/2)^2


def test_unfinished_episodes_count_as_failures_so_the_rate_is_a_lower_bound():
    """A GPU host's time ran out with s3 and s4 running (s4's only episode invalid): both come back as failures under
    the plan's keys, the ended episodes unchanged: 1 of 4 strict, not 1 of 2."""
    plan = [_row("t", s, False, episode_id=f"z{s}") for s in ("s1", "s2", "s3", "s4")]
    ended = [_row("t", "s1", True), _row("t", "s2", False), _row("t", "s4", True, valid=False, episode_id="y")]
    rows = ev.with_unfinished(ended, plan)
    assert rows[:3] == ended
    added = rows[3:]
    assert [(r.start_id, r.strict_success, r.host_success, r.valid, r.episode_id) for r in added] == [
        ("s3", False, False, True, ""),
        ("s4", False, False, True, ""),
    ]
    assert all(r.policy == "p" and r.family == "f" and r.outcome == "failure" for r in added)
    stats = summarize(rows)["overall"]
    assert (stats["valid"], stats["rates"]["strict"]["k"], stats["excluded"]) == (4, 1, 1)
    assert ev.compare(plan, rows)["pairs"] == 4
    assert ev.with_unfinished(rows, plan) == rows  # nothing left to add


def test_a_resumed_evaluation_counts_each_start_once_preferring_its_valid_episode(tmp_path, monkeypatch):
    runs = {
        tmp_path / "run1" / "rollout.sqlite": [
            _row("t", "s1", False, valid=False, episode_id="a"),
            _row("t", "s2", True),
        ],
        tmp_path / "run2" / "rollout.sqlite": [_row("t", "s1", True, episode_id="b")],
    }
    for path in runs:
        path.parent.mkdir()
        path.touch()
    monkeypatch.setattr(ev, "load_rows", lambda store: runs[store])
    rows = {r.start_id: r for r in ev.rows_of(tmp_path)}
    assert len(rows) == 2 and rows["s1"].valid and rows["s1"].episode_id == "b"


def test_the_plan_covers_every_task_and_family_on_held_out_starts_the_same_way_each_time():
    jobs = ev.plan_jobs(ev.EvalPlan())
    suite = default_suite()
    assert len(jobs) == 5 * len(suite) >= 64
    assert Counter(suite[j.task].family for j in jobs).keys() == {suite[t].family for t in suite}
    assert all(j.split == "eval" for j in jobs)
    assert [j.start_id for j in jobs] == [j.start_id for j in ev.plan_jobs(ev.EvalPlan())]
    with pytest.raises(ValueError, match="unknown task"):
        ev.plan_jobs(ev.EvalPlan(tasks="fly_to_the_moon"))


def test_a_train_split_plan_draws_training_starts_none_of_which_is_held_out():
    """The student's own rollouts for DAgger labels (captain_ros_training.dagger) run on training starts only."""
    held_out = {j.start_id for j in ev.plan_jobs(ev.EvalPlan())}
    train = ev.plan_jobs(ev.EvalPlan(split="train", starts_per_task=8, seed=1))
    assert len(train) == 8 * len(default_suite()) and all(j.split == "train" for j in train)
    assert not held_out & {j.start_id for j in train}
    with pytest.raises(ValueError, match="unknown split 'test'"):
        ev.EvalPlan(split="test")


def test_where_each_run_generated_is_read_from_its_run_file_or_summary(tmp_path):
    """run.json is written when a run starts, so a run that never ended (its host's time ran out) still says where
    it generated; older runs have only their summary; a run with neither is unknown, not assumed."""
    old, new, cut, bare = (tmp_path / f"2026120{i}-100000" for i in range(4))
    for run in (old, new, cut, bare):
        run.mkdir()
        (run / "rollout.sqlite").touch()
    (old / "summary.json").write_text(json.dumps({"plan": {}}))  # written before the server was recorded: vLLM
    meta = {"plan": {"server": "transformers"}, "generation": {"host": "gpu-1", "gpu": "NVIDIA H100 80GB HBM3"}}
    (new / "summary.json").write_text(json.dumps(meta))
    (cut / ev.RUN_FILE).write_text(json.dumps(meta))
    h100 = {"server": "transformers", "host": "gpu-1", "gpu": "NVIDIA H100 80GB HBM3"}
    assert ev.generation_of(tmp_path) == [  # these stores hold no episodes yet
        {"run": old.name, "server": "vllm", "episodes": 0},
        {"run": new.name, "episodes": 0, **h100},
        {"run": cut.name, "episodes": 0, **h100},
        {"run": bare.name, "server": None, "episodes": 0},
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--server", "tgi"], "invalid choice: 'tgi'"),
        (["--split", "test"], "invalid choice: 'test'"),
        (["--starts-per-task", "0"], "--starts-per-task must be at least 1"),
        (["--kv-cache-memory-fraction", "0"], "--kv-cache-memory-fraction must be in (0, 1]"),
    ],
)
def test_the_run_command_refuses_bad_arguments_before_anything_starts(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        ev_cli.main(["run", "--model", str(tmp_path), "--label", "x", "--out", str(tmp_path / "out"), *args])
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_plan_names_a_known_server():
    assert ev.EvalPlan(server="transformers").server == "transformers"
    with pytest.raises(ValueError, match="unknown server 'tgi': vllm or transformers"):
        ev.EvalPlan(server="tgi")


def test_sigterm_unwinds_the_run_command_so_its_servers_are_stopped(tmp_path):
    """`kill` (SIGTERM) on `run` raises SystemExit inside the evaluation, so its finally blocks (model server, rollout
    workers) run, as on Ctrl-C; without the handler Python dies at once and leaves them running. The evaluation
    here is a stand-in that waits in a try/finally; the real one's cleanup is its `finally: server.stop()`."""
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from captain_ros_training import student_eval as ev\n"
        "def stand_in(model, label, out, plan, progress=True):\n"
        "    try:\n"
        "        print('evaluating', flush=True)\n"
        "        time.sleep(120)\n"
        "    finally:\n"
        "        Path(out).mkdir(parents=True, exist_ok=True)\n"
        "        (Path(out) / 'cleaned_up').write_text('yes')\n"
        "from captain_ros_training.cli import student_eval_cli as ev_cli\n"
        "ev.evaluate = stand_in\n"
        "ev_cli.main(sys.argv[1:])\n"
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "run", "--model", str(tmp_path), "--label", "x", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "evaluating"  # the handler is installed before the evaluation starts
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "stopped by signal 15: rerun the same command to resume" in err
    assert (out / "cleaned_up").read_text() == "yes"


def _outcome_row(task, outcome, attempt=0, policy="p", valid=True):
    host = outcome in ("success", "missed_finish")
    return EvalRow(policy, task, "fam", f"{task}/eval/0", attempt, outcome, host, outcome == "success",
                   outcome in ("success", "false_finish"), 5, 2, 1.0, valid, episode_id=f"{policy}-{task}")  # fmt: skip


# SFT vs RL on the same 8 starts, by hand:
#   t0..t3: SFT fails (failure, false_finish, missed_finish, budget_exhausted), RL succeeds (4 RL-only strict wins)
#   t4: both succeed; t5: SFT succeeds, RL false-finishes (1 SFT-only win); t6: both fail; t7: RL's row is invalid
SFT = ["failure", "false_finish", "missed_finish", "budget_exhausted", "success", "success", "failure", "success"]
RL = ["success", "success", "success", "success", "success", "false_finish", "failure", "success"]


def _rl_run(folder, rounds):
    """An rl_host run's driver rows: round k trained 8 episodes in 10 + 20 + 2 seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"round": k, "episodes": 8, "wait_s": 10.0, "update_s": 20.0, "sync_s": 2.0, "early_stopped": 1}
            for k in range(1, rounds + 1)]  # fmt: skip
    (folder / "rl_rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_rl_report_pairs_the_rl_student_with_sft_by_hand(tmp_path):
    sft = [_outcome_row(f"t{i}", o, policy="sft") for i, o in enumerate(SFT)]
    rl = [_outcome_row(f"t{i}", o, policy="rl", valid=i != 7) for i, o in enumerate(RL)]
    _rl_run(tmp_path / "rl" / "round-00002", 2)  # a carried checkpoint's copy of the logs, older ...
    _rl_run(tmp_path / "rl" / "checkpoints" / "round-00003", 3)  # ... and the furthest one
    report = ev.rl_report(sft, rl, tmp_path / "rl")
    # RL over its 7 valid rows: 5 strict successes (t0-t4), host also 5 (t5's false finish is not solved)
    assert report["student_rl_strict"] == pytest.approx(5 / 7) and report["student_rl_host"] == pytest.approx(5 / 7)
    # pairs: t0..t6 (t7 invalid for RL); discordant 4 RL-only, 1 SFT-only: p = 2 * P(X <= 1 | n=5) = 2 * 6/32
    assert report["rl_paired_starts"] == 7 and report["rl_vs_sft_mcnemar_p"] == pytest.approx(12 / 32)
    assert report["sft_false_finish_rate"] == pytest.approx(1 / 8)
    assert report["sft_missed_finish_rate"] == pytest.approx(1 / 8)
    assert report["rl_false_finish_rate"] == pytest.approx(1 / 7) and report["rl_missed_finish_rate"] == 0.0
    # the furthest run records: 3 rounds x 8 episodes, 3 x 32 s on the GPU
    assert (report["rl_rounds"], report["rl_episodes"], report["rl_gpu_seconds"]) == (3, 24, 96.0)
    assert report["rl_gpu_seconds_per_episode"] == pytest.approx(4.0) and report["rl_early_stopped"] == 3
    assert report["rl_missing"] is None


def test_without_an_rl_evaluation_the_rl_keys_are_null_and_say_why(tmp_path):
    sft = [_outcome_row(f"t{i}", o, policy="sft") for i, o in enumerate(SFT)]
    report = ev.rl_report(sft, None, tmp_path / "rl")
    for key in ("student_rl_strict", "student_rl_host", "rl_vs_sft_mcnemar_p", "rl_rounds", "rl_episodes",
                "rl_gpu_seconds_per_episode", "rl_false_finish_rate", "rl_missed_finish_rate"):  # fmt: skip
        assert report[key] is None, key
    assert report["sft_false_finish_rate"] == pytest.approx(1 / 8)  # the "before" side is measured
    assert "no evaluation of an RL student" in report["rl_missing"]
    assert "no RL run records" in report["rl_missing"]
    # an RL evaluation without its run's records: the rates, and the run's figures null with the reason
    rl = [_outcome_row(f"t{i}", o, policy="rl") for i, o in enumerate(RL)]
    report = ev.rl_report(sft, rl, tmp_path / "nowhere")
    assert report["student_rl_strict"] == pytest.approx(6 / 8) and report["rl_rounds"] is None
    assert report["rl_missing"].startswith("no RL run records")
    # and an RL evaluation with no SFT one to pair with: no McNemar p
    report = ev.rl_report(None, rl, tmp_path / "nowhere")
    assert report["rl_vs_sft_mcnemar_p"] is None and "no SFT evaluation" in report["rl_missing"]

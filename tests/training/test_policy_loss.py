"""CaPtain Eq. 8 and the AgenticRoboRL objective against hand-computed values (captain_ros_training/policy_loss.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from captain_ros_training.policy_loss import (
    ObjectiveConfig,
    RequestSample,
    accumulation_normaliser,
    agenticroborl_policy_loss,
    agenticroborl_token_weights,
    captain_policy_loss,
    captain_token_weights,
    dual_clip_loss,
    episode_rng,
    expand_to_tokens,
    k3_kl,
    keep_mask,
    leave_one_out_advantages,
    leave_one_out_by_group,
    policy_loss,
    sample_requests,
    staleness_ok,
    truncated_is_weight,
)

LN2 = math.log(2.0)


def _t(values, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=grad)


# ------------------------------------------------------------------ CaPtain Eq. 8: the 5-token example


def _five_tokens():
    """Ratios r = [0.1, 0.5, 1, 2, 5] (logp_rollout = 0, logp_new = ln r). Tokens 0-2 belong to request A with
    advantage +1, tokens 3-4 to request B with advantage -0.5. The episode had 16 requests of which 8 were sampled
    (A and B are two of them), so every token carries inclusion weight 16/8 = 2. d = ref - new = [ln2, ln2, 0,
    -ln2, ln2]."""
    r = [0.1, 0.5, 1.0, 2.0, 5.0]
    logp_new = _t([math.log(x) for x in r], grad=True)
    logp_rollout = torch.zeros(5)
    adv = expand_to_tokens([1.0, -0.5], [3, 2])
    sample = RequestSample((1, 4, 5, 7, 9, 10, 12, 15), 16, 2.0)
    weight = expand_to_tokens(captain_token_weights(sample)[:2], [3, 2])
    d = [LN2, LN2, 0.0, -LN2, LN2]
    logp_ref = (logp_new.detach() + torch.tensor(d)).clone()
    return logp_new, logp_rollout, adv, weight, logp_ref


def test_captain_five_token_example_by_hand():
    logp_new, logp_rollout, adv, weight, logp_ref = _five_tokens()
    assert adv.tolist() == [1.0, 1.0, 1.0, -0.5, -0.5]
    assert weight.tolist() == [2.0] * 5
    loss, m = captain_policy_loss(logp_new, logp_rollout, adv, logp_ref=logp_ref, token_weight=weight)
    # kept: 0.2 < r < 4 -> r = 0.1 dropped (low), 0.5, 1, 2 kept, 5 dropped (high) -> [F, T, T, T, F]
    # pg  = -sum w m r A = -2 * (0.5*1 + 1*1 + 2*(-0.5)) = -2 * 0.5 = -1.0
    # k3(ln2)  = 2 - ln2 - 1   = 0.306853; k3(0) = 0; k3(-ln2) = 0.5 + ln2 - 1 = 0.193147
    # KL  = sum w m k3 = 2 * (0.306853 + 0 + 0.193147) = 2 * 0.5 = 1.0 ; beta * KL = 0.002
    # loss = -1.0 + 0.002 = -0.998
    assert m["pg_loss"] == pytest.approx(-1.0, abs=1e-6)
    assert m["kl_loss"] == pytest.approx(0.002, abs=1e-8)
    assert loss.item() == pytest.approx(-0.998, abs=1e-6)
    # metrics: kept 3/5; ratio mean (0.1+0.5+1+2+5)/5 = 1.72; one low, one high of 5; KL mean over kept = 0.5/3;
    # advantage mean (3*1 - 2*0.5)/5 = 0.4, population var (3*0.6^2 + 2*0.9^2)/5 = 0.54 -> std 0.734847
    assert m["kept_frac"] == pytest.approx(0.6)
    assert m["ratio_mean"] == pytest.approx(1.72, abs=1e-6)
    assert m["clipped_low_frac"] == pytest.approx(0.2)
    assert m["clipped_high_frac"] == pytest.approx(0.2)
    assert m["kl_k3"] == pytest.approx(0.5 / 3, abs=1e-6)
    assert m["adv_mean"] == pytest.approx(0.4, abs=1e-6)
    assert m["adv_std"] == pytest.approx(math.sqrt(0.54), abs=1e-6)
    # gradient w.r.t. logp_new: -w m r A + beta w m (1 - e^d)   (d r / d logp = r; d k3 / d logp_new = 1 - e^d)
    # token 1: -2*0.5*1 + 0.002*2*(1-2)   = -1.004
    # token 2: -2*1*1   + 0                = -2.0
    # token 3: -2*2*(-0.5) + 0.002*2*(1-0.5) = 2.002
    # tokens 0 and 4 dropped: 0
    loss.backward()
    assert logp_new.grad.tolist() == pytest.approx([0.0, -1.004, -2.0, 2.002, 0.0], abs=1e-6)


def test_captain_gradient_equals_stop_gradient_ratio_form():
    """Eq. 8 with r carrying the gradient has the same gradient as -m sg(r) A log pi (the documented equivalence)."""
    logp_new, logp_rollout, adv, weight, _ = _five_tokens()
    loss, _ = captain_policy_loss(logp_new, logp_rollout, adv, token_weight=weight)
    (g1,) = torch.autograd.grad(loss, logp_new)
    r = torch.exp(logp_new - logp_rollout).detach()
    m = ((r > 0.2) & (r < 4.0)).float()
    (g2,) = torch.autograd.grad(-(m * r * adv * weight * logp_new).sum(), logp_new)
    assert torch.allclose(g1, g2, atol=1e-6)


def test_ratio_bounds_are_exclusive():
    r = torch.tensor([0.2, 0.2000001, 1.0, 3.9999999, 4.0, 0.0, math.inf], dtype=torch.float64)
    assert keep_mask(r).tolist() == [False, True, True, True, False, False, False]
    # a token exactly at the bound contributes nothing to the loss and gets no gradient
    logp_new = torch.tensor([math.log(4.0), 0.0], dtype=torch.float64, requires_grad=True)
    loss, m = captain_policy_loss(logp_new, torch.zeros(2, dtype=torch.float64), torch.tensor([1.0, 1.0]))
    # exp(ln 4) may land a hair either side of 4; the mask is computed from that computed ratio
    r4 = torch.exp(torch.tensor(math.log(4.0), dtype=torch.float64)).item()
    expected_kept = 1 + int(0.2 < r4 < 4.0)
    assert m["kept_frac"] == pytest.approx(expected_kept / 2)
    # r = 1 token: -1 * 1; the bound token: -r4 if kept (never when r4 == 4 exactly)
    assert loss.item() == pytest.approx(-1.0 - (r4 if expected_kept == 2 else 0.0), abs=1e-6)


def test_k3_value_and_zero_at_equality():
    new = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    # d = ref - new = [0, ln2, -ln2, 1]:  k3 = e^d - d - 1 = [0, 0.306853, 0.193147, e - 2 = 0.718282]
    ref = new + torch.tensor([0.0, LN2, -LN2, 1.0])
    assert k3_kl(new, ref).tolist() == pytest.approx([0.0, 2 - LN2 - 1, 0.5 + LN2 - 1, math.e - 2], abs=1e-6)
    assert k3_kl(new, new).abs().max().item() == 0.0
    assert (k3_kl(torch.zeros(50), torch.linspace(-5, 5, 50)) >= 0).all()
    # gradient of k3 at equality is zero (1 - e^0), so an on-policy first step gets no pull from the KL
    x = torch.tensor([-1.0], requires_grad=True)
    (g,) = torch.autograd.grad(k3_kl(x, x.detach()).sum(), x)
    assert g.item() == 0.0


def test_captain_kl_only_on_kept_tokens_and_no_kl_without_reference():
    logp_new, logp_rollout, adv, weight, logp_ref = _five_tokens()
    _, with_ref = captain_policy_loss(logp_new, logp_rollout, adv, logp_ref=logp_ref, token_weight=weight)
    loss, without = captain_policy_loss(logp_new, logp_rollout, adv, token_weight=weight)
    assert without["kl_loss"] == 0.0
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    # moving the reference on the two dropped tokens changes nothing
    moved = logp_ref.clone()
    moved[[0, 4]] += 3.0
    _, m2 = captain_policy_loss(logp_new, logp_rollout, adv, logp_ref=moved, token_weight=weight)
    assert m2["kl_loss"] == pytest.approx(with_ref["kl_loss"], abs=1e-9)


def test_token_mask_and_wild_log_ratios_give_finite_gradients():
    """Padding with arbitrary log-probs and dropped tokens with huge log-ratios: no NaN, no contribution."""
    logp_new = _t([0.0, -0.1, 200.0, -300.0], grad=True)
    logp_rollout = _t([0.0, 0.0, 0.0, 0.0])
    mask = torch.tensor([True, True, True, False])
    loss, m = captain_policy_loss(
        logp_new, logp_rollout, _t([1.0, 1.0, 1.0, 1.0]), logp_ref=_t([0.0] * 4), token_mask=mask
    )
    loss.backward()
    assert torch.isfinite(logp_new.grad).all()
    assert logp_new.grad[2:].tolist() == [0.0, 0.0]
    # kept: r = 1 and r = e^-0.1; pg = -(1 + 0.904837); k3 terms: d = [0, 0.1] -> e^0.1 - 0.1 - 1 = 0.005171
    assert loss.item() == pytest.approx(-(1 + math.exp(-0.1)) + 0.002 * (math.exp(0.1) - 1.1), abs=1e-6)
    assert m["kept_frac"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------ sampling, inclusion weights, staleness


def test_inclusion_weighting_is_unbiased_exactly_over_all_subsets():
    values = [0.3, -1.2, 2.5, 0.0, 4.1, -0.7]  # per-request contributions, n = 6
    n, k = len(values), 4
    subsets = list(itertools.combinations(range(n), k))  # C(6, 4) = 15, each equally likely under uniform sampling
    estimates = [(n / k) * sum(values[i] for i in s) for s in subsets]
    assert len(subsets) == 15
    assert sum(estimates) / len(estimates) == pytest.approx(sum(values), abs=1e-12)  # = 5.0


def test_inclusion_weighted_captain_loss_is_unbiased_over_all_subsets():
    """The loss on a sampled subset (weight n/k) averaged over all C(4,2) subsets equals the loss on all 4."""
    counts = [2, 3, 1, 2]
    gen = torch.Generator().manual_seed(3)
    logp_new = -torch.rand(sum(counts), generator=gen, dtype=torch.float64)
    logp_rollout = logp_new + 0.3 * torch.randn(sum(counts), generator=gen, dtype=torch.float64)
    logp_ref = logp_new + 0.2 * torch.randn(sum(counts), generator=gen, dtype=torch.float64)
    adv_req = [0.5, -1.0, 2.0, 0.25]
    starts = np.cumsum([0, *counts])
    full, _ = captain_policy_loss(logp_new, logp_rollout, expand_to_tokens(adv_req, counts), logp_ref=logp_ref)
    total = 0.0
    subsets = list(itertools.combinations(range(4), 2))
    for s in subsets:
        idx = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in s])
        sample = RequestSample(s, 4, 2.0)
        w = expand_to_tokens(captain_token_weights(sample), [counts[i] for i in s])
        adv = expand_to_tokens([adv_req[i] for i in s], [counts[i] for i in s])
        loss, _ = captain_policy_loss(logp_new[idx], logp_rollout[idx], adv, logp_ref=logp_ref[idx], token_weight=w)
        total += loss.item()
    assert total / len(subsets) == pytest.approx(full.item(), abs=1e-5)


def test_sample_requests_uniform_seeded_and_capped():
    rng = np.random.default_rng(0)
    s = sample_requests(20, 8, rng)
    assert len(s.indices) == 8 and len(set(s.indices)) == 8 and list(s.indices) == sorted(s.indices)
    assert s.inclusion_weight == pytest.approx(20 / 8)
    assert sample_requests(5, 8, rng) == RequestSample((0, 1, 2, 3, 4), 5, 1.0)  # short episode: all, weight 1
    assert sample_requests(0, 8, rng).indices == ()
    # seeded per episode: the same draw whatever order episodes are visited in
    a = sample_requests(30, 8, episode_rng(7, "ep-000012"))
    _ = sample_requests(30, 8, episode_rng(7, "ep-000013"))
    assert sample_requests(30, 8, episode_rng(7, "ep-000012")) == a
    # uniform: each of 10 requests is drawn with probability 8/10 (4000 seeded draws; sd of a frequency ~ 0.0063)
    rng = np.random.default_rng(1)
    hits = np.zeros(10)
    for _ in range(4000):
        hits[list(sample_requests(10, 8, rng).indices)] += 1
    assert np.abs(hits / 4000 - 0.8).max() < 0.03


def test_staleness_ok():
    assert staleness_ok(5, 5) and staleness_ok(4, 5) and staleness_ok(3, 5)
    assert not staleness_ok(2, 5)  # three versions old
    assert not staleness_ok(6, 5)  # newer than the trainer: bookkeeping error
    assert staleness_ok(2, 5, max_staleness=3)
    assert staleness_ok(0, 0, max_staleness=0) and not staleness_ok(0, 1, max_staleness=0)


@pytest.mark.parametrize("objective", ["captain", "agenticroborl"])
def test_accumulation_over_micro_batches_equals_one_batch(objective):
    cfg = ObjectiveConfig(objective=objective)
    gen = torch.Generator().manual_seed(0)
    n_tok = 23
    logp_new = (-2 * torch.rand(n_tok, generator=gen, dtype=torch.float64)).requires_grad_(True)
    logp_rollout = logp_new.detach() + 0.5 * torch.randn(n_tok, generator=gen, dtype=torch.float64)
    logp_ref = logp_new.detach() + 0.3 * torch.randn(n_tok, generator=gen, dtype=torch.float64)
    adv = torch.randn(n_tok, generator=gen, dtype=torch.float64)
    weight = torch.rand(n_tok, generator=gen, dtype=torch.float64) + 0.5
    norm = accumulation_normaliser(3)  # say these tokens are 3 episodes
    kw = {"logp_ref": logp_ref, "logp_prox": logp_rollout - 0.1}
    full, _ = policy_loss(cfg, logp_new, logp_rollout, adv, token_weight=weight, normaliser=norm, **kw)
    (g_full,) = torch.autograd.grad(full, logp_new)
    total, g_acc = 0.0, torch.zeros(n_tok, dtype=torch.float64)
    for lo, hi in [(0, 5), (5, 6), (6, 17), (17, 23)]:  # uneven micro-batches, cut anywhere
        part = slice(lo, hi)
        x = logp_new.detach()[part].clone().requires_grad_(True)
        sub = {k: v[part] for k, v in kw.items()}
        loss, _ = policy_loss(cfg, x, logp_rollout[part], adv[part], token_weight=weight[part], normaliser=norm, **sub)
        loss.backward()
        total += loss.item()
        g_acc[part] = x.grad
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(g_acc, g_full.to(g_acc.dtype), atol=1e-6)
    assert accumulation_normaliser(1024) == 1 / 1024
    with pytest.raises(ValueError):
        accumulation_normaliser(0)


# ------------------------------------------------------------------ AgenticRoboRL


def test_leave_one_out_group_of_three_with_one_invalid():
    # valid rewards 1 and 0; the invalid attempt's reward (0.7) must not enter any baseline
    # A_0 = 1 - mean{0} = 1 ; A_1 = 0 - mean{1} = -1 ; A_2 = None (invalid)
    assert leave_one_out_advantages([1.0, 0.0, 0.7], [True, True, False]) == [1.0, -1.0, None]
    # all three valid: A_0 = 1 - (0 + 0.5)/2 = 0.75 ; A_1 = 0 - (1 + 0.5)/2 = -0.75 ; A_2 = 0.5 - (1 + 0)/2 = 0
    assert leave_one_out_advantages([1.0, 0.0, 0.5], [True, True, True]) == pytest.approx([0.75, -0.75, 0.0])
    # only one valid attempt: the group is not used
    assert leave_one_out_advantages([1.0, 0.0, 0.0], [True, False, False]) == [None, None, None]
    # all equal: zero advantage, no direction learned
    assert leave_one_out_advantages([0.0] * 6, [True] * 6) == [0.0] * 6


def test_leave_one_out_by_group():
    keys = ["g1", "g2", "g1", "g1", "g2"]
    rewards = [1.0, 1.0, 0.0, 0.0, 0.0]
    valid = [True, True, True, True, False]
    # g1: [1, 0, 0] -> [1 - 0, 0 - 0.5, 0 - 0.5] ; g2 has one valid attempt -> unused
    assert leave_one_out_by_group(keys, rewards, valid) == [1.0, None, -0.5, -0.5, None]


def test_dual_clip_by_hand():
    """eps_low 0.2, eps_high 0.28, d 3: l_PPO = max(-rho A, -clip(rho, 0.8, 1.28) A); A < 0: min(l_PPO, -3A)."""
    rho = _t([0.5, 1.0, 2.0, 0.5, 1.0, 2.0, 5.0], grad=True)
    adv = _t([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    loss = dual_clip_loss(rho, adv)
    # A=+1: rho 0.5 -> max(-0.5, -0.8) = -0.5 ; rho 1 -> -1 ; rho 2 -> max(-2, -1.28) = -1.28 (clipped high)
    # A=-1: rho 0.5 -> max(0.5, 0.8) = 0.8 (clipped low); rho 1 -> 1; rho 2 -> max(2, 1.28) = 2, min(2, 3) = 2;
    #       rho 5 -> max(5, 1.28) = 5, min(5, 3) = 3 (dual clip)
    assert loss.tolist() == pytest.approx([-0.5, -1.0, -1.28, 0.8, 1.0, 2.0, 3.0], abs=1e-6)
    # d loss / d rho: -A on the active unclipped branch, 0 where a clip is active
    (g,) = torch.autograd.grad(loss.sum(), rho)
    assert g.tolist() == pytest.approx([-1.0, -1.0, 0.0, 0.0, 1.0, 1.0, 0.0], abs=1e-6)
    # the asymmetric upper edge: A = +1 at rho 1.27 still has gradient, at 1.29 not
    r2 = _t([1.27, 1.29], grad=True)
    (g2,) = torch.autograd.grad(dual_clip_loss(r2, _t([1.0, 1.0])).sum(), r2)
    assert g2.tolist() == [-1.0, 0.0]


def test_truncated_is_weight_by_hand():
    # q/b = 0.3/0.1 = 3 -> truncated to 2 ; 0.1/0.2 = 0.5 ; 0.25/0.25 = 1
    q = torch.log(_t([0.3, 0.1, 0.25]))
    b = torch.log(_t([0.1, 0.2, 0.25], grad=True))
    w = truncated_is_weight(q, b)
    assert w.tolist() == pytest.approx([2.0, 0.5, 1.0], abs=1e-6)
    assert not w.requires_grad  # sg[.]


def test_agenticroborl_loss_by_hand():
    # two tokens, A = -1 and +1, rho = pi/q = [2, 0.5]; b gives q/b = [3 -> 2, 0.5]
    logp_q = torch.log(_t([0.3, 0.1]))
    logp_new = torch.log(_t([0.6, 0.05])).requires_grad_(True)
    logp_b = torch.log(_t([0.1, 0.2]))
    adv = _t([-1.0, 1.0])
    loss, m = agenticroborl_policy_loss(logp_new, logp_q, adv, logp_prox=logp_b)
    # token 0: l_DC(2, -1) = min(max(2, 1.28), 3) = 2, w = 2 -> 4 ; token 1: l_DC(0.5, +1) = -0.5, w = 0.5 -> -0.25
    assert loss.item() == pytest.approx(4.0 - 0.25, abs=1e-6)
    # d/dlogp_new = w * dl/drho * rho: token 0: 2 * 1 * 2 = 4 ; token 1: 0.5 * (-1) * 0.5 = -0.25
    loss.backward()
    assert logp_new.grad.tolist() == pytest.approx([4.0, -0.25], abs=1e-6)
    assert m["is_weight_mean"] == pytest.approx(1.25)
    assert m["is_truncated_frac"] == pytest.approx(0.5)
    # default b = sg(logp_new) (single pass): w = min(q / pi, 2) = [0.5, 2]
    loss2, _ = agenticroborl_policy_loss(logp_new, logp_q, adv)
    assert loss2.item() == pytest.approx(0.5 * 2 + 2 * -0.5, abs=1e-6)


def test_episode_then_token_weighting_vs_token_mean():
    """Episode 1: responses of 1 and 3 tokens; episode 2: one response of 2 tokens. Per-token losses
    l = [3 | 1, 1, 1 | 1, 1] from A = -1 and rho = [3, 1, 1, 1, 1, 1] (l_DC(rho, -1) = rho for 0.8 <= rho <= 3).
    Paper: ep1 = 1/2 * 3/1 + 1/2 * 3/3 = 2, ep2 = 2/2 = 1 ; L = (2 + 1) / (1/2 + 1/2 + 1) = 1.5
    Plain token mean: 8 / 6 = 1.3333 ; pooled per-episode token mean: (6/4 + 2/2) / 2 = 1.25."""
    per_resp = agenticroborl_token_weights([[1, 3], [2]])
    # u_s / L_s: 1/(2*1) = 0.5, 1/(2*3) = 1/6, 1/(1*2) = 0.5
    assert per_resp[0] == pytest.approx([0.5, 1 / 6]) and per_resp[1] == pytest.approx([0.5])
    weight = expand_to_tokens([w for ep in per_resp for w in ep], [1, 3, 2])
    assert weight.sum().item() == pytest.approx(2.0)  # sum_s u_s = number of episodes
    logp_new = torch.log(_t([3.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    adv = torch.full((6,), -1.0)
    kw = {"logp_prox": torch.zeros(6), "normaliser": accumulation_normaliser(2)}  # b = q: w = 1
    loss, _ = agenticroborl_policy_loss(logp_new, torch.zeros(6), adv, token_weight=weight, **kw)
    assert loss.item() == pytest.approx(1.5, abs=1e-6)
    plain, _ = agenticroborl_policy_loss(logp_new, torch.zeros(6), adv, normaliser=1 / 6, logp_prox=torch.zeros(6))
    assert plain.item() == pytest.approx(8 / 6, abs=1e-6)
    with pytest.raises(ValueError):
        agenticroborl_token_weights([[0]])


def test_objective_config_selects_and_validates():
    assert ObjectiveConfig().objective == "captain" and ObjectiveConfig().max_per_episode_n == 8
    alt = ObjectiveConfig(objective="agenticroborl")
    assert alt.max_per_episode_n == 16
    c = ObjectiveConfig()
    assert (c.ratio_low, c.ratio_high, c.kl_beta, c.episodes_per_step_n, c.max_staleness_versions) == (
        0.2,
        4.0,
        0.002,
        1024,
        2,
    )
    assert (alt.clip_eps_low, alt.clip_eps_high, alt.dual_clip_d, alt.is_truncation_c) == (0.2, 0.28, 3.0, 2.0)
    with pytest.raises(ValueError):
        ObjectiveConfig(objective="grpo")
    with pytest.raises(ValueError):
        ObjectiveConfig(ratio_low=1.5)
    # same inputs, the two objectives give their own values: on-policy (r = 1), A = [1, -1]
    x = torch.zeros(2)
    a, _ = policy_loss(ObjectiveConfig(), x, x, _t([1.0, -1.0]))  # -(1) - (-1) = 0
    b, _ = policy_loss(alt, torch.log(_t([1.0, 1.0])), x, _t([2.0, -1.0]))  # -2 + 1 = -1
    assert a.item() == pytest.approx(0.0) and b.item() == pytest.approx(-1.0)


# ------------------------------------------------------------------ one optimizer step on a tiny LM-like model


class _Bigram(torch.nn.Module):
    """logits(next | prev) = table[prev]: the smallest language model with per-context parameters."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def token_logps(self, prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.table(prev), dim=-1).gather(-1, nxt[:, None])[:, 0]


@pytest.mark.parametrize("objective", ["captain", "agenticroborl"])
def test_one_step_raises_positive_and_lowers_negative_tokens(objective):
    torch.manual_seed(0)
    model = _Bigram(6)
    prev = torch.tensor([0, 0, 1, 2, 3, 4])
    nxt = torch.tensor([1, 2, 3, 4, 5, 0])
    adv = _t([1.0, -1.0, 1.0, -0.5, 2.0, 0.0])  # context 0 holds a positive and a negative target
    cfg = ObjectiveConfig(objective=objective)
    with torch.no_grad():
        before = model.token_logps(prev, nxt)
    ref = before.clone()
    # rollout log-probs: on-policy except token 4, whose ratio exp(2) ~ 7.4 is outside (0.2, 4) for CaPtain
    logp_rollout = before.clone()
    logp_rollout[4] -= 2.0
    if objective == "agenticroborl":
        logp_rollout[4] += 2.0  # AgenticRoboRL masks nothing; keep that token on-policy too
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss, _ = policy_loss(cfg, model.token_logps(prev, nxt), logp_rollout, adv, logp_ref=ref, normaliser=1 / 2)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        delta = model.token_logps(prev, nxt) - before
    assert delta[0] > 0 and delta[2] > 0  # A > 0: up
    assert delta[1] < 0 and delta[3] < 0  # A < 0: down
    if objective == "captain":
        assert delta[4].item() == 0.0  # dropped by the ratio mask: its context got no gradient
    else:
        assert delta[4] > 0
    assert delta[5].item() == 0.0  # A = 0 and alone in its context


def test_one_captain_step_on_the_tiny_qwen2():
    """The same check on a real (tiny, random-init) transformers Qwen2 from captain_ros_training/tiny.py: two sampled
    requests, one with A = +1, one with A = -1, on-policy rollout log-probs, k3 to a frozen copy. One SGD step raises
    every positive-advantage token's log-prob and lowers every negative one."""
    from captain_ros_training.tiny import TinyModelConfig, tiny_model

    model = tiny_model(TinyModelConfig(num_hidden_layers=1))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size, (2, 12), generator=gen)
    n_resp = 5  # the last 5 tokens of each row are the response

    def response_logps() -> torch.Tensor:
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        return logp[:, -n_resp:]

    with torch.no_grad():
        before = response_logps()
    adv = torch.tensor([[1.0] * n_resp, [-1.0] * n_resp])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss, m = captain_policy_loss(response_logps(), before, adv, logp_ref=before, normaliser=accumulation_normaliser(2))
    assert m["kept_frac"] == 1.0 and m["kl_k3"] == pytest.approx(0.0, abs=1e-6)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        delta = response_logps() - before
    assert (delta[0] > 0).all(), delta
    assert (delta[1] < 0).all(), delta

"""RL policy objectives: CaPtain's masked-ratio loss (Eq. 8, App. A.2 "Policy update") and, as a selectable
alternative, AgenticRoboRL's leave-one-out / truncated-IS / dual-clip loss.

Both losses take flat (or any-shape, same-shape) per-token tensors of the trained response tokens and reduce them
as a weighted *sum* times one scalar `normaliser`. The per-token weights carry every structural factor (CaPtain's
inclusion weight n/k, AgenticRoboRL's 1/(K_i L_s), a prompt-gate weight of 0), and the normaliser is
`accumulation_normaliser(n_episodes_in_step)`, the same for every micro-batch of an optimizer step. Because of that
the sum of the micro-batch losses (and gradients) equals the loss of the whole step computed in one batch, whatever
way the step is cut into micro-batches. A normaliser that depends on the current policy (e.g. the number of kept
tokens) would break that equality, which is why neither loss divides by a token count of its own.

Log-probabilities are computed in at least float32 inside the losses (bf16/fp16 inputs are upcast), and
log-ratios are clamped to +-`_LOG_RATIO_CLAMP` before `exp` so a dropped or padded token with a wild log-ratio
cannot produce inf * 0 = NaN in the backward pass; the clamp lies far outside every bound used here, so it never
touches a kept token.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

_LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8: far outside 0.2 < r < 4 and the 0.8 / 1.28 / 3 clips


@dataclass(frozen=True)
class ObjectiveConfig:
    """Constants of both RL objectives; `objective` picks which loss `policy_loss` applies."""

    objective: Literal["captain", "agenticroborl"] = field(
        default="captain", metadata={"help": "'captain' (CaPtain Eq. 8) or 'agenticroborl' (its L_RL)"}
    )
    # --- CaPtain Eq. 8 / App. A.2 ---
    ratio_low: float = field(default=0.2, metadata={"help": "CaPtain Eq. 8: token kept only if ratio > this"})
    ratio_high: float = field(default=4.0, metadata={"help": "CaPtain Eq. 8: token kept only if ratio < this"})
    kl_beta: float = field(default=0.002, metadata={"help": "CaPtain Eq. 8: weight of the k3 KL to the SFT model"})
    max_requests_per_episode_n: int = field(
        default=8, metadata={"help": "CaPtain App. A.2: requests per episode sampled for the policy gradient"}
    )
    episodes_per_step_n: int = field(
        default=1024, metadata={"help": "CaPtain App. A.2 / H: episodes accumulated per optimizer step"}
    )
    max_staleness_versions: int = field(
        default=2, metadata={"help": "CaPtain App. A.2: a rollout may be at most this many policy versions old"}
    )
    sampler_seed: int = field(default=0, metadata={"help": "seed of the per-episode request/response sampler"})
    # --- AgenticRoboRL ---
    clip_eps_low: float = field(default=0.2, metadata={"help": "AgenticRoboRL: PPO clip 1 - eps_low"})
    clip_eps_high: float = field(default=0.28, metadata={"help": "AgenticRoboRL: PPO clip 1 + eps_high"})
    dual_clip_d: float = field(default=3.0, metadata={"help": "AgenticRoboRL l_DC: loss <= -d A when A < 0"})
    is_truncation_c: float = field(default=2.0, metadata={"help": "AgenticRoboRL: w = sg[min(q/b, C)]"})
    max_responses_per_episode_n: int = field(
        default=16, metadata={"help": "AgenticRoboRL: responses selected per episode"}
    )
    min_valid_attempts_n: int = field(
        default=2, metadata={"help": "AgenticRoboRL: a group is used only with at least this many valid attempts"}
    )

    def __post_init__(self) -> None:
        if self.objective not in ("captain", "agenticroborl"):
            raise ValueError(f"objective must be 'captain' or 'agenticroborl', got {self.objective!r}")
        if not 0.0 < self.ratio_low < 1.0 < self.ratio_high:
            raise ValueError(f"need 0 < ratio_low < 1 < ratio_high, got {self.ratio_low}, {self.ratio_high}")
        if self.max_requests_per_episode_n < 1 or self.max_responses_per_episode_n < 1:
            raise ValueError("per-episode sample sizes must be >= 1")
        if self.dual_clip_d <= 1.0:
            raise ValueError(f"dual clip needs d > 1, got {self.dual_clip_d}")

    @property
    def max_per_episode_n(self) -> int:
        """How many requests (CaPtain) or responses (AgenticRoboRL) one episode contributes at most."""
        return self.max_requests_per_episode_n if self.objective == "captain" else self.max_responses_per_episode_n


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces: sampling requests, staleness, accumulation
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestSample:
    """Which requests of one episode are trained, and the weight each carries."""

    indices: tuple[int, ...]  # sorted, distinct, in [0, n_requests)
    n_requests: int
    inclusion_weight: float  # n_requests / len(indices): 1 / inclusion probability; 1.0 when all are kept


def episode_rng(seed: int, episode_id: Hashable) -> np.random.Generator:
    """A generator fixed by (seed, episode id), so a resumed or re-sharded run draws the same requests per episode.

    crc32 of the id's repr, not hash(): Python salts str hashes per process."""
    return np.random.default_rng([seed, zlib.crc32(repr(episode_id).encode())])


def sample_requests(n_requests: int, max_n: int, rng: np.random.Generator) -> RequestSample:
    """CaPtain App. A.2 / §3.3 (text under Eq. 8): at most `max_n` requests, uniformly without replacement.

    Every request is included with probability k/n (k = min(n, max_n)), so weighting each sampled request's
    contribution by n/k makes the sampled sum an unbiased estimate of the sum over all n requests (Horvitz-Thompson).
    AgenticRoboRL's "at most 16 responses" uses the same draw but its own weights (`agenticroborl_token_weights`)."""
    if n_requests < 0 or max_n < 1:
        raise ValueError(f"need n_requests >= 0 and max_n >= 1, got {n_requests}, {max_n}")
    if n_requests == 0:
        return RequestSample((), 0, 0.0)
    k = min(n_requests, max_n)
    if k == n_requests:
        return RequestSample(tuple(range(n_requests)), n_requests, 1.0)
    chosen = rng.choice(n_requests, size=k, replace=False)
    return RequestSample(tuple(sorted(int(i) for i in chosen)), n_requests, n_requests / k)


def staleness_ok(version: int, current: int, max_staleness: int = 2) -> bool:
    """CaPtain App. A.2: a rollout sampled by policy `version` may train policy `current` if at most
    `max_staleness` versions old. A version newer than the trainer's is a bookkeeping error and fails too."""
    return 0 <= current - version <= max_staleness


def accumulation_normaliser(n_episodes_in_step: int) -> float:
    """The scalar every micro-batch loss of one optimizer step is multiplied by: 1 / episodes in the step.

    CaPtain App. A.2 accumulates gradients over 1,024 episodes per step; AgenticRoboRL's L_RL divides by
    sum_s u_s, which is the number of episodes because each episode's u_s sum to 1. With the same constant for
    every micro-batch, sum over micro-batches == one batch (tested), and the loss reads per episode."""
    if n_episodes_in_step < 1:
        raise ValueError(f"an optimizer step needs at least one episode, got {n_episodes_in_step}")
    return 1.0 / n_episodes_in_step


def expand_to_tokens(
    values: Sequence[float], token_counts: Sequence[int], device: torch.device | str = "cpu"
) -> Tensor:
    """Per-request (or per-response) values repeated over that request's tokens, in order (CaPtain §3.3:
    "all tokens of request t share A_{i,t}"). Use it for advantages and weights alike."""
    if len(values) != len(token_counts):
        raise ValueError(f"{len(values)} values for {len(token_counts)} token counts")
    v = torch.as_tensor(values, dtype=torch.float32, device=device)
    counts = torch.as_tensor(token_counts, dtype=torch.long, device=device)
    return torch.repeat_interleave(v, counts)


def _up(x: Tensor) -> Tensor:
    """bf16/fp16 -> float32 for the loss arithmetic; float32/float64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def _prepare(logp_new: Tensor, token_weight: Tensor | None, token_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    mask = torch.ones_like(logp_new, dtype=torch.bool) if token_mask is None else token_mask.to(torch.bool)
    weight = torch.ones_like(logp_new, dtype=torch.float32) if token_weight is None else _up(token_weight)
    if mask.shape != logp_new.shape or weight.shape != logp_new.shape:
        raise ValueError(
            f"shapes differ: logp {tuple(logp_new.shape)}, mask {tuple(mask.shape)}, weight {tuple(weight.shape)}"
        )
    return mask, weight


def _metrics(values: dict[str, Tensor]) -> dict[str, float]:
    """One device sync for all metrics instead of one per `.item()`."""
    names = list(values)
    numbers = torch.stack([values[n].detach().float().reshape(()) for n in names]).cpu().tolist()
    return dict(zip(names, numbers, strict=True))


def _advantage_stats(advantages: Tensor, mask: Tensor) -> dict[str, Tensor]:
    mean = _masked_mean(advantages, mask)
    var = _masked_mean((advantages - mean) ** 2, mask)  # population variance over the trained tokens
    return {"adv_mean": mean, "adv_std": var.sqrt()}


# ---------------------------------------------------------------------------------------------------------------
# CaPtain Eq. 8
# ---------------------------------------------------------------------------------------------------------------


def token_log_ratio(logp_new: Tensor, logp_old: Tensor) -> Tensor:
    """log r_{t,j} = log pi_theta - log pi_old (CaPtain Eq. 8), at least float32, clamped to +-20 (module doc)."""
    return (_up(logp_new) - _up(logp_old)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def keep_mask(ratio: Tensor, low: float = 0.2, high: float = 4.0) -> Tensor:
    """CaPtain Eq. 8: m_{t,j} = 1[low < r_{t,j} < high], both bounds exclusive. Double-sided: a token whose ratio
    drifted too far either way is dropped (no gradient at all), not clipped. Boolean, so never differentiated."""
    return (ratio > low) & (ratio < high)


def k3_kl(logp_new: Tensor, logp_ref: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_SFT) (CaPtain Eq. 8; Schulman's "k3"):
    k3 = exp(d) - d - 1 with d = log pi_SFT - log pi_theta. Non-negative, zero iff the two agree, and unbiased for
    the KL when the token was drawn from pi_theta. Its gradient w.r.t. log pi_theta is 1 - exp(d)."""
    d = (_up(logp_ref) - _up(logp_new)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0


def captain_policy_loss(
    logp_new: Tensor,
    logp_rollout: Tensor,
    advantages: Tensor,
    *,
    logp_ref: Tensor | None = None,
    token_weight: Tensor | None = None,
    token_mask: Tensor | None = None,
    normaliser: float = 1.0,
    config: ObjectiveConfig = ObjectiveConfig(),
) -> tuple[Tensor, dict[str, float]]:
    """CaPtain Eq. 8: L = normaliser * sum_tokens weight * m * (-r A + beta k3), m = 1[0.2 < r < 4].

    Arguments are same-shape per-token tensors of the trained response tokens: `logp_new` the trained policy's
    log-prob of each sampled token (with grad), `logp_rollout` the recorded sampling log-prob (pi_old), `advantages`
    A_{i,t} repeated over request t's tokens, `logp_ref` the SFT model's log-probs (None: no KL term),
    `token_weight` inclusion weight n/k (times a prompt-gate weight; None: 1), `token_mask` the real response
    tokens (None: all).

    Gradient flow: the ratio r = exp(logp_new - logp_rollout) carries the gradient, exactly as Eq. 8 is written
    (-m r A, not -m sg(r) A log pi). Since grad r = r grad log pi, the per-token gradient is -m r A grad log pi:
    the importance-weighted policy gradient, "weighted by that ratio" as App. A.2 says, inside the trust band
    0.2 < r < 4 and zero outside it. This is the same gradient as -m sg(r) A log pi (tested); only the loss value
    differs. The mask is an indicator and gets no gradient. The k3 term is taken on kept tokens only (App. A.2)
    and weighted like the policy term, so the inclusion weights make it an unbiased estimate of the full
    episodes' KL sum too.

    Metrics (unweighted, over the masked-in tokens): kept_frac, ratio_mean, clipped_low_frac (r <= 0.2),
    clipped_high_frac (r >= 4), kl_k3 (mean k3 over kept tokens), adv_mean, adv_std (population), and the two loss
    parts pg_loss and kl_loss (already multiplied by beta and the normaliser)."""
    mask, weight = _prepare(logp_new, token_weight, token_mask)
    log_r = token_log_ratio(logp_new, logp_rollout)
    ratio = torch.exp(log_r)
    kept = keep_mask(ratio.detach(), config.ratio_low, config.ratio_high) & mask
    zero = torch.zeros_like(ratio)
    adv = _up(advantages)

    pg = torch.where(kept, -ratio * adv * weight, zero).sum() * normaliser
    if logp_ref is not None:
        k3 = k3_kl(logp_new, logp_ref)
        kl = config.kl_beta * torch.where(kept, k3 * weight, zero).sum() * normaliser
        kl_mean = _masked_mean(k3.detach(), kept)
    else:
        kl = pg.new_zeros(())
        kl_mean = pg.new_zeros(())
    loss = pg + kl

    r = ratio.detach()
    metrics = _metrics(
        {
            "kept_frac": kept.sum() / mask.sum().clamp(min=1),
            "ratio_mean": _masked_mean(r, mask),
            "clipped_low_frac": _masked_mean((r <= config.ratio_low).float(), mask),
            "clipped_high_frac": _masked_mean((r >= config.ratio_high).float(), mask),
            "kl_k3": kl_mean,
            **_advantage_stats(adv, mask),
            "pg_loss": pg,
            "kl_loss": kl,
        }
    )
    return loss, metrics


def captain_token_weights(sample: RequestSample, gate_weights: Sequence[float] | None = None) -> list[float]:
    """Per-request weights for `expand_to_tokens` under CaPtain Eq. 8: the episode's inclusion weight n/k times the
    prompt-gate weight (0 for a request whose re-rendered prompt did not match). `gate_weights` are for the sampled
    requests in `sample.indices` order; returns one weight per sampled request, in that order."""
    gates = [1.0] * len(sample.indices) if gate_weights is None else list(gate_weights)
    if len(gates) != len(sample.indices):
        raise ValueError(f"{len(gates)} gate weights for {len(sample.indices)} sampled requests")
    return [sample.inclusion_weight * g for g in gates]


# ---------------------------------------------------------------------------------------------------------------
# AgenticRoboRL
# ---------------------------------------------------------------------------------------------------------------


def leave_one_out_advantages(
    rewards: Sequence[float], valid: Sequence[bool], min_valid_n: int = 2
) -> list[float | None]:
    """AgenticRoboRL A_i = R_i - mean_{k in V_g, k != i} R_k over one group's valid attempts V_g.

    A group with fewer than `min_valid_n` (2) valid attempts is not used: every entry is None. An invalid attempt
    (infrastructure failure) gets None and never enters another attempt's baseline; an honest zero reward is valid
    and stays in. No standard-deviation normalisation (the paper uses none)."""
    if len(rewards) != len(valid):
        raise ValueError(f"{len(rewards)} rewards for {len(valid)} validity flags")
    ok = [i for i, v in enumerate(valid) if v]
    if len(ok) < max(min_valid_n, 2):
        return [None] * len(rewards)
    total = sum(float(rewards[i]) for i in ok)
    others = len(ok) - 1
    return [float(r) - (total - float(r)) / others if v else None for r, v in zip(rewards, valid, strict=True)]


def leave_one_out_by_group(
    group_keys: Sequence[Hashable], rewards: Sequence[float], valid: Sequence[bool], min_valid_n: int = 2
) -> list[float | None]:
    """`leave_one_out_advantages` applied per group; a group is (task, initial state), e.g. start['group_id'].
    Returns one advantage (or None: not trained) per episode, in input order."""
    if not len(group_keys) == len(rewards) == len(valid):
        raise ValueError("group_keys, rewards and valid must have one entry per episode")
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(group_keys):
        members.setdefault(key, []).append(i)
    out: list[float | None] = [None] * len(rewards)
    for idx in members.values():
        adv = leave_one_out_advantages([rewards[i] for i in idx], [valid[i] for i in idx], min_valid_n)
        for i, a in zip(idx, adv, strict=True):
            out[i] = a
    return out


def truncated_is_weight(logp_sampling: Tensor, logp_prox: Tensor, cap: float = 2.0) -> Tensor:
    """AgenticRoboRL w_sj = sg[min(q_sj / b_sj, C)], C = 2.

    Following the paper's definition literally: q = the *sampling* probability recorded by the rollout server
    (the behaviour policy, `logp_rollout`), b = the *pre-update* probability of the same token recomputed by the
    trainer (the proximal policy). Their gap is the numerical mismatch between the two backends. Combined with
    rho = pi_theta / q this gives an effective untruncated weight pi_theta / b, i.e. the trainer-side ratio,
    while the PPO clip still looks at the ratio to what was actually sampled. Note this is q/b, the inverse of the
    "TIS" weight pi_trainer / pi_sampler of Yao et al.; we follow the paper. No gradient."""
    log_w = (_up(logp_sampling) - _up(logp_prox)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(log_w).clamp(max=cap).detach()


def dual_clip_loss(
    ratio: Tensor, advantages: Tensor, eps_low: float = 0.2, eps_high: float = 0.28, d: float = 3.0
) -> Tensor:
    """AgenticRoboRL l_DC per token: l_PPO = max(-rho A, -clip(rho, 1 - eps_low, 1 + eps_high) A); for A < 0 the
    loss is further capped at -d A (dual clip: a negative token whose ratio has grown past d stops pushing).

    Asymmetric clip: a positive-advantage token may rise to 1.28x before its gradient stops, a negative one may
    fall to 0.8x. Gradient flows through rho where the unclipped branch is active."""
    adv = _up(advantages)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    ppo = torch.maximum(-ratio * adv, -clipped * adv)
    return torch.where(adv < 0, torch.minimum(ppo, -d * adv), ppo)


def agenticroborl_policy_loss(
    logp_new: Tensor,
    logp_rollout: Tensor,
    advantages: Tensor,
    *,
    logp_prox: Tensor | None = None,
    token_weight: Tensor | None = None,
    token_mask: Tensor | None = None,
    normaliser: float = 1.0,
    config: ObjectiveConfig = ObjectiveConfig(),
) -> tuple[Tensor, dict[str, float]]:
    """AgenticRoboRL L_RL = sum_s (u_s / L_s) sum_j w_sj l_DC(rho_sj, A_i(s)) / sum_s u_s.

    rho = pi_theta / q with q the recorded sampling probability (`logp_rollout`); w = sg[min(q / b, 2)] with b the
    pre-update probability `logp_prox`. captain_ros_training.rl_trainer computes b once per update, without gradient,
    before the update's gradient is applied, and keeps it with the sampled tokens (RLTrainer.set_proximal_logprobs).
    With None, b = sg(logp_new), which is the pre-update policy only while no optimizer step has been taken on this
    batch.

    `token_weight` must hold u_s / L_s = 1 / (K_i L_s) (see `agenticroborl_token_weights`, times a gate weight)
    and `normaliser` 1 / episodes in the step (`accumulation_normaliser`): that is the paper's two-level
    weighting, episodes first, tokens second. Nothing is masked by ratio here.

    Metrics (unweighted over masked-in tokens): ratio_mean, clipped_low_frac (rho < 1 - eps_low, A < 0: clip
    active), clipped_high_frac (rho > 1 + eps_high, A > 0: clip active), dual_clip_frac (A < 0 and the -dA cap
    active), is_weight_mean, is_truncated_frac, kept_frac (always 1: for a common log), adv_mean, adv_std, pg_loss."""
    mask, weight = _prepare(logp_new, token_weight, token_mask)
    rho = torch.exp(token_log_ratio(logp_new, logp_rollout))
    prox = logp_new.detach() if logp_prox is None else logp_prox
    w = truncated_is_weight(logp_rollout, prox, config.is_truncation_c)
    adv = _up(advantages)
    per_token = dual_clip_loss(rho, adv, config.clip_eps_low, config.clip_eps_high, config.dual_clip_d)
    loss = torch.where(mask, weight * w * per_token, torch.zeros_like(per_token)).sum() * normaliser

    r = rho.detach()
    lo, hi = 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high
    ppo = torch.maximum(-r * adv, -r.clamp(lo, hi) * adv)
    metrics = _metrics(
        {
            "kept_frac": mask.sum() / mask.sum().clamp(min=1),
            "ratio_mean": _masked_mean(r, mask),
            "clipped_low_frac": _masked_mean(((r < lo) & (adv < 0)).float(), mask),
            "clipped_high_frac": _masked_mean(((r > hi) & (adv > 0)).float(), mask),
            "dual_clip_frac": _masked_mean(((adv < 0) & (ppo > -config.dual_clip_d * adv)).float(), mask),
            "is_weight_mean": _masked_mean(w, mask),
            "is_truncated_frac": _masked_mean((w >= config.is_truncation_c).float(), mask),
            **_advantage_stats(adv, mask),
            "pg_loss": loss,
        }
    )
    return loss, metrics


def agenticroborl_token_weights(response_token_counts: Sequence[Sequence[int]]) -> list[list[float]]:
    """AgenticRoboRL per-token weight u_s / L_s = 1 / (K_i L_s) for every selected response s of every episode i.

    `response_token_counts[i]` lists the lengths L_s of episode i's K_i selected responses (after the
    <= 16 selection). Each episode's weights over its tokens sum to 1, so with `accumulation_normaliser` the loss is
    the mean over episodes of the mean over responses of the mean over tokens: a long episode or a long response
    does not count more than a short one. Returns, per episode, one weight per response (for `expand_to_tokens`)."""
    out = []
    for counts in response_token_counts:
        if any(c < 1 for c in counts):
            raise ValueError(f"every selected response needs >= 1 token, got {list(counts)}")
        k = len(counts)
        out.append([1.0 / (k * c) for c in counts])
    return out


# ---------------------------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------------------------


def policy_loss(
    config: ObjectiveConfig,
    logp_new: Tensor,
    logp_rollout: Tensor,
    advantages: Tensor,
    *,
    logp_ref: Tensor | None = None,
    logp_prox: Tensor | None = None,
    token_weight: Tensor | None = None,
    token_mask: Tensor | None = None,
    normaliser: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """The objective `config.objective` names: CaPtain Eq. 8 (uses logp_ref) or AgenticRoboRL L_RL (uses
    logp_prox). The token weights must be built for the same objective (`captain_token_weights` or
    `agenticroborl_token_weights`)."""
    common = {"token_weight": token_weight, "token_mask": token_mask, "normaliser": normaliser, "config": config}
    if config.objective == "captain":
        return captain_policy_loss(logp_new, logp_rollout, advantages, logp_ref=logp_ref, **common)
    return agenticroborl_policy_loss(logp_new, logp_rollout, advantages, logp_prox=logp_prox, **common)


__all__ = [
    "ObjectiveConfig",
    "RequestSample",
    "accumulation_normaliser",
    "agenticroborl_policy_loss",
    "agenticroborl_token_weights",
    "captain_policy_loss",
    "captain_token_weights",
    "dual_clip_loss",
    "episode_rng",
    "expand_to_tokens",
    "k3_kl",
    "keep_mask",
    "leave_one_out_advantages",
    "leave_one_out_by_group",
    "policy_loss",
    "sample_requests",
    "staleness_ok",
    "token_log_ratio",
    "truncated_is_weight",
]

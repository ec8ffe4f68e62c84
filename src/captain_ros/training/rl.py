"""One RL update from a round (CaPtain §3.3 Eq. 8-10, App. A.2 "RL"; AgenticRoboRL L_RL as the alternative), the
metrics log, and the trainer's command line (`python -m training.rl {sft-data,sft,rl,plot} --help`).

`RLTrainer.update(round)` does, for the round's kept groups (training.rounds):

  1. critic values with a snapshot of the critic taken BEFORE this round's co-training (App. A.2: "each round's
     advantages use the critic before that round's update"), and the snapshot's AUC on this round's states, which
     it has never been trained on;
  2. advantages: CaPtain Eq. 9-10 through training.credit (per request, divided by the running std), or
     AgenticRoboRL's leave-one-out A_i over the group's valid attempts (per episode) of its binary reward
     R_i = 1[host success] (not CaPtain's shaped return of Eq. 7);
  3. per episode, at most 8 requests (CaPtain) or 16 responses (AgenticRoboRL) drawn uniformly from the requests
     eligible for a policy gradient (prompt gate passed, fits the context; AgenticRoboRL also drops requests made
     after the scene was solved, CaPtain keeps them: training.rounds), with CaPtain's inclusion weight n/k or
     AgenticRoboRL's 1/(K L_s); every token of request t shares A_{i,t} (§3.3);
  4. the student's log-probability of each sampled token, teacher-forced (prompt ids + sampled ids -> logits ->
     log-softmax at the sampled id), on packed rows without cross-document attention (training.data packing,
     training.sft's forward), and the frozen SFT model's for the k3 KL (CaPtain); for AgenticRoboRL, first, once
     per update and without gradient, the pre-update (proximal) log-probability b of every sampled token, which its
     truncated IS weight w = sg[min(q / b, 2)] compares with the recorded sampling probability q;
  5. the loss of training.policy_loss and its backward pass, micro-batch by micro-batch, all scaled by one
     normaliser 1 / `episodes_per_step_n` (CaPtain accumulates 1,024 episodes per optimizer step: K = 4 rounds
     of 256). When the step is taken with a different number of trained episodes, the accumulated gradient is
     rescaled by episodes_per_step_n / episodes, which is exactly the loss with 1 / episodes as normaliser
     (gradients are linear in it), so a step never depends on how it was cut into micro-batches or rounds;
  6. an AdamW step (gradient clipping, constant learning rate after warm-up, App. A.2) once enough episodes are
     accumulated (or when asked), which increments the policy version;
  7. two full-batch co-training steps of the critic on all the round's request states (App. A.2).

Every update appends one row to a JSONL metrics log (loss, KL, kept-token fraction, advantage statistics, critic
AUC, episodes, requests, tokens, ...); `plot_metrics` draws it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.data import Example, collate, pack_examples
from training.policy_loss import (
    ObjectiveConfig,
    agenticroborl_token_weights,
    captain_token_weights,
    episode_rng,
    leave_one_out_by_group,
    policy_loss,
    sample_requests,
)
from training.rounds import Round, RoundConfig, build_round
from training.sft import SFTConfig, target_logits

RL_CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class RLConfig:
    """Optimizer and batching of the policy update (CaPtain App. A.2; the objective's constants live in
    policy_loss.ObjectiveConfig, the credit's in credit.CreditConfig)."""

    learning_rate: float = field(default=4.24e-6, metadata={"help": "CaPtain App. A.2: constant after warm-up"})
    warmup_steps: int = field(default=0, metadata={"help": "linear warm-up, in optimizer steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    adam_betas: tuple[float, float] = field(default=(0.9, 0.95), metadata={"help": "AdamW betas"})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping; None: none"})
    micro_batch_tokens: int = field(default=16384, metadata={"help": "tokens per packed row (one row per micro-batch)"})
    attention: str = field(
        default="position_ids",
        metadata={"help": "packing: 'position_ids' (restarting positions) | 'mask' (4D block-causal, O(L^2) memory)"},
    )
    bf16: bool = field(default=True, metadata={"help": "bf16 autocast on CUDA (CPU runs fp32)"})
    co_train_critic: bool = field(default=True, metadata={"help": "CaPtain App. A.2: co-train after each round"})


# ---------------------------------------------------------------------------------------------------- selection
@dataclass
class TrainItem:
    """One sampled request (CaPtain) or response (AgenticRoboRL) and what its tokens share."""

    episode_id: str
    request: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # pi_rollout, recorded by the proxy
    advantage: float  # A_{i,t} (CaPtain Eq. 10) or A_i (AgenticRoboRL), shared by every token
    weight: float  # per-token weight: n/k x gate (CaPtain) or 1/(K L_s) x gate (AgenticRoboRL)
    # AgenticRoboRL's b: the trainer's pre-update log-probs of the tokens (RLTrainer.set_proximal_logprobs)
    prox_logprobs: list[float] | None = None


def captain_advantages(round_: Round, critic: Any, running_std: Any, credit_config: Any) -> tuple[dict, dict]:
    """CaPtain Eq. 9-10 per request of every round episode, with `critic` (the snapshot from before this round's
    co-training) and the running std; returns ({episode id: [A_t for t = 1..T]}, credit statistics)."""
    from training.credit import batch_from_episodes, credit_round

    batch = batch_from_episodes([e.episode for e in round_.episodes], critic.tasks)
    credit = credit_round(critic, batch, running_std, credit_config)
    return credit.per_episode(), credit.stats()


def agenticroborl_advantages(round_: Round, objective: ObjectiveConfig) -> tuple[dict, dict]:
    """AgenticRoboRL A_i = R_i - mean of the other valid attempts' R, one value for all of an episode's
    responses (policy_loss.leave_one_out_by_group); episodes of groups too small get no entry.

    R_i is the paper's binary reward 1[task success] (the host's success predicate, the critic's label too), not
    the stored end["reward"]: that is CaPtain's shaped return (Eq. 7: 0.25 for a success without finish(), -0.1
    budget exhausted, -0.3 false finish, sub-goal rewards), which the AgenticRoboRL objective does not use."""
    episodes = round_.episodes
    adv = leave_one_out_by_group(
        [e.group_id for e in episodes],
        [1.0 if e.success else 0.0 for e in episodes],
        [True] * len(episodes),
        objective.min_valid_attempts_n,
    )
    out = {e.episode_id: np.full(len(e.requests), a) for e, a in zip(episodes, adv, strict=True) if a is not None}
    values = np.concatenate(list(out.values())) if out else np.zeros(0)
    stats = {
        "adv_mean": float(values.mean()) if values.size else 0.0,
        "adv_std": float(values.std()) if values.size else 0.0,
    }
    return out, stats


def select_items(round_: Round, advantages: dict[str, np.ndarray], objective: ObjectiveConfig) -> list[TrainItem]:
    """Per episode, at most `objective.max_per_episode_n` eligible requests, uniformly without replacement from a
    generator fixed by (sampler seed, episode id) (CaPtain App. A.2), with the objective's per-token weights."""
    items = []
    for episode in round_.episodes:
        if episode.episode_id not in advantages:
            continue
        eligible = episode.eligible
        sample = sample_requests(
            len(eligible), objective.max_per_episode_n, episode_rng(objective.sampler_seed, episode.episode_id)
        )
        chosen = [episode.requests[eligible[i]] for i in sample.indices]
        if not chosen:
            continue
        gates = [r.gate_weight for r in chosen]
        if objective.objective == "captain":
            weights = captain_token_weights(sample, gates)
        else:
            base = agenticroborl_token_weights([[len(r.token_ids) for r in chosen]])[0]
            weights = [w * g for w, g in zip(base, gates, strict=True)]
        per_request = advantages[episode.episode_id]
        for request, weight in zip(chosen, weights, strict=True):
            items.append(
                TrainItem(
                    episode.episode_id,
                    request.index,
                    request.prompt_ids,
                    request.token_ids,
                    request.logprobs,
                    float(per_request[request.index - 1]),
                    float(weight),
                )
            )
    return items


# ---------------------------------------------------------------------------------------------------- batches
@dataclass
class MicroBatch:
    """Packed rows and, aligned with their response tokens in row order, what the loss needs per token."""

    batch: dict[str, Any]
    logp_rollout: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    items: list[int]  # indices into the item list
    logp_prox: torch.Tensor | None = None  # AgenticRoboRL's b, when every item of the row has it

    @property
    def tokens(self) -> int:
        return int(self.logp_rollout.numel())


def micro_batches(
    items: Sequence[TrainItem], max_tokens: int, pad_id: int, mask: bool = True
) -> tuple[list[MicroBatch], list[int]]:
    """Items packed first-fit into rows of at most `max_tokens` (training.data.pack_examples: positions restart
    per document, no cross-document attention), one row per micro-batch. Returns (micro-batches, indices of items
    too long for a row). Per-token tensors follow the order in which sft.target_logits returns the targets."""
    examples = [
        Example(
            list(it.prompt_ids) + list(it.token_ids),
            [False] * len(it.prompt_ids) + [True] * len(it.token_ids),
            1.0,
            len(it.prompt_ids),
        )
        for it in items
    ]
    rows, too_long = pack_examples(examples, max_tokens)
    out = []
    for row in rows:
        logp, adv, weight, prox = [], [], [], []
        for index in row.examples:
            item, n = items[index], len(items[index].token_ids)
            logp += item.logprobs
            adv += [item.advantage] * n
            weight += [item.weight] * n
            prox = None if prox is None or item.prox_logprobs is None else prox + list(item.prox_logprobs)
        out.append(
            MicroBatch(
                collate([row], pad_id, mask=mask),
                torch.tensor(logp, dtype=torch.float32),
                torch.tensor(adv, dtype=torch.float32),
                torch.tensor(weight, dtype=torch.float32),
                list(row.examples),
                None if prox is None else torch.tensor(prox, dtype=torch.float32),
            )
        )
    return out, too_long


def sampled_token_logprobs(model: Any, batch: dict[str, Any], sft_config: SFTConfig) -> torch.Tensor:
    """log pi(y_j | prompt, y_<j) of every response token of a packed batch, teacher-forced, in row order: one
    forward pass, lm_head only at the response positions, log-softmax in fp32 (bf16 autocast on CUDA)."""
    device = next(model.parameters()).device
    autocast = device.type == "cuda" and sft_config.bf16
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits, targets, _ = target_logits(model, batch, sft_config)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)


# ---------------------------------------------------------------------------------------------------- metrics
_MEAN_KEYS = (
    "kept_frac",
    "ratio_mean",
    "clipped_low_frac",
    "clipped_high_frac",
    "dual_clip_frac",
    "is_weight_mean",
    "is_truncated_frac",
)


def combine_loss_metrics(parts: Sequence[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Micro-batch metrics of policy_loss into the step's: loss parts summed (each already carries the step's
    normaliser), token fractions and means weighted by tokens, the k3 KL by kept tokens."""
    out: dict[str, float] = {}
    tokens = sum(n for n, _ in parts)
    for key in ("pg_loss", "kl_loss"):
        values = [m[key] for _, m in parts if key in m]
        if values:
            out[key] = float(sum(values))
    out["loss"] = out.get("pg_loss", 0.0) + out.get("kl_loss", 0.0)
    for key in _MEAN_KEYS:
        if tokens and any(key in m for _, m in parts):
            out[key] = sum(n * m.get(key, 0.0) for n, m in parts) / tokens
    kept = [(n * m.get("kept_frac", 1.0), m["kl_k3"]) for n, m in parts if "kl_k3" in m]
    if kept:  # 0 without kept tokens, as policy_loss reports it
        total = sum(k for k, _ in kept)
        out["kl_k3"] = sum(k * v for k, v in kept) / total if total > 0 else 0.0
    return out


def token_advantage_stats(items: Sequence[TrainItem]) -> dict[str, float]:
    """Mean and (population) std of the advantage over the trained tokens (every token carries its request's A)."""
    n = np.asarray([len(it.token_ids) for it in items], dtype=np.float64)
    a = np.asarray([it.advantage for it in items], dtype=np.float64)
    if not n.sum():
        return {"token_adv_mean": 0.0, "token_adv_std": 0.0}
    mean = float((n * a).sum() / n.sum())
    return {"token_adv_mean": mean, "token_adv_std": float(math.sqrt((n * (a - mean) ** 2).sum() / n.sum()))}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def append_metrics(path: str | Path, row: dict[str, Any]) -> None:
    """One JSON object per line; NaN/inf become null so the file stays strict JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(_finite(row), sort_keys=True) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


PLOT_KEYS = ("loss", "kl_k3", "kept_frac", "adv_mean", "adv_std", "critic_auc", "reward_mean", "tokens")


def plot_metrics(path: str | Path, out: str | Path, keys: Sequence[str] = PLOT_KEYS) -> Path:
    """One panel per metric against the update index (missing or null values skipped), written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    cols = min(4, max(1, len(keys)))
    n_rows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.6 * cols, 2.6 * n_rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        points = [(r.get("update", i), r[key]) for i, r in enumerate(rows) if r.get(key) is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_title(key)
        ax.set_xlabel("update")
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------------- trainer
class RLTrainer:
    """The policy being trained, its frozen SFT reference, the critic and the running advantage std, and one
    AdamW optimizer; `update(round)` is one round of the module doc, `step()` applies the accumulated gradient."""

    def __init__(
        self,
        model: Any,
        ref_model: Any = None,
        critic: Any = None,
        *,
        tokenizer: Any = None,
        config: RLConfig = RLConfig(),
        objective: ObjectiveConfig = ObjectiveConfig(),
        credit_config: Any = None,
        policy_version: int = 0,
        metrics_path: str | Path | None = None,
    ):
        from training.credit import CreditConfig, RunningStd

        self.model, self.ref_model, self.critic, self.tokenizer = model, ref_model, critic, tokenizer
        self.config, self.objective = config, objective
        self.credit_config = credit_config or CreditConfig()
        self.running_std = RunningStd(self.credit_config.std_momentum, self.credit_config.min_std)
        self.policy_version = policy_version
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.sft_config = SFTConfig(attention=config.attention, bf16=config.bf16)
        self.used: set[str] = set()  # episodes already trained on (single-pass RL)
        self.pending_episodes = 0  # trained episodes whose gradient waits for the next optimizer step
        self.updates = 0
        self.last_items: list[TrainItem] = []  # the previous update's sampled requests (inspection, tests)
        if ref_model is not None:
            ref_model.eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=config.learning_rate,
            betas=config.adam_betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        warmup = max(config.warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def pad_id(self) -> int:
        pad = getattr(getattr(self.model, "config", None), "pad_token_id", None)
        return int(pad if pad is not None else 0)

    def build_round(self, reader: Any, config: RoundConfig = RoundConfig()) -> Round:
        """training.rounds.build_round at this trainer's policy version, with its tokenizer (gate), its critic's
        task vocabulary and its ledger of used episodes."""
        tasks = self.critic.tasks if self.critic is not None else None
        return build_round(
            reader,
            self.policy_version,
            config=config,
            objective=self.objective,
            tokenizer=self.tokenizer,
            tasks=tasks,
            used=self.used,
        )

    # ---------------------------------------------------------------------------------- pieces
    def advantages(self, round_: Round, critic: Any) -> tuple[dict, dict]:
        if self.objective.objective == "captain":
            if critic is None:
                raise ValueError("the CaPtain objective needs a critic (CaPtain Eq. 9-10)")
            return captain_advantages(round_, critic, self.running_std, self.credit_config)
        return agenticroborl_advantages(round_, self.objective)

    def micro_batches(self, items: Sequence[TrainItem]) -> tuple[list[MicroBatch], list[int]]:
        mask = self.config.attention == "mask"
        return micro_batches(items, self.config.micro_batch_tokens, self.pad_id, mask=mask)

    def micro_batch_loss(self, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """policy_loss of one micro-batch: the student's log-probs (with grad unless disabled by the caller), the
        frozen SFT model's for CaPtain's k3 KL, AgenticRoboRL's stored pre-update log-probs b (without them, b is
        the current forward pass detached, which is the pre-update policy only while no step has been taken), and
        the step's fixed normaliser 1 / episodes_per_step_n."""
        device = next(self.model.parameters()).device
        logp_new = sampled_token_logprobs(self.model, mb.batch, self.sft_config)
        logp_ref = None
        if self.ref_model is not None and self.objective.objective == "captain":
            with torch.no_grad():
                logp_ref = sampled_token_logprobs(self.ref_model, mb.batch, self.sft_config)
        return policy_loss(
            self.objective,
            logp_new,
            mb.logp_rollout.to(device),
            mb.advantages.to(device),
            logp_ref=logp_ref,
            logp_prox=None if mb.logp_prox is None else mb.logp_prox.to(device),
            token_weight=mb.weights.to(device),
            normaliser=1.0 / self.objective.episodes_per_step_n,
        )

    @torch.no_grad()
    def set_proximal_logprobs(self, items: Sequence[TrainItem]) -> None:
        """AgenticRoboRL's b (its truncated IS weight w = sg[min(q / b, C)]): the trainer's own log-probability of
        every sampled token under the weights as they are now, i.e. before this update's gradient is applied,
        computed without gradient (eval mode: the policy's probability, as the sampler sees it) and stored on the
        items, so that every later forward of the same items (the loss, `evaluate` after the step) divides by the
        pre-update policy rather than by its own detached value. q is the recorded sampling log-prob."""
        batches, _ = self.micro_batches(items)
        was_training = self.model.training
        self.model.eval()
        try:
            for mb in batches:
                logp = sampled_token_logprobs(self.model, mb.batch, self.sft_config).float().cpu()
                parts = logp.split([len(items[i].token_ids) for i in mb.items])
                for index, part in zip(mb.items, parts, strict=True):
                    items[index].prox_logprobs = part.tolist()
        finally:
            self.model.train(was_training)

    def accumulate(self, items: Sequence[TrainItem]) -> tuple[dict[str, float], int]:
        """Forward and backward over the items' micro-batches (module doc, step 5); the gradients add up in the
        parameters' .grad until `step`. For AgenticRoboRL the pre-update log-probs b of items that have none are
        computed first, all of them before the first backward pass. Returns the combined loss metrics and the
        number of items too long for a packed row (skipped)."""
        if self.objective.objective == "agenticroborl":
            self.set_proximal_logprobs([it for it in items if it.prox_logprobs is None])
        batches, too_long = self.micro_batches(items)
        self.model.train()
        parts = []
        for mb in batches:
            loss, metrics = self.micro_batch_loss(mb)
            loss.backward()
            parts.append((mb.tokens, metrics))
        return combine_loss_metrics(parts), len(too_long)

    @torch.no_grad()
    def evaluate(self, items: Sequence[TrainItem]) -> dict[str, float]:
        """The loss metrics `accumulate` would report for `items` under the current weights, without gradients."""
        return combine_loss_metrics([(mb.tokens, self.micro_batch_loss(mb)[1]) for mb in self.micro_batches(items)[0]])

    def step(self) -> dict[str, float]:
        """Apply the accumulated gradient: rescale it to 1 / (episodes accumulated) (module doc, step 5), clip,
        AdamW, zero; the policy version goes up by one. A step without any accumulated episode does nothing."""
        if self.pending_episodes == 0:
            return {"stepped": 0.0}
        params = [p for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        scale = self.objective.episodes_per_step_n / self.pending_episodes
        for p in params:
            p.grad.mul_(scale)
        if self.config.max_grad_norm is not None and params:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) if params else 0.0
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        episodes, self.pending_episodes = self.pending_episodes, 0
        self.policy_version += 1
        return {"stepped": 1.0, "grad_norm": grad_norm, "lr": lr, "step_episodes": float(episodes)}

    # ---------------------------------------------------------------------------------- checkpoint
    def save_checkpoint(self, path: str | Path) -> Path:
        """Everything an exact resume needs, written atomically (a crash mid-write leaves the previous file): the
        weights, AdamW and schedule, the gradient accumulated towards the next step and its episode count, the
        running std, the critic (weights, optimizer, normalisation), the ledger of used episodes, the policy
        version and the RNGs. The frozen SFT reference is not saved: it is the model it was loaded from."""
        from dataclasses import asdict

        from training.sft import rng_state

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "format_version": RL_CHECKPOINT_VERSION,
            "objective": asdict(self.objective),
            "model": self.model.state_dict(),
            "grads": {n: p.grad for n, p in self.model.named_parameters() if p.grad is not None},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "running_std": asdict(self.running_std),
            "critic": self.critic.state() if self.critic is not None else None,
            "used": sorted(self.used),
            "pending_episodes": self.pending_episodes,
            "updates": self.updates,
            "policy_version": self.policy_version,
            "rng": rng_state(),
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a `save_checkpoint` file in place. Refuses one written for another objective (its advantages,
        accumulated gradient and ledger would not mean the same)."""
        from dataclasses import asdict

        from training.critic import Critic
        from training.sft import set_rng_state

        device = next(self.model.parameters()).device
        payload = torch.load(Path(path), map_location=device, weights_only=True)
        if payload.get("format_version") != RL_CHECKPOINT_VERSION:
            raise ValueError(
                f"{path}: RL checkpoint format {payload.get('format_version')!r}, expected {RL_CHECKPOINT_VERSION}"
            )
        if payload["objective"] != asdict(self.objective):
            changed = sorted(k for k, v in asdict(self.objective).items() if payload["objective"].get(k) != v)
            raise ValueError(
                f"{path} was written with other objective settings ({', '.join(changed)}); resume "
                "with the settings it was written with, or start a new run in another folder"
            )
        self.model.load_state_dict(payload["model"])
        grads = payload["grads"]
        for name, p in self.model.named_parameters():
            p.grad = grads[name].to(p.dtype) if name in grads else None
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        for key, value in payload["running_std"].items():
            setattr(self.running_std, key, value)
        if payload["critic"] is not None:
            critic_device = self.critic.device if self.critic is not None else "cpu"
            self.critic = Critic.from_state(payload["critic"], critic_device)
        self.used = set(payload["used"])
        self.pending_episodes = int(payload["pending_episodes"])
        self.updates = int(payload["updates"])
        self.policy_version = int(payload["policy_version"])
        set_rng_state(payload["rng"])

    # ---------------------------------------------------------------------------------- one round
    def update(self, round_: Round, *, step: bool | None = None) -> dict[str, Any]:
        """One round (module doc, steps 1-7). `step`: True forces the optimizer step after this round, False
        defers it, None steps once `episodes_per_step_n` episodes are accumulated. Returns the metrics row (also
        appended to the metrics log)."""
        from training.critic import evaluate, states_from_episodes

        t0 = time.perf_counter()
        episodes = round_.episodes
        row: dict[str, Any] = {
            "update": self.updates,
            "policy_version": self.policy_version,
            "objective": self.objective.objective,
            "groups": len(round_.groups),
            "episodes": len(episodes),
            "requests": sum(len(e.requests) for e in episodes),
            "episodes_dropped": round_.report.episodes_dropped,
            "dropped": dict(round_.report.dropped),
            "reward_mean": float(np.mean([e.reward for e in episodes])) if episodes else None,
            "success_rate": float(np.mean([e.success for e in episodes])) if episodes else None,
        }
        snapshot = self.critic.snapshot() if self.critic is not None else None
        states = (
            states_from_episodes([e.episode for e in episodes], self.critic.tasks) if self.critic is not None else None
        )
        if snapshot is not None and len(states):
            row.update({f"critic_{k}": v for k, v in evaluate(snapshot, states).items()})
        if episodes:
            advantages, adv_stats = self.advantages(round_, snapshot)
            row.update(adv_stats)
            items = select_items(round_, advantages, self.objective)
            self.last_items = items
            loss_metrics, too_long = self.accumulate(items)
            row.update(loss_metrics)
            trained = {it.episode_id for it in items}
            self.pending_episodes += len(trained)
            self.used.update(e.episode_id for e in episodes)
            row.update(token_advantage_stats(items))
            row.update(
                trained_episodes=len(trained),
                sampled_requests=len(items),
                tokens=int(sum(len(it.token_ids) for it in items)),
                too_long=too_long,
            )
        stepped = step if step is not None else self.pending_episodes >= self.objective.episodes_per_step_n
        row.update(self.step() if stepped else {"stepped": 0.0})
        row["policy_version_after"] = self.policy_version
        if self.critic is not None and self.config.co_train_critic and states is not None and len(states):
            losses = self.critic.co_train(states)
            row["critic_co_train_loss_first"] = losses[0]
            row["critic_co_train_loss_last"] = losses[-1]
        row["elapsed_s"] = time.perf_counter() - t0
        self.updates += 1
        if self.metrics_path is not None:
            append_metrics(self.metrics_path, row)
        return row


# ---------------------------------------------------------------------------------------------------- CLI
def _load_policy(path: str | None, tiny: bool) -> tuple[Any, Any]:
    """(model, tokenizer) from a transformers folder, or the tiny Qwen2 (training.tiny) with --tiny. A folder whose
    tokenizer or chat template cannot train the stack is refused with the reasons (training.student)."""
    if tiny:
        from training.tiny import tiny_model, tiny_tokenizer

        return tiny_model(), tiny_tokenizer()
    if not path:
        raise SystemExit("give --model DIR (a transformers folder) or --tiny")
    from transformers import AutoModelForCausalLM

    from training.student import StudentError, check_model_folder

    try:
        tokenizer = check_model_folder(Path(path))
    except StudentError as exc:
        raise SystemExit(str(exc)) from None
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


def _device(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def _fast_applies(model: Any, args: argparse.Namespace) -> bool:
    """training.fast computes the same loss over the same weights for Qwen2-shaped models on a GPU, all weights or
    LoRA adapters (the CLI's have no dropout) alike (training.fast.unsupported_reason: Qwen2, no sliding window);
    other architectures take the transformers forward."""
    from training.fast import unsupported_reason

    return torch.cuda.is_available() and unsupported_reason(model) is None


def _group_of(episode: Any) -> str:
    return str(episode.start.get("group_id", episode.episode_id))


def warm_start_split(episodes: Sequence[Any], fraction: float) -> tuple[list[Any], list[Any]]:
    """(held apart for the critic's warm start, left for the RL rounds): whole start-state groups, the first
    ceil(fraction x groups) in the order of sha256(group id). Deterministic in every process and on resume,
    independent of the order in which groups were recorded (a task or a start state does not decide it), and
    sibling attempts of one start never straddle it. Needs at least one group on each side."""
    groups = sorted({_group_of(e) for e in episodes}, key=lambda g: hashlib.sha256(g.encode()).digest())
    n = math.ceil(fraction * len(groups))
    if not 0.0 < fraction < 1.0 or not 0 < n < len(groups):
        raise SystemExit(
            f"cannot hold {fraction} of {len(groups)} start-state groups apart for the critic's warm start and keep "
            "some for RL: give --critic (a trained critic) or --warm-start-store (an earlier policy's episodes)"
        )
    held = set(groups[:n])
    return [e for e in episodes if _group_of(e) in held], [e for e in episodes if _group_of(e) not in held]


def warm_start_critic(
    reader: Any, *, fraction: float = 0.25, seed: int = 0, warm_reader: Any = None
) -> tuple[Any, set[str]]:
    """The critic `cmd_rl` uses without --critic, warm-started (CaPtain App. A.2) only on episodes that no RL round
    of the run trains on. CaPtain warm-starts on 1,000 episodes of an earlier policy: with `warm_reader` (such a
    store: --warm-start-store) all its valid episodes are used; otherwise `warm_start_split` holds `fraction` of the
    RL store's groups apart. Returns the critic and the episode ids the trainer must count as used (the held-apart
    ones; with a separate store, those of its ids the RL store also holds), so the first round, and every later one,
    trains only on episodes whose labels the warm start has not seen. The task vocabulary covers both stores (a task
    name carries no label)."""
    from training.critic import Critic, CriticConfig, states_from_episodes

    episodes = [reader.load(eid) for eid in reader.episode_ids()]
    if warm_reader is not None:
        warm = [warm_reader.load(eid) for eid in warm_reader.episode_ids()]
        ids = {e.episode_id for e in episodes}
        held_apart = {e.episode_id for e in warm if e.episode_id in ids}
        source = "the warm-start store"
    else:
        warm, _ = warm_start_split(episodes, fraction)
        held_apart = {e.episode_id for e in warm}
        n_warm, n_all = len({_group_of(e) for e in warm}), len({_group_of(e) for e in episodes})
        source = f"{n_warm} of the store's {n_all} start-state groups, never trained on"
    tasks = tuple(sorted({e.start["task"] for e in episodes + warm}))
    states = states_from_episodes(warm, tasks)
    if not len(states):
        raise SystemExit(f"the critic's warm start has no labelled request state ({len(warm)} episodes)")
    critic = Critic(CriticConfig(tasks=tasks, seed=seed))
    critic.fit(states)
    print(f"critic warm start on {len(warm)} episodes ({len(states)} states): {source}", file=sys.stderr)
    return critic, held_apart


def _write_sft_outputs(out: Path, served: Any, tokenizer: Any, *, result: Any, config: Any, run: dict) -> None:
    """The SFT run's outputs: metrics, the servable folder (with LoRA, also the adapter alone), the run record."""
    import platform

    from training.weight_sync import write_model_folder

    args, stats, examples, rows = run["args"], run["stats"], run["examples"], run["rows"]
    n_batches, seconds, steps = run["n_batches"], run["seconds"], config.max_steps
    for row in result.metrics:
        append_metrics(out / "sft_metrics.jsonl", row)
    if config.lora_rank:
        # peft trains the adapter in fp32; stored in the base model's dtype it is half the size to bring back from a
        # GPU host (rank 32 on the 0.5B student: 35 MB), and merging it into that base rounds to that dtype anyway
        base_dtype = served.get_base_model().dtype
        adapter = {k: v.to(base_dtype) if v.is_floating_point() else v for k, v in served.state_dict().items()}
        served.save_pretrained(out / "adapter", state_dict=adapter)
        served = served.merge_and_unload()
    write_model_folder(served, tokenizer, out / "model")
    trained = sum(r["tokens"] for r in result.metrics)
    seen = round(sum(len(r) for r in rows) / n_batches * steps * args.grad_accum)  # mean micro-batch x used
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    record = {
        "store": run["source"],
        "episodes": stats.episodes,
        "unsuccessful_skipped": stats.unsuccessful_skipped,
        "whole_trajectories": stats.whole,
        "segmented_episodes": stats.segmented,
        "per_request_episodes": stats.per_request,
        "requests": dict(stats.requests),  # each request's fate: target, zero weight, too long, ...
        "examples": len(examples),
        "rows": len(rows),
        "steps": steps,
        "epochs": args.epochs,
        "lora_rank": config.lora_rank,
        "trained_rows": list(config.trainable_rows),  # output rows trained beside LoRA (SFTConfig.trainable_rows)
        "learning_rate": args.lr,
        "lr_schedule": config.lr_schedule,
        "fast_path": config.fast is not None,
        "supervised_tokens": trained,
        "tokens_seen": seen,  # packed row tokens through forward and backward
        "seconds": seconds,
        "tokens_per_s": seen / seconds,
        "final_loss": result.metrics[-1]["loss"] if result.metrics else None,
        "machine": {"host": platform.node(), "gpu": gpu, "torch": torch.__version__},
    }
    (out / "sft_run.json").write_text(json.dumps(record, indent=2) + "\n")


def _data_config(args: argparse.Namespace) -> Any:
    from training.data import DataConfig

    return DataConfig(
        seed=args.seed,
        whole_episodes=not args.per_request,
        strict_success=not args.keep_missed_finish,  # a solved scene without finish() would teach not finishing
        max_trajectory_tokens=args.max_tokens,
        recovery_per_episode=args.recovery_per_episode,
    )


def _sft_data(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """The SFT examples: from --examples (a file of `sft-data`, checked against this tokenizer and these options),
    else built from --store (the prompt gate over every request, then `training.data.sft_examples`)."""
    from training.data import SFTDataMismatch, TrajectoryStats, load_sft_data, sft_examples

    config = _data_config(args)
    if getattr(args, "examples", None) and args.store:
        raise SystemExit("give --store or --examples, not both")
    if getattr(args, "examples", None):
        try:
            return load_sft_data(args.examples, tokenizer, config)
        except (OSError, SFTDataMismatch) as exc:
            raise SystemExit(f"--examples: {exc}") from None
    if not args.store:
        raise SystemExit("give --store (an episode store) or --examples (a file of `python -m training.rl sft-data`)")
    from captain_ros.bridge.store import EpisodeReader
    from training.gate import gate_episodes

    reader = EpisodeReader(args.store)
    gate = gate_episodes(tokenizer, reader)
    stats = TrajectoryStats()
    examples = sft_examples(tokenizer, reader, config=config, gate=gate, stats=stats)
    return {"source": str(args.store), "gate": gate, "stats": stats, "examples": examples}


def _untrained_target_rows(model: Any, tokenizer: Any, examples: Sequence[Example], trainable: bool) -> list[int]:
    """The output rows of target tokens the base never trained (training.token_rows.untrained_rows): LoRA leaves
    lm_head frozen, so without training them beside the adapters no hidden state can single those tokens out."""
    from training.token_rows import untrained_rows

    targeted = sorted({t for e in examples for t, m in zip(e.input_ids, e.response_mask, strict=True) if m})
    free = untrained_rows(model.get_output_embeddings().weight, targeted)
    if free and trainable:
        print(
            f"training the output rows of {tokenizer.convert_ids_to_tokens(free)} beside the LoRA adapters: the base "
            "never trained them (each equals thousands of others) and LoRA leaves lm_head frozen",
            file=sys.stderr,
        )
    elif free:
        print(
            f"warning: the output rows of {tokenizer.convert_ids_to_tokens(free)} were never trained and this run "
            "leaves them frozen, so it cannot teach writing them: fit them afterwards (python -m training.token_rows "
            "fit)",
            file=sys.stderr,
        )
    return free if trainable else []


def cmd_sft_data(args: argparse.Namespace) -> int:
    """Build the SFT examples of a store once (here, on CPU) and write them to one file that `sft --examples` reads:
    a GPU host then spends no time rendering and gating thousands of long prompts."""
    from training.data import save_sft_data

    if args.tiny:
        from training.tiny import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    elif args.model:
        from training.student import StudentError, check_model_folder

        try:
            tokenizer = check_model_folder(Path(args.model))
        except StudentError as exc:
            raise SystemExit(str(exc)) from None
    else:
        raise SystemExit("give --model DIR (a transformers folder) or --tiny")
    t0 = time.perf_counter()
    data = _sft_data(args, tokenizer)
    print(data["gate"], file=sys.stderr)
    print(data["stats"], file=sys.stderr)
    out = save_sft_data(args.out, tokenizer, _data_config(args), **data)
    tokens = sum(len(e.input_ids) for e in data["examples"])
    print(
        f"SFT data: {len(data['examples'])} examples, {tokens:,} tokens, built in {time.perf_counter() - t0:.0f} s "
        f"-> {out} ({out.stat().st_size / 2**20:.1f} MiB)"
    )
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    """SFT on a store's successful episodes: gate, examples (whole trajectories where the history only grows),
    packing, train_sft, then a servable folder (and, with LoRA, the adapter alone) and a run record."""
    from training.data import MicroBatches
    from training.fast import FastConfig
    from training.sft import SFTConfig as Config
    from training.sft import train_sft

    dist_info = None
    if args.fsdp:  # one process per GPU under torchrun (training.distributed)
        from training.distributed import init_distributed

        dist_info = init_distributed(args.device)
    main = dist_info is None or dist_info.is_main
    out = Path(args.out)
    model, tokenizer = _load_policy(args.model, args.tiny)
    model.to(dist_info.device if dist_info else _device(args.device))
    if args.gradient_checkpointing:  # recompute each layer's activations in backward: whole trajectories fit
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    data = _sft_data(args, tokenizer)
    examples, stats = data["examples"], data["stats"]
    if main:
        print(data["gate"], file=sys.stderr)
        print(stats, file=sys.stderr)
    free_rows: list[int] = []
    if args.lora_rank and main:  # trained beside the adapters, except under FSDP (not supported there)
        free_rows = _untrained_target_rows(model, tokenizer, examples, trainable=dist_info is None)
    rows, too_long = pack_examples(examples, args.max_tokens)
    if too_long and main:
        print(f"{len(too_long)} examples longer than --max-tokens {args.max_tokens} left out", file=sys.stderr)
    if not rows:
        raise SystemExit(f"no SFT examples in {args.store}: it holds no successful episode that fits --max-tokens")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    fast = _fast_applies(model, args) and not args.no_fast and dist_info is None
    batches = MicroBatches(rows, args.rows, pad, mask=not fast)
    steps = args.steps if args.epochs is None else max(1, math.ceil(args.epochs * len(batches) / args.grad_accum))
    config = Config(
        max_steps=steps,
        grad_accum_steps=args.grad_accum,
        learning_rate=args.lr,
        warmup_steps=args.warmup,
        lr_schedule=args.lr_schedule,
        min_lr_ratio=args.min_lr_ratio,
        seed=args.seed,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha or 2.0 * args.lora_rank,
        trainable_rows=tuple(free_rows),
        rows_learning_rate=args.rows_lr,
        checkpoint_dir=str(out / "checkpoint"),
        progress=not args.no_progress,
        fast=FastConfig() if fast else None,
    )
    if main:
        path = "training.fast (packed attention, fused linear cross-entropy)" if fast else "the transformers forward"
        lora = f"LoRA rank {config.lora_rank}" if config.lora_rank else "all weights"
        print(
            f"training {len(rows)} rows in {len(batches)} micro-batches, {steps} steps, {lora}, {path}", file=sys.stderr
        )
    t0 = time.perf_counter()
    if dist_info is None:
        result = train_sft(model, batches, config)
        served = result.model
    else:
        from training.distributed import shutdown, train_sft_fsdp, unsharded_copy

        result = train_sft_fsdp(model, batches, config)
        served = unsharded_copy(result.model)  # gathered on rank 0 (None elsewhere)
    seconds = time.perf_counter() - t0
    if main:
        run = {"args": args, "source": data["source"], "stats": stats, "examples": examples, "rows": rows}
        run["n_batches"] = len(batches)
        _write_sft_outputs(out, served, tokenizer, result=result, config=config, run={**run, "seconds": seconds})
    if dist_info is not None:
        shutdown()
    if not main:
        return 0
    print(f"SFT: {len(examples)} examples, {steps} steps in {seconds:.0f} s -> {out / 'model'}")
    return 0


def cmd_rl(args: argparse.Namespace) -> int:
    """RL rounds over a store: build a round, update, co-train the critic, and sync weights after each step."""
    from tqdm import tqdm

    from captain_ros.bridge.store import EpisodeReader
    from training.critic import Critic
    from training.weight_sync import WeightSync, write_model_folder

    model, tokenizer = _load_policy(args.model, args.tiny)
    ref, _ = _load_policy(args.ref or args.model, args.tiny)
    device = _device(args.device)
    model.to(device)
    ref.to(device)
    reader = EpisodeReader(args.store)
    held_apart: set[str] = set()
    if args.critic and Path(args.critic).exists():
        critic = Critic.load(args.critic)
    else:  # warm start on episodes no round of this run trains on (warm_start_critic)
        warm_reader = EpisodeReader(args.warm_start_store) if args.warm_start_store else None
        critic, held_apart = warm_start_critic(
            reader, fraction=args.warm_start_fraction, seed=args.seed, warm_reader=warm_reader
        )
    objective = ObjectiveConfig(objective=args.objective, episodes_per_step_n=args.episodes_per_step)
    trainer = RLTrainer(
        model,
        ref,
        critic,
        tokenizer=tokenizer,
        config=RLConfig(learning_rate=args.lr, micro_batch_tokens=args.max_tokens),
        objective=objective,
        policy_version=args.version,
        metrics_path=Path(args.out) / "rl_metrics.jsonl",
    )
    trainer.used.update(held_apart)  # the critic's warm-start episodes are never trained on
    sync = WeightSync(args.server, args.served_dir, proxy_url=args.proxy) if args.server else None
    round_config = RoundConfig(group_size_n=args.group_size, max_groups_n=args.groups_per_round)

    checkpoint = Path(args.out) / "rl_checkpoint.pt"
    if checkpoint.exists() and not args.resume:
        raise SystemExit(f"{checkpoint} exists (an earlier run): pass --resume to continue it, or use another --out")
    if args.resume and checkpoint.exists():
        trainer.load_checkpoint(checkpoint)
        print(
            f"resumed {checkpoint}: {trainer.updates} updates done, policy version {trainer.policy_version}, "
            f"{len(trainer.used)} episodes used, {trainer.pending_episodes} waiting for the next step",
            file=sys.stderr,
        )

    def publish() -> None:
        """The new policy: a servable folder, the critic, and (with --server) the running policy server."""
        write_model_folder(trainer.model, tokenizer, Path(args.out) / "model")
        trainer.critic.save(Path(args.out) / "critic.pt")
        if sync is not None:
            print(sync.sync(trainer.model, trainer.policy_version).as_dict(), file=sys.stderr)

    bar = tqdm(total=args.rounds, desc="rl", unit="round", disable=args.no_progress)
    for _ in range(args.rounds):
        round_ = trainer.build_round(reader, round_config)
        print(round_.report, file=sys.stderr)
        if not round_.groups:
            break
        row = trainer.update(round_)
        bar.update(1)
        bar.set_postfix(
            loss=f"{row.get('loss', 0):.4f}", kept=f"{row.get('kept_frac', 0):.2f}", v=trainer.policy_version
        )
        if row["stepped"]:
            publish()
        trainer.save_checkpoint(checkpoint)  # after publishing: a resumed run never re-syncs an older version
    bar.close()
    if trainer.pending_episodes:  # a last, smaller step (its gradient is rescaled to its own episode count)
        print(f"final step over {trainer.pending_episodes} accumulated episodes", file=sys.stderr)
        trainer.step()
        publish()
        trainer.save_checkpoint(checkpoint)
    metrics = Path(args.out) / "rl_metrics.jsonl"
    if metrics.exists():
        plot_metrics(metrics, Path(args.out) / "rl_metrics.png")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    print(plot_metrics(args.metrics, args.out, args.keys.split(",") if args.keys else PLOT_KEYS))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m training.rl",
        description="The captain_ros trainer: SFT on recorded twin episodes, then critic-credited RL rounds whose "
        "new weights reach a running vLLM policy server (CaPtain §3.2-3.3; issue 12).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, store_required: bool = True) -> None:
        p.add_argument("--store", required=store_required, help="episode store (SQLite) the rollouts shipped to")
        p.add_argument("--out", required=True, help="output folder (model, metrics, checkpoints)")
        p.add_argument("--model", help="transformers folder of the policy to train")
        p.add_argument("--tiny", action="store_true", help="use the tiny Qwen2 of training.tiny (tests, CPU)")
        p.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda', 'cuda:1', ...")
        p.add_argument("--max-tokens", type=int, default=16384, help="tokens per packed row")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--no-progress", action="store_true", help="no progress bars")

    def data_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--per-request", action="store_true", help="one example per request, not per trajectory")
        p.add_argument(
            "--keep-missed-finish", action="store_true", help="also imitate solved episodes that never called finish()"
        )
        p.add_argument(
            "--recovery-per-episode",
            type=_count,
            default=0,
            help="per episode, this many extra examples of recovering from a failed turn: the expert's call with one "
            "JSON slip and the loop's error message, or with its cell broken and the compile error; then the expert's "
            "call as the target",
        )

    data = sub.add_parser(
        "sft-data",
        help="build a store's SFT examples once and write them to one file (--out) for `sft --examples`",
        description="Gate and render a store's SFT examples with a model's tokenizer, and write them (lzma pickle) to "
        "--out: a GPU host reads them with `sft --examples FILE` instead of rendering the store itself. --max-tokens, "
        "--seed and the data options must match the sft run's (it checks them, and the tokenizer).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data.add_argument("--store", required=True, help="episode store (SQLite) of the episodes to imitate")
    data.add_argument("--out", required=True, help="the file to write (e.g. sft_data.pkl.xz)")
    data.add_argument("--model", help="transformers folder whose tokenizer and chat template render the examples")
    data.add_argument("--tiny", action="store_true", help="the tiny Qwen2's tokenizer (tests)")
    data.add_argument("--max-tokens", type=int, default=16384, help="tokens per packed row (as the sft run's)")
    data.add_argument("--seed", type=int, default=0)
    data_options(data)
    data.set_defaults(func=cmd_sft_data)

    sft = sub.add_parser(
        "sft",
        help="supervised fine-tuning on a store (CaPtain Eq. 2)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    common(sft, store_required=False)
    sft.add_argument(
        "--examples",
        help="train on this file of `sft-data` (built from a store with this model's tokenizer) instead of --store",
    )
    data_options(sft)
    sft.add_argument("--steps", type=int, default=100, help="optimizer steps (unless --epochs)")
    sft.add_argument("--epochs", type=float, default=None, help="passes over the data; sets the number of steps")
    sft.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank (0: all weights)")
    sft.add_argument("--lora-alpha", type=float, default=0.0, help="LoRA alpha (0: twice the rank)")
    sft.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations in backward (less memory)"
    )
    sft.add_argument(
        "--rows-lr",
        type=_positive,
        default=1e-2,
        help="learning rate of the output rows a LoRA run trains beside its adapters: those of target tokens the base "
        "never trained, found by training.token_rows (default 1e-2)",
    )
    sft.add_argument("--no-fast", action="store_true", help="the transformers forward even where training.fast applies")
    sft.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    sft.add_argument("--rows", type=int, default=1, help="packed rows per micro-batch")
    sft.add_argument("--lr", type=float, default=1e-5)
    sft.add_argument("--warmup", type=int, default=0, help="warm-up steps")
    sft.add_argument(
        "--lr-schedule",
        choices=("constant", "cosine"),
        default="constant",
        help="after the warm-up: constant, or a cosine down to --min-lr-ratio x --lr at the last step",
    )
    sft.add_argument(
        "--min-lr-ratio", type=_fraction, default=0.1, help="with --lr-schedule cosine: the last step's rate over --lr"
    )
    sft.add_argument(
        "--fsdp",
        action="store_true",
        help="FSDP2 across the ranks of `torchrun --nproc-per-node N -m training.rl sft --fsdp` (training.distributed)",
    )
    sft.set_defaults(func=cmd_sft)

    rl = sub.add_parser(
        "rl", help="RL rounds on a store (CaPtain Eq. 8-10)", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    common(rl)
    rl.add_argument("--ref", help="frozen SFT model for the k3 KL; absent: --model")
    rl.add_argument("--critic", help="critic checkpoint (training.critic); absent: a warm start (see below)")
    rl.add_argument(
        "--warm-start-store",
        help="without --critic: warm-start the critic on this store's episodes (an earlier policy's, as CaPtain "
        "App. A.2); absent: on --warm-start-fraction of --store's start-state groups, which RL then never trains on",
    )
    rl.add_argument(
        "--warm-start-fraction",
        type=float,
        default=0.25,
        help="share of --store's start-state groups held apart for the critic's warm start (by sha256 of group id)",
    )
    rl.add_argument("--objective", choices=["captain", "agenticroborl"], default="captain")
    rl.add_argument("--rounds", type=int, default=1, help="rounds to run (stops early when no group is ready)")
    rl.add_argument("--group-size", type=int, default=4, help="G: attempts per start state")
    rl.add_argument("--groups-per-round", type=int, default=64)
    rl.add_argument("--episodes-per-step", type=int, default=1024, help="episodes per optimizer step")
    rl.add_argument("--lr", type=float, default=4.24e-6)
    rl.add_argument(
        "--version", type=int, default=0, help="policy version of the --model weights (what the server serves now)"
    )
    rl.add_argument("--server", help="vLLM policy server (VLLM_SERVER_DEV_MODE=1) to sync weights into")
    rl.add_argument("--served-dir", help="the folder that server serves (weights are written there)")
    rl.add_argument("--proxy", help="recording proxy whose policy version is bumped after each sync")
    rl.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its rl_checkpoint.pt (saved each round)"
    )
    rl.set_defaults(func=cmd_rl)

    plot = sub.add_parser("plot", help="plot a metrics log (JSONL) as PNG")
    plot.add_argument("metrics", help="rl_metrics.jsonl")
    plot.add_argument("--out", required=True, help="PNG to write")
    plot.add_argument("--keys", default="", help=f"comma-separated metrics (default: {','.join(PLOT_KEYS)})")
    plot.set_defaults(func=cmd_plot)
    return top


def _cli_number(convert: Any, ok: Any, what: str) -> Any:
    """An argparse type: `convert` (float or int) of the text, refused with a message unless `ok(value)` (NaN fails
    any comparison, so it is refused too)."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            kind = "a whole number" if convert is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    return parse


_count = _cli_number(int, lambda v: v >= 0, "zero or more")
_fraction = _cli_number(float, lambda v: 0.0 <= v <= 1.0, "between 0 and 1")
_positive = _cli_number(float, lambda v: v > 0, "above zero")  # a learning rate


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "server", None) and not getattr(args, "served_dir", None):
        raise SystemExit("--server needs --served-dir (the folder the server serves)")
    return int(args.func(args))


if __name__ == "__main__":
    from training.distributed import exit_process

    exit_process(main())


__all__ = [
    "MicroBatch",
    "RLConfig",
    "RLTrainer",
    "TrainItem",
    "agenticroborl_advantages",
    "append_metrics",
    "captain_advantages",
    "combine_loss_metrics",
    "main",
    "micro_batches",
    "plot_metrics",
    "read_metrics",
    "sampled_token_logprobs",
    "select_items",
    "token_advantage_stats",
    "warm_start_critic",
    "warm_start_split",
]

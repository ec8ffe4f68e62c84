"""One RL update from a round (CaPtain §3.3 Eq. 8-10, App. A.2 "RL"; AgenticRoboRL L_RL as the alternative): the
trainer that `python -m captain_ros_training rl rl` (captain_ros_training.rl_command) and
captain_ros_training.sft_then_rl run round after round.

`RLTrainer.update(round)` does, for the round's kept groups (captain_ros_training.rounds):

  1. critic values with a snapshot of the critic taken BEFORE this round's co-training (App. A.2: "each round's
     advantages use the critic before that round's update"), and the snapshot's AUC on this round's states, which
     it has never been trained on;
  2. advantages: CaPtain Eq. 9-10 through captain_ros_training.credit (per request, divided by the running std), or
     AgenticRoboRL's leave-one-out A_i over the group's valid attempts (per episode) of its binary reward
     R_i = 1[host success] (not CaPtain's shaped return of Eq. 7);
  3. per episode, at most 8 requests (CaPtain) or 16 responses (AgenticRoboRL) drawn uniformly from the requests
     eligible for a policy gradient (prompt gate passed, fits the context; AgenticRoboRL also drops requests made
     after the scene was solved, CaPtain keeps them: captain_ros_training.rounds), with CaPtain's inclusion weight n/k
     or AgenticRoboRL's 1/(K L_s); every token of request t shares A_{i,t} (§3.3);
  4. the student's log-probability of each sampled token, teacher-forced (prompt ids + sampled ids -> logits ->
     log-softmax at the sampled id), on packed rows without cross-document attention (captain_ros_training.data packing,
     captain_ros_training.sft's forward), and the frozen SFT model's for the k3 KL (CaPtain); for AgenticRoboRL, first,
     once per update and without gradient, the pre-update (proximal) log-probability b of every sampled token, which its
     truncated IS weight w = sg[min(q / b, 2)] compares with the recorded sampling probability q;
  5. the loss of captain_ros_training.policy_loss and its backward pass, micro-batch by micro-batch, all scaled by one
     normaliser 1 / `episodes_per_step_n` (CaPtain accumulates 1,024 episodes per optimizer step: K = 4 rounds
     of 256). When the step is taken with a different number of trained episodes, the accumulated gradient is
     rescaled by episodes_per_step_n / episodes, which is exactly the loss with 1 / episodes as normaliser
     (gradients are linear in it), so a step never depends on how it was cut into micro-batches or rounds;
  6. an AdamW step (gradient clipping, constant learning rate after warm-up, App. A.2) once enough episodes are
     accumulated (or when asked), which increments the policy version;
  7. two full-batch co-training steps of the critic on all the round's request states (App. A.2).

Every update appends one row to a JSONL metrics log (loss, KL, kept-token fraction, advantage statistics, critic
AUC and within-group AUC, the round's host and strict success, false and missed finishes, requests per episode,
episodes, tokens, ...): captain_ros_training.metrics_log writes it, and its `plot_metrics` draws it.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captain_ros_training.data import Example, collate, pack_examples
from captain_ros_training.metrics_log import append_metrics
from captain_ros_training.policy_loss import (
    ObjectiveConfig,
    agenticroborl_token_weights,
    captain_token_weights,
    episode_rng,
    leave_one_out_by_group,
    policy_loss,
    sample_requests,
)
from captain_ros_training.rounds import Round, RoundConfig, build_round
from captain_ros_training.sft import SFTConfig, target_logits

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
    fast: Any = field(
        default=None,
        metadata={"help": "a captain_ros_training.fast.FastConfig: its packed forward for the log-probs (Qwen2)"},
    )
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
    from captain_ros_training.credit import batch_from_episodes, credit_round

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
    """Items packed first-fit into rows of at most `max_tokens` (captain_ros_training.data.pack_examples: positions
    restart per document, no cross-document attention), one row per micro-batch. Returns (micro-batches, indices of
    items too long for a row). Per-token tensors follow the order in which sft.target_logits returns the targets."""
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
    forward pass, lm_head only at the response positions, log-softmax in fp32 (bf16 autocast on CUDA). With
    `sft_config.fast` the forward is captain_ros_training.fast's packed one (varlen attention within each document, no
    [L, L] mask; LoRA through its linear weights; layer recomputation with `checkpoint_layers`), the same
    log-probabilities up to kernel rounding."""
    device = next(model.parameters()).device
    autocast = device.type == "cuda" and sft_config.bf16
    if sft_config.fast is not None:
        from captain_ros_training.fast import packed_hidden

        selected = batch["token_weights"].to(device).reshape(-1) > 0
        targets = batch["targets"].to(device).reshape(-1)[selected]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            hidden = packed_hidden(
                model,
                batch["input_ids"].to(device),
                batch["position_ids"].to(device),
                batch["cu_seqlens"].to(device),
                int(batch["max_seqlen"]),
                config=sft_config.fast,
            )
            logits = model.get_output_embeddings()(hidden[selected])
    else:
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


def outcome_stats(episodes: Sequence[Any]) -> dict[str, Any]:
    """How the round's episodes ended (captain_ros.agent.episode.Outcome): strict success (an accepted finish() on
    a solved scene), false finishes (finish() on a failing scene) and missed finishes (solved, never finished) as
    rates over the round's episodes, every outcome's count, and requests per episode."""
    outcomes = [str((e.episode.end or {}).get("outcome")) for e in episodes]
    n = len(outcomes)

    def rate(name: str) -> float | None:
        return outcomes.count(name) / n if n else None

    return {
        "strict_success_rate": rate("success"),
        "false_finish_rate": rate("false_finish"),
        "missed_finish_rate": rate("missed_finish"),
        "outcomes": dict(sorted(Counter(outcomes).items())),
        "requests_per_episode": sum(len(e.requests) for e in episodes) / n if n else None,
    }


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
        from captain_ros_training.credit import CreditConfig, RunningStd

        self.model, self.ref_model, self.critic, self.tokenizer = model, ref_model, critic, tokenizer
        self.config, self.objective = config, objective
        self.credit_config = credit_config or CreditConfig()
        self.running_std = RunningStd(self.credit_config.std_momentum, self.credit_config.min_std)
        self.policy_version = policy_version
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.sft_config = SFTConfig(attention=config.attention, bf16=config.bf16, fast=config.fast)
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
        """captain_ros_training.rounds.build_round at this trainer's policy version, with its tokenizer (gate), its
        critic's task vocabulary and its ledger of used episodes."""
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

        from captain_ros_training.sft import rng_state

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "format_version": RL_CHECKPOINT_VERSION,
            "objective": asdict(self.objective),
            # a model with frozen weights (LoRA on a base folder) keeps only what trains: the frozen base is the
            # folder it was loaded from, like the reference, and a rank-8 adapter's checkpoint is ~50 MB, not ~2 GB
            "model_params": "trainable" if self._frozen_params() else "all",
            "model": self._model_state(),
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

        from captain_ros_training.critic import Critic
        from captain_ros_training.sft import set_rng_state

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
        if payload.get("model_params", "all") == "trainable":
            self._load_trainable(payload["model"], path)
        else:
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

    def _frozen_params(self) -> bool:
        return any(not p.requires_grad for p in self.model.parameters())

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The weights a checkpoint holds: every one (`state_dict`), or with frozen weights only the trainable."""
        if not self._frozen_params():
            return self.model.state_dict()
        return {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def _load_trainable(self, state: dict[str, torch.Tensor], path: str | Path) -> None:
        """Trainable weights of a checkpoint into the model, refused unless the names are exactly this model's
        trainable ones (another LoRA rank or target list would silently load into nothing)."""
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        if set(params) != set(state):
            missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise ValueError(
                f"{path} holds other trainable weights than this model: {len(missing)} missing (e.g. "
                f"{missing[:2]}), {len(extra)} unexpected (e.g. {extra[:2]}); resume with the adapter settings it "
                "was written with"
            )
        for name, p in params.items():
            if state[name].shape != p.shape:
                raise ValueError(f"{path}: {name} has shape {tuple(state[name].shape)}, the model {tuple(p.shape)}")
            p.copy_(state[name])

    # ---------------------------------------------------------------------------------- one round
    def update(self, round_: Round, *, step: bool | None = None) -> dict[str, Any]:
        """One round (module doc, steps 1-7). `step`: True forces the optimizer step after this round, False
        defers it, None steps once `episodes_per_step_n` episodes are accumulated. Returns the metrics row (also
        appended to the metrics log)."""
        from captain_ros_training.critic import evaluate, states_from_episodes

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
            **outcome_stats(episodes),
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


__all__ = [
    "RL_CHECKPOINT_VERSION",
    "MicroBatch",
    "RLConfig",
    "RLTrainer",
    "TrainItem",
    "agenticroborl_advantages",
    "captain_advantages",
    "combine_loss_metrics",
    "micro_batches",
    "outcome_stats",
    "sampled_token_logprobs",
    "select_items",
    "token_advantage_stats",
]

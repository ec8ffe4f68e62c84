"""Supervised fine-tuning (CaPtain §3.2 Eq. 2; AgenticRoboRL L_SFT) on packed rows from captain_ros_training.data.

    L_SFT = - sum_s w_s sum_{j in response(s)} log pi(y_{s,j} | c_s, y_{s,<j}) / sum_s |response(s)|

Only response tokens carry a loss (reasoning, code, end token: captain_ros_training.data puts them in `targets`), each
weighted by its turn/row weight w_s (Eq. 2: w_t in {0, 1}, visual QA 0.5). The denominator is AgenticRoboRL's
global token normalisation: the response tokens (of weight > 0) of ALL micro-batches of one optimizer step,
computed once before the step and passed to every micro-batch, so a micro-batch's share of the gradient does not
depend on how the step was cut into micro-batches (a per-micro-batch mean would up-weight short ones).

Packed rows keep documents apart either with the 4D block-causal mask (`attention="mask"`, SDPA or eager) or
with restarting `position_ids` alone (`attention="position_ids"`: transformers derives the same block mask, and
varlen kernels use it); both are checked against one-by-one runs in the tests. Logits are computed only at target
positions (lm_head on the selected hidden states), which keeps a 150k vocabulary affordable on long rows.

Checkpoints hold the model, optimizer, scheduler, every RNG state and the data position (optimizer steps done,
micro-batches consumed): training N steps equals training k, saving, loading and training N - k, bit for bit.
bf16 autocast on CUDA, fp32 on CPU; LoRA through peft when `lora_rank > 0`.
"""

from __future__ import annotations

import functools
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captain_ros_training.fast import FastConfig, fast_micro_batch_loss, unsupported_reason

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class SFTConfig:
    max_steps: int = 100  # optimizer steps
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    learning_rate: float = 1e-5
    warmup_steps: int = 0  # linear warm-up, then the schedule
    lr_schedule: str = "constant"  # after warm-up: "constant" | "cosine" (down to min_lr_ratio x lr at max_steps)
    min_lr_ratio: float = 0.1  # "cosine": the last step's learning rate over the peak
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # CaPtain App. C clips at 1.0; None: no clipping
    attention: str = "mask"  # "mask" (4D block-causal) | "position_ids" (packing derived from positions)
    bf16: bool = True  # autocast to bf16 on CUDA; CPU always runs fp32
    shuffle: bool = True  # a seeded permutation of the micro-batches per epoch
    seed: int = 0
    lora_rank: int = 0  # > 0: train LoRA adapters (peft) instead of all weights
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    # output rows (lm_head) trained beside the LoRA adapters (peft trainable_token_indices): rows the base never
    # trained, which LoRA cannot reach (captain_ros_training.token_rows.untrained_rows); their own, larger learning rate
    trainable_rows: tuple[int, ...] = ()
    rows_learning_rate: float = 1e-2
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0  # 0: only at the end (when checkpoint_dir is set)
    progress: bool = True
    # None: the transformers forward (logits for every position); a FastConfig: captain_ros_training.fast's path (packed
    # attention over the same weights, fused linear cross-entropy without full logits), the same loss
    fast: FastConfig | None = None


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    position: int = 0  # micro-batches consumed (the data position)


@dataclass
class SFTResult:
    model: Any
    state: TrainState
    metrics: list[dict] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ the objective
def token_denominator(micro_batches: Sequence[dict]) -> int:
    """AgenticRoboRL's global normaliser: response tokens of weight > 0 over all micro-batches of one step."""
    return int(sum(int((b["token_weights"] > 0).sum()) for b in micro_batches))


def sft_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, denominator: float) -> torch.Tensor:
    """CaPtain Eq. 2 with global token normalisation: sum_i w_i * (-log p(target_i)) / denominator.
    `logits` [N, V] at the N target positions, `targets` [N], `weights` [N]. Log-softmax runs in fp32."""
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return -(weights.float() * logp).sum() / max(float(denominator), 1.0)


def compute_dtype(model: Any, config: SFTConfig) -> torch.dtype:
    device = next(model.parameters()).device
    if device.type == "cuda" and config.bf16:
        return torch.bfloat16
    return next(model.parameters()).dtype


def target_logits(model: Any, batch: dict, config: SFTConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, targets, weights) at the positions that carry a loss, from one forward pass of a packed batch."""
    device = next(model.parameters()).device
    kwargs: dict[str, Any] = {
        "input_ids": batch["input_ids"].to(device),
        "position_ids": batch["position_ids"].to(device),
        "use_cache": False,  # with a cache, transformers would not derive packing from position_ids
    }
    if config.attention == "mask":
        kwargs["attention_mask"] = batch["attention_mask"].to(device, compute_dtype(model, config))
    elif config.attention != "position_ids":
        raise ValueError(f"attention must be 'mask' or 'position_ids', not {config.attention!r}")
    weights = batch["token_weights"].to(device)
    selected = weights > 0
    # captain_ros_training.distributed binds `selected_logits` as an FSDP2 forward method of a sharded model, so that
    # the root's weights (embedding, final norm, lm_head) are gathered around the call; a plain model runs it directly
    forward = getattr(model, SELECTED_LOGITS, None)
    logits = forward(selected, **kwargs) if callable(forward) else selected_logits(model, selected, **kwargs)
    return logits, batch["targets"].to(device)[selected], weights[selected]


SELECTED_LOGITS = "captain_selected_logits"  # the attribute captain_ros_training.distributed binds on an FSDP2 root


def selected_logits(model: Any, selected: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The decoder over a packed batch, then lm_head only at the `selected` [B, L] positions (not a full
    [B, L, vocab] logits tensor)."""
    hidden = model.get_decoder()(**kwargs).last_hidden_state
    return model.get_output_embeddings()(hidden[selected])


def micro_batch_loss(model: Any, batch: dict, denominator: float, config: SFTConfig) -> torch.Tensor:
    """This micro-batch's term of the step's loss (its weighted NLL sum over the step's denominator)."""
    if config.fast is not None:
        return fast_micro_batch_loss(model, batch, denominator, config.fast)
    device = next(model.parameters()).device
    autocast = device.type == "cuda" and config.bf16
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits, targets, weights = target_logits(model, batch, config)
    return sft_loss(logits, targets, weights, denominator)


def sft_step(model: Any, optimizer: Any, scheduler: Any, micro_batches: Sequence[dict], config: SFTConfig) -> dict:
    """One optimizer step over `micro_batches` (gradient accumulation with one global denominator)."""
    denominator = token_denominator(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for batch in micro_batches:
        loss = micro_batch_loss(model, batch, denominator, config)
        loss.backward()
        total += float(loss.detach())
    params = [p for p in model.parameters() if p.requires_grad]
    if config.max_grad_norm is not None:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
    else:
        grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    return {"loss": total, "tokens": denominator, "lr": lr, "grad_norm": grad_norm, "micro_batches": len(micro_batches)}


# ------------------------------------------------------------------------------------------------ the loop
def apply_lora(model: Any, config: SFTConfig) -> Any:
    """Wrap `model` with LoRA adapters (peft) when config.lora_rank > 0; the base weights are frozen."""
    if config.lora_rank <= 0:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("LoRA (lora_rank > 0) needs peft: pip install peft") from exc
    rows = {}
    if config.trainable_rows:
        head = model.get_output_embeddings()
        name = next(n for n, m in model.named_modules() if m is head)
        rows = {"trainable_token_indices": {name: sorted(config.trainable_rows)}}
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        task_type="CAUSAL_LM",
        **rows,
    )
    return get_peft_model(model, lora)


def make_optimizer(model: Any, config: SFTConfig) -> tuple[Any, Any]:
    """AdamW on the trainable parameters and a linear warm-up to a constant learning rate; trained output rows
    (SFTConfig.trainable_rows) at their own rate."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rows = [p for n, p in named if "trainable_tokens_delta" in n]
    params: list = [{"params": [p for n, p in named if "trainable_tokens_delta" not in n]}]
    if rows:
        params.append({"params": rows, "lr": config.rows_learning_rate})
    optimizer = torch.optim.AdamW(
        params,
        lr=config.learning_rate,
        betas=config.adam_betas,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_factor, config=config))
    return optimizer, scheduler


def lr_factor(step: int, config: SFTConfig) -> float:
    """The learning rate of optimizer step `step` (0-based) over the peak: a linear warm-up over `warmup_steps`,
    then constant, or a cosine from 1 at the first step after warm-up to `min_lr_ratio` at the last
    (`max_steps` - 1)."""
    warmup = max(config.warmup_steps, 0)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if config.lr_schedule == "constant":
        return 1.0
    if config.lr_schedule != "cosine":
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', not {config.lr_schedule!r}")
    progress = min(1.0, (step - warmup) / max(1, config.max_steps - 1 - warmup))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def batch_index(position: int, n_batches: int, config: SFTConfig) -> int:
    """Which micro-batch comes at data position `position`: epoch = position // n, a seeded permutation each."""
    epoch, offset = divmod(position, n_batches)
    if not config.shuffle:
        return offset
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
    return int(torch.randperm(n_batches, generator=generator)[offset])


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].copy()), *numpy_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore `rng_state()`. Its tensors may come back on the GPU (a checkpoint loaded with map_location="cuda");
    the generators take them on the CPU."""
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.cpu().numpy(), *rest))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def save_checkpoint(
    path: str | Path, model: Any, optimizer: Any, scheduler: Any, *, state: TrainState, config: SFTConfig
) -> Path:
    """Everything an exact resume needs, written atomically (a crash leaves the previous checkpoint)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "state": asdict(state),
        "config": asdict(config),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, model: Any, optimizer: Any, scheduler: Any) -> TrainState:
    """Restore model, optimizer, scheduler and RNG states in place; returns the data position."""
    payload = torch.load(Path(path), map_location=next(model.parameters()).device, weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    set_rng_state(payload["rng"])
    return TrainState(**payload["state"])


def train_sft(
    model: Any, batches: Sequence[dict], config: SFTConfig, resume_from: str | Path | None = None
) -> SFTResult:
    """Train `model` for config.max_steps optimizer steps on collated micro-batches (captain_ros_training.data.collate),
    config.grad_accum_steps per step, cycling through `batches` in seeded epochs. Resumes exactly from a
    checkpoint of this function. Returns the (possibly LoRA-wrapped) model, the data position and per-step metrics
    (step, loss, tokens, lr, grad_norm, micro_batches, elapsed_s)."""
    if not batches:
        raise ValueError("no micro-batches to train on")
    torch.manual_seed(config.seed)
    model = apply_lora(model, config)
    if config.fast is not None and (reason := unsupported_reason(model)):
        raise ValueError(f"SFTConfig.fast cannot train this model: {reason}")
    model.train()
    optimizer, scheduler = make_optimizer(model, config)
    state = TrainState()
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scheduler)
    metrics = run_steps(
        model, optimizer, scheduler, state, batches=batches, config=config, step_fn=sft_step, save_fn=save_checkpoint
    )
    return SFTResult(model, state, metrics)


def log_progress(desc: str, metrics: list[dict], max_steps: int, lines: int = 20) -> None:
    """Without a progress bar (logs, background runs), one line to stderr at about every 1/`lines` of the run and at
    its last step: step, loss, tokens/s and the time left at that rate."""
    row = metrics[-1]
    step, every = row["step"], max(1, max_steps // lines)
    if step % every and step != max_steps:
        return
    elapsed = row["elapsed_s"]
    tokens_per_s = sum(r["tokens"] for r in metrics) / max(elapsed, 1e-9)
    left = elapsed / len(metrics) * (max_steps - step)
    print(
        f"{desc} step {step}/{max_steps}: loss {row['loss']:.4f}, {tokens_per_s:,.0f} tokens/s, "
        f"{elapsed:.0f} s elapsed, about {left:.0f} s left",
        file=sys.stderr,
        flush=True,
    )


def run_steps(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    state: TrainState,
    *,
    batches: Sequence[dict],
    config: SFTConfig,
    step_fn: Any,
    save_fn: Any,
    show: bool = True,
    desc: str = "sft",
) -> list[dict]:
    """The SFT loop from `state` to config.max_steps (single process and FSDP2 alike): config.grad_accum_steps
    micro-batches per `step_fn` in the seeded epoch order of `batch_index`, a progress bar when `show`, and a
    `save_fn` checkpoint every config.checkpoint_every_steps and at the end (when config.checkpoint_dir is set).
    Advances `state` in place; returns the per-step metrics."""
    from tqdm import tqdm

    checkpoint = Path(config.checkpoint_dir) / "checkpoint.pt" if config.checkpoint_dir else None
    metrics = []
    t0 = time.perf_counter()
    bar = tqdm(
        total=config.max_steps, initial=state.step, disable=not (config.progress and show), desc=desc, unit="step"
    )
    while state.step < config.max_steps:
        positions = range(state.position, state.position + config.grad_accum_steps)
        micro = [batches[batch_index(p, len(batches), config)] for p in positions]
        row = step_fn(model, optimizer, scheduler, micro, config)
        state.step += 1
        state.position += config.grad_accum_steps
        row = {"step": state.step, **row, "elapsed_s": time.perf_counter() - t0}
        metrics.append(row)
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.4f}", tokens=row["tokens"], lr=f"{row['lr']:.2e}")
        if show and not config.progress:
            log_progress(desc, metrics, config.max_steps)
        every = config.checkpoint_every_steps
        if checkpoint is not None and ((every and state.step % every == 0) or state.step == config.max_steps):
            save_fn(checkpoint, model, optimizer, scheduler, state=state, config=config)
    bar.close()
    return metrics

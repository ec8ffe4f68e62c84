"""SFT on several GPUs with FSDP2 (torch.distributed.fsdp.fully_shard) under torchrun (issue 12: "several GPUs
through an existing engine"): the objective, the data order and the checkpoints of captain_ros_training.sft, sharded.

    torchrun --nproc-per-node 2 -m captain_ros_training rl sft --fsdp --store S --out O --model M --grad-accum 8

Every rank holds a shard of each weight, gradient and AdamW moment: `fully_shard` on each decoder layer, then on
the root (embedding, final norm, lm_head). One optimizer step takes the same G micro-batches train_sft would (the
seeded epoch order of sft.batch_index) and cuts them into W contiguous slices, one per rank. Two things make the
step's gradient the single-process one, up to fp32 summation order:

  * the loss denominator is the GLOBAL count of response tokens over all ranks' micro-batches, all-reduced before
    the step (CaPtain Eq. 2 with AgenticRoboRL's global token normalisation), so a rank's micro-batch carries the
    same share of the gradient as it would in one process;
  * FSDP's gradient reduce-scatter SUMS the ranks' gradients (divide factor 1) instead of averaging them.

Clipping uses the global norm (clip_grad_norm_ reduces over DTensor shards). When W does not divide G, a rank with
one micro-batch fewer runs a zero-weight copy of one (no loss, zero gradient), because every rank must issue the
same all-gathers and reduce-scatters. On CUDA with bf16, MixedPrecisionPolicy gathers and computes the weights in
bf16 and reduces gradients in fp32 onto fp32 master shards; CPU runs fp32 over gloo (the tests).

Checkpoints are train_sft's file (`checkpoint_dir/checkpoint.pt`, written atomically by rank 0) with the model
and optimizer as full state dicts keyed by parameter name (gathered to rank 0's CPU), the scheduler, every rank's
RNG state and the data position; on resume every rank reads the file and keeps its shards. N steps equal k steps,
saving, loading on the same number of ranks, and N - k, bit for bit (tests/training/test_distributed.py).
Rank 0 alone prints progress and returns metrics; `full_model_state` gathers the weights for a servable folder.
Not covered: LoRA and SFTConfig.fast (it reads weights outside the module calls FSDP hooks) are refused.
"""

from __future__ import annotations

import functools
import io
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from captain_ros_training.sft import (
    SELECTED_LOGITS,
    SFTConfig,
    SFTResult,
    TrainState,
    make_optimizer,
    micro_batch_loss,
    rng_state,
    run_steps,
    selected_logits,
    set_rng_state,
    token_denominator,
)

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job torchrun started."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# ---------------------------------------------------------------------------------------------------- process group
def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_ENV)


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): NCCL with
    GPU `LOCAL_RANK` on CUDA, gloo on CPU. `device`: 'auto' (CUDA when available), 'cuda' or 'cpu'."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"FSDP training needs the environment torchrun sets ({', '.join(missing)} missing): launch with "
            "`torchrun --nproc-per-node N -m captain_ros_training rl sft --fsdp ...`"
        )
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device.partition(":")[0]
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA device")
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices on this host")
        torch.cuda.set_device(local)
        where = torch.device("cuda", local)
    elif kind == "cpu":
        where = torch.device("cpu")
    else:
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', not {device!r}")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if kind == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s))
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError("the initialised process group disagrees with RANK / WORLD_SIZE")
    return DistInfo(rank, world, local, where)


_THIS_PROCESS = {"left_a_group": False}  # set by shutdown: this process was a rank of a process group


def shutdown() -> None:
    """Leave the process group (after a barrier, so no rank exits while another still talks to it)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _THIS_PROCESS["left_a_group"] = True


def exit_process(code: int) -> NoReturn:
    """End the process with `code`. A rank that has left its process group ends at once after flushing its output
    (os._exit), skipping the C++ static destructors: on torch 2.13 (CPU, gloo) about one rank in twenty otherwise
    aborts after Python has finished ("terminate called without an active exception", SIGABRT with no Python
    frame), which torchrun reports as a failed run though every result was written. Anything else exits normally."""
    if not _THIS_PROCESS["left_a_group"]:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def all_reduce_sum(value: float, device: torch.device) -> float:
    """The sum of a number over all ranks (float64 on the wire: token counts and loss sums stay exact enough)."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def all_gather_tensors_object(obj: Any) -> list[Any]:
    """Every rank's `obj` (tensors inside allowed), in rank order. Through torch.save bytes: all_gather_object's
    own pickling of CPU tensors fails to unpickle in torch 2.13."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, buffer.getvalue())
    return [torch.load(io.BytesIO(b), weights_only=True) for b in gathered]


# ---------------------------------------------------------------------------------------------------- sharding
def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks (`model.get_decoder().layers`), each one FSDP unit."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None or not len(layers):
        raise ValueError(f"{type(model).__name__} has no decoder layers at get_decoder().layers to shard")
    return list(layers)


def shard_model(model: Any, *, bf16: bool = True) -> Any:
    """FSDP2 in place: fully_shard on every decoder layer, then on the root; gradients SUMMED over ranks (module
    doc); bf16 weights / fp32 reduction on CUDA when `bf16`, fp32 otherwise. `model` must already sit on this
    rank's device. Binds sft.selected_logits as an FSDP forward method of the root, so that sft.target_logits
    (which calls the decoder and lm_head, not model.forward) runs with the root's weights gathered."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if not dist.is_initialized():
        raise RuntimeError("shard_model needs a process group: call init_distributed() first")
    if hasattr(model, "peft_config"):
        raise ValueError("FSDP training of LoRA adapters is not supported: train all weights (lora_rank=0)")
    device = next(model.parameters()).device
    if dist.get_backend() == "nccl" and device.type != "cuda":
        raise ValueError(f"the model sits on {device}, NCCL needs it on this rank's GPU: model.to(info.device) first")
    if device.type == "cuda" and bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for module in (*layers, model):
        assert isinstance(module, FSDPModule)
        module.set_gradient_divide_factor(1.0)  # sum, not mean: the loss already carries the global denominator
        module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has neither AVG nor PREMUL_SUM)
    setattr(model, SELECTED_LOGITS, functools.partial(selected_logits, model))
    register_fsdp_forward_method(model, SELECTED_LOGITS)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_model_state(model: Any) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on CPU, on rank 0; an empty dict on the other ranks. Every rank must call
    it (it gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def unsharded_copy(model: Any) -> Any:
    """On rank 0, a plain CPU model of the same class and config holding the gathered weights (for
    weight_sync.write_model_folder); None on the other ranks. Every rank must call it."""
    state = full_model_state(model)
    if dist.get_rank() != 0:
        return None
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(state, strict=False, assign=True)
    plain.tie_weights()
    missing = [name for name, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"gathered state dict lacks {missing[:5]}")
    return plain.eval()


# ---------------------------------------------------------------------------------------------------- one step
def rank_slice(micro_batches: Sequence[dict], rank: int, world_size: int) -> tuple[list[dict], int]:
    """This rank's contiguous slice of the step's micro-batches, padded to ceil(G / W) with zero-weight copies
    (module doc); returns (slice, how many of them are real)."""
    if not micro_batches:
        raise ValueError("an optimizer step needs at least one micro-batch")
    per_rank = -(-len(micro_batches) // world_size)
    real = list(micro_batches[rank * per_rank : (rank + 1) * per_rank])
    pad = {**micro_batches[0], "token_weights": torch.zeros_like(micro_batches[0]["token_weights"])}
    return real + [pad] * (per_rank - len(real)), len(real)


def fsdp_sft_step(model: Any, optimizer: Any, scheduler: Any, micro_batches: Sequence[dict], config: SFTConfig) -> dict:
    """sft.sft_step over ALL of the step's `micro_batches` (the same list on every rank), of which this rank runs
    its slice: global denominator, summed gradients, global-norm clipping. Returns the step's global metrics."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = next(model.parameters()).device
    local, _ = rank_slice(micro_batches, rank, world)
    denominator = int(all_reduce_sum(token_denominator(local), device))  # padding copies weigh 0: not counted
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for batch in local:
        loss = micro_batch_loss(model, batch, denominator, config)
        loss.backward()
        total += float(loss.detach())
    total = all_reduce_sum(total, device)
    params = [p for p in model.parameters() if p.requires_grad]
    if config.max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    return {"loss": total, "tokens": denominator, "lr": lr, "grad_norm": grad_norm, "micro_batches": len(micro_batches)}


# ---------------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(
    path: str | Path, model: Any, optimizer: Any, scheduler: Any, *, state: TrainState, config: SFTConfig
) -> Path:
    """sft.save_checkpoint for a sharded model: full model and optimizer state gathered to rank 0's CPU, every
    rank's RNG state; rank 0 writes atomically. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    rngs = all_gather_tensors_object(rng_state())
    path = Path(path)
    if dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": model_state,
            "optimizer": optim_state,
            "scheduler": scheduler.state_dict(),
            "rng": rngs,
            "world_size": dist.get_world_size(),
            "state": asdict(state),
            "config": asdict(config),
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, path)
    dist.barrier()  # no rank goes on (or exits) before the file is complete
    return path


def load_checkpoint(path: str | Path, model: Any, optimizer: Any, scheduler: Any) -> TrainState:
    """Restore a checkpoint of `save_checkpoint` into a sharded model on the same number of ranks: every rank reads
    the file and keeps its shards, its optimizer state, the scheduler and its own RNG state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    payload = torch.load(Path(path), map_location="cpu", weights_only=True)
    if "world_size" not in payload:
        raise ValueError(f"{path} is a single-process checkpoint of captain_ros_training.sft: resume it with train_sft")
    if payload["world_size"] != dist.get_world_size():
        raise ValueError(
            f"{path} was written by {payload['world_size']} ranks, this job has {dist.get_world_size()}: the RNG "
            "streams and the micro-batch slices would differ"
        )
    set_state_dict(
        model,
        optimizer,
        model_state_dict=payload["model"],
        optim_state_dict=payload["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )
    scheduler.load_state_dict(payload["scheduler"])
    set_rng_state(payload["rng"][dist.get_rank()])
    return TrainState(**payload["state"])


# ---------------------------------------------------------------------------------------------------- the loop
def train_sft_fsdp(
    model: Any, batches: Sequence[dict], config: SFTConfig, resume_from: str | Path | None = None
) -> SFTResult:
    """sft.train_sft on every rank of a torchrun job (init_distributed first): `model` on this rank's device is
    sharded in place, every rank gets the same `batches` and runs its slice of each step. Returns the sharded
    model, the data position and (on rank 0; empty elsewhere) the per-step metrics, which equal train_sft's on
    the same batches up to fp32 summation order."""
    if not dist.is_initialized():
        raise RuntimeError("train_sft_fsdp runs inside a process group: call init_distributed() under torchrun")
    if not batches:
        raise ValueError("no micro-batches to train on")
    if config.lora_rank > 0:
        raise ValueError("FSDP training of LoRA adapters is not supported: set lora_rank=0")
    if config.fast is not None:
        raise ValueError("SFTConfig.fast reads weights outside the module calls FSDP gathers them in: use fast=None")
    main = dist.get_rank() == 0
    torch.manual_seed(config.seed)
    if not is_sharded(model):
        shard_model(model, bf16=config.bf16)
    model.train()
    optimizer, scheduler = make_optimizer(model, config)
    state = TrainState()
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scheduler)
    metrics = run_steps(
        model, optimizer, scheduler, state, batches=batches, config=config,
        step_fn=fsdp_sft_step, save_fn=save_checkpoint, show=main, desc="sft-fsdp",
    )  # fmt: skip
    if not main:
        metrics = []  # rank 0 reports
    return SFTResult(model, state, metrics)


__all__ = [
    "DistInfo",
    "all_gather_tensors_object",
    "all_reduce_sum",
    "decoder_layers",
    "fsdp_sft_step",
    "full_model_state",
    "init_distributed",
    "is_sharded",
    "launched_by_torchrun",
    "load_checkpoint",
    "rank_slice",
    "save_checkpoint",
    "shard_model",
    "shutdown",
    "train_sft_fsdp",
    "unsharded_copy",
]

"""The `sft-data` and `sft` commands of `python -m captain_ros_training rl` (their options and help:
captain_ros_training.cli.rl_cli): build a store's SFT examples once into one file, and supervised fine-tuning (CaPtain
Eq. 2) on a store or on such a file, written as a servable folder (with LoRA, also the adapter alone), a metrics log and
a run record. `load_policy` and `resolve_device` serve the `rl` command too (captain_ros_training.rl_command)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from captain_ros_training.data import Example, pack_examples
from captain_ros_training.metrics_log import append_metrics


def load_policy(path: str | None, tiny: bool) -> tuple[Any, Any]:
    """(model, tokenizer) from a transformers folder, or the tiny Qwen2 (captain_ros_training.tiny) with --tiny. A
    folder whose tokenizer or chat template cannot train the stack is refused with the reasons
    (captain_ros_training.student)."""
    if tiny:
        from captain_ros_training.tiny import tiny_model, tiny_tokenizer

        return tiny_model(), tiny_tokenizer()
    if not path:
        raise SystemExit("give --model DIR (a transformers folder) or --tiny")
    from transformers import AutoModelForCausalLM

    from captain_ros_training.student import StudentError, check_model_folder

    try:
        tokenizer = check_model_folder(Path(path))
    except StudentError as exc:
        raise SystemExit(str(exc)) from None
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


def resolve_device(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def _fast_applies(model: Any, args: argparse.Namespace) -> bool:
    """captain_ros_training.fast computes the same loss over the same weights for Qwen2-shaped models on a GPU, all
    weights or LoRA adapters (the CLI's have no dropout) alike (captain_ros_training.fast.unsupported_reason: Qwen2, no
    sliding window); other architectures take the transformers forward."""
    from captain_ros_training.fast import unsupported_reason

    return torch.cuda.is_available() and unsupported_reason(model) is None


def _write_sft_outputs(out: Path, served: Any, tokenizer: Any, *, result: Any, config: Any, run: dict) -> None:
    """The SFT run's outputs: metrics, the servable folder (with LoRA, also the adapter alone), the run record."""
    import platform

    from captain_ros_training.weight_sync import write_model_folder

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
    from captain_ros_training.data import DataConfig

    return DataConfig(
        seed=args.seed,
        whole_episodes=not args.per_request,
        strict_success=not args.keep_missed_finish,  # a solved scene without finish() would teach not finishing
        max_trajectory_tokens=args.max_tokens,
        recovery_per_episode=args.recovery_per_episode,
    )


def _sft_data(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """The SFT examples: from --examples (a file of `sft-data`, checked against this tokenizer and these options),
    else built from --store (the prompt gate over every request, then `captain_ros_training.data.sft_examples`)."""
    from captain_ros_training.data import SFTDataMismatch, TrajectoryStats, load_sft_data, sft_examples

    config = _data_config(args)
    if getattr(args, "examples", None) and args.store:
        raise SystemExit("give --store or --examples, not both")
    if getattr(args, "examples", None):
        try:
            return load_sft_data(args.examples, tokenizer, config)
        except (OSError, SFTDataMismatch) as exc:
            raise SystemExit(f"--examples: {exc}") from None
    if not args.store:
        raise SystemExit(
            "give --store (an episode store) or --examples (a file of `python -m captain_ros_training rl sft-data`)"
        )
    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.gate import gate_episodes

    reader = EpisodeReader(args.store)
    gate = gate_episodes(tokenizer, reader)
    stats = TrajectoryStats()
    examples = sft_examples(tokenizer, reader, config=config, gate=gate, stats=stats)
    return {"source": str(args.store), "gate": gate, "stats": stats, "examples": examples}


def _untrained_target_rows(model: Any, tokenizer: Any, examples: Sequence[Example], trainable: bool) -> list[int]:
    """The output rows of target tokens the base never trained (captain_ros_training.token_rows.untrained_rows): LoRA
    leaves lm_head frozen, so without training them beside the adapters no hidden state can single those tokens out."""
    from captain_ros_training.token_rows import untrained_rows

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
            "leaves them frozen, so it cannot teach writing them: fit them afterwards "
            "(python -m captain_ros_training token-rows fit)",
            file=sys.stderr,
        )
    return free if trainable else []


def _with_dagger(args: argparse.Namespace, tokenizer: Any, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the expert-labelled states of the student stores in --dagger added (captain_ros_training.dagger); the
    record's source names the stores and the stats count what was labelled."""
    from captain_ros_training.dagger import DaggerStats, NotATrainingEpisode, store_dagger_examples

    stats = DaggerStats()
    extra = []
    for store in args.dagger:
        if not Path(store).is_file():
            raise SystemExit(f"--dagger {store}: no such episode store")
        try:
            extra += store_dagger_examples(
                tokenizer, store, per_episode=args.dagger_per_episode, max_tokens=args.max_tokens,
                render=_data_config(args).render, stats=stats,
            )  # fmt: skip
        except NotATrainingEpisode as exc:
            raise SystemExit(f"--dagger {store}: {exc}") from None
    print(stats, file=sys.stderr)
    data["stats"].dagger_examples = stats.examples
    source = f"{data['source']} + DAgger labels of {', '.join(map(str, args.dagger))} ({stats})"
    return {**data, "source": source, "examples": data["examples"] + extra}


def cmd_sft_data(args: argparse.Namespace) -> int:
    """Build the SFT examples of a store once (here, on CPU) and write them to one file that `sft --examples` reads:
    a GPU host then spends no time rendering and gating thousands of long prompts. With --examples instead of
    --store it starts from such a file (to add --dagger labels where the store is not)."""
    from captain_ros_training.data import save_sft_data

    if args.tiny:
        from captain_ros_training.tiny import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    elif args.model:
        from captain_ros_training.student import StudentError, check_model_folder

        try:
            tokenizer = check_model_folder(Path(args.model))
        except StudentError as exc:
            raise SystemExit(str(exc)) from None
    else:
        raise SystemExit("give --model DIR (a transformers folder) or --tiny")
    t0 = time.perf_counter()
    data = {k: v for k, v in _sft_data(args, tokenizer).items() if k in ("source", "gate", "stats", "examples")}
    if args.dagger:
        data = _with_dagger(args, tokenizer, data)
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
    from captain_ros_training.data import MicroBatches
    from captain_ros_training.fast import FastConfig
    from captain_ros_training.sft import SFTConfig as Config
    from captain_ros_training.sft import train_sft

    dist_info = None
    if args.fsdp:  # one process per GPU under torchrun (captain_ros_training.distributed)
        from captain_ros_training.distributed import init_distributed

        dist_info = init_distributed(args.device)
    main = dist_info is None or dist_info.is_main
    out = Path(args.out)
    model, tokenizer = load_policy(args.model, args.tiny)
    model.to(dist_info.device if dist_info else resolve_device(args.device))
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
        path = (
            "captain_ros_training.fast (packed attention, fused linear cross-entropy)"
            if fast
            else "the transformers forward"
        )
        lora = f"LoRA rank {config.lora_rank}" if config.lora_rank else "all weights"
        print(
            f"training {len(rows)} rows in {len(batches)} micro-batches, {steps} steps, {lora}, {path}", file=sys.stderr
        )
    t0 = time.perf_counter()
    if dist_info is None:
        result = train_sft(model, batches, config)
        served = result.model
    else:
        from captain_ros_training.distributed import shutdown, train_sft_fsdp, unsharded_copy

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


__all__ = ["cmd_sft", "cmd_sft_data", "load_policy", "resolve_device"]

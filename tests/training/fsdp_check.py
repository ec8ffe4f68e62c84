"""FSDP2 SFT (captain_ros_training.distributed) against single-process train_sft, on CPU/gloo or on GPUs/NCCL. Not a
pytest module: tests/training/test_distributed.py launches it on CPU; on a GPU host run

    torchrun --nproc-per-node 2 tests/training/fsdp_check.py --device cuda

It trains a freshly built Qwen2 (captain_ros_training.tiny: no download; --hidden/--layers make it larger) on seeded
synthetic token ids, three ways on all ranks: K steps straight, k steps + checkpoint + resume to K (from another init),
and, on rank 0 alone, train_sft on one device. fp32: the FSDP losses and weights must equal the single-process ones up
to fp32 summation order, and the resumed run the straight one. bf16 (CUDA only, MixedPrecisionPolicy against
autocast, whose residual stream stays fp32): losses within a looser tolerance, and the loss must fall. Rank 0
prints a table and PASS or FAIL, writes results.json (and the final weights) to --out, and exits 1 on FAIL.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

PAD = 0


def make_batches(n_batches: int = 6, rows: int = 2, seed: int = 0, vocab: int = 2000) -> list[dict]:
    """Seeded synthetic documents (random ids, a prompt then a response) packed into `n_batches` micro-batches of
    `rows` rows each; lengths vary so that micro-batches carry different numbers of target tokens."""
    from captain_ros_training import data
    from captain_ros_training.data import Example

    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        examples = []
        for _ in range(rows):
            n = int(torch.randint(12, 48, (1,), generator=g))
            prompt = int(torch.randint(2, n // 2, (1,), generator=g))
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            examples.append(Example(ids, [i >= prompt for i in range(n)], 1.0, prompt))
        packed, too_long = data.pack_examples(examples, 64)
        assert not too_long
        batches.append(data.collate(packed, PAD))
    return batches


def sft_config(args: argparse.Namespace, **overrides) -> object:
    from captain_ros_training.sft import SFTConfig

    base = dict(
        max_steps=args.steps,
        grad_accum_steps=args.grad_accum,
        learning_rate=args.lr,
        warmup_steps=1,
        seed=7,
        shuffle=True,
        progress=False,
        bf16=False,
    )
    return SFTConfig(**{**base, **overrides})


def model_config(args: argparse.Namespace, seed: int = 0) -> object:
    from captain_ros_training.tiny import TinyModelConfig

    heads = max(2, args.hidden // 16)
    return TinyModelConfig(
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=16,
        seed=seed,
    )


def max_diff(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        raise AssertionError(f"state dict keys differ: {sorted(set(a) ^ set(b))[:5]}")
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def update_rel_diff(a: dict, b: dict, init: dict) -> float:
    """||a - b|| / ||b - init|| over all weights: how far apart two runs' weight updates are, relative to the
    update. Robust to the odd near-zero gradient whose sign GPU atomics flip (AdamW turns it into a full step)."""
    num = sum(float((a[k].double().cpu() - b[k].double().cpu()).pow(2).sum()) for k in b)
    den = sum(float((b[k].double().cpu() - init[k].double().cpu()).pow(2).sum()) for k in b)
    return (num / max(den, 1e-30)) ** 0.5


def rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from captain_ros_training import distributed
    from captain_ros_training.sft import train_sft
    from captain_ros_training.tiny import tiny_model

    info = distributed.init_distributed(args.device)
    out = Path(args.out or tempfile.mkdtemp(prefix="fsdp-check-"))
    batches = make_batches(args.batches)
    ckpt_dir = out / "checkpoint"
    precisions = ["fp32"] + (["bf16"] if info.device.type == "cuda" and args.bf16 else [])
    results: dict = {"world_size": info.world_size, "device": str(info.device), "torch": torch.__version__}
    failures = []
    for precision in precisions:
        bf16 = precision == "bf16"
        config = sft_config(args, bf16=bf16)
        straight = distributed.train_sft_fsdp(tiny_model(model_config(args)).to(info.device), batches, config)
        straight_state = distributed.full_model_state(straight.model)
        row: dict = {"fsdp_loss": [m["loss"] for m in straight.metrics]}
        if not bf16:  # resume: k steps, checkpoint, a new process state from another init, K - k more
            first = sft_config(args, max_steps=args.resume_at, checkpoint_dir=str(ckpt_dir))
            distributed.train_sft_fsdp(tiny_model(model_config(args)).to(info.device), batches, first)
            other = tiny_model(model_config(args, seed=3)).to(info.device)
            resumed = distributed.train_sft_fsdp(other, batches, config, resume_from=ckpt_dir / "checkpoint.pt")
            resumed_state = distributed.full_model_state(resumed.model)
            if info.is_main:
                row["resumed_loss"] = [m["loss"] for m in resumed.metrics]
                row["resume_max_abs_param_diff"] = max_diff(resumed_state, straight_state)
                row["resume_losses_equal"] = row["resumed_loss"] == row["fsdp_loss"][args.resume_at :]
                torch.save(straight_state, out / "fsdp_state.pt")
                torch.save(resumed_state, out / "resumed_state.pt")
        if info.is_main:
            single = train_sft(tiny_model(model_config(args)).to(info.device), batches, config)
            row["single_loss"] = [m["loss"] for m in single.metrics]
            row["fsdp_grad_norm"] = [m["grad_norm"] for m in straight.metrics]
            row["single_grad_norm"] = [m["grad_norm"] for m in single.metrics]
            row["loss_max_rel_diff"] = rel_diff(row["fsdp_loss"], row["single_loss"])
            row["grad_norm_max_rel_diff"] = rel_diff(row["fsdp_grad_norm"], row["single_grad_norm"])
            single_state = {k: v.detach() for k, v in single.model.state_dict().items()}
            row["max_abs_param_diff"] = max_diff(straight_state, single_state)
            init = tiny_model(model_config(args)).state_dict()
            row["update_rel_diff"] = update_rel_diff(straight_state, single_state, init)
            if bf16:
                ok = row["loss_max_rel_diff"] < args.bf16_rtol and row["fsdp_loss"][-1] < row["fsdp_loss"][0]
            else:
                ok = (
                    row["loss_max_rel_diff"] < args.rtol
                    and row["grad_norm_max_rel_diff"] < 10 * args.rtol
                    and row["update_rel_diff"] < args.update_rtol
                    and row["resume_losses_equal"]
                    and row["resume_max_abs_param_diff"] == 0.0
                )
            row["pass"] = bool(ok)
            if not ok:
                failures.append(precision)
        results[precision] = row
        dist.barrier()
    code = 0
    if info.is_main:
        results["pass"] = not failures
        (out / "results.json").write_text(json.dumps(results, indent=2))
        print(f"FSDP2 on {info.world_size} ranks ({info.device.type}, torch {torch.__version__}) vs one process:")
        for precision in precisions:
            r = results[precision]
            print(f"  {precision}: step losses fsdp   {' '.join(f'{x:.6f}' for x in r['fsdp_loss'])}")
            print(f"  {precision}: step losses single {' '.join(f'{x:.6f}' for x in r['single_loss'])}")
            print(
                f"  {precision}: loss max rel diff {r['loss_max_rel_diff']:.2e}, grad-norm max rel diff "
                f"{r['grad_norm_max_rel_diff']:.2e}, weights max abs diff {r['max_abs_param_diff']:.2e}, "
                f"update rel L2 diff {r['update_rel_diff']:.2e}"
            )
            if "resume_max_abs_param_diff" in r:
                print(
                    f"  {precision}: resume after {args.resume_at}: losses equal {r['resume_losses_equal']}, "
                    f"weights max abs diff {r['resume_max_abs_param_diff']:.2e}"
                )
        print(("PASS" if not failures else f"FAIL ({', '.join(failures)})") + f"  (results in {out})")
        code = 1 if failures else 0
    distributed.shutdown()
    return code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="'auto', 'cuda' or 'cpu'")
    p.add_argument("--out", default="", help="folder for results.json and weights (default: a temp folder)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps K")
    p.add_argument("--resume-at", type=int, default=2, help="k: checkpoint after k steps, resume to K")
    p.add_argument("--grad-accum", type=int, default=3, help="micro-batches per step (3 on 2 ranks: one padded)")
    p.add_argument("--batches", type=int, default=5, help="micro-batches in the data set (epochs reshuffle)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64, help="hidden size of the Qwen2 built from a config")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="on CUDA, skip the bf16 comparison")
    p.add_argument("--rtol", type=float, default=1e-4, help="fp32: step losses, relative")
    p.add_argument("--update-rtol", type=float, default=1e-3, help="fp32: ||w_fsdp - w_single|| / ||w_single - w_0||")
    p.add_argument("--bf16-rtol", type=float, default=3e-2, help="bf16: step losses, relative")
    args = p.parse_args(argv)
    if not 0 < args.resume_at < args.steps:
        p.error("--resume-at must lie strictly between 0 and --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    from captain_ros_training.distributed import exit_process

    exit_process(main())

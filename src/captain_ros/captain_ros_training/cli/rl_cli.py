"""`python -m captain_ros_training rl {sft-data,sft,rl,plot}` (argparse subcommands): their options, defaults and help,
and the dispatch. The commands' work is in their own modules: `sft-data` and `sft` in captain_ros_training.sft_command,
`rl` in captain_ros_training.rl_command (over captain_ros_training.rl_trainer, the RL update), `plot` in
captain_ros_training.metrics_log. Several GPUs: `torchrun ... -m captain_ros_training rl sft --fsdp`
(captain_ros_training.distributed)."""

from __future__ import annotations

import argparse
from typing import Any

from captain_ros_training.metrics_log import PLOT_KEYS, plot_metrics
from captain_ros_training.rl_command import cmd_rl
from captain_ros_training.sft_command import cmd_sft, cmd_sft_data


def cmd_plot(args: argparse.Namespace) -> int:
    print(plot_metrics(args.metrics, args.out, args.keys.split(",") if args.keys else PLOT_KEYS))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m captain_ros_training rl",
        description="The captain_ros trainer: SFT on recorded twin episodes, then critic-credited RL rounds whose "
        "new weights reach a running vLLM policy server (CaPtain §3.2-3.3; issue 12).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, store_required: bool = True) -> None:
        p.add_argument("--store", required=store_required, help="episode store (SQLite) the rollouts shipped to")
        p.add_argument("--out", required=True, help="output folder (model, metrics, checkpoints)")
        p.add_argument("--model", help="transformers folder of the policy to train")
        p.add_argument(
            "--tiny", action="store_true", help="use the tiny Qwen2 of captain_ros_training.tiny (tests, CPU)"
        )
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
    data.add_argument("--store", help="episode store (SQLite) of the episodes to imitate")
    data.add_argument(
        "--examples",
        help="instead of --store: a file of `sft-data` (built with this tokenizer and these options) to start from, "
        "e.g. to add --dagger labels on a GPU host that holds the file but not the store",
    )
    data.add_argument("--out", required=True, help="the file to write (e.g. sft_data.pkl.xz)")
    data.add_argument("--model", help="transformers folder whose tokenizer and chat template render the examples")
    data.add_argument("--tiny", action="store_true", help="the tiny Qwen2's tokenizer (tests)")
    data.add_argument("--max-tokens", type=int, default=16384, help="tokens per packed row (as the sft run's)")
    data.add_argument("--seed", type=int, default=0)
    data_options(data)
    data.add_argument(
        "--dagger",
        action="append",
        default=[],
        metavar="STORE",
        help="a store of the student's own episodes on training starts (`python -m captain_ros_training student-eval "
        "run --split train`); each state where it left the expert's path is labelled with the expert's next cell "
        "(captain_ros_training.dagger) and added to the examples; may be given more than once",
    )
    data.add_argument(
        "--dagger-per-episode",
        type=_count,
        default=4,
        help="with --dagger: at most this many labelled states per episode",
    )
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
        "never trained, found by captain_ros_training.token_rows (default 1e-2)",
    )
    sft.add_argument(
        "--no-fast", action="store_true", help="the transformers forward even where captain_ros_training.fast applies"
    )
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
        help="FSDP2 across the ranks of `torchrun --nproc-per-node N -m captain_ros_training rl sft --fsdp` "
        "(captain_ros_training.distributed)",
    )
    sft.set_defaults(func=cmd_sft)

    rl = sub.add_parser(
        "rl", help="RL rounds on a store (CaPtain Eq. 8-10)", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    common(rl)
    rl.add_argument("--ref", help="frozen SFT model for the k3 KL; absent: --model")
    rl.add_argument(
        "--critic", help="critic checkpoint (captain_ros_training.critic); absent: a warm start (see below)"
    )
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


__all__ = ["main", "parser"]

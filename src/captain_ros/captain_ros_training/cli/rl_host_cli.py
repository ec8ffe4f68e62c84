"""`python -m captain_ros_training rl-host run|export`: RL rounds on a GPU host in one resumable process tree, or a
checkpoint's adapter as a peft folder (captain_ros_training.rl_host)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from captain_ros_training import rl_host
from captain_ros_training.rl_host import HostRLConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m captain_ros_training rl-host",
        description=rl_host.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="serve, roll out, train and sync in one process until --rounds-n rounds (or a signal)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run.add_argument("--model", type=Path, required=True, help="the SFT student's merged folder (policy v0, KL ref)")
    run.add_argument("--out", type=Path, required=True, help="the run folder (served/, sessions/, checkpoints/)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out (or --resume-from)")
    run.add_argument(
        "--resume-from",
        type=Path,
        help="a checkpoint folder carried from another host (round-NNNNN/ or a run folder); with --resume, the "
        "newer of it and --out's own",
    )
    for f in fields(HostRLConfig):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            name = f"--no-{f.name.replace('_', '-')}" if f.default else flag
            run.add_argument(name, dest=f.name, action="store_false" if f.default else "store_true",
                             help=("turn off: " if f.default else "") + f.metadata["help"])  # fmt: skip
        else:
            run.add_argument(
                flag,
                type=type(f.default),
                default=f.default,
                help=("turn off: " if f.default else "") + f.metadata["help"],
            )
    export = sub.add_parser("export", help="a checkpoint's adapter as a peft folder (for student merge)")
    export.add_argument("--checkpoint", type=Path, required=True, help="RUN/checkpoints/round-NNNNN")
    export.add_argument("--model", type=Path, required=True, help="the SFT folder it was trained on")
    export.add_argument("--out", type=Path, required=True, help="the adapter folder to write")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "export":
        print(rl_host.export_adapter(args.checkpoint, args.model, args.out))
        return 0
    try:
        config = HostRLConfig(**{f.name: getattr(args, f.name) for f in fields(HostRLConfig)})
        config.task_list()
    except ValueError as exc:
        raise SystemExit(f"[rl-host] {exc}") from None
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"[rl-host] {args.model} is not a model folder (no config.json)")
    try:
        return rl_host.HostRL(config, args.model, args.out, resume=args.resume, resume_from=args.resume_from).run()
    except rl_host.HostRLError as exc:
        print(f"[rl-host] ERROR: {exc}", file=sys.stderr, flush=True)
        return 1

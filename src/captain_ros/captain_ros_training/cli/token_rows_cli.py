"""`python -m captain_ros_training token-rows fit|apply`: fit the output rows the base never trained to a fine-tuned
folder, or put fitted rows into another (captain_ros_training.token_rows)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captain_ros_training import token_rows
from captain_ros_training.token_rows import ROWS_FILE, FitConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m captain_ros_training token-rows",
        description=token_rows.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit the untrained output rows the SFT targets; write a new model folder")
    fit.add_argument("--model", type=Path, required=True, help="the fine-tuned (merged) model folder")
    fit.add_argument("--examples", type=Path, required=True, help="the SFT data file (`rl sft-data`)")
    fit.add_argument("--out", type=Path, required=True, help="the folder to write (a copy with the fitted rows)")
    fit.add_argument("--n-examples", type=int, default=FitConfig.examples, help="examples used (the last held out)")
    fit.add_argument("--held-out", type=int, default=FitConfig.held_out, help="examples only evaluated")
    fit.add_argument("--prefix-tokens", type=int, default=FitConfig.prefix_tokens, help="tokens of each example")
    fit.add_argument("--steps", type=int, default=FitConfig.steps, help="Adam steps on the cached hidden states")
    apply = sub.add_parser("apply", help="put fitted rows (token_rows.npz) into a model folder's lm_head")
    apply.add_argument("--model", type=Path, required=True, help="the folder, e.g. the adapter merged into the student")
    apply.add_argument("--rows", type=Path, required=True, help=f"the {ROWS_FILE} that `fit` wrote")
    apply.add_argument("--out", type=Path, required=True, help="the folder to write")
    args = parser.parse_args(argv)
    if args.command == "apply":
        print(f"rows of {args.rows} put into {args.model}: {token_rows.apply_rows(args.model, args.rows, args.out)}")
        return 0
    config = FitConfig(
        examples=args.n_examples, prefix_tokens=args.prefix_tokens, steps=args.steps, held_out=args.held_out
    )
    report = token_rows.fit_folder(args.model, args.examples, args.out, config)
    for name, stats in (
        ("fitted examples", (report.before, report.after)),
        ("held out", (report.held_out_before, report.held_out_after)),
    ):
        b, a = stats
        print(
            f"{name}: NLL of the {b['free_targets']} targets on fitted rows {b['nll_free_targets']:.3f} -> "
            f"{a['nll_free_targets']:.3f}; of the other {b['positions'] - b['free_targets']} targets "
            f"{b['nll_other_targets']:.4f} -> {a['nll_other_targets']:.4f}"
        )
    print(f"rows {report.free_tokens} fitted in {report.seconds:.0f} s -> {args.out}", file=sys.stderr)
    return 0

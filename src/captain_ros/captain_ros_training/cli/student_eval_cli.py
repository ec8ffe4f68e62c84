"""`python -m captain_ros_training student-eval run`: one model folder's evaluation on the twin's held-out starts
(captain_ros_training.student_eval.evaluate), resumable, then its success rates."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from captain_ros_training import student_eval
from captain_ros_training.student_eval import EvalPlan


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(f"[eval] stopped by signal {signum}: rerun the same command to resume")


def main(argv: list[str] | None = None) -> int:
    """`run`: one model's evaluation (resumable) where bench/student.py cannot run it, e.g. on a GPU host."""
    parser = argparse.ArgumentParser(
        prog="python -m captain_ros_training student-eval",
        description=student_eval.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the plan's episodes that --out does not hold yet")
    run.add_argument("--model", type=Path, required=True, help="the model folder to serve")
    run.add_argument("--label", required=True, help="the policy's name in the records, e.g. student-sft")
    run.add_argument("--out", type=Path, required=True, help="the evaluation folder (one store per run)")
    run.add_argument("--server", choices=("vllm", "transformers"), default="vllm", help="what serves the model")
    run.add_argument("--workers", type=int, default=EvalPlan.workers, help="episodes at once")
    run.add_argument(
        "--cuda-graphs", action="store_true", help="with --server transformers on CUDA: decode steps from CUDA graphs"
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar (logs)")
    run.add_argument(
        "--split", choices=("eval", "train"), default=EvalPlan.split,
        help="start states: eval (the held-out evaluation, the default) or train (the student's own rollouts on "
        "training starts, which captain_ros_training.dagger labels with the expert's next cell; never reported as "
        "success)",
    )  # fmt: skip
    run.add_argument("--starts-per-task", type=int, default=EvalPlan.starts_per_task, help="start states per task")
    run.add_argument("--seed", type=int, default=EvalPlan.seed, help="seed of the start-state draw")
    run.add_argument(
        "--kv-cache-memory-fraction", type=float, default=EvalPlan.kv_cache_memory_fraction,
        help="with --server transformers on CUDA: the share of free GPU memory for the KV cache; two runs started "
        "together on one GPU each see all of it free (give each 0.4)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.starts_per_task < 1:
        parser.error(f"--starts-per-task must be at least 1, got {args.starts_per_task}")
    if not 0.0 < args.kv_cache_memory_fraction <= 1.0:
        parser.error(f"--kv-cache-memory-fraction must be in (0, 1], got {args.kv_cache_memory_fraction}")
    plan = EvalPlan(
        workers=args.workers, server=args.server, cuda_graphs=args.cuda_graphs, split=args.split,
        starts_per_task=args.starts_per_task, seed=args.seed, kv_cache_memory_fraction=args.kv_cache_memory_fraction,
    )  # fmt: skip
    # SIGTERM (kill, a job scheduler) unwinds like Ctrl-C: the finally blocks stop the model server and the rollout
    # workers instead of leaving them running; finished episodes are in the store and a rerun resumes after them
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    student_eval.evaluate(args.model, args.label, args.out, plan, progress=not args.no_progress)
    result = student_eval.summary(args.out)["success"]["overall"]["rates"]
    print(f"[eval] {args.label}: strict {result['strict']['rate']}, host {result['host']['rate']} ({args.out})")
    return 0

"""`captain-ros rollout` and `captain-ros eval`: twin episodes recorded through the sim bridge.

captain-ros rollout --starts-per-task 2 --group-size 4          # 13 tasks x 2 starts x 4 attempts, train split
captain-ros eval run --starts-per-task 8 --attempts 1 --out eval/expert
captain-ros eval report runs/<run>/rollout.sqlite --out eval/expert
captain-ros eval compare A.sqlite B.sqlite --labels sft rl --out eval/sft-vs-rl
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from captain_ros.bridge.host import HostOptions, RolloutHost, write_summary
from captain_ros.bridge.rollout import RolloutReport, plan_groups


def add_rollout_arguments(parser: argparse.ArgumentParser, split: str = "train", attempts_name: str = "--group-size"):
    parser.add_argument("--tasks", default="all", help="comma-separated task names (config/tasks.yaml) or 'all'")
    parser.add_argument("--starts-per-task", type=int, default=2, help="start states drawn per task")
    parser.add_argument(attempts_name, dest="attempts", type=int, default=4, help="attempts per start state (G)")
    parser.add_argument("--split", default=split, choices=["train", "eval", "any"], help="start-state split")
    parser.add_argument("--seed", type=int, default=0, help="seed of the start-state draw")
    parser.add_argument("--workers", type=int, default=2, help="parallel twin workers on this host")
    parser.add_argument("--policy-url", default="", help="OpenAI-compatible policy server; empty: the scripted expert")
    parser.add_argument("--policy", default="", help="label recorded with each episode (default: expert or the URL)")
    parser.add_argument("--policy-version", type=int, default=0, help="the served policy's version, recorded")
    parser.add_argument("--ship", default="", help="the trainer's receiver, tcp://HOST:PORT (default: a local one)")
    parser.add_argument("--no-ship", action="store_true", help="keep the episodes in this host's store only")
    parser.add_argument("--engine", default="local", choices=["local", "ray"], help="local processes or Ray actors")
    parser.add_argument("--ray-address", default="", help="Ray cluster address (default: start Ray on this host)")
    parser.add_argument("--runs-dir", default="runs", help="a folder <runs-dir>/<time>-rollout is made inside")


def _tasks(text: str) -> list[str]:
    from captain_ros.twin.tasks import default_suite

    suite = default_suite()
    names = list(suite) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in suite]
    if unknown:
        raise SystemExit(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(suite)}")
    return names


def rollout(args: argparse.Namespace, kind: str = "rollout", ship: bool = True) -> tuple[RolloutHost, RolloutReport]:
    run_dir = Path(args.runs_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"
    jobs = plan_groups(_tasks(args.tasks), args.starts_per_task, args.attempts, args.split, args.seed)
    options = HostOptions(
        run_dir,
        workers=args.workers,
        policy_url=args.policy_url,
        policy=args.policy,
        policy_version=args.policy_version,
        ship_to=args.ship,
        ship=ship and not args.no_ship,
        engine=args.engine,
        ray_address=args.ray_address,
    )
    print(f"{len(jobs)} episodes ({args.attempts} per start state) on {args.workers} workers; records: {run_dir}")
    with RolloutHost(options) as host:
        report = host.run(jobs)
        left = host.drain()
    write_summary(run_dir / "summary.json", report, {"unshipped_records": left, "jobs": len(jobs)})
    _print_report(report, host, left)
    return host, report


def _print_report(report: RolloutReport, host: RolloutHost, unshipped: int) -> None:
    invalid = report.episodes - report.valid
    print(
        f"\n{report.episodes} episodes in {report.seconds:.0f} s: {report.valid} valid, {report.strict} strict "
        f"successes, {invalid} invalid, {report.restarts} worker restarts, {report.stale} stale"
    )
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())))
    for line in report.abandoned[:10] + report.errors[:10]:
        print("  " + line)
    print(f"episode store: {host.store_path}")
    if "shipper" in host.services:
        where = host.trainer_store if "receiver" in host.services else host.endpoint
        state = "all delivered" if unshipped == 0 else f"{unshipped} records NOT yet delivered"
        print(f"shipped to: {where} ({state})")


def run_rollout(args: argparse.Namespace) -> int:
    _, report = rollout(args)
    return 0 if report.episodes and not report.errors else 1


def main(argv: list[str] | None = None) -> int:
    """`captain-ros eval`: run (episodes, then a report), report (one store) or compare (two stores)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("report", "compare"):
        from captain_ros.bridge import evaluation

        return evaluation.main(argv)
    parser = argparse.ArgumentParser(
        prog="captain-ros eval",
        description="Evaluation over suites x start states x attempts. `run` records episodes (evaluation split by "
        "default) and writes a report; `report STORE --out DIR` and `compare STORE_A STORE_B --out DIR` work on "
        "existing stores (see `captain-ros eval report --help`).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="run|report|compare")
    run = sub.add_parser("run", help="run episodes and write a report")
    add_rollout_arguments(run, split="eval", attempts_name="--attempts")
    run.add_argument("--out", default="", help="report folder (default: <run dir>/report)")
    sub.add_parser("report", help="report on one store (report --help)")
    sub.add_parser("compare", help="paired comparison of two stores (compare --help)")
    args = parser.parse_args(argv)
    host, report = rollout(args, kind="eval", ship=False)
    from captain_ros.bridge import evaluation

    out = Path(args.out) if args.out else host.run_dir / "report"
    label = args.policy or ("expert" if not args.policy_url else args.policy_url)
    code = evaluation.main(["report", str(host.store_path), "--label", label, "--out", str(out)])
    return code or (0 if report.episodes and not report.errors else 1)

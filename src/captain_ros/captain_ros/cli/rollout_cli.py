"""`captain-ros rollout`: episodes in a world (the twin, or LIBERO: `captain_ros.worlds`) recorded through the sim
bridge (captain_ros.bridge.host), and the options `captain-ros eval run` shares (captain_ros.cli.evaluation_cli).

captain-ros rollout --starts-per-task 2 --group-size 4          # 13 tasks x 2 starts x 4 attempts, train split
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from captain_ros.bridge.host import HostOptions, RolloutHost, write_summary
from captain_ros.bridge.rollout import RolloutReport, plan_groups
from captain_ros.worlds import WorldOptions, segmentations, world, world_entry, world_names


def add_rollout_arguments(parser: argparse.ArgumentParser, split: str = "train", attempts_name: str = "--group-size"):
    names = world_names(in_process=True)
    parser.add_argument(
        "--backend",
        default=names[0],
        choices=names,
        help="the world the episodes run in (captain_ros.worlds): "
        + "; ".join(f"{name}: {world_entry(name).summary}" for name in names),
    )
    parser.add_argument(
        "--tasks",
        default="all",
        help="'all', or comma-separated task names: the twin's (config/tasks.yaml); on LIBERO `<suite>/<index>` "
        "or indices taken in every suite (0,4)",
    )
    parser.add_argument(
        "--suite",
        default="",
        help="task suites, comma-separated, where the world has several (LIBERO; default: the world's, on LIBERO "
        "libero_spatial,libero_object,libero_goal; libero_10, libero_90 and LIBERO-PRO's are known too)",
    )
    parser.add_argument(
        "--segmentation",
        default="",
        choices=segmentations(),
        help="where the world has variants (LIBERO; default: the world's first): how perception names objects: "
        "appearance (a library rendered from the benchmark's asset "
        "models), colour_shape (built-in naming only), or oracle (the simulator's object ids: an ORACLE, labelled "
        "as such in the records)",
    )
    parser.add_argument(
        "--starts-per-task",
        type=int,
        default=None,
        help="start states per task (default 2; LIBERO: official initial states, each once, and on the evaluation "
        "split all six held-out states 11-16 by default, CaPtain's protocol)",
    )
    parser.add_argument(
        attempts_name,
        dest="attempts",
        type=int,
        default=None,
        help="attempts per start state (G; default 4, and 1 for a LIBERO evaluation)",
    )
    parser.add_argument("--split", default=split, choices=["train", "eval", "any"], help="start-state split")
    parser.add_argument("--seed", type=int, default=0, help="seed of the start-state draw")
    parser.add_argument("--workers", type=int, default=2, help="parallel twin workers on this host")
    parser.add_argument("--policy-url", default="", help="OpenAI-compatible policy server; empty: the scripted expert")
    parser.add_argument("--policy", default="", help="label recorded with each episode (default: expert or the URL)")
    parser.add_argument("--policy-version", type=int, default=0, help="the served policy's version, recorded")
    parser.add_argument("--no-images", action="store_true", help="no camera images in requests (text-only models)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=0, help="sampled tokens per request at most (default: harness.yaml's)"
    )
    parser.add_argument(
        "--requests", type=int, default=0, help="the requests budget of an episode (default: harness.yaml's, 60)"
    )
    parser.add_argument("--ship", default="", help="the trainer's receiver, tcp://HOST:PORT (default: a local one)")
    parser.add_argument("--no-ship", action="store_true", help="keep the episodes in this host's store only")
    parser.add_argument("--engine", default="local", choices=["local", "ray"], help="local processes or Ray actors")
    parser.add_argument("--ray-address", default="", help="Ray cluster address (default: start Ray on this host)")
    parser.add_argument("--runs-dir", default="runs", help="a folder <runs-dir>/<time>-rollout is made inside")


def _options(args: argparse.Namespace, log_dir: Path | None = None) -> WorldOptions:
    suites = tuple(s.strip() for s in args.suite.split(",") if s.strip())
    return WorldOptions(segmentation=args.segmentation, suites=suites, log_dir=log_dir)


def _tasks(args: argparse.Namespace, log_dir: Path) -> list[str]:
    try:
        return world(args.backend).tasks(args.tasks, _options(args, log_dir))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _defaults(args: argparse.Namespace) -> None:
    """The world's defaults: a LIBERO evaluation is CaPtain's protocol (every held-out state 11-16, once)."""
    starts, attempts = world(args.backend).defaults(args.split)
    if args.starts_per_task is None:
        args.starts_per_task = starts
    if args.attempts is None:
        args.attempts = attempts


def rollout(args: argparse.Namespace, kind: str = "rollout", ship: bool = True) -> tuple[RolloutHost, RolloutReport]:
    for name in ("max_new_tokens", "requests"):  # before anything is made or started
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be 0 (the harness's) or more, got {getattr(args, name)}")
    _defaults(args)
    try:
        on = world(args.backend).describe(_options(args))
    except ValueError as exc:  # e.g. a segmentation the world does not have
        raise SystemExit(str(exc)) from None
    run_dir = Path(args.runs_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"
    try:
        jobs = plan_groups(
            _tasks(args, run_dir / "logs"),
            args.starts_per_task,
            args.attempts,
            args.split,
            args.seed,
            backend=args.backend,
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
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
        backend=args.backend,
        segmentation=args.segmentation,
        send_images=not args.no_images,
        max_new_tokens=args.max_new_tokens,
        requests_budget=args.requests,
    )
    print(f"{len(jobs)} episodes on {on} ({args.attempts} per start state), {args.workers} workers; records: {run_dir}")
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

"""`captain-ros eval`: evaluation over suites x start states x attempts. `run` records episodes through
`captain-ros rollout`'s machinery (captain_ros.cli.rollout_cli) and writes a report; `report` and `compare` work on
existing stores (the statistics, tables and plots: captain_ros.bridge.evaluation).

captain-ros eval run --starts-per-task 8 --attempts 1 --out eval/expert
captain-ros eval --backend libero --suite libero_spatial,libero_object,libero_goal   # held-out states 11-16
captain-ros eval report runs/<run>/rollout.sqlite --out eval/expert
captain-ros eval compare A.sqlite B.sqlite --labels sft rl --out eval/sft-vs-rl
captain-ros eval transcript runs/<run>/rollout.sqlite --outcome missed_finish --brief
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from captain_ros.bridge.evaluation import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    METRICS,
    OUTCOMES,
    SUMMARY_COLUMNS,
    EvaluationError,
    compare_columns,
    comparison_rows,
    interpret,
    load_nonempty,
    load_rows,
    open_episodes,
    pairing_text,
    stored_transcript,
    summarize,
    summary_rows,
    text_table,
    unique_labels,
    write_report,
)


def report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="captain-ros eval",
        description="Evaluation statistics and reports from episode stores (CaPtain §4 conventions).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="rates for one store, per family and task; report.md, report.json, PNGs")
    r.add_argument("store", help="episode store (.sqlite) the rollouts wrote")
    r.add_argument("--label", help="policy name to show (default: the episodes' `policy` field)")
    r.add_argument("--out", required=True, help="output directory")
    c = sub.add_parser("compare", help="paired comparison of B against A (the baseline) on identical start states")
    c.add_argument("store_a", help="baseline policy's store")
    c.add_argument("store_b", help="the other policy's store")
    c.add_argument("--labels", nargs=2, metavar=("A", "B"), help="names for the two policies")
    c.add_argument("--metric", choices=METRICS, default="strict", help="primary metric (both are reported)")
    c.add_argument("--out", required=True, help="output directory")
    t = sub.add_parser(
        "transcript",
        help="an episode of a store as markdown (each request's reasoning, cell and output, then the outcome); the "
        "first that matches the filters",
    )
    t.add_argument("store", help="episode store (.sqlite) the rollouts wrote")
    t.add_argument("--episode", help="its episode id")
    t.add_argument("--task", help="a task (e.g. libero_object/4)")
    t.add_argument("--outcome", choices=OUTCOMES, help="an outcome class")
    t.add_argument(
        "--brief",
        action="store_true",
        help="each cell as its comment lines (the reasoning), each output without receipts",
    )
    t.add_argument("--out", help="write the markdown here (default: standard output)")
    for q in (r, c):
        q.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples")
        q.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed")
    return p


def _print_summary(name: str, summary: dict[str, Any], still_open: int) -> None:
    o = summary["overall"]
    print(
        f"\n{name}: {o['episodes']} complete episodes, {o['valid']} valid, {o['excluded']} excluded "
        f"({o['infrastructure_failures']} infrastructure failures)"
        + (f", {still_open} not ended" if still_open else "")
    )
    if len(summary["policies"]) > 1:
        print(f"  note: this store mixes policies {', '.join(summary['policies'])}; they are pooled here")
    if o["valid"] == 0:
        print("  no valid episodes: every rate is undefined")
    print(text_table(SUMMARY_COLUMNS, summary_rows(summary)))


def _transcript(args: argparse.Namespace) -> int:
    rows = [
        r
        for r in load_rows(args.store)
        if (args.episode in (None, r.episode_id))
        and (args.task in (None, r.task))
        and (args.outcome in (None, r.outcome))
    ]
    if not rows:
        raise EvaluationError(f"{args.store}: no complete episode matches (`captain-ros eval report` lists them)")
    row = rows[0]
    print(
        f"{len(rows)} episode(s) match; {row.episode_id}: {row.task} from {row.start_id}, {row.outcome}",
        file=sys.stderr,
    )
    text = stored_transcript(args.store, row.episode_id, brief=args.brief)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"transcript: {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


def report_main(argv: list[str] | None = None) -> int:
    """`captain-ros eval report|compare`: a report on one store, or a paired comparison of two."""
    args = report_parser().parse_args(argv)
    try:
        if args.command == "transcript":
            return _transcript(args)
        if args.command == "report":
            rows = load_nonempty(args.store, args.label)
            path = write_report(args.out, rows, resamples=args.resamples, seed=args.seed, sources=[args.store])
            name = unique_labels(rows, None, [args.label] if args.label else None)[0]
            _print_summary(name, summarize(rows), open_episodes(args.store))
        else:
            rows_a = load_nonempty(args.store_a, args.labels[0] if args.labels else None)
            rows_b = load_nonempty(args.store_b, args.labels[1] if args.labels else None)
            path = write_report(
                args.out,
                rows_a,
                rows_b,
                labels=args.labels,
                metric=args.metric,
                resamples=args.resamples,
                seed=args.seed,
                sources=[args.store_a, args.store_b],
            )
            report = json.loads((Path(args.out) / "report.json").read_text())
            for name, store in zip(report["labels"], (args.store_a, args.store_b), strict=True):
                _print_summary(name, report["summaries"][name], open_episodes(store))
            comp = report["comparisons"][args.metric]
            print(f"\n{comp['labels'][1]} vs {comp['labels'][0]}, {args.metric} success:")
            print(pairing_text(comp["pairing"], *comp["labels"]))
            print(text_table(compare_columns(comp["labels"]), comparison_rows(comp)))
            print(interpret(comp))
    except EvaluationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"\nreport: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`captain-ros eval`: run (episodes, then a report), report (one store) or compare (two stores)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]  # `captain-ros eval --backend libero ...` is `eval run ...`
    if argv and argv[0] in ("report", "compare", "transcript"):
        return report_main(argv)
    from captain_ros.cli.rollout_cli import add_rollout_arguments, rollout

    parser = argparse.ArgumentParser(
        prog="captain-ros eval",
        description="Evaluation over suites x start states x attempts. `run` records episodes (evaluation split by "
        "default) and writes a report; `report STORE --out DIR` and `compare STORE_A STORE_B --out DIR` work on "
        "existing stores (see `captain-ros eval report --help`).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="run|report|compare|transcript")
    run = sub.add_parser("run", help="run episodes and write a report")
    add_rollout_arguments(run, split="eval", attempts_name="--attempts")
    run.add_argument("--out", default="", help="report folder (default: <run dir>/report)")
    sub.add_parser("report", help="report on one store (report --help)")
    sub.add_parser("compare", help="paired comparison of two stores (compare --help)")
    sub.add_parser("transcript", help="an episode of a store as markdown (transcript --help)")
    args = parser.parse_args(argv)
    host, report = rollout(args, kind="eval", ship=False)
    out = Path(args.out) if args.out else host.run_dir / "report"
    label = args.policy or ("expert" if not args.policy_url else args.policy_url)
    code = report_main(["report", str(host.store_path), "--label", label, "--out", str(out)])
    return code or (0 if report.episodes and not report.errors else 1)

"""`captain-ros export mcap|parquet`: the episode store as rosbag2 (MCAP) bags for ROS tools and Parquet tables for
analysis (the exports themselves: captain_ros.bridge.export)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq

from captain_ros.bridge.export import ExportError, export_mcap, export_mcap_all, export_parquet, require_episodes
from captain_ros.bridge.store import StoreError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captain-ros export",
        description="Export the episode store: rosbag2 (MCAP) bags for ROS tools, Parquet tables for analysis.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    mcap = sub.add_parser("mcap", help="write episodes as rosbag2 bags (metadata.yaml + .mcap), one per episode")
    mcap.add_argument("--store", required=True, type=Path, help="the episode store (SQLite file)")
    mcap.add_argument("--out", required=True, type=Path, help="folder the bags go under, one folder per episode")
    which = mcap.add_mutually_exclusive_group(required=True)
    which.add_argument("--episode", help="the episode id to export")
    which.add_argument("--all", action="store_true", help="export every episode in the store")
    mcap.add_argument("--valid-only", action="store_true", help="with --all: only complete, valid episodes")
    mcap.add_argument("--overwrite", action="store_true", help="replace bags that exist already")
    table = sub.add_parser("parquet", help="write episodes/requests/calls .parquet tables")
    table.add_argument("--store", required=True, type=Path, help="the episode store (SQLite file)")
    table.add_argument("--out", required=True, type=Path, help="folder the three .parquet files go in")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require_episodes(args.store)
        if args.command == "parquet":
            for name, path in export_parquet(args.store, args.out).items():
                print(f"{name:<9} {pq.read_metadata(path).num_rows:>7} rows  {path}")
            return 0
        if args.all:
            paths = export_mcap_all(args.store, args.out, args.valid_only, args.overwrite, progress=True)
            if not paths:
                raise ExportError(f"{args.store} has no complete, valid episodes to export (drop --valid-only)")
            print(f"wrote {len(paths)} bags under {args.out}")
        else:
            print(f"wrote {export_mcap(args.store, args.episode, args.out, args.overwrite)}")
        return 0
    except (ExportError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

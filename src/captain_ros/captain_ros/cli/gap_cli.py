"""`captain-ros gap PATH`: the sim-to-real gap report of an episode (captain_ros.bridge.gap: what the shadow twin
predicted for every action it checked beside what happened), printed and written as gap.md, gap.json and gap.png."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captain_ros.bridge import gap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="captain-ros gap", description=gap.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "path", help="an agent transcript (transcript.jsonl or its folder) or an episode store (.sqlite)"
    )
    parser.add_argument("--episode", default=None, help="the store's episode id (default: its newest)")
    parser.add_argument("--out", default="", help="folder for gap.md, gap.json, gap.png (default: beside the input)")
    args = parser.parse_args(argv)
    path = Path(args.path)
    if path.is_dir():
        path = path / "transcript.jsonl"
    if not path.is_file():
        print(f"captain-ros gap: no transcript or store at {path}", file=sys.stderr)
        return 2
    try:
        if path.suffix == ".sqlite":
            episode, rows = gap.read_store(path, args.episode)
            title = f"episode {episode}"
        else:
            rows, title = gap.read_transcript(path), path.parent.name
    except gap.GapError as exc:
        print(f"captain-ros gap: {exc}", file=sys.stderr)
        return 2
    summary = gap.summarize(rows)
    text = gap.markdown(rows, summary, title)
    out = Path(args.out) if args.out else path.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "gap.md").write_text(text)
    (out / "gap.json").write_text(json.dumps({"summary": summary, "actions": rows}, indent=1))
    drawn = gap.plot(rows, out / "gap.png", title)
    print(text)
    print(f"written: {out / 'gap.md'}, {out / 'gap.json'}" + (f", {out / 'gap.png'}" if drawn else ""))
    return 0

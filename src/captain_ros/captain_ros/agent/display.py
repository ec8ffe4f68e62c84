"""A live view of episodes for a terminal (each request's reasoning, code, receipts and budget) and
the summary table printed at the end of a run."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from typing import TextIO

from captain_ros.agent.episode import EpisodeResult, Outcome


class LiveDisplay:
    """`on_event` for EpisodeRunner: prints as the episode goes. `code_lines`: lines of each cell shown."""

    def __init__(self, stream: TextIO = sys.stdout, code_lines: int = 14, output_lines: int = 16):
        self.stream, self.code_lines, self.output_lines = stream, code_lines, output_lines

    def _print(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    @staticmethod
    def _clip(text: str, lines: int, indent: str) -> str:
        rows = text.rstrip().splitlines() or [""]
        shown = rows[:lines] + ([f"... ({len(rows) - lines} more lines)"] if len(rows) > lines else [])
        return textwrap.indent("\n".join(shown), indent)

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "start":
            self._print(f"\n=== episode {data['episode_id']}: {data['start_id']}")
            self._print(f"    task: {data['instruction']}")
        elif kind == "reply":
            content = (data["content"] or "").strip().replace("\n", " ")
            calls = "" if data["tool_calls"] else "  (no tool call)"
            self._print(f"--- request {data['request']}: {textwrap.shorten(content, 150) or '(no text)'}{calls}")
        elif kind == "cell":
            self._print(self._clip(data["code"], self.code_lines, "    | "))
        elif kind == "output":
            self._print(self._clip(data["text"], self.output_lines, "    > "))
        elif kind == "compacted":
            self._print(f"    [context compacted: {data['removed']} turns replaced by a notice]")
        elif kind == "end":
            r: EpisodeResult = data["result"]
            self._print(
                f"=== {r.outcome.value}: host success {r.host_success}, {r.requests} requests, {r.actions} actions, "
                f"{r.wall_time_s:.1f} s — {r.reason}"
            )
            if r.transcript_dir:
                self._print(f"    transcript: {r.transcript_dir}/transcript.md")


def summary_table(results: list[EpisodeResult]) -> str:
    """Per-episode rows and totals: host and strict success, requests, actions, wall time."""
    columns = (("episode", "<14"), ("start id", "<40"), ("outcome", "<22"), ("host", ">5"), ("strict", ">6"))
    columns += (("req", ">4"), ("act", ">4"), ("time s", ">7"))
    header = " ".join(f"{name:{fmt}}" for name, fmt in columns)
    rows = [header, "-" * len(header)]
    for r in results:
        host = "-" if r.host_success is None else ("yes" if r.host_success else "no")
        rows.append(
            f"{r.episode_id[:14]:<14} {r.start_id[:40]:<40} {r.outcome.value:<22} {host:>5} "
            f"{'yes' if r.strict_success else 'no':>6} {r.requests:>4} {r.actions:>4} {r.wall_time_s:>7.1f}"
        )
    valid = [r for r in results if r.valid]
    if valid:
        host = sum(bool(r.host_success) for r in valid)
        strict = sum(r.strict_success for r in valid)
        rows.append("-" * len(header))
        rows.append(
            f"{len(valid)} valid episodes: host success {host}/{len(valid)}, strict success {strict}/{len(valid)}"
        )
    counts = Counter(r.outcome.value for r in results)
    rows.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    infra = [r for r in results if r.outcome is Outcome.INFRASTRUCTURE]
    rows += [f"infrastructure failure (not a task outcome) in {r.episode_id}: {r.reason}" for r in infra]
    return "\n".join(rows)

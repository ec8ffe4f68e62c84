"""Each episode's transcript on disk: `transcript.jsonl` (one JSON record per line, flushed and fsynced
as it happens, so a killed process leaves every earlier record readable) and, at the end, a readable
`transcript.md`. Images are not stored here (the sim bridge stores them content-addressed)."""

from __future__ import annotations

import json
import os
import reprlib
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from captain_ros.core.contract import _json_safe


def _without_images(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, list):
        content = [
            p if p.get("type") != "image_url" else {"type": "image_url", "image_url": "[image]"} for p in content
        ]
        return {**message, "content": content}
    return message


def _recordable(record: dict[str, Any]) -> dict[str, Any]:
    """`record` as JSON types; a field that cannot be written (nested past Python's recursion limit, a type JSON
    does not know) becomes a note saying so, so the record itself is always written."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        try:
            safe = _json_safe(value)
            json.dumps(safe, allow_nan=False)
        except (RecursionError, ValueError, TypeError) as exc:
            safe = {"unrecordable": f"{type(exc).__name__}: {str(exc)[:200]}", "repr": reprlib.repr(value)}
        out[str(key)] = safe
    return out


class Transcript:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._file = (self.folder / "transcript.jsonl").open("a", encoding="utf-8")
        self._records: list[dict] = []

    def _write(self, record: dict[str, Any]) -> None:
        record = {"t_unix_s": round(time.time(), 3), **_recordable(record)}
        self._records.append(record)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def start(self, start: Any, system: str, task_md: str, tools: list, agent_config: dict) -> None:
        self._write(
            {
                "type": "start",
                **asdict(start),
                "system": system,
                "task_md": task_md,
                "tools": tools,
                "agent_config": agent_config,
            }
        )

    def call(self, request: int, capability: str, kwargs: dict, result: dict) -> None:
        self._write({"type": "call", "request": request, "capability": capability, "kwargs": kwargs, "result": result})

    def request(self, index: int, completion: Any, turn: Any, timing: Any, budget_line: str) -> None:
        fields = (
            "content",
            "tool_calls",
            "finish_reason",
            "prompt_token_ids",
            "token_ids",
            "logprobs",
            "model",
            "usage",
            "latency_s",
        )
        self._write(
            {
                "type": "request",
                "request": index,
                "completion": {k: getattr(completion, k, None) for k in fields},
                "replies": [_without_images(m) for m in turn.replies],
                "fenced_code": getattr(turn, "fenced_code", ""),  # the cell ran from a code block, not a tool call
                "timing": {**asdict(timing), "overhead_s": timing.overhead_s},
                "budget": budget_line,
            }
        )

    def end(self, summary: dict) -> None:
        self._write({"type": "end", **summary})
        self._file.close()
        (self.folder / "transcript.md").write_text(render_markdown(self._records), encoding="utf-8")


def _brief(code: str) -> str:
    """A cell as its comment lines (the expert narrates its reasoning there) and a count of the rest."""
    lines = code.rstrip().splitlines()
    said = [line for line in lines if line.lstrip().startswith("#")]
    rest = len(lines) - len(said)
    return "\n".join([*said, *([f"# ... {rest} lines of code"] if rest else [])])


def _without_receipts(text: str) -> str:
    """A cell's output without its receipts block (from "[receipts]" up to the "[budget]" line)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("[receipts"):
            skipping = True
        elif line.startswith("[budget]"):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


def render_markdown(records: list[dict], brief: bool = False) -> str:
    """A transcript a person reads: the task, then each request's reasoning, code and output (`brief`: each cell as
    its comment lines, each output without its receipts)."""
    out: list[str] = []
    for r in records:
        if r["type"] == "start":
            out += [f"# Episode {r['episode_id']}: {r['task']} ({r['start_id']})", "", f"> {r['instruction']}", ""]
        elif r["type"] == "request":
            c = r["completion"]
            out += [f"## Request {r['request']}", "", (c.get("content") or "").strip(), ""]
            for call in c.get("tool_calls") or []:
                raw = (call.get("function") or {}).get("arguments", "")
                try:
                    code = json.loads(raw).get("code", raw)
                except (json.JSONDecodeError, AttributeError):
                    code = raw
                out += ["```python", _brief(str(code)) if brief else str(code).rstrip(), "```", ""]
            for reply in r["replies"]:
                content = reply.get("content")
                if isinstance(content, list):
                    content = " ".join(p.get("text", "[image]") for p in content if isinstance(p, dict))
                text = _without_receipts(str(content)) if brief else str(content)
                out += ["```text", text.rstrip(), "```", ""]
        elif r["type"] == "end":
            out += [
                "## Outcome",
                "",
                f"**{r['outcome']}** (host success: {r['host_success']}, finished: {r['finished']}): {r['reason']}; "
                f"{r['requests']} requests, {r['actions']} physical actions, {r['wall_time_s']:.1f} s",
                "",
            ]
    return "\n".join(out)

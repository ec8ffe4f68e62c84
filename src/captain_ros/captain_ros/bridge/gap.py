"""The sim-to-real gap report of an episode: for every action the shadow twin checked, what it predicted beside what
happened (outcome, distance, peak wrist force, jaw opening), and the episode's agreement and errors.

It reads an agent transcript (`transcript.jsonl`, which the agent writes on the real arm and on the twin) or an
episode of an episode store (the sim bridge's records). `captain-ros gap PATH` prints the table and writes
`gap.md`, `gap.json` and `gap.png` (predicted against actual distance and force).

  captain-ros gap runs/<episode>/transcript.jsonl
  captain-ros gap runs/<run>/rollout.sqlite --episode <id> --out gap/
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FIELDS = (("executed_distance_m", "distance", 100.0, "cm"), ("peak_force_n", "peak force", 1.0, "N"))
JAW = ("jaw_after_m", "jaw", 1000.0, "mm")


class GapError(ValueError):
    """The input holds nothing to report on (the message says what was read)."""


def rows_from_calls(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """(capability, the call's shadow record {predicted, actual}) -> one row per checked action, in order."""
    rows = []
    for capability, shadow in calls:
        if not isinstance(shadow, dict) or "predicted" not in shadow:
            continue
        rows.append({"n": len(rows) + 1, "capability": capability, **shadow})
    return rows


def read_transcript(path: Path) -> list[dict[str, Any]]:
    calls = []
    with path.open(encoding="utf-8") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut by a killed process: the records before it are whole
            if record.get("type") == "call":
                value = (record.get("result") or {}).get("value")
                calls.append((record.get("capability", ""), value.get("shadow") if isinstance(value, dict) else None))
    return rows_from_calls(calls)


def read_store(path: Path, episode_id: str | None) -> tuple[str, list[dict[str, Any]]]:
    from captain_ros.bridge.store import EpisodeReader

    reader = EpisodeReader(path)
    ids = reader.episode_ids(valid_only=False)
    if not ids:
        raise GapError(f"{path} holds no complete episode")
    if episode_id is None:
        episode_id = ids[-1]
    elif episode_id not in ids:
        raise GapError(f"{path} has no complete episode {episode_id!r}; it has {', '.join(ids[:10])}")
    episode = reader.load(episode_id)
    calls = [(c["capability"], c.get("shadow")) for r in episode.requests for c in (r.step or {}).get("calls", [])]
    return episode_id, rows_from_calls(calls)


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement of predicted and actual outcomes over the actions that ran, mean absolute errors, refusals."""
    refused = [r for r in rows if r["predicted"].get("refusal")]
    ran = [r for r in rows if not r["predicted"].get("refusal")]
    agree = [r["predicted"].get("outcome") == r["actual"].get("outcome") for r in ran]
    out: dict[str, Any] = {
        "checked": len(rows),
        "refused": len(refused),
        "ran": len(ran),
        "outcome_agreement": sum(agree) / len(agree) if agree else None,
        "check_ms_mean": sum(r["predicted"].get("check_ms", 0.0) for r in rows) / len(rows) if rows else None,
    }
    for key, *_ in (*FIELDS, JAW):
        errors = [
            abs(p - a)
            for r in ran
            if (p := _number(r["predicted"].get(key))) is not None and (a := _number(r["actual"].get(key))) is not None
        ]
        out[f"{key}_mae"] = sum(errors) / len(errors) if errors else None
        out[f"{key}_pairs"] = len(errors)
    return out


def _cell(x: Any, scale: float, digits: int = 1) -> str:
    v = _number(x)
    return "-" if v is None else f"{v * scale:.{digits}f}"


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], title: str) -> str:
    lines = [f"# Sim-to-real gap: {title}", ""]
    if not rows:
        return "\n".join([*lines, "No action of this episode was shadow-checked (the shadow check was off).", ""])
    agreement = summary["outcome_agreement"]
    lines += [
        f"{summary['checked']} actions checked by the shadow twin, {summary['refused']} refused, {summary['ran']} ran; "
        f"predicted outcome = actual outcome for "
        + ("-" if agreement is None else f"{agreement * 100:.0f}%")
        + f" of those that ran; mean check {summary['check_ms_mean']:.0f} ms.",
        "",
    ]
    for key, label, scale, unit in (*FIELDS, JAW):
        mae = summary[f"{key}_mae"]
        if mae is not None:
            lines.append(
                f"- {label}: mean absolute error {mae * scale:.1f} {unit} over {summary[f'{key}_pairs']} actions"
            )
    lines += [
        "",
        "| # | action | predicted | actual | distance cm (pred / actual) | peak N (pred / actual) "
        "| jaw mm (pred / actual) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, a = r["predicted"], r["actual"]
        predicted = f"REFUSED: {p['refusal']}" if p.get("refusal") else p.get("outcome", "?")
        lines.append(
            f"| {r['n']} | {r['capability']} | {predicted} | {a.get('outcome', '?')} | "
            f"{_cell(p.get('executed_distance_m'), 100)} / {_cell(a.get('executed_distance_m'), 100)} | "
            f"{_cell(p.get('peak_force_n'), 1)} / {_cell(a.get('peak_force_n'), 1)} | "
            f"{_cell(p.get('jaw_after_m'), 1000, 0)} / {_cell(a.get('jaw_after_m'), 1000, 0)} |"
        )
    return "\n".join([*lines, ""])


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Predicted against actual distance and peak force, one point per action that ran; False when none has both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if not r["predicted"].get("refusal")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    drawn = False
    for ax, (key, label, scale, unit) in zip(axes, FIELDS, strict=True):
        points = [
            (p * scale, a * scale, r["predicted"].get("outcome") == r["actual"].get("outcome"))
            for r in ran
            if (p := _number(r["predicted"].get(key))) is not None and (a := _number(r["actual"].get(key))) is not None
        ]
        if points:
            drawn = True
            xs, ys, agree = zip(*points, strict=True)
            top = max(*xs, *ys) * 1.05 or 1.0
            ax.plot([0, top], [0, top], color="0.7", lw=1, label="prediction = outcome")
            ax.scatter(xs, ys, c=["tab:blue" if ok else "tab:red" for ok in agree], s=22)
            ax.legend(loc="upper left", fontsize=8)
        ax.set_xlabel(f"predicted {label} ({unit})")
        ax.set_ylabel(f"actual {label} ({unit})")
        ax.set_title(label)
    fig.suptitle(f"{title} (red: the outcome differed)", fontsize=10)
    fig.tight_layout()
    if drawn:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn

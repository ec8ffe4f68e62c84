"""Evaluation statistics: one or two episode stores into rates, paired tests, plots and a report.

The conventions follow CaPtain §4 and Appendix K. Host success is the benchmark predicate on the final
state; strict success additionally needs finish() (the deployable metric); a false finish is finish() on
a failed state; a missed finish is a solved scene without finish(). Infrastructure failures (policy
server down, simulator fault, a lost link) say nothing about the policy, so they are left out of every
rate and counted on their own; an episode is left out whenever its episode_end says `valid: false`.

Two policies are compared only on identical (task, start id, attempt) keys that both ran validly, so
the start state cannot favour either. Success on a pair is a dependent binary outcome: the exact
two-sided McNemar test looks only at the discordant pairs (b: A succeeded and B failed, c: the
reverse), which under "equally good" split like fair coin flips. Episodes of one task are correlated
(one task may be easy for both), so the interval on the difference in rates resamples whole tasks with
replacement (a task-cluster bootstrap), not single episodes, which would give intervals that are too
narrow. The bootstrap is vectorized with numpy and seeded, so a report is reproducible.

Reading goes through `EpisodeStore.episodes(status="complete")` and each episode's start and end
records only; the model calls and steps are not needed. ROS-free. matplotlib is imported only when
plotting (Agg backend, no display needed).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from captain_ros.bridge.store import EpisodeReader, EpisodeStore, StoreError

OUTCOMES = ("success", "missed_finish", "false_finish", "budget_exhausted", "failure", "infrastructure_failure")
INFRASTRUCTURE = "infrastructure_failure"
RATES = ("host", "strict", "false_finish", "missed_finish", "budget_exhausted")
METRICS = ("strict", "host")
Z_95 = 1.959963984540054  # two-sided 95% normal quantile, for Wilson intervals
UNKNOWN_FAMILY = "unknown"
DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
_BOOTSTRAP_CHUNK_CELLS = 4_000_000  # resamples x tasks per numpy block (bounds memory for many tasks)


class EvaluationError(ValueError):
    """The input cannot be evaluated (missing or empty store, nothing to pair); the message says what to do."""


# -------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class EvalRow:
    """One complete episode as evaluation sees it. `valid` False: left out of every rate."""

    policy: str
    task: str
    family: str
    start_id: str
    attempt: int
    outcome: str
    host_success: bool
    strict_success: bool
    finished: bool
    requests: int
    actions: int
    wall_time_s: float | None
    valid: bool
    episode_id: str = ""
    invalid_reason: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        """The pairing key: the same task from the same start state, the same attempt number."""
        return (self.task, self.start_id, self.attempt)


def _row(episode_id: str, start: dict[str, Any] | None, end: dict[str, Any], policy: str | None) -> EvalRow:
    start = start or {}
    outcome = str(end.get("outcome", ""))
    host = end.get("host_success")
    if not isinstance(host, bool):  # no scorer (real arm) or never scored: the outcome class implies it
        host = outcome in ("success", "missed_finish")
    finished = bool(end.get("finished", outcome in ("success", "false_finish")))
    known = outcome in OUTCOMES
    valid = bool(end.get("valid", False)) and outcome != INFRASTRUCTURE and bool(start) and known
    reason = ""
    if not valid:
        if not start:
            reason = "no episode_start record"
        elif not known:  # a class this code does not know cannot be put in any rate: shown, not guessed
            reason = f"unknown outcome {outcome!r}"
        elif outcome == INFRASTRUCTURE:
            reason = INFRASTRUCTURE
        else:
            reason = str(end.get("invalid_reason") or "marked invalid")
    wall = end.get("wall_time_s")
    label = policy if policy is not None else start.get("policy")
    if not label:
        version = start.get("policy_version")
        label = f"policy_v{version}" if version is not None else "unlabelled"
    return EvalRow(
        policy=str(label),
        task=str(start.get("task", "")),
        family=str(start.get("family") or UNKNOWN_FAMILY),
        start_id=str(start.get("start_id", "")),
        attempt=int(start.get("attempt", 0)),
        outcome=outcome,
        host_success=bool(host),
        strict_success=outcome == "success",
        finished=finished,
        requests=int(end.get("requests", 0)),
        actions=int(end.get("actions", 0)),
        wall_time_s=float(wall) if isinstance(wall, int | float) and not isinstance(wall, bool) else None,
        valid=valid,
        episode_id=episode_id,
        invalid_reason=reason,
    )


def open_store(store_path: str | Path) -> EpisodeStore:
    """Open an existing store for reading; refuses a missing path (EpisodeStore would create one)."""
    path = Path(store_path)
    if not path.is_file():
        raise EvaluationError(f"no episode store at {path}: pass the .sqlite file the rollouts wrote")
    try:
        return EpisodeStore(path)
    except StoreError as exc:
        raise EvaluationError(f"cannot read {path} as an episode store: {exc}") from None


def load_rows(store_path: str | Path, policy: str | None = None) -> list[EvalRow]:
    """Every complete episode of a store, oldest first. `policy` overrides the label of every row
    (by default the episode_start's `policy`)."""
    with open_store(store_path) as store:
        rows = []
        for entry in store.episodes(status="complete"):
            eid = entry["episode_id"]
            start, end = store.record(eid, "episode_start"), store.record(eid, "episode_end")
            if end is None:  # the index says complete, so this is a damaged store: say so, do not guess
                raise EvaluationError(f"{store_path}: episode {eid} is indexed as complete but has no episode_end")
            if (end.payload.get("early_stop") or {}).get("stopped"):  # CaPtain §4: evaluation never stops early
                raise EvaluationError(
                    f"{store_path}: episode {eid} was cut by the critic's early stop (an RL rollout's rule): it is "
                    "neither a success nor a failure of an evaluation; evaluate from a store whose rollouts ran "
                    "without early_stop_critic"
                )
            rows.append(_row(eid, start.payload if start else None, end.payload, policy))
    return rows


def stored_transcript(store_path: str | Path, episode_id: str, brief: bool = False) -> str:
    """Episode `episode_id` of a store as the agent's transcript.md reads (captain_ros.agent.transcript): each
    request's reply and cell, then what came back to it (the next request's new messages; for the last request,
    which no later request shows, its receipts), then the outcome. `brief`: each cell as its comment lines, each
    output without its receipts."""
    from captain_ros.agent.transcript import render_markdown

    open_store(store_path).close()  # refuses a missing path (the reader would create one)
    reader = EpisodeReader(store_path)
    try:
        episode = reader.load(episode_id)  # its records, model calls and steps joined by request
    except StoreError as exc:  # none by that id, or a damaged record
        raise EvaluationError(
            f"{store_path}: no episode {episode_id!r} to read ({exc}; `captain-ros eval report` lists the store)"
        ) from None
    finally:
        reader.close()
    calls = [r for r in episode.requests if r.model_call is not None]
    out = [{"type": "start", "episode_id": episode_id, **episode.start}]
    for n, request in enumerate(calls):
        if n + 1 < len(calls):  # what followed this reply: the next request's messages after its last assistant turn
            messages = calls[n + 1].model_call["messages"]
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages) - 1)
            replies = messages[last + 1 :]
        else:
            receipts = [c.get("receipt", "") for c in (request.step or {}).get("calls", [])]
            replies = [{"role": "tool", "content": "[receipts of the last cell]\n" + "\n".join(receipts)}]
        completion = request.model_call.get("response") or {}
        out.append({"type": "request", "request": request.index, "completion": completion, "replies": replies})
    if episode.end is not None:
        out.append({"type": "end", **episode.end, "wall_time_s": float(episode.end.get("wall_time_s") or 0.0)})
    return render_markdown(out, brief=brief)


def open_episodes(store_path: str | Path) -> int:
    """How many episodes of a store have not ended (still running, or their worker died unnoticed)."""
    with open_store(store_path) as store:
        return len(store.episodes(status="open"))


# -------------------------------------------------------------------------------------- statistics
def wilson(k: int, n: int, z: float = Z_95) -> tuple[float, float] | tuple[None, None]:
    """Wilson score interval for k successes in n trials ((None, None) when n == 0)."""
    if n <= 0:
        return None, None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exact at the edges (the formula leaves rounding dust there)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci_low": lo, "ci_high": hi}


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _stats(rows: Sequence[EvalRow]) -> dict[str, Any]:
    valid = [r for r in rows if r.valid]
    n = len(valid)
    counts = {
        "host": sum(r.host_success for r in valid),
        "strict": sum(r.strict_success for r in valid),
        "false_finish": sum(r.outcome == "false_finish" for r in valid),
        "missed_finish": sum(r.outcome == "missed_finish" for r in valid),
        "budget_exhausted": sum(r.outcome == "budget_exhausted" for r in valid),
    }
    excluded = [r for r in rows if not r.valid]
    return {
        "episodes": len(rows),
        "valid": n,
        "excluded": len(excluded),
        "infrastructure_failures": sum(r.outcome == INFRASTRUCTURE for r in rows),
        "excluded_reasons": dict(Counter(r.invalid_reason for r in excluded)),
        "outcomes": {o: sum(r.outcome == o for r in valid) for o in OUTCOMES if o != INFRASTRUCTURE},
        "rates": {name: _rate(counts[name], n) for name in RATES},
        "mean_requests": _mean(r.requests for r in valid),
        "mean_actions": _mean(r.actions for r in valid),
        "mean_wall_time_s": _mean(r.wall_time_s for r in valid),
    }


def summarize(rows: Sequence[EvalRow]) -> dict[str, Any]:
    """Overall, per-family and per-task statistics. Rates are over valid episodes only, each with a
    Wilson 95% interval; excluded (invalid) episodes are counted, with their reasons."""
    by_family: dict[str, list[EvalRow]] = defaultdict(list)
    by_task: dict[str, list[EvalRow]] = defaultdict(list)
    for r in rows:
        by_family[r.family].append(r)
        by_task[r.task].append(r)
    tasks = {}
    for task in sorted(by_task):
        families = sorted({r.family for r in by_task[task]})
        tasks[task] = {"family": ", ".join(families), **_stats(by_task[task])}
    return {
        "policies": _policies(rows),
        "overall": _stats(rows),
        "by_family": {f: _stats(by_family[f]) for f in sorted(by_family)},
        "by_task": tasks,
    }


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: under H0 the b + c discordant pairs split Binomial(b + c, 1/2);
    p = min(1, 2 P(X <= min(b, c))). Computed with exact integers (no rounding before the last step)."""
    if b < 0 or c < 0 or int(b) != b or int(c) != c:
        raise ValueError(f"discordant counts must be non-negative integers, got b={b}, c={c}")
    b, c = int(b), int(c)
    n = b + c
    if n == 0:
        return 1.0
    term, tail = 1, 1  # C(n, 0)
    for k in range(min(b, c)):
        term = term * (n - k) // (k + 1)  # C(n, k + 1), exact
        tail += term
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def task_bootstrap_ci(
    clusters: Sequence[Any],
    deltas: Sequence[float],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval for mean(deltas) when whole clusters (tasks) are resampled with replacement.

    A resample draws as many clusters as there are, each with all its pairs, and takes the pooled mean
    sum(deltas) / count over the drawn pairs, the same estimator as the point estimate."""
    if len(clusters) != len(deltas) or not deltas:
        raise ValueError("need one cluster label per delta, and at least one delta")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"resamples must be >= 1 and 0 < confidence < 1 (got {resamples}, {confidence})")
    index: dict[Any, int] = {}
    ids = np.array([index.setdefault(c, len(index)) for c in clusters])
    k = len(index)
    sums = np.bincount(ids, weights=np.asarray(deltas, dtype=float), minlength=k)
    sizes = np.bincount(ids, minlength=k).astype(float)
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    chunk = max(1, _BOOTSTRAP_CHUNK_CELLS // k)
    for lo in range(0, resamples, chunk):
        m = min(chunk, resamples - lo)
        draw = rng.integers(0, k, size=(m, k))
        stats[lo : lo + m] = sums[draw].sum(axis=1) / sizes[draw].sum(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(low), float(high)


def _outcome_of(row: EvalRow, metric: str) -> bool:
    return row.strict_success if metric == "strict" else row.host_success


def _pair_table(
    pairs: Sequence[tuple[EvalRow, EvalRow]], metric: str, resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    ya = np.array([_outcome_of(a, metric) for a, _ in pairs], dtype=bool)
    yb = np.array([_outcome_of(b, metric) for _, b in pairs], dtype=bool)
    b = int(np.sum(ya & ~yb))  # A succeeded, B failed: lost by B
    c = int(np.sum(~ya & yb))  # A failed, B succeeded: gained by B
    n = len(pairs)
    clusters = [(a.family, a.task) for a, _ in pairs]
    low, high = task_bootstrap_ci(clusters, (yb.astype(int) - ya.astype(int)).tolist(), resamples, seed, confidence)
    return {
        "pairs": n,
        "tasks": len(set(clusters)),
        "rate_a": float(ya.mean()),
        "rate_b": float(yb.mean()),
        "difference": (c - b) / n,
        "ci_low": low,
        "ci_high": high,
        "b": b,
        "c": c,
        "both_success": int(np.sum(ya & yb)),
        "both_fail": int(np.sum(~ya & ~yb)),
        "p_value": mcnemar_exact(b, c),
    }


def pair_rows(
    rows_a: Sequence[EvalRow], rows_b: Sequence[EvalRow]
) -> tuple[list[tuple[EvalRow, EvalRow]], dict[str, int]]:
    """Pairs of valid episodes on identical (task, start id, attempt) keys, and how many keys were
    dropped and why. A key re-run after an infrastructure failure counts once (its valid episode); if
    a store holds several valid episodes for one key, the oldest is used and the rest are counted."""

    def index(rows: Sequence[EvalRow]) -> tuple[dict, set, int]:
        valid: dict[tuple, EvalRow] = {}
        seen: set[tuple] = set()
        duplicates = 0
        for r in rows:
            seen.add(r.key)
            if r.valid:
                if r.key in valid:
                    duplicates += 1
                else:
                    valid[r.key] = r
        return valid, seen, duplicates

    va, sa, da = index(rows_a)
    vb, sb, db = index(rows_b)
    keys = sorted(set(va) & set(vb))
    common = sa & sb
    pairs = [(va[k], vb[k]) for k in keys]
    report = {
        "paired": len(pairs),
        "keys_a": len(sa),
        "keys_b": len(sb),
        "only_in_a": len(sa - sb),
        "only_in_b": len(sb - sa),
        "invalid_in_a": sum(k not in va and k in vb for k in common),
        "invalid_in_b": sum(k in va and k not in vb for k in common),
        "invalid_in_both": sum(k not in va and k not in vb for k in common),
        "duplicates_a": da,
        "duplicates_b": db,
        "family_mismatch": sum(a.family != b.family for a, b in pairs),
    }
    return pairs, report


def compare(
    rows_a: Sequence[EvalRow],
    rows_b: Sequence[EvalRow],
    metric: str = "strict",
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Paired comparison of policy B against policy A (the baseline) on one metric ("strict" or "host").

    `difference` = rate_b - rate_a = (c - b) / pairs, with b = pairs A won and B lost, c = the reverse;
    exact McNemar p and a task-cluster bootstrap interval, overall and per family (of policy A's row)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    pairs, pairing = pair_rows(rows_a, rows_b)
    if not pairs:
        raise EvaluationError(
            "no (task, start id, attempt) key has a valid episode in both stores, so nothing can be compared "
            f"(keys: {pairing['keys_a']} in A, {pairing['keys_b']} in B; only in A {pairing['only_in_a']}, "
            f"only in B {pairing['only_in_b']}, invalid in A {pairing['invalid_in_a']}, in B "
            f"{pairing['invalid_in_b']}, in both {pairing['invalid_in_both']}). Run both policies on the same "
            "suite, start ids and attempts."
        )
    families: dict[str, list] = defaultdict(list)
    for p in pairs:
        families[p[0].family].append(p)
    return {
        "metric": metric,
        "labels": [_label(rows_a, "A"), _label(rows_b, "B")],
        "pairing": pairing,
        "overall": _pair_table(pairs, metric, resamples, seed, confidence),
        "by_family": {f: _pair_table(families[f], metric, resamples, seed, confidence) for f in sorted(families)},
        "bootstrap": {"resamples": resamples, "seed": seed, "confidence": confidence, "cluster": "task"},
    }


def _policies(rows: Sequence[EvalRow]) -> list[str]:
    """The policies evaluated: labels of valid episodes (an abandoned episode without a start record has none)."""
    return sorted({r.policy for r in rows if r.valid} or {r.policy for r in rows})


def _label(rows: Sequence[EvalRow], fallback: str) -> str:
    names = _policies(rows)
    return " + ".join(names) if names else fallback


# ------------------------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _groups(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [*summary["by_family"].items(), ("all", summary["overall"])]


def _plotted_families(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """Families with a valid episode (an abandoned episode that never recorded its start has none), then "all"."""
    return sorted({f for s in summaries.values() for f, g in s["by_family"].items() if g["valid"]}) + ["all"]


def plot_success(summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """Host and strict success per family (and overall), one bar per policy, Wilson 95% error bars."""
    plt = _pyplot()
    families = _plotted_families(summaries)
    fig, axes = plt.subplots(1, 2, figsize=(max(6.0, 1.6 * len(families) * max(1, len(summaries))), 4), sharey=True)
    width = 0.8 / len(summaries)
    x = np.arange(len(families))
    for ax, metric in zip(axes, ("host", "strict"), strict=True):
        for i, (label, summary) in enumerate(summaries.items()):
            stats = dict(_groups(summary))
            rates, errs = [], [[], []]
            for f in families:
                r = stats[f]["rates"][metric] if f in stats else {"rate": None}
                rate = r["rate"]
                rates.append(100 * rate if rate is not None else 0.0)
                errs[0].append(100 * (rate - r["ci_low"]) if rate is not None else 0.0)
                errs[1].append(100 * (r["ci_high"] - rate) if rate is not None else 0.0)
            ax.bar(x + (i - (len(summaries) - 1) / 2) * width, rates, width, yerr=errs, capsize=3, label=label)
        ax.set_xticks(x, families, rotation=20)
        ax.set_ylim(0, 105)
        ax.set_title(f"{metric} success (95% Wilson)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("% of valid episodes")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_outcomes(summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """Outcome classes as stacked fractions of valid episodes, one bar per (family, policy)."""
    plt = _pyplot()
    classes = [o for o in OUTCOMES if o != INFRASTRUCTURE]
    colors = {"success": "#2a9d55", "missed_finish": "#9acd32", "false_finish": "#d62728"}
    colors |= {"budget_exhausted": "#ff9f1c", "failure": "#8c8c8c"}
    families = _plotted_families(summaries)
    bars: list[tuple[str, dict[str, Any]]] = []  # the policies side by side within each family
    for family in families:
        for label, summary in summaries.items():
            stats = dict(_groups(summary)).get(family)
            if stats is not None:
                bars.append((family if len(summaries) == 1 else f"{family}\n{label}", stats))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(bars) + 2), 4.2))
    bottom = np.zeros(len(bars))
    for outcome in classes:
        vals = np.array([100 * s["outcomes"][outcome] / s["valid"] if s["valid"] else 0.0 for _, s in bars])
        ax.bar(range(len(bars)), vals, bottom=bottom, color=colors[outcome], label=outcome.replace("_", " "))
        bottom += vals
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=30, fontsize=8)
    ax.set_ylabel("% of valid episodes")
    ax.set_ylim(0, 100)
    ax.set_title("Outcome classes")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_difference(comparisons: dict[str, dict[str, Any]], path: Path) -> Path:
    """Paired difference (B - A, percentage points) per family and overall, task-cluster bootstrap CIs,
    one marker series per metric."""
    plt = _pyplot()
    first = next(iter(comparisons.values()))
    families = [*first["by_family"], "all"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(families) + 2), 4))
    x = np.arange(len(families))
    offsets = np.linspace(-0.15, 0.15, len(comparisons)) if len(comparisons) > 1 else [0.0]
    for off, (metric, comp) in zip(offsets, comparisons.items(), strict=True):
        tables = [comp["by_family"][f] for f in families[:-1]] + [comp["overall"]]
        d = np.array([100 * t["difference"] for t in tables])
        lo = d - np.array([100 * t["ci_low"] for t in tables])
        hi = np.array([100 * t["ci_high"] for t in tables]) - d
        ax.errorbar(x + off, d, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], fmt="o", capsize=4, label=metric)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, families, rotation=20)
    a, b = first["labels"]
    ax.set_ylabel(f"{b} − {a} (points)")
    ax.set_title("Paired difference, 95% task-cluster bootstrap")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ report
def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}"


def _rate_cell(r: dict[str, Any]) -> str:
    if r["rate"] is None:
        return "–"
    return f"{_pct(r['rate'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]"


SUMMARY_COLUMNS = ("group", "valid", "excl.", "host %", "strict %", "false fin. %", "missed fin. %", "budget %")
SUMMARY_COLUMNS += ("req", "act", "time s")


def _summary_cells(name: str, s: dict[str, Any]) -> list[str]:
    rates = s["rates"]
    return [
        name,
        str(s["valid"]),
        str(s["excluded"]),
        *(_rate_cell(rates[k]) for k in RATES),
        _num(s["mean_requests"]),
        _num(s["mean_actions"]),
        _num(s["mean_wall_time_s"]),
    ]


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


def summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    return [_summary_cells(f, s) for f, s in summary["by_family"].items()] + [_summary_cells("all", summary["overall"])]


def compare_columns(labels: Sequence[str]) -> tuple[str, ...]:
    a, b = labels
    return ("family", "pairs", "tasks", f"{a} %", f"{b} %", "Δ points [95% CI]", f"b ({a} only)", f"c ({b} only)", "p")


def comparison_rows(comp: dict[str, Any]) -> list[list[str]]:
    def cells(name: str, t: dict[str, Any]) -> list[str]:
        delta = f"{100 * t['difference']:+.1f} [{100 * t['ci_low']:+.1f}, {100 * t['ci_high']:+.1f}]"
        return [name, str(t["pairs"]), str(t["tasks"]), _pct(t["rate_a"]), _pct(t["rate_b"]), delta]

    return [
        [*cells(f, t), str(t["b"]), str(t["c"]), _p(t["p_value"])]
        for f, t in [*comp["by_family"].items(), ("all", comp["overall"])]
    ]


def interpret(comp: dict[str, Any]) -> str:
    """One paragraph saying in words what the overall McNemar test and bootstrap interval mean."""
    t, (a, b) = comp["overall"], comp["labels"]
    m = comp["metric"]
    lvl = round(100 * comp["bootstrap"]["confidence"])
    text = (
        f"On {t['pairs']} paired episodes ({t['tasks']} tasks), {b} reached {m} success where {a} did not in "
        f"{t['c']} pairs, and {a} where {b} did not in {t['b']}; the other {t['both_success'] + t['both_fail']} "
        f"pairs agree. {b} − {a} = {100 * t['difference']:+.1f} points, {lvl}% task-cluster bootstrap interval "
        f"[{100 * t['ci_low']:+.1f}, {100 * t['ci_high']:+.1f}] (whole tasks resampled, so episodes of one task "
        f"are not treated as independent). The exact two-sided McNemar test gives p = {_p(t['p_value'])}: "
    )
    if t["b"] + t["c"] == 0:
        return text + "no pair disagrees, so the data carry no evidence of a difference either way."
    if t["p_value"] < 0.05:
        better = b if t["c"] > t["b"] else a
        return text + (
            f"if the two policies were equally good, a split of the discordant pairs at least this lopsided "
            f"would happen less than 5% of the time, so {better} is better on {m} success on this suite."
        )
    return text + (
        "a split this uneven is common when the two policies are equally good (p >= 0.05), so these episodes do "
        "not show a difference; more episodes may."
    )


def pairing_text(pairing: dict[str, int], a: str, b: str) -> str:
    """How many keys were paired, and how many were dropped and why, in one sentence."""
    return (
        f"Episodes are paired on identical (task, start id, attempt) keys valid in both: {pairing['paired']} "
        f"pairs. Dropped keys: only in {a} {pairing['only_in_a']}, only in {b} {pairing['only_in_b']}, invalid "
        f"in {a} {pairing['invalid_in_a']}, invalid in {b} {pairing['invalid_in_b']}, invalid in both "
        f"{pairing['invalid_in_both']}; extra valid episodes of one key ignored: {pairing['duplicates_a']} "
        f"in {a}, {pairing['duplicates_b']} in {b}."
    )


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def unique_labels(rows_a: Sequence[EvalRow], rows_b: Sequence[EvalRow] | None, labels) -> list[str]:
    if labels is not None:
        out = [str(x) for x in labels]
    else:
        out = [_label(rows_a, "A")] + ([_label(rows_b, "B")] if rows_b is not None else [])
    if len(out) == 2 and out[0] == out[1]:
        out = [f"{out[0]} (A)", f"{out[1]} (B)"]
    return out


def write_report(
    out_dir: str | Path,
    rows_a: Sequence[EvalRow],
    rows_b: Sequence[EvalRow] | None = None,
    labels: Sequence[str] | None = None,
    *,
    metric: str = "strict",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    sources: Sequence[str] | None = None,
) -> Path:
    """Write report.md (tables, embedded PNG plots, the paired test in words) and report.json (every
    number, and the per-episode rows) into out_dir; returns the report.md path. With rows_b, B is
    compared against A (the baseline) on both metrics, `metric` first."""
    if not rows_a or (rows_b is not None and not rows_b):
        raise EvaluationError("no complete episodes to report on: run rollouts into the store first")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    names = unique_labels(rows_a, rows_b, labels)
    if len(names) != (1 if rows_b is None else 2):
        raise ValueError(f"need {1 if rows_b is None else 2} labels, got {names}")
    sets = [rows_a] if rows_b is None else [rows_a, rows_b]
    relabelled = [[replace(r, policy=n) for r in rs] for n, rs in zip(names, sets, strict=True)]
    summaries = {n: summarize(rs) for n, rs in zip(names, relabelled, strict=True)}
    comparisons: dict[str, dict[str, Any]] = {}
    if rows_b is not None:
        for m in (metric, *(x for x in METRICS if x != metric)):
            comparisons[m] = compare(*relabelled, metric=m, resamples=resamples, seed=seed)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = {
        "success": plot_success(summaries, out / "success.png"),
        "outcomes": plot_outcomes(summaries, out / "outcomes.png"),
    }
    if comparisons:
        plots["difference"] = plot_difference(comparisons, out / "difference.png")

    md = ["# Evaluation report", ""]
    if sources:
        md += [f"- {n}: `{s}`" for n, s in zip(names, sources, strict=False)] + [""]
    md += [
        "Rates are over valid episodes; infrastructure failures and other invalid episodes are excluded and "
        "counted in *excl.* Brackets are Wilson 95% intervals. Host success: the task predicate holds on the "
        "final state; strict success: it holds and the policy called finish(); false finish: finish() on a "
        "failed state; missed finish: solved without finish().",
        "",
    ]
    for name, s in summaries.items():
        o = s["overall"]
        md += [f"## {name}", ""]
        md += [
            f"{o['episodes']} complete episodes: {o['valid']} valid, {o['excluded']} excluded "
            f"({o['infrastructure_failures']} infrastructure failures)."
        ]
        if o["excluded_reasons"]:
            md[-1] += " Excluded: " + ", ".join(f"{k} ({v})" for k, v in sorted(o["excluded_reasons"].items())) + "."
        md += ["", _markdown_table(SUMMARY_COLUMNS, summary_rows(s)), ""]
        task_rows = [
            [
                t,
                st["family"],
                str(st["valid"]),
                str(st["excluded"]),
                _pct(st["rates"]["host"]["rate"]),
                _pct(st["rates"]["strict"]["rate"]),
                _num(st["mean_requests"]),
            ]
            for t, st in s["by_task"].items()
        ]
        md += ["<details><summary>Per task</summary>", ""]
        md += [_markdown_table(("task", "family", "valid", "excl.", "host %", "strict %", "req"), task_rows), ""]
        md += ["</details>", ""]
    md += ["## Plots", "", "![host and strict success](success.png)", "", "![outcome classes](outcomes.png)", ""]
    if comparisons:
        a, b = names
        pairing = next(iter(comparisons.values()))["pairing"]
        md += [f"## Paired comparison: {b} vs {a}", ""]
        md += [pairing_text(pairing, a, b), ""]
        for m, comp in comparisons.items():
            md += [
                f"### {m} success",
                "",
                _markdown_table(compare_columns(comp["labels"]), comparison_rows(comp)),
                "",
                interpret(comp),
                "",
            ]
        md += [
            f"b counts pairs where {a} succeeded and {b} failed, c the reverse; p is the exact two-sided McNemar "
            f"test on b and c; per-family p-values are not corrected for multiple comparisons. Bootstrap: "
            f"{resamples} task-cluster resamples, seed {seed}.",
            "",
            "![paired difference](difference.png)",
            "",
        ]
    report_md = out / "report.md"
    report_md.write_text("\n".join(md))
    payload = {
        "generated_unix_s": time.time(),
        "labels": names,
        "sources": list(sources) if sources else None,
        "metric": metric,
        "summaries": summaries,
        "comparisons": comparisons,
        "plots": {k: p.name for k, p in plots.items()},
        "episodes": {n: [asdict(r) for r in rs] for n, rs in zip(names, relabelled, strict=True)},
    }
    (out / "report.json").write_text(json.dumps(payload, indent=1, allow_nan=False, default=_json_default))
    return report_md


def load_nonempty(path: str, label: str | None) -> list[EvalRow]:
    """`load_rows`, or an EvaluationError naming the store (and how many episodes have not ended) when it has none."""
    rows = load_rows(path, label)
    if not rows:
        still_open = open_episodes(path)
        hint = f" ({still_open} episodes have not ended)" if still_open else ""
        raise EvaluationError(f"{path} has no complete episodes{hint}: run rollouts into it first")
    return rows

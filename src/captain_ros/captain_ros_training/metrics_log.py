"""The training runs' metrics log: one JSON object per line, strict JSON (NaN and inf written as null), appended by
each RL update (captain_ros_training.rl_trainer) and each SFT step of `python -m captain_ros_training rl sft`
(captain_ros_training.sft_command), and its plot, one panel per metric (`python -m captain_ros_training rl plot`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def append_metrics(path: str | Path, row: dict[str, Any]) -> None:
    """One JSON object per line; NaN/inf become null so the file stays strict JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(_finite(row), sort_keys=True) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


PLOT_KEYS = (
    "success_rate",
    "strict_success_rate",
    "false_finish_rate",
    "missed_finish_rate",
    "loss",
    "kl_k3",
    "kept_frac",
    "adv_mean",
    "adv_std",
    "critic_auc",
    "critic_within_group_auc",
    "requests_per_episode",
    "reward_mean",
    "tokens",
)


def plot_metrics(path: str | Path, out: str | Path, keys: Sequence[str] = PLOT_KEYS) -> Path:
    """One panel per metric against the update index (missing or null values skipped), written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    cols = min(4, max(1, len(keys)))
    n_rows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.6 * cols, 2.6 * n_rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        points = [(r.get("update", i), r[key]) for i, r in enumerate(rows) if r.get(key) is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_title(key)
        ax.set_xlabel("update")
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["PLOT_KEYS", "append_metrics", "plot_metrics", "read_metrics"]

"""The simulator critic (CaPtain Eq. 3-4, App. A.2 "Critic"): the probability of host success from privileged state.

V(s, t) = sigmoid(mean_k f_k([x(s); t; onehot(task)])) with five MLPs of three hidden layers (256, ReLU) whose
*logits* are averaged, trained with binary cross-entropy against the host success of the episode a state belongs to
(every request state of an episode carries that episode's label). It reads only the 36 privileged physical features
of `captain_ros.twin.features.FEATURE_NAMES`, the request index and the task: counters of the policy's own
behaviour are left out on purpose, because they act as proxies for elapsed time and leak credit onto perception
requests (CaPtain §4.5).

Design choices, and why:
- The ensemble's weights are stacked tensors ([members, in, out]) so training runs all members in one batched
  matmul; inference walks the members one at a time over row chunks of `eval_chunk_rows`, which keeps each
  member's activations in cache. On this 2-core CPU that is about 3x faster than one big batched matmul over all
  rows, and it is what makes the credit of 1,024 x 40 requests fit in the 1 s budget (bench/advantages.py).
- Features are standardised with the mean/std of the first data the critic is trained on (the warm start) and then
  frozen: moving them during co-training would shift every input under the trained network. Constant features get
  std 1. The request index enters as t / `request_scale_n` (the 60-request budget), so it lies in (0, 1].
- One AdamW optimizer lives with the critic, across the warm start and every co-training round (SAO-style
  streaming), and is saved with it.
- `snapshot()` is a deep copy: each round's advantages use the critic from *before* that round's update (Eq. 4's
  text), even when the update runs while the advantages are still being consumed.

Metrics: AUC is the rank statistic (Mann-Whitney U with average ranks for ties); within-group AUC is that AUC
inside each start-state group over its request states, averaged over the groups that hold both labels; Brier is the
mean squared error of the probability; the calibration plot is a reliability diagram.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as nnf

from captain_ros.twin.features import FEATURE_NAMES  # x(s) of CaPtain App. A.2 (no MuJoCo import)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class CriticConfig:
    """CaPtain App. A.2 "Critic" plus the choices the paper leaves open (optimizer settings, scaling of t)."""

    tasks: tuple[str, ...] = field(default=(), metadata={"help": "task vocabulary: the one-hot's order"})
    members: int = field(default=5, metadata={"help": "CaPtain Eq. 3: MLPs in the ensemble (logits averaged)"})
    hidden: int = field(default=256, metadata={"help": "CaPtain App. A.2: units per hidden layer"})
    layers: int = field(default=3, metadata={"help": "CaPtain App. A.2: hidden layers per MLP (ReLU)"})
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate (warm start and co-training)"})
    weight_decay: float = field(default=1e-4, metadata={"help": "AdamW weight decay"})
    warm_start_epochs: int = field(default=20, metadata={"help": "epochs of `fit` when none are given"})
    co_train_steps: int = field(
        default=2, metadata={"help": "CaPtain App. A.2: full-batch AdamW steps per round of co-training"}
    )
    batch_size: int = field(default=1024, metadata={"help": "request states per minibatch of the warm start"})
    seed: int = field(default=0, metadata={"help": "initialisation and minibatch order"})
    request_scale_n: float = field(default=60.0, metadata={"help": "t enters the MLP as t / this (request budget)"})
    eval_chunk_rows: int = field(default=8192, metadata={"help": "rows per chunk at inference (cache-sized)"})

    @property
    def in_features(self) -> int:
        return len(FEATURE_NAMES) + 1 + len(self.tasks)


@dataclass
class CriticStates:
    """Request states as tensors, one row per request of each used episode (CaPtain Eq. 3's inputs, Eq. 4's y)."""

    features: Tensor  # [N, 36] float32, raw (not normalised), FEATURE_NAMES order
    t: Tensor  # [N] float32, request index from 1
    task: Tensor  # [N] int64, index into the task vocabulary
    task_onehot: Tensor  # [N, n_tasks] float32
    labels: Tensor  # [N] float32, host success of the state's episode (Eq. 4's y_i)
    episode: Tensor  # [N] int64, position of the state's episode in the list given to states_from_episodes
    group: Tensor  # [N] int64, index into group_ids (start-state group)
    group_ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def subset(self, rows: Tensor | np.ndarray) -> CriticStates:
        """The rows selected by a boolean mask or an index array (group_ids kept whole)."""
        rows = torch.as_tensor(rows)
        return CriticStates(
            self.features[rows],
            self.t[rows],
            self.task[rows],
            self.task_onehot[rows],
            self.labels[rows],
            self.episode[rows],
            self.group[rows],
            list(self.group_ids),
        )


def features_of(step: dict[str, Any]) -> list[float]:
    """x(s_t) of CaPtain App. A.2 from a `step` record: the snapshot's 36 features in FEATURE_NAMES order."""
    feats = step["snapshot"]["features"]
    if isinstance(feats, dict):
        return [float(feats[name]) for name in FEATURE_NAMES]
    if len(feats) != len(FEATURE_NAMES):
        raise ValueError(f"expected {len(FEATURE_NAMES)} features, got {len(feats)}")
    return [float(v) for v in feats]


def episode_label(end: dict[str, Any] | None) -> float | None:
    """Eq. 4's y_i: the episode's host success (None when it has none: incomplete or infrastructure failure)."""
    if not end or end.get("host_success") is None:
        return None
    return 1.0 if end["host_success"] else 0.0


def states_from_episodes(episodes: Sequence[Any], tasks: Sequence[str]) -> CriticStates:
    """Every request state of every usable episode (complete, valid, with a host-success label), CaPtain Eq. 4.

    `episodes` are `captain_ros.bridge.store.Episode`s; requests without a `step` record are skipped. A task that
    is not in `tasks` raises: a silently all-zero one-hot would make a new task look like an average one."""
    vocab = {name: i for i, name in enumerate(tasks)}
    feats: list[list[float]] = []
    t_idx, task_idx, labels, ep_idx, grp = [], [], [], [], []
    group_ids: dict[str, int] = {}
    for e, episode in enumerate(episodes):
        label = episode_label(episode.end)
        if label is None or not episode.end.get("valid", True):
            continue
        task = episode.start["task"]
        if task not in vocab:
            raise KeyError(f"task {task!r} is not in the critic's vocabulary ({len(vocab)} tasks)")
        g = group_ids.setdefault(str(episode.start.get("group_id", episode.episode_id)), len(group_ids))
        for request in sorted(episode.requests, key=lambda r: r.index):
            if request.step is None:
                continue
            feats.append(features_of(request.step))
            t_idx.append(request.index)
            task_idx.append(vocab[task])
            labels.append(label)
            ep_idx.append(e)
            grp.append(g)
    task_t = torch.tensor(task_idx, dtype=torch.int64)
    return CriticStates(
        features=torch.tensor(feats, dtype=torch.float32).reshape(-1, len(FEATURE_NAMES)),
        t=torch.tensor(t_idx, dtype=torch.float32),
        task=task_t,
        task_onehot=nnf.one_hot(task_t, len(tasks)).float() if len(tasks) else torch.zeros(len(task_idx), 0),
        labels=torch.tensor(labels, dtype=torch.float32),
        episode=torch.tensor(ep_idx, dtype=torch.int64),
        group=torch.tensor(grp, dtype=torch.int64),
        group_ids=list(group_ids),
    )


def split_by_group(states: CriticStates, held_out_fraction: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Boolean (train, held_out) row masks that keep each start-state group whole, so a held-out AUC is not
    inflated by sibling rollouts of the same start in the training set."""
    n_groups = len(states.group_ids)
    if not n_groups and len(states):
        n_groups = int(states.group.max()) + 1
    rng = np.random.default_rng(seed)
    held_groups = rng.permutation(n_groups)[: max(1, round(held_out_fraction * n_groups))] if n_groups else []
    held = torch.zeros(max(n_groups, 1), dtype=torch.bool)
    held[torch.as_tensor(held_groups, dtype=torch.int64)] = True
    held_rows = held[states.group]
    return ~held_rows, held_rows


class EnsembleMLP(nn.Module):
    """CaPtain Eq. 3's f_1..f_K: K MLPs (`layers` hidden layers of `hidden`, ReLU), weights stacked per layer."""

    def __init__(self, in_features: int, hidden: int, layers: int, members: int, generator: torch.Generator):
        super().__init__()
        sizes = [in_features] + [hidden] * layers + [1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default initialisation, one draw per member
            w = (torch.rand(members, fan_in, fan_out, generator=generator) * 2 - 1) * bound
            b = (torch.rand(members, 1, fan_out, generator=generator) * 2 - 1) * bound
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    @property
    def members(self) -> int:
        return int(self.weights[0].shape[0])

    def member_logits(self, x: Tensor) -> Tensor:
        """[K, N] logits of every member (batched matmul; the training path)."""
        h = x.unsqueeze(0).expand(self.members, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = torch.relu(h)
        return h.squeeze(-1)

    def forward(self, x: Tensor) -> Tensor:
        """CaPtain Eq. 3 inside the sigmoid: the members' mean logit, [N]."""
        return self.member_logits(x).mean(0)

    @torch.no_grad()
    def mean_logit_chunked(self, x: Tensor, chunk_rows: int) -> Tensor:
        """The same as forward(x), computed member by member over row chunks (the fast inference path)."""
        out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        last = len(self.weights) - 1
        for start in range(0, x.shape[0], chunk_rows):
            xc = x[start : start + chunk_rows]
            acc = torch.zeros(xc.shape[0], 1, dtype=x.dtype, device=x.device)
            for k in range(self.members):
                h = xc
                for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                    h = torch.addmm(b[k], h, w[k])
                    if i < last:
                        h.relu_()
                acc += h
            out[start : start + chunk_rows] = acc.squeeze(1) / self.members
        return out


class Critic:
    """CaPtain's simulator critic V_phi(s, t) (Eq. 3), its loss (Eq. 4), warm start, co-training and metrics."""

    def __init__(self, config: CriticConfig, device: str | torch.device = "cpu"):
        if not config.tasks:
            raise ValueError("CriticConfig.tasks is empty: the critic needs the task vocabulary for its one-hot")
        self.config = config
        self.device = torch.device(device)
        generator = torch.Generator().manual_seed(config.seed)
        self.model = EnsembleMLP(config.in_features, config.hidden, config.layers, config.members, generator)
        self.model.to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.feature_mean: Tensor | None = None  # [36], set by the first training call, then frozen
        self.feature_std: Tensor | None = None
        self._epochs_done = 0

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.config.tasks

    # ------------------------------------------------------------------ inputs
    def set_normalisation(self, features: Tensor) -> None:
        """Freeze the feature mean/std from training data (std 1 where a feature is constant)."""
        f = features.to(torch.float64)
        std = f.std(0, unbiased=False) if len(f) else torch.ones(f.shape[1], dtype=torch.float64)
        mean = f.mean(0) if len(f) else torch.zeros(f.shape[1], dtype=torch.float64)
        self.feature_mean = mean.float().to(self.device)
        self.feature_std = torch.where(std > 1e-6, std, torch.ones_like(std)).float().to(self.device)

    def inputs(self, features: Tensor, t: Tensor, task: Tensor) -> Tensor:
        """[x(s); t; onehot(task)] of CaPtain Eq. 3, normalised: [N, in_features] float32 on the critic's device."""
        if self.feature_mean is None:
            raise RuntimeError("the critic has no feature normalisation yet: train it (fit / co_train) first")
        x = (features.to(self.device, torch.float32) - self.feature_mean) / self.feature_std
        tt = (t.to(self.device, torch.float32) / self.config.request_scale_n).reshape(-1, 1)
        onehot = nnf.one_hot(task.to(self.device, torch.int64), len(self.tasks)).float()
        return torch.cat([x, tt, onehot], dim=1)

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def value_of(self, features: Tensor, t: Tensor, task: Tensor) -> Tensor:
        """V(s, t) of CaPtain Eq. 3 for rows of raw features, request indices and task indices: [N] float32."""
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model.mean_logit_chunked(self.inputs(features, t, task), self.config.eval_chunk_rows)
        finally:
            self.model.train(was_training)
        return torch.sigmoid(logits)

    def values(self, states: CriticStates, t_override: Tensor | float | None = None) -> Tensor:
        """V(s, t) for every state (CaPtain Eq. 3); `t_override` replaces the states' own request index, the way
        Eq. 9 evaluates V(s_{t+1}, t) at the *earlier* index."""
        t = states.t if t_override is None else torch.as_tensor(t_override, dtype=torch.float32).expand_as(states.t)
        return self.value_of(states.features, t, states.task)

    # ------------------------------------------------------------------ training
    def loss(self, states: CriticStates) -> Tensor:
        """CaPtain Eq. 4: binary cross-entropy of sigmoid(mean logit) against host success (mean over states; the
        paper's sum differs by a constant factor that AdamW does not see)."""
        logits = self.model(self.inputs(states.features, states.t, states.task))
        return nnf.binary_cross_entropy_with_logits(logits, states.labels.to(self.device))

    def _ensure_normalisation(self, states: CriticStates) -> None:
        if self.feature_mean is None:
            self.set_normalisation(states.features)

    def fit(self, states: CriticStates, epochs: int | None = None) -> list[float]:
        """Warm start (CaPtain App. A.2): minibatch AdamW on Eq. 4 over `epochs` passes; returns each epoch's
        mean loss. Continues the critic's optimizer, so calling it twice trains further."""
        self._ensure_normalisation(states)
        epochs = self.config.warm_start_epochs if epochs is None else epochs
        n = len(states)
        if n == 0:
            return []
        x_all = self.inputs(states.features, states.t, states.task)
        y_all = states.labels.to(self.device)
        self.model.train()
        losses = []
        for _ in range(epochs):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.config.seed + self._epochs_done))
            self._epochs_done += 1
            total = 0.0
            for start in range(0, n, self.config.batch_size):
                rows = order[start : start + self.config.batch_size].to(self.device)
                loss = nnf.binary_cross_entropy_with_logits(self.model(x_all[rows]), y_all[rows])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                total += float(loss.detach()) * len(rows)
            losses.append(total / n)
        return losses

    def co_train(self, states: CriticStates, steps: int | None = None) -> list[float]:
        """Online co-training (CaPtain App. A.2, as in SAO): `steps` (2) full-batch AdamW steps of Eq. 4 over all
        request states of the round. Returns the loss before each step."""
        self._ensure_normalisation(states)
        steps = self.config.co_train_steps if steps is None else steps
        if len(states) == 0:
            return []
        self.model.train()
        losses = []
        for _ in range(steps):
            loss = self.loss(states)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
        return losses

    def snapshot(self) -> Critic:
        """An independent copy (weights, optimizer state, normalisation): the critic *before* a round's update, for
        that round's advantages (CaPtain App. A.2)."""
        return copy.deepcopy(self)

    def to(self, device: str | torch.device) -> Critic:
        self.device = torch.device(device)
        self.model.to(self.device)
        if self.feature_mean is not None:
            self.feature_mean = self.feature_mean.to(self.device)
            self.feature_std = self.feature_std.to(self.device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor) and value.dim() > 0:
                    state[key] = value.to(self.device)
        return self

    # ------------------------------------------------------------------ save / load
    def state(self) -> dict[str, Any]:
        """Everything needed to restore the critic exactly: config, weights, optimizer, normalisation, vocabulary."""
        config = asdict(self.config)
        config["tasks"] = list(self.config.tasks)
        return {
            "format_version": FORMAT_VERSION,
            "config": config,
            "feature_names": list(FEATURE_NAMES),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "feature_mean": None if self.feature_mean is None else self.feature_mean.cpu(),
            "feature_std": None if self.feature_std is None else self.feature_std.cpu(),
            "epochs_done": self._epochs_done,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state(), path)
        return path

    @classmethod
    def from_state(cls, state: dict[str, Any], device: str | torch.device = "cpu") -> Critic:
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"critic format {state.get('format_version')!r}, expected {FORMAT_VERSION}")
        if list(state["feature_names"]) != list(FEATURE_NAMES):
            raise ValueError("the saved critic was trained on a different feature list")
        config = dict(state["config"])
        config["tasks"] = tuple(config["tasks"])
        critic = cls(CriticConfig(**config), device)
        critic.model.load_state_dict(state["model"])
        critic.optimizer.load_state_dict(state["optimizer"])
        if state["feature_mean"] is not None:
            critic.feature_mean = state["feature_mean"].to(critic.device)
            critic.feature_std = state["feature_std"].to(critic.device)
        critic._epochs_done = int(state["epochs_done"])
        return critic

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> Critic:
        return cls.from_state(torch.load(path, map_location="cpu", weights_only=True), device)


# ---------------------------------------------------------------------- metrics
def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of the ranks they span (what the Mann-Whitney U statistic needs)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(xs)]  # exclusive
    mean_rank = (starts + ends + 1) / 2.0  # mean of starts+1 .. ends
    ranks = np.empty(len(xs))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def auc(scores: np.ndarray | Tensor, labels: np.ndarray | Tensor) -> float:
    """ROC AUC as P(score of a positive > score of a negative) + 0.5 P(tie), via ranks; NaN without both labels."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel() > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = average_ranks(s)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def within_group_auc(scores: np.ndarray | Tensor, labels: np.ndarray | Tensor, groups: np.ndarray | Tensor) -> float:
    """AUC inside each start-state group (its rollouts' request states), averaged over the groups that hold both
    labels (CaPtain §4.5's "within-group AUC"); NaN when no group does."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    g = np.asarray(groups).ravel()
    per_group = [auc(s[g == k], y[g == k]) for k in np.unique(g)]
    per_group = [a for a in per_group if not math.isnan(a)]
    return float(np.mean(per_group)) if per_group else float("nan")


def brier(scores: np.ndarray | Tensor, labels: np.ndarray | Tensor) -> float:
    """Mean squared error of the predicted probability against the 0/1 label."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    return float(np.mean((s - y) ** 2)) if len(s) else float("nan")


def calibration_bins(scores: np.ndarray | Tensor, labels: np.ndarray | Tensor, bins: int = 10) -> dict[str, Any]:
    """Reliability table over equal-width probability bins: count, mean prediction and positive rate per bin, and
    the expected calibration error (count-weighted |rate - prediction|)."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    which = np.clip((s * bins).astype(np.int64), 0, bins - 1)
    count = np.bincount(which, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred = np.bincount(which, weights=s, minlength=bins) / count
        rate = np.bincount(which, weights=y, minlength=bins) / count
    filled = count > 0
    ece = float(np.sum(count[filled] * np.abs(rate[filled] - mean_pred[filled])) / max(count.sum(), 1.0))
    return {"edges": np.linspace(0, 1, bins + 1), "count": count, "mean_pred": mean_pred, "rate": rate, "ece": ece}


def calibration_plot(
    scores: np.ndarray | Tensor, labels: np.ndarray | Tensor, path: str | Path, bins: int = 10, title: str = ""
) -> Path:
    """A reliability diagram (positive rate against mean prediction per bin, with the diagonal) written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = calibration_bins(scores, labels, bins)
    filled = table["count"] > 0
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(4.5, 5.5), height_ratios=[3, 1], sharex=True)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect")
    ax.plot(table["mean_pred"][filled], table["rate"][filled], marker="o", label=f"critic (ECE {table['ece']:.3f})")
    ax.set_ylabel("host success rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    ax.set_title(title or "critic calibration")
    centers = (table["edges"][:-1] + table["edges"][1:]) / 2
    hist.bar(centers, table["count"], width=1.0 / bins, color="tab:blue", alpha=0.6)
    hist.set_xlabel("predicted V(s, t)")
    hist.set_ylabel("states")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def evaluate(critic: Critic, states: CriticStates, plot_path: str | Path | None = None) -> dict[str, float]:
    """Held-out metrics of the critic on `states`: AUC, within-group AUC, Brier, ECE, mean value and base rate."""
    v = critic.values(states).cpu().numpy()
    y = states.labels.cpu().numpy()
    metrics = {
        "auc": auc(v, y),
        "within_group_auc": within_group_auc(v, y, states.group.cpu().numpy()),
        "brier": brier(v, y),
        "ece": calibration_bins(v, y)["ece"] if len(v) else float("nan"),
        "mean_value": float(v.mean()) if len(v) else float("nan"),
        "positive_rate": float(y.mean()) if len(y) else float("nan"),
        "states": float(len(v)),
    }
    if plot_path is not None and len(v):
        calibration_plot(v, y, plot_path)
    return metrics

"""Per-request credit from the simulator critic (CaPtain Eq. 5/9-10, App. A.2 "Advantage", App. E early stopping).

For episode i with requests t = 1..T (CaPtain Eq. 9, the same as Eq. 5):

    delta_t = c_t + V(s_{t+1}, t) - V(s_t, t)      (t < T)
    delta_T = c_T + R_i - V(s_T, T)
    A^GAE_t = sum_{k>=0} lambda^k delta_{t+k}        (lambda = 0.9, no discount)
    A_{i,t} = (G_i - mean_group G) + (A^GAE_{i,t} - mean_t A^GAE_{i,.}),   G_i = R_i + sum_t c_t     (Eq. 10)

Both values of a one-step difference use the *same* index t, so the passage of time alone produces no credit: a
request that only perceives leaves the physical state unchanged and gets delta ~ c_t. s_t is the privileged
snapshot taken before request t (the `step` record of request t), so s_{t+1} is the state request t left behind.
The critic input's t is the recorded request index of the state.

Normalisation: A is divided by a running estimate of its standard deviation and never re-centred (App. A.2).
`RunningStd` keeps bias-corrected exponential moving averages of E[A] and E[A^2] with one update per round
(momentum 0.9 by default, i.e. about the last ten rounds), so the scale follows an improving policy instead of
being frozen by the early rounds the way a Welford average over all history would be; the mean is estimated only to
form the variance and is never subtracted from A. Each round first updates the estimate with its own raw
advantages, then divides, so the very first round is scaled by its own std.

Error-only requests (App. A.2: "a request whose cells only produced Python errors receives no positive credit, and
its tokens receive a small additional penalty"): after normalisation, A <- min(A, 0) - `error_penalty`. The penalty
is in units of the normalised advantage, so it means the same at every reward scale. How a request is judged
error-only from the records is documented on `error_only_request`.

Everything runs vectorised on episodes padded to [E, T_max] with a mask: one critic forward over all the
(2T - 1) states per episode (fewer where a request left the state bit-for-bit unchanged), GAE as one [T, T] matmul.
`advantages_loop` is the plain per-episode reference that the tests compare against. The forward pass is the whole
cost: the paper-sized ensemble needs about 122 GFLOP for 1,024 x 40 requests, about 0.8-0.95 s on a 2-core CPU
(bench/advantages.py), a fraction of that on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from captain_ros_training.critic import features_of


@dataclass(frozen=True)
class CreditConfig:
    """CaPtain App. A.2 "Advantage" constants and the choices the paper leaves open."""

    lam: float = field(default=0.9, metadata={"help": "CaPtain Eq. 9: GAE lambda (no discount)"})
    error_penalty: float = field(
        default=0.1, metadata={"help": "subtracted from an error-only request's normalised advantage (after <= 0)"}
    )
    std_momentum: float = field(default=0.9, metadata={"help": "RunningStd: EMA momentum per round"})
    min_std: float = field(default=1e-3, metadata={"help": "RunningStd: floor of the std advantages are divided by"})


@dataclass(frozen=True)
class EarlyStopConfig:
    """CaPtain App. E: cut an episode when V < 0.02 for 5 consecutive requests after request 5; a deterministic 5%
    control slice (and the hard tasks, App. A.2) is never cut. A cut episode settles as budget-exhausted."""

    value_threshold: float = field(default=0.02, metadata={"help": "V below this counts toward a cut"})
    consecutive_n: int = field(default=5, metadata={"help": "consecutive low-value requests that cut"})
    after_request_n: int = field(default=5, metadata={"help": "only requests after this index count"})
    control_fraction: float = field(default=0.05, metadata={"help": "share of episode ids never cut"})


# ---------------------------------------------------------------------- running std
@dataclass
class RunningStd:
    """A running advantage std for CaPtain App. A.2's "divide by a running estimate of the advantage standard
    deviation, without re-centering": bias-corrected EMAs of E[A] and E[A^2], one update per call (round)."""

    momentum: float = 0.9
    min_std: float = 1e-3
    ema_mean: float = 0.0  # biased EMAs (as in Adam), corrected by 1 - momentum^updates
    ema_sq: float = 0.0
    updates: int = 0

    def update(self, values: np.ndarray | Tensor) -> float:
        """Fold one round's advantages into the estimate; returns the new std. An empty round changes nothing."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size:
            b = self.momentum
            self.ema_mean = b * self.ema_mean + (1 - b) * float(v.mean())
            self.ema_sq = b * self.ema_sq + (1 - b) * float(np.mean(v * v))
            self.updates += 1
        return self.std

    @property
    def std(self) -> float:
        if self.updates == 0:
            return 1.0
        correction = 1.0 - self.momentum**self.updates
        mean, sq = self.ema_mean / correction, self.ema_sq / correction
        return max(math.sqrt(max(sq - mean * mean, 0.0)), self.min_std)

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """values / std: scaled, never re-centred."""
        return np.asarray(values) / self.std

    def state_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in ("momentum", "min_std", "ema_mean", "ema_sq", "updates")}

    def load_state_dict(self, state: dict[str, float]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value) if key == "updates" else float(value))


# ---------------------------------------------------------------------- early stopping (App. E)
def in_control_slice(episode_id: str, fraction: float = 0.05) -> bool:
    """CaPtain App. E's control slice: the first 8 bytes of sha256(episode id) as a fraction of 2^64 fall below
    `fraction`. Deterministic across processes and machines (unlike Python's salted hash())."""
    digest = hashlib.sha256(episode_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


def cut_request(
    values: Sequence[float], episode_id: str, config: EarlyStopConfig = EarlyStopConfig(), hard: bool = False
) -> int | None:
    """CaPtain App. E early stop: `values[k]` is V(s_{k+1}, k+1), the critic's value at request k+1. Returns the
    request (from 1) at which the episode is cut: the 5th consecutive request with V < 0.02 among requests
    6, 7, ... (requests up to `after_request_n` never count, so the earliest cut is request 10). None for no cut,
    for the control slice and for hard tasks."""
    if hard or in_control_slice(episode_id, config.control_fraction):
        return None
    return rule_cut_request(values, config)


def rule_cut_request(values: Sequence[float], config: EarlyStopConfig = EarlyStopConfig()) -> int | None:
    """`cut_request` without its exemptions: where the rule alone would cut (for the control slice, the request at
    which it would have been cut had it not been in the slice: App. E's false-stop measurement)."""
    run = 0
    for k, value in enumerate(values):
        request = k + 1
        if request <= config.after_request_n:
            continue
        run = run + 1 if value < config.value_threshold else 0
        if run >= config.consecutive_n:
            return request
    return None


def should_cut(
    values: Sequence[float], episode_id: str, config: EarlyStopConfig = EarlyStopConfig(), hard: bool = False
) -> bool:
    """CaPtain App. E: whether the critic values seen so far cut the episode (pure; see `cut_request`)."""
    return cut_request(values, episode_id, config, hard) is not None


# ---------------------------------------------------------------------- error-only requests
CELL_ERROR_MARKER = "[error]"  # captain_ros.agent.episode prefixes every failed cell / malformed call reply with it


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def well_formed_python_call(call: dict[str, Any]) -> bool:
    """The harness would run this tool call as a cell (name `python`, JSON arguments with non-empty `code`)."""
    function = call.get("function") or {}
    if function.get("name") != "python":
        return False
    raw = function.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except (TypeError, ValueError):
        return False
    code = arguments.get("code") if isinstance(arguments, dict) else None
    return isinstance(code, str) and bool(code.strip())


def _replies_to_last_assistant(messages: list[dict[str, Any]]) -> list[str]:
    """The tool replies that follow the last assistant message of a prompt (the previous request's cell outputs)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        return []
    return [_text(m.get("content")) for m in messages[last + 1 :] if m.get("role") == "tool"]


def _failed_reply(text: str) -> bool:
    return text.lstrip().startswith(CELL_ERROR_MARKER) or f"\n{CELL_ERROR_MARKER} (" in text


def error_only_request(request: Any, next_request: Any | None = None) -> bool:
    """Whether request t produced only errors (CaPtain App. A.2), judged from the records.

    - Not error-only when any robot call of the step succeeded: the cell did something real before it failed.
    - Error-only when the response has no tool call (nothing ran) or when every tool call is malformed (not the
      `python` tool, arguments not JSON, empty code): the harness answered each with an `[error]` reply.
    - Otherwise a cell ran; its output is visible only in the *next* request's prompt, whose messages end with the
      tool replies to this request. Error-only when every one of those replies carries the harness's cell-error
      marker (`[error] (error|timeout|crashed|output_limit)`).
    - The last request (no next prompt) and a request without a model call are never judged error-only: no
      penalty without evidence."""
    call = request.model_call
    if not call:
        return False
    step = request.step or {}
    if any(c.get("success") for c in step.get("calls", [])):
        return False
    tool_calls = (call.get("response") or {}).get("tool_calls") or []
    if not tool_calls or not any(well_formed_python_call(c) for c in tool_calls):
        return True
    if next_request is None or not next_request.model_call:
        return False
    replies = _replies_to_last_assistant(next_request.model_call.get("messages") or [])
    return bool(replies) and all(_failed_reply(text) for text in replies)


# ---------------------------------------------------------------------- inputs
@dataclass
class EpisodeCredit:
    """What credit needs of one episode: its states, costs c_t, terminal return R_i and error-only flags."""

    episode_id: str
    group_id: str
    task: int  # index into the critic's task vocabulary
    features: np.ndarray  # [T, 36] raw privileged features of s_1..s_T
    costs: np.ndarray  # [T] c_t (App. E, <= 0)
    reward: float  # R_i (Eq. 7, with the sub-goal reward)
    error_only: np.ndarray  # [T] bool
    requests: np.ndarray  # [T] request index of each state (1..T unless a step is missing)

    def __len__(self) -> int:
        return len(self.costs)


def episode_credit(episode: Any, tasks: Sequence[str]) -> EpisodeCredit | None:
    """An `EpisodeCredit` from a stored `Episode`; None for an incomplete or invalid one (never trained on)."""
    end = episode.end
    if not end or not end.get("valid") or end.get("reward") is None:
        return None
    requests = sorted((r for r in episode.requests if r.step is not None), key=lambda r: r.index)
    if not requests:
        return None
    by_index = {r.index: r for r in episode.requests}
    task = episode.start["task"]
    if task not in tasks:
        raise KeyError(f"task {task!r} is not in the critic's vocabulary")
    return EpisodeCredit(
        episode_id=episode.episode_id,
        group_id=str(episode.start.get("group_id", episode.episode_id)),
        task=list(tasks).index(task),
        features=np.asarray([features_of(r.step) for r in requests], dtype=np.float32),
        costs=np.asarray([float(r.step["costs"]["total"]) for r in requests], dtype=np.float64),
        reward=float(end["reward"]),
        error_only=np.asarray([error_only_request(r, by_index.get(r.index + 1)) for r in requests], dtype=bool),
        requests=np.asarray([r.index for r in requests], dtype=np.int64),
    )


@dataclass
class CreditBatch:
    """Episodes padded to [E, T_max]; `mask` marks real requests. Groups are indices into `group_ids`."""

    features: np.ndarray  # [E, T, 36] float32
    requests: np.ndarray  # [E, T] float32 request index (0 in padding)
    task: np.ndarray  # [E] int64
    costs: np.ndarray  # [E, T] float64
    reward: np.ndarray  # [E] float64
    error_only: np.ndarray  # [E, T] bool
    mask: np.ndarray  # [E, T] bool
    lengths: np.ndarray  # [E] int64
    group: np.ndarray  # [E] int64
    episode_ids: list[str]
    group_ids: list[str]


def pad_episodes(episodes: Sequence[EpisodeCredit]) -> CreditBatch:
    """Stack episodes into one padded batch (CaPtain Eq. 9-10 then run on all of them at once)."""
    n, width = len(episodes), max((len(e) for e in episodes), default=0)
    n_feat = episodes[0].features.shape[1] if episodes else 0
    lengths = np.asarray([len(e) for e in episodes], dtype=np.int64)
    mask = np.arange(width)[None, :] < lengths[:, None]
    features = np.zeros((n, width, n_feat), dtype=np.float32)
    requests = np.zeros((n, width), dtype=np.float32)
    costs = np.zeros((n, width), dtype=np.float64)
    error_only = np.zeros((n, width), dtype=bool)
    for i, e in enumerate(episodes):
        features[i, : len(e)] = e.features
        requests[i, : len(e)] = e.requests
        costs[i, : len(e)] = e.costs
        error_only[i, : len(e)] = e.error_only
    group_ids: dict[str, int] = {}
    group = np.asarray([group_ids.setdefault(e.group_id, len(group_ids)) for e in episodes], dtype=np.int64)
    return CreditBatch(
        features=features,
        requests=requests,
        task=np.asarray([e.task for e in episodes], dtype=np.int64),
        costs=costs,
        reward=np.asarray([e.reward for e in episodes], dtype=np.float64),
        error_only=error_only,
        mask=mask,
        lengths=lengths,
        group=group,
        episode_ids=[e.episode_id for e in episodes],
        group_ids=list(group_ids),
    )


def batch_from_episodes(episodes: Sequence[Any], tasks: Sequence[str]) -> CreditBatch:
    """The padded credit batch of the complete, valid stored episodes among `episodes`."""
    return pad_episodes([c for c in (episode_credit(e, tasks) for e in episodes) if c is not None])


# ---------------------------------------------------------------------- critic values
class ValueModel(Protocol):
    """Anything with the critic's `value_of(features [N, F], t [N], task [N]) -> V [N]`
    (captain_ros_training.critic.Critic)."""

    def value_of(self, features: Tensor, t: Tensor, task: Tensor) -> Tensor: ...


def critic_values(critic: ValueModel, batch: CreditBatch) -> tuple[np.ndarray, np.ndarray]:
    """The two values of CaPtain Eq. 9 for every request, in one forward pass over all rows:
    v_cur[e, t] = V(s_t, t) and v_next[e, t] = V(s_{t+1}, t) (the NEXT state at THIS request's index; 0 at the
    last request and in padding). Both [E, T] float64.

    A request that left the privileged state bit-for-bit unchanged (s_{t+1} == s_t, typical of perception-only
    requests) needs no second forward: V(s_{t+1}, t) = V(s_t, t) exactly, so its row is skipped."""
    mask = batch.mask
    feats_np = batch.features
    has_next = mask[:, 1:]  # position t has a successor state t + 1
    unchanged = has_next & np.all(feats_np[:, 1:] == feats_np[:, :-1], axis=-1)
    needs = has_next & ~unchanged
    feats = torch.from_numpy(feats_np)
    req = torch.from_numpy(batch.requests)
    m = torch.from_numpy(mask)
    nx = torch.from_numpy(np.ascontiguousarray(needs))
    task = torch.from_numpy(batch.task)[:, None].expand(mask.shape)
    rows_x = torch.cat([feats[m], feats[:, 1:][nx]])
    rows_t = torch.cat([req[m], req[:, :-1][nx]])  # the successor state is valued at the earlier index
    rows_task = torch.cat([task[m], task[:, :-1][nx]])
    v = critic.value_of(rows_x, rows_t, rows_task).detach().cpu().to(torch.float64).numpy()
    n_cur = int(mask.sum())
    v_cur = np.zeros(mask.shape)
    v_next = np.zeros(mask.shape)
    v_cur[mask] = v[:n_cur]
    v_next[:, :-1][needs] = v[n_cur:]
    v_next[:, :-1][unchanged] = v_cur[:, :-1][unchanged]
    return v_cur, v_next


# ---------------------------------------------------------------------- the equations, vectorised
def td_deltas(
    v_cur: np.ndarray, v_next: np.ndarray, costs: np.ndarray, reward: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """CaPtain Eq. 9 (Eq. 5): delta_t = c_t + V(s_{t+1}, t) - V(s_t, t) for t < T, delta_T = c_T + R - V(s_T, T).
    [E, T], zero in padding."""
    lengths = mask.sum(1)
    last = np.arange(mask.shape[1])[None, :] == (lengths - 1)[:, None]
    target = np.where(last, np.asarray(reward, dtype=np.float64)[:, None], v_next)
    return np.where(mask, costs + target - v_cur, 0.0)


def gae(deltas: np.ndarray, lam: float, mask: np.ndarray | None = None) -> np.ndarray:
    """CaPtain Eq. 9: A^GAE_t = sum_{k>=0} lambda^k delta_{t+k}, no discount, as deltas @ M^T with
    M[t, j] = lambda^(j - t) for j >= t (padding must hold zero deltas)."""
    width = deltas.shape[-1]
    offset = np.arange(width)[None, :] - np.arange(width)[:, None]  # j - t
    weights = np.where(offset >= 0, np.power(float(lam), np.maximum(offset, 0)), 0.0)
    out = deltas @ weights.T
    return out if mask is None else np.where(mask, out, 0.0)


def outcome_term(
    returns: np.ndarray, group: np.ndarray, gae_values: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The two centred pieces of CaPtain Eq. 10: (G_i - mean_group G) per episode [E], and
    (A^GAE_{i,t} - mean_t A^GAE_{i,.}) per request [E, T] (zero in padding)."""
    n_groups = int(group.max()) + 1 if len(group) else 0
    group_mean = np.bincount(group, weights=returns, minlength=n_groups) / np.bincount(group, minlength=n_groups)
    centred_g = returns - group_mean[group]
    lengths = np.maximum(mask.sum(1), 1)
    ep_mean = np.where(mask, gae_values, 0.0).sum(1) / lengths
    return centred_g, np.where(mask, gae_values - ep_mean[:, None], 0.0)


def penalise_error_only(advantages: np.ndarray, error_only: np.ndarray, penalty: float) -> np.ndarray:
    """CaPtain App. A.2: an error-only request gets no positive credit and a small penalty: min(A, 0) - penalty."""
    return np.where(error_only, np.minimum(advantages, 0.0) - penalty, advantages)


@dataclass
class Credit:
    """Every stage of CaPtain Eq. 9-10 for one batch (kept for the metrics log and the tests)."""

    deltas: np.ndarray  # [E, T] Eq. 9
    gae: np.ndarray  # [E, T]
    returns: np.ndarray  # [E] G_i = R_i + sum_t c_t
    outcome: np.ndarray  # [E] G_i - mean_group G
    raw: np.ndarray  # [E, T] A_{i,t} of Eq. 10 before scaling
    advantages: np.ndarray  # [E, T] raw / running std, error-only clamp and penalty applied: what tokens share
    std: float  # the running std the raw advantages were divided by
    mask: np.ndarray  # [E, T]
    episode_ids: list[str] = field(default_factory=list)

    def per_episode(self) -> dict[str, np.ndarray]:
        """Episode id -> its requests' advantages (unpadded)."""
        return {eid: self.advantages[i, : int(self.mask[i].sum())] for i, eid in enumerate(self.episode_ids)}

    def stats(self) -> dict[str, float]:
        a = self.advantages[self.mask]
        return {
            "adv_mean": float(a.mean()) if a.size else 0.0,
            "adv_std": float(a.std()) if a.size else 0.0,
            "adv_abs_mean": float(np.abs(a).mean()) if a.size else 0.0,
            "adv_positive_frac": float((a > 0).mean()) if a.size else 0.0,
            "adv_running_std": self.std,
            "delta_abs_mean": float(np.abs(self.deltas[self.mask]).mean()) if a.size else 0.0,
            "return_mean": float(self.returns.mean()) if self.returns.size else 0.0,
        }


def advantages(
    batch: CreditBatch,
    v_cur: np.ndarray,
    v_next: np.ndarray,
    running_std: RunningStd,
    config: CreditConfig = CreditConfig(),
    *,
    update_std: bool = True,
) -> Credit:
    """CaPtain Eq. 9-10 on a padded batch given the critic's values (see `critic_values`); updates `running_std`
    with the round's raw advantages (unless `update_std` is False) and divides by it without re-centring."""
    mask = batch.mask
    deltas = td_deltas(v_cur, v_next, batch.costs, batch.reward, mask)
    gae_values = gae(deltas, config.lam, mask)
    returns = batch.reward + np.where(mask, batch.costs, 0.0).sum(1)
    centred_g, centred_gae = outcome_term(returns, batch.group, gae_values, mask)
    raw = np.where(mask, centred_g[:, None] + centred_gae, 0.0)
    std = running_std.update(raw[mask]) if update_std else running_std.std
    scaled = penalise_error_only(raw / std, batch.error_only & mask, config.error_penalty)
    return Credit(
        deltas=deltas,
        gae=gae_values,
        returns=returns,
        outcome=centred_g,
        raw=raw,
        advantages=np.where(mask, scaled, 0.0),
        std=std,
        mask=mask,
        episode_ids=list(batch.episode_ids),
    )


def credit_round(
    critic: ValueModel, batch: CreditBatch, running_std: RunningStd, config: CreditConfig = CreditConfig()
) -> Credit:
    """One round's credit: the critic's values (use the critic from BEFORE this round's co-training, e.g.
    `critic.snapshot()`), then Eq. 9-10 and the running-std scaling."""
    v_cur, v_next = critic_values(critic, batch)
    return advantages(batch, v_cur, v_next, running_std, config)


# ---------------------------------------------------------------------- the plain reference
def advantages_loop(
    episodes: Sequence[EpisodeCredit],
    value: Callable[[np.ndarray, int, int], float],
    running_std: RunningStd,
    config: CreditConfig = CreditConfig(),
) -> list[np.ndarray]:
    """CaPtain Eq. 9-10 written as plain loops, one state at a time (the reference the vectorised path is tested
    against). `value(x, t, task)` is V(s, t) for one raw feature vector. GAE here uses the backward recursion
    A_t = delta_t + lambda A_{t+1}, which equals the forward sum of Eq. 9."""
    raws, returns = [], []
    for ep in episodes:
        n = len(ep)
        deltas = []
        for t in range(n):
            v_here = value(ep.features[t], int(ep.requests[t]), ep.task)
            if t < n - 1:
                v_there = value(ep.features[t + 1], int(ep.requests[t]), ep.task)  # s_{t+1} at index t
                deltas.append(ep.costs[t] + v_there - v_here)
            else:
                deltas.append(ep.costs[t] + ep.reward - v_here)
        adv = [0.0] * n
        running = 0.0
        for t in reversed(range(n)):
            running = deltas[t] + config.lam * running
            adv[t] = running
        raws.append(np.asarray(adv))
        returns.append(ep.reward + float(sum(ep.costs)))
    groups: dict[str, list[float]] = {}
    for ep, g in zip(episodes, returns, strict=True):
        groups.setdefault(ep.group_id, []).append(g)
    out = []
    for ep, g, a in zip(episodes, returns, raws, strict=True):
        group_mean = sum(groups[ep.group_id]) / len(groups[ep.group_id])
        out.append((g - group_mean) + (a - a.mean()))
    std = running_std.update(np.concatenate(out)) if out else running_std.std
    final = []
    for ep, a in zip(episodes, out, strict=True):
        scaled = a / std
        final.append(
            np.array(
                [min(x, 0.0) - config.error_penalty if e else x for x, e in zip(scaled, ep.error_only, strict=True)]
            )
        )
    return final

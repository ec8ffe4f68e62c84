"""Rounds (issue 12 "Rounds"; CaPtain App. A.2 "RL"): which recorded groups an RL update may use, and why not.

A round is a set of start-state groups (`start["group_id"]`, G attempts each: CaPtain rolls each start out G = 4
times, 64 groups x 4 = 256 episodes per round). Before a group is used, every attempt is checked, in this order,
and the first failing check names the reason it is dropped:

  invalid          end["valid"] is false (an infrastructure failure: its outcome says nothing about the policy)
  incomplete       a request 1..T (T = end["requests"]) lacks its model_call or its step record
  untrainable      a model_call lacks prompt_token_ids, token_ids or logprobs, or has a different number of
                   logprobs than sampled tokens (e.g. the scripted expert, whose endpoint returns no ids)
  unknown_task     the task is not in the critic's vocabulary (when a vocabulary is given)
  future_version   the episode's policy version is newer than the trainer's (a bookkeeping error)
  stale            the episode is more than `max_staleness_versions` (2) behind the trainer (CaPtain App. A.2,
                   `policy_loss.staleness_ok`)

An episode's policy version is the OLDEST version among its start record and its model calls: the recording proxy
tags each request with the version it was sent under, and an episode that straddles a weight update is as stale
as its oldest sample. Then the group is used only if at least `min_valid_attempts_n` of its attempts passed
(CaPtain: 1, the GAE term is defined for a lone attempt and its group-relative term is 0; AgenticRoboRL: 2, the
leave-one-out baseline needs another attempt); otherwise all its attempts are dropped as `too_few_valid`.

Groups that have not finished yet (fewer than G distinct attempts ended; open attempts are invisible to the
reader) are `pending`, not dropped: a later round takes them. Episodes already trained on (`used`) are skipped:
CaPtain's RL is single-pass.

Within a kept episode every request keeps its tokens, its recorded sampling log-probs (pi_rollout of Eq. 8), the
prompt gate's weight (captain_ros_training.gate: 0 when the student's template renders a different prompt) and its
post-success flag (step["solved_before"]). Gate-rejected requests and requests longer than the trainer's context
(`max_sequence_tokens`) stay in the episode, since the critic and the credit of Eq. 9-10 need every state, but are
not eligible for the policy gradient. Post-success requests (made after the host first judged the scene solved)
depend on the objective (`filters_post_success`): AgenticRoboRL's eligibility has a post-success filter, so there
they carry no gradient. CaPtain has none: the request that calls finish() on a solved scene is itself
post-success, and so is every request that should have; their post-success costs (§3.3 "Returns and costs",
App. E: -0.005 per request, -0.008 per action, capped) and the missed-finish return are the signal that teaches the
policy to stop (App. I), and it reaches the decision only through these requests' own gradient, so under CaPtain
they stay eligible (their costs enter Eq. 9-10 either way). The per-episode request sampling of the objective then
draws from the eligible requests only, so its inclusion weights stay those of the population actually trained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from captain_ros_training.gate import GateConfig, GateReport, gate_request
from captain_ros_training.policy_loss import ObjectiveConfig, staleness_ok

INVALID, INCOMPLETE, UNTRAINABLE = "invalid", "incomplete", "untrainable"
UNKNOWN_TASK, FUTURE_VERSION, STALE, TOO_FEW_VALID = "unknown_task", "future_version", "stale", "too_few_valid"
REASONS = (INVALID, INCOMPLETE, UNTRAINABLE, UNKNOWN_TASK, FUTURE_VERSION, STALE, TOO_FEW_VALID)


@dataclass(frozen=True)
class RoundConfig:
    """How a round is put together (CaPtain App. A.2: 64 start groups x G = 4 attempts per round)."""

    group_size_n: int = field(default=4, metadata={"help": "G: attempts per start state; a group waits for all G"})
    max_groups_n: int = field(default=64, metadata={"help": "groups per round (64 x 4 = 256 episodes)"})
    max_staleness_versions: int = field(default=2, metadata={"help": "CaPtain App. A.2: versions behind at most"})
    min_valid_attempts_n: int | None = field(
        default=None, metadata={"help": "None: the objective's (CaPtain 1, AgenticRoboRL 2)"}
    )
    max_sequence_tokens: int | None = field(
        default=None, metadata={"help": "prompt + response longer than this: no policy gradient (None: any)"}
    )
    filter_post_success: bool | None = field(
        default=None,
        metadata={"help": "post-success requests get no policy gradient; None: the objective's (AgenticRoboRL only)"},
    )
    max_examples: int = field(default=5, metadata={"help": "examples kept per drop reason in the report"})
    gate: GateConfig = field(default_factory=GateConfig)


def min_valid_attempts(config: RoundConfig, objective: ObjectiveConfig) -> int:
    """The fewest valid attempts a group needs: CaPtain Eq. 10 is defined for one (its group term is then 0);
    AgenticRoboRL's leave-one-out baseline needs `objective.min_valid_attempts_n` (2)."""
    if config.min_valid_attempts_n is not None:
        return config.min_valid_attempts_n
    return 1 if objective.objective == "captain" else max(2, objective.min_valid_attempts_n)


def filters_post_success(config: RoundConfig, objective: ObjectiveConfig) -> bool:
    """Whether requests made after the scene was solved are kept out of the policy gradient (module doc): only
    under AgenticRoboRL (its eligibility's post-success filter), unless `config.filter_post_success` says."""
    if config.filter_post_success is not None:
        return config.filter_post_success
    return objective.objective == "agenticroborl"


# ---------------------------------------------------------------------------------------------------- outputs
@dataclass
class RoundRequest:
    """Request t of a kept episode, as the policy gradient needs it."""

    index: int  # t, from 1
    prompt_ids: list[int]
    token_ids: list[int]  # the sampled response
    logprobs: list[float]  # pi_rollout of each sampled token (CaPtain Eq. 8's denominator)
    gate_weight: float  # captain_ros_training.gate: 1 match, 0 mismatch (or GateConfig.not_gateable_weight)
    post_success: bool  # step["solved_before"]: the scene was solved before this request
    policy_version: int
    too_long: bool = False  # prompt + response exceed RoundConfig.max_sequence_tokens
    filter_post_success: bool = False  # the round's objective keeps post-success requests out (`filters_post_success`)

    @property
    def post_success_filtered(self) -> bool:
        """Post-success and kept out of the policy gradient by the objective (AgenticRoboRL)."""
        return self.post_success and self.filter_post_success

    @property
    def eligible(self) -> bool:
        """Whether this request may carry a policy gradient (gate passed, fits the trainer's context, and not
        post-success under an objective that filters those)."""
        return self.gate_weight > 0 and not self.too_long and not self.post_success_filtered


@dataclass
class RoundEpisode:
    """A kept episode: the stored episode (for the critic and credit) and its requests' training data."""

    episode: Any  # captain_ros.bridge.store.Episode
    requests: list[RoundRequest]
    policy_version: int

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    @property
    def group_id(self) -> str:
        return str(self.episode.start.get("group_id", self.episode.episode_id))

    @property
    def reward(self) -> float:
        """CaPtain's R_i (Eq. 7, with the sub-goal reward) as the episode stored it."""
        return float(self.episode.end["reward"])

    @property
    def success(self) -> bool:
        """Host success (CaPtain Eq. 4's y_i; AgenticRoboRL's binary reward is 1 exactly when it holds)."""
        return bool(self.episode.end.get("host_success"))

    @property
    def eligible(self) -> list[int]:
        """Positions (into `requests`) of the requests that may carry a policy gradient."""
        return [i for i, r in enumerate(self.requests) if r.eligible]


@dataclass
class RoundGroup:
    group_id: str
    episodes: list[RoundEpisode]


@dataclass
class RoundReport:
    """What a round kept and what it dropped, with reasons, counts and a few examples per reason."""

    trainer_version: int
    groups_used: int = 0
    groups_pending: int = 0  # not all G attempts have ended yet: left for a later round
    groups_deferred: int = 0  # ready, but the round was full
    groups_dropped: int = 0
    dropped_groups: list[str] = field(default_factory=list)  # ids of the groups dropped whole (a driver's ledger)
    episodes_used: int = 0
    episodes_already_used: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> episodes
    examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> "episode: why"
    requests: int = 0
    requests_eligible: int = 0
    requests_gate_rejected: int = 0
    requests_post_success: int = 0  # made after the scene was solved (eligible or not, depending on the objective)
    requests_post_success_filtered: int = 0  # of those, kept out of the policy gradient (AgenticRoboRL)
    requests_too_long: int = 0
    episodes_without_eligible: int = 0
    tokens: int = 0  # sampled tokens of the kept requests
    version_lag: Counter = field(default_factory=Counter)  # trainer version - episode version -> kept episodes
    gate: GateReport = field(default_factory=GateReport)

    def drop(self, reason: str, episode_id: str, why: str, max_examples: int) -> None:
        self.dropped[reason] += 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < max_examples:
            examples.append(f"{episode_id}: {why}")

    @property
    def episodes_dropped(self) -> int:
        return sum(self.dropped.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "trainer_version": self.trainer_version,
            "groups_used": self.groups_used,
            "groups_pending": self.groups_pending,
            "groups_deferred": self.groups_deferred,
            "groups_dropped": self.groups_dropped,
            "dropped_groups": list(self.dropped_groups),
            "episodes_used": self.episodes_used,
            "episodes_dropped": self.episodes_dropped,
            "episodes_already_used": self.episodes_already_used,
            "dropped": dict(self.dropped),
            "examples": {k: list(v) for k, v in self.examples.items()},
            "requests": self.requests,
            "requests_eligible": self.requests_eligible,
            "requests_gate_rejected": self.requests_gate_rejected,
            "requests_post_success": self.requests_post_success,
            "requests_post_success_filtered": self.requests_post_success_filtered,
            "requests_too_long": self.requests_too_long,
            "episodes_without_eligible": self.episodes_without_eligible,
            "tokens": self.tokens,
            "version_lag": {int(k): v for k, v in sorted(self.version_lag.items())},
            "gate": {"passed": self.gate.passed, "failed": self.gate.failed, "not_gateable": self.gate.not_gateable},
        }

    def __str__(self) -> str:
        lines = [
            f"round at trainer version {self.trainer_version}: {self.groups_used} groups / {self.episodes_used} "
            f"episodes used ({self.requests_eligible} of {self.requests} requests eligible, {self.tokens} tokens); "
            f"{self.groups_dropped} groups dropped, {self.groups_pending} pending, {self.groups_deferred} deferred"
        ]
        for reason in REASONS:
            if self.dropped.get(reason):
                lines.append(f"  dropped {self.dropped[reason]} episodes as {reason}, e.g. {self.examples[reason][0]}")
        if self.requests_gate_rejected or self.requests_post_success_filtered or self.requests_too_long:
            lines.append(
                f"  requests kept without policy gradient: {self.requests_gate_rejected} gate-rejected, "
                f"{self.requests_post_success_filtered} post-success, {self.requests_too_long} too long"
            )
        return "\n".join(lines)


@dataclass
class Round:
    groups: list[RoundGroup]
    report: RoundReport

    @property
    def episodes(self) -> list[RoundEpisode]:
        return [e for g in self.groups for e in g.episodes]


# ---------------------------------------------------------------------------------------------------- checks
def episode_policy_version(episode: Any) -> int:
    """The oldest policy version an episode was sampled under (its start record and every model call)."""
    versions = [int(episode.start.get("policy_version") or 0)]
    versions += [
        int(r.model_call["policy_version"])
        for r in episode.requests
        if r.model_call and "policy_version" in r.model_call
    ]
    return min(versions)


def check_complete(episode: Any) -> tuple[str, str] | None:
    """(INCOMPLETE | UNTRAINABLE, why) or None: every request 1..T has a model_call with prompt_token_ids,
    token_ids and one logprob per token, and a step."""
    n = int(episode.end.get("requests") or 0)
    by_index = {r.index: r for r in episode.requests}
    if n < 1:
        return INCOMPLETE, "the episode recorded no request"
    for t in range(1, n + 1):
        request = by_index.get(t)
        if request is None or request.model_call is None:
            return INCOMPLETE, f"request {t} of {n} has no model_call record"
        if request.step is None:
            return INCOMPLETE, f"request {t} of {n} has no step record"
    for t in range(1, n + 1):
        call = by_index[t].model_call
        for key in ("prompt_token_ids", "token_ids", "logprobs"):
            if not call.get(key):
                return UNTRAINABLE, f"request {t}: no {key} recorded"
        if len(call["logprobs"]) != len(call["token_ids"]):
            return UNTRAINABLE, f"request {t}: {len(call['logprobs'])} logprobs for {len(call['token_ids'])} tokens"
    return None


def check_episode(
    episode: Any, trainer_version: int, max_staleness: int, tasks: Sequence[str] | None = None
) -> tuple[str, str] | None:
    """The first failing check of the module doc as (reason, why), or None when the episode may be trained."""
    end = episode.end or {}
    if not end.get("valid"):
        return INVALID, str(end.get("invalid_reason") or end.get("outcome") or "not valid")
    problem = check_complete(episode)
    if problem is not None:
        return problem
    if tasks is not None and episode.start.get("task") not in tasks:
        return UNKNOWN_TASK, f"task {episode.start.get('task')!r} is not in the critic's vocabulary"
    version = episode_policy_version(episode)
    if version > trainer_version:
        return FUTURE_VERSION, f"policy version {version} is newer than the trainer's {trainer_version}"
    if not staleness_ok(version, trainer_version, max_staleness):
        return STALE, f"policy version {version} is {trainer_version - version} behind {trainer_version}"
    return None


def round_requests(
    episode: Any,
    reader: Any,
    tokenizer: Any,
    gate: GateReport,
    config: RoundConfig,
    *,
    objective: ObjectiveConfig = ObjectiveConfig(),
) -> list[RoundRequest]:
    """The training data of a checked episode's requests, gated one by one (no tokenizer: gate weight 1); the
    objective decides whether post-success requests are eligible (`filters_post_success`)."""
    filter_post_success = filters_post_success(config, objective)
    out = []
    for request in sorted(episode.requests, key=lambda r: r.index):
        call = request.model_call
        weight = 1.0
        if tokenizer is not None:
            messages = reader.restore_messages(call["messages"]) if call.get("messages") else None
            result = gate_request(tokenizer, episode.episode_id, request.index, call, messages, config=config.gate)
            gate.add(episode.episode_id, request.index, result, config.gate.max_examples)
            weight = result.weight
        out.append(
            RoundRequest(
                index=request.index,
                prompt_ids=list(call["prompt_token_ids"]),
                token_ids=list(call["token_ids"]),
                logprobs=[float(x) for x in call["logprobs"]],
                gate_weight=float(weight),
                post_success=bool(request.step.get("solved_before")),
                policy_version=int(call.get("policy_version", episode.start.get("policy_version") or 0)),
                too_long=config.max_sequence_tokens is not None
                and len(call["prompt_token_ids"]) + len(call["token_ids"]) > config.max_sequence_tokens,
                filter_post_success=filter_post_success,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------- builder
def episode_index(reader: Any, episode_ids: Sequence[str]) -> dict[str, tuple[str, Any]] | None:
    """{episode id: (group id, attempt)} from the store's index table when the reader has one (no records are
    read), else None. Lets a round load only the episodes of the groups it takes."""
    store = getattr(reader, "store", None)
    if store is None or not hasattr(store, "episodes"):
        return None
    rows = {r["episode_id"]: r for r in store.episodes(status="complete")}
    if not all(eid in rows and rows[eid].get("group_id") is not None for eid in episode_ids):
        return None
    return {eid: (str(rows[eid]["group_id"]), rows[eid].get("attempt")) for eid in episode_ids}


def group_episodes(episodes: Iterable[Any]) -> dict[str, list[Any]]:
    """Episodes by start["group_id"], groups in order of first appearance."""
    groups: dict[str, list[Any]] = {}
    for episode in episodes:
        groups.setdefault(str(episode.start.get("group_id", episode.episode_id)), []).append(episode)
    return groups


def group_ready(attempts: Iterable[Any], group_size_n: int) -> bool:
    """All G attempts of a group have ended (an attempt re-run after an infrastructure failure counts once)."""
    return len(set(attempts)) >= group_size_n


def build_round(
    reader: Any,
    trainer_version: int,
    *,
    config: RoundConfig = RoundConfig(),
    objective: ObjectiveConfig = ObjectiveConfig(),
    tokenizer: Any = None,
    tasks: Sequence[str] | None = None,
    used: set[str] | frozenset[str] = frozenset(),
    episode_ids: Iterable[str] | None = None,
) -> Round:
    """Select up to `config.max_groups_n` ready groups from an EpisodeReader (or anything with `episode_ids`,
    `load` and `restore_messages`) and check them (module doc). `tokenizer`: the student's, for the prompt gate;
    `tasks`: the critic's vocabulary; `used`: episode ids already trained on. The report says what was dropped."""
    report = RoundReport(trainer_version=trainer_version)
    need = min_valid_attempts(config, objective)
    ids = reader.episode_ids(valid_only=False) if episode_ids is None else list(episode_ids)
    fresh = [eid for eid in ids if eid not in used]
    report.episodes_already_used = len(ids) - len(fresh)
    index = episode_index(reader, fresh)
    loaded: dict[str, Any] = {}
    if index is None:  # no index table: read every fresh episode to learn its group
        loaded = {eid: reader.load(eid) for eid in fresh}
        index = {eid: (str(e.start.get("group_id", eid)), e.start.get("attempt")) for eid, e in loaded.items()}
    candidates: dict[str, list[str]] = {}
    for eid in fresh:
        candidates.setdefault(index[eid][0], []).append(eid)
    groups: list[RoundGroup] = []
    for group_id, ids_in_group in candidates.items():
        if not group_ready((index[eid][1] for eid in ids_in_group), config.group_size_n):
            report.groups_pending += 1
            continue
        if len(groups) >= config.max_groups_n:
            report.groups_deferred += 1
            continue
        members = [loaded[eid] if eid in loaded else reader.load(eid) for eid in ids_in_group]
        kept, problems = [], []
        for episode in members:
            problem = check_episode(episode, trainer_version, config.max_staleness_versions, tasks)
            (kept if problem is None else problems).append((episode, problem))
        for episode, (reason, why) in problems:
            report.drop(reason, episode.episode_id, why, config.max_examples)
        if len(kept) < need:
            report.groups_dropped += 1
            report.dropped_groups.append(group_id)
            for episode, _ in kept:
                why = f"group {group_id} has {len(kept)} valid attempts, the objective needs {need}"
                report.drop(TOO_FEW_VALID, episode.episode_id, why, config.max_examples)
            continue
        round_episodes = []
        for episode, _ in kept:
            version = episode_policy_version(episode)
            requests = round_requests(episode, reader, tokenizer, report.gate, config, objective=objective)
            round_episodes.append(RoundEpisode(episode, requests, version))
            report.version_lag[trainer_version - version] += 1
            report.requests += len(requests)
            report.requests_eligible += sum(r.eligible for r in requests)
            report.requests_gate_rejected += sum(r.gate_weight <= 0 for r in requests)
            report.requests_post_success += sum(r.post_success for r in requests)
            report.requests_post_success_filtered += sum(r.post_success_filtered for r in requests)
            report.requests_too_long += sum(r.too_long for r in requests)
            report.episodes_without_eligible += not any(r.eligible for r in requests)
            report.tokens += sum(len(r.token_ids) for r in requests)
        groups.append(RoundGroup(group_id, round_episodes))
        report.groups_used += 1
        report.episodes_used += len(round_episodes)
    return Round(groups, report)


__all__ = [
    "REASONS",
    "Round",
    "RoundConfig",
    "RoundEpisode",
    "RoundGroup",
    "RoundReport",
    "RoundRequest",
    "build_round",
    "check_complete",
    "check_episode",
    "episode_policy_version",
    "filters_post_success",
    "group_episodes",
    "group_ready",
    "min_valid_attempts",
    "round_requests",
]

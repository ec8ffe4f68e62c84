"""The round builder (issue 12 "Rounds"): each check drops an episode with its reason, staleness at most two
versions (the oldest sample counts), the objective's minimum of valid attempts, pending / deferred / used groups,
the prompt gate and the post-success filter per request, and the report. Synthetic episodes, no simulator.

`synthetic_episode` and `FakeReader` are shared with the RL trainer's tests (tests/training/test_rl_trainer.py,
test_metrics_log.py, test_rl_command.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from captain_ros.bridge.store import Episode, RequestData
from captain_ros_training.critic import FEATURE_NAMES
from captain_ros_training.policy_loss import ObjectiveConfig
from captain_ros_training.rounds import (
    FUTURE_VERSION,
    INCOMPLETE,
    INVALID,
    STALE,
    TOO_FEW_VALID,
    UNKNOWN_TASK,
    UNTRAINABLE,
    RoundConfig,
    build_round,
    check_complete,
    episode_policy_version,
    min_valid_attempts,
)

PYTHON_CALL = {"type": "function", "function": {"name": "python", "arguments": json.dumps({"code": "look()"})}}


def synthetic_episode(
    eid: str,
    group: str,
    attempt: int = 0,
    *,
    n: int = 3,
    task: str = "open_drawer",
    version: int = 0,
    valid: bool = True,
    success: bool = True,
    reward: float = 1.0,
    solved_from: int | None = None,
    prompt_len: int = 6,
    response_len: int = 3,
    seed: int = 0,
    features: list[list[float]] | None = None,
    costs: list[float] | None = None,
) -> Episode:
    """A stored-looking episode: every request has a model call (ids, logprobs, a python tool call) and a step
    (36 features, cost, solved_before from request `solved_from` on, one successful robot call)."""
    requests = []
    for t in range(1, n + 1):
        base = (seed * 131 + t * 17 + attempt * 7) % 1900
        call = {
            "messages": [{"role": "user", "content": f"{eid} request {t}"}],
            "tools": None,
            "prompt_token_ids": [(base + k) % 2000 + 10 for k in range(prompt_len)],
            "token_ids": [(base * 3 + k) % 2000 + 10 for k in range(response_len)],
            "logprobs": [-1.0 - 0.1 * k for k in range(response_len)],
            "policy_version": version,
            "response": {"content": "", "tool_calls": [PYTHON_CALL]},
        }
        row = features[t - 1] if features else [0.1 * t + 0.01 * i for i in range(len(FEATURE_NAMES))]
        step = {
            "snapshot": {"features": dict(zip(FEATURE_NAMES, row, strict=True))},
            "costs": {"total": costs[t - 1] if costs else 0.0},
            "solved_before": solved_from is not None and t >= solved_from,
            "calls": [{"success": True}],
        }
        requests.append(RequestData(t, call, step))
    start = {"task": task, "group_id": group, "attempt": attempt, "policy_version": version}
    end = {
        "valid": valid,
        "requests": n,
        "reward": reward,
        "host_success": success,
        "outcome": "success" if success else "failure",
        "invalid_reason": "" if valid else "the simulator crashed",
    }
    return Episode(eid, start, end, requests)


class FakeReader:
    """What build_round reads from an EpisodeReader: episode ids, episodes and restored messages."""

    def __init__(self, episodes: list[Episode]):
        self.episodes = {e.episode_id: e for e in episodes}

    def episode_ids(self, valid_only: bool = True) -> list[str]:
        return [k for k, e in self.episodes.items() if e.end and (e.end.get("valid") or not valid_only)]

    def load(self, episode_id: str) -> Episode:
        return self.episodes[episode_id]

    def restore_messages(self, messages: list[dict]) -> list[dict]:
        return messages


def _without(episode: Episode, t: int, what: str) -> Episode:
    def strip(r: RequestData) -> RequestData:
        if r.index != t:
            return r
        return RequestData(r.index, None if what == "model_call" else r.model_call, None if what == "step" else r.step)

    return replace(episode, requests=[strip(r) for r in episode.requests])


def _with_call(episode: Episode, t: int, **fields) -> Episode:
    requests = [
        RequestData(r.index, {**r.model_call, **fields}, r.step) if r.index == t else r for r in episode.requests
    ]
    return replace(episode, requests=requests)


def test_a_ready_group_is_used_with_tokens_logprobs_gate_weight_and_post_success_flags():
    a = synthetic_episode("a", "g", 0, n=4, solved_from=3)
    b = synthetic_episode("b", "g", 1, n=2)
    round_ = build_round(FakeReader([a, b]), 0, config=RoundConfig(group_size_n=2))
    assert [g.group_id for g in round_.groups] == ["g"]
    first = round_.episodes[0]
    assert first.episode_id == "a" and first.policy_version == 0 and first.reward == 1.0
    assert [r.index for r in first.requests] == [1, 2, 3, 4]
    assert first.requests[0].prompt_ids == a.requests[0].model_call["prompt_token_ids"]
    assert first.requests[0].token_ids == a.requests[0].model_call["token_ids"]
    assert first.requests[0].logprobs == pytest.approx([-1.0, -1.1, -1.2])
    assert [r.post_success for r in first.requests] == [False, False, True, True]
    assert [r.gate_weight for r in first.requests] == [1.0] * 4  # no tokenizer: the gate is not run
    assert first.eligible == [0, 1, 2, 3]  # CaPtain (the default objective) has no post-success filter
    report = round_.report
    assert (report.groups_used, report.episodes_used, report.episodes_dropped) == (1, 2, 0)
    assert (report.requests, report.requests_eligible, report.requests_post_success) == (6, 6, 2)
    assert report.requests_post_success_filtered == 0
    assert report.tokens == 6 * 3 and report.version_lag == {0: 2}


@pytest.mark.parametrize(
    ("objective", "override", "eligible_a", "eligible_n", "filtered"),
    [
        # a: requests 3 and 4 come after the scene was solved; b: 2 requests, none post-success
        ("captain", None, [0, 1, 2, 3], 4 + 2, 0),  # CaPtain: post-success costs need these requests' gradient
        ("agenticroborl", None, [0, 1], 2 + 2, 2),  # AgenticRoboRL's eligibility: post-success filter
        ("captain", True, [0, 1], 2 + 2, 2),  # RoundConfig.filter_post_success overrides the objective
        ("agenticroborl", False, [0, 1, 2, 3], 4 + 2, 0),
    ],
)
def test_post_success_requests_are_filtered_only_under_agenticroborl(
    objective, override, eligible_a, eligible_n, filtered
):
    a = synthetic_episode("a", "g", 0, n=4, solved_from=3)
    b = synthetic_episode("b", "g", 1, n=2)
    config = RoundConfig(group_size_n=2, filter_post_success=override)
    round_ = build_round(FakeReader([a, b]), 0, config=config, objective=ObjectiveConfig(objective=objective))
    first = round_.episodes[0]
    assert [r.post_success for r in first.requests] == [False, False, True, True]  # flagged either way
    assert first.eligible == eligible_a
    report = round_.report
    assert (report.requests, report.requests_eligible, report.requests_post_success) == (6, eligible_n, 2)
    assert report.requests_post_success_filtered == filtered
    assert (f"{filtered} post-success" in str(report)) == bool(filtered)


def test_every_check_drops_with_its_reason_and_an_example():
    trainer_version = 5
    ok = synthetic_episode("ok", "g1", 0, version=3)  # exactly 2 versions behind: still fresh
    episodes = [
        ok,
        synthetic_episode("invalid", "g1", 1, version=5, valid=False),
        _without(synthetic_episode("no_step", "g1", 2, version=5), 2, "step"),
        _without(synthetic_episode("no_call", "g1", 3, version=5), 3, "model_call"),
        _with_call(synthetic_episode("expert", "g1", 4, version=5), 1, prompt_token_ids=None, token_ids=None),
        _with_call(synthetic_episode("short_lp", "g1", 5, version=5), 2, logprobs=[-1.0]),
        synthetic_episode("stale", "g1", 6, version=2),
        synthetic_episode("future", "g1", 7, version=6),
        synthetic_episode("other_task", "g1", 8, version=5, task="stack_blocks"),
    ]
    round_ = build_round(
        FakeReader(episodes), trainer_version, config=RoundConfig(group_size_n=9), tasks=("open_drawer",)
    )
    report = round_.report
    assert [e.episode_id for e in round_.episodes] == ["ok"]
    assert dict(report.dropped) == {
        INVALID: 1,
        INCOMPLETE: 2,
        UNTRAINABLE: 2,
        STALE: 1,
        FUTURE_VERSION: 1,
        UNKNOWN_TASK: 1,
    }
    assert report.examples[INVALID] == ["invalid: the simulator crashed"]
    assert report.examples[INCOMPLETE] == [
        "no_step: request 2 of 3 has no step record",
        "no_call: request 3 of 3 has no model_call record",
    ]
    assert report.examples[UNTRAINABLE] == [
        "expert: request 1: no prompt_token_ids recorded",
        "short_lp: request 2: 1 logprobs for 3 tokens",
    ]
    assert report.examples[STALE] == ["stale: policy version 2 is 3 behind 5"]
    assert report.examples[FUTURE_VERSION] == ["future: policy version 6 is newer than the trainer's 5"]
    assert report.version_lag == {2: 1}
    json.dumps(report.as_dict())  # the report goes into the metrics log as it is
    assert "dropped 2 episodes as incomplete, e.g. no_step: request 2 of 3 has no step record" in str(report)


def test_the_oldest_sample_decides_the_policy_version():
    episode = _with_call(synthetic_episode("e", "g", version=5), 2, policy_version=3)
    assert episode_policy_version(episode) == 3
    round_ = build_round(FakeReader([episode]), 6, config=RoundConfig(group_size_n=1))
    assert round_.report.dropped == {STALE: 1}  # 6 - 3 = 3 > 2, although the episode started at version 5


def test_check_complete_needs_every_request_up_to_the_recorded_count():
    episode = synthetic_episode("e", "g", n=3)
    assert check_complete(episode) is None
    truncated = replace(episode, requests=episode.requests[:2])
    assert check_complete(truncated) == (INCOMPLETE, "request 3 of 3 has no model_call record")


@pytest.mark.parametrize(("objective", "used"), [("captain", 1), ("agenticroborl", 0)])
def test_a_group_needs_the_objectives_minimum_of_valid_attempts(objective, used):
    episodes = [synthetic_episode("good", "g", 0), synthetic_episode("bad", "g", 1, valid=False)]
    config = RoundConfig(group_size_n=2)
    objective_config = ObjectiveConfig(objective=objective)
    assert min_valid_attempts(config, objective_config) == {"captain": 1, "agenticroborl": 2}[objective]
    round_ = build_round(FakeReader(episodes), 0, config=config, objective=objective_config)
    assert round_.report.episodes_used == used
    if objective == "agenticroborl":  # leave-one-out needs another valid attempt: the whole group goes
        assert round_.report.dropped == {INVALID: 1, TOO_FEW_VALID: 1} and round_.report.groups_dropped == 1
        assert round_.report.examples[TOO_FEW_VALID] == ["good: group g has 1 valid attempts, the objective needs 2"]
        assert round_.report.dropped_groups == ["g"] and round_.report.as_dict()["dropped_groups"] == ["g"]
    else:
        assert round_.report.dropped_groups == [] and round_.report.groups_dropped == 0


def test_pending_deferred_and_already_used_groups():
    episodes = [
        synthetic_episode("p0", "pending", 0),  # 1 of 2 attempts ended: waits for a later round
        synthetic_episode("r0", "ready1", 0),
        synthetic_episode("r1", "ready1", 1),
        synthetic_episode("s0", "ready2", 0),
        synthetic_episode("s1", "ready2", 1),
        synthetic_episode("u0", "used", 0),
        synthetic_episode("u1", "used", 1),
    ]
    config = RoundConfig(group_size_n=2, max_groups_n=1)
    round_ = build_round(FakeReader(episodes), 0, config=config, used={"u0", "u1"})
    report = round_.report
    assert [g.group_id for g in round_.groups] == ["ready1"]
    assert (report.groups_pending, report.groups_deferred, report.episodes_already_used) == (1, 1, 2)
    assert report.episodes_dropped == 0
    # the next round, with ready1 used, takes ready2
    after = build_round(FakeReader(episodes), 0, config=config, used={"u0", "u1", "r0", "r1"})
    assert [g.group_id for g in after.groups] == ["ready2"]


def test_an_attempt_rerun_after_an_infrastructure_failure_counts_once():
    episodes = [
        synthetic_episode("a0-dead", "g", 0, valid=False),
        synthetic_episode("a0", "g", 0),
        synthetic_episode("a1", "g", 1),
    ]
    round_ = build_round(FakeReader(episodes), 0, config=RoundConfig(group_size_n=2))
    assert [e.episode_id for e in round_.episodes] == ["a0", "a1"] and round_.report.dropped == {INVALID: 1}
    only_dead = build_round(FakeReader(episodes[:2]), 0, config=RoundConfig(group_size_n=2))
    assert only_dead.report.groups_pending == 1  # attempt 0 twice is still one attempt of two


def test_requests_longer_than_the_trainers_context_carry_no_gradient():
    episode = synthetic_episode("e", "g", n=2, prompt_len=6, response_len=3)
    episode = _with_call(episode, 2, prompt_token_ids=list(range(10, 20)))  # 10 + 3 tokens
    round_ = build_round(FakeReader([episode]), 0, config=RoundConfig(group_size_n=1, max_sequence_tokens=9))
    assert [r.too_long for r in round_.episodes[0].requests] == [False, True]
    assert round_.episodes[0].eligible == [0] and round_.report.requests_too_long == 1


def test_the_prompt_gate_gives_an_altered_prompt_weight_zero():
    from captain_ros_training.gate import render_prompt_ids
    from captain_ros_training.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    episode = synthetic_episode("e", "g", n=3)
    requests = []
    for r in episode.requests:
        ids = render_prompt_ids(tokenizer, r.model_call["messages"], None)
        if r.index == 2:
            ids = ids[:-3] + [ids[-3] + 1] + ids[-2:]  # one token altered, three from the end
        requests.append(RequestData(r.index, {**r.model_call, "prompt_token_ids": ids}, r.step))
    episode = replace(episode, requests=requests)
    round_ = build_round(FakeReader([episode]), 0, config=RoundConfig(group_size_n=1), tokenizer=tokenizer)
    kept = round_.episodes[0]
    assert [r.gate_weight for r in kept.requests] == [1.0, 0.0, 1.0]
    assert kept.eligible == [0, 2]  # the rejected request stays (critic, credit) but carries no gradient
    report = round_.report
    assert (report.gate.passed, report.gate.failed, report.requests_gate_rejected) == (2, 1, 1)
    mismatch = report.gate.mismatches[0]
    assert (mismatch.request, mismatch.position) == (2, len(requests[1].model_call["prompt_token_ids"]) - 3)


class _Index:
    def __init__(self, episodes: list[Episode]):
        self.rows = [
            {"episode_id": e.episode_id, "group_id": e.start["group_id"], "attempt": e.start["attempt"]}
            for e in episodes
        ]

    def episodes(self, status: str | None = None) -> list[dict]:
        return self.rows


class IndexedReader(FakeReader):
    """A reader with the store's index table (as EpisodeReader has): groups are known without loading."""

    def __init__(self, episodes: list[Episode]):
        super().__init__(episodes)
        self.store = _Index(episodes)
        self.loaded: list[str] = []

    def load(self, episode_id: str) -> Episode:
        self.loaded.append(episode_id)
        return super().load(episode_id)


def test_with_the_stores_index_only_the_taken_groups_are_read():
    episodes = [synthetic_episode(f"{g}{a}", g, a) for g in ("x", "y", "z") for a in range(2)]
    episodes.append(synthetic_episode("w0", "w", 0))  # pending
    reader = IndexedReader(episodes)
    round_ = build_round(reader, 0, config=RoundConfig(group_size_n=2, max_groups_n=1))
    assert [g.group_id for g in round_.groups] == ["x"] and reader.loaded == ["x0", "x1"]
    assert (round_.report.groups_deferred, round_.report.groups_pending) == (2, 1)

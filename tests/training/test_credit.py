"""CaPtain Eq. 9-10 credit against hand arithmetic, the running std without re-centring, the error-only rule, App. E
early stopping with its control slice, and the vectorised path against the plain reference loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from captain_ros.bridge.store import Episode, RequestData
from captain_ros.twin.privileged_state import FEATURE_NAMES
from captain_ros_training.credit import (
    CreditConfig,
    EarlyStopConfig,
    EpisodeCredit,
    RunningStd,
    advantages,
    advantages_loop,
    batch_from_episodes,
    critic_values,
    cut_request,
    error_only_request,
    gae,
    in_control_slice,
    pad_episodes,
    should_cut,
    td_deltas,
)
from captain_ros_training.critic import Critic, CriticConfig

N_FEAT = len(FEATURE_NAMES)


class TimeDependentValue:
    """A stand-in critic with V(s, t) = x_0(s) + 0.01 t: any use of the wrong index shows up as a 0.01 offset."""

    def value_of(self, features, t, task):
        return features[:, 0].double() + 0.01 * t.double()


class TimeFreeValue:
    def value_of(self, features, t, task):
        return features[:, 0].double()


def _episode(eid, group, x0, costs, reward, *, error_only=None, task=0):
    x = np.zeros((len(x0), N_FEAT), dtype=np.float32)
    x[:, 0] = x0
    return EpisodeCredit(
        episode_id=eid,
        group_id=group,
        task=task,
        features=x,
        costs=np.asarray(costs, dtype=np.float64),
        reward=float(reward),
        error_only=np.zeros(len(x0), bool) if error_only is None else np.asarray(error_only, bool),
        requests=np.arange(1, len(x0) + 1),
    )


# Episode A (success): V-features x = 0.2, 0.5, 0.9; c = 0, -0.02, 0; R = 1.
# Episode B (budget exhausted): x = 0.2, 0.1, 0.05; c = -0.02, -0.02, 0; R = -0.1. Both in group "g".
# The values are exactly representable in float32 where it matters to 1e-6.
def _group():
    return [
        _episode("A", "g", [0.2, 0.5, 0.9], [0.0, -0.02, 0.0], 1.0),
        _episode("B", "g", [0.2, 0.1, 0.05], [-0.02, -0.02, 0.0], -0.1),
    ]


# delta_t = c_t + V(s_{t+1}, t) - V(s_t, t) = c_t + x_{t+1} - x_t (the 0.01 t cancels because t is held fixed)
# delta_T = c_T + R - V(s_T, T) = c_T + R - x_T - 0.03
# A: d1 = 0 + 0.5 - 0.2 = 0.30; d2 = -0.02 + 0.9 - 0.5 = 0.38; d3 = 0 + 1 - 0.9 - 0.03 = 0.07
# B: d1 = -0.02 + 0.1 - 0.2 = -0.12; d2 = -0.02 + 0.05 - 0.1 = -0.07; d3 = 0 - 0.1 - 0.05 - 0.03 = -0.18
DELTA_A = [0.30, 0.38, 0.07]
DELTA_B = [-0.12, -0.07, -0.18]
# GAE with lambda = 0.5, backwards: A3 = d3, A2 = d2 + 0.5 A3, A1 = d1 + 0.5 A2
# A: 0.07; 0.38 + 0.035 = 0.415; 0.30 + 0.2075 = 0.5075        mean = 0.9925 / 3 = 0.330833...
# B: -0.18; -0.07 - 0.09 = -0.16; -0.12 - 0.08 = -0.20          mean = -0.54 / 3 = -0.18
GAE_A = [0.5075, 0.415, 0.07]
GAE_B = [-0.20, -0.16, -0.18]
# G_A = 1 - 0.02 = 0.98; G_B = -0.1 - 0.04 = -0.14; group mean 0.42 -> outcome terms +0.56 and -0.56
# A_A = 0.56 + (GAE_A - 0.330833) = [0.736667, 0.644167, 0.299167]
# A_B = -0.56 + (GAE_B + 0.18) = [-0.58, -0.54, -0.56]
RAW_A = [0.56 + 0.5075 - 0.9925 / 3, 0.56 + 0.415 - 0.9925 / 3, 0.56 + 0.07 - 0.9925 / 3]
RAW_B = [-0.58, -0.54, -0.56]


def test_deltas_gae_and_group_term_match_hand_arithmetic():
    batch = pad_episodes(_group())
    v_cur, v_next = critic_values(TimeDependentValue(), batch)
    credit = advantages(batch, v_cur, v_next, RunningStd(momentum=0.9), CreditConfig(lam=0.5, error_penalty=0.1))
    np.testing.assert_allclose(credit.deltas, [DELTA_A, DELTA_B], atol=1e-6)
    np.testing.assert_allclose(credit.gae, [GAE_A, GAE_B], atol=1e-6)
    np.testing.assert_allclose(credit.returns, [0.98, -0.14], atol=1e-12)
    np.testing.assert_allclose(credit.outcome, [0.56, -0.56], atol=1e-12)
    np.testing.assert_allclose(credit.raw, [RAW_A, RAW_B], atol=1e-6)
    # first round: the running std is the round's own (population) std; the raw values have mean 0 here
    raw = np.asarray(RAW_A + RAW_B)
    assert abs(raw.sum()) < 1e-9
    std = math.sqrt(float(np.mean(raw**2)))  # 0.5757...
    assert credit.std == pytest.approx(std, rel=1e-6)
    np.testing.assert_allclose(credit.advantages, [np.asarray(RAW_A) / std, np.asarray(RAW_B) / std], atol=1e-5)


def test_request_index_is_held_fixed_inside_each_difference():
    batch = pad_episodes(_group())
    v_cur, v_next = critic_values(TimeDependentValue(), batch)
    # v_next[t] = V(s_{t+1}, t) = x_{t+1} + 0.01 t, not x_{t+1} + 0.01 (t + 1)
    np.testing.assert_allclose(v_next[0, :2], [0.5 + 0.01, 0.9 + 0.02], atol=1e-6)
    np.testing.assert_allclose(v_cur[0], [0.2 + 0.01, 0.5 + 0.02, 0.9 + 0.03], atol=1e-6)
    deltas = td_deltas(v_cur, v_next, batch.costs, batch.reward, batch.mask)
    assert deltas[0, 0] == pytest.approx(0.30, abs=1e-6)  # the shifted index would give 0.31
    assert deltas[0, 0] != pytest.approx(0.31, abs=1e-4)


class CountingValue(TimeDependentValue):
    def __init__(self):
        self.rows = 0

    def value_of(self, features, t, task):
        self.rows += len(t)
        return super().value_of(features, t, task)


def test_unchanged_states_skip_the_second_forward_and_give_the_same_values():
    # request 1 only perceives: s_2 == s_1, so V(s_2, 1) = V(s_1, 1) and delta_1 = c_1 = -0.004 exactly
    eps = [_episode("P", "g", [0.2, 0.2, 0.5], [-0.004, 0.0, 0.0], 1.0)]
    batch = pad_episodes(eps)
    counting = CountingValue()
    v_cur, v_next = critic_values(counting, batch)
    assert counting.rows == 3 + 1  # V(s_t, t) for t = 1..3, and V(s_3, 2) only
    np.testing.assert_allclose(v_next[0, :2], [0.2 + 0.01, 0.5 + 0.02], atol=1e-6)
    deltas = td_deltas(v_cur, v_next, batch.costs, batch.reward, batch.mask)
    # delta = [-0.004, 0 + 0.5 - 0.2 = 0.3, 0 + 1 - 0.5 - 0.03 = 0.47]
    np.testing.assert_allclose(deltas[0], [-0.004, 0.3, 0.47], atol=1e-6)


def test_lambda_limits():
    batch = pad_episodes(_group())
    v_cur, v_next = critic_values(TimeDependentValue(), batch)
    deltas = td_deltas(v_cur, v_next, batch.costs, batch.reward, batch.mask)
    # lambda = 0: A^GAE = delta
    np.testing.assert_allclose(gae(deltas, 0.0, batch.mask), deltas, atol=1e-12)
    # lambda = 1: the plain sum of the remaining deltas. For A: [0.30 + 0.38 + 0.07, 0.38 + 0.07, 0.07]
    # = [0.75, 0.45, 0.07], which also equals sum_{k>=t} c_k + R - x_t - 0.01 T (the fixed-t sum telescopes
    # except for one -0.01 per step): t=1: -0.02 + 1 - 0.2 - 0.03 = 0.75; t=2: -0.02 + 1 - 0.5 - 0.03 = 0.45.
    np.testing.assert_allclose(gae(deltas, 1.0, batch.mask)[0], [0.75, 0.45, 0.07], atol=1e-6)
    # with a time-free critic and lambda = 1, A^GAE_1 = G - V(s_1): A: 0.98 - 0.2 = 0.78, B: -0.14 - 0.2 = -0.34
    v_cur, v_next = critic_values(TimeFreeValue(), batch)
    deltas = td_deltas(v_cur, v_next, batch.costs, batch.reward, batch.mask)
    np.testing.assert_allclose(gae(deltas, 1.0, batch.mask)[:, 0], [0.78, -0.34], atol=1e-6)


def test_padding_and_singleton_groups():
    # a 1-request episode in its own group: outcome term 0, GAE term 0 -> raw advantage 0, and padding stays 0
    eps = [*_group(), _episode("C", "h", [0.3], [0.0], 1.0)]
    batch = pad_episodes(eps)
    v_cur, v_next = critic_values(TimeDependentValue(), batch)
    credit = advantages(batch, v_cur, v_next, RunningStd(), CreditConfig(lam=0.5))
    assert credit.deltas[2, 0] == pytest.approx(1.0 - 0.3 - 0.01, abs=1e-6)
    assert credit.raw[2].tolist() == [0.0, 0.0, 0.0]
    assert credit.advantages[2, 1:].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(credit.raw[:2], [RAW_A, RAW_B], atol=1e-6)  # group g is unaffected by C


def test_running_std_scales_without_recentring():
    rs = RunningStd(momentum=0.5)
    assert rs.std == 1.0  # nothing seen yet
    # round 1: [1, 2, 3]: E[A] = 2, E[A^2] = 14/3, var = 14/3 - 4 = 2/3, std = 0.816497
    assert rs.update([1.0, 2.0, 3.0]) == pytest.approx(math.sqrt(2 / 3))
    # divided, not re-centred: [1, 2, 3] / 0.816497 = [1.224745, 2.449490, 3.674235] (re-centring would give
    # [-1.22, 0, 1.22])
    np.testing.assert_allclose(rs.normalise(np.array([1.0, 2.0, 3.0])), [1.224745, 2.449490, 3.674235], atol=1e-6)
    # round 2: [0, 4]: E = 2, E[A^2] = 8. Bias-corrected EMA weights 1/3 (round 1) and 2/3 (round 2):
    # E = 2, E[A^2] = 14/9 + 16/3 = 62/9, var = 62/9 - 4 = 26/9, std = sqrt(26) / 3 = 1.699673
    assert rs.update([0.0, 4.0]) == pytest.approx(math.sqrt(26) / 3)
    state = rs.state_dict()
    other = RunningStd()
    other.load_state_dict(state)
    assert other.std == rs.std and other.updates == 2


def test_running_std_persists_across_rounds_in_advantages():
    rs = RunningStd(momentum=0.9)
    batch = pad_episodes(_group())
    v_cur, v_next = critic_values(TimeDependentValue(), batch)
    first = advantages(batch, v_cur, v_next, rs, CreditConfig(lam=0.5))
    # a second round whose every input is doubled: raw advantages double, E[A^2] goes from s^2 to 4 s^2
    doubled = pad_episodes(
        [
            _episode("A2", "g", [0.2, 0.5, 0.9], [0.0, -0.02, 0.0], 1.0),
            _episode("B2", "g", [0.2, 0.1, 0.05], [-0.02, -0.02, 0.0], -0.1),
        ]
    )
    doubled.costs *= 2
    doubled.reward *= 2
    v_cur2, v_next2 = v_cur * 2, v_next * 2
    second = advantages(doubled, v_cur2, v_next2, rs, CreditConfig(lam=0.5))
    np.testing.assert_allclose(second.raw, 2 * first.raw, atol=1e-9)
    # weights of the bias-corrected EMA after two updates: 0.1 * 0.9 / 0.19 and 0.1 / 0.19 on E[A^2] = s^2, 4 s^2
    s = first.std
    assert rs.updates == 2
    assert second.std == pytest.approx(s * math.sqrt((0.09 * 1 + 0.1 * 4) / 0.19), rel=1e-9)


def test_error_only_requests_get_no_positive_credit_and_a_penalty():
    eps = _group()
    eps[0].error_only[0] = True  # A_1 would be positive (0.7367 / std)
    eps[1].error_only[1] = True  # B_2 is negative (-0.54 / std)
    batch = pad_episodes(eps)
    v_cur, v_next = critic_values(TimeDependentValue(), batch)
    credit = advantages(batch, v_cur, v_next, RunningStd(), CreditConfig(lam=0.5, error_penalty=0.1))
    std = credit.std
    assert credit.advantages[0, 0] == pytest.approx(-0.1)  # min(+1.2796, 0) - 0.1
    assert credit.advantages[1, 1] == pytest.approx(-0.54 / std - 0.1, abs=1e-6)
    assert credit.advantages[0, 1] == pytest.approx(RAW_A[1] / std, abs=1e-6)  # others untouched
    # the running std sees the raw advantages (the clamp does not feed back into the scale)
    assert std == pytest.approx(math.sqrt(float(np.mean(np.square(RAW_A + RAW_B)))), rel=1e-6)


# ---------------------------------------------------------------------- error-only detection from records
def _call(code="print(1)", name="python"):
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps({"code": code})}}


def _model_call(tool_calls, messages=None):
    return {"messages": messages or [], "response": {"content": "", "tool_calls": tool_calls}}


def _step(calls=()):
    return {"calls": list(calls), "costs": {"total": 0.0}}


def _next_prompt(*tool_texts):
    messages = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "", "tool_calls": [_call()]}]
    messages += [{"role": "tool", "tool_call_id": "c1", "content": text} for text in tool_texts]
    messages.append({"role": "user", "content": [{"type": "text", "text": "Images from the cell: head"}]})
    return RequestData(2, _model_call([_call()], messages), _step())


def test_error_only_detection():
    failed_cell = "[receipts]\nnothing\n[error] (error)\nNameError: name 'x' is not defined\nbudget: 3 requests"
    ok_cell = "{'success': True}\nbudget: 3 requests"
    # a cell whose only output is a Python error, and no robot call succeeded
    assert error_only_request(RequestData(1, _model_call([_call()]), _step()), _next_prompt(failed_cell))
    # the same cell, but a robot call succeeded before the error: it did something real
    good = _step([{"capability": "observe", "success": True}])
    assert not error_only_request(RequestData(1, _model_call([_call()]), good), _next_prompt(failed_cell))
    # a cell that ran fine
    assert not error_only_request(RequestData(1, _model_call([_call()]), _step()), _next_prompt(ok_cell))
    # two cells, only one failed
    assert not error_only_request(RequestData(1, _model_call([_call()]), _step()), _next_prompt(failed_cell, ok_cell))
    # no tool call at all, or only a malformed one: nothing ran
    assert error_only_request(RequestData(1, _model_call([]), _step()), None)
    assert error_only_request(RequestData(1, _model_call([_call(name="bash")]), _step()), None)
    assert error_only_request(RequestData(1, _model_call([_call(code="  ")]), _step()), None)
    # the last request: its output is never seen, so no penalty without evidence
    assert not error_only_request(RequestData(1, _model_call([_call()]), _step()), None)
    assert not error_only_request(RequestData(1, None, _step()), None)


def _stored_episode(eid, group, task, xs, costs, *, reward, valid=True, host_success=True, texts=None):
    requests = []
    for t, (x, c) in enumerate(zip(xs, costs, strict=True), start=1):
        feats = dict.fromkeys(FEATURE_NAMES, 0.0)
        feats[FEATURE_NAMES[0]] = x
        messages = []
        if texts and t > 1:
            messages = _next_prompt(texts[t - 2]).model_call["messages"]
        step = {"snapshot": {"features": feats}, "calls": [], "costs": {"total": c}, "solved_before": False}
        requests.append(RequestData(t, _model_call([_call()], messages), step))
    end = {"valid": valid, "reward": reward, "host_success": host_success}
    start = {"task": task, "group_id": group}
    return Episode(eid, start, end, requests)


def test_batch_from_stored_episodes():
    episodes = [
        _stored_episode("e1", "g1", "t1", [0.2, 0.5], [0.0, -0.02], reward=1.0, texts=["[error] (error)\nValueError"]),
        _stored_episode("e2", "g1", "t0", [0.1], [-0.008], reward=-0.1, host_success=False),
        _stored_episode("bad", "g1", "t0", [0.1], [0.0], reward=0.0, valid=False),
    ]
    batch = batch_from_episodes(episodes, ["t0", "t1"])
    assert batch.episode_ids == ["e1", "e2"]  # the invalid episode is left out
    assert batch.task.tolist() == [1, 0]
    assert batch.lengths.tolist() == [2, 1]
    np.testing.assert_allclose(batch.features[0, :, 0], [0.2, 0.5], atol=1e-7)
    np.testing.assert_allclose(batch.costs, [[0.0, -0.02], [-0.008, 0.0]])
    assert batch.reward.tolist() == [1.0, -0.1]
    assert batch.error_only.tolist() == [[True, False], [False, False]]  # request 1's cell only errored
    assert batch.group.tolist() == [0, 0]
    with pytest.raises(KeyError):
        batch_from_episodes(episodes, ["t0"])


# ---------------------------------------------------------------------- early stopping (App. E)
def test_control_slice_is_deterministic_and_about_five_percent():
    share = np.mean([in_control_slice(f"episode-{i}") for i in range(20000)])
    assert 0.045 < share < 0.055
    # pinned: sha256-based, so the same on every process and machine (Python's hash() is salted per process)
    pinned = [i for i in range(200) if in_control_slice(f"episode-{i}")]
    assert pinned == CONTROL_IDS


CONTROL_IDS = [1, 56, 64, 83, 107, 134, 145, 151, 152, 161, 182]


def _not_control(n=1):
    ids = [f"episode-{i}" for i in range(100) if not in_control_slice(f"episode-{i}")]
    return ids[:n]


def test_early_stop_rule():
    eid = _not_control()[0]
    hi, lo = 0.5, 0.01
    assert cut_request([hi] * 5 + [lo] * 5, eid) == 10
    assert should_cut([hi] * 5 + [lo] * 5, eid)
    assert not should_cut([hi] * 5 + [lo] * 4, eid)  # only four so far
    assert not should_cut([hi] * 5 + [lo] * 4 + [hi] + [lo] * 4, eid)  # the run was broken
    assert cut_request([hi] * 7 + [lo] * 5 + [hi], eid) == 12
    # requests 1..5 never count: low from the start still cuts only at request 10
    assert not should_cut([lo] * 9, eid)
    assert cut_request([lo] * 12, eid) == 10
    assert not should_cut([hi] * 5 + [0.02] * 5, eid)  # strictly below the threshold
    assert not should_cut([hi] * 5 + [lo] * 5, eid, hard=True)  # hard tasks are never cut
    control = f"episode-{CONTROL_IDS[0]}"
    assert not should_cut([lo] * 40, control)  # the control slice is never cut
    assert cut_request([hi] * 3 + [lo] * 3, eid, EarlyStopConfig(consecutive_n=2, after_request_n=2)) == 5


# ---------------------------------------------------------------------- vectorised == loop
def _with_repeats(x, rng):
    """About a third of the requests leave the state unchanged (perception only)."""
    for t in range(1, len(x)):
        if rng.random() < 0.3:
            x[t] = x[t - 1]
    return x


def test_vectorised_equals_reference_loop_on_random_inputs():
    rng = np.random.default_rng(3)
    tasks = ("a", "b", "c")
    critic = Critic(CriticConfig(tasks=tasks, members=3, hidden=32, layers=3, seed=1, eval_chunk_rows=17))
    episodes = []
    for i in range(24):
        n = int(rng.integers(1, 9))
        episodes.append(
            EpisodeCredit(
                episode_id=f"e{i}",
                group_id=f"g{i // 4}" if i < 20 else f"solo{i}",
                task=int(rng.integers(3)),
                features=_with_repeats(rng.normal(size=(n, N_FEAT)).astype(np.float32), rng),
                costs=-0.02 * rng.integers(0, 3, n),
                reward=float(rng.choice([1.0, 0.25, 0.0, -0.1, -0.3])),
                error_only=rng.random(n) < 0.2,
                requests=np.arange(1, n + 1),
            )
        )
    critic.set_normalisation(torch.from_numpy(np.concatenate([e.features for e in episodes])))
    # a random (untrained) critic gives values near 0.5; scale the last layer so they spread out
    with torch.no_grad():
        critic.model.weights[-1].mul_(20)

    def value(x, t, task):
        return float(critic.value_of(torch.from_numpy(x)[None], torch.tensor([float(t)]), torch.tensor([task]))[0])

    for lam in (0.0, 0.9, 1.0):
        config = CreditConfig(lam=lam, error_penalty=0.05)
        loop = advantages_loop(episodes, value, RunningStd(momentum=0.8), config)
        credit = advantages(
            pad_episodes(episodes), *critic_values(critic, pad_episodes(episodes)), RunningStd(0.8), config
        )
        for i, expected in enumerate(loop):
            np.testing.assert_allclose(credit.advantages[i, : len(expected)], expected, atol=1e-5)
        assert credit.std > 0.1  # the values really spread


def test_the_staged_subgoal_reward_enters_the_return_of_eq_10_by_hand():
    """CaPtain App. A.2: a failed hard-task episode at rung d of n gets 0.15 d / (n + 1) in R_i, so in G_i = R_i +
    sum_t c_t and in the group term of Eq. 10. stack_three_blocks has n = 6 rungs (grasp, lift, place, twice)."""
    from captain_ros.bridge.rewards import RewardConfig, subgoal_reward, terminal_reward

    def reward(outcome, d):
        return terminal_reward(outcome) + subgoal_reward(outcome, True, d, 6, RewardConfig())

    # X: failure at rung 4 (green placed and still on blue, red grasped): R = 0 + 0.15 * 4 / 7 = 0.6 / 7
    # Y: failure at rung 2 (its place did not hold at the end): R = 0.15 * 2 / 7 = 0.3 / 7
    # Z: budget exhausted at rung 0: R = -0.1;  W: success: R = 1 (no staged reward on a success)
    assert reward("failure", 4) == pytest.approx(0.6 / 7)
    assert reward("false_finish", 4) == -0.3  # a false finish earns no rung: it stays the worst class
    episodes = [
        _stored_episode("X", "g", "t0", [0.1, 0.1], [-0.02, 0.0], reward=reward("failure", 4), host_success=False),
        _stored_episode("Y", "g", "t0", [0.1, 0.1], [0.0, 0.0], reward=reward("failure", 2), host_success=False),
        _stored_episode("Z", "g", "t0", [0.1], [-0.008], reward=reward("budget_exhausted", 0), host_success=False),
        _stored_episode("W", "g", "t0", [0.1, 0.1], [0.0, -0.005], reward=reward("success", 6)),
    ]
    batch = batch_from_episodes(episodes, ["t0"])
    v_cur, v_next = critic_values(TimeFreeValue(), batch)
    credit = advantages(batch, v_cur, v_next, RunningStd(), CreditConfig())
    # G = R + sum c: X 0.6/7 - 0.02 = 0.0657143; Y 0.3/7 = 0.0428571; Z -0.108; W 0.995
    returns = [0.6 / 7 - 0.02, 0.3 / 7, -0.108, 0.995]
    np.testing.assert_allclose(credit.returns, returns, atol=1e-9)
    mean = (0.6 / 7 - 0.02 + 0.3 / 7 - 0.108 + 0.995) / 4  # 0.2488929
    np.testing.assert_allclose(credit.outcome, [g - mean for g in returns], atol=1e-9)
    assert credit.returns[0] > credit.returns[1] > 0 > credit.returns[2]  # partial progress > 0 > budget exhausted

"""CaPtain App. E's early stop, worker side (captain_ros_training.early_stop): the rule on hand-made critic values,
the control slice and hard tasks never cut, the published critic read back, the per-round counts."""

from __future__ import annotations

import math
import os

import pytest
import torch

from captain_ros.bridge.evaluation import EvaluationError, load_rows
from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeStore
from captain_ros.twin.features import FEATURE_NAMES
from captain_ros_training.credit import EarlyStopConfig, in_control_slice
from captain_ros_training.critic import Critic, CriticConfig
from captain_ros_training.early_stop import CriticEarlyStop, EpisodeStop, early_stop_counts, publish

HI, LO = 0.5, 0.01
CUT = next(i for i in range(200) if not in_control_slice(f"episode-{i}"))
CONTROL = next(i for i in range(200) if in_control_slice(f"episode-{i}"))


def scripted(values):
    """A value_of that returns values[t - 1] for request t (critic version 'v1')."""
    return lambda snapshot, t, task: (values[t - 1], "v1")


def run_checks(stop: EpisodeStop, n: int) -> int | None:
    """Ask before requests 1..n as the episode loop does; the request the episode was cut before, or None."""
    for t in range(1, n + 1):
        if stop.check(t, {}):
            return t
    return None


def test_the_fifth_low_value_after_request_five_cuts_before_that_request():
    values = [HI] * 5 + [LO] * 5 + [HI] * 5
    stop = EpisodeStop(f"episode-{CUT}", scripted(values))
    stop.begin("put_red_cube_in_bowl", hard=False)
    assert run_checks(stop, 15) == 10  # V(s_6..s_10, t) < 0.02: request 10 is never sent (9 requests ran)
    record = stop.record()
    assert record["stopped"] and record["stopped_before_request"] == 10 == record["would_stop_before_request"]
    assert not record["control_slice"] and not record["hard_task"] and record["critic_versions"] == ["v1"]
    assert record["values"] == [HI] * 5 + [LO] * 5  # the values seen up to the cut


def test_low_values_up_to_request_five_and_a_broken_run_never_cut():
    stop = EpisodeStop(f"episode-{CUT}", scripted([LO] * 9 + [HI] + [LO] * 4 + [0.02] * 5))
    stop.begin("put_red_cube_in_bowl", hard=False)
    assert run_checks(stop, 19) is None  # 4 counted lows (6-9), a high, 4 lows, then V = 0.02 (not below)
    assert stop.record()["would_stop_before_request"] is None


def test_the_control_slice_and_hard_tasks_are_never_cut_but_say_when_they_would_have_been():
    values = [HI] * 5 + [LO] * 10
    control = EpisodeStop(f"episode-{CONTROL}", scripted(values))
    control.begin("put_red_cube_in_bowl", hard=False)
    assert run_checks(control, 15) is None
    assert control.record()["control_slice"] and control.record()["would_stop_before_request"] == 10
    hard = EpisodeStop(f"episode-{CUT}", scripted(values))
    hard.begin("stack_three_blocks", hard=True)
    assert run_checks(hard, 15) is None
    assert hard.record()["hard_task"] and not hard.record()["stopped"]
    assert hard.record()["would_stop_before_request"] == 10


def test_nothing_is_cut_before_a_critic_is_published_and_a_late_one_does_not_cut_that_episode():
    values = [None] * 3 + [(LO, "v1")] * 12
    stop = EpisodeStop(f"episode-{CUT}", lambda snapshot, t, task: values[t - 1])
    stop.begin("put_red_cube_in_bowl", hard=False)
    assert run_checks(stop, 15) is None
    assert stop.record()["values"][:4] == [None, None, None, LO]
    with pytest.raises(ValueError, match="out of order"):
        stop.check(20, {})


def _critic(tasks=("put_red_cube_in_bowl", "open_drawer"), seed=0) -> Critic:
    critic = Critic(CriticConfig(tasks=tasks, members=2, hidden=16, layers=1, seed=seed))
    critic.set_normalisation(torch.randn(32, len(FEATURE_NAMES), generator=torch.Generator().manual_seed(1)))
    return critic


def test_a_worker_reads_the_published_critic_and_rereads_it_when_it_changes(tmp_path):
    path = tmp_path / "early_stop" / "critic.pt"
    stopper = CriticEarlyStop(path)
    snapshot = {"features": {name: 0.1 * i for i, name in enumerate(FEATURE_NAMES)}}
    assert stopper.value(snapshot, 7, "open_drawer") is None  # nothing published yet
    first = _critic()
    publish(first, path)
    assert not path.with_name("critic.pt.partial").exists()
    x = torch.tensor([[0.1 * i for i in range(len(FEATURE_NAMES))]])
    value, version = stopper.value(snapshot, 7, "open_drawer")
    assert value == pytest.approx(float(first.value_of(x, torch.tensor([7.0]), torch.tensor([1]))[0]), abs=1e-6)
    second = _critic(seed=5)
    publish(second, path)
    os.utime(path, ns=(1, 1))  # a distinct stamp whatever the file system's time resolution
    value2, version2 = stopper.value(snapshot, 7, "open_drawer")
    assert version2 != version
    assert value2 == pytest.approx(float(second.value_of(x, torch.tensor([7.0]), torch.tensor([1]))[0]), abs=1e-6)
    with pytest.raises(KeyError, match="vocabulary"):
        stopper.value(snapshot, 7, "close_drawer")


def test_the_round_counts_cuts_and_the_control_slice_false_stops():
    def end(stopped=False, would=None, control=False, hard=False, host=False):
        record = {"stopped": stopped, "would_stop_before_request": would, "control_slice": control, "hard_task": hard}
        return {"host_success": host, "early_stop": record}

    ends = [
        end(stopped=True, would=10),
        end(stopped=True, would=12),
        end(),
        end(control=True, would=11, host=True),  # a false stop: it would have been cut, yet it succeeded
        end(control=True, would=10),
        end(control=True, host=True),
        end(hard=True, would=14),
        {"host_success": True},  # no stopper (a run with --no-early-stop): not watched
    ]
    assert early_stop_counts(ends) == {
        "early_stop_watched": 7,
        "early_stopped": 2,
        "early_stop_control": 3,
        "early_stop_control_would_stop": 2,
        "early_stop_control_false_stops": 1,
        "early_stop_hard_would_stop": 1,
    }


def test_an_evaluation_refuses_an_episode_the_critic_cut(tmp_path):
    path = tmp_path / "rollout.sqlite"
    with EpisodeStore(path) as store:
        for eid, stopped in (("a", False), ("b", True)):
            start = {"task": "open_drawer", "start_id": "s", "family": "f", "attempt": 0, "group_id": "g",
                     "policy_version": 0, "worker": "w", "policy": "p", "split": "eval"}  # fmt: skip
            store.append(Record(eid, "episode_start", 0, start))
            end = {"outcome": "budget_exhausted", "host_success": False, "finished": False, "requests": 9,
                   "actions": 3, "wall_time_s": 1.0, "valid": True, "reward": -0.1, "reason": "cut",
                   "early_stop": {"rule": "critic", "stopped": stopped}}  # fmt: skip
            store.append(Record(eid, "episode_end", 0, end))
    with pytest.raises(EvaluationError, match="episode b was cut by the critic's early stop"):
        load_rows(path)
    assert math.isfinite(EarlyStopConfig().value_threshold)


def test_reading_the_critic_leaves_the_processes_torch_threads_as_they_were(tmp_path):
    """The stopper evaluates on one thread, and only around its own call: set process-wide it changed the
    reduction order of every later computation in the process (a test of the fast SFT path that compares two
    paths' Adam steps failed after this module's tests ran in the same pytest worker)."""
    path = tmp_path / "critic.pt"
    publish(_critic(), path)
    before = torch.get_num_threads()
    snapshot = {"features": dict.fromkeys(FEATURE_NAMES, 0.0)}
    assert CriticEarlyStop(path).value(snapshot, 3, "open_drawer") is not None
    assert torch.get_num_threads() == before

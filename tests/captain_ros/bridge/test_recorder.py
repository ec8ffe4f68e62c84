"""The episode adapter on the twin: a whole expert episode through the real loop and sandbox, recorded."""

from __future__ import annotations

import json
import math

import pytest

from captain_ros.bridge.recorder import EpisodeMeta, EpisodeRecorder
from captain_ros.bridge.store import EpisodeReader, EpisodeStore, StoreFull
from captain_ros.twin.privileged_state import FEATURE_NAMES
from captain_ros.worlds.twin.privileged import TwinPrivileged
from tests.captain_ros.agent.test_expert import InProcessExpert

pytestmark = pytest.mark.slow
START = "put_red_cube_in_bowl/official/11"


class WatchedExpert(InProcessExpert):
    """The expert, keeping every message list the policy was sent."""

    def __init__(self):
        super().__init__()
        self.sent: list[str] = []

    def complete(self, messages, tools, headers=None):
        self.sent.append(json.dumps(messages))
        return super().complete(messages, tools, headers)


class FailingStore(EpisodeStore):
    """A store whose disk fills up at the third step record (the real full-disk path is in test_transport)."""

    def append(self, record, digest=None):
        if record.kind == "step" and record.index == 3:
            raise StoreFull("storing step 3: the disk or quota is full (test)")
        return super().append(record, digest)


def _run(store, policy, tmp_path, episode_id, on_link=None, *, config=None, early_stop=None):
    from captain_ros.agent.episode import EpisodeRunner
    from captain_ros.agent.sandbox import Sandbox
    from captain_ros.core.config import load_config
    from captain_ros.worlds.twin.link import InProcessLink

    def sandbox(scratch, on_call, allowed):
        box = Sandbox(scratch, on_call, allowed)
        box.start()
        return box

    config = config or load_config()
    link = InProcessLink(config)
    if on_link is not None:
        on_link(link)
    meta = EpisodeMeta(attempt=2, group_id="g7", policy_version=5, policy="expert", worker="w1", split="eval")
    recorder = EpisodeRecorder(
        store, episode_id, TwinPrivileged(lambda: link.twin), meta, expect_model_calls=False, early_stop=early_stop
    )
    runner = EpisodeRunner(link, policy, config, sandbox_factory=sandbox, runs_dir=tmp_path, recorder=recorder)
    try:
        return runner.run("put_red_cube_in_bowl", START, "eval", episode_id)
    finally:
        link.close()


def test_an_expert_episode_is_recorded_with_snapshots_the_policy_never_sees(tmp_path):
    policy = WatchedExpert()
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        result = _run(store, policy, tmp_path, "ep1")
    assert result.strict_success, result.reason
    episode = EpisodeReader(tmp_path / "s.sqlite").load("ep1")
    start, end = episode.start, episode.end
    assert (start["family"], start["attempt"], start["group_id"], start["policy_version"]) == ("pick_place", 2, "g7", 5)
    assert [r.index for r in episode.requests] == list(range(1, result.requests + 1))
    for request in episode.requests:
        snap = request.step["snapshot"]
        assert sorted(snap["features"]) == sorted(FEATURE_NAMES)  # canonical JSON sorts keys: order by name
        assert len(snap["robot"]["arm_q_rad"]) == 7 and "red_cube" in snap["object_poses"]
    # the privileged snapshot is stored and never reaches a message
    for text in policy.sent:
        assert not any(name in text for name in ("target_goal_dist_norm", "ee_target_dist_m", "target_ever_held"))
    # post-success flags: from the first request whose snapshot shows the scene solved
    first = end["first_solved_request"]
    assert first is not None and episode.requests[first - 1].step["snapshot"]["success"]
    assert [r.post_success for r in episode.requests] == [r.index >= first for r in episode.requests]
    # the adapter's values
    costs = sum(r.step["costs"]["total"] for r in episode.requests)
    assert (end["outcome"], end["reward"], end["valid"]) == ("success", 1.0, True)
    assert end["return"] == pytest.approx(1.0 + costs) and costs < 0  # the request after solving costs
    # every robot call with its receipt; the images the policy was shown, stored once
    calls = [c for r in episode.requests for c in r.step["calls"]]
    assert len([c for c in calls if c["physical"]]) == result.actions
    assert all(c["receipt"] for c in calls)
    images = [i for r in episode.requests for i in r.step["images"]]
    assert images and all(EpisodeStore(tmp_path / "s.sqlite").has_blob(i["sha256"]) for i in images)


def test_the_critics_early_stop_cuts_an_episode_before_a_request_and_settles_it_as_budget_exhausted(tmp_path):
    """CaPtain App. E through the real loop: the stopper sees the privileged snapshot before each request (x(s_t):
    the critic's 36 features); with the rule shortened to 2 low values after request 1 it cuts before request 3."""
    from captain_ros_training.credit import EarlyStopConfig
    from captain_ros_training.critic import features_of
    from captain_ros_training.early_stop import EpisodeStop

    seen = []

    def value_of(snapshot, t, task):
        seen.append((t, task, len(features_of({"snapshot": snapshot}))))
        return 0.01, "v1"

    stop = EpisodeStop("ep-cut", value_of, EarlyStopConfig(consecutive_n=2, after_request_n=1, control_fraction=0.0))
    policy = WatchedExpert()
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        result = _run(store, policy, tmp_path, "ep-cut", early_stop=stop)
    assert seen == [(1, "put_red_cube_in_bowl", 36), (2, "put_red_cube_in_bowl", 36), (3, "put_red_cube_in_bowl", 36)]
    assert (result.outcome.value, result.requests, len(policy.sent)) == ("budget_exhausted", 2, 2)
    assert "stopped early before request 3" in result.reason
    episode = EpisodeReader(tmp_path / "s.sqlite").load("ep-cut")
    end = episode.end
    assert [r.index for r in episode.requests] == [1, 2]
    assert (end["outcome"], end["valid"], end["reward"], end["host_success"]) == ("budget_exhausted", True, -0.1, False)
    assert end["early_stop"]["stopped"] and end["early_stop"]["stopped_before_request"] == 3
    assert end["early_stop"]["values"] == [0.01, 0.01, 0.01] and not end["early_stop"]["control_slice"]


def test_a_store_that_fails_mid_episode_makes_it_an_invalid_infrastructure_failure(tmp_path):
    with FailingStore(tmp_path / "s.sqlite") as store:
        result = _run(store, WatchedExpert(), tmp_path, "ep2")
        end = store.record("ep2", "episode_end").payload
    assert result.outcome.value == "infrastructure_failure"
    assert "recording failed (after_request): StoreFull" in result.reason
    assert result.requests == 3 and not end["valid"] and "disk or quota is full" in end["invalid_reason"]


class BlowUp(WatchedExpert):
    """The expert, whose twin blows up (NaN state) while the third request is being answered."""

    link = None

    def complete(self, messages, tools, headers=None):
        if len(self.sent) == 2:
            self.link.twin.data.qpos[:] = float("nan")  # the simulation fails under the next motion
        return super().complete(messages, tools, headers)


def test_a_twin_that_fails_mid_episode_leaves_an_invalid_episode_with_its_earlier_records(tmp_path):
    policy = BlowUp()
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        result = _run(store, policy, tmp_path, "ep3", on_link=lambda link: setattr(policy, "link", link))
    assert result.outcome.value == "infrastructure_failure" and result.requests == 3
    episode = EpisodeReader(tmp_path / "s.sqlite").load("ep3")
    assert not episode.valid and episode.end["invalid_reason"] == result.reason
    assert [r.index for r in episode.requests] == [1, 2, 3]  # every request before the fault is whole
    assert all(math.isfinite(f) for r in episode.requests[:3] for f in r.step["snapshot"]["features"].values())


def test_a_shadow_checked_episode_records_each_prediction_beside_its_outcome(tmp_path):
    """With the shadow check on (harness.yaml's shadow.enabled), every physical call's step record carries the twin's
    prediction and the outcome, and the gap report reads them back from the store."""
    from dataclasses import replace

    from captain_ros.bridge import gap
    from captain_ros.core.config import load_config

    config = load_config()
    config = replace(config, shadow=replace(config.shadow, enabled=True))
    with EpisodeStore(tmp_path / "s.sqlite") as store:
        result = _run(store, InProcessExpert(), tmp_path, "ep4", config=config)
    assert result.strict_success, result.reason  # the expert's actions pass the check
    episode = EpisodeReader(tmp_path / "s.sqlite").load("ep4")
    physical = [c for r in episode.requests for c in r.step["calls"] if c["physical"] and c["executed"]]
    assert physical and all(set(c["shadow"]) == {"predicted", "actual"} for c in physical)
    episode_id, rows = gap.read_store(tmp_path / "s.sqlite", None)
    summary = gap.summarize(rows)
    assert episode_id == "ep4" and summary["checked"] == len(rows) >= len(physical) and summary["refused"] == 0
    assert summary["outcome_agreement"] >= 0.8  # the same twin, measured: outcomes mostly agree

"""Evaluation statistics on small stores with known outcomes: every number is checked against a value
computed by hand (or by scipy where it is an independent implementation of the same test)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.stats import binomtest

from captain_ros.bridge.evaluation import (
    EvalRow,
    EvaluationError,
    compare,
    load_rows,
    mcnemar_exact,
    pair_rows,
    stored_transcript,
    summarize,
    task_bootstrap_ci,
    wilson,
    write_report,
)
from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeStore
from captain_ros.cli.evaluation_cli import main

HOST = {"success": True, "missed_finish": True, "false_finish": False, "budget_exhausted": False, "failure": False}


def add_episode(  # noqa: PLR0917 - positional fields read like the start payload at every call
    store: EpisodeStore,
    eid: str,
    task: str,
    family: str | None,
    start_id: str,
    outcome: str,
    *,
    attempt: int = 0,
    policy: str | None = "sft",
    requests: int = 10,
    actions: int = 4,
    wall_time_s: float | None = 20.0,
    host_success: object = "derive",
) -> None:
    """An episode_start and (unless the outcome is 'open') an episode_end as the rollout side writes them;
    'infrastructure_failure' goes through EpisodeStore.abandon like a dead worker's episode."""
    start = {
        "task": task,
        "start_id": start_id,
        "attempt": attempt,
        "group_id": f"{task}/{start_id}",
        "policy_version": 3,
        "worker": "w0",
        "split": "eval",
        "instruction": f"do {task}",
    }
    if family is not None:
        start["family"] = family
    if policy is not None:
        start["policy"] = policy
    store.append(Record(eid, "episode_start", 0, start))
    if outcome == "open":
        return
    if outcome == "infrastructure_failure":
        assert store.abandon(eid, "twin crashed")
        return
    end = {
        "outcome": outcome,
        "host_success": HOST[outcome] if host_success == "derive" else host_success,
        "finished": outcome in ("success", "false_finish"),
        "requests": requests,
        "actions": actions,
        "reason": "test",
        "reward": 1.0 if outcome == "success" else 0.0,
        "valid": True,
    }
    if wall_time_s is not None:
        end["wall_time_s"] = wall_time_s
    store.append(Record(eid, "episode_end", 0, end))


# (task, family, start id, outcome, requests, actions, wall time s)
SUITE = [
    ("t1", "pick_place", "s0", "success", 10, 4, 20.0),
    ("t1", "pick_place", "s1", "missed_finish", 20, 6, 40.0),
    ("t1", "pick_place", "s2", "infrastructure_failure", 0, 0, None),
    ("t2", "pick_place", "s0", "false_finish", 5, 2, 10.0),
    ("t2", "pick_place", "s1", "budget_exhausted", 60, 30, 100.0),
    ("t3", "drawer", "s0", "success", 8, 3, 16.0),
    ("t3", "drawer", "s1", "failure", 1, 0, 2.0),
]


@pytest.fixture
def suite_store(tmp_path: Path) -> Path:
    path = tmp_path / "sft.sqlite"
    with EpisodeStore(path) as store:
        for i, (task, family, sid, outcome, req, act, wall) in enumerate(SUITE):
            add_episode(store, f"e{i:03d}", task, family, sid, outcome, requests=req, actions=act, wall_time_s=wall)
        add_episode(store, "e999", "t3", "drawer", "s2", "open")  # still running: not evaluated
    return path


# ------------------------------------------------------------------------------------------ loading
def test_load_rows_reads_start_and_end_records(suite_store: Path):
    rows = load_rows(suite_store)
    assert [r.episode_id for r in rows] == [f"e{i:03d}" for i in range(len(SUITE))]  # the open one is left out
    assert {r.policy for r in rows} == {"sft"}
    first = rows[0]
    assert (first.task, first.family, first.start_id, first.attempt, first.outcome) == (
        "t1",
        "pick_place",
        "s0",
        0,
        "success",
    )
    assert (first.host_success, first.strict_success, first.finished, first.valid) == (True, True, True, True)
    assert (first.requests, first.actions, first.wall_time_s) == (10, 4, 20.0)
    missed, infra, false_finish = rows[1], rows[2], rows[3]
    assert (missed.host_success, missed.strict_success, missed.finished) == (True, False, False)
    assert (false_finish.host_success, false_finish.strict_success, false_finish.finished) == (False, False, True)
    assert infra.valid is False and infra.outcome == "infrastructure_failure"
    assert infra.invalid_reason == "infrastructure_failure" and infra.wall_time_s is None
    assert {r.policy for r in load_rows(suite_store, policy="renamed")} == {"renamed"}


def test_load_rows_fills_missing_fields_from_the_outcome(tmp_path: Path):
    path = tmp_path / "s.sqlite"
    with EpisodeStore(path) as store:
        # a real-arm episode: no scorer, so host_success is null; no family, no policy label
        add_episode(store, "a", "t", None, "s0", "success", policy=None, host_success=None)
        add_episode(store, "b", "t", None, "s1", "missed_finish", policy=None, host_success=None)
        store.append(Record("c", "episode_start", 0, {"task": "t", "start_id": "s2", "attempt": 0, "group_id": "g",
                                                      "policy_version": 3, "worker": "w"}))  # fmt: skip
        store.append(Record("c", "episode_end", 0, {"outcome": "teleported", "reward": 0.0, "valid": True,
                                                    "requests": 1, "actions": 0, "reason": "?"}))  # fmt: skip
    a, b, c = load_rows(path)
    assert (a.family, a.policy, a.host_success, a.strict_success) == ("unknown", "policy_v3", True, True)
    assert (b.host_success, b.strict_success) == (True, False)
    assert (c.valid, c.invalid_reason) == (False, "unknown outcome 'teleported'")  # excluded, with the reason
    assert summarize([a, b, c])["overall"]["excluded_reasons"] == {"unknown outcome 'teleported'": 1}


def test_missing_store_is_refused_without_creating_one(tmp_path: Path):
    with pytest.raises(EvaluationError, match="no episode store at"):
        load_rows(tmp_path / "nope.sqlite")
    assert not (tmp_path / "nope.sqlite").exists()
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(EvaluationError, match="cannot read"):
        load_rows(junk)


# --------------------------------------------------------------------------------------- summaries
def test_wilson_interval_hand_values_and_scipy():
    lo, hi = wilson(3, 6)  # p = 1/2: centred at 1/2, half-width z sqrt(1/24 + z^2/144) / (1 + z^2/6)
    assert lo == pytest.approx(0.187616, abs=1e-6) and hi == pytest.approx(0.812384, abs=1e-6)
    lo, hi = wilson(0, 6)  # lower bound 0, upper (z^2/6) / (1 + z^2/6)
    assert lo == 0.0 and hi == pytest.approx(0.390334, abs=1e-6)
    assert wilson(0, 0) == (None, None)
    for k, n in [(1, 7), (13, 40), (40, 40), (177, 240)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_summarize_overall_excludes_infrastructure_failures(suite_store: Path):
    s = summarize(load_rows(suite_store))
    o = s["overall"]
    assert s["policies"] == ["sft"]
    assert (o["episodes"], o["valid"], o["excluded"], o["infrastructure_failures"]) == (7, 6, 1, 1)
    assert o["excluded_reasons"] == {"infrastructure_failure": 1}
    # over the 6 valid episodes: success 2, missed 1, false finish 1, budget 1, failure 1
    expected = {"host": 3, "strict": 2, "false_finish": 1, "missed_finish": 1, "budget_exhausted": 1}
    for name, k in expected.items():
        r = o["rates"][name]
        assert (r["k"], r["n"]) == (k, 6)
        assert r["rate"] == pytest.approx(k / 6)
        assert (r["ci_low"], r["ci_high"]) == pytest.approx(wilson(k, 6))
        assert r["ci_low"] <= r["rate"] <= r["ci_high"]
    assert o["outcomes"] == {"success": 2, "missed_finish": 1, "false_finish": 1, "budget_exhausted": 1, "failure": 1}
    assert o["mean_requests"] == pytest.approx(104 / 6)  # 10 + 20 + 5 + 60 + 8 + 1: the infra episode is left out
    assert o["mean_actions"] == pytest.approx(45 / 6)
    assert o["mean_wall_time_s"] == pytest.approx(188 / 6)


def test_summarize_per_family_and_per_task(suite_store: Path):
    s = summarize(load_rows(suite_store))
    assert list(s["by_family"]) == ["drawer", "pick_place"]
    pp, dr = s["by_family"]["pick_place"], s["by_family"]["drawer"]
    assert (pp["valid"], pp["excluded"]) == (4, 1)
    assert {k: pp["rates"][k]["k"] for k in pp["rates"]} == {
        "host": 2, "strict": 1, "false_finish": 1, "missed_finish": 1, "budget_exhausted": 1
    }  # fmt: skip
    assert pp["mean_requests"] == pytest.approx(95 / 4)
    assert (dr["valid"], dr["excluded"], dr["rates"]["host"]["rate"], dr["rates"]["strict"]["rate"]) == (2, 0, 0.5, 0.5)
    assert dr["rates"]["false_finish"]["rate"] == 0.0 and dr["mean_requests"] == pytest.approx(4.5)
    t1 = s["by_task"]["t1"]
    assert (t1["family"], t1["valid"], t1["excluded"]) == ("pick_place", 2, 1)
    assert (t1["rates"]["host"]["rate"], t1["rates"]["strict"]["rate"]) == (1.0, 0.5)
    assert s["by_task"]["t2"]["rates"]["host"]["k"] == 0


def test_summarize_with_only_invalid_episodes_has_undefined_rates():
    row = EvalRow("p", "t", "f", "s", 0, "infrastructure_failure", False, False, False, 0, 0, None, False)
    o = summarize([row])["overall"]
    assert (o["valid"], o["excluded"]) == (0, 1)
    assert o["rates"]["host"] == {"k": 0, "n": 0, "rate": None, "ci_low": None, "ci_high": None}
    assert o["mean_requests"] is None


# ------------------------------------------------------------------------------------------ McNemar
@pytest.mark.parametrize(
    ("b", "c", "p"),
    [(0, 6, 0.03125), (6, 0, 0.03125), (0, 0, 1.0), (3, 3, 1.0), (1, 5, 0.21875), (1, 11, 26 / 4096), (0, 1, 1.0)],
)
def test_mcnemar_exact_hand_values(b: int, c: int, p: float):
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)


def test_mcnemar_exact_matches_scipy_binomtest():
    for b in range(0, 25):
        for c in range(0, 25):
            if b + c:
                assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9, abs=1e-300)
    # large counts (the paper's 800-episode suites): exact integers, no underflow to a wrong value
    for b, c in [(11, 55), (40, 160), (400, 460)]:
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9)
    assert mcnemar_exact(0, 1000) == 2.0**-999  # 2 / 2^1000, below 1e-300 yet exact


def test_mcnemar_exact_reproduces_the_paper():
    # CaPtain §4.1: on held-out LIBERO, RL gained 55 host successes and lost 11; Table 10 gives p = 4e-8
    assert f"{mcnemar_exact(11, 55):.0e}" == "4e-08"


def test_mcnemar_exact_rejects_bad_counts():
    with pytest.raises(ValueError, match="non-negative integers"):
        mcnemar_exact(-1, 3)
    with pytest.raises(ValueError, match="non-negative integers"):
        mcnemar_exact(1.5, 3)


# ----------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_resamples_whole_tasks():
    # two tasks of 10 pairs: one all +1, one all 0. Resampling tasks gives 1, 1/2, 1/2, 0 with probabilities
    # 1/4, 1/2, 1/4, so the 95% interval is exactly [0, 1] (resampling single pairs would give about [0.3, 0.7]).
    clusters, deltas = ["a"] * 10 + ["b"] * 10, [1] * 10 + [0] * 10
    assert task_bootstrap_ci(clusters, deltas, resamples=10_000, seed=1) == (0.0, 1.0)


def test_bootstrap_matches_a_loop_over_the_same_draws():
    rng = np.random.default_rng(5)
    clusters = [f"t{i}" for i in rng.integers(0, 12, 200)]
    deltas = rng.choice([-1, 0, 0, 1, 1], size=200).tolist()
    lo, hi = task_bootstrap_ci(clusters, deltas, resamples=500, seed=7)
    # reference: the same generator draws, one resample at a time, pairs gathered by hand
    order = list(dict.fromkeys(clusters))
    members = {t: [d for c, d in zip(clusters, deltas, strict=True) if c == t] for t in order}
    draws = np.random.default_rng(7).integers(0, len(order), size=(500, len(order)))
    stats = []
    for row in draws:
        picked = [d for j in row for d in members[order[j]]]
        stats.append(sum(picked) / len(picked))
    assert (lo, hi) == pytest.approx(tuple(np.quantile(stats, [0.025, 0.975])), abs=1e-12)


def test_bootstrap_is_reproducible_and_degenerates_when_all_tasks_agree():
    clusters = ["a", "a", "b", "c", "c", "c"]
    deltas = [1, 0, 1, 0, 1, -1]
    assert task_bootstrap_ci(clusters, deltas, seed=3) == task_bootstrap_ci(clusters, deltas, seed=3)
    assert task_bootstrap_ci(["a", "b", "c"], [1, 1, 1]) == (1.0, 1.0)
    assert task_bootstrap_ci(["a", "a", "b"], [0, 0, 0]) == (0.0, 0.0)
    # every task has the same mean and size: each resample has that mean
    assert task_bootstrap_ci(["a", "a", "b", "b"], [1, 0, 0, 1]) == pytest.approx((0.5, 0.5))
    with pytest.raises(ValueError):
        task_bootstrap_ci([], [])


def test_bootstrap_with_many_tasks_is_chunked_and_fast():
    rng = np.random.default_rng(0)
    clusters = rng.integers(0, 2000, 20_000).tolist()
    deltas = rng.choice([-1, 0, 1], size=20_000).tolist()
    lo, hi = task_bootstrap_ci(clusters, deltas, resamples=10_000)
    point = sum(deltas) / len(deltas)
    assert lo < point < hi and hi - lo < 0.05


# ---------------------------------------------------------------------------------- paired compare
# per pair: (task, family, start id, A outcome, B outcome)
PAIRS = (
    [("t1", "pick_place", f"s{i}", "budget_exhausted", "success") for i in range(3)]
    + [("t1", "pick_place", "s3", "success", "success")]
    + [("t2", "pick_place", f"s{i}", "failure", "success") for i in range(2)]
    + [("t2", "pick_place", "s2", "success", "false_finish"), ("t2", "pick_place", "s3", "failure", "missed_finish")]
    + [("t3", "drawer", f"s{i}", "budget_exhausted", "success") for i in range(4)]
    + [("t4", "drawer", f"s{i}", "false_finish", "success") for i in range(2)]
)


@pytest.fixture
def pair_stores(tmp_path: Path) -> tuple[Path, Path]:
    a_path, b_path = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with EpisodeStore(a_path) as a, EpisodeStore(b_path) as b:
        # A's first try of (t1, s0) died in the infrastructure and was re-run: the re-run is the one paired
        add_episode(a, "a000", "t1", "pick_place", "s0", "infrastructure_failure", policy="sft")
        for i, (task, fam, sid, oa, ob) in enumerate(PAIRS):
            add_episode(a, f"a{i + 1:03d}", task, fam, sid, oa, policy="sft")
            add_episode(b, f"b{i + 1:03d}", task, fam, sid, ob, policy="rl")
        add_episode(a, "a100", "t1", "pick_place", "s9", "success", policy="sft")  # only in A
        add_episode(b, "b100", "t3", "drawer", "s9", "success", policy="rl")  # only in B
        add_episode(a, "a101", "t4", "drawer", "s5", "success", policy="sft")  # invalid in B
        add_episode(b, "b101", "t4", "drawer", "s5", "infrastructure_failure", policy="rl")
        add_episode(a, "a102", "t4", "drawer", "s6", "infrastructure_failure", policy="sft")  # invalid in both
        add_episode(b, "b102", "t4", "drawer", "s6", "infrastructure_failure", policy="rl")
        add_episode(a, "a103", "t2", "pick_place", "s7", "infrastructure_failure", policy="sft")  # invalid in A
        add_episode(b, "b103", "t2", "pick_place", "s7", "failure", policy="rl")
        add_episode(b, "b104", "t1", "pick_place", "s1", "failure", policy="rl")  # a second valid run: ignored
        add_episode(a, "a104", "t1", "pick_place", "s0", "success", attempt=1, policy="sft")  # other attempt
    return a_path, b_path


def test_pairing_drops_unmatched_keys_and_says_why(pair_stores):
    rows_a, rows_b = (load_rows(p) for p in pair_stores)
    pairs, report = pair_rows(rows_a, rows_b)
    assert report == {
        "paired": 14,
        "keys_a": 14 + 5,  # the 14 paired keys, s9, (t4, s5), (t4, s6), (t2, s7), attempt 1 of (t1, s0)
        "keys_b": 14 + 4,
        "only_in_a": 2,  # (t1, s9, 0) and (t1, s0, 1)
        "only_in_b": 1,
        "invalid_in_a": 1,
        "invalid_in_b": 1,
        "invalid_in_both": 1,
        "duplicates_a": 0,
        "duplicates_b": 1,
        "family_mismatch": 0,
    }
    by_key = {a.key: (a, b) for a, b in pairs}
    a, _ = by_key[("t1", "s0", 0)]
    assert (a.episode_id, a.valid) == ("a001", True)  # the re-run, not the infrastructure failure
    assert by_key[("t1", "s1", 0)][1].episode_id == "b002"  # the oldest valid run of a duplicated key


def test_compare_strict_hand_computed(pair_stores):
    rows_a, rows_b = (load_rows(p) for p in pair_stores)
    comp = compare(rows_a, rows_b, metric="strict")
    assert comp["labels"] == ["sft", "rl"] and comp["metric"] == "strict"
    o = comp["overall"]
    # B gains: t1 3, t2 2, t3 4, t4 2 = 11; B loses: t2 s2 = 1; both succeed: t1 s3; both fail: t2 s3
    assert (o["pairs"], o["tasks"], o["b"], o["c"], o["both_success"], o["both_fail"]) == (14, 4, 1, 11, 1, 1)
    assert o["rate_a"] == pytest.approx(2 / 14) and o["rate_b"] == pytest.approx(12 / 14)
    assert o["difference"] == pytest.approx(10 / 14) == o["rate_b"] - o["rate_a"]
    assert o["p_value"] == pytest.approx(26 / 4096)  # 2 (C(12,0) + C(12,1)) / 2^12
    assert o["ci_low"] <= o["difference"] <= o["ci_high"]
    pp, dr = comp["by_family"]["pick_place"], comp["by_family"]["drawer"]
    assert (pp["pairs"], pp["b"], pp["c"], pp["difference"]) == (8, 1, 5, 0.5)
    assert pp["p_value"] == pytest.approx(0.21875)  # 2 (1 + 6) / 64
    assert (dr["pairs"], dr["b"], dr["c"], dr["difference"]) == (6, 0, 6, 1.0)
    assert dr["p_value"] == pytest.approx(0.03125)
    assert (dr["ci_low"], dr["ci_high"]) == (1.0, 1.0)  # every drawer pair is a gain: no spread to resample
    assert comp["bootstrap"] == {"resamples": 10_000, "seed": 0, "confidence": 0.95, "cluster": "task"}
    assert compare(rows_a, rows_b)["overall"] == o  # the fixed seed makes the interval reproducible


def test_compare_host_counts_a_missed_finish_as_host_success(pair_stores):
    rows_a, rows_b = (load_rows(p) for p in pair_stores)
    o = compare(rows_a, rows_b, metric="host")["overall"]
    # as strict, plus (t2, s3): A failure vs B missed finish is a host gain; (t2, s2) false finish is a host loss
    assert (o["b"], o["c"], o["both_success"], o["both_fail"]) == (1, 12, 1, 0)
    assert o["p_value"] == pytest.approx(28 / 8192)  # 2 (1 + 13) / 2^13
    with pytest.raises(ValueError, match="metric"):
        compare(rows_a, rows_b, metric="reward")


def test_compare_without_overlap_is_a_clear_error(pair_stores, tmp_path: Path):
    rows_a = load_rows(pair_stores[0])
    other = tmp_path / "other.sqlite"
    with EpisodeStore(other) as store:
        add_episode(store, "x", "t9", "drawer", "s0", "success", policy="rl")
    with pytest.raises(EvaluationError, match=r"no \(task, start id, attempt\) key has a valid episode in both"):
        compare(rows_a, load_rows(other))


# ------------------------------------------------------------------------------------------ report
def _assert_png(path: Path) -> None:
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 200 and img.size[1] > 200
        img.verify()


def test_write_report_single_store(suite_store: Path, tmp_path: Path):
    out = tmp_path / "report"
    md_path = write_report(out, load_rows(suite_store), sources=[str(suite_store)])
    assert md_path == out / "report.md"
    md = md_path.read_text()
    for png in ("success.png", "outcomes.png"):
        assert f"]({png})" in md
        _assert_png(out / png)
    assert not (out / "difference.png").exists()
    assert "| all | 6 | 1 | 50.0 [18.8, 81.2] | 33.3 [9.7, 70.0] |" in md  # overall host and strict, Wilson CIs
    assert "1 infrastructure failures" in md
    data = json.loads((out / "report.json").read_text())
    assert data["labels"] == ["sft"] and data["comparisons"] == {}
    assert data["summaries"]["sft"] == json.loads(json.dumps(summarize(load_rows(suite_store))))
    assert len(data["episodes"]["sft"]) == 7


def test_write_report_comparison(pair_stores, tmp_path: Path):
    rows_a, rows_b = (load_rows(p) for p in pair_stores)
    out = tmp_path / "cmp"
    md = write_report(out, rows_a, rows_b, labels=["SFT", "RL"], metric="host", resamples=2000, seed=4).read_text()
    for png in ("success.png", "outcomes.png", "difference.png"):
        assert f"]({png})" in md
        _assert_png(out / png)
    data = json.loads((out / "report.json").read_text())
    assert data["labels"] == ["SFT", "RL"] and list(data["comparisons"]) == ["host", "strict"]
    strict = data["comparisons"]["strict"]
    sft, rl = [replace(r, policy="SFT") for r in rows_a], [replace(r, policy="RL") for r in rows_b]
    expected = compare(sft, rl, "strict", resamples=2000, seed=4)
    assert strict == json.loads(json.dumps(expected))
    assert strict["pairing"]["paired"] == 14
    # the sentence reading the overall test, and the table row with the hand-computed p
    assert "RL reached strict success where SFT did not in 11 pairs, and SFT where RL did not in 1" in md
    assert "so RL is better on strict success" in md
    assert "| all | 14 | 4 | 14.3 | 85.7 |" in md and "| 1 | 11 | 0.00635 |" in md
    assert md.index("### host success") < md.index("### strict success")  # the chosen metric first


def test_identical_labels_are_told_apart(pair_stores, tmp_path: Path):
    rows_a, rows_b = (load_rows(p, policy="expert") for p in pair_stores)
    write_report(tmp_path / "r", rows_a, rows_b, resamples=200)
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["labels"] == ["expert (A)", "expert (B)"]


def test_equal_policies_read_as_no_evidence(tmp_path: Path):
    a_path, b_path = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with EpisodeStore(a_path) as a, EpisodeStore(b_path) as b:
        for i, (oa, ob) in enumerate([("success", "failure"), ("failure", "success"), ("success", "success")]):
            add_episode(a, f"a{i}", f"t{i}", "spatial", "s0", oa, policy="x")
            add_episode(b, f"b{i}", f"t{i}", "spatial", "s0", ob, policy="y")
    md = write_report(tmp_path / "r", load_rows(a_path), load_rows(b_path), resamples=500).read_text()
    assert "McNemar test gives p = 1:" in md and "do not show a difference" in md


# --------------------------------------------------------------------------------------------- CLI
def test_cli_report(suite_store: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["report", str(suite_store), "--label", "SFT", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SFT: 7 complete episodes, 6 valid, 1 excluded (1 infrastructure failures), 1 not ended" in text
    assert "pick_place" in text and "50.0 [18.8, 81.2]" in text
    assert f"report: {out / 'report.md'}" in text
    assert json.loads((out / "report.json").read_text())["labels"] == ["SFT"]


def test_cli_compare(pair_stores, tmp_path: Path, capsys):
    a, b = pair_stores
    out = tmp_path / "out"
    argv = ["compare", str(a), str(b), "--labels", "SFT", "RL", "--metric", "strict", "--out", str(out)]
    assert main([*argv, "--resamples", "1000"]) == 0
    text = capsys.readouterr().out
    assert "RL vs SFT, strict success:" in text
    assert "0.00635" in text and "McNemar" in text
    assert (out / "difference.png").is_file()


def test_cli_errors(tmp_path: Path, pair_stores, capsys):
    missing = tmp_path / "missing.sqlite"
    assert main(["report", str(missing), "--out", str(tmp_path / "o")]) == 1
    assert "no episode store at" in capsys.readouterr().err
    empty = tmp_path / "empty.sqlite"
    with EpisodeStore(empty) as store:
        add_episode(store, "e", "t", "drawer", "s0", "open")
    assert main(["report", str(empty), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "has no complete episodes (1 episodes have not ended)" in err and "run rollouts" in err
    other = tmp_path / "other.sqlite"
    with EpisodeStore(other) as store:
        add_episode(store, "x", "t9", "drawer", "s0", "success")
    assert main(["compare", str(pair_stores[0]), str(other), "--out", str(tmp_path / "o")]) == 1
    assert "nothing can be compared" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing half-written
    with pytest.raises(SystemExit) as exc:
        main(["report", str(pair_stores[0])])  # --out is required
    assert exc.value.code == 2


def test_cli_as_a_module(suite_store: Path, tmp_path: Path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "captain_ros.cli",
            "eval",
            "report",
            str(suite_store),
            "--out",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "m" / "report.md").is_file() and math.isfinite(
        json.loads((tmp_path / "m" / "report.json").read_text())["summaries"]["sft"]["overall"]["mean_requests"]
    )


# ------------------------------------------------------------------------------------------ transcripts
def _call(code: str) -> dict:
    function = {"name": "python", "arguments": json.dumps({"code": code})}
    return {"content": "", "tool_calls": [{"type": "function", "function": function}]}


def _model_call(messages: list[dict], code: str) -> dict:
    """A model_call record's payload as the proxy writes it (the fields the schema requires)."""
    return {
        "messages": messages,
        "tools": [],
        "sampling": {},
        "prompt_token_ids": None,
        "token_ids": None,
        "logprobs": None,
        "policy_version": 3,
        "timing": {},
        "status": "ok",
        "response": _call(code),
    }


def test_transcript_of_a_stored_episode(suite_store: Path, tmp_path: Path, capsys):
    """Each request's cell, what came back to it (the next request's new messages; the last one's receipts), the
    outcome; --brief keeps a cell's comments; the filters pick the episode."""
    first, second = "# step: survey\n# look first\nx = 1\nprint(x)", "# step: finish\nfinish('done')"
    messages = [{"role": "developer", "content": "TASK.md"}, {"role": "user", "content": "do t1"}]
    after_first = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": _call(first)["tool_calls"]},
        {"role": "tool", "content": "x is 1\n[receipts]\nobserve: obs-1"},
    ]
    with EpisodeStore(suite_store) as store:
        add_episode(store, "tx", "t1", "pick_place", "s9", "missed_finish")
        store.append(Record("tx", "model_call", 1, _model_call(messages, first)))
        store.append(Record("tx", "model_call", 2, _model_call(after_first, second)))
        step = {"snapshot": {}, "calls": [{"receipt": "finish: refused"}], "timing": {}, "costs": {}}
        store.append(Record("tx", "step", 2, {**step, "solved_before": False}))
    text = stored_transcript(suite_store, "tx")
    assert (
        text.index("# Episode tx: t1 (s9)")
        < text.index("print(x)")
        < text.index("x is 1")
        < text.index("finish('done')")
        < text.index("finish: refused")
        < text.index("**missed_finish**")
    )
    assert "TASK.md" not in text and "do t1" in text  # the instruction once, as the heading's quote
    brief = stored_transcript(suite_store, "tx", brief=True)
    assert "# look first" in brief and "print(x)" not in brief and "# ... 2 lines of code" in brief
    assert "x is 1" in brief and "observe: obs-1" not in brief  # the output, without its receipts
    out = tmp_path / "t.md"
    assert main(["transcript", str(suite_store), "--outcome", "missed_finish", "--task", "t1", "--out", str(out)]) == 0
    assert "e001: t1 from s1" in capsys.readouterr().err  # the oldest match: the suite's own missed finish
    assert main(["transcript", str(suite_store), "--episode", "tx", "--brief"]) == 0
    assert "# look first" in capsys.readouterr().out
    assert main(["transcript", str(suite_store), "--task", "nothing"]) == 1
    assert "no complete episode matches" in capsys.readouterr().err
    with pytest.raises(EvaluationError, match="no episode 'nope'"):
        stored_transcript(suite_store, "nope")

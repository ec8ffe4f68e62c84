"""The sim-to-real gap report: rows from transcripts and stores, its summary, and bad input (the checked path with
real predictions is in harness/test_shadow.py and test_recorder.py)."""

from __future__ import annotations

import json

from captain_ros.bridge import gap
from captain_ros.bridge.store import EpisodeStore
from captain_ros.cli import gap_cli

PREDICTED = {"outcome": "contact", "executed_distance_m": 0.05, "peak_force_n": 4.0, "jaw_after_m": 0.08}
ACTUAL = {"outcome": "target_reached", "executed_distance_m": 0.08, "peak_force_n": 1.0, "jaw_after_m": 0.08}


def test_the_report_counts_refusals_agreement_and_errors():
    rows = gap.rows_from_calls(
        [
            ("move_to", {"predicted": PREDICTED, "actual": ACTUAL}),
            ("observe", None),  # not checked: no row
            ("move_to", {"predicted": {**PREDICTED, "refusal": "the twin predicts panda_link6 ~ det-2"}, "actual": {}}),
            ("release", {"predicted": ACTUAL, "actual": ACTUAL}),
        ]
    )
    assert [r["n"] for r in rows] == [1, 2, 3]
    summary = gap.summarize(rows)
    assert (summary["checked"], summary["refused"], summary["ran"], summary["outcome_agreement"]) == (3, 1, 2, 0.5)
    assert abs(summary["executed_distance_m_mae"] - 0.015) < 1e-9 and summary["executed_distance_m_pairs"] == 2
    text = gap.markdown(rows, summary, "test")
    assert "REFUSED: the twin predicts panda_link6" in text and "| 1 | move_to | contact | target_reached |" in text
    assert "was shadow-checked" in gap.markdown([], gap.summarize([]), "none")


def test_bad_inputs_are_refused_with_the_reason(tmp_path, capsys):
    assert gap_cli.main([str(tmp_path / "nowhere.jsonl")]) == 2
    assert "no transcript or store at" in capsys.readouterr().err
    empty = tmp_path / "empty.sqlite"
    EpisodeStore(empty).close()
    assert gap_cli.main([str(empty)]) == 2
    assert "holds no complete episode" in capsys.readouterr().err
    transcript = tmp_path / "ep" / "transcript.jsonl"
    transcript.parent.mkdir()
    call = {"type": "call", "capability": "observe", "result": {"value": {"observation_handle": "obs-1"}}}
    transcript.write_text(json.dumps(call) + "\n{not json, cut by a kill\n")
    assert gap_cli.main([str(transcript.parent)]) == 0  # a cut last line is skipped; nothing was checked
    assert "No action of this episode was shadow-checked" in (transcript.parent / "gap.md").read_text()
    assert not (transcript.parent / "gap.png").exists()

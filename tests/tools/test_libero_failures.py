"""tools/libero_failures.py: each failed episode in the first class whose rule matches what its cells printed (never
their comments), a table, and one example transcript per class."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeStore
from tests.captain_ros.bridge.test_evaluation import _model_call, add_episode

TOOL = Path(__file__).resolve().parents[2] / "tools" / "libero_failures.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("libero_failures", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def with_output(store: EpisodeStore, eid: str, code: str, output: str) -> None:
    """Two requests: a cell, then the next request carrying what it printed."""
    first = [{"role": "user", "content": "go"}]
    after = [*first, {"role": "assistant", "content": None}, {"role": "tool", "content": output}]
    store.append(Record(eid, "model_call", 1, _model_call(first, code)))
    store.append(Record(eid, "model_call", 2, _model_call(after, "print('again')")))


def test_classes_table_and_examples(tmp_path: Path, capsys):
    tool = load_tool()
    path = tmp_path / "eval.sqlite"
    with EpisodeStore(path) as store:
        add_episode(store, "ok", "libero_goal/0", "libero_goal", "11", "success")
        add_episode(store, "m1", "libero_object/4", "libero_object", "11", "missed_finish")
        add_episode(store, "g1", "libero_spatial/4", "libero_spatial", "11", "failure")
        with_output(
            store, "g1", "# the rim slipped out once\nsurvey()", "result: no clear, reachable grasp\nstatus: no_grasp"
        )
        add_episode(store, "g2", "libero_spatial/4", "libero_spatial", "12", "failure")
        with_output(store, "g2", "survey()", "result: no clear, reachable grasp of the black bowl\nstatus: no_grasp")
        add_episode(store, "d1", "libero_goal/5", "libero_goal", "11", "failure")
        with_output(store, "d1", "print(1)", "I cannot turn the instruction 'push the plate' into steps")
        add_episode(store, "x1", "libero_10/2", "libero_10", "11", "failure")
    out = tmp_path / "classes"
    (out).mkdir()
    (out / "stale.md").write_text("an example from an earlier run")
    assert tool.main([str(path), "--out", str(out)]) == 0
    table = (out / "README.md").read_text()
    assert "6 valid episodes" in table and "5 not a strict success" in table
    # the comment "slipped out" is not what the cell printed: the grasp class, not the slip class
    assert "| no_reachable_grasp | 2 | libero_spatial 2 | libero_spatial/4 (2) |" in table
    assert "| missed_finish | 1 |" in table and "| declined | 1 |" in table and "| other | 1 |" in table
    assert "grasp_slipped_or_dropped" not in table
    assert sorted(p.name for p in out.glob("*.md")) == [
        "README.md",
        "declined.md",
        "missed_finish.md",
        "no_reachable_grasp.md",
        "other.md",
    ]  # the stale example is gone
    example = (out / "no_reachable_grasp.md").read_text()
    assert "--episode g1 --brief" in example and "# Episode g1: libero_spatial/4 (11)" in example
    assert "no_reachable_grasp" in capsys.readouterr().out


def test_a_missing_store_is_an_error(tmp_path: Path, capsys):
    assert load_tool().main([str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "o")]) == 1
    assert "no episode store" in capsys.readouterr().err

"""The measured figures of the README and docs/ are the benchmarks' own: rendered from bench/results by
tools/readme_figures.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "tools" / "readme_figures.py")
readme_figures = importlib.util.module_from_spec(spec)
sys.modules["readme_figures"] = readme_figures  # dataclasses look their module up there
spec.loader.exec_module(readme_figures)


def test_readme_figures_match_the_results_files():
    names = []
    for page in readme_figures.pages():
        text = page.read_text()
        names += [name for _, name, _, _ in readme_figures.BLOCK.findall(text)]
        assert readme_figures.rebuilt(text) == text, f"{page.name}: run `python tools/readme_figures.py`"
    assert sorted(names) == sorted(readme_figures.BLOCKS), "every defined block is on exactly one page"
    headline = readme_figures.BLOCK.findall(readme_figures.README.read_text())
    # the headline figures, the real student's table with its plot by family, and LIBERO per suite beside CaPtain's
    assert [name for _, name, _, _ in headline] == ["headline", "student", "libero_protocol"], (
        "the README carries the headline figures"
    )
    assert "](bench/results/student.png)" in readme_figures.README.read_text()


def test_a_missing_key_names_the_bench_to_rerun(tmp_path, monkeypatch):
    (tmp_path / "ros_rtt.json").write_text('{"rtt_ratio": 1.0}')
    monkeypatch.setattr(readme_figures, "RESULTS", tmp_path)
    try:
        readme_figures.render("ros_rtt")
    except SystemExit as exc:
        assert "has no key" in str(exc) and "python bench/ros_rtt.py" in str(exc)
    else:
        raise AssertionError("a results file without the keys must be refused")


def test_the_libero_protocol_counts_carry_wilson_intervals():
    # the headline variant's episodes only; intervals by hand: 1/2 -> 0.09-0.91, 2/2 -> 0.34-1.00, 0/1 -> 0.00-0.79
    def episode(suite: str, outcome: str, host: bool, variant: str = "appearance", **more) -> dict:
        return {"variant": variant, "suite": suite, "outcome": outcome, "host_success": host, **more}

    values = {
        "episodes": [
            episode("libero_goal", "success", True, commit="abc1234"),
            episode("libero_goal", "missed_finish", True, commit="def5678"),
            episode("libero_10", "failure", False),
            episode("libero_goal", "failure", False, variant="oracle_segmentation"),
            episode("libero_object_swap", "success", True),  # LIBERO-PRO: counted apart, never in the protocol's
        ]
    }
    counts = readme_figures.derived("libero", values)
    assert counts["libero_goal_counts"] == "1/2 (0.09–0.91) / 2/2 (0.34–1.00)"
    assert counts["libero_10_counts"] == "0/1 (0.00–0.79) / 0/1 (0.00–0.79)"
    assert counts["libero_spatial_counts"] == "n/a / n/a" and counts["libero_spatial_episodes"] == 0
    assert counts["libero_counts"] == "1/3 (0.06–0.79) / 2/3 (0.21–0.94)" and counts["libero_episodes"] == 3
    assert counts["libero_pro_counts"] == "1/1 (0.21–1.00) / 1/1 (0.21–1.00)" and counts["libero_pro_episodes"] == 1
    assert counts["libero_pro_suites"] == "libero_object_swap 1/1"
    # each suite's row says which expert ran it; a file from before commits were recorded says so
    assert counts["libero_goal_commits"] == "abc1234 and def5678"
    assert counts["libero_10_commits"] == "an unrecorded commit" and counts["libero_spatial_commits"] == "no commit"

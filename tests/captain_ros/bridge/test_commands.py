import pytest

from captain_ros.cli import evaluation_cli


@pytest.mark.parametrize("flag", ["--requests", "--max-new-tokens"])
def test_a_negative_budget_is_refused_before_anything_starts(tmp_path, flag):
    with pytest.raises(SystemExit, match=f"{flag} must be 0 \\(the harness's\\) or more, got -3"):
        evaluation_cli.main(
            ["run", "--tasks", "put_red_cube_in_bowl", flag, "-3", "--runs-dir", str(tmp_path / "runs")]
        )
    assert not (tmp_path / "runs").exists()  # no run folder, no services

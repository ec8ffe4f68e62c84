"""captain_ros_training.serve: what a policy server process is started with."""

from __future__ import annotations

from captain_ros_training import serve


def test_a_local_folder_is_passed_absolute_and_a_hub_id_as_given(tmp_path, monkeypatch):
    (tmp_path / "runs" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert serve.model_argument("runs/model") == str(tmp_path / "runs" / "model")  # servers run in their log folder
    assert serve.model_argument("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"

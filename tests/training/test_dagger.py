"""DAgger labels: a student's states, where it left the real scripted expert's path, get the expert's next cell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from captain_ros.agent.expert import ScriptedExpert
from captain_ros.agent.expert_server import completion
from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeReader, EpisodeStore
from captain_ros_training import dagger
from captain_ros_training.gate import render_prompt_ids
from captain_ros_training.tiny import tiny_tokenizer

HEAD = [
    {"role": "system", "content": "You control a robot arm by writing Python."},
    {"role": "developer", "content": "# TASK.md\n\n## Instruction\nput the red cube in the bowl\n"},
    {"role": "user", "content": "put the red cube in the bowl"},
]
TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
BROKEN = "# step: survey goal=1 attempt=1\nprint(f'cube at {cube['position_m']:.2f}')\n"
COMPILE_ERROR = (
    "[error] (error)\n  File \"<cell 2>\", line 2\nSyntaxError: f-string: expecting '}'\n[budget] requests 2/16"
)


def call_message(t: int, code: str) -> dict:
    call = {
        "id": f"call_{t}",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": code})},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def expert_message(messages: list[dict]) -> dict:
    return completion(ScriptedExpert(), messages)["choices"][0]["message"]


def student_episode(split: str = "train") -> list[tuple[list[dict], dict]]:
    """(messages sent, the student's reply) per request: the expert's own first cell (the student agrees), then a
    survey that does not compile, sent again after its compile error, then a reply that is not a tool call."""
    first = expert_message(HEAD)
    seen = "result: in view: 1 red cube, 1 bowl\nstatus: ready\n[budget] requests 1/16"
    after_setup = [*HEAD, first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": seen}]
    broken = call_message(2, BROKEN)
    after_error = [*after_setup, broken, {"role": "tool", "tool_call_id": "call_2", "content": COMPILE_ERROR}]
    again = call_message(3, BROKEN)
    after_again = [*after_error, again, {"role": "tool", "tool_call_id": "call_3", "content": COMPILE_ERROR}]
    prose = {"role": "assistant", "content": "The cube is in the bowl, I think."}
    return [(HEAD, first), (after_setup, broken), (after_error, again), (after_again, prose)]


def write_store(path: Path, episodes: dict[str, str], *, invalid: str = "") -> None:
    """Episodes named -> split, each the `student_episode` requests; `invalid`: one ended invalid; "open-*" never
    ended (its host's time ran out)."""
    with EpisodeStore(path) as store:
        for eid, split in episodes.items():
            start = {"task": "put_red_cube_in_bowl", "family": "pick_place", "start_id": f"{eid}/s", "split": split,
                     "attempt": 0, "group_id": f"{eid}/g", "policy_version": 0, "policy": "student-sft-train",
                     "worker": "w0", "host": "test", "instruction": "put the red cube in the bowl"}  # fmt: skip
            store.append(Record(eid, "episode_start", 0, start))
            for t, (messages, reply) in enumerate(student_episode(split), start=1):
                response = {"content": reply.get("content"), "tool_calls": reply.get("tool_calls"),
                            "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}  # fmt: skip
                call = {"messages": messages, "tools": TOOLS, "response": response, "status": "ok",
                        "sampling": {"temperature": 1.0}, "prompt_token_ids": None, "token_ids": None, "logprobs": None,
                        "policy_version": 0, "timing": {}}  # fmt: skip
                store.append(Record(eid, "model_call", t, call))
            if not eid.startswith("open-"):
                end = {"outcome": "failure", "reward": 0.0, "valid": eid != invalid, "requests": 4, "actions": 0,
                       "host_success": False, "finished": False, "reason": "the requests budget is spent"}  # fmt: skip
                store.append(Record(eid, "episode_end", 0, end))


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_each_state_off_the_experts_path_is_labelled_with_the_experts_next_cell(tmp_path, tokenizer):
    write_store(tmp_path / "s.sqlite", {"ep": "train"})
    reader = EpisodeReader(tmp_path / "s.sqlite")
    stats = dagger.DaggerStats()
    examples = dagger.dagger_examples(tokenizer, reader, reader.load("ep"), expert=ScriptedExpert(), stats=stats)
    reader.close()
    requests = student_episode()
    assert [e.request for e in examples] == [2, 3, 4]  # the first request was the expert's own cell
    assert stats.agreed == 1 and stats.examples == 3 and all(e.source == "dagger" for e in examples)
    for example in examples:
        messages = requests[example.request - 1][0]
        label = expert_message(messages)
        prompt = render_prompt_ids(tokenizer, messages, TOOLS)
        assert example.input_ids[: example.prompt_len] == prompt  # the student's own request, as recorded
        assert not any(example.response_mask[: example.prompt_len]) and all(example.response_mask[example.prompt_len :])
        target = tokenizer.decode([t for t, m in zip(example.input_ids, example.response_mask, strict=True) if m])
        code = json.loads(label["tool_calls"][0]["function"]["arguments"])["code"]
        assert code.splitlines()[0] in target and "print(f'cube at" not in target
    # after the setup the expert surveys; after the compile error it says so and surveys again from scratch
    survey_after_error = json.loads(expert_message(requests[2][0])["tool_calls"][0]["function"]["arguments"])["code"]
    assert survey_after_error.startswith("# step: survey goal=1 attempt=2\n# The last cell failed (SyntaxError")


def test_at_most_per_episode_states_are_labelled_the_first_ones(tmp_path, tokenizer):
    write_store(tmp_path / "s.sqlite", {"ep": "train"})
    reader = EpisodeReader(tmp_path / "s.sqlite")
    stats = dagger.DaggerStats()
    examples = dagger.dagger_examples(
        tokenizer, reader, reader.load("ep"), expert=ScriptedExpert(), per_episode=2, stats=stats
    )
    reader.close()
    assert [e.request for e in examples] == [2, 3] and stats.capped == 1


def test_a_label_longer_than_the_token_limit_is_left_out(tmp_path, tokenizer):
    write_store(tmp_path / "s.sqlite", {"ep": "train"})
    reader = EpisodeReader(tmp_path / "s.sqlite")
    stats = dagger.DaggerStats()
    examples = dagger.dagger_examples(tokenizer, reader, reader.load("ep"), expert=ScriptedExpert(), max_tokens=50,
                                      stats=stats)  # fmt: skip
    reader.close()
    assert examples == [] and stats.too_long == 3


def test_held_out_episodes_are_never_labelled(tmp_path, tokenizer):
    write_store(tmp_path / "s.sqlite", {"ep": "eval"})
    reader = EpisodeReader(tmp_path / "s.sqlite")
    with pytest.raises(dagger.NotATrainingEpisode, match="split 'eval'"):
        dagger.dagger_examples(tokenizer, reader, reader.load("ep"), expert=ScriptedExpert())
    reader.close()


def test_a_store_gives_its_valid_and_cut_short_episodes_not_its_invalid_ones(tmp_path, tokenizer):
    write_store(tmp_path / "s.sqlite", {"a": "train", "open-b": "train", "c": "train"}, invalid="c")
    stats = dagger.DaggerStats()
    examples = dagger.store_dagger_examples(tokenizer, tmp_path / "s.sqlite", stats=stats)
    assert sorted({e.episode_id for e in examples}) == ["a", "open-b"] and len(examples) == 6
    assert stats.skipped_episodes == ["c (invalid)"] and "6 labelled" in str(stats)


def test_sft_data_adds_the_labelled_states_and_says_where_they_came_from(tmp_path):
    """`python -m captain_ros_training rl sft-data --dagger`: the expert store's examples plus the labels, refused for a
    held-out store."""
    from tests.training.test_data import build_store

    build_store(tmp_path / "expert.sqlite")
    write_store(tmp_path / "student.sqlite", {"ep": "train"})
    write_store(tmp_path / "held_out.sqlite", {"ep": "eval"})
    base = [
        sys.executable,
        "-m",
        "captain_ros_training",
        "rl",
        "sft-data",
        "--tiny",
        "--store",
        str(tmp_path / "expert.sqlite"),
    ]
    run = subprocess.run([*base, "--out", str(tmp_path / "d.pkl.xz"), "--dagger", str(tmp_path / "student.sqlite")],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "DAgger: 1 student episodes, 4 states; 3 labelled" in run.stderr
    from captain_ros_training.data import DataConfig, load_sft_data

    record = load_sft_data(
        tmp_path / "d.pkl.xz", tiny_tokenizer(), DataConfig(strict_success=True, max_trajectory_tokens=16384)
    )
    assert sum(e.source == "dagger" for e in record["examples"]) == record["stats"].dagger_examples == 3
    assert "DAgger labels of" in record["source"] and "3 DAgger examples" in str(record["stats"])
    held_out = ["--out", str(tmp_path / "e.pkl.xz"), "--dagger", str(tmp_path / "held_out.sqlite")]
    refused = subprocess.run([*base, *held_out], capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "only the student's episodes on training starts" in refused.stderr
    assert not (tmp_path / "e.pkl.xz").exists()
    missing = ["--out", str(tmp_path / "g.pkl.xz"), "--dagger", str(tmp_path / "nowhere.sqlite")]
    absent = subprocess.run([*base, *missing], capture_output=True, text=True, check=False)
    assert absent.returncode != 0 and "nowhere.sqlite: no such episode store" in absent.stderr
    assert not (tmp_path / "g.pkl.xz").exists()
    # on a GPU host that holds the data file but not the expert store: the file, then the labels
    more = ["sft-data", "--tiny", "--examples", str(tmp_path / "d.pkl.xz"), "--out", str(tmp_path / "f.pkl.xz")]
    added = subprocess.run([sys.executable, "-m", "captain_ros_training", "rl", *more,
                            "--dagger", str(tmp_path / "student.sqlite")],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert added.returncode == 0, added.stderr
    again = load_sft_data(
        tmp_path / "f.pkl.xz", tiny_tokenizer(), DataConfig(strict_success=True, max_trajectory_tokens=16384)
    )
    assert len(again["examples"]) == len(record["examples"]) + 3
    assert [e.input_ids for e in again["examples"][: len(record["examples"])]] == [
        e.input_ids for e in record["examples"]
    ]


def test_a_data_file_written_under_the_trainers_old_package_name_still_loads(tmp_path, monkeypatch):
    """Files of `sft-data` written before the package was renamed (`training` -> `captain_ros_training`) pickle their
    classes under the old name; they load as they are (the GPU host's carried data is such a file)."""
    import lzma
    import pickle

    import captain_ros_training
    from captain_ros_training import data
    from captain_ros_training.data import DataConfig, Example, TrajectoryStats, load_sft_data, tokenizer_fingerprint

    tokenizer = tiny_tokenizer()
    config = DataConfig()
    example = Example(input_ids=[1, 2, 3], response_mask=[False, True, True], weight=1.0, prompt_len=1)
    record = {"format": data.SFT_DATA_FORMAT, "tokenizer": tokenizer_fingerprint(tokenizer), "config": repr(config),
              "source": "old", "gate": "", "stats": TrajectoryStats(episodes=1), "examples": [example]}  # fmt: skip
    monkeypatch.setitem(sys.modules, "training", captain_ros_training)
    monkeypatch.setitem(sys.modules, "training.data", data)
    for cls in (Example, TrajectoryStats):
        monkeypatch.setattr(cls, "__module__", "training.data")
    with lzma.open(tmp_path / "old.pkl.xz", "wb") as f:
        pickle.dump(record, f)
    monkeypatch.undo()
    with lzma.open(tmp_path / "old.pkl.xz") as f:
        raw = f.read()
    assert b"training.data" in raw and b"captain_ros_training" not in raw  # the old name only
    loaded = load_sft_data(tmp_path / "old.pkl.xz", tokenizer, config)
    assert loaded["examples"][0].input_ids == [1, 2, 3] and isinstance(loaded["examples"][0], Example)
    assert loaded["stats"].episodes == 1

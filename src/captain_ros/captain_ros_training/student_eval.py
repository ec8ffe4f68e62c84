"""A model folder evaluated as the stack's policy on held-out twin starts, and what its episodes say about it.

`evaluate` serves the folder with vLLM (`.venv-vllm`: the CPU build here, any vLLM on a GPU host) or, where there is
no vLLM, with captain_ros_training.hf_serve (its slot engine on the GPU; `EvalPlan.server`), puts the recording
proxy in front (every request's prompt ids, sampled ids and logprobs are recorded) and runs the plan's episodes
through the same agent loop, sandbox and harness a deployment uses (captain_ros.bridge.host). It resumes: episodes
of the plan already complete and valid in `out` are not run again, so a long evaluation can be stopped and
continued; an infrastructure failure (a dead server, say) is left out of every rate and run again next time.

`summarize` reads the stores back: strict and host success with Wilson 95% intervals, overall and per family;
what the model did with the harness (tool-call parse rate, fenced blocks, cells that raise, the API misuse seen:
robot-call failure categories and the error types of raising cells); requests and output tokens per episode; and
the prompt gate over every recorded request (the served prompt ids equal the trainer's rendering of the recorded
messages with the folder's tokenizer). `compare` pairs two evaluations on their common starts (exact McNemar).

The plan (EvalPlan) is the same for every model compared: the twin's held-out (`eval` split) start states, 5 per
task over all 13 tasks (65 episodes, four families), one attempt each, text only (the student reads no images), at
most `requests_budget` requests of at most `max_new_tokens` tokens each, with the harness's sampling temperature.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from captain_ros.bridge.evaluation import EvalRow, load_rows, mcnemar_exact, summarize, wilson

RUN_FILE = "run.json"  # each run folder: its plan, model, label and where it generated, written at its start
VLLM_START_LIMIT_S = 1800.0  # a 0.5B model starts in about 2 minutes on 2 idle cores; a loaded host is slower


@dataclass(frozen=True)
class EvalPlan:
    """Which held-out episodes, and the budgets every evaluated model gets."""

    tasks: str = "all"  # 'all' or comma-separated twin task names
    split: str = "eval"  # the twin's start-state split: eval (held out) | train (a student's own rollouts on the
    # starts it trains on, for DAgger labels: captain_ros_training.dagger; never an evaluation)
    starts_per_task: int = 5  # held-out start states per task (13 tasks: 65 episodes)
    attempts: int = 1
    seed: int = 0  # of the start-state draw: the same starts for every model
    requests_budget: int = 16  # requests per episode (the expert needs 8.5 on average)
    max_new_tokens: int = 4096  # sampled tokens per request (the expert's longest cell is 3.3k tokens)
    context_limit_tokens: int = 32768  # the student's context; the agent compacts history before it
    workers: int = 4  # episodes at once (the server batches their requests)
    kv_cache_gib: int = 2  # vLLM CPU KV cache
    server: str = "vllm"  # vllm (.venv-vllm) | transformers (captain_ros_training.hf_serve: a GPU host without vLLM)
    cuda_graphs: bool = False  # transformers on CUDA: decode from CUDA graphs (speed only; hf_serve --cuda-graphs)
    # transformers on CUDA: the share of the GPU's free memory its KV cache may take (hf_serve
    # --kv-cache-memory-fraction); two servers started together on one GPU each see it all free, so give each less
    kv_cache_memory_fraction: float = 0.8

    def __post_init__(self) -> None:
        if self.server not in ("vllm", "transformers"):
            raise ValueError(f"unknown server {self.server!r}: vllm or transformers")
        if self.split not in ("eval", "train"):
            raise ValueError(f"unknown split {self.split!r}: eval or train")
        if self.starts_per_task < 1:
            raise ValueError(f"starts_per_task must be at least 1, got {self.starts_per_task}")
        if not 0.0 < self.kv_cache_memory_fraction <= 1.0:
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 1], got {self.kv_cache_memory_fraction}")


def plan_jobs(plan: EvalPlan) -> list[Any]:
    """The plan's episodes: start states of the plan's split (held out by default) drawn with the plan's seed, the
    same for every model."""
    from captain_ros.bridge.rollout import plan_groups
    from captain_ros.twin.tasks import default_suite

    suite = default_suite()
    tasks = list(suite) if plan.tasks == "all" else [t.strip() for t in plan.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in suite]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(suite)}")
    return plan_groups(tasks, plan.starts_per_task, plan.attempts, plan.split, plan.seed)


def stores(out: Path) -> list[Path]:
    """Every episode store of an evaluation folder (one per resumed run), oldest first."""
    return sorted(Path(out).glob("*/rollout.sqlite"))


def rows_of(out: Path) -> list[EvalRow]:
    """One row per (task, start, attempt): the first valid episode of it in the folder's stores, else its last."""
    chosen: dict[tuple, EvalRow] = {}
    for store in stores(out):
        for row in load_rows(store):
            if row.key not in chosen or (row.valid and not chosen[row.key].valid):
                chosen[row.key] = row
    return list(chosen.values())


def with_unfinished(rows: Sequence[EvalRow], plan_rows: Sequence[EvalRow]) -> list[EvalRow]:
    """`rows` and, for each episode of the plan they lack (`plan_rows`: an evaluation of the whole plan, whose keys
    and families are used), a failed row: the episodes a GPU host's time left unfinished counted as failures, so a
    rate over them is a lower bound on the rate over the whole plan (a rate over the episodes that ended first leans
    up: the ones still running are the longest, and most of those end on the budget)."""
    have = {r.key for r in rows if r.valid}
    failed = {"policy": rows[0].policy if rows else "unfinished", "outcome": "failure", "host_success": False,
              "strict_success": False, "finished": False, "requests": 0, "actions": 0, "wall_time_s": None,
              "valid": True, "episode_id": "", "invalid_reason": ""}  # fmt: skip
    missing = [dataclasses.replace(r, **failed) for r in plan_rows if r.valid and r.key not in have]
    return list(rows) + missing


def evaluate(model: Path, label: str, out: Path, plan: EvalPlan = EvalPlan(), progress: bool = True) -> Path:
    """Run the plan's episodes that `out` does not hold yet (complete and valid); returns `out`."""
    from captain_ros.bridge.host import HostOptions, RolloutHost, write_summary
    from captain_ros_training import serve
    from captain_ros_training.student import check_model_folder

    out = Path(out)
    done = {r.key for r in rows_of(out) if r.valid}
    todo = [j for j in plan_jobs(plan) if (j.task, j.start_id, j.attempt) not in done]
    if not todo:
        print(f"[eval] {out}: every episode of the plan is there")
        return out
    check_model_folder(model)
    run_dir = out / time.strftime("%Y%m%d-%H%M%S")
    print(f"[eval] {label}: {len(todo)} episodes to run ({len(done)} already done) -> {run_dir}", flush=True)
    where = {"host": platform.node(), "gpu": _gpu_name() if plan.server == "transformers" else None}
    meta = {"plan": asdict(plan), "model": str(model), "label": label, "generation": where}
    run_dir.mkdir(parents=True, exist_ok=True)  # what ran where, kept even if the run never ends (a lost host)
    (run_dir / RUN_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if plan.server == "transformers":
        from captain_ros_training.hf_serve import start_hf_server

        server = start_hf_server(
            model, run_dir / "logs" / "server.log", max_model_len=plan.context_limit_tokens,
            extra_args=(
                *(("--cuda-graphs",) if plan.cuda_graphs else ()),
                "--kv-cache-memory-fraction", str(plan.kv_cache_memory_fraction),
            ),
        )  # fmt: skip
    else:
        server = serve.start_server(
            model,
            run_dir / "logs" / "vllm.log",
            max_model_len=plan.context_limit_tokens,
            kv_cache_gib=plan.kv_cache_gib,
        )
    try:
        healthy = server.wait_healthy(VLLM_START_LIMIT_S)
        print(f"[eval] {plan.server} serving {model} (healthy after {healthy:.0f} s)", flush=True)
        options = HostOptions(
            run_dir,
            workers=plan.workers,
            policy_url=server.base_url,
            policy=label,
            ship=False,
            progress=progress,
            send_images=False,
            max_new_tokens=plan.max_new_tokens,
            requests_budget=plan.requests_budget,
            context_limit_tokens=plan.context_limit_tokens,
        )
        with RolloutHost(options) as host:
            report = host.run(todo)
        write_summary(run_dir / "summary.json", report, meta)
    finally:
        server.stop()
    return out


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def generation_of(out: Path) -> list[dict[str, Any]]:
    """Where each run of an evaluation folder generated (server, host, GPU), from its run.json (written when the run
    starts), else its summary.json (runs before run.json), else unknown; and how many valid episodes it ended."""
    runs = []
    for store in stores(out):
        data = {}
        for name in (RUN_FILE, "summary.json"):
            if (store.parent / name).is_file():
                data = json.loads((store.parent / name).read_text())
                break
        plan = data.get("plan") or {}
        server = plan.get("server", "vllm" if data else None)  # files from before the server was recorded: vLLM
        ended = sum(r.valid for r in load_rows(store))
        runs.append({"run": store.parent.name, "server": server, "episodes": ended, **(data.get("generation") or {})})
    return runs


# ------------------------------------------------------------------------------------------------ behaviour
def behaviour(episodes: Iterable[Any]) -> dict[str, Any]:
    """What a model did with the harness over valid episodes (EpisodeReader episodes)."""
    from captain_ros.agent.policy_client import unread_tool_call
    from captain_ros_training.credit import well_formed_python_call

    requests = tool_calls = parsed = unread = fenced = neither = cells = raised = 0
    output_tokens: list[int] = []
    per_episode_requests: list[int] = []
    misuse: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for episode in episodes:
        tokens = 0
        per_episode_requests.append(len(episode.requests))
        for req in episode.requests:
            call = req.model_call or {}
            response = call.get("response") or {}
            tokens += len(call.get("token_ids") or [])
            requests += 1
            calls = response.get("tool_calls") or []
            step_cells = (req.step or {}).get("cells") or []
            if calls:
                tool_calls += 1
                parsed += all(well_formed_python_call(c) for c in calls)
            elif unread_tool_call(response.get("content") or "", response.get("finish_reason") or ""):
                unread += 1  # a <tool_call> block the server could not read
            elif any(c.get("source") == "fenced" for c in step_cells):
                fenced += 1
            else:
                neither += 1
            for cell in step_cells:
                cells += 1
                if cell.get("status") not in ("ok", "not_run"):
                    raised += 1
                    errors[str(cell.get("error", "")).split(":", 1)[0] or cell.get("status")] += 1
            for robot_call in (req.step or {}).get("calls") or []:
                if robot_call.get("failure_category"):
                    misuse[f"{robot_call.get('capability')}: {robot_call['failure_category']}"] += 1
        output_tokens.append(tokens)
    n = len(per_episode_requests)
    return {
        "episodes": n,
        "requests": requests,
        "requests_per_episode": requests / n if n else None,
        "output_tokens_per_episode": sum(output_tokens) / n if n else None,
        # of the replies that tried a tool call, those the server read as well-formed python calls
        "tool_call_parse_rate": parsed / (tool_calls + unread) if tool_calls + unread else None,
        "replies_with_tool_call": tool_calls,
        "replies_with_unread_tool_call": unread,
        "replies_with_fenced_block_only": fenced,
        "replies_with_neither": neither,
        "cells": cells,
        "cells_raised": raised,
        "cell_raise_rate": raised / cells if cells else None,
        "cell_error_types": dict(errors.most_common(10)),
        "robot_call_failures": dict(misuse.most_common(15)),
    }


def gate_report(out: Path, tokenizer: Any) -> dict[str, Any]:
    """The prompt gate over every recorded request of the folder's valid episodes."""
    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.gate import gate_episodes

    passed = failed = not_gateable = 0
    examples: list[str] = []
    for store in stores(out):
        reader = EpisodeReader(store)
        try:
            report = gate_episodes(tokenizer, reader)
        finally:
            reader.close()
        passed, failed, not_gateable = (
            passed + report.passed,
            failed + report.failed,
            not_gateable + report.not_gateable,
        )
        examples += [str(m) for m in report.mismatches[:3]]
    checked = passed + failed
    return {
        "requests_checked": checked,
        "pass_rate": passed / checked if checked else None,
        "failed": failed,
        "not_gateable": not_gateable,
        "examples": examples[:5],
    }


def summary(out: Path, tokenizer: Any | None = None) -> dict[str, Any]:
    """Success (overall, by family, Wilson 95%), behaviour and, given the tokenizer, the prompt gate."""
    from captain_ros.bridge.store import EpisodeReader

    rows = rows_of(out)
    chosen = {r.episode_id for r in rows}
    episodes = []
    for store in stores(out):
        reader = EpisodeReader(store)
        try:
            episodes += [reader.load(e) for e in reader.episode_ids() if e in chosen]
        finally:
            reader.close()
    result = {"success": summarize(rows), "behaviour": behaviour(episodes)}
    if tokenizer is not None:
        result["prompt_gate"] = gate_report(out, tokenizer)
    return result


def compare(a: Sequence[EvalRow], b: Sequence[EvalRow], metric: str = "strict") -> dict[str, Any]:
    """Paired comparison on the (task, start, attempt) keys both ran validly: exact McNemar on the discordant pairs."""
    first = {r.key: r for r in a if r.valid}
    pairs = [(first[r.key], r) for r in b if r.valid and r.key in first]
    won = [getattr(x, f"{metric}_success") for x, _ in pairs], [getattr(y, f"{metric}_success") for _, y in pairs]
    only_a = sum(x and not y for x, y in zip(*won, strict=True))
    only_b = sum(y and not x for x, y in zip(*won, strict=True))
    n = len(pairs)
    return {
        "pairs": n,
        "a_rate": sum(won[0]) / n if n else None,
        "b_rate": sum(won[1]) / n if n else None,
        "a_only": only_a,
        "b_only": only_b,
        "mcnemar_p": mcnemar_exact(only_a, only_b),
        "a_ci95": wilson(sum(won[0]), n),
        "b_ci95": wilson(sum(won[1]), n),
    }


def finish_rates(rows: Sequence[EvalRow]) -> dict[str, float | None]:
    """False finishes (finish() on a failed scene) and missed finishes (solved, never finished) as shares of the
    valid episodes (CaPtain §4.1 reports both before and after RL)."""
    valid = [r for r in rows if r.valid]
    n = len(valid)
    return {
        "false_finish_rate": sum(r.outcome == "false_finish" for r in valid) / n if n else None,
        "missed_finish_rate": sum(r.outcome == "missed_finish" for r in valid) / n if n else None,
    }


def rl_run_records(rl_dir: Path) -> dict[str, Any] | None:
    """The RL run's own account (captain_ros_training.rl_host's `rl_rounds.jsonl`, the driver's per-round rows, in
    the run folder or a carried checkpoint): rounds, trained episodes, the rounds' seconds on the run's one GPU (the
    policy server and the trainer share it: waiting for rollouts, the update, the weight sync; the critic's warm
    start before round 1 not included) and those per trained episode. None when no such file is there. The most
    advanced file wins (a carried checkpoint holds copies of the logs up to its round)."""
    best: list[dict[str, Any]] = []
    for path in sorted(Path(rl_dir).rglob("rl_rounds.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows and (not best or rows[-1].get("round", 0) > best[-1].get("round", 0)):
            best = rows
    if not best:
        return None
    episodes = sum(int(r.get("episodes") or 0) for r in best)
    seconds = sum(
        float(r.get("wait_s") or 0) + float(r.get("update_s") or 0) + float(r.get("sync_s") or 0) for r in best
    )
    return {
        "rl_rounds": int(best[-1]["round"]),
        "rl_episodes": episodes,
        "rl_gpu_seconds": seconds,
        "rl_gpu_seconds_per_episode": seconds / episodes if episodes else None,
        "rl_early_stopped": sum(int(r.get("early_stopped") or 0) for r in best)
        if any("early_stopped" in r for r in best)
        else None,
    }


RL_KEYS = (
    "student_rl_strict",
    "student_rl_host",
    "rl_rounds",
    "rl_episodes",
    "rl_vs_sft_mcnemar_p",
    "rl_paired_starts",
    "rl_gpu_seconds",
    "rl_gpu_seconds_per_episode",
    "rl_early_stopped",
    "sft_false_finish_rate",
    "sft_missed_finish_rate",
    "rl_false_finish_rate",
    "rl_missed_finish_rate",
)


def rl_report(sft_rows: Sequence[EvalRow] | None, rl_rows: Sequence[EvalRow] | None, rl_dir: Path) -> dict[str, Any]:
    """The RL student against the SFT student on the same held-out starts (bench/student.py's RL keys): strict and
    host success of the RL evaluation, the exact McNemar p on the (task, start, attempt) pairs both ran validly, the
    false- and missed-finish rates before (SFT) and after (RL), and the RL run's rounds, trained episodes and GPU
    seconds (`rl_run_records`). Where a part is missing every key it feeds is None and `rl_missing` says why: no
    value is made up. `rl_rows` should already hold the plan's unfinished episodes as failures (`with_unfinished`)."""
    out: dict[str, Any] = dict.fromkeys(RL_KEYS)
    missing = []
    if not rl_rows or not any(r.valid for r in rl_rows):
        missing.append(
            "no evaluation of an RL student (runs/student/rl_eval/): bring an RL checkpoint back, export and merge it "
            "into runs/student/rl/model (docs/student.md section 6), then run bench/student.py"
        )
    else:
        valid = [r for r in rl_rows if r.valid]
        out["student_rl_strict"] = sum(r.strict_success for r in valid) / len(valid)
        out["student_rl_host"] = sum(r.host_success for r in valid) / len(valid)
        after = finish_rates(rl_rows)
        out["rl_false_finish_rate"], out["rl_missed_finish_rate"] = (
            after["false_finish_rate"],
            after["missed_finish_rate"],
        )
        if not sft_rows or not any(r.valid for r in sft_rows):
            missing.append("no SFT evaluation to pair the RL student with (runs/student/sft_eval/)")
        else:
            pair = compare(sft_rows, rl_rows, "strict")
            out["rl_vs_sft_mcnemar_p"] = pair["mcnemar_p"] if pair["pairs"] else None
            out["rl_paired_starts"] = pair["pairs"]
    if sft_rows and any(r.valid for r in sft_rows):
        before = finish_rates(sft_rows)
        out["sft_false_finish_rate"], out["sft_missed_finish_rate"] = (
            before["false_finish_rate"],
            before["missed_finish_rate"],
        )
    run = rl_run_records(rl_dir)
    if run is None:
        missing.append(f"no RL run records (rl_rounds.jsonl) under {rl_dir}: rounds, episodes and GPU seconds unknown")
    else:
        out.update(run)
    out["rl_missing"] = "; ".join(missing) or None
    return out


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `python -m captain_ros_training student-eval`")

"""The real student (Qwen2.5-Coder-0.5B-Instruct) on held-out twin starts: zero-shot, then after SFT on the expert.

  .venv/bin/python bench/student.py                 # run what is missing and can run here, then report
  .venv/bin/python bench/student.py --report-only   # report on what is there

Stages, each resumable and skipped when its output is complete (captain_ros_training.student_eval):
  zero-shot  the student `make setup` built, served by vLLM's CPU build (.venv-vllm), drives the 65 held-out
             episodes of captain_ros_training.student_eval.EvalPlan (13 tasks, 4 families) through the stack's loop,
             sandbox, harness and recorder (runs/student/zero_shot/); about 30 minutes on 2 cores
  sft        the fine-tuned folder runs/student/sft/model, made on a GPU host by `python -m captain_ros_training rl sft`
             (docs/gpu_host_without_network.md) and brought back as a LoRA adapter merged here
             (`python -m captain_ros_training student merge`); its run record runs/student/sft/sft_run.json says where
             it ran and at what speed. Not made here: without it the SFT figures are reported missing, with the command.
  sft-eval   the fine-tuned student on the same episodes (runs/student/sft_eval/); about an hour on 2 cores
  rl-eval    the RL student runs/student/rl/model (an rl_host checkpoint exported and merged into the SFT student,
             docs/student.md section 6) on the same episodes (runs/student/rl_eval/); not made here without it

Writes bench/results/student.json (student_zero_shot_strict, student_sft_strict, student_sft_host, student_episodes,
95% intervals, sft_vs_zero_shot_mcnemar_p on the paired starts, prompt_gate_pass_rate over every recorded request,
requests and output tokens per episode, SFT tokens/s and where SFT ran) and bench/results/student.png (success by
family, zero-shot vs SFT, Wilson 95% bars). With an RL student's evaluation: student_rl_strict, student_rl_host,
rl_vs_sft_mcnemar_p (exact, on the starts both ran), false- and missed-finish rates before (sft_*) and after (rl_*),
and from the RL run's records under runs/student/rl/ (rl_rounds.jsonl) rl_rounds, rl_episodes and
rl_gpu_seconds_per_episode; without them those keys are null and rl_missing says why
(captain_ros_training.student_eval.rl_report). The headline rates are the twin's host and strict success on held-out
starts the student never trained on; nothing in the student's path reads simulator state.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "student"
KEPT = ROOT / "models" / "qwen2.5-coder-0.5b-captain-sft"  # the fine-tuned student kept in the repository
TARGET_SFT_STRICT = 0.5  # CaPtain-4B: 0% -> 55.4% with SFT on LIBERO


def _rate(summary: dict, metric: str) -> tuple[float | None, list]:
    r = summary["success"]["overall"]["rates"][metric]
    return r["rate"], [r["ci_low"], r["ci_high"]]


def _k(family: dict, metric: str) -> str:
    r = family["rates"][metric]
    return f"{r['k']}/{r['n']}"


def _sft_record(sft_dir: Path) -> dict:
    """The SFT's run record: the one beside a fine-tuned folder made here, else the kept student's."""
    for path in (sft_dir / "sft_run.json", KEPT / "sft_run.json"):
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def _where(runs: list[dict]) -> str:
    """Where an evaluation's runs generated, in words, with the episodes each ended: "vLLM on CPU (65 episodes)",
    "captain_ros_training.hf_serve on NVIDIA H100 80GB HBM3 (64 episodes) and vLLM on CPU (1 episode)"."""
    names = {"vllm": "vLLM", "transformers": "captain_ros_training.hf_serve", None: "an unrecorded server"}
    ended: dict[str, int] = {}
    for r in runs:
        if not r.get("episodes"):  # a run stopped before it ended an episode generated none of the results
            continue
        where = f"{names.get(r['server'], r['server'])} on {r.get('gpu') or 'CPU'}"
        ended[where] = ended.get(where, 0) + r.get("episodes", 0)
    return " and ".join(f"{w} ({n} episode{'s' * (n != 1)})" for w, n in sorted(ended.items(), key=lambda x: -x[1]))


def _rl_metrics(evals: dict, summaries: dict, rl_dir: Path) -> dict:
    """The RL keys (captain_ros_training.student_eval.rl_report) and `rl_summary`, the README's words for them. The
    plan's episodes the RL evaluation has not ended count as failures in its rates (with_unfinished), as for SFT."""
    from captain_ros.bridge.evaluation import summarize
    from captain_ros_training import student_eval as ev

    if "rl" in evals and {r.key for r in evals["zero_shot"] if r.valid} - {r.key for r in evals["rl"] if r.valid}:
        evals["rl"] = ev.with_unfinished(evals["rl"], evals["zero_shot"])
        summaries["rl"]["success"] = summarize(evals["rl"])
    rl = ev.rl_report(evals.get("sft"), evals.get("rl"), rl_dir)
    if rl["student_rl_strict"] is None:
        rl["rl_summary"] = "the RL figures are not measured yet: " + rl["rl_missing"]
    else:
        parts = [f"after RL {rl['student_rl_strict']:.1%} strict, {rl['student_rl_host']:.1%} host"]
        if rl["rl_vs_sft_mcnemar_p"] is not None:
            parts.append(
                f"exact McNemar p = {rl['rl_vs_sft_mcnemar_p']:.2g} against SFT on {rl['rl_paired_starts']} paired "
                "starts"
            )
        if rl["sft_false_finish_rate"] is not None:
            parts.append(
                f"false finishes {rl['sft_false_finish_rate']:.1%} -> {rl['rl_false_finish_rate']:.1%}, missed "
                f"finishes {rl['sft_missed_finish_rate']:.1%} -> {rl['rl_missed_finish_rate']:.1%}"
            )
        if rl["rl_gpu_seconds_per_episode"] is not None:
            parts.append(
                f"{rl['rl_rounds']} rounds, {rl['rl_episodes']} trained episodes, "
                f"{rl['rl_gpu_seconds_per_episode']:.1f} GPU-seconds per episode"
            )
        rl["rl_summary"] = "; ".join(parts)
    if rl["rl_missing"]:
        print(f"RL student: {rl['rl_missing']}", file=sys.stderr)
    return rl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=RUNS, help="where the evaluations and the SFT model live")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report on what is there")
    args = parser.parse_args(argv)

    from captain_ros_training import student_eval as ev
    from captain_ros_training.student import check_model_folder, default_folder

    plan = ev.EvalPlan()
    base = default_folder()
    sft_dir = args.runs / "sft"
    sft_model = sft_dir / "model"
    rl_model = args.runs / "rl" / "model"
    folders = {
        "zero_shot": (base, args.runs / "zero_shot"),
        "sft": (sft_model, args.runs / "sft_eval"),
        "rl": (rl_model, args.runs / "rl_eval"),
    }
    if not args.report_only:
        ev.evaluate(base, "student-zero-shot", folders["zero_shot"][1], plan)
        for name in ("sft", "rl"):  # the fine-tuned students there are
            model, out = folders[name]
            if (model / "config.json").is_file():
                ev.evaluate(model, f"student-{name}", out, plan)
    tokenizer = check_model_folder(base)  # the fine-tuned folder carries the same tokenizer and template
    summaries = {
        name: ev.summary(out, tokenizer) for name, (_, out) in folders.items() if ev.stores(out) and ev.rows_of(out)
    }
    if "zero_shot" not in summaries:
        print("no zero-shot evaluation yet: run without --report-only", file=sys.stderr)
        return 1
    from captain_ros.bridge.evaluation import summarize

    evals = {name: ev.rows_of(out) for name, (_, out) in folders.items() if name in summaries}
    finished = None  # the SFT evaluation's success over the episodes that ended, when some did not
    if "sft" in evals and {r.key for r in evals["zero_shot"] if r.valid} - {r.key for r in evals["sft"] if r.valid}:
        finished = summaries["sft"]["success"]
        evals["sft"] = ev.with_unfinished(evals["sft"], evals["zero_shot"])
        summaries["sft"]["success"] = summarize(evals["sft"])  # behaviour and the gate stay over what ran
    zs = summaries["zero_shot"]
    sft = summaries.get("sft")
    record = _sft_record(sft_dir)
    metrics: dict = {
        "student_zero_shot_strict": _rate(zs, "strict")[0],
        "student_zero_shot_strict_ci95": _rate(zs, "strict")[1],
        "student_zero_shot_host": _rate(zs, "host")[0],
        "student_zero_shot_host_ci95": _rate(zs, "host")[1],
        "student_sft_strict": _rate(sft, "strict")[0] if sft else None,
        "student_sft_strict_ci95": _rate(sft, "strict")[1] if sft else None,
        "student_sft_host": _rate(sft, "host")[0] if sft else None,
        "student_sft_host_ci95": _rate(sft, "host")[1] if sft else None,
        "student_episodes": zs["success"]["overall"]["valid"],
        # episodes the SFT evaluation ended, and those of the plan it has not (a GPU host's time ran out): the
        # latter count as failures in student_sft_strict / _host (a lower bound; with_unfinished)
        "student_sft_episodes": (finished or (sft or {}).get("success") or {}).get("overall", {}).get("valid"),
        "student_sft_unfinished": sum(not r.episode_id for r in evals["sft"]) if sft else None,
        # over the episodes that ended (leans up when some did not), and the upper bound (unfinished ones successes)
        "student_sft_strict_finished": _rate({"success": finished}, "strict")[0] if finished else None,
        "student_sft_host_finished": _rate({"success": finished}, "host")[0] if finished else None,
        "student_sft_strict_upper": (
            (finished["overall"]["rates"]["strict"]["k"] + sum(not r.episode_id for r in evals["sft"]))
            / sft["success"]["overall"]["valid"]
            if finished
            else None
        ),
        "sft_tokens_per_s": record.get("tokens_per_s"),
        "sft_ran_on": record.get("machine"),
    }
    metrics["sft_unfinished_note"] = (  # the README's words for a lower bound
        f"; {metrics['student_sft_unfinished']} episodes the GPU host's time left unfinished count as failures "
        f"(over the {metrics['student_sft_episodes']} that ended: {metrics['student_sft_strict_finished']:.1%} / "
        f"{metrics['student_sft_host_finished']:.1%})"
        if finished
        else ""
    )
    gates = [s["prompt_gate"] for s in summaries.values()]
    checked = sum(g["requests_checked"] for g in gates)
    passed = sum(round(g["pass_rate"] * g["requests_checked"]) for g in gates if g["pass_rate"] is not None)
    metrics["prompt_gate_pass_rate"] = passed / checked if checked else None
    metrics["prompt_gate_requests"] = checked
    for name, s in summaries.items():
        b = s["behaviour"]
        metrics[f"{name}_requests_per_episode"] = b["requests_per_episode"]
        metrics[f"{name}_output_tokens_per_episode"] = b["output_tokens_per_episode"]
        metrics[f"{name}_tool_call_parse_rate"] = b["tool_call_parse_rate"]
        metrics[f"{name}_cell_raise_rate"] = b["cell_raise_rate"]
        metrics[f"{name}_tool_calls"] = b["replies_with_tool_call"]
        metrics[f"{name}_unread_tool_calls"] = b.get("replies_with_unread_tool_call", 0)
        metrics[f"{name}_fenced_replies"] = b["replies_with_fenced_block_only"]
        metrics[f"{name}_replies"] = b["requests"]
        metrics[f"{name}_cell_errors"] = ", ".join(f"{k} {v}" for k, v in b["cell_error_types"].items()) or "none"
    families = zs["success"]["by_family"]
    metrics["strict_by_family"] = "; ".join(
        f"{fam.replace('_', ' ')} {_k(families[fam], 'strict')}"
        + (f" -> {_k(sft['success']['by_family'][fam], 'strict')}" if sft else "")
        for fam in sorted(families)
    )  # zero-shot -> SFT, strict successes over valid episodes per family
    metrics["generation_zero_shot"] = _where(ev.generation_of(folders["zero_shot"][1]))
    metrics["generation_sft"] = _where(ev.generation_of(folders["sft"][1])) if sft else None
    if sft:
        pair = ev.compare(evals["zero_shot"], evals["sft"], "strict")
        metrics["sft_vs_zero_shot_mcnemar_p"] = pair["mcnemar_p"]
        metrics["paired_starts"] = pair["pairs"]
    else:
        metrics["sft_vs_zero_shot_mcnemar_p"] = None
    unfinished = metrics["student_sft_unfinished"]
    if sft:
        partial = (
            f"{unfinished} of {len(evals['sft'])} episodes unfinished, counted as failures (a lower bound: over the "
            f"{metrics['student_sft_episodes']} that ended {metrics['student_sft_strict_finished']:.1%} strict, "
            f"{metrics['student_sft_host_finished']:.1%} host; at most {metrics['student_sft_strict_upper']:.1%} "
            "strict if every unfinished one succeeded); "
            if unfinished
            else ""
        )
        metrics["sft_summary"] = partial + (
            f"after SFT {metrics['student_sft_strict']:.1%} strict (95% CI {metrics['student_sft_strict_ci95'][0]:.1%}"
            f"-{metrics['student_sft_strict_ci95'][1]:.1%}), {metrics['student_sft_host']:.1%} host on the same "
            f"{metrics['paired_starts']} paired starts (exact McNemar p = "
            f"{metrics['sft_vs_zero_shot_mcnemar_p']:.2g}); of its {metrics['sft_replies']} replies "
            f"{metrics['sft_tool_calls']} were tool calls and {metrics['sft_unread_tool_calls']} held a <tool_call> "
            f"block that was not JSON; evaluated with {_where(ev.generation_of(folders['sft'][1]))}; the SFT ran at "
            f"{metrics['sft_tokens_per_s'] or float('nan'):,.0f} tokens/s on "
            f"{(record.get('machine') or {}).get('gpu') or 'an unknown machine'}"
        )
    else:
        metrics["sft_summary"] = (
            "the SFT figures are not measured yet: no fine-tuned student has come back from a GPU host"
        )
    metrics.update(_rl_metrics(evals, summaries, args.runs / "rl"))
    missing = None
    if not sft:
        missing = (
            f"no fine-tuned student at {sft_model}: train it on a GPU host (docs/gpu_host_without_network.md), "
            "bring back the adapter and `python -m captain_ros_training student merge`, then run this again"
        )
        print(missing, file=sys.stderr)

    rows = []
    for name, s in summaries.items():
        o, b = s["success"]["overall"], s["behaviour"]
        rows.append(
            [
                name,
                f"{o['valid']} ({unfinished} unfinished: failed)" if name == "sft" and unfinished else o["valid"],
                f"{o['rates']['strict']['rate']:.1%}",
                f"{o['rates']['host']['rate']:.1%}",
                f"{b['requests_per_episode']:.1f}",
                f"{b['output_tokens_per_episode']:.0f}",
                "-" if b["tool_call_parse_rate"] is None else f"{b['tool_call_parse_rate']:.0%}",
                "-" if b["cell_raise_rate"] is None else f"{b['cell_raise_rate']:.0%}",
                f"{s['prompt_gate']['pass_rate']:.0%}" if s["prompt_gate"]["pass_rate"] is not None else "-",
            ]
        )
    print_table(
        f"Student on {plan.starts_per_task} held-out starts x 13 tasks (target SFT strict >= {TARGET_SFT_STRICT:.0%})",
        [
            "policy",
            "episodes",
            "strict",
            "host",
            "requests/ep",
            "out tokens/ep",
            "tool-call parse",
            "cells raise",
            "gate",
        ],
        rows,
    )
    from captain_ros.bridge.evaluation import plot_success

    plot = plot_success({name: s["success"] for name, s in summaries.items()}, RESULTS / "student.png")
    write_results(
        "student",
        metrics,
        {
            "plan": asdict(plan),
            "by_family": {n: s["success"]["by_family"] for n, s in summaries.items()},
            "behaviour": {n: s["behaviour"] for n, s in summaries.items()},
            "prompt_gate": {n: s["prompt_gate"] for n, s in summaries.items()},
            "episodes": {  # every evaluated start, for pairing and audit without the stores
                name: [
                    {
                        "task": r.task,
                        "family": r.family,
                        "start_id": r.start_id,
                        "attempt": r.attempt,
                        "outcome": r.outcome if r.episode_id else "unfinished (counted as a failure)",
                        "strict": r.strict_success,
                        "host": r.host_success,
                        "valid": r.valid,
                    }
                    for r in sorted(evals[name], key=lambda r: r.key)
                ]
                for name in evals
            },
            "sft_run": record or None,
            "missing": missing,
            "plot": str(plot.relative_to(ROOT)),
            "generation": {  # where each evaluation's runs generated: vllm (the CPU build here) or transformers
                name: ev.generation_of(out) for name, (_, out) in folders.items() if name in summaries
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

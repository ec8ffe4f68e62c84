#!/usr/bin/env python3
"""Render the measured figures of README.md and docs/*.md from the benchmarks' results files, so no figure is
copied by hand.

Each block sits between `<!-- figures: <name> -->` and `<!-- /figures -->` in README.md or a file of docs/ and is
rebuilt from a bench's results file: a table (per row a label, a value template filled from that file's keys with
str.format, and a target; then a line naming the command, the machine and the date), or a paragraph
template for prose that quotes measured numbers. The README's `headline` block takes one row each from several
results files, and names the file of each row and the page that has its full table.

  python tools/readme_figures.py           # rewrite the blocks in README.md and docs/*.md
  python tools/readme_figures.py --check   # exit 1 if a page differs from the results files (a test runs this)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(r"(<!-- figures: ([\w-]+) -->\n)(.*?)(<!-- /figures -->)", re.DOTALL)


STUDENT = (
    (
        "`student_zero_shot_strict` / host: Qwen2.5-Coder-0.5B-Instruct as built, on {student_episodes} held-out twin "
        "episodes (5 starts x 13 tasks, four families), {generation_zero_shot}",
        "{student_zero_shot_strict:.1%} / {student_zero_shot_host:.1%} (95% CI up to "
        "{student_zero_shot_strict_ci95[1]:.1%})",
        "near 0 (CaPtain: 0% for an untrained 4B)",
    ),
    (
        "`student_sft_strict` / `student_sft_host`: after SFT on the expert's training-split episodes, the same "
        "starts and budgets, {generation_sft}{sft_unfinished_note}",
        "{student_sft_strict:.1%} (95% CI {student_sft_strict_ci95[0]:.1%}-{student_sft_strict_ci95[1]:.1%}) / "
        "{student_sft_host:.1%}",
        "≥ 50% (moonshot ≥ 80%)",
    ),
    ("strict successes by family, zero-shot -> SFT", "{strict_by_family}", ""),
    (
        "`sft_vs_zero_shot_mcnemar_p`: exact McNemar on the {paired_starts} paired starts",
        "{sft_vs_zero_shot_mcnemar_p:.2g}",
        "",
    ),
    (
        "`prompt_gate_pass_rate`: served prompt ids = the trainer's rendering, every recorded request",
        "{prompt_gate_pass_rate:.0%} of {prompt_gate_requests}",
        "= 100%",
    ),
    (
        "requests / output tokens per episode, zero-shot vs SFT",
        "{zero_shot_requests_per_episode:.1f} / {zero_shot_output_tokens_per_episode:,.0f} vs "
        "{sft_requests_per_episode:.1f} / {sft_output_tokens_per_episode:,.0f}",
        "",
    ),
    (
        "after SFT: replies that are a tool call (of those that tried one), cells that raise",
        "{sft_tool_call_parse_rate:.0%}, {sft_cell_raise_rate:.0%} ({sft_cell_errors})",
        "",
    ),
    (
        "`sft_tokens_per_s`: LoRA rank 32 on the `captain_ros_training.fast` path",
        "{sft_tokens_per_s:,.0f} on {sft_ran_on[gpu]}",
        "",
    ),
)


@dataclass(frozen=True)
class Block:
    results: str  # bench/results/<results>.json, written by `python bench/<results>.py`
    rows: tuple[tuple[str, str, str], ...] = ()  # (label, value, target) templates: a table
    text: str = ""  # or a paragraph template
    # or a table of rows from several results files: (results, label, value, page with the full table)
    headline: tuple[tuple[str, str, str, str], ...] = ()


MOTION = (
    (
        "`contact_stop_error_mm_p95`: 50 guarded descents onto the table, the twin's TCP at first contact vs at rest",
        "{contact_stop_error_mm_p95:.2f} mm (max {contact_stop_error_mm_max:.2f})",
        "≤ 5 mm",
    ),
    (
        "`sweep_deviation_mm_max`: 12 straight 20 cm sweeps, the twin's TCP from the line",
        "{sweep_deviation_mm_max:.2f} mm (median {sweep_deviation_mm_p50:.2f})",
        "< 5 mm",
    ),
    (
        "`cancel_to_hold_ms_p50`: {cancels} cancels from another thread, real-time twin: request to the hold "
        "(the stop ramp starts the next period)",
        "{cancel_to_hold_ms_p50:.1f} ms (p95 {cancel_to_hold_ms_p95:.1f}; control period {control_period_ms:.0f} ms)",
        "",
    ),
    (
        "`cancel_stop_distance_mm_p95`: {cancels} `MoveTo` cancels over DDS at random moments: TCP travel from the "
        "request to rest (a ramp within `stop_decel_radps2`)",
        "{cancel_stop_distance_mm_p95:.1f} mm (p50 {cancel_stop_distance_mm_p50:.1f}) at "
        "{ros_cancel_speed_mps_p50:.3f} m/s",
        "",
    ),
    (
        "`ros_cancel_to_result_ms_p50` / `ros_cancel_to_rest_ms_p50`: the same cancels, request to the CANCELED "
        "result / to rest",
        "{ros_cancel_to_result_ms_p50:.0f} ms / {ros_cancel_to_rest_ms_p50:.0f} ms",
        "",
    ),
    (
        "`force_limit_overshoot_n_max`: {force_descents} manipulation-mode descents into the table at 2 cm/s, "
        "15 N limit: physics-rate peak − limit, in-process",
        "{force_limit_overshoot_n_max:.1f} N (p50 {force_limit_overshoot_n_p50:.1f})",
        "",
    ),
    (
        "`ros_force_limit_overshoot_n_max`: the same descents through the ros2_control backend over DDS, the arm "
        "reflex in twin_node",
        "{ros_force_limit_overshoot_n_max:.1f} N (p50 {ros_force_limit_overshoot_n_p50:.1f}); "
        "{ros_minus_in_process_overshoot_max_n:+.1f} N vs in-process",
        "within 5 N of in-process",
    ),
    (
        "`ros_overhead_ratio`: 10 cm `move_to` via the `MoveTo` action vs the core in-process, both on twin_node "
        "via ros2_control",
        "{ros_overhead_ratio:.2f} ({move_to_ros_s_p50:.2f} s vs {move_to_in_process_s_p50:.2f} s)",
        "",
    ),
    (
        "`ik_ms_p50`: our damped least squares per top-down pose, cold from home (mink + daqp beside)",
        "{ik_ms_p50:.1f} ms (mink {mink_ms_p50:.1f} ms; a 20 cm sweep plan {sweep_plan_ms_p50:.0f} ms)",
        "",
    ),
    (
        "machine load while it ran (1-minute load average at start / end, 2 cores): wall-clock rows are upper bounds",
        "{load_average_1min_at_start:.1f} / {load_average_1min_at_end:.1f}",
        "",
    ),
)

PERCEPTION = (
    (
        '`e2e_success_rate`: `segment("<colour> <kind>")` → top-1 → `measure_object_geometry`: the right object '
        "and its centre within {e2e_success_criterion_cm:.0f} cm",
        "{e2e_success_rate:.3f} ({e2e_successes}/{e2e_queries} queries)",
        "≥ 0.9",
    ),
    (
        "`e2e_center_error_cm_p50`: all queries, a wrong or missing detection counted as a failure",
        "{e2e_center_error_cm_p50:.2f} cm (p90 {e2e_center_error_cm_p90:.2f})",
        "≤ 1 cm",
    ),
    (
        "`e2e_center_error_cm_p50_correct`: right top-1 detections only",
        "{e2e_center_error_cm_p50_correct:.2f} cm (p90 {e2e_center_error_cm_p90_correct:.2f})",
        "",
    ),
    (
        "`e2e_top1_right_rate`: the top-1 detection is an object of the asked description",
        "{e2e_top1_right_rate:.3f} (wrong {e2e_wrong}, missing {e2e_missing})",
        "",
    ),
    ("`e2e_point_success_rate`: `point(...)` instead of `segment`", "{e2e_point_success_rate:.3f}", ""),
    (
        "`e2e_extent_error_cm_p50` / `e2e_yaw_error_deg_p50`: right groundings; yaw of cubes, blocks, boxes",
        "{e2e_extent_error_cm_p50:.2f} cm / {e2e_yaw_error_deg_p50:.2f}°",
        "≤ 1 cm / ≤ 10°",
    ),
    (
        "`oracle_click_center_error_cm_p50`: **oracle**: `mark_point` on the true mask's central pixel, then "
        "measure ({oracle_click_objects} objects)",
        "{oracle_click_center_error_cm_p50:.2f} cm (p90 {oracle_click_center_error_cm_p90:.2f})",
        "",
    ),
    (
        "`observe_ms_p50`: the `observe` capability: both cameras rendered and handed to the background build of "
        "their point clouds (table planes, robot masks, colour names), which the next call on them waits for",
        "{observe_ms_p50:.0f} ms (p90 {observe_ms_p90:.0f}; CPU time {observe_cpu_ms_p50:.0f} ms)",
        "`observe_ratio_to_captain` {observe_ratio_to_captain:.2f} of CaPtain's {observe_anchor_ms:.0f} ms",
    ),
    (
        "`observe_ros_ms_p50`: `observe` as the agent node calls it (`/perception/call`; twin_node in its own process, "
        "same run as the next two rows)",
        "{observe_ros_ms_p50:.0f} ms ({observe_ros_ratio_to_render:.1f}x the raw render); the images back and "
        "PNG-encoded as the agent attaches them: +{observe_ros_images_ms_p50:.0f} ms; then the first `segment`: "
        "{first_segment_ros_ms_p50:.0f} ms",
        "≤ 60 ms and ≤ 3x the raw render",
    ),
    (
        "`raw_render_ms_p50` / `observe_inprocess_ms_p50`: both cameras rendered, nothing else / `observe` through "
        "the harness core in-process",
        "{raw_render_ms_p50:.0f} ms / {observe_inprocess_ms_p50:.0f} ms, then the first `segment` "
        "{first_segment_inprocess_ms_p50:.0f} ms (the cloud build per camera "
        "{observe_breakdown_ms_p50[clouds_per_camera_ms_p50]:.1f} ms: robot mask "
        "{observe_breakdown_ms_p50[robot_mask_ms_p50]:.1f}, back-projection "
        "{observe_breakdown_ms_p50[backproject_ms_p50]:.1f}, table {observe_breakdown_ms_p50[table_ms_p50]:.1f}, "
        "colours {observe_breakdown_ms_p50[colours_ms_p50]:.1f} ms)",
        "",
    ),
    (
        "`e2e_segment_measure_ms_p50`: `segment` + `measure_object_geometry` right after a fresh `observe` (waiting "
        "for its clouds included)",
        "{e2e_segment_measure_ms_p50:.0f} ms (p90 {e2e_segment_measure_ms_p90:.0f}; CPU "
        "{e2e_segment_measure_cpu_ms_p50:.0f} ms)",
        "≤ 50 ms",
    ),
    (
        "`mark_measure_ms_p50`: `mark_point` + `measure_object_geometry` on a fresh observation, segmentation included",
        "{mark_measure_ms_p50:.0f} ms (p90 {mark_measure_ms_p90:.0f}; CPU {mark_measure_cpu_ms_p50:.0f} ms)",
        "≤ 50 ms",
    ),
)

PERCEPTION_NOTES = (
    "By kind: {by_kind}. The centre error is the calibration error: handed the true camera pose instead "
    "(evaluation only), the same path measures {perfect_calibration_e2e_center_error_cm_p50:.2f} cm (p50), against "
    "{e2e_center_error_cm_p50:.2f} cm with the calibrated one (this run's head-camera errors: "
    "{head_calibration_error_mm_p50:.1f} mm and {head_calibration_error_deg_p50:.2f}° p50). Failures: {failures}. "
    "Noisy depth (σ = 1.5 mm·z², 2% holes, 1 mm steps) on top of the calibration error: success "
    "{noisy_depth_e2e_success_rate:.3f}, centre {noisy_depth_e2e_center_error_cm_p50:.2f} cm p50; the oracle click "
    "then fails {noisy_depth_oracle_click_failures} times, the policy's path "
    "{noisy_depth_e2e_failure_count} time(s). The run shared the 2-core VM with other jobs (1-minute load average "
    "{load_average_1min_at_start:.1f} at its start, {load_average_1min_at_end:.1f} at its end), so wall-clock "
    "timings are upper bounds; the CPU time per call is beside them.\n"
)

TWIN = (
    (
        "`render_ms_p50`: head + wrist, RGB + metric depth, 512×512, rendering only (`observe` as a whole is "
        "`observe_ms_p50` in docs/perception.md)",
        "{render_ms_p50:.0f} ms (p90 {render_ms_p90:.0f})",
        "≤ 60 ms",
    ),
    (
        "`physics_rtf`: scripted grasps, carries and sweeps ({contact_pct:.0f}% of steps in arm contact)",
        "{physics_rtf:.1f}×",
        "≥ 20×",
    ),
    ("`reset_ms_p50`: a wide start state, incl. 0.3 s settle", "{reset_ms_p50:.0f} ms", ""),
)

ROS_RTT = (
    (
        "`harness_call_rtt_ms_p50`: HarnessCall between two processes, {calls_per_service} calls",
        "{harness_call_rtt_ms_p50:.2f} ms (p90 {harness_call_rtt_ms_p90:.2f})",
        "",
    ),
    (
        "`trigger_rtt_ms_p50`: std_srvs/Trigger, the same way",
        "{trigger_rtt_ms_p50:.2f} ms (p90 {trigger_rtt_ms_p90:.2f})",
        "",
    ),
    ("`rtt_ratio`: HarnessCall / Trigger", "{rtt_ratio:.2f}", "≤ {target_rtt_ratio_max}"),
)

STRESS = (
    "The DDS tests (`tests/captain_ros/ros`, every `ros`-marked test) under load: `python tools/stress_dds_tests.py` "
    "ran them {runs} times in a row on {machine[cores]} cores while {busy_loops} busy loops kept every core busy: "
    "{passed} of {runs} runs passed (longest run of consecutive passes: {longest_passing_streak}; a run took "
    "{run_s_median:.0f} s, at most {run_s_max:.0f} s; `bench/results/stress_dds.json`, {machine[date_utc]}).\n"
)

AGENT = (
    (
        "`expert_strict_success` / `expert_host_success`: the scripted expert on {episodes} evaluation start "
        "states ({per_task} per task, every task), whole episodes through the loop, sandbox and harness",
        "{expert_strict_success:.3f} / {expert_host_success:.3f}",
        "strict ≥ 0.8",
    ),
    ("per family (strict)", "{family_strict}", "each ≥ 0.6"),
    (
        "`harness_overhead_s_p50` / `_p90`: per request, everything but generation and the motions' own "
        "duration (sandbox, robot calls' compute, rendering, image encoding, prompt building)",
        "{harness_overhead_s_p50:.3f} s / {harness_overhead_s_p90:.3f} s ({overhead_ratio_p50:.3f} of CaPtain's "
        "{overhead_anchor_s} s)",
        "p50 ≤ 0.3 s",
    ),
    (
        "`episodes_per_hour`: one at a time, twin in-process (physics faster than real time); with the motions "
        "at real time",
        "{episodes_per_hour:.0f}; {episodes_per_hour_real_time_motions:.0f}",
        "",
    ),
    (
        "per episode: requests, physical actions, sandbox start",
        "{requests_mean:.1f}, {actions_mean:.1f}, {sandbox_start_s_p50:.2f} s",
        "",
    ),
)

BRIDGE = (
    (
        "`episodes_per_hour_per_core`: the scripted expert behind the recording proxy, {workers} twin workers, "
        "every request recorded and the store streamed to a local receiver ({clean_episodes} episodes)",
        "{episodes_per_hour_per_core:.0f}",
        "",
    ),
    (
        "`recording_overhead_share`: the proxy's own time plus the recorder's snapshots and durable writes, "
        "over request time (the expert generates in ms: an upper bound for an LLM policy)",
        "{recording_overhead_share:.4f}",
        "≤ 0.02",
    ),
    (
        "`zmq_records_per_s` / `zmq_mb_per_s`: shipper → receiver on loopback, {zmq[records]} records of "
        "{zmq[payload_bytes]} B, each acknowledged only once committed to the trainer's store",
        "{zmq_records_per_s:.0f} / {zmq_mb_per_s:.1f}",
        "",
    ),
    (
        "`records_lost_under_kill`: {faulted_episodes} episodes while {kills} kill -9 hit {injected}; every "
        "record compared by id and SHA-256 between the host's and the trainer's store, valid episodes checked "
        "whole",
        "{records_lost_under_kill} ({abandoned} episodes abandoned as invalid and re-run)",
        "0",
    ),
)

TRAINING = (
    (
        "`advantages_s_1024x40`: critic values (the paper-sized 5×MLP ensemble, two passes) and Eq. 9–10 "
        "advantages for 1,024 episodes of 40 requests, CPU (`python bench/advantages.py`)",
        "{advantages_s_1024x40:.3f} s",
        "≤ 1 s",
    ),
)

TRAIN_GPU = (
    (
        "`sft_tokens_per_s` / `sft_mfu`: the fastest fast-SFT variant that passes the log-prob gate, Qwen2-0.5B "
        "shape, bf16, packed 8k-token rows, H200",
        "{sft_tokens_per_s:.0f} / {sft_mfu:.3f}",
        "",
    ),
    (
        "`plain_tokens_per_s`: a plain transformers step, same model and rows, its best batch",
        "{plain_tokens_per_s:.0f}",
        "",
    ),
    ("`speedup_vs_plain`", "{speedup_vs_plain:.2f}", "≥ 1.5"),
    (
        "`logprob_max_abs_diff` vs `plain_run_to_run_max_abs_diff` (CaPtain App. F's numerical gate)",
        "{logprob_max_abs_diff:.4f} vs {plain_run_to_run_max_abs_diff:.4f}",
        "≤",
    ),
)

SFT_THEN_RL = (
    "| stage | what ran | measured |\n|---|---|---|\n"
    "| expert | the scripted expert on {tasks} (train starts) | {expert_success} solved, "
    "{expert_requests:.1f} requests per episode, {wall[expert]:.0f} s |\n"
    "| SFT | gate + CaPtain Eq. 2 on the tiny student ({sft[parameters]:,} parameters), {sft[steps]} steps | "
    "{sft[examples]} requests, {sft[examples_too_long]} longer than the {config[context_tokens]}-token context left "
    "out; loss {sft[loss_first]:.2f} → {sft[loss_last]:.2f}; {wall[sft]:.0f} s |\n"
    "| eval, SFT (v0) | the served student on {eval_sft_episodes} held-out starts | {eval_sft_success} |\n"
    "| RL | {config[rl_rounds_n]} rounds: rollouts of the served policy → round → update → weight sync | "
    "{rl_rounds}; server, proxy and receiver never restarted: {services_unchanged}; {wall[rl]:.0f} s |\n"
    "| eval, RL (v{eval_rl_version}) | the same held-out starts | {eval_rl_success} |\n"
    "\nFrom `bench/results/sft_then_rl.json` (and `.png`), written by "
    "`.venv/bin/python -m captain_ros_training sft-then-rl` on {machine[cpu_count]} CPU cores ({machine[vllm]}, "
    "torch {machine[torch]}) in {wall[total]:.0f} s.\n"
)

LIBERO = (
    *(
        (
            f"`{suite}_strict` / host: the scripted expert, one episode per task of the suite on the official "
            "initial states {states}; its perception the built-in depth regions named by the appearance library "
            "rendered from LIBERO's asset models, and its models of LIBERO's cabinet and stove from their asset files "
            "(both IN-DOMAIN; no simulator state; run {variant_dates[appearance]})",
            f"{{{suite}_strict:.2f}} / {{{suite}_host:.2f}}",
            "",
        )
        for suite in ("libero_spatial", "libero_object", "libero_goal", "libero_10")
    ),
    *(
        (
            f"`{suite}_strict_colour_shape` / host: the same episodes naming objects by colour and shape alone "
            "(run {variant_dates[colour_shape]})",
            f"{{{suite}_strict_colour_shape:.2f}} / {{{suite}_host_colour_shape:.2f}}",
            "",
        )
        for suite in ("libero_spatial", "libero_object", "libero_goal")
    ),
    *(
        (
            f"`{suite}_strict_oracle_segmentation` / host: the same episodes with ORACLE segmentation (masks from the "
            "simulator's object ids; depth, geometry, planning and motion unchanged; run "
            "{variant_dates[oracle_segmentation]})",
            f"{{{suite}_strict_oracle_segmentation:.2f}} / {{{suite}_host_oracle_segmentation:.2f}}",
            "",
        )
        for suite in ("libero_spatial", "libero_object", "libero_goal")
    ),
    (
        "`observe_ms_p50_libero`: the observe capability on a LIBERO scene (head + wrist RGB-D {image_px}x{image_px} "
        "rendered by LIBERO, clouds built); rendering alone {capture_ms_p50_libero:.0f} ms vs LIBERO's own "
        "{native_observe_ms:.0f} ms",
        "{observe_ms_p50_libero:.0f} ms",
        "",
    ),
    (
        "50 ms of simulated arm motion: the harness's joint control (25 round trips to the LIBERO server) vs "
        "LIBERO's own env.step (OSC, no cameras)",
        "{control_ms_per_50ms:.1f} ms vs {native_step_ms_per_50ms:.1f} ms ({control_ratio_to_native:.2f}x)",
        "",
    ),
)

LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
# CaPtain App. K, Table 9: strict / host successes of 60 episodes per suite (240 in all)
LIBERO_PAPER = {
    "libero_spatial": {"CaPtain-4B-SFT": "46/47", "CaPtain-4B": "58/58"},
    "libero_object": {"CaPtain-4B-SFT": "45/46", "CaPtain-4B": "52/55"},
    "libero_goal": {"CaPtain-4B-SFT": "21/25", "CaPtain-4B": "36/41"},
    "libero_10": {"CaPtain-4B-SFT": "13/15", "CaPtain-4B": "16/23"},
    "libero": {"CaPtain-4B-SFT": "125/133", "CaPtain-4B": "162/177"},
}


def _paper(suite: str) -> str:
    of = 240 if suite == "libero" else 60
    return "; ".join(f"{model} {counts}" for model, counts in LIBERO_PAPER[suite].items()) + f" (strict / host of {of})"


LIBERO_PROTOCOL = (
    *(
        (
            f"`{suite}_strict` / host: the scripted expert at {{{suite}_commits}}, {{{suite}_episodes}} episodes "
            "(IN-DOMAIN perception models)",
            f"{{{suite}_counts}}",
            _paper(suite),
        )
        for suite in LIBERO_SUITES
    ),
    ("`libero_strict` / `libero_host`: all {libero_episodes} episodes", "{libero_counts}", _paper("libero")),
    (
        "`libero_pro_strict` / host: LIBERO-PRO's perturbed suites, the same way ({libero_pro_episodes} episodes; "
        "strict per suite: {libero_pro_suites})",
        "{libero_pro_counts}",
        "",
    ),
    ("`libero_episode_s_p50`: wall time per episode, one worker per core", "{libero_episode_s_p50:.1f} s", ""),
)

SHADOW = (
    (
        "`shadow_refusal_recall`: unsafe motions (by the real outcome: an arm link hit something, a force over the "
        "limit, or an object pushed off the table) the shadow refused, over {scene_count} scenes with hidden mass and "
        "friction differences",
        "{shadow_refusal_recall:.2f} ({refused_unsafe} of {unsafe_motions})",
        "",
    ),
    (
        "`shadow_false_refusal_rate`: safe motions it refused",
        "{shadow_false_refusal_rate:.2f} ({refused_safe} of {safe_motions})",
        "",
    ),
    (
        "`predicted_stop_reason_agreement`: the predicted outcome (stop reason, or holding for a jaw command) equals "
        "the real one",
        "{predicted_stop_reason_agreement:.2f}",
        "",
    ),
    (
        "`shadow_check_ms_p50`: one check (build the scene when measurements changed, place it, settle, play the "
        "action); p90 {check_ms_p90:.0f} ms",
        "{shadow_check_ms_p50:.0f} ms ({check_to_motion_time_ratio_p50:.2f}x the motion's own duration; "
        "{check_ratio_to_raw_physics_p50:.1f}x its raw physics, MuJoCo's mj_step alone: {raw_physics_ms_p50:.0f} ms)",
        "≤ 200 ms",
    ),
)

AGENT_MEMORY = (
    (
        "`agent_peak_rss_mb`: the agent process over one episode of {observe_calls} `observe` + `segment` calls "
        "through the loop, sandbox and in-process twin",
        "{agent_peak_rss_mb:.0f} MB (growth {rss_growth_mb_per_observe:.2f} MB per observe; "
        "{max_observations_kept} observations kept)",
        "≤ {target_peak_rss_mb:.0f} MB",
    ),
    (
        "the same with the bounds lifted (every observation kept, as before issue 30): the anchor",
        "{unbounded_peak_rss_mb:.0f} MB ({unbounded_rss_growth_mb_per_observe:.1f} MB per observe)",
        "",
    ),
)

CI = (
    "`make test` on a fresh clone as CI runs it (`python bench/ci.py`: a clone under `/tmp`, setup included, on "
    "{machine[cpu]}, {machine[cores]} cores): {fresh_clone_ci_min:.1f} min ({fresh_clone_ci_s:.0f} s; target ≤ "
    "{target_s:.0f} s): setup {setup_s:.0f} s, pytest {pytest_s:.0f} s on {test_workers} workers ({tests_passed} "
    "passed, {tests_skipped} skipped, {tests_failed} failed), then the Jazzy start-up suite; "
    "`bench/results/ci.json`, {machine[date_utc]}. The run before the parallel test files took {before_ci_min:.1f} min "
    "(pytest {before_pytest_s:.0f} s); both runs' 20 slowest tests are in the results file. A second `make setup` "
    "with nothing changed: {setup_again_s:.1f} s; `.venv` {venv_gb[.venv]:.1f} GB (torch CPU, open3d, MuJoCo, "
    "transformers, the ROS wheels), `.venv-jazzy` {venv_gb[.venv-jazzy]:.1f} GB, `.venv-vllm` "
    "{venv_gb[.venv-vllm]:.1f} GB, `.venv-libero` {venv_gb[.venv-libero]:.1f} GB.\n"
)

HEADLINE = (
    (
        "agent",
        "scripted expert, strict / host success on {episodes} held-out twin starts, whole episodes over the loop, "
        "sandbox and harness",
        "{expert_strict_success:.3f} / {expert_host_success:.3f}",
        "docs/agent.md",
    ),
    (
        "libero",
        "scripted expert on LIBERO, CaPtain's held-out protocol ({libero_episodes} of its 240 episodes; the expert "
        "at {libero_commits}), strict / host; its perception models are built from LIBERO's assets (in-domain)",
        "{libero_strict:.3f} / {libero_host:.3f}",
        "docs/libero.md",
    ),
    (
        "student",
        "Qwen2.5-Coder-0.5B-Instruct, strict success on {student_episodes} held-out twin episodes, zero-shot -> SFT",
        "{student_zero_shot_strict:.1%} -> {student_sft_strict:.1%}",
        "docs/training.md",
    ),
    (
        "perception",
        "RGB-D grounding: `segment` -> top-1 -> `measure_object_geometry` right, centre error p50",
        "{e2e_success_rate:.3f}, {e2e_center_error_cm_p50:.2f} cm",
        "docs/perception.md",
    ),
    (
        "motion",
        "guarded descent onto the table: TCP at first contact vs at rest, p95",
        "{contact_stop_error_mm_p95:.2f} mm",
        "docs/harness.md",
    ),
    (
        "shadow",
        "shadow twin: unsafe motions refused / safe motions refused",
        "{shadow_refusal_recall:.2f} / {shadow_false_refusal_rate:.2f}",
        "docs/shadow.md",
    ),
    (
        "bridge",
        "records lost by the episode bridge under {kills} kill -9",
        "{records_lost_under_kill}",
        "docs/bridge.md",
    ),
    (
        "twin",
        "twin: head + wrist RGB-D render p50; physics real-time factor",
        "{render_ms_p50:.0f} ms; {physics_rtf:.1f}x",
        "docs/benchmarks.md",
    ),
    (
        "train_gpu",
        "fast SFT path vs a plain transformers step (Qwen2-0.5B shape, H200), log-prob gate passed",
        "{speedup_vs_plain:.2f}x",
        "docs/training.md",
    ),
    ("ci", "`make test` on a fresh clone, setup included", "{fresh_clone_ci_min:.1f} min", "docs/benchmarks.md"),
)

BLOCKS = {
    "headline": Block("", headline=HEADLINE),
    "motion": Block("motion", rows=MOTION),
    "perception": Block("perception", rows=PERCEPTION),
    "perception-notes": Block("perception", text=PERCEPTION_NOTES),
    "twin": Block("twin", rows=TWIN),
    "ros_rtt": Block("ros_rtt", rows=ROS_RTT),
    "stress_dds": Block("stress_dds", text=STRESS),
    "agent": Block("agent", rows=AGENT),
    "agent_memory": Block("agent_memory", rows=AGENT_MEMORY),
    "bridge": Block("bridge", rows=BRIDGE),
    "advantages": Block("advantages", rows=TRAINING),
    "train_gpu": Block("train_gpu", rows=TRAIN_GPU),
    "sft_then_rl": Block("sft_then_rl", text=SFT_THEN_RL),
    "libero": Block("libero_quick", rows=LIBERO),
    "libero_protocol": Block("libero", rows=LIBERO_PROTOCOL),
    "shadow": Block("shadow", rows=SHADOW),
    "ci": Block("ci", text=CI),
    "student": Block("student", rows=STUDENT),
}


COMMANDS = {
    "stress_dds": "python tools/stress_dds_tests.py",
    "sft_then_rl": ".venv/bin/python -m captain_ros_training sft-then-rl",
    "libero_quick": "python bench/libero.py --quick",
}


def command(results: str) -> str:
    """What writes bench/results/<results>.json."""
    return COMMANDS.get(results, f"python bench/{results}.py")


def derived(name: str, values: dict) -> dict:
    """Values a template quotes that the results file holds in another shape."""
    if name == "perception":
        kinds = values.get("e2e_by_kind", {})
        return {
            "by_kind": ", ".join(f"{k} {v['successes']}/{v['queries']}" for k, v in sorted(kinds.items())),
            "failures": "; ".join(f"`{f}`" for f in values.get("e2e_failures", [])) or "none",
            "noisy_depth_e2e_failure_count": len(values.get("noisy_depth_e2e_failures", [])),
        }
    if name == "agent":
        families = {k: v for k, v in values.get("per_family", {}).items() if k != "all"}
        every = values.get("per_family", {}).get("all", {})
        return {
            "family_strict": ", ".join(f"{k} {v['strict']:.2f} ({v['episodes']})" for k, v in sorted(families.items())),
            "requests_mean": every.get("requests", float("nan")),
            "actions_mean": every.get("actions", float("nan")),
        }
    if name == "bridge":
        faulted = values.get("faulted", {})
        return {
            "clean_episodes": values.get("clean", {}).get("episodes", 0),
            "faulted_episodes": faulted.get("episodes", 0),
            "abandoned": len(faulted.get("abandoned", [])),
            "injected": ", ".join(f"{k} ×{v}" for k, v in sorted(faulted.get("injected", {}).items())) or "nothing",
        }
    if name == "sft_then_rl":
        s = values["stages"]
        rounds = s["rl"]["rounds"]

        def success(stage: dict) -> str:
            won = round(stage["strict_success_rate"] * stage["episodes"])
            low, high = stage["strict_success_ci95"]
            return f"{won}/{stage['episodes']} (95% CI {low:.2f}–{high:.2f})"

        per_round = [
            f"round {r['round']}: {r['rollout']['episodes']} episodes, {r['rollout']['strict']} solved, kept "
            f"{r['update']['kept_frac']:.2f}, KL {r['update']['kl_k3']:.4f}, advantage {r['update']['adv_mean']:+.2f} "
            f"± {r['update']['adv_std']:.2f}, v{r['update']['policy_version']}→v{r['update']['policy_version_after']},"
            f" sync {r['sync']['total_s']:.2f} s"
            for r in rounds
        ]
        return {
            "expert_success": success(s["expert"]),
            "expert_requests": s["expert"]["mean_requests"],
            "eval_sft_success": success(s["eval_sft"]),
            "eval_rl_success": success(s["eval_rl"]),
            "rl_rounds": "; ".join(per_round),
            "services_unchanged": all(r["services_unchanged"] for r in rounds),
            "sft": s["sft"],
            "wall": values["wall_s"],
            "eval_sft_episodes": s["eval_sft"]["episodes"],
            "tasks": ", ".join(f"`{t}`" for t in values["config"]["tasks"]),
            "eval_rl_version": s["eval_rl"]["policy_version"],
        }
    others = {
        "twin": lambda v: {"contact_pct": 100 * v.get("physics_contact_step_fraction", float("nan"))},
        "libero": _libero_counts,
    }
    return others[name](values) if name in others else {}


def _libero_counts(values: dict) -> dict:
    """Per suite and over all: strict and host successes of the headline variant's episodes with Wilson 95%
    intervals ("k/n (lo–hi) / k/n (lo–hi)"), and the episode counts."""
    from captain_ros.bridge.evaluation import wilson

    def rate(k: int, n: int) -> str:
        low, high = wilson(k, n)
        return f"{k}/{n} ({low:.2f}–{high:.2f})" if n else "n/a"

    out = {}
    episodes = [e for e in values.get("episodes", []) if e.get("variant", "appearance") == "appearance"]
    groups = {suite: [e for e in episodes if e["suite"] == suite] for suite in LIBERO_SUITES}
    groups["libero"] = [e for e in episodes if e["suite"] in LIBERO_SUITES]
    groups["libero_pro"] = [e for e in episodes if e["suite"] not in LIBERO_SUITES]  # LIBERO-PRO's perturbed suites
    for suite, mine in groups.items():
        strict = sum(e["outcome"] == "success" for e in mine)
        host = sum(bool(e["host_success"]) for e in mine)
        out[f"{suite}_episodes"] = len(mine)
        out[f"{suite}_counts"] = f"{rate(strict, len(mine))} / {rate(host, len(mine))}"
        commits = sorted({e.get("commit", "an unrecorded commit") for e in mine})
        out[f"{suite}_commits"] = " and ".join(commits) or "no commit"
    pro = sorted({e["suite"] for e in groups["libero_pro"]})
    out["libero_pro_suites"] = (
        ", ".join(
            f"{s} {sum(e['outcome'] == 'success' for e in groups['libero_pro'] if e['suite'] == s)}"
            f"/{sum(e['suite'] == s for e in groups['libero_pro'])}"
            for s in pro
        )
        or "none run yet"
    )
    return out


def _fill(template: str, values: dict, name: str) -> str:
    try:
        return template.format_map(values)
    except KeyError as exc:
        raise SystemExit(
            f"README figures: bench/results/{name}.json has no key {exc.args[0]}: rerun `{command(name)}`"
        ) from None


def _values(results: str) -> dict:
    path = RESULTS / f"{results}.json"
    if not path.is_file():
        raise SystemExit(f"README figures: {path.relative_to(ROOT)} is missing: run `{command(results)}`")
    values = json.loads(path.read_text())
    values.update(derived(results, values))
    return values


def render_headline(block: Block) -> str:
    lines = ["| figure | value | from | details |", "|---|---|---|---|"]
    for results, label, value, page in block.headline:
        values = _values(results)
        cells = (_fill(label, values, results), _fill(value, values, results))
        lines.append(f"| {cells[0]} | {cells[1]} | `bench/results/{results}.json` | [{page}]({page}) |")
    return "\n".join(lines) + "\n"


def render(block_name: str) -> str:
    block = BLOCKS[block_name]
    if block.headline:
        return render_headline(block)
    values = _values(block.results)
    if block.text:
        return _fill(block.text, values, block.results)
    lines = ["| metric | value | target |", "|---|---|---|"]
    for row in block.rows:
        lines.append("| " + " | ".join(_fill(cell, values, block.results) for cell in row) + " |")
    machine = values.get("machine", {})
    lines += [
        "",
        f"From `bench/results/{block.results}.json`, written by `{command(block.results)}` on "
        f"{machine.get('cpu', '?')} ({machine.get('cores', '?')} cores"
        + (f", {machine['gpu']}" if machine.get("gpu") else "")
        + f") at {machine.get('date_utc', '?')}.",
    ]
    return "\n".join(lines) + "\n"


def pages() -> list[Path]:
    """The pages that may hold blocks: the README and every file of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def rebuilt(text: str) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in BLOCKS:
            raise SystemExit(f"README figures: no block '{name}' is defined (tools/readme_figures.py)")
        return match.group(1) + render(name) + match.group(4)

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if README.md is stale")
    args = parser.parse_args(argv)
    stale, blocks = [], 0
    for page in pages():
        text = page.read_text()
        new = rebuilt(text)
        blocks += len(BLOCK.findall(new))
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    if args.check:
        if stale:
            print(
                f"figures in {', '.join(map(str, stale))} differ from bench/results/*.json: "
                "run `python tools/readme_figures.py`"
            )
            return 1
        print(f"README.md and docs/*.md figures match bench/results ({blocks} blocks)")
        return 0
    print(
        f"{blocks} blocks in README.md and docs/*.md rendered from bench/results; rewritten: "
        f"{', '.join(map(str, stale)) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

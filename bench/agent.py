"""The agent loop with the scripted expert on evaluation-split twin start states (issue 10).

Every task of the suite gets the same number of evaluation start states (wide layouts drawn from the
held-out split with a fixed seed); each episode runs the full loop: the expert server over HTTP (the
OpenAI-compatible API), the bubblewrap sandbox, the harness core on the in-process twin. Ground truth
only scores the final scene (host success); strict success also needs an accepted finish().

  expert_strict_success, expert_host_success   over all episodes (infrastructure failures excluded)
  harness_overhead_s_p50 / _p90                per request: everything except model generation and the
                                               motions' own duration (sandbox, robot calls' compute,
                                               rendering, prompt building); anchor: CaPtain's ~4.1 s
                                               per request outside vLLM (6.7 s total, 2.6 s generation)
  episodes_per_hour                            this machine, one episode at a time, twin in-process
                                               (physics faster than real time; a real arm runs the
                                               motions' own duration on top)

Per-family rates, outcome classes and the mean requests/actions per episode go to the results file.

  python bench/agent.py                 # 104 episodes (8 per task), about 10 minutes here
  python bench/agent.py --per-task 2    # a quick look
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("MUJOCO_GL", "egl")

from _common import print_table, write_results
from tqdm import tqdm

from captain_ros.agent.episode import EpisodeRunner, Outcome
from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
from captain_ros.agent.sandbox import Sandbox, SandboxLimits
from captain_ros.core.config import load_config
from captain_ros.stack import start_expert
from captain_ros.twin.start_states import sample_start_id
from captain_ros.twin.tasks import default_suite
from captain_ros.worlds.twin.link import InProcessLink

CAPTAIN_OVERHEAD_S = 4.1  # CaPtain: 6.7 s per request, 2.6 s of it generation
SEED = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-task", type=int, default=8, help="evaluation start states per task")
    parser.add_argument("--runs-dir", default="", help="keep transcripts here (default: a temporary folder)")
    args = parser.parse_args()

    suite = default_suite()
    rng = np.random.default_rng(SEED)
    episodes = [(name, str(sample_start_id(name, "eval", rng))) for name in suite for _ in range(args.per_task)]
    config = load_config()
    runs = Path(args.runs_dir or tempfile.mkdtemp(prefix="bench-agent-"))
    runs.mkdir(parents=True, exist_ok=True)
    expert, url = start_expert(dict(os.environ), runs / "expert.log")
    limits = SandboxLimits(cell_timeout_s=config.agent.cell_timeout_s)

    def sandbox(scratch, on_call, allowed):
        box = Sandbox(scratch, on_call, allowed, limits)
        box.start()
        return box

    policy = PolicyClient(PolicyConfig(base_url=url))
    runner = EpisodeRunner(InProcessLink(config), policy, config, sandbox_factory=sandbox, runs_dir=runs)
    results, robot_time_s = [], []
    t0 = time.perf_counter()
    try:
        for task, start in tqdm(episodes, desc="episodes", unit="ep"):
            results.append(runner.run(task, start, split="eval"))
            robot_time_s.append(runner.link.twin.time_s)  # simulated seconds since the reset: the arm's own time
    finally:
        expert.terminate()
    elapsed = time.perf_counter() - t0

    valid = [r for r in results if r.valid]
    overhead = [t.overhead_s for r in valid for t in r.timings]
    family_of = {name: spec.family for name, spec in suite.items()}
    by_family: dict[str, list] = defaultdict(list)
    for r in valid:
        by_family[family_of[r.task]].append(r)
    rows = []
    for family, rs in sorted(by_family.items()):
        rows.append(
            [
                family,
                len(rs),
                float(np.mean([bool(r.host_success) for r in rs])),
                float(np.mean([r.strict_success for r in rs])),
                float(np.mean([r.requests for r in rs])),
                float(np.mean([r.actions for r in rs])),
            ]
        )
    strict = float(np.mean([r.strict_success for r in valid])) if valid else 0.0
    host = float(np.mean([bool(r.host_success) for r in valid])) if valid else 0.0
    rows.append(
        [
            "all",
            len(valid),
            host,
            strict,
            float(np.mean([r.requests for r in valid])),
            float(np.mean([r.actions for r in valid])),
        ]
    )
    print_table(
        "scripted expert, evaluation start states", ["family", "episodes", "host", "strict", "req", "act"], rows
    )
    p50, p90 = float(np.percentile(overhead, 50)), float(np.percentile(overhead, 90))
    per_hour = 3600.0 * len(results) / elapsed
    # at real time the arm's own motion time adds to what was measured here (the twin ran it faster)
    physical = sum(t.physical_s for r in results for t in r.timings)
    real_time_per_hour = 3600.0 * len(results) / (elapsed - physical + sum(robot_time_s))
    sandbox_start = float(np.median([r.sandbox_start_s for r in results]))
    print_table(
        "harness overhead per request (excludes generation and the motions' own duration)",
        ["metric", "value", "anchor", "ratio"],
        [
            ["overhead p50 s", p50, CAPTAIN_OVERHEAD_S, p50 / CAPTAIN_OVERHEAD_S],
            ["overhead p90 s", p90, CAPTAIN_OVERHEAD_S, p90 / CAPTAIN_OVERHEAD_S],
            ["episodes per hour (twin in-process)", per_hour, "", ""],
            ["episodes per hour (motions at real time)", real_time_per_hour, "", ""],
            ["sandbox start s (per episode, p50)", sandbox_start, "", ""],
        ],
    )
    outcomes = Counter(r.outcome.value for r in results)
    print("\noutcomes:", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    failures = [f"{r.start_id}: {r.outcome.value} ({r.reason})" for r in results if not r.strict_success]
    for line in failures[:20]:
        print("  not strict:", line)
    write_results(
        "agent",
        {
            "expert_strict_success": strict,
            "expert_host_success": host,
            "harness_overhead_s_p50": p50,
            "harness_overhead_s_p90": p90,
            "episodes_per_hour": per_hour,
        },
        {
            "episodes": len(results),
            "valid_episodes": len(valid),
            "infrastructure_failures": outcomes.get(Outcome.INFRASTRUCTURE.value, 0),
            "outcomes": dict(outcomes),
            "per_family": {
                row[0]: {"episodes": row[1], "host": row[2], "strict": row[3], "requests": row[4], "actions": row[5]}
                for row in rows
            },
            "per_task_strict": {
                name: float(np.mean([r.strict_success for r in valid if r.task == name]))
                for name in suite
                if any(r.task == name for r in valid)
            },
            "episodes_per_hour_real_time_motions": real_time_per_hour,
            "robot_time_s_mean": float(np.mean(robot_time_s)),
            "sandbox_start_s_p50": sandbox_start,
            "overhead_anchor_s": CAPTAIN_OVERHEAD_S,
            "overhead_ratio_p50": p50 / CAPTAIN_OVERHEAD_S,
            "requests_measured": len(overhead),
            "not_strict": failures,
            "seed": SEED,
            "per_task": args.per_task,
        },
    )


if __name__ == "__main__":
    main()

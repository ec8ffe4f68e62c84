"""The agent's memory over an episode of 200 `observe` calls (issue 30).

A hostile or careless policy can call `robot.observe()` in a loop: each observation holds two 512x512 RGB-D pairs
and, once perceived, their point clouds (about 14 MB). This runs one episode through the agent's own loop
(EpisodeRunner, the bubblewrap sandbox, the harness core on the in-process twin) whose cells call `observe` 200
times in all (40 per request, the per-request limit), and samples the agent process's resident memory after every
request. Then the same with the bounds lifted (every observation and detection kept, no per-request limit), the
behaviour before the fix, as the anchor.

  agent_peak_rss_mb              peak resident memory of the agent process (VmHWM) over the bounded episode;
                                 target <= 1024 MB
  rss_growth_mb_per_observe      slope of resident memory over the second half of the bounded episode (0: bounded)
  unbounded_rss_growth_mb_per_observe, unbounded_peak_rss_mb   the same with the bounds lifted

  python bench/agent_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("MUJOCO_GL", "egl")

from _common import print_table, write_results

from captain_ros.agent.episode import EpisodeRunner
from captain_ros.agent.sandbox import Sandbox
from captain_ros.core.config import load_config
from captain_ros.worlds.twin.link import InProcessLink

TASK, START = "put_red_cube_in_bowl", "put_red_cube_in_bowl/wide/0"
OBSERVES, PER_REQUEST = 200, 40
TARGET_MB = 1024.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@dataclass
class ObservingPolicy:
    """Replies with cells that call observe() and perceive each observation, PER_REQUEST times per request, then
    ends the episode; samples the agent's memory before each request."""

    samples: list[tuple[int, float]] = field(default_factory=list)  # (observes so far, RSS MB)

    def complete(self, messages, tools, headers=None):
        done = len(self.samples) * PER_REQUEST
        self.samples.append((done, rss_mb()))
        if done >= OBSERVES:
            return _Reply("done", [])
        code = (
            f"for _ in range({PER_REQUEST}):\n"
            "    handle = robot.observe()['value']['observation_handle']\n"
            "    robot.segment('red cube', observation_handle=handle)\n"
        )
        call = {"id": "c", "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": code})}}
        return _Reply("observing", [call])


@dataclass
class _Reply:
    content: str
    tool_calls: list
    latency_s: float = 0.0
    usage: dict = field(default_factory=dict)


def episode(config) -> tuple[list[tuple[int, float]], float]:
    """(samples, peak RSS MB of the process so far) for one episode."""
    policy = ObservingPolicy()
    link = InProcessLink(config)

    def sandbox(scratch, on_call, allowed):
        box = Sandbox(scratch, on_call, allowed)
        box.start()
        return box

    runner = EpisodeRunner(link, policy, config, sandbox_factory=sandbox)
    result = runner.run(TASK, START)
    policy.samples.append((OBSERVES, rss_mb()))
    link.close()
    if not result.valid:
        raise SystemExit(f"the episode failed as infrastructure: {result.reason}")
    return policy.samples, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def slope(samples: list[tuple[int, float]]) -> float:
    half = samples[len(samples) // 2 :]
    x, y = np.array([s[0] for s in half], float), np.array([s[1] for s in half])
    return float(np.polyfit(x, y, 1)[0]) if len(half) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-unbounded", action="store_true", help="do not run the anchor without the bounds")
    args = parser.parse_args()
    config = load_config()
    config = replace(config, budgets=replace(config.budgets, perception_calls_per_request=2 * PER_REQUEST))
    bounded, peak = episode(config)  # 2 calls per observation (observe + segment): 40 observations per request
    metrics = {
        "agent_peak_rss_mb": round(peak, 1),
        "rss_growth_mb_per_observe": round(slope(bounded), 3),
        "observe_calls": OBSERVES,
        "target_peak_rss_mb": TARGET_MB,
        "max_observations_kept": config.perception.max_observations_kept,
    }
    rows = [["bounded (defaults)", f"{peak:.0f}", f"{slope(bounded):.2f}", f"{bounded[-1][1]:.0f}"]]
    if not args.skip_unbounded:
        lifted = replace(
            config,
            perception=replace(config.perception, max_observations_kept=10_000, max_observations_mb=1e9,
                               max_detections_kept=1_000_000),
        )  # fmt: skip
        unbounded, unbounded_peak = episode(lifted)
        metrics["unbounded_rss_growth_mb_per_observe"] = round(slope(unbounded), 3)
        metrics["unbounded_peak_rss_mb"] = round(unbounded_peak, 1)
        rows.append(["bounds lifted (anchor)", f"{unbounded_peak:.0f}", f"{slope(unbounded):.2f}",
                     f"{unbounded[-1][1]:.0f}"])  # fmt: skip
    print_table(
        f"agent memory over an episode of {OBSERVES} observe + segment calls ({PER_REQUEST} per request)",
        ["variant", "peak RSS (MB)", "growth (MB/observe)", "RSS at end (MB)"],
        rows,
    )
    print(f"target: peak <= {TARGET_MB:.0f} MB -> {'met' if peak <= TARGET_MB else 'NOT met'}")
    write_results("agent_memory", metrics, {"samples_bounded": bounded})


if __name__ == "__main__":
    main()

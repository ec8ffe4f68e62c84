"""Critic values and advantages for one accumulation step of CaPtain RL on CPU (issue 12).

1,024 synthetic episodes of 40 requests (256 start groups x 4 attempts, random privileged features, App. E-sized
costs, Eq. 7 returns, 3% error-only requests) go through the credit path the trainer uses: one forward pass of a
critic of the paper's size (5 MLPs x 3 hidden layers of 256, CaPtain's 40-task one-hot) over the 2T - 1 states of
each episode (V(s_t, t) and V(s_{t+1}, t)), then Eq. 9-10 and the running-std scaling. Timed: median of several
repeats after a warm-up.

  advantages_s_1024x40     critic values + advantages, seconds (target <= 1 s); every state distinct (worst case)

Also reported: the same with 40% of the requests perception-only (state bit-for-bit unchanged), whose
V(s_{t+1}, t) = V(s_t, t) needs no second forward (`captain_ros_training.credit.critic_values` skips those rows).

  python bench/advantages.py
  python bench/advantages.py --repeats 9 --episodes 2048
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_results

from captain_ros_training.credit import CreditConfig, EpisodeCredit, RunningStd, advantages, critic_values, pad_episodes
from captain_ros_training.critic import FEATURE_NAMES, Critic, CriticConfig

TARGET_S = 1.0
SEED = 12


def synthetic_episodes(n_episodes: int, length: int, n_tasks: int, rng: np.random.Generator) -> list[EpisodeCredit]:
    episodes = []
    for i in range(n_episodes):
        episodes.append(
            EpisodeCredit(
                episode_id=f"bench-{i}",
                group_id=f"group-{i // 4}",
                task=int(rng.integers(n_tasks)),
                features=rng.normal(size=(length, len(FEATURE_NAMES))).astype(np.float32),
                costs=-0.008 * rng.integers(0, 3, length) - 0.02 * (rng.random(length) < 0.05),
                reward=float(rng.choice([1.0, 0.25, 0.0, -0.1, -0.3])),
                error_only=rng.random(length) < 0.03,
                requests=np.arange(1, length + 1),
            )
        )
    return episodes


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples


def cpu_share(fn, repeats: int) -> float:
    """This process's CPU time over wall time x torch threads while running fn: about 1 on an idle machine,
    lower when other processes take the cores (the timings above are then inflated)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - cpu0) / ((time.perf_counter() - wall0) * torch.get_num_threads())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=40, help="requests per episode")
    parser.add_argument("--tasks", type=int, default=40, help="size of the task one-hot (CaPtain: 40 LIBERO tasks)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    rng = np.random.default_rng(SEED)
    tasks = tuple(f"task_{k:02d}" for k in range(args.tasks))
    episodes = synthetic_episodes(args.episodes, args.requests, args.tasks, rng)
    critic = Critic(CriticConfig(tasks=tasks, seed=SEED))
    critic.set_normalisation(torch.from_numpy(np.concatenate([e.features for e in episodes])))
    config = CreditConfig()

    pad_s, _ = timed(lambda: pad_episodes(episodes), args.repeats)
    batch = pad_episodes(episodes)
    values = critic_values(critic, batch)
    values_s, _ = timed(lambda: critic_values(critic, batch), args.repeats)
    credit_s, _ = timed(lambda: advantages(batch, *values, RunningStd(), config), args.repeats)

    def both():
        advantages(batch, *critic_values(critic, batch), RunningStd(), config)

    total_s, samples = timed(both, args.repeats)
    share = cpu_share(both, 2)

    static = pad_episodes(episodes)
    keep = rng.random(static.mask.shape) < 0.4  # request t only perceived: s_{t+1} = s_t
    for t in range(1, args.requests):
        static.features[keep[:, t - 1], t] = static.features[keep[:, t - 1], t - 1]
    static_s, _ = timed(lambda: advantages(static, *critic_values(critic, static), RunningStd(), config), args.repeats)
    rows = int(batch.mask.sum() + batch.mask[:, 1:].sum())
    flops = 2 * rows * critic.config.members * sum(w.shape[1] * w.shape[2] for w in critic.model.weights)
    label = f"{args.episodes}x{args.requests}"
    print_table(
        f"critic values + advantages, {label} requests, torch {torch.__version__}, {torch.get_num_threads()} threads",
        ["stage", "median s", "target s", "ratio"],
        [
            ["critic values (one forward, 2T-1 states/episode)", values_s, "", ""],
            ["Eq. 9-10 + running std", credit_s, "", ""],
            ["values + advantages", total_s, TARGET_S, total_s / TARGET_S],
            ["values + advantages, 40% perception-only requests", static_s, TARGET_S, static_s / TARGET_S],
            ["(not timed above) padding the episodes", pad_s, "", ""],
        ],
    )
    print(f"\nvalues + advantages: min {min(samples):.3f} s, max {max(samples):.3f} s over {len(samples)} repeats")
    print(f"CPU share of this process while timing: {share:.2f} (1.0 = the cores were ours; lower = contended)")
    print(f"critic rows {rows}, {flops / 1e9:.1f} GFLOP per forward -> {flops / values_s / 1e9:.0f} GFLOP/s")
    write_results(
        "advantages",
        {f"advantages_s_{label}": total_s},
        {
            "target_s": TARGET_S,
            "ratio_to_target": total_s / TARGET_S,
            "advantages_s_perception_only_40pct": static_s,
            "critic_values_s": values_s,
            "credit_s": credit_s,
            "pad_s": pad_s,
            "samples_s": samples,
            "advantages_s_min": min(samples),
            "cpu_share": share,
            "loadavg_1min": os.getloadavg()[0],
            "critic_rows": rows,
            "critic_gflop": flops / 1e9,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "episodes": args.episodes,
            "requests": args.requests,
            "tasks": args.tasks,
            "repeats": args.repeats,
            "seed": SEED,
        },
    )


if __name__ == "__main__":
    main()

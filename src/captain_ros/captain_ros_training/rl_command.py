"""The `rl` command of `python -m captain_ros_training rl` (its options and help: captain_ros_training.cli.rl_cli):
RL rounds over an episode store with captain_ros_training.rl_trainer, the critic warm-started (CaPtain App. A.2) on
episodes that no round of the run trains on, the new weights published and synced into a running policy server after
each optimizer step, a checkpoint after each round (`--resume`), and the metrics log plotted at the end."""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captain_ros_training.metrics_log import plot_metrics
from captain_ros_training.policy_loss import ObjectiveConfig
from captain_ros_training.rl_trainer import RLConfig, RLTrainer
from captain_ros_training.rounds import RoundConfig
from captain_ros_training.sft_command import load_policy, resolve_device


def _group_of(episode: Any) -> str:
    return str(episode.start.get("group_id", episode.episode_id))


def warm_start_split(episodes: Sequence[Any], fraction: float) -> tuple[list[Any], list[Any]]:
    """(held apart for the critic's warm start, left for the RL rounds): whole start-state groups, the first
    ceil(fraction x groups) in the order of sha256(group id). Deterministic in every process and on resume,
    independent of the order in which groups were recorded (a task or a start state does not decide it), and
    sibling attempts of one start never straddle it. Needs at least one group on each side."""
    groups = sorted({_group_of(e) for e in episodes}, key=lambda g: hashlib.sha256(g.encode()).digest())
    n = math.ceil(fraction * len(groups))
    if not 0.0 < fraction < 1.0 or not 0 < n < len(groups):
        raise SystemExit(
            f"cannot hold {fraction} of {len(groups)} start-state groups apart for the critic's warm start and keep "
            "some for RL: give --critic (a trained critic) or --warm-start-store (an earlier policy's episodes)"
        )
    held = set(groups[:n])
    return [e for e in episodes if _group_of(e) in held], [e for e in episodes if _group_of(e) not in held]


def warm_start_critic(
    reader: Any, *, fraction: float = 0.25, seed: int = 0, warm_reader: Any = None
) -> tuple[Any, set[str]]:
    """The critic `cmd_rl` uses without --critic, warm-started (CaPtain App. A.2) only on episodes that no RL round
    of the run trains on. CaPtain warm-starts on 1,000 episodes of an earlier policy: with `warm_reader` (such a
    store: --warm-start-store) all its valid episodes are used; otherwise `warm_start_split` holds `fraction` of the
    RL store's groups apart. Returns the critic and the episode ids the trainer must count as used (the held-apart
    ones; with a separate store, those of its ids the RL store also holds), so the first round, and every later one,
    trains only on episodes whose labels the warm start has not seen. The task vocabulary covers both stores (a task
    name carries no label)."""
    from captain_ros_training.critic import Critic, CriticConfig, states_from_episodes

    episodes = [reader.load(eid) for eid in reader.episode_ids()]
    if warm_reader is not None:
        warm = [warm_reader.load(eid) for eid in warm_reader.episode_ids()]
        ids = {e.episode_id for e in episodes}
        held_apart = {e.episode_id for e in warm if e.episode_id in ids}
        source = "the warm-start store"
    else:
        warm, _ = warm_start_split(episodes, fraction)
        held_apart = {e.episode_id for e in warm}
        n_warm, n_all = len({_group_of(e) for e in warm}), len({_group_of(e) for e in episodes})
        source = f"{n_warm} of the store's {n_all} start-state groups, never trained on"
    tasks = tuple(sorted({e.start["task"] for e in episodes + warm}))
    states = states_from_episodes(warm, tasks)
    if not len(states):
        raise SystemExit(f"the critic's warm start has no labelled request state ({len(warm)} episodes)")
    critic = Critic(CriticConfig(tasks=tasks, seed=seed))
    critic.fit(states)
    print(f"critic warm start on {len(warm)} episodes ({len(states)} states): {source}", file=sys.stderr)
    return critic, held_apart


def cmd_rl(args: argparse.Namespace) -> int:
    """RL rounds over a store: build a round, update, co-train the critic, and sync weights after each step."""
    from tqdm import tqdm

    from captain_ros.bridge.store import EpisodeReader
    from captain_ros_training.critic import Critic
    from captain_ros_training.weight_sync import WeightSync, write_model_folder

    model, tokenizer = load_policy(args.model, args.tiny)
    ref, _ = load_policy(args.ref or args.model, args.tiny)
    device = resolve_device(args.device)
    model.to(device)
    ref.to(device)
    reader = EpisodeReader(args.store)
    held_apart: set[str] = set()
    if args.critic and Path(args.critic).exists():
        critic = Critic.load(args.critic)
    else:  # warm start on episodes no round of this run trains on (warm_start_critic)
        warm_reader = EpisodeReader(args.warm_start_store) if args.warm_start_store else None
        critic, held_apart = warm_start_critic(
            reader, fraction=args.warm_start_fraction, seed=args.seed, warm_reader=warm_reader
        )
    objective = ObjectiveConfig(objective=args.objective, episodes_per_step_n=args.episodes_per_step)
    trainer = RLTrainer(
        model,
        ref,
        critic,
        tokenizer=tokenizer,
        config=RLConfig(learning_rate=args.lr, micro_batch_tokens=args.max_tokens),
        objective=objective,
        policy_version=args.version,
        metrics_path=Path(args.out) / "rl_metrics.jsonl",
    )
    trainer.used.update(held_apart)  # the critic's warm-start episodes are never trained on
    sync = WeightSync(args.server, args.served_dir, proxy_url=args.proxy) if args.server else None
    round_config = RoundConfig(group_size_n=args.group_size, max_groups_n=args.groups_per_round)

    checkpoint = Path(args.out) / "rl_checkpoint.pt"
    if checkpoint.exists() and not args.resume:
        raise SystemExit(f"{checkpoint} exists (an earlier run): pass --resume to continue it, or use another --out")
    if args.resume and checkpoint.exists():
        trainer.load_checkpoint(checkpoint)
        print(
            f"resumed {checkpoint}: {trainer.updates} updates done, policy version {trainer.policy_version}, "
            f"{len(trainer.used)} episodes used, {trainer.pending_episodes} waiting for the next step",
            file=sys.stderr,
        )

    def publish() -> None:
        """The new policy: a servable folder, the critic, and (with --server) the running policy server."""
        write_model_folder(trainer.model, tokenizer, Path(args.out) / "model")
        trainer.critic.save(Path(args.out) / "critic.pt")
        if sync is not None:
            print(sync.sync(trainer.model, trainer.policy_version).as_dict(), file=sys.stderr)

    bar = tqdm(total=args.rounds, desc="rl", unit="round", disable=args.no_progress)
    for _ in range(args.rounds):
        round_ = trainer.build_round(reader, round_config)
        print(round_.report, file=sys.stderr)
        if not round_.groups:
            break
        row = trainer.update(round_)
        bar.update(1)
        bar.set_postfix(
            loss=f"{row.get('loss', 0):.4f}", kept=f"{row.get('kept_frac', 0):.2f}", v=trainer.policy_version
        )
        if row["stepped"]:
            publish()
        trainer.save_checkpoint(checkpoint)  # after publishing: a resumed run never re-syncs an older version
    bar.close()
    if trainer.pending_episodes:  # a last, smaller step (its gradient is rescaled to its own episode count)
        print(f"final step over {trainer.pending_episodes} accumulated episodes", file=sys.stderr)
        trainer.step()
        publish()
        trainer.save_checkpoint(checkpoint)
    metrics = Path(args.out) / "rl_metrics.jsonl"
    if metrics.exists():
        plot_metrics(metrics, Path(args.out) / "rl_metrics.png")
    return 0


__all__ = ["cmd_rl", "warm_start_critic", "warm_start_split"]

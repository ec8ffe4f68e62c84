"""The `rl` command's critic warm start: whole start-state groups held apart by sha256 of their id, never
trained on by any round; or an earlier policy's store."""

from __future__ import annotations

import pytest

from captain_ros_training.critic import FEATURE_NAMES
from captain_ros_training.policy_loss import ObjectiveConfig
from captain_ros_training.rl_command import warm_start_critic, warm_start_split
from captain_ros_training.rl_trainer import RLTrainer
from captain_ros_training.rounds import RoundConfig
from captain_ros_training.tiny import tiny_model
from tests.training.test_rl_trainer import TASK
from tests.training.test_rounds import FakeReader, synthetic_episode


def test_the_critic_warm_start_is_held_apart_from_every_round():
    """Four groups of two attempts; group k's states all have features k. sha256 order of the group ids:
    g3 (3921871a...) < g2 (4d2f4b66...) < g1 (711430f6...) < g0 (f21b0ef8...). A fraction 0.25 holds ceil(0.25 x 4)
    = 1 group apart: g3, so the critic's frozen feature mean is 3.0 (it saw only g3's states), and the first round
    trains on g0, g1, g2 only."""
    episodes = [
        synthetic_episode(f"{g}{i}", g, i, success=i == 0, features=[[float(g[1])] * len(FEATURE_NAMES)] * 3)
        for g in ("g0", "g1", "g2", "g3")
        for i in range(2)
    ]
    warm, rest = warm_start_split(episodes, 0.25)
    assert [e.episode_id for e in warm] == ["g30", "g31"]
    assert [e.episode_id for e in rest] == ["g00", "g01", "g10", "g11", "g20", "g21"]
    assert [e.episode_id for e in warm_start_split(episodes, 0.5)[0]] == ["g20", "g21", "g30", "g31"]  # 2 groups
    with pytest.raises(SystemExit, match="warm start"):
        warm_start_split(episodes[:2], 0.25)  # one group: none would be left for RL

    critic, held_apart = warm_start_critic(FakeReader(episodes), fraction=0.25)
    assert held_apart == {"g30", "g31"}
    assert critic.feature_mean.tolist() == [3.0] * len(FEATURE_NAMES)
    trainer = RLTrainer(tiny_model(), None, critic, objective=ObjectiveConfig(objective="agenticroborl"))
    trainer.used.update(held_apart)  # what cmd_rl does
    first = trainer.build_round(FakeReader(episodes), RoundConfig(group_size_n=2))
    ids = {e.episode_id for e in first.episodes}
    assert ids == {"g00", "g01", "g10", "g11", "g20", "g21"} and not ids & held_apart
    assert first.report.episodes_already_used == 2

    # an earlier policy's store: all of it warms the critic; an id the RL store also holds is never trained on
    earlier = [synthetic_episode("old0", "o", 0, success=True), synthetic_episode("g00", "o", 1, success=False)]
    critic, held_apart = warm_start_critic(FakeReader(episodes), warm_reader=FakeReader(earlier))
    assert held_apart == {"g00"} and critic.tasks == (TASK,)

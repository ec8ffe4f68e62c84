"""The simulator critic (CaPtain Eq. 3-4): features from stored episodes, training (loss falls, AUC on a separable
set), the metrics against hand values, save/load, and snapshot independence."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from captain_ros.bridge.store import Episode, RequestData
from captain_ros.twin import privileged_state
from captain_ros_training.critic import (
    FEATURE_NAMES,
    Critic,
    CriticConfig,
    CriticStates,
    auc,
    average_ranks,
    brier,
    calibration_bins,
    calibration_plot,
    evaluate,
    split_by_group,
    states_from_episodes,
    within_group_auc,
)

TASKS = ("put_red_cube_in_bowl", "open_drawer")
N_FEAT = len(FEATURE_NAMES)


def _stored(eid, group, task, rows, *, host_success=True, valid=True):
    requests = []
    for t, row in enumerate(rows, start=1):
        feats = dict(zip(FEATURE_NAMES, row, strict=True))
        step = {"snapshot": {"features": feats}, "calls": [], "costs": {"total": 0.0}}
        requests.append(RequestData(t, {"response": {}}, step))
    requests.append(RequestData(len(rows) + 1, {"response": {}}, None))  # a model call whose step never came
    end = {"valid": valid, "host_success": host_success, "reward": 1.0 if host_success else 0.0}
    return Episode(eid, {"task": task, "group_id": group}, end, requests)


def test_the_critic_reads_the_twins_feature_names_without_importing_mujoco():
    """The GPU training machine has no MuJoCo: the critic must not pull the twin in."""
    probe = (
        "import sys, captain_ros_training.critic as c; assert 'mujoco' not in sys.modules; print(len(c.FEATURE_NAMES))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "36", done.stderr
    assert FEATURE_NAMES == privileged_state.FEATURE_NAMES


def test_states_from_episodes():
    a = np.arange(2 * N_FEAT, dtype=np.float64).reshape(2, N_FEAT)
    b = -np.ones((1, N_FEAT))
    episodes = [
        _stored("e0", "g0", "open_drawer", a, host_success=True),
        _stored("bad", "g0", "open_drawer", b, valid=False),
        _stored("none", "g1", "open_drawer", b, host_success=None),
        _stored("e3", "g1", "put_red_cube_in_bowl", b, host_success=False),
    ]
    states = states_from_episodes(episodes, TASKS)
    assert len(states) == 3  # two requests of e0, one of e3; the step-less request is skipped
    np.testing.assert_array_equal(states.features.numpy(), np.concatenate([a, b]).astype(np.float32))
    assert states.t.tolist() == [1.0, 2.0, 1.0]
    assert states.task.tolist() == [1, 1, 0]
    assert states.task_onehot.tolist() == [[0, 1], [0, 1], [1, 0]]
    assert states.labels.tolist() == [1.0, 1.0, 0.0]  # every state carries its episode's host success
    assert states.episode.tolist() == [0, 0, 3]
    assert states.group.tolist() == [0, 0, 1] and states.group_ids == ["g0", "g1"]
    with pytest.raises(KeyError):
        states_from_episodes(episodes, ("open_drawer",))


def _synthetic(n_episodes=160, length=12, seed=0, tasks=TASKS):
    """Separable by construction: an episode succeeds iff its latent `progress` (feature 0, plus noise in the
    other features) is positive; requests of an episode share the label, and four episodes share a group."""
    rng = np.random.default_rng(seed)
    feats, t, task, labels, episode, group = [], [], [], [], [], []
    for e in range(n_episodes):
        progress = rng.normal()
        k = int(rng.integers(len(tasks)))
        for r in range(1, length + 1):
            row = rng.normal(scale=0.3, size=N_FEAT)
            row[0] = progress + rng.normal(scale=0.2)
            row[5] = 3.0  # a constant feature (std 0 -> normalised with std 1)
            feats.append(row)
            t.append(r)
            task.append(k)
            labels.append(float(progress > 0))
            episode.append(e)
            group.append(e // 4)
    task_t = torch.tensor(task)
    return CriticStates(
        features=torch.tensor(np.asarray(feats), dtype=torch.float32),
        t=torch.tensor(t, dtype=torch.float32),
        task=task_t,
        task_onehot=torch.nn.functional.one_hot(task_t, len(tasks)).float(),
        labels=torch.tensor(labels),
        episode=torch.tensor(episode),
        group=torch.tensor(group),
        group_ids=[f"g{i}" for i in range(max(group) + 1)],
    )


@pytest.fixture(scope="module")
def trained():
    states = _synthetic()
    train, held = split_by_group(states, 0.25, seed=0)
    critic = Critic(CriticConfig(tasks=TASKS, batch_size=256, seed=0))  # the paper's size: 5 x 3 x 256
    losses = critic.fit(states.subset(train), epochs=6)
    return critic, states, train, held, losses


def test_warm_start_loss_falls_and_held_out_auc(trained):
    critic, states, _train, held, losses = trained
    assert losses[-1] < 0.5 * losses[0]
    metrics = evaluate(critic, states.subset(held))
    assert metrics["auc"] > 0.9
    assert metrics["brier"] < 0.15
    assert set(metrics) >= {"auc", "within_group_auc", "brier", "ece"}
    # the constant feature was given std 1 instead of dividing by zero
    assert critic.feature_std[5].item() == 1.0


def test_split_keeps_groups_whole(trained):
    _critic, states, train, held, _ = trained
    assert set(states.group[train].tolist()).isdisjoint(states.group[held].tolist())
    assert int(held.sum()) == 10 * 4 * 12  # 10 of the 40 groups, 4 episodes of 12 requests each


def test_values_are_batched_chunked_and_match_the_training_path(trained):
    critic = trained[0]
    states = _synthetic(n_episodes=8, seed=5)
    v = critic.values(states)
    with torch.no_grad():
        logits = critic.model(critic.inputs(states.features, states.t, states.task))  # batched-matmul path
    np.testing.assert_allclose(v.numpy(), torch.sigmoid(logits).numpy(), atol=1e-5)
    # t_override evaluates every state at the given index (how Eq. 9 values s_{t+1} at index t)
    v3 = critic.values(states, t_override=3.0)
    expected = critic.value_of(states.features, torch.full_like(states.t, 3.0), states.task)
    np.testing.assert_allclose(v3.numpy(), expected.numpy(), atol=0)
    at3 = states.t == 3
    np.testing.assert_allclose(v3[at3].numpy(), v[at3].numpy(), atol=1e-6)


def test_co_training_takes_two_full_batch_steps_and_snapshot_is_independent(trained):
    critic = trained[0].snapshot()  # leave the module fixture untouched
    round_states = _synthetic(n_episodes=16, seed=7)
    before = critic.snapshot()
    v_before = critic.values(round_states)
    steps_before = sum(int(s["step"]) for s in critic.optimizer.state.values()) // len(critic.optimizer.state)
    losses = critic.co_train(round_states)
    steps_after = sum(int(s["step"]) for s in critic.optimizer.state.values()) // len(critic.optimizer.state)
    assert len(losses) == 2 and steps_after - steps_before == 2
    assert not torch.allclose(critic.values(round_states), v_before)
    # the snapshot taken before the update still gives the old values: round advantages use it
    assert torch.equal(before.values(round_states), v_before)
    for p, q in zip(before.model.parameters(), critic.model.parameters(), strict=True):
        assert p.data_ptr() != q.data_ptr()


def test_save_load_round_trip(trained, tmp_path):
    critic = trained[0].snapshot()
    states = _synthetic(n_episodes=8, seed=9)
    path = critic.save(tmp_path / "critic.pt")
    loaded = Critic.load(path)
    assert loaded.config == critic.config and loaded.tasks == TASKS
    assert torch.equal(loaded.feature_mean, critic.feature_mean) and torch.equal(loaded.feature_std, critic.feature_std)
    assert torch.equal(loaded.values(states), critic.values(states))
    # the optimizer state came along: one more co-training round gives identical weights
    critic.co_train(states)
    loaded.co_train(states)
    assert torch.equal(loaded.values(states), critic.values(states))


def test_untrained_critic_refuses_to_guess_a_normalisation():
    critic = Critic(CriticConfig(tasks=TASKS, members=1, hidden=8))
    with pytest.raises(RuntimeError):
        critic.values(_synthetic(n_episodes=1))
    with pytest.raises(ValueError):
        Critic(CriticConfig(tasks=()))


def test_eq3_mean_of_member_logits_and_eq4_bce_by_hand():
    """A hand-set ensemble of K = 2 one-hidden-unit MLPs on the input [x; t / 60; onehot(task)] (x normalised with
    mean 0, std 1, so x is the raw feature; t at input 36):
      f_1 = 2 relu(x_0) - 1            f_2 = relu(1 - x_0 + 6 t / 60) - 2
    states (x_0, t, y):  A (1, 10, 1)  B (0, 10, 0)  C (2, 30, 1)
      f_1 = [2 - 1, 0 - 1, 4 - 1] = [1, -1, 3];  f_2 = [relu(1) - 2, relu(2) - 2, relu(2) - 2] = [-1, 0, 0]
      mean logit (Eq. 3) = [0, -0.5, 1.5];  V = sigmoid = [0.5, 0.3775407, 0.8175745]
      (a mean of the members' sigmoids would give C (sigmoid(3) + sigmoid(0)) / 2 = 0.7262871)
    Eq. 4 (mean over states): -[log 0.5 + log(1 - 0.3775407) + log 0.8175745] / 3
      = [0.6931472 + log(1 + e^-0.5) + log(1 + e^-1.5)] / 3 = [0.6931472 + 0.4740770 + 0.2014133] / 3 = 0.4562125
    d loss / d (output bias of member k) = mean_i (V_i - y_i) / K = (-0.5 + 0.3775407 - 0.1824255) / 3 / 2
      = -0.0508141 for each member (each member's logit enters the mean with weight 1/K)."""
    critic = Critic(CriticConfig(tasks=("only",), members=2, hidden=1, layers=1))
    w1, w2 = critic.model.weights
    b1, b2 = critic.model.biases
    with torch.no_grad():
        for p in critic.model.parameters():
            p.zero_()
        w1[0, 0, 0], b1[0, 0, 0], w2[0, 0, 0], b2[0, 0, 0] = 1.0, 0.0, 2.0, -1.0  # f_1
        w1[1, 0, 0], w1[1, N_FEAT, 0], b1[1, 0, 0], w2[1, 0, 0], b2[1, 0, 0] = -1.0, 6.0, 1.0, 1.0, -2.0  # f_2
    critic.set_normalisation(torch.tensor([[-1.0] * N_FEAT, [1.0] * N_FEAT]))  # mean 0, std 1
    features = torch.zeros(3, N_FEAT)
    features[:, 0] = torch.tensor([1.0, 0.0, 2.0])
    task = torch.zeros(3, dtype=torch.int64)
    states = CriticStates(
        features, torch.tensor([10.0, 10.0, 30.0]), task, torch.ones(3, 1), torch.tensor([1.0, 0.0, 1.0]),
        torch.arange(3), torch.zeros(3, dtype=torch.int64), ["g"],
    )  # fmt: skip
    x = critic.inputs(states.features, states.t, states.task)
    torch.testing.assert_close(critic.model.member_logits(x), torch.tensor([[1.0, -1.0, 3.0], [-1.0, 0.0, 0.0]]))
    assert critic.model(x).tolist() == pytest.approx([0.0, -0.5, 1.5], abs=1e-6)
    assert critic.values(states).tolist() == pytest.approx([0.5, 0.3775407, 0.8175745], abs=1e-6)
    loss = critic.loss(states)
    assert loss.item() == pytest.approx(0.4562125, abs=1e-6)
    loss.backward()
    assert b2.grad[:, 0, 0].tolist() == pytest.approx([-0.0508141, -0.0508141], abs=1e-6)
    assert critic.co_train(states, steps=1) == pytest.approx([0.4562125], abs=1e-6)  # co-training's Eq. 4


# ---------------------------------------------------------------------- metrics against hand values
def test_auc_hand_values():
    # positives 0.35, 0.8; negatives 0.1, 0.4. Pairs won by the positive: (0.35>0.1), (0.8>0.1), (0.8>0.4);
    # lost: (0.35<0.4) -> 3/4
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    # with a tie: positives 0.5, 0.9; negatives 0.5, 0.2. (0.5 vs 0.5) counts 1/2, the other three pairs 1 each
    # -> 3.5 / 4 = 0.875
    assert auc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == pytest.approx(0.875)
    # ranks with ties share their mean: [0.5, 0.5, 0.2, 0.9] -> [2.5, 2.5, 1, 4]
    assert average_ranks(np.array([0.5, 0.5, 0.2, 0.9])).tolist() == [2.5, 2.5, 1.0, 4.0]
    assert auc([0.3, 0.3, 0.3], [1, 0, 1]) == pytest.approx(0.5)  # all tied
    assert math.isnan(auc([0.1, 0.2], [1, 1]))  # one class only


def test_auc_equals_the_pairwise_definition_on_random_data_with_ties():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 6, 60) / 5.0  # many ties
    y = rng.random(60) < 0.4
    pos, neg = s[y], s[~y]
    pairwise = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
    assert auc(s, y) == pytest.approx(pairwise / (len(pos) * len(neg)))


def test_within_group_auc_and_brier_hand_values():
    scores = [0.1, 0.4, 0.35, 0.8, 0.3, 0.6, 0.9, 0.7]
    labels = [0, 0, 1, 1, 1, 0, 1, 1]
    groups = [0, 0, 0, 0, 1, 1, 2, 2]
    # group 0: 0.75 (above); group 1: positive 0.3 < negative 0.6 -> 0; group 2: positives only -> skipped
    assert within_group_auc(scores, labels, groups) == pytest.approx((0.75 + 0.0) / 2)
    assert math.isnan(within_group_auc([0.2, 0.4], [1, 1], [0, 1]))
    # (0.9 - 1)^2 + (0.2 - 0)^2 + (0.6 - 0)^2 = 0.01 + 0.04 + 0.36 = 0.41, mean 0.136667
    assert brier([0.9, 0.2, 0.6], [1, 0, 0]) == pytest.approx(0.41 / 3)


def test_calibration_bins_and_plot(tmp_path):
    # bins of width 0.1: 0.05 -> bin 0 (rate 0), 0.15 and 0.12 -> bin 1 (mean 0.135, rate 0.5), 0.95 -> bin 9 (1)
    table = calibration_bins([0.05, 0.15, 0.12, 0.95], [0, 1, 0, 1], bins=10)
    assert table["count"][[0, 1, 9]].tolist() == [1, 2, 1] and table["count"].sum() == 4
    assert table["mean_pred"][1] == pytest.approx(0.135) and table["rate"][1] == pytest.approx(0.5)
    # ECE = (1 * |0 - 0.05| + 2 * |0.5 - 0.135| + 1 * |1 - 0.95|) / 4 = (0.05 + 0.73 + 0.05) / 4 = 0.2075
    assert table["ece"] == pytest.approx(0.2075)
    path = calibration_plot([0.05, 0.15, 0.12, 0.95], [0, 1, 0, 1], tmp_path / "plots" / "calibration.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

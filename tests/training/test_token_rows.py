"""captain_ros_training.token_rows: untrained output rows are found by their likeness to the padding rows, the fit's
loss is the exact full-softmax cross-entropy, and fitting a row makes its token likely where it is the target and leaves
the other targets as they were."""

from __future__ import annotations

import torch

from captain_ros_training.data import IGNORE
from captain_ros_training.token_rows import FitConfig, fit_rows, prepare, row_loss, untrained_rows


def _head(seed: int = 0, d: int = 16) -> torch.Tensor:
    """An lm_head of 40 rows: 0-29 trained (random), 30-39 one untrained vector (two markers, eight padding rows)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(40, d, generator=g)
    w[30:] = torch.randn(d, generator=g) * 0.1
    return w


def test_untrained_rows_are_the_candidates_with_many_twins():
    w = _head()
    assert untrained_rows(w, [1, 5, 30, 31], min_twins=8) == [30, 31]  # each has 9 twins
    assert untrained_rows(w, [30, 31], min_twins=10) == []
    w[31] *= 1.05  # a row of another norm is no twin
    assert untrained_rows(w, [30, 31], min_twins=8) == [30]


def test_the_fit_loss_is_the_full_softmax_cross_entropy():
    w = _head()
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(50, 16, generator=g)
    targets = torch.randint(0, 30, (50,), generator=g)
    targets[::5] = 30
    free = [30, 31]
    data = prepare(w, [(hidden, targets)], free)
    rows = torch.randn(2, 16, generator=g)
    full = w.clone()
    full[free] = rows
    expected = torch.nn.functional.cross_entropy(hidden @ full.T, targets)
    loss, stats = row_loss(rows, data, free)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert stats["free_targets"] == 10 and stats["positions"] == 50


def test_fitting_makes_the_untrained_token_likely_where_it_is_the_target_only():
    w = _head()
    g = torch.Generator().manual_seed(2)
    cue = torch.randn(16, generator=g)  # the hidden state before the marker carries a direction of its own
    hidden = torch.randn(400, 16, generator=g)
    targets = (hidden @ w[:30].T).argmax(1)  # elsewhere the frozen head is right
    marker = torch.arange(400) % 8 == 0
    hidden[marker] += 3 * cue
    targets[marker] = 30
    targets[1] = IGNORE
    keep = targets != IGNORE
    free = untrained_rows(w, targets[keep].tolist(), min_twins=8)
    assert free == [30]
    data = prepare(w, [(hidden[keep], targets[keep])], free)
    before = row_loss(w[free], data, free)[1]
    rows = fit_rows(w, data, free, FitConfig(steps=500, learning_rate=5e-2))
    after = row_loss(rows, data, free)[1]
    assert before["nll_free_targets"] > 3.0 and after["nll_free_targets"] < 0.1
    assert after["nll_other_targets"] < before["nll_other_targets"] + 0.01
    full = w.clone()
    full[free] = rows
    predicted = (hidden[keep] @ full.T).argmax(1)
    assert bool((predicted == targets[keep]).float().mean() > 0.97)


def test_apply_puts_the_saved_rows_into_a_copy_of_the_folder(tmp_path):
    import numpy as np
    from transformers import AutoModelForCausalLM

    from captain_ros_training.tiny import tiny_model
    from captain_ros_training.token_rows import ROWS_FILE, apply_rows

    model = tiny_model()
    model.save_pretrained(tmp_path / "merged")
    head = model.get_output_embeddings().weight.detach()
    rows = torch.randn(2, head.shape[1]).to(torch.bfloat16)
    np.savez(tmp_path / ROWS_FILE, ids=np.array([3, 7]), rows=rows.float().numpy())
    out = apply_rows(tmp_path / "merged", tmp_path / ROWS_FILE, tmp_path / "model")
    applied = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).get_output_embeddings().weight
    torch.testing.assert_close(applied[[3, 7]], rows, rtol=0, atol=0)
    torch.testing.assert_close(applied[:3], head[:3].to(torch.bfloat16), rtol=0, atol=0)  # the rest as it was
    assert (out / ROWS_FILE).is_file() and not (tmp_path / "model.partial").exists()
    assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]  # vLLM loads every one as weights

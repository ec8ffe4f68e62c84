"""The SFT objective (CaPtain Eq. 2 with AgenticRoboRL's global token normalisation) and its training loop on the
tiny model: hand-computed losses, packed == one by one, accumulation == one big batch, weights, a falling loss
and an exact resume."""

from __future__ import annotations

import math

import pytest
import torch

from captain_ros.bridge.store import EpisodeReader
from captain_ros_training import data, sft
from captain_ros_training.data import Example
from captain_ros_training.sft import SFTConfig
from captain_ros_training.tiny import TinyModelConfig, tiny_model, tiny_tokenizer
from tests.training.test_data import build_store

PAD = 0


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> list[Example]:
    path = tmp_path_factory.mktemp("sft") / "episodes.sqlite"
    build_store(path)
    reader = EpisodeReader(path)
    try:
        config = data.DataConfig(mark_point_mask_prob=0.0, whole_episodes=False)  # many short documents to pack
        return data.sft_examples(tiny_tokenizer(), reader, config=config)
    finally:
        reader.close()


def synthetic(n: int, prompt: int, weight: float = 1.0, seed: int = 0) -> Example:
    ids = torch.randint(3, 2000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return Example(ids, [i >= prompt for i in range(n)], weight, prompt)


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def loss_and_grads(model, batches, config, denominator=None):
    model.zero_grad(set_to_none=True)
    denominator = sft.token_denominator(batches) if denominator is None else denominator
    total = 0.0
    for b in batches:
        loss = sft.micro_batch_loss(model, b, denominator, config)
        loss.backward()
        total += loss.detach().item()
    return total, grads(model)


def assert_grads_close(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=name)


# ------------------------------------------------------------------------------------------------ by hand
def test_sft_loss_by_hand():
    # two target positions over a 2-token vocabulary: p(target) = 1/2 and e^2 / (1 + e^2)
    logits = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    targets = torch.tensor([1, 1])
    nll = [math.log(2.0), math.log(1 + math.exp(-2.0))]
    weights = torch.tensor([1.0, 0.5])
    # Eq. 2 weighted sum over the global denominator (say 4 response tokens in the whole step)
    expected = (1.0 * nll[0] + 0.5 * nll[1]) / 4
    assert float(sft.sft_loss(logits, targets, weights, 4)) == pytest.approx(expected, rel=1e-6)
    assert float(sft.sft_loss(logits, targets, torch.zeros(2), 4)) == 0.0


def test_denominator_counts_weighted_response_tokens_of_all_micro_batches():
    a = {"token_weights": torch.tensor([[0.0, 1.0, 1.0, 0.0]])}
    b = {"token_weights": torch.tensor([[0.5, 0.0], [1.0, 1.0]])}
    assert sft.token_denominator([a, b]) == 2 + 3


def test_unit_weights_reproduce_the_transformers_causal_lm_loss():
    model = tiny_model().eval()
    ex = synthetic(12, 5)
    rows, _ = data.pack_examples([ex], 64)
    batch = data.collate(rows, PAD)
    loss = sft.micro_batch_loss(model, batch, sft.token_denominator([batch]), SFTConfig())
    labels = torch.tensor([[-100 if not m else i for i, m in zip(ex.input_ids, ex.response_mask, strict=True)]])
    with torch.no_grad():
        reference = model(torch.tensor([ex.input_ids]), labels=labels).loss
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)


# ------------------------------------------------------------------------------------------------ packing
@pytest.mark.parametrize(("attn", "attention"), [("sdpa", "mask"), ("sdpa", "position_ids"), ("eager", "mask")])
def test_packed_loss_and_gradients_equal_the_examples_run_one_by_one(examples, attn, attention):
    model = tiny_model(TinyModelConfig(attn_implementation=attn))
    config = SFTConfig(attention=attention)
    chosen = examples[:4]
    rows, too_long = data.pack_examples(chosen, max_tokens=4096)
    assert not too_long and len(rows) == 1 and len(rows[0].examples) == 4  # all four share one row
    packed = [data.collate(rows, PAD, length=len(rows[0]) + 7)]  # with padding at the end
    singles = [data.collate(data.pack_examples([ex], 4096)[0], PAD) for ex in chosen]
    denominator = sft.token_denominator(packed)
    assert denominator == sum(ex.response_tokens for ex in chosen)  # every response token is a target
    loss_packed, grads_packed = loss_and_grads(model, packed, config)
    loss_single, grads_single = loss_and_grads(model, singles, config, denominator)
    assert loss_packed == pytest.approx(loss_single, rel=1e-5)
    assert_grads_close(grads_packed, grads_single)
    # without the block mask the documents would see each other: the loss changes, by far more than the packed
    # and one-by-one losses differ (fp32 summation order)
    leaky = [{**packed[0], "attention_mask": torch.zeros_like(packed[0]["attention_mask"]).triu(1) * -1e9}]
    if attention == "mask":
        noise = abs(loss_packed - loss_single)
        assert abs(loss_and_grads(model, leaky, config)[0] - loss_packed) > max(100 * noise, 1e-5 * loss_packed)


# ------------------------------------------------------------------------------------------------ normalisation
def test_accumulated_micro_batches_give_the_gradient_of_one_big_batch():
    model = tiny_model()
    config = SFTConfig()
    small = [synthetic(6, 2, seed=1)]  # 4 target tokens
    large = [synthetic(20, 3, seed=2), synthetic(9, 4, seed=3)]  # 17 + 5 target tokens
    micro = [data.collate(data.pack_examples(small, 64)[0], PAD), data.collate(data.pack_examples(large, 64)[0], PAD)]
    one = [data.collate(data.pack_examples(small + large, 64)[0], PAD)]
    assert sft.token_denominator(micro) == sft.token_denominator(one) == 4 + 17 + 5
    loss_micro, g_micro = loss_and_grads(model, micro, config)
    loss_one, g_one = loss_and_grads(model, one, config)
    assert loss_micro == pytest.approx(loss_one, rel=1e-5)
    assert_grads_close(g_micro, g_one)
    # a per-micro-batch mean (the usual mistake) would weight the 4-token micro-batch like the 22-token one
    with torch.no_grad():
        means = [sft.micro_batch_loss(model, b, sft.token_denominator([b]), config).item() for b in micro]
    mean_of_means = sum(means) / 2
    assert abs(mean_of_means - loss_one) > 1e-3


def test_zero_weight_rows_contribute_nothing_and_vqa_rows_count_half():
    model = tiny_model()
    config = SFTConfig()
    kept = synthetic(10, 4, seed=4)
    dropped = synthetic(12, 3, weight=0.0, seed=5)
    with_zero = [data.collate(data.pack_examples([kept, dropped], 64)[0], PAD)]
    without = [data.collate(data.pack_examples([kept], 64)[0], PAD)]
    assert sft.token_denominator(with_zero) == sft.token_denominator(without) == 6
    _, g_with = loss_and_grads(model, with_zero, config)
    _, g_without = loss_and_grads(model, without, config)
    assert_grads_close(g_with, g_without)
    half = synthetic(10, 4, weight=0.5, seed=4)
    with torch.no_grad():
        loss_half = sft.micro_batch_loss(model, data.collate(data.pack_examples([half], 64)[0], PAD), 6, config).item()
        loss_full = sft.micro_batch_loss(model, without[0], 6, config).item()
    assert loss_half == pytest.approx(0.5 * loss_full, rel=1e-6)


# ------------------------------------------------------------------------------------------------ training
def test_sft_loss_falls_on_a_fixed_batch(examples, capsys):
    rows, _ = data.pack_examples(examples[:2], 2048)  # ~1k tokens, 130 targets
    batches = [data.collate(rows, PAD)]
    config = SFTConfig(max_steps=20, learning_rate=3e-3, progress=False)
    result = sft.train_sft(tiny_model(), batches, config)
    losses = [m["loss"] for m in result.metrics]
    assert len(losses) == 20 and losses[-1] < 0.5 * losses[0], losses
    # without a progress bar (background runs) one log line per twentieth of the run says where it is
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"sft step {i}/20" for i in range(1, 21)]
    assert f"loss {losses[-1]:.4f}" in lines[-1] and "tokens/s" in lines[-1] and "about 0 s left" in lines[-1]
    assert set(result.metrics[0]) >= {"step", "loss", "tokens", "lr", "grad_norm"}
    assert result.metrics[0]["tokens"] == sum(ex.response_tokens for ex in examples[:2])


def test_the_fast_path_trains_like_the_transformers_forward(examples):
    """SFTConfig.fast swaps the forward and the loss (captain_ros_training.fast): the same optimizer steps follow."""
    from captain_ros_training.fast import FastConfig

    rows, _ = data.pack_examples(examples[:2], 2048)
    batches = [data.collate(rows, PAD)]
    base = dict(max_steps=3, learning_rate=1e-3, progress=False, shuffle=False)
    plain = sft.train_sft(tiny_model(), batches, SFTConfig(**base))
    fast = sft.train_sft(tiny_model(), batches, SFTConfig(fast=FastConfig(), **base))
    assert [m["loss"] for m in fast.metrics] == pytest.approx([m["loss"] for m in plain.metrics], rel=1e-4)
    # Adam moves an element whose gradient is near its eps by anything in (-lr, lr): two fp32 paths whose losses agree
    # to 1e-7 can move such an element by a few per cent of lr (1.4e-5 was seen after the first step); a wrong
    # gradient moves elements by up to lr every step
    for (name, a), (_, b) in zip(plain.model.named_parameters(), fast.model.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=0.05 * base["learning_rate"]), name


def test_training_n_steps_equals_k_then_resume_for_n_minus_k(tmp_path):
    exs = [synthetic(8 + 3 * i, 3, seed=10 + i) for i in range(6)]
    batches = [data.collate(data.pack_examples(exs[i : i + 2], 64)[0], PAD) for i in range(0, 6, 2)]
    base = dict(learning_rate=1e-3, warmup_steps=2, grad_accum_steps=2, progress=False, shuffle=True, seed=7)
    straight = sft.train_sft(tiny_model(), batches, SFTConfig(max_steps=5, **base))
    first = sft.train_sft(tiny_model(), batches, SFTConfig(max_steps=2, checkpoint_dir=str(tmp_path), **base))
    assert (tmp_path / "checkpoint.pt").is_file() and first.state.position == 4
    torch.manual_seed(999)  # disturb the global RNG: the checkpoint must restore it
    other_init = tiny_model(TinyModelConfig(seed=3))
    resumed = sft.train_sft(other_init, batches, SFTConfig(max_steps=5, **base), resume_from=tmp_path / "checkpoint.pt")
    assert resumed.state.step == 5 and resumed.state.position == 10
    assert [m["step"] for m in resumed.metrics] == [3, 4, 5]
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert [m["loss"] for m in straight.metrics[2:]] == [m["loss"] for m in resumed.metrics]
    assert [m["lr"] for m in straight.metrics] == pytest.approx([1 / 3 * 1e-3, 2 / 3 * 1e-3, 1e-3, 1e-3, 1e-3])


def test_each_epoch_is_a_seeded_permutation_of_the_micro_batches():
    config = SFTConfig(seed=3)
    epochs = [[sft.batch_index(e * 5 + i, 5, config) for i in range(5)] for e in range(3)]
    assert all(sorted(order) == list(range(5)) for order in epochs)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]
    assert [sft.batch_index(p, 5, SFTConfig(shuffle=False)) for p in range(7)] == [0, 1, 2, 3, 4, 0, 1]


@pytest.mark.parametrize("fast", [False, True], ids=["transformers", "fast"])
def test_untrained_output_rows_are_trained_beside_lora_and_merge_with_the_adapter(tmp_path, fast):
    """A target token whose lm_head row the base never trained (it equals many others) is out of LoRA's reach: with
    SFTConfig.trainable_rows that row trains beside the adapters at its own rate (peft trainable_token_indices),
    the twins stay as they were, and the saved adapter carries the row into the merged model."""
    peft = pytest.importorskip("peft")
    from transformers import Qwen2ForCausalLM

    from captain_ros_training.fast import FastConfig
    from captain_ros_training.token_rows import untrained_rows

    def untied() -> Qwen2ForCausalLM:
        config = tiny_model().config
        config.tie_word_embeddings = False  # as the student's head is
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # the target and 20 twins share one vector, as the student's marker rows do
            model.lm_head.weight[1980:2001] = model.lm_head.weight[1979]
        return model

    ex = synthetic(12, 4, seed=21)
    ex.input_ids[8] = 1990  # a target position (past the prompt) holds the untrained token
    batches = [data.collate(data.pack_examples([ex], 64)[0], PAD, mask=not fast)]
    model = untied()
    before = model.lm_head.weight.detach().clone()
    assert untrained_rows(before, [1990, 1500]) == [1990]
    config = SFTConfig(
        max_steps=4, learning_rate=1e-3, lora_rank=4, trainable_rows=(1990,), rows_learning_rate=5e-2,
        fast=FastConfig() if fast else None, progress=False,
    )  # fmt: skip
    result = sft.train_sft(model, batches, config)
    head = result.model.get_output_embeddings().weight.detach()
    assert not torch.equal(head[1990], before[1990])  # trained
    assert torch.equal(head[1980:1990], before[1980:1990]) and torch.equal(head[1991:2001], before[1991:2001])
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    result.model.save_pretrained(tmp_path / "adapter")
    merged = peft.PeftModel.from_pretrained(untied(), tmp_path / "adapter").merge_and_unload()
    torch.testing.assert_close(merged.lm_head.weight[1990], head[1990])
    assert torch.equal(merged.lm_head.weight[1991], before[1991])


def test_lora_trains_only_the_adapters():
    pytest.importorskip("peft")
    exs = [synthetic(10, 4, seed=20)]
    batches = [data.collate(data.pack_examples(exs, 64)[0], PAD)]
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = SFTConfig(max_steps=3, learning_rate=1e-2, lora_rank=4, progress=False)
    result = sft.train_sft(model, batches, config)
    changed = {n for n, p in result.model.named_parameters() if "lora_" in n and p.requires_grad}
    assert changed and result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    base = result.model.get_base_model()
    for name, p in base.named_parameters():
        if "lora_" not in name and name.replace("base_layer.", "") in before:
            assert torch.equal(p, before[name.replace("base_layer.", "")]), name


def test_the_learning_rate_warms_up_then_holds_or_follows_a_cosine_worked_by_hand():
    """Warm-up 2, 7 steps: (s+1)/3 for s < 2; then constant 1, or cosine from 1 (step 2) to 0.1 (step 6):
    0.1 + 0.9 x (1 + cos(pi x (s-2)/4)) / 2 = 1, 0.8682, 0.55, 0.2318, 0.1."""
    from captain_ros_training.sft import lr_factor

    constant = SFTConfig(max_steps=7, warmup_steps=2)
    assert [lr_factor(s, constant) for s in range(7)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1, 1])
    cosine = SFTConfig(max_steps=7, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1)
    want = [1 / 3, 2 / 3, 1.0, 0.1 + 0.45 * (1 + 0.5**0.5), 0.55, 0.1 + 0.45 * (1 - 0.5**0.5), 0.1]
    assert [lr_factor(s, cosine) for s in range(7)] == pytest.approx(want)
    assert want[3] == pytest.approx(0.8682, abs=1e-4) and want[5] == pytest.approx(0.2318, abs=1e-4)
    assert lr_factor(10, cosine) == pytest.approx(0.1)  # past the last step: stays at the floor
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor(3, SFTConfig(lr_schedule="linear"))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_rng_state_comes_back_exactly_from_a_checkpoint_loaded_onto_any_device(tmp_path, device):
    """A checkpoint loaded with map_location=<the model's device> brings the RNG tensors back on that device (on the
    GPU host an RL resume failed so: "can't convert cuda:0 device type tensor to numpy"); set_rng_state takes them
    wherever they are and the generators continue exactly as they would have."""
    import random

    import numpy as np
    import torch

    from captain_ros_training.sft import rng_state, set_rng_state

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.save({"rng": rng_state()}, tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(torch.load(tmp_path / "rng.pt", map_location=device, weights_only=True)["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected

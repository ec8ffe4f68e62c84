"""The fast SFT path equals the reference: the chunked fused linear + cross-entropy against
captain_ros_training.sft.sft_loss (loss and gradients, ignored tokens, per-token weights, global denominator, by hand on
a 3-token vocabulary), the packed attention against one-document-at-a-time runs, and the whole fast micro-batch loss
against captain_ros_training.sft.micro_batch_loss on the tiny Qwen2, gradients of every parameter included (fp32,
CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from captain_ros_training import data, fast, sft
from captain_ros_training.data import IGNORE, Example
from captain_ros_training.sft import SFTConfig
from captain_ros_training.tiny import tiny_model

PAD = 0


def synthetic(n: int, prompt: int, weight: float = 1.0, seed: int = 0) -> Example:
    ids = torch.randint(3, 2000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return Example(ids, [i >= prompt for i in range(n)], weight, prompt)


def packed_batch() -> dict:
    """Two rows of 40 tokens: documents of 17 + 23 and 11 + 19 (+ 10 padding), weights 1, 0.5, 0, 1."""
    examples = [synthetic(17, 5, 1.0, 1), synthetic(23, 9, 0.5, 2), synthetic(11, 4, 0.0, 3), synthetic(19, 6, 1.0, 4)]
    rows = [data.PackedRow(), data.PackedRow()]
    for i, ex in enumerate(examples):
        rows[i // 2].add(ex, i)
    return data.collate(rows, PAD, length=40)


# ------------------------------------------------------------------------------------------------ linear + CE
def test_linear_cross_entropy_by_hand():
    """h = 0 gives uniform logits over V = 3: each kept token costs log 3. Weights (1, 0.5, 2 (ignored)),
    denominator 2: loss = (1 + 0.5) log 3 / 2; d loss / d W row v = sum_i s_i (1/3 - [v = y_i]) h_i = 0 at h = 0."""
    hidden = torch.zeros(3, 4, requires_grad=True)
    weight = torch.zeros(3, 4, requires_grad=True)
    targets = torch.tensor([0, 2, IGNORE])
    loss = fast.linear_cross_entropy(hidden, weight, targets, torch.tensor([1.0, 0.5, 2.0]), 2, chunk_tokens=2)
    assert loss.item() == pytest.approx(1.5 * math.log(3) / 2, rel=1e-6)
    loss.backward()
    assert torch.count_nonzero(weight.grad) == 0
    # d loss / d h_i = s_i * sum_v (p_v - [v = y_i]) W_v = 0 with W = 0
    assert torch.count_nonzero(hidden.grad) == 0


def test_linear_cross_entropy_gradient_by_hand():
    """One token, V = 2, d = 1, h = 1, W = [[a], [b]] = [[1], [0]]: p = softmax(1, 0), target 1, weight 1,
    denominator 4. loss = -log p_1 / 4 = log(1 + e) / 4; d/dW_0 = p_0 h / 4, d/dW_1 = (p_1 - 1) h / 4,
    d/dh = (p_0 a + (p_1 - 1) b) / 4."""
    hidden = torch.ones(1, 1, requires_grad=True)
    weight = torch.tensor([[1.0], [0.0]], requires_grad=True)
    loss = fast.linear_cross_entropy(hidden, weight, torch.tensor([1]), torch.tensor([1.0]), 4)
    loss.backward()
    p0 = math.e / (1 + math.e)
    assert loss.item() == pytest.approx(math.log(1 + math.e) / 4, rel=1e-6)
    assert weight.grad[:, 0].tolist() == pytest.approx([p0 / 4, (1 - p0 - 1) / 4], rel=1e-6)
    assert hidden.grad.item() == pytest.approx(p0 / 4, rel=1e-6)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64])
def test_linear_cross_entropy_equals_sft_loss(chunk_tokens):
    """Against captain_ros_training.sft.sft_loss on full logits: ignored targets, weights 0 / 0.5 / 1 / 2, a global
    denominator larger than the kept tokens (as with gradient accumulation), an upstream gradient of 3."""
    g = torch.Generator().manual_seed(0)
    n, d, vocab = 37, 16, 50
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, d, generator=g, dtype=torch.float64) * 0.5
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[::5] = IGNORE
    weights = torch.tensor([0.0, 0.5, 1.0, 2.0])[torch.randint(0, 4, (n,), generator=g)]
    weights[targets == IGNORE] = 0.0
    denominator = 61

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    kept = targets != IGNORE
    ref = sft.sft_loss((h1 @ w1.T)[kept], targets[kept], weights[kept], denominator)
    (3 * ref).backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = fast.linear_cross_entropy(h2, w2, targets, weights, denominator, chunk_tokens=chunk_tokens)
    (3 * loss).backward()
    torch.testing.assert_close(loss.double(), ref.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-6, atol=1e-7)


def test_linear_token_logprobs_equal_log_softmax():
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(9, 8, generator=g), torch.randn(30, 8, generator=g)
    targets = torch.randint(0, 30, (9,), generator=g)
    targets[3] = IGNORE
    got = fast.linear_token_logprobs(hidden, weight, targets, chunk_tokens=4)
    ref = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1)
    assert math.isnan(got[3].item())
    keep = targets != IGNORE
    torch.testing.assert_close(got[keep], ref[keep], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ attention
def test_packed_attention_equals_documents_one_by_one():
    """Documents of 5, 1 and 8 tokens, 4 query heads on 2 kv heads: each document alone through causal SDPA."""
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(14, 4, 8, generator=g), torch.randn(14, 2, 8, generator=g), torch.randn(14, 2, 8, generator=g)
    cu = torch.tensor([0, 5, 6, 14], dtype=torch.int32)
    got = fast.packed_attention(q, k, v, cu, 8, backend="sdpa")
    for a, b in [(0, 5), (5, 6), (6, 14)]:
        qd = q[a:b].transpose(0, 1)
        kd = k[a:b].repeat_interleave(2, 1).transpose(0, 1)
        vd = v[a:b].repeat_interleave(2, 1).transpose(0, 1)
        scores = (qd @ kd.transpose(1, 2)) / math.sqrt(8)
        scores = scores.masked_fill(~torch.ones(b - a, b - a, dtype=torch.bool).tril(), float("-inf"))
        ref = (scores.softmax(-1) @ vd).transpose(0, 1)
        torch.testing.assert_close(got[a:b], ref, rtol=1e-5, atol=1e-5)
    # the single-token document attends only to itself: its output is its own value, head h on kv head h // 2
    torch.testing.assert_close(got[5], v[5].repeat_interleave(2, 0))


def test_bucket_plan_by_hand():
    """Documents of 5, 1 and 8 tokens, padded to multiples of 4 (8, 4, 8): min_fill 0.8 puts the two of padded
    length 8 in one bucket [[6..13], [0..4, 0, 0, 0]] (padded slots -> the document's first token) and the 1-token
    document alone in [[5, 5, 5, 5]]; token t's row in the concatenated slots: doc 3 at 0..7, doc 1 at 8..12,
    doc 2 at 16."""
    plan = fast.bucket_plan([0, 5, 6, 14], multiple=4, min_fill=0.8)
    assert plan.shapes == ((2, 8), (1, 4))
    assert plan.gather.tolist() == [*range(6, 14), 0, 1, 2, 3, 4, 0, 0, 0, 5, 5, 5, 5]
    assert plan.real.tolist() == [True] * 13 + [False] * 3 + [True] + [False] * 3
    assert plan.inverse.tolist() == [8, 9, 10, 11, 12, 16, 0, 1, 2, 3, 4, 5, 6, 7]
    # min_fill 0.4 also takes the length-4 document into the first bucket
    assert fast.bucket_plan([0, 5, 6, 14], multiple=4, min_fill=0.4).shapes == ((3, 8),)


@pytest.mark.parametrize("min_fill", [0.0, 0.8, 1.0])
def test_bucketed_attention_equals_per_document_attention(min_fill):
    """The padded, bucketed call gives the per-document SDPA output and gradients (math backend, fp64): padded keys
    sit after every real query of their document (hidden by the causal mask), padded queries are dropped."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(3)
    shapes = [(30, 4, 8), (30, 2, 8), (30, 2, 8)]
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes)
    cu = torch.tensor([0, 5, 6, 19, 30], dtype=torch.int32)
    plan = fast.bucket_plan(cu.tolist(), multiple=4, min_fill=min_fill)
    grad_out = torch.randn(30, 4, 8, generator=g, dtype=torch.float64)
    results = []
    with sdpa_kernel(SDPBackend.MATH):
        for backend, p in [("sdpa", None), ("bucketed", plan)]:
            out = fast.packed_attention(q, k, v, cu, 13, backend=backend, plan=p)
            grads = torch.autograd.grad(out, (q, k, v), grad_out)
            results.append((out, *grads))
    for ref, got in zip(*results, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_split_rms_norm_equals_rms_norm():
    """compile_norms=False splits RMSNorm into its eager reduction and a pointwise rest: bit-identical in bf16."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 32, generator=g).to(torch.bfloat16)
    w = torch.randn(32, generator=g).to(torch.bfloat16)
    split = fast._rms_scale(x, fast._mean_square(x), w, 1e-6)
    assert torch.equal(split, fast.rms_norm(x, w, 1e-6))
    # the custom backward of the reduction: d mean(x^2) / dx = 2 x / d (d = 32), as autograd's
    x32 = torch.randn(3, 32, generator=g, requires_grad=True)
    grad_out = torch.randn(3, 1, generator=g)
    (got,) = torch.autograd.grad(fast._MeanSquare.apply(x32), x32, grad_out)
    (ref,) = torch.autograd.grad(x32.pow(2).mean(-1, keepdim=True), x32, grad_out)
    torch.testing.assert_close(got, x32.detach() * grad_out * 2 / 32, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_packed_hidden_equals_per_document_runs(model):
    batch = packed_batch()
    with torch.no_grad():
        hidden = fast.packed_hidden(
            model, batch["input_ids"], batch["position_ids"], batch["cu_seqlens"], batch["max_seqlen"]
        ).view(2, 40, -1)
        for row, spans in enumerate([[(0, 17), (17, 40)], [(0, 11), (11, 30)]]):
            for a, b in spans:
                alone = model.get_decoder()(input_ids=batch["input_ids"][row : row + 1, a:b]).last_hidden_state[0]
                torch.testing.assert_close(hidden[row, a:b], alone, rtol=1e-5, atol=1e-5)


def test_fast_token_logprobs_equal_model_logits(model):
    batch = packed_batch()
    got = fast.fast_token_logprobs(model, batch, fast.FastConfig(chunk_tokens=16))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"][0:1, :17]).logits[0]
    ref = torch.log_softmax(logits, -1)
    targets = batch["targets"][0, :17]
    for i in range(17):
        if targets[i] == IGNORE:
            assert math.isnan(got[0, i].item())
        else:
            assert got[0, i].item() == pytest.approx(ref[i, targets[i]].item(), abs=1e-5)
    assert torch.isnan(got[1, 30:]).all()  # padding carries no target


@pytest.mark.parametrize(
    ("attention", "fused"),
    [("sdpa", True), ("bucketed", True), ("bucketed", False)],
    ids=["sdpa", "bucketed", "unfused"],
)
def test_fast_loss_and_gradients_equal_sft_reference(model, attention, fused):
    """fast_micro_batch_loss == captain_ros_training.sft.micro_batch_loss (4D block-causal mask path) on a packed batch
    with weights 1 / 0.5 / 0 and a global denominator of two micro-batches: loss and every parameter's gradient."""
    batch = packed_batch()
    denominator = sft.token_denominator([batch, batch])

    model.zero_grad(set_to_none=True)
    ref = sft.micro_batch_loss(model, batch, denominator, SFTConfig(attention="mask"))
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    config = fast.FastConfig(chunk_tokens=13, attention=attention, fuse_qkv=fused, fuse_gate_up=fused)
    loss = fast.fast_micro_batch_loss(model, batch, denominator, config)
    loss.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    model.zero_grad(set_to_none=True)


def lora_model(seed: int = 0, **lora: object):
    """The tiny Qwen2 under peft LoRA adapters whose B is random (peft starts B at 0, where any merge is exact)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": list(sft.LORA_TARGETS), **lora}
    model = get_peft_model(tiny_model(), LoraConfig(**config))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return model


@pytest.mark.parametrize("attention", ["sdpa", "bucketed"])
def test_fast_lora_loss_and_adapter_gradients_equal_peft_forward(attention):
    """Through LoRA adapters (W + s B A merged per step, captain_ros_training.fast.linear_weight) the fast loss and
    every trainable adapter's gradient equal peft's own forward (x W^T + s (x A^T) B^T) on the 4D-mask path; the frozen
    base weights get no gradient on either path."""
    model = lora_model()
    batch = packed_batch()
    denominator = sft.token_denominator([batch, batch])
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)

    ref = sft.micro_batch_loss(model, batch, denominator, SFTConfig(attention="mask"))
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in trainable.items()}
    model.zero_grad(set_to_none=True)

    loss = fast.fast_micro_batch_loss(model, batch, denominator, fast.FastConfig(chunk_tokens=13, attention=attention))
    loss.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for name, p in trainable.items():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)


def test_fast_lora_sft_steps_equal_the_transformers_forward():
    """Two optimizer steps of train_sft with LoRA: the fast path and the transformers forward end on the same
    adapter weights (the same loss each step), and a fresh adapter (B = 0) starts where the base model is."""
    batches = [packed_batch(), packed_batch()]
    runs = []
    for fast_config in (None, fast.FastConfig(chunk_tokens=16, attention="sdpa")):
        config = SFTConfig(
            max_steps=2, grad_accum_steps=2, lora_rank=4, lora_alpha=8, progress=False, fast=fast_config,
            attention="mask", learning_rate=1e-3, warmup_steps=0,
        )  # fmt: skip
        result = sft.train_sft(tiny_model(), batches, config)
        lora = {n: p.detach().clone() for n, p in result.model.named_parameters() if "lora_" in n}
        runs.append(([row["loss"] for row in result.metrics], lora))
    (ref_losses, ref_lora), (losses, lora) = runs
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert lora.keys() == ref_lora.keys() and lora
    for name in lora:
        torch.testing.assert_close(lora[name], ref_lora[name], rtol=1e-4, atol=1e-6, msg=name)


def test_fast_path_refuses_lora_it_cannot_merge():
    """Dropout (a different mask per token, not one merged weight), DoRA and an adapter on the embeddings are named
    as the reason; plain LoRA on the projections is not refused, and train_sft refuses before any step."""
    assert fast.unsupported_reason(lora_model()) is None
    assert "dropout 0.1" in fast.unsupported_reason(lora_model(lora_dropout=0.1))
    assert "DoRA" in fast.unsupported_reason(lora_model(use_dora=True))
    reason = fast.unsupported_reason(lora_model(target_modules=["q_proj", "embed_tokens"]))
    assert "embed_tokens" in reason
    config = SFTConfig(max_steps=1, lora_rank=4, lora_dropout=0.1, progress=False, fast=fast.FastConfig())
    with pytest.raises(ValueError, match="dropout"):
        sft.train_sft(tiny_model(), [packed_batch()], config)


# ------------------------------------------------------------------------------------------------ where it applies
def test_the_fast_path_applies_to_qwen2_only_and_the_cli_sft_takes_it_there(monkeypatch):
    """captain_ros_training.fast re-implements a Qwen2 layer: it applies to the tiny Qwen2, not to a sliding-window
    Qwen2 (its forward raises) nor to another architecture (Llama here); the command-line SFT
    (captain_ros_training.sft_command) takes it for full fine-tuning on a GPU where it applies, and the transformers
    forward otherwise."""
    import argparse

    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from captain_ros_training.sft_command import _fast_applies

    qwen = tiny_model()
    small = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    heads = {"num_attention_heads": 2, "num_key_value_heads": 1}
    sliding = Qwen2ForCausalLM(Qwen2Config(**small, **heads, use_sliding_window=True, sliding_window=8))
    llama = LlamaForCausalLM(LlamaConfig(**small, **heads))
    assert fast.unsupported_reason(qwen) is None
    assert "sliding-window" in fast.unsupported_reason(sliding)
    assert "'llama'" in fast.unsupported_reason(llama)
    with pytest.raises(NotImplementedError, match="sliding-window"):  # what the check keeps the CLI from
        fast.packed_hidden(sliding, torch.zeros(1, 4, dtype=torch.long), torch.arange(4)[None], torch.tensor([0, 4]), 4)

    full, lora = argparse.Namespace(lora_rank=0), argparse.Namespace(lora_rank=4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only consulted, nothing runs on a GPU
    assert _fast_applies(qwen, full)
    assert _fast_applies(qwen, lora)
    assert not _fast_applies(sliding, full) and not _fast_applies(llama, full)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not _fast_applies(qwen, full)


def test_cached_attention_aligns_each_requests_queries_to_the_end_of_its_keys():
    """Requests with 1, 3 and 5 new tokens over caches of 4, 3 and 9 keys: each query row equals a full causal
    forward of that request's whole sequence at its position (the reference backend; varlen is CUDA only)."""
    torch.manual_seed(0)
    lens_q, lens_k = [1, 3, 5], [4, 3, 9]
    q = torch.randn(sum(lens_q), 4, 8)
    k, v = torch.randn(sum(lens_k), 2, 8), torch.randn(sum(lens_k), 2, 8)
    cu_q, cu_k = torch.tensor([0, 1, 4, 9]), torch.tensor([0, 4, 7, 16])
    got = fast.cached_attention(q, k, v, cu_q, cu_k, 5, 9, backend="sdpa")
    for i in range(3):
        qa, ka = cu_q[i].item(), cu_k[i].item()
        for j in range(lens_q[i]):
            seen = lens_k[i] - lens_q[i] + j + 1  # keys up to and including the query's own position
            kk, vv = (x[ka : ka + seen].repeat_interleave(2, dim=1) for x in (k, v))
            scores = torch.einsum("hd,thd->ht", q[qa + j], kk) / 8**0.5
            want = torch.einsum("ht,thd->hd", scores.softmax(-1), vv)
            torch.testing.assert_close(got[qa + j], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="attention backend"):
        fast.cached_attention(q, k, v, cu_q, cu_k, 5, 9, backend="dense")

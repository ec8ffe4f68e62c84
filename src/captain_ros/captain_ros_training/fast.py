"""The fast SFT path for Qwen2-family models: packed varlen attention and a chunked fused linear + cross-entropy.

Same objective as captain_ros_training.sft (CaPtain Eq. 2 with AgenticRoboRL's global token normalisation), computed
faster:

* No logits tensor. A plain step materialises [tokens, vocab] logits (8k x 151,936 in bf16 is 2.5 GB per row,
  twice that once upcast for the loss), which caps the micro-batch. `linear_cross_entropy` walks the target
  positions in chunks: per chunk it computes the logits, their log-sum-exp, the loss term and, in the same pass,
  the gradients w.r.t. the hidden states and the output embedding (softmax - one-hot, times w_i / denominator);
  backward only scales what forward stored by the incoming gradient. Peak memory is one chunk of logits.
* Packed rows without cross-document attention. The batch is flattened to [tokens] and each document attends only
  to itself through `cu_seqlens` (captain_ros_training.data.collate): flash-attention varlen (torch.nn.attention.varlen)
  on CUDA, one causal SDPA call per document elsewhere; no [L, L] mask is built and no padding is attended.
  Or "bucketed": documents padded to a multiple of 64 and grouped by length, one batched causal SDPA call per
  group ([n_docs, heads, L, d], the kernel the plain step gets: cuDNN on the H200). Exact: a document's padded
  keys come after all of its real queries, so the causal mask hides them, and padded queries are dropped (their
  zero output gradient sends nothing back).
* Fewer, larger GEMMs: q/k/v projections as one matmul, gate/up as one; optionally `torch.compile` of the two
  halves of a decoder layer (norm + projections + RoPE, and o_proj + residual + norm + SwiGLU MLP), which fuses
  the memory-bound elementwise work; the attention call stays outside the compiled regions.

The forward runs on the weights of an unmodified transformers Qwen2ForCausalLM (the same module the plain path and
checkpoints use) and reproduces its arithmetic op for op (RMSNorm in fp32, RoPE from the model's own rotary
module), so the two paths differ only by kernel rounding; bench/train_gpu.py measures that against the plain
path's own run-to-run noise (CaPtain Appendix F's numerical gate).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint
from torch.nn.functional import linear, scaled_dot_product_attention, silu

from captain_ros_training import kernels

IGNORE = -100  # captain_ros_training.data.IGNORE


@dataclass(frozen=True)
class FastConfig:
    chunk_tokens: int = 8192  # target positions per linear + cross-entropy chunk (peak memory: chunk x vocab fp32)
    attention: str = "auto"  # "auto" (varlen on CUDA when available, else per document) | "varlen" | "sdpa"
    # | "bucketed" (documents padded to a multiple of pad_multiple, one batched causal SDPA call per length bucket)
    compile: bool = False  # torch.compile the two halves of each decoder layer (regional compilation)
    compile_norms: bool = True  # with compile: False keeps the RMSNorms eager (compiles only GEMM + pointwise parts)
    pad_multiple: int = 64  # "bucketed": each document's padded length is a multiple of this
    bucket_min_fill: float = 0.8  # "bucketed": a document joins a bucket if its padded length >= this x the bucket's
    fuse_qkv: bool = True  # one GEMM for q, k and v (False: three; no faster on the H200)
    # one GEMM for the MLP's gate and up projections; False (two GEMMs) was 2 % faster on the H200, where the fused
    # projection's backward spent 1.4 ms per layer concatenating the gate and up gradients
    fuse_gate_up: bool = False
    bf16: bool = True  # autocast to bf16 on CUDA (as captain_ros_training.sft); a bf16 model runs in bf16 regardless
    # recompute each decoder layer in backward (torch.utils.checkpoint, non-reentrant): a layer's input is all that is
    # kept, about 1.7 KB a token for the 0.5B student instead of ~1.2 MB over its 24 layers, so an RL row of a 32k-token
    # request fits beside a policy server's KV cache (captain_ros_training.rl_host)
    checkpoint_layers: bool = False


# ------------------------------------------------------------------------------------------------ the loss
def _chunk_terms(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One chunk of CaPtain Eq. 2: log p(target) (fp32) and d loss / d logits = scale * (softmax - onehot) in the
    logits' dtype (computed in fp32; one fused kernel when compiled).
    `scale` = w_i / denominator; rows with an IGNORE target must have scale 0 (their gradient is then 0)."""
    out_dtype = logits.dtype
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    safe = targets.clamp(min=0)
    logp = logits.gather(-1, safe[:, None]).squeeze(-1) - lse
    grad = torch.exp(logits - lse[:, None])
    grad.scatter_add_(-1, safe[:, None], -torch.ones_like(lse)[:, None])
    return logp, (grad * scale[:, None]).to(out_dtype)


def _exact_casts() -> None:
    """Make Inductor round intermediates to bf16 where eager does (`emulate_precision_casts`), so a compiled
    region keeps eager's arithmetic; without it fused RMSNorm/RoPE skip roundings and move log-probabilities
    (the gate CaPtain App. F applies; torch.compile failed it there)."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "emulate_precision_casts"):
        inductor_config.emulate_precision_casts = True


@functools.cache
def _compiled_chunk_terms() -> Any:
    _exact_casts()
    return torch.compile(_chunk_terms, dynamic=False)


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * -log softmax(h_i W^T)[y_i] / denominator with the gradients computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale, chunk_tokens, compute_dtype, compiled):  # noqa: PLR0917 (apply's order)
        h = hidden.to(compute_dtype)
        w = weight.to(compute_dtype)
        fp32_accumulate = compiled and kernels.available(h.device) and h.dtype in (torch.bfloat16, torch.float16)
        if compiled and kernels.available(h.device):
            terms = kernels.cross_entropy_grad_
        else:
            terms = _compiled_chunk_terms() if compiled else _chunk_terms
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, h.shape[0], chunk_tokens):
            stop = min(start + chunk_tokens, h.shape[0])
            logits = h[start:stop] @ w.T  # the plain path's lm_head in the same dtype
            if terms is kernels.cross_entropy_grad_:  # in place: the logits become the gradient
                logp, grad = terms(logits, targets[start:stop], scale[start:stop]), logits
            else:
                logp, grad = terms(logits, targets[start:stop], scale[start:stop])
            loss -= (logp * scale[start:stop]).sum()
            grad_h[start:stop] = grad @ w
            if fp32_accumulate:  # cuBLAS adds the chunk's bf16 product into the fp32 sum (beta = 1): no rounding
                torch.ops.aten.addmm.dtype_out(grad_w, grad.T, h[start:stop], torch.float32, out=grad_w)
            else:
                grad_w += (grad.T @ h[start:stop]).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        grad_hidden = (grad_h.float() * grad_loss).to(h_dtype) if ctx.needs_input_grad[0] else None
        grad_weight = (grad_w * grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    denominator: float,
    *,
    chunk_tokens: int = 4096,
    compute_dtype: torch.dtype | None = None,
    compiled: bool = False,
) -> torch.Tensor:
    """CaPtain Eq. 2 with global token normalisation, sum_i w_i * (-log p(y_i | h_i)) / denominator, where
    p = softmax(h_i W^T), without materialising the [N, vocab] logits. `hidden` [N, d], `weight` [V, d] (lm_head,
    possibly tied to the embedding), `targets` [N] (IGNORE allowed: weight it 0), `weights` [N]. Equals
    captain_ros_training.sft.sft_loss(hidden @ weight.T, targets, weights, denominator), gradients included."""
    weights = torch.where(targets == IGNORE, torch.zeros_like(weights), weights)
    scale = weights.float() / max(float(denominator), 1.0)
    dtype = compute_dtype or hidden.dtype
    return _LinearCrossEntropy.apply(hidden, weight, targets, scale, chunk_tokens, dtype, compiled)


@torch.no_grad()
def linear_token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int = 4096
) -> torch.Tensor:
    """log p(y_i | h_i) for each row (fp32, chunked; NaN where the target is IGNORE): the quantity the numerical
    gate compares (CaPtain Appendix F) and the policy loss consumes (Eq. 8 ratios)."""
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    w = weight.to(hidden.dtype)
    for start in range(0, hidden.shape[0], chunk_tokens):
        logits = (hidden[start : start + chunk_tokens] @ w.T).float()
        t = targets[start : start + chunk_tokens]
        logp = logits.gather(-1, t.clamp(min=0)[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        out[start : start + chunk_tokens] = torch.where(t == IGNORE, torch.full_like(logp, float("nan")), logp)
    return out


# ------------------------------------------------------------------------------------------------ attention
@functools.cache
def _varlen() -> tuple[Any, dict, bool] | None:
    """torch's flash varlen attention and how this torch version asks for causal masking / GQA (the signature
    moved between 2.10 (`is_causal`) and later versions (`window_size=(-1, 0)`, `enable_gqa`))."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in params


def varlen_available() -> bool:
    return _varlen() is not None and torch.cuda.is_available()


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[T, Hkv, D] -> [T, Hkv * groups, D], query head h using kv head h // groups (transformers' repeat_kv)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


@dataclass(frozen=True)
class BucketPlan:
    """Where each packed token sits in the padded per-bucket layout (see `bucket_plan`): slots are the
    concatenation of every bucket's [n_docs, L] padded documents, flattened."""

    shapes: tuple[tuple[int, int], ...]  # per bucket (n_docs, L)
    gather: torch.Tensor  # [slots]: flat token index of each slot (padded slots: the document's first token)
    inverse: torch.Tensor  # [T]: slot of token t
    real: torch.Tensor  # [slots] bool: slot holds a real token (not padding)


def bucket_plan(
    cu_seqlens: list[int], *, multiple: int = 64, min_fill: float = 0.8, device: torch.device | str = "cpu"
) -> BucketPlan:
    """Group the documents of a packed batch into length buckets: each document is padded to a multiple of
    `multiple`; going from the longest down, a bucket of padded length L takes every document whose padded length
    is >= min_fill * L (padding costs at most 1 / min_fill^2 of that document's attention work). Padded slots
    point at the document's first token (any real token works: the causal mask hides them)."""
    docs = sorted(
        ((b - a, a) for a, b in itertools.pairwise(cu_seqlens) if b > a), key=lambda d: (-d[0], d[1])
    )  # fmt: skip
    inverse = torch.empty(cu_seqlens[-1] if cu_seqlens else 0, dtype=torch.long)
    shapes, gathers, reals, offset, i = [], [], [], 0, 0
    while i < len(docs):
        length = -(-docs[i][0] // multiple) * multiple
        j = i
        while j < len(docs) and -(-docs[j][0] // multiple) * multiple >= min_fill * length:
            j += 1
        slots = torch.arange(length)
        for n, (size, start) in enumerate(docs[i:j]):
            gathers.append(start + torch.where(slots < size, slots, torch.zeros_like(slots)))
            reals.append(slots < size)
            inverse[start : start + size] = offset + n * length + slots[:size]
        shapes.append((j - i, length))
        offset += (j - i) * length
        i = j
    gather = torch.cat(gathers) if gathers else torch.empty(0, dtype=torch.long)
    real = torch.cat(reals) if reals else torch.empty(0, dtype=torch.bool)
    return BucketPlan(tuple(shapes), gather.to(device), inverse.to(device), real.to(device))


class _Permute(torch.autograd.Function):
    """y = x[index] where `index` is a permutation up to padding: the backward is the gather by the inverse map
    (one index_select) instead of an accumulating scatter. `back_mask` (or None) zeroes gradient rows that have no
    source (padded slots); rows of x that `index` repeats must get zero gradient through the copies (as padded
    keys and queries do under the causal mask: exact)."""

    @staticmethod
    def forward(ctx, x, index, back_index, back_mask):
        ctx.save_for_backward(back_index, back_mask)
        ctx.has_mask = back_mask is not None
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        back_index, back_mask = ctx.saved_tensors
        g = grad.index_select(0, back_index)
        if ctx.has_mask:
            g = g * back_mask.view(-1, *([1] * (g.dim() - 1))).to(g.dtype)
        return g, None, None, None


def _bucketed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BucketPlan) -> torch.Tensor:
    """One causal SDPA call per bucket on [n_docs, H, L, D]; the default backend choice (cuDNN on the H200, as
    for the plain step's SDPA), math on CPU."""
    groups = q.shape[1] // k.shape[1]
    qs, ks, vs = (_Permute.apply(x, plan.gather, plan.inverse, None) for x in (q, k, v))  # [slots, H(kv), D]
    sizes = [n * length for n, length in plan.shapes]
    outs = []
    for (n, length), qf, kf, vf in zip(plan.shapes, qs.split(sizes), ks.split(sizes), vs.split(sizes), strict=True):
        qb = qf.view(n, length, *q.shape[1:]).transpose(1, 2)
        kb, vb = (_repeat_kv(x, groups).view(n, length, q.shape[1], -1).transpose(1, 2) for x in (kf, vf))
        out = scaled_dot_product_attention(qb, kb, vb, is_causal=True)  # [n, H, L, D]
        outs.append(out.transpose(1, 2).reshape(n * length, q.shape[1], v.shape[2]))
    slots = torch.cat(outs) if len(outs) > 1 else outs[0]
    return _Permute.apply(slots, plan.inverse, plan.gather, plan.real)


_FLASH_DTYPES = (torch.float16, torch.bfloat16)  # what flash attention (varlen_attn) takes


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    backend: str,
    plan: BucketPlan | None = None,
) -> torch.Tensor:
    """Causal attention within each document of a flattened packed batch: q [T, H, D], k/v [T, Hkv, D],
    document i = tokens cu_seqlens[i]:cu_seqlens[i+1]. No token sees another document (captain_ros_training.data
    packing). backend "varlen": one flash varlen call; "sdpa": one causal SDPA call per document (CPU, reference);
    "bucketed": one batched causal SDPA call per length bucket (`plan`, computed from cu_seqlens if None)."""
    groups = q.shape[1] // k.shape[1]
    if backend == "auto":
        backend = "varlen" if q.is_cuda and q.dtype in _FLASH_DTYPES and _varlen() is not None else "sdpa"
    if backend == "bucketed":
        if plan is None:
            plan = bucket_plan(cu_seqlens.tolist(), device=q.device)
        return _bucketed_attention(q, k, v, plan)
    if backend == "varlen":
        found = _varlen()
        if found is None:
            raise RuntimeError("torch.nn.attention.varlen.varlen_attn is not available in this torch")
        varlen_attn, causal, gqa = found
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        if gqa:
            return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, enable_gqa=True, **causal)
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, **causal)
    if backend != "sdpa":
        raise ValueError(f"attention backend must be 'auto', 'varlen', 'sdpa' or 'bucketed', not {backend!r}")
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    outs = []
    for a, b in itertools.pairwise(cu_seqlens.tolist()):
        qd, kd, vd = (x[a:b].transpose(0, 1)[None] for x in (q, k, v))  # [1, H, s, D]
        outs.append(scaled_dot_product_attention(qd, kd, vd, is_causal=True)[0].transpose(0, 1))
    return torch.cat(outs)


def cached_attention(  # noqa: PLR0917 (varlen_attn's argument order)
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal attention of a batch of requests over their KV caches (serving: captain_ros_training.hf_serve): request
    i's new tokens are queries q[cu_q[i]:cu_q[i+1]] ([Tq, H, D]) and attend to its keys k[cu_k[i]:cu_k[i+1]] ([Tk, Hkv,
    D]: its cached past, then the new tokens themselves), the causal mask aligned bottom-right (query j of n sees the
    first Lk - n + j + 1 keys). Query rows past cu_q[-1] (padding) are left unspecified. backend "varlen": one flash
    varlen call on CUDA, work proportional to each request's own context; "sdpa": one SDPA call per request, the
    reference (any device); "auto": varlen where available, else sdpa."""
    if backend == "auto":
        backend = "varlen" if q.is_cuda and q.dtype in _FLASH_DTYPES and _varlen() is not None else "sdpa"
    groups = q.shape[1] // k.shape[1]
    if backend == "varlen":
        found = _varlen()
        if found is None:
            raise RuntimeError("torch.nn.attention.varlen.varlen_attn is not available in this torch")
        varlen_attn, causal, gqa = found
        cu_q, cu_k = (c.to(device=q.device, dtype=torch.int32) for c in (cu_q, cu_k))
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # transformers hands over transposed views
        if gqa:
            return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, enable_gqa=True, **causal)
        return varlen_attn(q, _repeat_kv(k, groups), _repeat_kv(v, groups), cu_q, cu_k, max_q, max_k, **causal)
    if backend != "sdpa":
        raise ValueError(f"attention backend must be 'auto', 'varlen' or 'sdpa', not {backend!r}")
    out = torch.zeros_like(q)
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    for (qa, qb), (ka, kb) in zip(itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True):
        if qb == qa:
            continue
        mask = torch.ones(qb - qa, kb - ka, dtype=torch.bool, device=q.device).tril(diagonal=(kb - ka) - (qb - qa))
        qd, kd, vd = q[qa:qb].transpose(0, 1)[None], k[ka:kb].transpose(0, 1)[None], v[ka:kb].transpose(0, 1)[None]
        out[qa:qb] = scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)[0].transpose(0, 1)
    return out


def cached_attention_self_check(device: str | torch.device, dtype: torch.dtype = torch.bfloat16) -> float:
    """The largest difference between the varlen and the reference backends of `cached_attention` on random
    requests whose queries are fewer than their keys (decode steps and prefill chunks over a cache): a check that
    this torch's flash varlen aligns the causal mask bottom-right, as serving needs. CUDA only."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    lens_q, lens_k = [1, 7, 1, 32], [40, 7, 129, 300]
    heads, kv_heads, dim = 4, 2, 64
    q = torch.randn(sum(lens_q), heads, dim, generator=gen).to(device, dtype)
    k, v = (torch.randn(sum(lens_k), kv_heads, dim, generator=gen).to(device, dtype) for _ in range(2))
    cu_q, cu_k = (
        torch.tensor([0, *itertools.accumulate(x)], dtype=torch.int32, device=device) for x in (lens_q, lens_k)
    )
    args = (q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
    got = cached_attention(*args, backend="varlen").float()  # (serving passes transposed views: made contiguous)
    want = cached_attention(*args, backend="sdpa").float()
    return float((got - want).abs().max())


# ------------------------------------------------------------------------------------------------ the decoder
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm exactly: normalise in fp32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qkv_rope(h, qkv_w, *, qkv_b, cos, sin, heads: int, kv_heads: int, head_dim: int):
    """q/k/v projection and RoPE of the normalised input h [T, d] -> q, k, v. `qkv_w` / `qkv_b` are the fused
    [q; k; v] weight and bias (one GEMM) or triples (three GEMMs: no concatenated gradient in the backward)."""
    if isinstance(qkv_w, tuple):
        q, k, v = (linear(h, w, b) for w, b in zip(qkv_w, qkv_b, strict=True))
    else:
        qkv = linear(h, qkv_w, qkv_b)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(-1, heads, head_dim)
    k = k.view(-1, kv_heads, head_dim)
    v = v.view(-1, kv_heads, head_dim)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q, k, v


def attention_in(x, norm_w, qkv_w, *, qkv_b, cos, sin, eps: float, heads: int, kv_heads: int, head_dim: int):
    """First half of a Qwen2 decoder layer: RMSNorm, fused q/k/v projection, RoPE. x [T, d] -> q, k, v."""
    h = rms_norm(x, norm_w, eps)
    return qkv_rope(h, qkv_w, qkv_b=qkv_b, cos=cos, sin=sin, heads=heads, kv_heads=kv_heads, head_dim=head_dim)


def out_residual(x, attn, o_w):
    """o_proj + residual."""
    return x + linear(attn.reshape(x.shape[0], -1), o_w)


def swiglu_residual(x, h, *, gate_up_w, down_w):
    """SwiGLU MLP of the normalised h, + residual x: `gate_up_w` is the fused [gate; up] weight (one GEMM) or the
    pair (gate, up) (two GEMMs; the backward then needs no concatenated gradient)."""
    if isinstance(gate_up_w, tuple):
        gate, up = linear(h, gate_up_w[0]), linear(h, gate_up_w[1])
    else:
        gate, up = linear(h, gate_up_w).chunk(2, dim=-1)
    return x + linear(silu(gate) * up, down_w)


def attention_out_mlp(x, attn, o_w, *, norm_w, gate_up_w, down_w, eps: float):
    """Second half: o_proj + residual, RMSNorm, SwiGLU MLP (fused gate/up projection) + residual."""
    x = out_residual(x, attn, o_w)
    return swiglu_residual(x, rms_norm(x, norm_w, eps), gate_up_w=gate_up_w, down_w=down_w)


@functools.cache
def _layer_fns(compiled: bool, norms: bool = True) -> tuple[Any, Any]:
    """The two halves of a decoder layer: eager, compiled whole, or (norms=False) compiled around eager RMSNorms
    (the norms' fp32 reductions then keep eager's summation order)."""
    if not compiled:
        return attention_in, attention_out_mlp
    _exact_casts()
    if norms:
        return torch.compile(attention_in, dynamic=False), torch.compile(attention_out_mlp, dynamic=False)
    c_qkv, c_out, c_mlp = (torch.compile(f, dynamic=False) for f in (_normed_qkv_rope, out_residual, _normed_swiglu))

    def first(x, norm_w, qkv_w, *, eps, **kw):
        return c_qkv(x, _MeanSquare.apply(x), norm_w, qkv_w, eps=eps, **kw)

    def second(x, attn, o_w, *, norm_w, gate_up_w, down_w, eps):
        x = c_out(x, attn, o_w)
        return c_mlp(x, _MeanSquare.apply(x), norm_w, gate_up_w=gate_up_w, down_w=down_w, eps=eps)

    return first, second


def _square(x: torch.Tensor) -> torch.Tensor:
    return x.float().pow(2)


@functools.cache
def _compiled_square() -> Any:
    return torch.compile(_square, dynamic=False)


def _mean_square(x: torch.Tensor) -> torch.Tensor:
    """RMSNorm's one reduction, mean(x^2) in fp32, kept eager so its summation order is eager's. The squares
    (exact fp32 products, whichever kernel forms them) come from one compiled kernel on CUDA instead of eager's
    cast + pow pair, which wrote and re-read two fp32 copies of x; the mean is eager's own reduction kernel."""
    return (_compiled_square() if x.is_cuda else _square)(x).mean(-1, keepdim=True)


def _mean_square_grad(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """d mean(x^2) / dx = 2 x / d, times the incoming gradient (fp32, cast to x's dtype)."""
    return (x.float() * (grad * (2.0 / x.shape[-1]))).to(x.dtype)


@functools.cache
def _compiled_mean_square_grad() -> Any:
    return torch.compile(_mean_square_grad, dynamic=False)


class _MeanSquare(torch.autograd.Function):
    """`_mean_square` with eager's forward (the log-probabilities the gate compares depend on its summation order)
    and a one-kernel compiled backward (gradients only need to be right, not bit-equal to eager autograd's)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _mean_square(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (_compiled_mean_square_grad() if x.is_cuda else _mean_square_grad)(x, grad)


def _rms_scale(x, mean_square, weight, eps: float):
    """The pointwise rest of Qwen2RMSNorm given mean(x^2) (as rms_norm: fp32, cast back, then scale)."""
    return weight * (x.float() * torch.rsqrt(mean_square + eps)).to(x.dtype)


def _normed_qkv_rope(x, mean_square, norm_w, qkv_w, *, eps: float, **kw):
    return qkv_rope(_rms_scale(x, mean_square, norm_w, eps), qkv_w, **kw)


def _normed_swiglu(x, mean_square, norm_w, *, gate_up_w, down_w, eps: float):
    return swiglu_residual(x, _rms_scale(x, mean_square, norm_w, eps), gate_up_w=gate_up_w, down_w=down_w)


def packed_hidden(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    config: FastConfig = FastConfig(),
) -> torch.Tensor:
    """Final hidden states [T, d] of a transformers Qwen2 causal LM on a packed batch flattened to T tokens
    (input_ids/position_ids [B, L] or [T]; cu_seqlens over the flattened batch, as captain_ros_training.data.collate
    gives)."""
    core = model.get_decoder()
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    eps = cfg.rms_norm_eps
    if getattr(cfg, "use_sliding_window", False):
        raise NotImplementedError("sliding-window attention is not supported by the fast path")
    ids = input_ids.reshape(-1)
    x = core.embed_tokens(ids)
    cos, sin = core.rotary_emb(x[None], position_ids.reshape(1, -1).to(ids.device))
    cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, D] against q/k [T, H, D]
    first, second = _layer_fns(config.compile, config.compile_norms)
    attention = config.attention
    if attention == "auto":
        attention = "varlen" if x.is_cuda and _varlen() is not None else "sdpa"
    plan = None
    if attention == "bucketed":  # one host sync per forward, not per layer
        plan = bucket_plan(
            cu_seqlens.tolist(), multiple=config.pad_multiple, min_fill=config.bucket_min_fill, device=x.device
        )

    def decoder_layer(x: torch.Tensor, layer: Any) -> torch.Tensor:
        a, mlp = layer.self_attn, layer.mlp
        qkv_w = (linear_weight(a.q_proj), linear_weight(a.k_proj), linear_weight(a.v_proj))
        qkv_b = (_base(a.q_proj).bias, _base(a.k_proj).bias, _base(a.v_proj).bias)
        if config.fuse_qkv:
            qkv_w = torch.cat(qkv_w)
            qkv_b = torch.cat(qkv_b) if all(b is not None for b in qkv_b) else None
        q, k, v = first(
            x, layer.input_layernorm.weight, qkv_w, qkv_b=qkv_b, cos=cos, sin=sin, eps=eps, heads=heads,
            kv_heads=kv_heads, head_dim=head_dim,
        )  # fmt: skip
        attn = packed_attention(q, k, v, cu_seqlens, max_seqlen, backend=attention, plan=plan)
        gate_up_w = (linear_weight(mlp.gate_proj), linear_weight(mlp.up_proj))
        if config.fuse_gate_up:
            gate_up_w = torch.cat(gate_up_w)
        return second(
            x, attn, linear_weight(a.o_proj), norm_w=layer.post_attention_layernorm.weight, gate_up_w=gate_up_w,
            down_w=linear_weight(mlp.down_proj), eps=eps,
        )  # fmt: skip

    recompute = config.checkpoint_layers and torch.is_grad_enabled()
    for layer in core.layers:
        if recompute:
            x = torch.utils.checkpoint.checkpoint(decoder_layer, x, layer, use_reentrant=False)
        else:
            x = decoder_layer(x, layer)
    return rms_norm(x, core.norm.weight, eps)


def _base(module: Any) -> Any:
    """The plain nn.Linear under a peft LoRA layer (the module itself when it is not wrapped)."""
    return getattr(module, "base_layer", module)


def linear_weight(module: Any) -> torch.Tensor:
    """The weight a projection applies: its own, or for a peft LoRA layer W + scaling x B @ A of each active
    adapter. The fast path multiplies by this merged weight, so LoRA costs two small GEMMs per projection and step
    (896 x 32 x 896 for the 0.5B student at rank 32) instead of two extra token-sized GEMMs per projection and
    micro-batch; autograd sends W's gradient on to A and B. With dropout 0 (`unsupported_reason` refuses other
    values) it is the same function as peft's x W^T + s (x A^T) B^T, and under bf16 autocast it computes W + s B A
    in bf16, as the merged model the student is served as (peft's merge_and_unload) does."""
    base = _base(module)
    if base is module:
        return module.weight
    weight = base.weight
    for name in module.active_adapters:
        if name in module.lora_A:
            delta = module.lora_B[name].weight @ module.lora_A[name].weight
            weight = weight + (delta * module.scaling[name]).to(weight.dtype)
    return weight


_LINEARS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


def _lora_reason(model: Any) -> str | None:
    """Why the fast path cannot train `model`'s peft adapters, or None: LoRA (not DoRA or another peft method) on
    the decoder's linear projections only, without dropout (`linear_weight` merges A and B into W)."""
    for name, cfg in model.peft_config.items():
        kind = str(getattr(cfg, "peft_type", ""))
        if not kind.endswith("LORA") or kind.endswith("ADALORA"):
            return f"peft adapter {name!r} is {kind}, not LoRA"
        if getattr(cfg, "use_dora", False):
            return f"peft adapter {name!r} uses DoRA"
        if getattr(cfg, "lora_dropout", 0.0):
            return f"peft adapter {name!r} has LoRA dropout {cfg.lora_dropout} (the fast path merges B A into W)"
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and name.rsplit(".", 1)[-1] not in _LINEARS:
            return f"a LoRA adapter on {name} (the fast path adapts only the decoder's linear projections)"
    return None


def unsupported_reason(model: Any) -> str | None:
    """Why this path cannot stand in for the transformers forward of `model`, or None when it can: it re-implements a
    Qwen2 decoder layer op for op (no q/k norms as in Qwen3, no sliding window; `packed_hidden`), on the model's own
    weights or through LoRA adapters on its linear projections (`linear_weight`)."""
    if hasattr(model, "peft_config") and (reason := _lora_reason(model)):
        return reason
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type != "qwen2":
        return f"model type {model_type!r}: the fast path implements Qwen2 only"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention is not implemented by the fast path"
    return None


def _autocast(model: Any, config: FastConfig) -> torch.autocast:
    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and config.bf16)


def _packed_forward(model: Any, batch: dict, device: torch.device, config: FastConfig) -> tuple[torch.Tensor, Any]:
    """The packed batch's final hidden states, and the dtype they were computed in (bf16 under autocast)."""
    with _autocast(model, config):
        hidden = packed_hidden(
            model,
            batch["input_ids"].to(device),
            batch["position_ids"].to(device),
            batch["cu_seqlens"].to(device),
            int(batch["max_seqlen"]),
            config=config,
        )
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
    return hidden, dtype


def fast_micro_batch_loss(model: Any, batch: dict, denominator: float, config: FastConfig = FastConfig()) -> Any:
    """This micro-batch's term of the step's SFT loss (CaPtain Eq. 2, global denominator), equal to
    captain_ros_training.sft.micro_batch_loss on the same batch; a drop-in for it in
    captain_ros_training.sft.sft_step."""
    device = next(model.parameters()).device
    weights = batch["token_weights"].to(device).reshape(-1)
    targets = batch["targets"].to(device).reshape(-1)
    selected = weights > 0
    hidden, dtype = _packed_forward(model, batch, device, config)
    weight = model.get_output_embeddings().weight
    return linear_cross_entropy(
        hidden[selected], weight, targets[selected], weights[selected], denominator,
        chunk_tokens=config.chunk_tokens, compute_dtype=dtype, compiled=config.compile,
    )  # fmt: skip


@torch.no_grad()
def fast_token_logprobs(model: Any, batch: dict, config: FastConfig = FastConfig()) -> torch.Tensor:
    """log p(target_i) at every position of the packed batch, [B, L] fp32, NaN where targets is IGNORE."""
    device = next(model.parameters()).device
    hidden, dtype = _packed_forward(model, batch, device, config)
    weight = model.get_output_embeddings().weight
    targets = batch["targets"].to(device)
    logp = linear_token_logprobs(
        hidden.to(dtype), weight.to(dtype), targets.reshape(-1), chunk_tokens=config.chunk_tokens
    )
    return logp.view(targets.shape)

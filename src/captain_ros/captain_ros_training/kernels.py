"""Triton kernels for the fast SFT path (CUDA only; captain_ros_training.fast falls back to torch where Triton is
missing).

`cross_entropy_grad_`: one chunk of CaPtain Eq. 2's token loss and its gradient, in place. Given bf16 logits
[N, V] (the lm_head GEMM's output), target ids and per-row scales w_i / denominator, it returns
log p(y_i) = z_i[y_i] - logsumexp(z_i) in fp32 and overwrites the logits with d loss / d z = scale_i *
(softmax(z_i) - onehot(y_i)). One program per row streams the row twice: an online max / sum-exp pass (the
log-sum-exp without a separate max pass) and the gradient pass. That is 2 reads + 1 write of the logits, where
torch.compile's fused kernel read them three times, and no [N, V] gradient buffer besides the logits' own.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.cache
def _triton() -> Any:
    """The triton module, or None (CPU builds of torch ship without it)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def available(device: torch.device) -> bool:
    return device.type == "cuda" and _triton() is not None


@functools.cache
def _ce_kernel() -> Any:
    triton, tl = _triton()

    @triton.jit
    def kernel(logits_ptr, stride, targets_ptr, scale_ptr, logp_ptr, n_cols, block: tl.constexpr):  # noqa: PLR0917 (a Triton launch passes arguments by position)
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        target = tl.maximum(tl.load(targets_ptr + row), 0)  # IGNORE rows carry scale 0 (their gradient is 0)
        scale = tl.load(scale_ptr + row)
        m = float("-inf")
        s = 0.0
        for start in range(0, n_cols, block):
            cols = start + tl.arange(0, block)
            z = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)
        tl.store(logp_ptr + row, tl.load(base + target).to(tl.float32) - lse)
        for start in range(0, n_cols, block):
            cols = start + tl.arange(0, block)
            inside = cols < n_cols
            z = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
            g = tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)
            tl.store(base + cols, (g * scale).to(logits_ptr.dtype.element_ty), mask=inside)

    return kernel


def cross_entropy_grad_(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """log p(target) per row (fp32); `logits` [N, V] (contiguous rows) now holds scale * (softmax - onehot).
    `scale` [N] fp32 must be 0 on rows whose target is IGNORE (any negative id)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [N, V] with contiguous rows, got shape {tuple(logits.shape)}")
    n, v = logits.shape
    if targets.shape != (n,) or scale.shape != (n,):
        raise ValueError(f"targets {tuple(targets.shape)} and scale {tuple(scale.shape)} must be [{n}]")
    logp = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        _ce_kernel()[(n,)](
            logits, logits.stride(0), targets.contiguous(), scale.float().contiguous(), logp, v,
            block=8192, num_warps=16,
        )  # fmt: skip
    return logp

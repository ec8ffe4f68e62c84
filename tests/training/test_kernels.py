"""captain_ros_training.kernels (Triton, CUDA only) against the torch reference it replaces; skipped where there is no
GPU. Run on the GPU machine: `PYTHONPATH=src/captain_ros python -m pytest -q tests/training/test_kernels.py`."""

import pytest
import torch

from captain_ros_training import fast, kernels

cuda = pytest.mark.skipif(not kernels.available(torch.device("cuda")), reason="needs CUDA and Triton")


@cuda
@pytest.mark.parametrize("n_cols", [151936, 1000, 8192])
def test_cross_entropy_grad_matches_the_torch_chunk_terms(n_cols):
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 67
    logits = (torch.randn(n, n_cols, device="cuda", generator=g) * 4).to(torch.bfloat16)
    targets = torch.randint(0, n_cols, (n,), device="cuda", generator=g)
    targets[::7] = fast.IGNORE
    scale = torch.rand(n, device="cuda", generator=g) / 50
    scale[targets == fast.IGNORE] = 0
    ref_logp, ref_grad = fast._chunk_terms(logits.clone(), targets, scale)
    out = logits.clone()
    logp = kernels.cross_entropy_grad_(out, targets, scale)
    keep = targets != fast.IGNORE
    torch.testing.assert_close(logp[keep], ref_logp[keep], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), ref_grad.float(), atol=1e-6, rtol=1e-2)
    assert torch.all(out[~keep] == 0)  # IGNORE rows: no gradient


@cuda
def test_cross_entropy_grad_refuses_bad_shapes():
    logits = torch.zeros(4, 10, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous rows"):
        kernels.cross_entropy_grad_(logits.T, torch.zeros(10, device="cuda", dtype=torch.long), torch.zeros(10))
    with pytest.raises(ValueError, match="must be"):
        kernels.cross_entropy_grad_(logits, torch.zeros(3, device="cuda", dtype=torch.long), torch.zeros(4))


def test_mean_square_is_bit_identical_to_eager_rmsnorm_reduction():
    """The gate (CaPtain App. F) depends on RMSNorm's reduction order: the fused squares + eager mean must equal
    Qwen2RMSNorm's x.float().pow(2).mean(-1) bit for bit (on CUDA the squares come from a compiled kernel)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(1)
    x = (torch.randn(4096, 896, device=device, generator=g) * 3).to(torch.bfloat16)
    assert torch.equal(fast._mean_square(x), x.float().pow(2).mean(-1, keepdim=True))


@cuda
def test_the_lm_head_gradient_accumulates_in_fp32_across_chunks():
    """The compiled CUDA path adds each chunk's bf16 GEMM into an fp32 sum: it matches an fp32 reference closer
    than a per-chunk bf16 rounding would allow."""
    g = torch.Generator(device="cuda").manual_seed(2)
    n, d, v = 3000, 64, 5000
    hidden = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, d, device="cuda", generator=g) / 8).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, v, (n,), device="cuda", generator=g)
    weights = torch.ones(n, device="cuda")
    fast.linear_cross_entropy(hidden, weight, targets, weights, n, chunk_tokens=512, compiled=True).backward()
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    torch.nn.functional.cross_entropy(h32 @ w32.T, targets).backward()
    torch.testing.assert_close(weight.grad.float(), w32.grad, atol=2e-4, rtol=2e-2)
    torch.testing.assert_close(hidden.grad.float(), h32.grad, atol=2e-4, rtol=2e-2)

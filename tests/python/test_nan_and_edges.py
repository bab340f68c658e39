"""NaN, Inf and empty inputs through the Python API: a NaN in the query reaches its row's output
and gradients (not a zero row); large finite values stay finite; a layout without blocks gives
empty or zero results (docs/block_sparse_ops.md); an empty query is named; and the float64 path
gives the same bits for any thread count, also with the stride-0 gradient that out.sum() hands to
the backward."""
import pytest
import torch

import sciattn
from sciattn.sparse_attention import (MatMul, Softmax, SparseSelfAttention, SparsityConfig)

from conftest import run_or_skip

NAN = float("nan")


class FullConfig(SparsityConfig):
    """Every block: the whole row attends, so a NaN row reaches every key's gradient."""

    def make_layout(self, seq_len):
        return torch.ones(self.num_heads, seq_len // self.block, seq_len // self.block,
                          dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("algorithm", ["tiled", "reference"])
def test_evoformer_nan_in_q_reaches_its_row(device, dtype, algorithm):
    if device.type == "cuda" and algorithm == "reference":
        pytest.skip("the reference algorithm is CPU-only")
    B, N, L, H, D = 1, 2, 40, 2, 16
    q, k, v = (torch.randn(B, N, L, H, D, device=device, dtype=dtype) for _ in range(3))
    bias2 = torch.randn(B, 1, H, L, L, device=device, dtype=dtype, requires_grad=True)
    q[0, 1, 7, 1, 3] = NAN
    for t in (q, k, v):
        t.requires_grad_(True)
    out = run_or_skip(sciattn.evoformer_attention, q, k, v, None, bias2, algorithm=algorithm)
    row = torch.zeros(B, N, L, H, dtype=torch.bool, device=device)
    row[0, 1, 7, 1] = True
    assert out[row].isnan().all(), "the NaN row must be NaN, not 0"
    assert out[~row].isfinite().all()
    out.backward(torch.randn_like(out))
    assert q.grad[row].isnan().all() and q.grad[~row].isfinite().all()
    # Every key of the row's (b, n, h) slice is attended: its dK and dV are NaN, the rest finite.
    slice_ = torch.zeros_like(row)
    slice_[0, 1, :, 1] = True
    for g in (k.grad, v.grad):
        assert g[slice_].isnan().all() and g[~slice_].isfinite().all()
    assert bias2.grad[0, 0, 1, 7].isnan().all()
    assert bias2.grad[0, 0, 0].isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ["fused", "composite", "reference"])
def test_sparse_attention_nan_in_q_reaches_its_row(device, dtype, algorithm):
    if device.type == "cuda" and algorithm == "reference":
        pytest.skip("the reference algorithm is CPU-only")
    B, H, L, D = 2, 2, 64, 16
    module = SparseSelfAttention(FullConfig(num_heads=H, block=16), max_seq_length=L,
                                 algorithm=algorithm).to(device)
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype) for _ in range(3))
    q[1, 0, 20, 5] = NAN
    for t in (q, k, v):
        t.requires_grad_(True)
    out = run_or_skip(module, q, k, v)
    row = torch.zeros(B, H, L, dtype=torch.bool, device=device)
    row[1, 0, 20] = True
    assert out[row].isnan().all(), "the NaN row must be NaN, not 0"
    assert out[~row].isfinite().all()
    out.backward(torch.randn_like(out))
    assert q.grad[row].isnan().all() and q.grad[~row].isfinite().all()
    head = torch.zeros_like(row)
    head[1, 0] = True
    for g in (k.grad, v.grad):
        assert g[head].isnan().all() and g[~head].isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_values_stay_finite(device, dtype):
    """With every score 0 the output is the mean of V: 1e37 (the sum of the rows is inf). In bf16
    on the GPU this is the tensor-core kernels' exponent shift (docs/numerics.md)."""
    q = torch.zeros(1, 2, 300, 2, 32, device=device, dtype=dtype)
    v = torch.full_like(q, 1e37)
    out = run_or_skip(sciattn.evoformer_attention, q, torch.randn_like(q), v)
    torch.testing.assert_close(out, v, rtol=1e-5, atol=0)
    module = SparseSelfAttention(FullConfig(num_heads=2, block=16), max_seq_length=256).to(device)
    qs = torch.zeros(1, 2, 256, 32, device=device, dtype=dtype)
    vs = torch.full_like(qs, 1e37)
    out = run_or_skip(module, qs, torch.randn_like(qs), vs)
    torch.testing.assert_close(out, vs, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_empty_layout_gives_empty_or_zero_results(device, dtype):
    """docs/block_sparse_ops.md: a layout without blocks is valid. sdd gives an empty sparse
    tensor, dsd and dds give zeros, the Softmax gives an empty tensor; gradients are zeros."""
    layout = torch.zeros(2, 3, 2, dtype=torch.int64)
    a = torch.randn(3, 2, 48, 8, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(3, 2, 8, 32, device=device, dtype=dtype, requires_grad=True)
    c = run_or_skip(MatMul(layout, 16, "sdd"), a, b)
    assert c.shape == (3, 0, 16, 16)
    y = torch.randn(3, 2, 32, 5, device=device, dtype=dtype, requires_grad=True)
    out = MatMul(layout, 16, "dsd")(c, y)
    assert out.shape == (3, 2, 48, 5) and (out == 0).all()
    out.sum().backward()
    assert (a.grad == 0).all() and (b.grad == 0).all() and (y.grad == 0).all()
    x = torch.randn(3, 2, 7, 48, device=device, dtype=dtype)
    assert (MatMul(layout, 16, "dds")(x, c.detach()) == 0).all()
    assert Softmax(layout, 16)(c.detach()).shape == (3, 0, 16, 16)


def test_sparse_attention_empty_query_is_named(device):
    module = SparseSelfAttention(FullConfig(num_heads=2, block=16), max_seq_length=64).to(device)
    q = torch.randn(1, 2, 0, 8, device=device)
    with pytest.raises(ValueError, match=r"query must not be empty: got shape \[1, 2, 0, 8\]"):
        module(q, q, q)


def _grads_with_threads(threads, fn, *inputs):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
        fn(*leaves).sum().backward()  # dout is expanded: stride 0 everywhere
        return [t.grad for t in leaves]
    finally:
        torch.set_num_threads(old)


def test_float64_path_same_bits_for_any_thread_count():
    """docs/python.md promises thread-count independence; the float64 path must keep it with the
    stride-0 dout of out.sum().backward()."""
    q, k, v = (torch.randn(2, 3, 37, 2, 8, dtype=torch.float64) for _ in range(3))
    bias2 = torch.randn(2, 1, 2, 37, 37, dtype=torch.float64)

    def evo(q_, k_, v_, b_):
        return sciattn.evoformer_attention(q_, k_, v_, None, b_)

    one = _grads_with_threads(1, evo, q, k, v, bias2)
    for threads in (2, 3):
        for g1, g2 in zip(one, _grads_with_threads(threads, evo, q, k, v, bias2)):
            assert torch.equal(g1, g2), f"{threads} threads changed the bits"
    module = SparseSelfAttention(FullConfig(num_heads=2, block=16), max_seq_length=64)
    qs, ks, vs = (torch.randn(2, 2, 64, 8, dtype=torch.float64) for _ in range(3))
    one = _grads_with_threads(1, module, qs, ks, vs)
    for g1, g2 in zip(one, _grads_with_threads(2, module, qs, ks, vs)):
        assert torch.equal(g1, g2)

"""torch.library.opcheck on every op (schema, fake kernel, autograd registration, AOT dispatch)
and torch.compile(fullgraph=True) of a module using each op: no graph break, same results as
eager (forward and gradients)."""
import pytest
import torch

import sciattn
from conftest import rand, run_or_skip
from sciattn.sparse_attention import (BigBirdSparsityConfig, MatMul, Softmax,
                                      SparseSelfAttention)

ops = torch.ops.sciattn
LAYOUT = torch.tensor([[[1, 0, 1], [1, 1, 0], [0, 0, 1]], [[1, 1, 1], [0, 1, 0], [1, 0, 1]]])
NNZ = int(LAYOUT.sum())


def opcheck(op, args, device):
    run_or_skip(op, *args)
    # test_aot_dispatch_dynamic and test_faketensor use the fake kernels of _ops.py.
    torch.library.opcheck(op, args)


def g(*shape, device, dtype=torch.float32):
    return rand(*shape, dtype=dtype, device=device).requires_grad_(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_evoformer(device, dtype):
    q, k, v = (g(1, 2, 20, 2, 8, device=device, dtype=dtype) for _ in range(3))
    b1 = g(1, 2, 1, 1, 20, device=device, dtype=dtype)
    b2 = g(1, 1, 2, 20, 20, device=device, dtype=dtype)
    opcheck(ops.evoformer_fwd.default, (q, k, v, b1, b2, None, "tiled"), device)
    opcheck(ops.evoformer_fwd.default, (q, k, v, None, None, 0.5, "tiled"), device)
    out, lse = ops.evoformer_fwd(q, k, v, b1, b2, None, "tiled")
    opcheck(ops.evoformer_bwd.default,
            (torch.ones_like(out), q.detach(), k.detach(), v.detach(), b1.detach(), b2.detach(),
             out.detach(), lse, None, True, True, "tiled"), device)


@pytest.mark.parametrize("mode", ["sdd", "dsd", "dds"])
def test_opcheck_bsmm(device, mode):
    a = g(2, 2, 48, 8, device=device) if mode != "dsd" else g(2, NNZ, 16, 16, device=device)
    b = g(2, 2, 8, 48, device=device) if mode == "sdd" else (
        g(2, 2, 48, 8, device=device) if mode == "dsd" else g(2, NNZ, 16, 16, device=device))
    if mode == "dds":
        a = g(2, 2, 8, 48, device=device)
    opcheck(ops.bsmm.default, (a, b, LAYOUT, 16, NNZ, mode, False, False), device)
    c = ops.bsmm(a, b, LAYOUT, 16, NNZ, mode, False, False)
    opcheck(ops.bsmm_bwd.default, (torch.ones_like(c), a.detach(), b.detach(), LAYOUT, 16, NNZ,
                                   mode, False, False, True, True), device)


def test_opcheck_softmax(device):
    x = g(2, NNZ, 16, 16, device=device)
    kpm = torch.zeros(2, 48, device=device)
    opcheck(ops.bs_softmax.default, (x, LAYOUT, 16, NNZ, 0.5, None, kpm, None, "add", "add"),
            device)
    y = ops.bs_softmax(x, LAYOUT, 16, NNZ, 0.5, None, None, None, "add", "add")
    opcheck(ops.bs_softmax_bwd.default, (torch.ones_like(y), y.detach(), LAYOUT, 16, NNZ, 0.5),
            device)


def test_opcheck_sparse_attention(device):
    q, k, v = (g(2, 2, 48, 8, device=device) for _ in range(3))
    args = (q, k, v, LAYOUT, 16, NNZ, None, None, None, None, False, "add", "mul", "fused")
    opcheck(ops.sparse_attention_fwd.default, args, device)
    out, lse = ops.sparse_attention_fwd(*args)
    opcheck(ops.sparse_attention_bwd.default,
            (torch.ones_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, LAYOUT,
             16, NNZ, None, None, None, None, True, "add", "mul", "fused"), device)


class Evoformer(torch.nn.Module):
    def forward(self, q, k, v, b1, b2):
        return sciattn.evoformer_attention(q, k, v, b1, b2) * 2


class BlockSparseChain(torch.nn.Module):
    """sdd -> Softmax -> dsd: DeepSpeed's composition, each op once."""

    def __init__(self):
        super().__init__()
        self.sdd = MatMul(LAYOUT, 16, "sdd", trans_b=True)
        self.softmax = Softmax(LAYOUT, 16)
        self.dsd = MatMul(LAYOUT, 16, "dsd")

    def forward(self, q, k, v):
        return self.dsd(self.softmax(self.sdd(q, k), scale=0.3), v)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = SparseSelfAttention(BigBirdSparsityConfig(2, seed=5), max_seq_length=64)

    def forward(self, q, k, v):
        return self.attn(q, k, v) * 2 - 1


def compile_matches_eager(module, inputs, backend):
    eager = run_or_skip(module, *inputs)
    geager = torch.autograd.grad(eager.sum(), inputs)
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    out = compiled(*inputs)
    gout = torch.autograd.grad(out.sum(), inputs)
    assert torch.equal(out, eager)
    for a, b in zip(gout, geager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_evoformer(device, backend):
    torch._dynamo.reset()
    inputs = [g(1, 2, 24, 2, 8, device=device), g(1, 2, 24, 2, 8, device=device),
              g(1, 2, 24, 2, 8, device=device), g(1, 2, 1, 1, 24, device=device),
              g(1, 1, 2, 24, 24, device=device)]
    compile_matches_eager(Evoformer(), inputs, backend)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_block_sparse_chain(device, backend):
    torch._dynamo.reset()
    inputs = [g(2, 2, 48, 8, device=device) for _ in range(3)]
    compile_matches_eager(BlockSparseChain(), inputs, backend)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_sparse_self_attention(device, backend):
    torch._dynamo.reset()
    inputs = [g(2, 2, 64, 8, device=device) for _ in range(3)]
    compile_matches_eager(Attention().to(device), inputs, backend)

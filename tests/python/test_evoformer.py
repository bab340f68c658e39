"""sciattn.evoformer_attention and DS4Sci_EvoformerAttention against an independent fp64 oracle
(tolerance rule, lowp_ref = the C++ reference algorithm in the tested dtype), DeepSpeed's own
test recipe scaled down for the CPU, gradients only where required, and gradcheck in fp64."""
import math

import pytest
import torch

import sciattn
from conftest import assert_close_rule, rand, run_or_skip
import oracle

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_inputs(device, dtype, B, N, L, H, D, bias1="float", bias2=True, transposed=False):
    if transposed:
        # Triangle attention around the ending node: views of [B, L, N, H, D] with N and L swapped.
        q, k, v = (rand(B, L, N, H, D, dtype=dtype, device=device).transpose(1, 2)
                   for _ in range(3))
    else:
        q, k, v = (rand(B, N, L, H, D, dtype=dtype, device=device) for _ in range(3))
    b1 = None
    if bias1 == "float":
        b1 = rand(B, N, 1, 1, L, dtype=dtype, device=device)
    elif bias1 == "bool":
        b1 = torch.rand(B, N, 1, 1, L, device=device) > 0.3
    elif bias1 == "mask1e9":  # OpenFold's 1e9 * (mask - 1)
        mask = (torch.rand(B, N, 1, 1, L) > 0.2).double()
        b1 = (1e9 * (mask - 1)).to(device=device, dtype=dtype)
    b2 = rand(B, 1, H, L, L, dtype=dtype, device=device) if bias2 else None
    return q, k, v, b1, b2


def cpu_reference(inputs, dout, scale=None):
    """lowp_ref: the C++ reference algorithm on CPU copies of the inputs (same dtype), whatever
    device the tested call ran on. Forward and backward are called as raw ops, not through the
    package's autograd wiring, so a wiring bug cannot hide in the bound. Returns the output and
    the gradients (dq, dk, dv, dbias1, dbias2; None where a bias is absent or bool)."""
    q, k, v, b1, b2 = [None if t is None else t.detach().cpu() for t in inputs]
    ops = torch.ops.sciattn
    out, lse = ops.evoformer_fwd(q, k, v, b1, b2, scale, "reference")
    need1 = b1 is not None and b1.is_floating_point()
    grads = ops.evoformer_bwd(dout.cpu(), q, k, v, b1, b2, out, lse, scale, need1,
                              b2 is not None, "reference")
    return out, [grads[0], grads[1], grads[2], grads[3] if need1 else None,
                 grads[4] if b2 is not None else None]


def check_against_oracle(q, k, v, b1, b2, scale=None, grads=True):
    dtype = q.dtype
    leaves = [t for t in (q, k, v, b1, b2) if t is not None and t.is_floating_point()]
    for t in leaves:
        t.requires_grad_(grads)
    out = run_or_skip(sciattn.evoformer_attention, q, k, v, b1, b2, scale)
    dout = rand(*out.shape, dtype=dtype, device=q.device)
    low, lowg = cpu_reference((q, k, v, b1, b2), dout, scale)
    # fp64 oracle on the same (rounded) inputs.
    r = [None if t is None else (t.detach().cpu().double() if t.is_floating_point()
                                 else t.detach().cpu()).requires_grad_(t.is_floating_point())
         for t in (q, k, v, b1, b2)]
    ref = oracle.evoformer(*r, scale=scale)
    assert_close_rule("out", out, low, ref, dtype)
    if not grads:
        return
    names = ["dq", "dk", "dv", "dbias1", "dbias2"]
    got = torch.autograd.grad(out, leaves, dout)
    lowg = [g for g in lowg if g is not None]
    refg = torch.autograd.grad(ref, [t for t in r if t is not None and t.requires_grad],
                               dout.cpu().double())
    present = [n for n, t in zip(names, (q, k, v, b1, b2)) if t is not None and
               t.is_floating_point()]
    for n, g, lg, rg in zip(present, got, lowg, refg):
        # A bias gradient stored in fp32 for f16/bf16 q is judged at q's dtype (docs/testing.md).
        assert_close_rule(n, g, lg, rg, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["both", "bias1", "bias2", "none", "bool_mask", "transposed"])
def test_matches_oracle(device, dtype, case):
    kw = dict(bias1={"bias2": None, "none": None, "bool_mask": "bool"}.get(case, "float"),
              bias2=case not in ("bias1", "none"), transposed=case == "transposed")
    inputs = make_inputs(device, dtype, 2, 3, 37, 2, 16, **kw)
    check_against_oracle(*inputs)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (1, 2, 130, 2, 8), (2, 1, 17, 3, 40)])
def test_edge_shapes_and_scale(device, shape):
    """L = 1, L past a tile boundary, D not a power of two, an explicit scale."""
    inputs = make_inputs(device, torch.float32, *shape)
    check_against_oracle(*inputs, scale=0.37)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 8, 48, 4, 32), (1, 16, 32, 8, 8)],
                         ids=["ds_1x256x256x4x32_scaled", "ds_1x512x256x8x8_scaled"])
def test_deepspeed_recipe(device, dtype, shape):
    """DeepSpeed's unit test (shapes (1, 256, 256, 4, 32) and (1, 512, 256, 8, 8), scaled down
    for the CPU): DS4Sci_EvoformerAttention(Q, K, V, [1e9 * (mask - 1), pair bias]) against
    softmax(QK^T scale + mask_bias + bias) V, pair bias requiring grad."""
    B, N, L, H, D = shape
    q, k, v, b1, b2 = make_inputs(device, dtype, B, N, L, H, D, bias1="mask1e9")
    for t in (q, k, v, b2):
        t.requires_grad_(True)
    biases = [b1, b2]
    out = run_or_skip(sciattn.DS4Sci_EvoformerAttention, q, k, v, biases)
    assert len(biases) == 2
    r = [t.detach().cpu().double().requires_grad_(t.requires_grad) for t in (q, k, v, b1, b2)]
    ref = oracle.evoformer(*r)
    dout = rand(*out.shape, dtype=dtype, device=device)
    low, lowg = cpu_reference((q, k, v, b1, b2), dout)
    assert_close_rule("out", out, low, ref, dtype)
    got = torch.autograd.grad(out, [q, k, v, b2], dout)
    lowg = [lowg[0], lowg[1], lowg[2], lowg[4]]
    refg = torch.autograd.grad(ref, [r[0], r[1], r[2], r[4]], dout.cpu().double())
    for n, g, lg, rg in zip(["dq", "dk", "dv", "dbias2"], got, lowg, refg):
        assert_close_rule(n, g, lg, rg, dtype)


def test_gradients_only_where_required(device):
    q, k, v, b1, b2 = make_inputs(device, torch.float32, 1, 2, 20, 2, 8)
    q.requires_grad_(True)
    b2.requires_grad_(True)
    out = sciattn.evoformer_attention(q, k, v, b1, b2)
    out.sum().backward()
    assert q.grad is not None and b2.grad is not None
    assert k.grad is None and v.grad is None and b1.grad is None
    # Only a bias requires grad: its gradient alone.
    b2.grad = None
    q.requires_grad_(False)
    sciattn.evoformer_attention(q, k, v, b1, b2).sum().backward()
    assert b2.grad is not None and torch.isfinite(b2.grad).all()


def test_fully_masked_row_gives_zero(device):
    q, k, v, _, b2 = make_inputs(device, torch.float32, 1, 2, 24, 2, 8)
    mask = torch.ones(1, 2, 1, 1, 24, dtype=torch.bool, device=device)
    mask[0, 1] = False  # every key of n = 1 masked
    for t in (q, k, v):
        t.requires_grad_(True)
    out = sciattn.evoformer_attention(q, k, v, mask, b2)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    assert torch.isfinite(out).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
        assert torch.equal(t.grad[0, 1], torch.zeros_like(t.grad[0, 1]))


def test_ds4sci_bias_list_forms(device):
    q, k, v, b1, b2 = make_inputs(device, torch.float32, 1, 2, 20, 2, 8)
    full = sciattn.evoformer_attention(q, k, v, b1, b2)
    assert torch.equal(sciattn.DS4Sci_EvoformerAttention(q, k, v, [b1, b2]), full)
    assert torch.equal(sciattn.DS4Sci_EvoformerAttention(q, k, v, (b1,)),
                       sciattn.evoformer_attention(q, k, v, b1))
    assert torch.equal(sciattn.DS4Sci_EvoformerAttention(q, k, v, [None, b2]),
                       sciattn.evoformer_attention(q, k, v, None, b2))
    assert torch.equal(sciattn.DS4Sci_EvoformerAttention(q, k, v, []),
                       sciattn.evoformer_attention(q, k, v))
    from sciattn.deepspeed4science import DS4Sci_EvoformerAttention
    assert DS4Sci_EvoformerAttention is sciattn.DS4Sci_EvoformerAttention


def test_deterministic(device):
    q, k, v, b1, b2 = make_inputs(device, torch.float32, 1, 3, 40, 2, 16)
    runs = []
    for _ in range(2):
        ts = [t.clone().requires_grad_(True) for t in (q, k, v, b1, b2)]
        out = sciattn.evoformer_attention(*ts)
        out.backward(torch.ones_like(out))
        runs.append([out] + [t.grad for t in ts])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bias1", ["float", "bool", None])
def test_gradcheck_fp64(device, bias1):
    q, k, v, b1, b2 = make_inputs(device, torch.float64, 1, 2, 5, 2, 3, bias1=bias1)
    inputs = [t.requires_grad_(True) if t is not None and t.is_floating_point() else t
              for t in (q, k, v, b1, b2)]
    assert torch.autograd.gradcheck(
        lambda *a: sciattn.evoformer_attention(*a, scale=0.7), inputs)


def test_fp64_path_matches_oracle(device):
    q, k, v, b1, b2 = make_inputs(device, torch.float64, 2, 2, 9, 2, 4)
    ref = oracle.evoformer(*(t.cpu() for t in (q, k, v, b1, b2)))
    got = sciattn.evoformer_attention(q, k, v, b1, b2)
    assert (got.cpu() - ref).abs().max().item() < 1e-12


def test_double_backward_is_refused(device):
    """create_graph=True gives the same first derivatives; differentiating them again raises
    (without the package's guard torch treats the backward op as a constant: no error, a silently
    missing second derivative)."""
    q, k, v, b1, b2 = make_inputs(device, torch.float32, 1, 2, 5, 2, 8)
    leaves = [x.requires_grad_(True) for x in (q, k, v, b2)]
    out = sciattn.evoformer_attention(q, k, v, b1, b2)
    plain = torch.autograd.grad(out.square().sum(), leaves, retain_graph=True)
    graphed = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
    for a, b in zip(plain, graphed):
        assert torch.equal(a, b)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        torch.autograd.grad(graphed[0].sum(), [k])

"""MatMul, Softmax and SparseSelfAttention against independent fp64 dense oracles (tolerance
rule), forward and backward, every algorithm, masks, rpe, causal, pre-transposed keys, user
layouts, per-instance layouts, and gradcheck in fp64."""
import pytest
import torch

from conftest import DEVICE, assert_close_rule, rand, run_or_skip
import oracle
from sciattn.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                      DenseSparsityConfig, FixedSparsityConfig,
                                      LocalSlidingWindowSparsityConfig, MatMul, Softmax,
                                      SparseSelfAttention, SparsityConfig,
                                      VariableSparsityConfig)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_layout(H, R, C, p=0.5):
    layout = (torch.rand(H, R, C) < p).long()
    layout[0, 0, 0] = 1
    return layout


def _lowp(ref, dtype):
    return ref.detach().to(dtype)


def _grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,trans_a,trans_b", [
    ("sdd", False, False), ("sdd", False, True), ("sdd", True, False),
    ("dsd", False, False), ("dsd", True, False), ("dsd", False, True),
    ("dds", False, False), ("dds", False, True), ("dds", True, False)])
def test_matmul(device, dtype, mode, trans_a, trans_b):
    Z, H, block, R, C, K = 2, 2, 16, 3, 4, 24
    layout = random_layout(H, R, C)
    nnz = int(layout.sum())
    if mode == "sdd":
        a = rand(Z, H, K, R * block) if trans_a else rand(Z, H, R * block, K)
        b = rand(Z, H, C * block, K) if trans_b else rand(Z, H, K, C * block)
    elif mode == "dsd":
        a = rand(Z, nnz, block, block)
        rows_in = (R if trans_a else C) * block
        b = rand(Z, H, K, rows_in) if trans_b else rand(Z, H, rows_in, K)
    else:
        cols_in = (C if trans_b else R) * block
        a = rand(Z, H, cols_in, K) if trans_a else rand(Z, H, K, cols_in)
        b = rand(Z, nnz, block, block)
    a = a.to(device, dtype).requires_grad_(True)
    b = b.to(device, dtype).requires_grad_(True)
    op = MatMul(layout, block, mode, trans_a=trans_a, trans_b=trans_b)
    c = run_or_skip(op, a, b)
    a64, b64 = (t.detach().cpu().double().requires_grad_(True) for t in (a, b))
    ref = oracle.matmul(a64, b64, layout, block, mode, trans_a, trans_b)
    assert_close_rule("c", c, _lowp(ref, dtype), ref, dtype)
    dc = rand(*c.shape, dtype=dtype, device=device)
    da, db = _grads(c, [a, b], dc)
    ra, rb = _grads(ref, [a64, b64], dc.cpu().double())
    assert_close_rule("da", da, _lowp(ra, dtype), ra, dtype)
    assert_close_rule("db", db, _lowp(rb, dtype), rb, dtype)


def test_matmul_pads_and_squeezes_leading_dims(device):
    layout = random_layout(1, 2, 2)
    a, b = rand(32, 8, device=device), rand(8, 32, device=device)
    c = run_or_skip(MatMul(layout[0], 16, "sdd"), a, b)  # 2-D layout, 2-D operands
    assert c.shape == (int(layout.sum()), 16, 16)
    ref = oracle.matmul(a[None, None].cpu().double(), b[None, None].cpu().double(), layout, 16,
                        "sdd", False, False)[0]
    assert_close_rule("c", c, ref.float(), ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masks", ["none", "all_add", "mul_bool", "fully_masked"])
def test_softmax(device, dtype, masks):
    Z, H, block, N = 2, 2, 16, 3
    L = N * block
    layout = random_layout(H, N, N, 0.6)
    nnz = int(layout.sum())
    x = rand(Z, nnz, block, block, dtype=dtype, device=device).requires_grad_(True)
    kw = {}
    if masks == "all_add":
        kw = dict(rpe=rand(H, L, L, dtype=dtype, device=device),  # broadcast over Z
                  key_padding_mask=torch.where(torch.rand(Z, L) > 0.2, 0.0, -float("inf")).to(
                      device, dtype),
                  attn_mask=torch.where(torch.rand(L, L) > 0.2, 0.0, -1e4).to(device, dtype))
    elif masks == "mul_bool":
        kw = dict(key_padding_mask=(torch.rand(Z, L) > 0.3).to(device, dtype),
                  attn_mask=torch.rand(L, L, device=device) > 0.3,
                  key_padding_mask_mode="mul", attn_mask_mode="mul")
    elif masks == "fully_masked":
        kpm = torch.zeros(Z, L)
        kpm[0] = -float("inf")
        kw = dict(key_padding_mask=kpm.to(device, dtype))
    y = run_or_skip(Softmax(layout, block), x, scale=0.4, **kw)
    x64 = x.detach().cpu().double().requires_grad_(True)
    ref = oracle.softmax(x64, layout, block, 0.4, kw.get("rpe"), kw.get("key_padding_mask"),
                         kw.get("attn_mask"), kw.get("key_padding_mask_mode", "add"),
                         kw.get("attn_mask_mode", "add"))
    assert_close_rule("y", y, _lowp(ref, dtype), ref, dtype)
    if masks == "fully_masked":
        assert torch.equal(y[0], torch.zeros_like(y[0]))
    dy = rand(*y.shape, dtype=dtype, device=device)
    (dx,) = _grads(y, [x], dy)
    (rdx,) = _grads(ref, [x64], dy.cpu().double())
    assert_close_rule("dx", dx, _lowp(rdx, dtype), rdx, dtype)


CONFIGS = {
    "dense": lambda H: DenseSparsityConfig(H),
    "fixed": lambda H: FixedSparsityConfig(H, num_local_blocks=2),
    "fixed_uni": lambda H: FixedSparsityConfig(H, num_local_blocks=2, attention="unidirectional"),
    "variable": lambda H: VariableSparsityConfig(H, num_random_blocks=1,
                                                 local_window_blocks=[1, 2]),
    "bigbird": lambda H: BigBirdSparsityConfig(H, different_layout_per_head=True, seed=3),
    "bslongformer": lambda H: BSLongformerSparsityConfig(H),
    "local": lambda H: LocalSlidingWindowSparsityConfig(H),
}


def attention_case(device, dtype, config, L, masks=False, causal=False, algorithm="fused",
                   transposed_key=False):
    B, H, D = 2, 2, 24
    q, k, v = (rand(B, H, L, D, dtype=dtype, device=device).requires_grad_(True)
               for _ in range(3))
    module = SparseSelfAttention(config, max_seq_length=128, causal=causal, algorithm=algorithm)
    kw = {}
    if masks:
        kw = dict(rpe=rand(1, H, L, L, dtype=dtype, device=device),
                  key_padding_mask=torch.where(torch.rand(B, 1, 1, L) > 0.2, 0.0, -1e4).to(
                      device, dtype),
                  attn_mask=(torch.rand(L, L, device=device) > 0.2).to(dtype))
    key = k.transpose(-1, -2) if transposed_key else k
    out = run_or_skip(module, q, key, v, **kw)
    r = [t.detach().cpu().double().requires_grad_(True) for t in (q, k, v)]
    n = L // config.block
    layout = config.make_layout(128)[:, :n, :n]
    ref = oracle.attention(*r, layout, config.block, kw.get("rpe"),
                           None if not masks else kw["key_padding_mask"].reshape(B, L),
                           kw.get("attn_mask"), "add", "mul", causal)
    # lowp_ref: the C++ reference algorithm on CPU copies (same dtype), whatever the device,
    # called as raw ops (not through the package's autograd wiring).
    qc, kc, vc = (t.detach().cpu() for t in (q, k, v))
    kpm = None if not masks else kw["key_padding_mask"].reshape(B, L).cpu()
    raw = (layout, config.block, int(layout.sum()), None if not masks else
           kw["rpe"].expand(B, H, L, L).cpu(), kpm, None if not masks else kw["attn_mask"].cpu(),
           None, causal, "add", "mul", "reference")
    low, low_lse = torch.ops.sciattn.sparse_attention_fwd(qc, kc, vc, *raw)
    assert_close_rule("out", out, low, ref, dtype)
    dout = rand(*out.shape, dtype=dtype, device=device)
    got = _grads(out, [q, k, v], dout)
    lowg = torch.ops.sciattn.sparse_attention_bwd(dout.cpu(), qc, kc, vc, low, low_lse, *raw)
    refg = _grads(ref, r, dout.cpu().double())
    for name, g, lg, rg in zip(["dq", "dk", "dv"], got, lowg, refg):
        assert_close_rule(name, g, lg, rg, dtype)


@pytest.mark.parametrize("mode", list(CONFIGS))
def test_attention_each_config(device, mode):
    attention_case(device, torch.float32, CONFIGS[mode](2), 96)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ["fused", "composite"])
def test_attention_masks_algorithms(device, dtype, algorithm):
    attention_case(device, dtype, CONFIGS["bigbird"](2), 64, masks=True, algorithm=algorithm)


def test_attention_causal_and_transposed_key(device):
    attention_case(device, torch.float32, CONFIGS["fixed_uni"](2), 80, causal=True,
                   transposed_key=True)


class DiagonalConfig(SparsityConfig):
    """A user subclass: only the diagonal blocks (a layout no built-in config makes)."""

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            layout[h] = torch.eye(seq_len // self.block, dtype=torch.int64)
        return self.check_and_propagate_first_head_layout(layout)


def test_user_config_works_with_every_op(device):
    config = DiagonalConfig(num_heads=2, block=16)
    attention_case(device, torch.float32, config, 48)
    layout = config.make_layout(48)
    a, b = rand(1, 2, 48, 8, device=device), rand(1, 2, 8, 48, device=device)
    w = MatMul(layout, 16, "sdd")(a, b)
    p = Softmax(layout, 16)(w)
    o = MatMul(layout, 16, "dsd")(p, rand(1, 2, 48, 8, device=device))
    assert w.shape == (1, 6, 16, 16) and o.shape == (1, 2, 48, 8)
    ref = oracle.softmax(oracle.matmul(a.cpu().double(), b.cpu().double(), layout, 16, "sdd",
                                       False, False), layout, 16)
    assert_close_rule("p", p, ref.float(), ref, torch.float32)


def test_layout_belongs_to_the_module(device):
    """DeepSpeed's class-level op cache made two modules of one length share a layout."""
    q = rand(1, 2, 64, 8, device=device)
    a = run_or_skip(SparseSelfAttention(LocalSlidingWindowSparsityConfig(2), max_seq_length=64),
                    q, q, q)
    b = SparseSelfAttention(DenseSparsityConfig(2), max_seq_length=64)(q, q, q)
    assert not torch.allclose(a, b)
    ref = oracle.attention(*(q.cpu().double(),) * 3, DenseSparsityConfig(2).make_layout(64), 16)
    assert_close_rule("dense", b, ref.float(), ref, torch.float32)


def test_crop_rule_and_state_dict(device):
    config = FixedSparsityConfig(1)
    module = SparseSelfAttention(config, max_seq_length=256).to(device)
    assert torch.equal(module.master_layout.cpu(), config.make_layout(256))
    other = SparseSelfAttention(DenseSparsityConfig(1), max_seq_length=256).to(device)
    other.load_state_dict(module.state_dict())
    q = rand(1, 1, 160, 8, device=device)
    assert torch.equal(run_or_skip(other, q, q, q), module(q, q, q))
    # A checkpoint's layout is checked before the module narrows its copy to uint8.
    bad = module.state_dict()
    bad["master_layout"] = bad["master_layout"].clone()
    bad["master_layout"][0, 0, 0] = 256
    with pytest.raises(ValueError, match="master_layout must hold only 0s and 1s"):
        other.load_state_dict(bad)


GRADCHECK_LAYOUT = torch.tensor([[[1, 0], [1, 1]], [[0, 1], [1, 0]]])


@pytest.mark.parametrize("mode", ["sdd", "dsd", "dds"])
def test_gradcheck_matmul_fp64(device, mode):
    layout, block = GRADCHECK_LAYOUT, 16
    nnz = int(layout.sum())
    dense = lambda *s: rand(*s, dtype=torch.float64, device=device).requires_grad_(True)
    a = dense(1, 2, 32, 3) if mode != "dsd" else dense(1, nnz, block, block)
    b = dense(1, 2, 3, 32) if mode == "sdd" else (
        dense(1, 2, 32, 3) if mode == "dsd" else dense(1, nnz, block, block))
    if mode == "dds":
        a = dense(1, 2, 3, 32)
    op = MatMul(layout, block, mode)
    assert torch.autograd.gradcheck(op, (a, b))


def test_gradcheck_softmax_fp64(device):
    layout = GRADCHECK_LAYOUT
    x = rand(1, int(layout.sum()), 16, 16, dtype=torch.float64,
             device=device).requires_grad_(True)
    kpm = torch.zeros(1, 32, dtype=torch.float64, device=device)
    kpm[0, 3] = -float("inf")
    op = Softmax(layout, 16)
    assert torch.autograd.gradcheck(lambda t: op(t, scale=0.5, key_padding_mask=kpm), (x,))


def test_gradcheck_attention_fp64(device):
    module = SparseSelfAttention(BigBirdSparsityConfig(2, seed=1), max_seq_length=64, causal=True)
    q, k, v = (rand(1, 2, 48, 3, dtype=torch.float64, device=device).requires_grad_(True)
               for _ in range(3))
    assert torch.autograd.gradcheck(module, (q, k, v))


def test_attention_double_backward_is_refused(device):
    """As for Evoformer attention: correct first derivatives under create_graph=True, an error
    (not a silently missing term) for a second derivative through the fused attention."""
    module = SparseSelfAttention(BigBirdSparsityConfig(2, seed=1), max_seq_length=64)
    q, k, v = (rand(1, 2, 48, 8, device=device).requires_grad_(True) for _ in range(3))
    out = run_or_skip(module, q, k, v)
    plain = torch.autograd.grad(out.square().sum(), [q, k, v], retain_graph=True)
    graphed = torch.autograd.grad(out.square().sum(), [q, k, v], create_graph=True)
    for a, b in zip(plain, graphed):
        assert torch.equal(a, b)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        torch.autograd.grad(graphed[0].sum(), [k])


def test_matmul_softmax_double_backward_is_refused(device):
    """MatMul and Softmax (Python autograd formulas): the same first derivatives under
    create_graph=True, an error for a second derivative through either op."""
    layout = random_layout(2, 3, 3)
    a = rand(1, 2, 48, 8, device=device).requires_grad_(True)
    b = rand(1, 2, 8, 48, device=device).requires_grad_(True)
    for op in (lambda: MatMul(layout, 16, "sdd")(a, b),
               lambda: Softmax(layout, 16)(MatMul(layout, 16, "sdd")(a, b).detach() * a.sum())):
        out = run_or_skip(op)
        plain = torch.autograd.grad(out.square().sum(), [a], retain_graph=True)
        graphed = torch.autograd.grad(out.square().sum(), [a], create_graph=True)
        assert torch.equal(plain[0], graphed[0])
        with pytest.raises(NotImplementedError, match="not differentiable"):
            torch.autograd.grad(graphed[0].sum(), [a])


def test_index_cache_follows_in_place_layout_changes(device):
    """The binding keeps the index of recently used layout tensors; changing a layout in place
    must not be answered from that cache (the tensor's version moves on)."""
    config = CONFIGS["bigbird"](2)
    layout = config.make_layout(64)
    q, k, v = (rand(1, 2, 64, 8, device=device) for _ in range(3))

    def fwd(lay):  # the fused algorithm, masks in their default modes
        raw = (lay, config.block, int(lay.sum()), None, None, None, None, False, "add", "mul", "fused")
        return run_or_skip(torch.ops.sciattn.sparse_attention_fwd, q, k, v, *raw)[0]

    first = fwd(layout)
    assert torch.equal(fwd(layout), first)  # the cached index gives the same bits
    with pytest.raises(ValueError, match="nnz"):  # a cached index still checks nnz
        torch.ops.sciattn.sparse_attention_fwd(q, k, v, layout, config.block,
                                               int(layout.sum()) + 1, None, None, None, None,
                                               False, "add", "mul", "fused")
    layout.zero_()
    layout[:, torch.arange(4), torch.arange(4)] = 1  # diagonal blocks only, in place
    changed = fwd(layout)
    assert torch.equal(changed, fwd(layout.clone()))  # as a fresh layout tensor gives
    assert not torch.allclose(changed, first)
    ref = oracle.attention(*(t.cpu().double() for t in (q, k, v)), layout, config.block)
    assert_close_rule("out", changed, ref.float(), ref, torch.float32)


def test_layout_tensor_of_any_integer_or_bool_dtype(device):
    """The binding reads a layout in its own dtype (bool, uint8, int8, int16, int32, int64) and
    checks its values in the same pass: every dtype gives the same bits, and a value that is not
    0 or 1 is refused in every dtype (256 too, which a narrowing copy to 8 bits would make 0)."""
    config = CONFIGS["bigbird"](2)
    layout = config.make_layout(64)
    q, k, v = (rand(1, 2, 64, 8, device=device) for _ in range(3))
    nnz = int(layout.sum())

    def fwd(lay):
        raw = (lay, config.block, nnz, None, None, None, None, False, "add", "mul", "fused")
        return run_or_skip(torch.ops.sciattn.sparse_attention_fwd, q, k, v, *raw)[0]

    want = fwd(layout)
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32):
        assert torch.equal(fwd(layout.to(dtype)), want), dtype
    for bad, dtype in ((2, torch.uint8), (-1, torch.int8), (256, torch.int32), (256, torch.int64)):
        wrong = layout.to(dtype).clone()
        wrong[0, 0, 0] = bad
        with pytest.raises(ValueError, match="only 0s and 1s"):
            torch.ops.sciattn.sparse_attention_fwd(q, k, v, wrong, config.block, nnz, None, None,
                                                   None, None, False, "add", "mul", "fused")


def test_index_cache_per_device_and_threads(device):
    """One layout tensor used on the CPU and on the test device (its index is uploaded once per
    CUDA device and kept next to the host index), from several threads at once: every call gives
    the bits of a single-threaded call on its device."""
    import threading
    config = CONFIGS["bigbird"](2)
    layout = config.make_layout(128)
    raw = (layout, config.block, int(layout.sum()), None, None, None, None, False, "add", "mul", "fused")
    q, k, v = (rand(1, 2, 128, 32) for _ in range(3))
    dq, dk, dv = (t.to(device) for t in (q, k, v))
    cpu_out = torch.ops.sciattn.sparse_attention_fwd(q, k, v, *raw)[0]
    dev_out = run_or_skip(torch.ops.sciattn.sparse_attention_fwd, dq, dk, dv, *raw)[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    results, errors = [], []

    def worker(i):
        try:
            on_dev = i % 2 == 0
            out = torch.ops.sciattn.sparse_attention_fwd(*((dq, dk, dv) if on_dev else (q, k, v)),
                                                         *raw)[0]
            if device.type == "cuda":
                torch.cuda.synchronize()
            results.append((on_dev, out))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for on_dev, out in results:
        assert torch.equal(out, dev_out if on_dev else cpu_out)
    ref = oracle.attention(*(t.double() for t in (q, k, v)), layout, config.block)
    assert_close_rule("out", dev_out, cpu_out, ref, torch.float32)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA tensors only (SCIATTN_TEST_DEVICE=cuda)")
def test_cuda_layout_tensor_and_second_device(device):
    """The layout may itself be a CUDA tensor (it is read on the host once), and each CUDA device
    gets its own copy of the index."""
    config = CONFIGS["fixed"](2)
    layout = config.make_layout(64)
    raw = (config.block, int(layout.sum()), None, None, None, None, False, "add", "mul", "fused")
    q, k, v = (rand(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(3))
    ref = torch.ops.sciattn.sparse_attention_fwd(q, k, v, layout, *raw)[0]
    devices = [torch.device("cuda", i) for i in range(min(2, torch.cuda.device_count()))]
    for d in devices:
        for lay in (layout, layout.to(d)):
            out = run_or_skip(torch.ops.sciattn.sparse_attention_fwd, q.to(d), k.to(d), v.to(d),
                              lay, *raw)[0]
            assert out.device == d
            r64 = oracle.attention(*(t.double() for t in (q, k, v)), layout, config.block)
            assert_close_rule(f"out on {d}", out, ref, r64, torch.bfloat16)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA tensors only (SCIATTN_TEST_DEVICE=cuda)")
def test_cuda_unsupported_path_names_the_op(device):
    """A path the GPU build does not have (the CPU-only reference algorithm; any op whose kernel
    is not written yet) raises NotImplementedError naming the op, never a crash."""
    config = CONFIGS["bigbird"](2)
    q, k, v = (rand(1, 2, 64, 32, dtype=torch.float16, device=device) for _ in range(3))
    module = SparseSelfAttention(config, max_seq_length=64, algorithm="reference")
    with pytest.raises(NotImplementedError, match="sciattn.SparseSelfAttention"):
        module(q, k, v)

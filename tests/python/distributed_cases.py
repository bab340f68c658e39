"""The cases of the sciattn.distributed tests, run on every rank of a distributed_pool.Pool as
case(rank, P, ...): the CPU tests (gloo, float32) and the GPU tests (NCCL, bf16 and fp16) share
them. Every rank draws the same whole tensors from the same seed, cuts its shard, runs the
distributed call, and compares its shard of the output and of every gradient with the
single-process call on the whole tensors, sliced to the rank, by the tolerance rule of
docs/conventions.md (lowp_ref: the single-process call in the tested dtype; ref64: the fp64 oracle).
Comparisons come after the last collective, so a failing rank does not leave its peers waiting."""
import functools
import random

import torch
import torch.nn.functional as F

import oracle
import sciattn
from conftest import assert_close_rule
from sciattn import distributed as sp
from sciattn.sparse_attention import BigBirdSparsityConfig, SparseSelfAttention

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _device(rank, kind):
    return torch.device("cuda", rank) if kind == "cuda" else torch.device("cpu")


def _draw(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def _shard(x, rank, counts, dim):
    start = sum(counts[:rank])
    return x.narrow(dim, start, counts[rank])


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


def _f64(x):
    return x.detach().double().cpu().requires_grad_(True)


def _grads(out, dout, leaves):
    return torch.autograd.grad(out, leaves, dout)


def _check(name, got, lowp, ref64, dtype):
    assert_close_rule(name, got, lowp, ref64, dtype)


# ---- the all-to-all -----------------------------------------------------------------------

def all_to_all_round_trip(rank, P, seed, kind):
    """For random shapes, dims and strides: all_to_all gives exactly the rank's piece of the whole
    tensor, the reverse all-to-all gives the input back bit for bit, and the backward is the
    reverse all-to-all of the gradient."""
    rng = random.Random(seed)
    device = _device(rank, kind)
    torch.manual_seed(seed)
    for _ in range(12):
        ndim = rng.randint(2, 5)
        sd, gd = rng.sample(range(ndim), 2)
        shape = [rng.randint(1, 3) for _ in range(ndim)]
        shape[sd] = P * rng.randint(1, 3)
        shape[gd] = P * rng.randint(1, 3)
        whole = _draw(shape, torch.float64, device)
        mine = whole.chunk(P, gd)[rank]
        if rng.random() < 0.5:  # strides that are not packed
            perm = list(range(ndim))
            rng.shuffle(perm)
            mine = mine.permute(perm).contiguous().permute(sorted(range(ndim),
                                                                  key=perm.__getitem__))
        x = mine.clone().requires_grad_(True)
        y = sp.all_to_all(x, sd, gd)
        assert torch.equal(y, whole.chunk(P, sd)[rank]), (shape, sd, gd)
        back = sp.all_to_all(y, gd, sd)
        assert torch.equal(back, mine), (shape, sd, gd)
        dy = _draw(y.shape, torch.float64, device)
        (dx,) = torch.autograd.grad(y, x, dy)
        assert torch.equal(dx, sp.all_to_all(dy, gd, sd)), (shape, sd, gd)


# ---- DistributedAttention -------------------------------------------------------------------

def sdpa_seq_first(q, k, v, causal=False, flat=False):
    """Plain SDPA on [s, b, h, d] tensors (key and value may have fewer heads: grouped-query
    attention); flat: Megatron's [s, b, h * d] output."""
    out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)),
                                         is_causal=causal, enable_gqa=k.shape[2] != q.shape[2]
                                         ).permute(2, 0, 1, 3)
    return out.reshape(out.shape[0], out.shape[1], -1) if flat else out


def ulysses_sdpa(rank, P, seed, kind, dtype_name, causal, uneven, flat, gqa=False):
    """DistributedAttention around plain SDPA ([s/P, b, h, d], the default indices; causal by
    global position; uneven heads; Megatron's flattened output; key and value with half the
    query's heads) against SDPA on the whole sequence."""
    dtype, device = DTYPES[dtype_name], _device(rank, kind)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    s_loc, b, d = rng.randint(1, 6), rng.randint(1, 2), rng.choice([8, 16, 64])
    h = P * rng.randint(1, 2) + (rng.randint(1, P - 1) if uneven else 0)
    h_kv = h
    if gqa:
        h_kv = P * rng.randint(1, 2)
        h = 2 * h_kv
    s = P * s_loc
    q = _draw((s, b, h, d), dtype, device)
    k, v = (_draw((s, b, h_kv, d), dtype, device) for _ in range(2))
    local = functools.partial(sdpa_seq_first, flat=flat)  # causal comes through forward's kwargs
    out_shape = (s, b, h * d) if flat else (s, b, h, d)
    dout = _draw(out_shape, dtype, device)
    counts = [s_loc] * P
    leaves = [_leaf(_shard(t, rank, counts, 0)) for t in (q, k, v)]
    attn = sp.DistributedAttention(local, None, uneven_heads=uneven)
    out = attn(*leaves, causal=causal)
    grads = _grads(out, _shard(dout, rank, counts, 0), leaves)
    whole = [_leaf(t) for t in (q, k, v)]
    ref = sdpa_seq_first(*whole, causal=causal, flat=flat)
    ref_grads = _grads(ref, dout, whole)
    w64 = [_f64(t) for t in (q, k, v)]
    r64 = sdpa_seq_first(*w64, causal=causal, flat=flat)
    g64 = _grads(r64, dout.double().cpu(), w64)
    for name, got, low, high in zip(("out", "dq", "dk", "dv"), (out,) + grads,
                                    (ref,) + ref_grads, (r64,) + g64):
        _check(f"rank {rank} {name}", got, _shard(low, rank, counts, 0),
               _shard(high, rank, counts, 0), dtype)
    return tuple(out.shape)


class _BatchFirstSparse(torch.nn.Module):
    """sciattn's SparseSelfAttention on [b, s, h, d] tensors (it takes [b, h, s, d])."""

    def __init__(self, config, seq_len, causal):
        super().__init__()
        self.attn = SparseSelfAttention(config, max_seq_length=seq_len, causal=causal)

    def forward(self, q, k, v):
        return self.attn(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)


def _sparse_problem(P, seed, dtype, device, uneven=False):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    block = 16
    s = block * P * rng.randint(1, 2)
    b, d = rng.randint(1, 2), rng.choice([8, 32, 64])
    h = P * rng.randint(1, 2) + (1 if uneven else 0)
    causal = rng.random() < 0.5
    config = BigBirdSparsityConfig(h, block=block, different_layout_per_head=True,
                                   num_random_blocks=1, num_sliding_window_blocks=1,
                                   attention="unidirectional" if causal else "bidirectional",
                                   seed=seed % 1000)
    q, k, v = (_draw((b, s, h, d), dtype, device) for _ in range(3))
    dout = _draw((b, s, h, d), dtype, device)
    return config, causal, (q, k, v), dout


def _distributed_sparse(rank, P, config, causal, inputs, dout, uneven=False):
    s = inputs[0].shape[1]
    local = _BatchFirstSparse(sp.head_slice_config(config, uneven_heads=uneven), s, causal)
    attn = sp.DistributedAttention(local.to(inputs[0].device), None, uneven_heads=uneven)
    leaves = [_leaf(sp.split_sequence(t, 1)) for t in inputs]
    out = attn(*leaves, batch_dim_idx=0)
    return (out,) + _grads(out, sp.split_sequence(dout, 1), leaves)


def ulysses_sparse(rank, P, seed, kind, dtype_name, uneven):
    """DistributedAttention around sciattn's SparseSelfAttention with per-head BigBird layouts
    (each rank builds its heads' slice with head_slice_config), batch-first tensors
    (batch_dim_idx=0), against the module with the whole config on the whole sequence."""
    dtype, device = DTYPES[dtype_name], _device(rank, kind)
    config, causal, inputs, dout = _sparse_problem(P, seed, dtype, device, uneven)
    got = _distributed_sparse(rank, P, config, causal, inputs, dout, uneven)
    s = inputs[0].shape[1]
    whole = [_leaf(t) for t in inputs]
    ref_module = _BatchFirstSparse(config, s, causal).to(device)
    ref = ref_module(*whole)
    lowp = (ref,) + _grads(ref, dout, whole)
    w64 = [_f64(t) for t in inputs]
    r64 = oracle.attention(*(t.transpose(1, 2) for t in w64), config.make_layout(s),
                           config.block, causal=causal).transpose(1, 2)
    high = (r64,) + _grads(r64, dout.double().cpu(), w64)
    counts = [s // P] * P
    for name, a, low, hi in zip(("out", "dq", "dk", "dv"), got, lowp, high):
        _check(f"rank {rank} {name}", a, _shard(low, rank, counts, 1),
               _shard(hi, rank, counts, 1), dtype)


# ---- Evoformer with N sharded ---------------------------------------------------------------

def _evoformer_problem(P, seed, dtype, device, uneven_n, bias1_kind, with_bias2):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    per = rng.randint(1, 3)
    counts = [rng.randint(1, 3) for _ in range(P)] if uneven_n else [per] * P
    B, L, H, D = rng.randint(1, 2), rng.choice([1, 7, 17, 33]), rng.randint(1, 3), \
        rng.choice([8, 16, 32])
    N = sum(counts)
    q, k, v = (_draw((B, N, L, H, D), dtype, device) for _ in range(3))
    b1 = None
    if bias1_kind == "float":
        b1 = _draw((B, N, 1, 1, L), dtype, device)
    elif bias1_kind == "bool":
        b1 = (torch.rand(B, N, 1, 1, L) > 0.3).to(device)
    b2 = _draw((B, 1, H, L, L), dtype, device) if with_bias2 else None
    dout = _draw((B, N, L, H, D), dtype, device)
    return counts, (q, k, v, b1, b2), dout


def _evoformer_call(fn, inputs, dout, **kw):
    """fn(q, k, v, bias1, bias2) with every float input a fresh leaf: the output and the
    gradients (None for a bool or absent bias)."""
    leaves = [None if t is None else (_leaf(t) if t.is_floating_point() else t) for t in inputs]
    out = fn(*leaves, **kw)
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    got = iter(_grads(out, dout, wanted))
    return out, [next(got) if t is not None and t.requires_grad else None for t in leaves]


def _distributed_evoformer(rank, counts, inputs, dout):
    q, k, v, b1, b2 = inputs
    mine = [_shard(t, rank, counts, 1) for t in (q, k, v)]
    mine.append(None if b1 is None else _shard(b1, rank, counts, 1))
    mine.append(b2)  # replicated
    return _evoformer_call(sp.evoformer_attention, mine, _shard(dout, rank, counts, 1))


def evoformer_sharded(rank, P, seed, kind, dtype_name, uneven_n, bias1_kind, with_bias2):
    """sciattn.distributed.evoformer_attention with N sharded (evenly or not) against
    sciattn.evoformer_attention on the whole MSA: output, dq, dk, dv, dbias1 sliced to the rank,
    and dbias2 whole. Returns dbias2, which must be the same bits on every rank."""
    dtype, device = DTYPES[dtype_name], _device(rank, kind)
    counts, inputs, dout = _evoformer_problem(P, seed, dtype, device, uneven_n, bias1_kind,
                                              with_bias2)
    out, grads = _distributed_evoformer(rank, counts, inputs, dout)
    ref, ref_grads = _evoformer_call(sciattn.evoformer_attention, inputs, dout)
    inputs64 = [None if t is None else (t.double().cpu() if t.is_floating_point() else t.cpu())
                for t in inputs]
    r64, g64 = _evoformer_call(oracle.evoformer, inputs64, dout.double().cpu())
    _check(f"rank {rank} out", out, _shard(ref, rank, counts, 1), _shard(r64, rank, counts, 1),
           dtype)
    for name, got, low, high in zip(("dq", "dk", "dv", "dbias1", "dbias2"), grads, ref_grads,
                                    g64):
        if got is None:
            assert low is None, name
            continue
        if name != "dbias2":
            low, high = _shard(low, rank, counts, 1), _shard(high, rank, counts, 1)
        _check(f"rank {rank} {name}", got, low, high, dtype)
    return None if grads[4] is None else grads[4].cpu()


# ---- bitwise determinism, torch.compile, activation checkpointing --------------------------

def _ulysses_and_evoformer(rank, P, seed, kind, dtype, wrap=None):
    """The outputs and gradients of one Ulysses call (SparseSelfAttention) and one Evoformer call,
    each through wrap(fn) when given (torch.compile, checkpointing)."""
    device = _device(rank, kind)
    config, causal, inputs, dout = _sparse_problem(P, seed, dtype, device)
    s = inputs[0].shape[1]
    local = _BatchFirstSparse(sp.head_slice_config(config), s, causal).to(device)
    attn = sp.DistributedAttention(local, None)

    def ulysses(q, k, v):
        return attn(q, k, v, batch_dim_idx=0) * 2

    fn = wrap(ulysses) if wrap else ulysses
    leaves = [_leaf(sp.split_sequence(t, 1)) for t in inputs]
    out = fn(*leaves)
    results = [out] + list(_grads(out, sp.split_sequence(dout, 1), leaves))
    counts, e_inputs, e_dout = _evoformer_problem(P, seed + 1, dtype, device, True, "float",
                                                  True)
    q, k, v, b1, b2 = e_inputs
    mine = [_shard(t, rank, counts, 1) for t in (q, k, v, b1)] + [b2]

    def evo(*args):
        return sp.evoformer_attention(*args) + 1

    e_out, e_grads = _evoformer_call(wrap(evo) if wrap else evo, mine,
                                     _shard(e_dout, rank, counts, 1))
    return results + [e_out] + e_grads


def _same_bits(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(
            x.view(torch.uint8) if x.dtype != torch.bool else x,
            y.view(torch.uint8) if y.dtype != torch.bool else y), f"{what}: result {i} differs"


def deterministic(rank, P, seed, kind, dtype_name):
    """Two runs of the same calls give the same bits (outputs and every gradient)."""
    dtype = DTYPES[dtype_name]
    first = _ulysses_and_evoformer(rank, P, seed, kind, dtype)
    second = _ulysses_and_evoformer(rank, P, seed, kind, dtype)
    _same_bits(first, second, "rerun")


def compiled(rank, P, seed, kind, dtype_name, backend):
    """torch.compile(fullgraph=True) of the distributed calls (a graph break would raise) gives
    the eager results, and dynamo's explain counts one graph and no break."""
    dtype = DTYPES[dtype_name]
    torch._dynamo.reset()
    eager = _ulysses_and_evoformer(rank, P, seed, kind, dtype)
    got = _ulysses_and_evoformer(rank, P, seed, kind, dtype,
                                 lambda fn: torch.compile(fn, fullgraph=True, backend=backend))
    for i, (a, b) in enumerate(zip(got, eager)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"result {i}")
    device = _device(rank, kind)
    x = _draw((2 * P, 1, 2 * P, 8), dtype, device)
    attn = sp.DistributedAttention(sdpa_seq_first, None)
    explained = torch._dynamo.explain(lambda q: attn(q, q, q))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


def checkpointed(rank, P, seed, kind, dtype_name):
    """torch.utils.checkpoint around the distributed calls (the backward recomputes them, the
    all-to-alls included) gives the same bits as without it."""
    dtype = DTYPES[dtype_name]
    plain = _ulysses_and_evoformer(rank, P, seed, kind, dtype)

    def wrap(fn):
        return lambda *args: torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)

    _same_bits(_ulysses_and_evoformer(rank, P, seed, kind, dtype, wrap), plain, "checkpoint")


# ---- errors ---------------------------------------------------------------------------------

def _raises(fn, error, *fragments):
    try:
        fn()
    except error as e:
        text = str(e)
        for f in fragments:
            assert f in text, f"{f!r} not in the message: {text}"
        return text
    raise AssertionError(f"no {error.__name__} raised; expected one naming {fragments}")


def errors(rank, P, seed):
    """The documented errors: each raised on every rank, before any collective."""
    x = torch.randn(P * 2, 1, P + 1, 4)
    attn = sp.DistributedAttention(sdpa_seq_first, None)
    _raises(lambda: attn(x, x, x), ValueError, f"h = {P + 1} heads", f"P = {P}", "h % P = 1",
            "uneven_heads=True")
    few = torch.randn(2, 1, P - 1, 4)
    _raises(lambda: sp.DistributedAttention(sdpa_seq_first, None, uneven_heads=True)(few, few,
                                                                                        few),
            ValueError, f"h = {P - 1} heads", f"P = {P}", "at least one head")
    seq = torch.randn(P * 3 + 1, 2)
    _raises(lambda: sp.split_sequence(seq), ValueError, f"s = {P * 3 + 1}", f"P = {P}",
            "s % P = 1")
    _raises(lambda: sp.all_to_all(torch.randn(3, P + 1), 1, 0), ValueError, f"size {P + 1}",
            "size % P = 1")
    _raises(lambda: sp.all_to_all(torch.randn(3, P), 1, 1), ValueError, "different dimensions")
    _raises(lambda: sp.all_to_all(torch.randn(3, P), 2, 0), ValueError, "scatter_idx = 2")
    y = torch.randn(2, 1, P, 4)
    _raises(lambda: attn(y, y, y, batch_dim_idx=2), ValueError, "batch_dim_idx")
    halve = sp.DistributedAttention(lambda q, k, v: q[: q.shape[0] // 2], None)
    _raises(lambda: halve(y, y, y), ValueError, "local_attention returned shape",
            "whole sequence")
    _raises(lambda: sp.head_range(P + 1), ValueError, "h % P = 1")
    assert sp.head_range(P + 1, uneven_heads=True) == (range(0, 2) if rank == 0 else
                                                        range(rank + 1, rank + 2))
    _raises(lambda: sp.HeadSliceSparsityConfig(BigBirdSparsityConfig(2), 1, 3), ValueError,
            "[1, 3)")
    # Every rank creates every group; rank 1 is not in this one.
    only_rank0 = torch.distributed.new_group([0])
    if rank != 0:
        _raises(lambda: sp.DistributedAttention(sdpa_seq_first, only_rank0)(y, y, y),
                RuntimeError, "not a member")
    # Each error above is raised before any collective, so every rank reaches this barrier.
    torch.distributed.barrier()

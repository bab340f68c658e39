"""Bad input raises a Python exception of the documented type whose message names the argument
and what is expected; nothing crashes."""
import pytest
import torch

import sciattn
from sciattn.sparse_attention import (DenseSparsityConfig, MatMul, Softmax, SparseSelfAttention)

ops = torch.ops.sciattn


def evo(device, **over):
    args = dict(q=torch.randn(1, 2, 8, 2, 4, device=device),
                k=torch.randn(1, 2, 8, 2, 4, device=device),
                v=torch.randn(1, 2, 8, 2, 4, device=device),
                bias1=torch.randn(1, 2, 1, 1, 8, device=device),
                bias2=torch.randn(1, 1, 2, 8, 8, device=device))
    args.update(over)
    return args


EVO_CASES = [
    ("q_not_tensor", dict(q=[1.0]), TypeError, r"q must be a torch\.Tensor"),
    ("q_int", dict(q=torch.ones(1, 2, 8, 2, 4, dtype=torch.int32)), TypeError, r"q has dtype"),
    ("q_rank", dict(q=torch.randn(2, 8, 2, 4)), ValueError, r"q must have shape \[B, N, L, H, D\]"),
    ("k_shape", dict(k=torch.randn(1, 2, 9, 2, 4)), ValueError, r"k must have shape"),
    ("v_dtype", dict(v=torch.randn(1, 2, 8, 2, 4).half()), TypeError, r"v has dtype"),
    ("bias1_shape", dict(bias1=torch.randn(1, 2, 1, 8, 8)), ValueError,
     r"bias1 must have shape \[B, N, 1, 1, L\] = \[1, 2, 1, 1, 8\]"),
    ("bias2_shape", dict(bias2=torch.randn(1, 2, 2, 8, 8)), ValueError,
     r"bias2 must have shape \[B, 1, H, L, L\] = \[1, 1, 2, 8, 8\]"),
    ("bias2_dtype", dict(bias2=torch.ones(1, 1, 2, 8, 8, dtype=torch.int64)), TypeError,
     r"bias2 has dtype"),
    ("k_device", dict(k=torch.randn(1, 2, 8, 2, 4, device="meta")), ValueError,
     r"k is on meta"),
    ("q_empty", dict(q=torch.randn(1, 2, 0, 2, 4), k=torch.randn(1, 2, 0, 2, 4),
                     v=torch.randn(1, 2, 0, 2, 4), bias1=None, bias2=None), ValueError,
     r"must not be empty|q"),
]


@pytest.mark.parametrize("name,over,error,pattern", EVO_CASES, ids=[c[0] for c in EVO_CASES])
def test_evoformer_bad_input(device, name, over, error, pattern):
    args = evo("cpu", **over)
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v)
            for k, v in args.items()}
    with pytest.raises(error, match=pattern):
        sciattn.evoformer_attention(**args)


def test_evoformer_bad_scale_and_options(device):
    a = evo(device)
    with pytest.raises(ValueError, match="scale must be finite"):
        sciattn.evoformer_attention(**a, scale=float("inf"))
    with pytest.raises(TypeError, match="scale must be a float"):
        sciattn.evoformer_attention(**a, scale="x")
    with pytest.raises(ValueError, match="algorithm"):
        sciattn.evoformer_attention(**a, algorithm="fast")
    with pytest.raises(ValueError, match="biases must hold at most 2"):
        sciattn.DS4Sci_EvoformerAttention(a["q"], a["k"], a["v"], [None, None, None])
    with pytest.raises(TypeError, match="biases must be a list"):
        sciattn.DS4Sci_EvoformerAttention(a["q"], a["k"], a["v"], a["bias1"])


def test_raw_op_errors_name_the_argument(device):
    """The C++ checks behind the Python ones: the library's message names the Params field."""
    a = evo(device)
    with pytest.raises(ValueError, match="bias2"):
        ops.evoformer_fwd(a["q"], a["k"], a["v"], None, torch.randn(1, 1, 3, 8, 8, device=device),
                          None, "tiled")
    with pytest.raises(TypeError, match="dtype"):
        ops.evoformer_fwd(a["q"].long(), a["k"].long(), a["v"].long(), None, None, None, "tiled")
    with pytest.raises(ValueError, match="q must have shape"):
        ops.evoformer_fwd(a["q"][0], a["k"], a["v"], None, None, None, "tiled")
    with pytest.raises(ValueError, match="algorithm"):
        ops.evoformer_fwd(a["q"], a["k"], a["v"], None, None, None, "fast")
    layout = torch.ones(1, 2, 2, dtype=torch.long)
    x = torch.randn(1, 4, 16, 16, device=device)
    with pytest.raises(ValueError, match="nnz"):
        ops.bs_softmax(x, layout, 16, 3, 1.0, None, None, None, "add", "add")
    with pytest.raises(ValueError, match="0s and 1s"):
        ops.bs_softmax(x, layout * 2, 16, 4, 1.0, None, None, None, "add", "add")
    with pytest.raises(ValueError, match="key_padding_mask"):
        ops.bs_softmax(x, layout, 16, 4, 1.0, None, torch.zeros(1, 31, device=device), None,
                       "add", "add")


def test_raw_op_enums_are_named_strings(device):
    """The ops' enum arguments cross the schema as strings; a wrong one names the argument and the
    accepted values. sparsity_layout's config fields are keyword-only, with DeepSpeed's defaults."""
    layout = torch.ones(1, 2, 2, dtype=torch.long)
    a = torch.randn(1, 1, 32, 8, device=device)
    b = torch.randn(1, 1, 8, 32, device=device)
    with pytest.raises(ValueError, match="mode must be 'sdd', 'dsd' or 'dds'; got 'ssd'"):
        ops.bsmm(a, b, layout, 16, 4, "ssd", False, False)
    x = torch.randn(1, 4, 16, 16, device=device)
    with pytest.raises(ValueError, match="attn_mask_mode must be 'add' or 'mul'"):
        ops.bs_softmax(x, layout, 16, 4, 1.0, None, None, None, "add", "max")
    q = torch.randn(1, 1, 32, 8, device=device)
    with pytest.raises(ValueError, match="algorithm must be 'fused', 'composite' or 'reference'"):
        ops.sparse_attention_fwd(q, q, q, layout, 16, 4, None, None, None, None, False,
                                 algorithm="dense")
    fixed = ops.sparsity_layout("fixed", 2, 16, seq_len=128, num_local_blocks=2)
    assert fixed.shape == (2, 8, 8)
    with pytest.raises(RuntimeError):
        ops.sparsity_layout("fixed", 2, 16, 128)  # seq_len is keyword-only


def test_sparse_ops_bad_input(device):
    layout = torch.tensor([[[1, 0], [1, 1]]])
    with pytest.raises(NotImplementedError, match="sdd, dsd, dds"):
        MatMul(layout, 16, "ssd")
    with pytest.raises(ValueError, match="block must be 16, 32, 64 or 128"):
        MatMul(layout, 8, "sdd")
    with pytest.raises(ValueError, match="layout must hold only 0s and 1s"):
        MatMul(layout * 3, 16, "sdd")
    # The check sees a single bad entry, below 0 or above 1, in any integer dtype; bool layouts
    # need none.
    for bad, dtype in ((-1, torch.int8), (2, torch.uint8), (256, torch.int32), (-7, torch.int64),
                       (2**40, torch.int64)):
        wrong = layout.to(dtype).clone()
        wrong[0, 1, 0] = bad
        with pytest.raises(ValueError, match="layout must hold only 0s and 1s"):
            Softmax(wrong, 16)
    assert Softmax(layout.bool(), 16).nnz == int(layout.sum())
    with pytest.raises(TypeError, match="layout must be an integer"):
        Softmax(layout.float(), 16)
    mm = MatMul(layout, 16, "sdd")
    a = torch.randn(1, 1, 32, 8, device=device)
    with pytest.raises(TypeError, match="b has dtype"):
        mm(a, torch.randn(1, 1, 8, 32, device=device).double())
    with pytest.raises(ValueError, match=r"\bb\b.*shape|inner|K"):
        mm(a, torch.randn(1, 1, 9, 32, device=device))
    sm = Softmax(layout, 16)
    x = torch.randn(1, 3, 16, 16, device=device)
    with pytest.raises(ValueError, match="key_padding_mask_mode"):
        sm(x, key_padding_mask_mode="multiply")
    with pytest.raises(TypeError, match="rpe has dtype"):
        sm(x, rpe=torch.ones(1, 1, 32, 32, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"rpe must be broadcastable to \[Z, H, R\*block"):
        sm(x, rpe=torch.zeros(3, 32, 32, device=device))
    with pytest.raises(ValueError, match=r"x must have shape \[Z, nnz, block, block\]"):
        sm(x[0])


def test_sparse_self_attention_bad_input(device):
    module = SparseSelfAttention(DenseSparsityConfig(2), max_seq_length=64)
    q = torch.randn(1, 2, 48, 8, device=device)
    with pytest.raises(ValueError, match="Sequence Length, 40, needs to be dividable"):
        module(q[:, :, :40], q[:, :, :40], q[:, :, :40])
    with pytest.raises(ValueError, match="max_seq_length = 64"):
        big = torch.randn(1, 2, 80, 8, device=device)
        module(big, big, big)
    with pytest.raises(ValueError, match="num_heads must be 3"):
        q3 = torch.randn(1, 3, 48, 8, device=device)
        module(q3, q3, q3)
    with pytest.raises(NotImplementedError, match="self-attention"):
        module(q, q, q[..., :4])
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \[B, L\]"):
        module(q, q, q, key_padding_mask=torch.zeros(1, 47, device=device))
    with pytest.raises(ValueError, match=r"attn_mask must have shape \[L, L\]"):
        module(q, q, q, attn_mask=torch.ones(48, 40, device=device))
    with pytest.raises(ValueError, match="rpe must be broadcastable"):
        module(q, q, q, rpe=torch.zeros(3, 48, 48, device=device))
    with pytest.raises(TypeError, match="query has dtype"):
        module(q.long(), q.long(), q.long())
    with pytest.raises(ValueError, match="algorithm"):
        SparseSelfAttention(DenseSparsityConfig(2), algorithm="magic")


def test_cuda_kernels_says_which_or_why(device, monkeypatch):
    """sciattn.cuda_kernels(): "warpgroup" or "portable" where the CUDA kernels run (the portable
    ones under SCIATTN_CUDA_KERNELS=portable), else a RuntimeError saying what is missing."""
    with pytest.raises(ValueError, match="must be a CUDA device"):
        sciattn.cuda_kernels("cpu")
    if device.type != "cuda" or not sciattn.built_with_cuda():
        with pytest.raises(RuntimeError, match="SCIATTN_WITH_CUDA|no CUDA device"):
            sciattn.cuda_kernels()
        return
    assert sciattn.cuda_kernels() in ("warpgroup", "portable")
    assert sciattn.cuda_kernels(0) == sciattn.cuda_kernels(torch.device("cuda", 0))
    monkeypatch.setenv("SCIATTN_CUDA_KERNELS", "portable")
    assert sciattn.cuda_kernels() == "portable"
    monkeypatch.setenv("SCIATTN_CUDA_KERNELS", "fastest")
    with pytest.raises(RuntimeError, match="SCIATTN_CUDA_KERNELS is 'fastest'"):
        sciattn.cuda_kernels()
    with pytest.raises(RuntimeError, match="does not exist"):
        sciattn.cuda_kernels(torch.cuda.device_count())

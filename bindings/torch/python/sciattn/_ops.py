"""Loads the compiled extension (the torch.ops.sciattn.* ops) and registers, for each op, its fake
(meta) kernel for torch.compile, and the autograd formulas of the composite block-sparse ops
(bsmm, bs_softmax). The C++ side registers the schemas and the CPU and CUDA kernels
(bindings/torch/*_ops.cpp) and the autograd of the two attention ops (bindings/torch/autograd.cpp)."""
import glob
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_extension():
    candidates = sorted(glob.glob(os.path.join(_HERE, "_sciattn_ops*.so")))
    if not candidates:
        raise ImportError(
            "sciattn: the compiled extension _sciattn_ops.so is missing from "
            f"{_HERE}; install the package with `pip install --no-build-isolation .` or build it "
            "with scripts/build_torch_ext.sh (see docs/python.md)")
    torch.ops.load_library(candidates[0])


_load_extension()
ops = torch.ops.sciattn


def _check_extension_matches():
    """The attention ops' autograd lives in the compiled module (bindings/torch/autograd.cpp). A
    module built from older sources lacks it, and torch would differentiate those ops as
    constants with only a warning; such a mix is refused here."""
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if has_kernel is None:  # a torch without this query: nothing to check with
        return
    for op in ("evoformer_fwd", "sparse_attention_fwd"):
        if not has_kernel(f"sciattn::{op}", "Autograd"):
            raise ImportError(
                f"sciattn: the compiled extension in {_HERE} has no autograd for {op}: it was "
                "built from older sources than these Python files; rebuild it "
                "(pip install --no-build-isolation ., or scripts/build_torch_ext.sh)")


_check_extension_matches()

# The values of the ops' enum arguments, which cross the op schemas as strings.
EVOFORMER_ALGORITHMS = ("tiled", "reference")
ATTENTION_ALGORITHMS = ("fused", "composite", "reference")
MASK_MODES = ("add", "mul")
MATMUL_MODES = ("sdd", "dsd", "dds")


def built_with_cuda() -> bool:
    """True when this build of sciattn has its CUDA kernels (and registers CUDA op kernels)."""
    return bool(ops.built_with_cuda())


def cuda_kernels(device=None) -> str:
    """Which of sciattn's CUDA kernels run on `device` (an int, a torch.device or None for the
    current CUDA device): "warpgroup" (Hopper's sm_90a kernels where they apply) or "portable"
    (the mma.sync kernels of every GPU from sm_80). Raises RuntimeError saying why when they cannot
    run there (no CUDA build, a GPU older than sm_80, no code for its architecture in this build)."""
    if device is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else -1
    else:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"cuda_kernels: device must be a CUDA device; got {device}")
        index = device.index if device.index is not None else torch.cuda.current_device()
    return str(ops.cuda_kernels(index))


def _lse_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _empty0(t):
    return t.new_empty((0,))


# ---- Evoformer --------------------------------------------------------------------------------

@torch.library.register_fake("sciattn::evoformer_fwd")
def _evoformer_fwd_fake(q, k, v, bias1, bias2, scale, algorithm="tiled"):
    B, N, L, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B * N, H, L), dtype=_lse_dtype(q))


@torch.library.register_fake("sciattn::evoformer_bwd")
def _evoformer_bwd_fake(dout, q, k, v, bias1, bias2, out, lse, scale, need_dbias1, need_dbias2,
                        algorithm="tiled"):
    db1 = bias1.new_empty(bias1.shape) if need_dbias1 else _empty0(q)
    db2 = bias2.new_empty(bias2.shape) if need_dbias2 else _empty0(q)
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), db1, db2


# evoformer_fwd's autograd formula is registered in C++ (bindings/torch/autograd.cpp): a Python
# one cost ~0.3 ms of host time per forward + backward, more than the kernels of small shapes.


# ---- First derivatives only ---------------------------------------------------------------------

class _BackwardOp(torch.autograd.Function):
    """A backward op's call as an autograd node whose own backward raises, for when autograd
    records the backward (create_graph=True): a second derivative is refused instead of coming out
    silently without this op's term (torch differentiates an op without an autograd formula as a
    constant, with only a warning). The C++ attention ops do the same (autograd.cpp)."""

    @staticmethod
    def forward(ctx, name, call, *inputs):  # inputs: for autograd's edges only
        ctx.name = name
        return call()

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"sciattn.{ctx.name}: the gradients are not differentiable (no second derivative; "
            "create_graph=True gives correct first derivatives, but backpropagating through "
            "them is not supported)")


def _run_backward_op(name, call, *inputs):
    return _BackwardOp.apply(name, call, *inputs) if torch.is_grad_enabled() else call()


# ---- Block-sparse MatMul ----------------------------------------------------------------------

@torch.library.register_fake("sciattn::bsmm")
def _bsmm_fake(a, b, layout, block, nnz, mode, trans_a, trans_b):
    H, R, C = layout.shape
    if mode == "sdd":
        return a.new_empty((a.shape[0], nnz, block, block))
    if mode == "dsd":
        return b.new_empty((b.shape[0], H, (C if trans_a else R) * block,
                            b.shape[2] if trans_b else b.shape[3]))
    return a.new_empty((a.shape[0], H, a.shape[3] if trans_a else a.shape[2],
                        (R if trans_b else C) * block))


@torch.library.register_fake("sciattn::bsmm_bwd")
def _bsmm_bwd_fake(dc, a, b, layout, block, nnz, mode, trans_a, trans_b, need_da, need_db):
    return (a.new_empty(a.shape) if need_da else _empty0(a),
            b.new_empty(b.shape) if need_db else _empty0(b))


def _bsmm_setup(ctx, inputs, output):
    a, b, layout, block, nnz, mode, trans_a, trans_b = inputs
    ctx.save_for_backward(a, b, layout)
    ctx.args = (block, nnz, mode, trans_a, trans_b)


def _bsmm_backward(ctx, dc):
    a, b, layout = ctx.saved_tensors
    need_da, need_db = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need_da or need_db):
        return (None,) * 8
    da, db = _run_backward_op(
        "MatMul (backward)",
        lambda: ops.bsmm_bwd(dc, a, b, layout, *ctx.args, need_da, need_db), dc, a, b)
    return (da if need_da else None, db if need_db else None) + (None,) * 6


torch.library.register_autograd("sciattn::bsmm", _bsmm_backward, setup_context=_bsmm_setup)


# ---- Block-sparse Softmax ---------------------------------------------------------------------

@torch.library.register_fake("sciattn::bs_softmax")
def _bs_softmax_fake(x, layout, block, nnz, scale, rpe, key_padding_mask, attn_mask,
                     key_padding_mask_mode="add", attn_mask_mode="mul"):
    return x.new_empty(x.shape)


@torch.library.register_fake("sciattn::bs_softmax_bwd")
def _bs_softmax_bwd_fake(dy, y, layout, block, nnz, scale):
    return y.new_empty(y.shape)


def _bs_softmax_setup(ctx, inputs, output):
    x, layout, block, nnz, scale = inputs[:5]
    ctx.save_for_backward(output, layout)
    ctx.args = (block, nnz, scale)


def _bs_softmax_backward(ctx, dy):
    y, layout = ctx.saved_tensors
    dx = (_run_backward_op("Softmax (backward)",
                           lambda: ops.bs_softmax_bwd(dy, y, layout, *ctx.args), dy, y)
          if ctx.needs_input_grad[0] else None)
    # rpe and the masks get no gradient, as in DeepSpeed.
    return (dx,) + (None,) * 9


torch.library.register_autograd("sciattn::bs_softmax", _bs_softmax_backward,
                                setup_context=_bs_softmax_setup)


# ---- Sparse self-attention --------------------------------------------------------------------

@torch.library.register_fake("sciattn::sparse_attention_fwd")
def _sparse_attention_fwd_fake(q, k, v, layout, block, nnz, rpe, key_padding_mask, attn_mask,
                               scale, causal, key_padding_mask_mode="add", attn_mask_mode="mul",
                               algorithm="fused"):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=_lse_dtype(q))


@torch.library.register_fake("sciattn::sparse_attention_bwd")
def _sparse_attention_bwd_fake(dout, q, k, v, out, lse, layout, block, nnz, rpe,
                               key_padding_mask, attn_mask, scale, causal,
                               key_padding_mask_mode="add", attn_mask_mode="mul",
                               algorithm="fused"):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


# sparse_attention_fwd's autograd formula is in C++ too (bindings/torch/autograd.cpp).

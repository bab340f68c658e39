"""Evoformer attention (DeepSpeed's DS4Sci_EvoformerAttention math) as a differentiable torch op.

    O[b,n,i,h,:] = sum_j softmax_j(scale <Q[b,n,i,h,:], K[b,n,j,h,:]> + bias1[b,n,0,0,j]
                                   + bias2[b,0,h,i,j]) V[b,n,j,h,:]
"""
import torch

from . import _checks
from ._ops import EVOFORMER_ALGORITHMS, ops

_SHAPE = "[B, N, L, H, D]"


_LOW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _plainly_valid(q, k, v, bias1, bias2):
    """True for the common valid call (plain tensors, f32/f16/bf16 on cpu or cuda), checked in
    one pass; anything else takes _check's argument-by-argument path, which names what is wrong.
    It takes ~5 us where that path took 12-14 on the 2-core CI-like machine (the checks were
    17-37 us of a call's host time on the H200 machine, where small calls are bound by it)."""
    tensor = torch.Tensor
    if type(q) is not tensor or type(k) is not tensor or type(v) is not tensor:
        return False
    dtype, device, shape = q.dtype, q.device, q.shape
    if (dtype not in _LOW_DTYPES or len(shape) != 5 or device.type not in ("cpu", "cuda")
            or k.shape != shape or v.shape != shape or k.dtype != dtype or v.dtype != dtype
            or k.device != device or v.device != device):
        return False
    B, N, L, H, _ = shape
    if bias1 is not None and (type(bias1) is not tensor or bias1.shape != (B, N, 1, 1, L)
                              or bias1.dtype not in (dtype, torch.float32, torch.bool)
                              or bias1.device != device):
        return False
    return bias2 is None or (type(bias2) is tensor and bias2.shape == (B, 1, H, L, L)
                             and bias2.dtype in (dtype, torch.float32) and bias2.device == device)


def _check(q, k, v, bias1, bias2):
    if _plainly_valid(q, k, v, bias1, bias2):
        return
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _checks.tensor(x, name)
    _checks.optional_tensor(bias1, "bias1")
    _checks.optional_tensor(bias2, "bias2")
    _checks.float_dtype(q, "q")
    _checks.supported_device(q, "q")
    _checks.ndim(q, "q", 5, _SHAPE)
    B, N, L, H, _ = q.shape
    for x, name in ((k, "k"), (v, "v")):
        _checks.same_dtype(x, name, q, "q")
        _checks.same_device(x, name, q, "q")
        _checks.shape(x, name, q.shape, _SHAPE)
    low = q.dtype != torch.float64
    if bias1 is not None:
        allowed = (q.dtype, torch.float32, torch.bool) if low else (torch.float64, torch.bool)
        _checks.dtype_in(bias1, "bias1", allowed,
                         f"q's dtype ({q.dtype}), float32 or bool" if low else "float64 or bool")
        _checks.same_device(bias1, "bias1", q, "q")
        _checks.shape(bias1, "bias1", (B, N, 1, 1, L), "[B, N, 1, 1, L]")
    if bias2 is not None:
        allowed = (q.dtype, torch.float32) if low else (torch.float64,)
        _checks.dtype_in(bias2, "bias2", allowed,
                         f"q's dtype ({q.dtype}) or float32" if low else "float64")
        _checks.same_device(bias2, "bias2", q, "q")
        _checks.shape(bias2, "bias2", (B, 1, H, L, L), "[B, 1, H, L, L]")


def evoformer_attention(q, k, v, bias1=None, bias2=None, scale=None, *, algorithm="tiled"):
    """Evoformer attention of q, k, v [B, N, L, H, D] with the optional mask bias bias1
    [B, N, 1, 1, L] (float, or bool with True = attend) and pair bias bias2 [B, 1, H, L, L].

    scale defaults to 1/sqrt(D). Differentiable in q, k, v, a float bias1 and bias2; bias
    gradients are computed only for biases that require grad. Returns [B, N, L, H, D] in q's
    dtype. float32/float16/bfloat16 run the library (CPU, and CUDA in CUDA builds);
    float64 runs a plain ATen path meant for gradcheck (docs/python.md). `algorithm`
    ("tiled" or "reference") picks the CPU implementation; "reference" is the naive C++ oracle.
    """
    _check(q, k, v, bias1, bias2)
    s = _checks.scale(scale)
    alg = _checks.choice(algorithm, "algorithm", EVOFORMER_ALGORITHMS)
    out, _ = ops.evoformer_fwd(q, k, v, bias1, bias2, s, alg)
    return out


def DS4Sci_EvoformerAttention(Q, K, V, biases):  # noqa: N802 (DeepSpeed's name)
    """DeepSpeed's DS4Sci_EvoformerAttention(Q, K, V, biases): biases is a list of at most two
    tensors [bias1] or [bias1, bias2] (either may be None); shapes as in evoformer_attention.
    Unlike DeepSpeed, the caller's list is not modified."""
    if not isinstance(biases, (list, tuple)):
        raise TypeError(f"biases must be a list of at most 2 tensors (or None); "
                        f"got {type(biases).__name__}")
    if len(biases) > 2:
        raise ValueError(f"biases must hold at most 2 tensors [bias1, bias2]; got {len(biases)}")
    padded = list(biases) + [None] * (2 - len(biases))
    return evoformer_attention(Q, K, V, padded[0], padded[1])

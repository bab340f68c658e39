"""DeepSpeed's block-sparse ``MatMul(layout, block, mode, trans_a=False, trans_b=False)``."""
import torch

from .. import _checks
from .._ops import MATMUL_MODES, ops
from ._layout import block_size, prepare_layout


class MatMul:
    """C = op(A) op(B) with one operand or the result block-sparse on `layout`:
    sdd (sparse result [Z, nnz, b, b]), dsd (A sparse), dds (B sparse). Dense operands are
    [Z, H, rows, cols] (fewer leading dims are padded, and removed again from the result);
    op(X) swaps X's last two dims when the trans flag is set. Differentiable in both operands."""

    def __init__(self, layout, block, mode, trans_a=False, trans_b=False):
        if mode not in MATMUL_MODES:
            raise NotImplementedError(f"Supported modes are: sdd, dsd, dds; got mode={mode!r}")
        self.layout, self.nnz = prepare_layout(layout)
        self.block = block_size(block)
        self.mode = mode
        self.trans_a = bool(trans_a)
        self.trans_b = bool(trans_b)
        self.spdims = tuple(self.layout.shape)

    def __call__(self, a, b):
        _checks.tensor(a, "a")
        _checks.tensor(b, "b")
        _checks.float_dtype(a, "a")
        _checks.same_dtype(b, "b", a, "a")
        _checks.supported_device(a, "a")
        _checks.same_device(b, "b", a, "a")
        dims = max(a.dim(), b.dim())
        if a.dim() > 4 or b.dim() > 4:
            raise ValueError(f"a and b may have at most 4 dimensions; got {list(a.shape)} and "
                             f"{list(b.shape)}")
        while a.dim() < 4:
            a = a.unsqueeze(0)
        while b.dim() < 4:
            b = b.unsqueeze(0)
        c = ops.bsmm(a, b, self.layout, self.block, self.nnz, self.mode, self.trans_a,
                     self.trans_b)
        # Remove the padded leading dims again; a sparse result keeps [nnz, b, b].
        for _ in range(min(4 - dims, 1) if self.mode == "sdd" else 4 - dims):
            c = c.squeeze(0)
        return c


__all__ = ["MatMul"]

"""DeepSpeed's block-sparse ``Softmax(layout, block)``."""
import torch

from .. import _checks
from .._ops import MASK_MODES, ops
from ._layout import block_size, prepare_layout


class Softmax:
    """Row softmax of a block-sparse tensor x [Z, nnz, b, b] over each row's layout entries:
    y = softmax(x * scale + rpe + key_padding_mask + attn_mask). Masks in 'add' mode are added;
    'mul' removes the keys where the mask is 0; a bool mask means True = keep. A fully masked
    row gives 0 (DeepSpeed: NaN). Returns a new tensor (DeepSpeed works in place)."""

    def __init__(self, layout, block):
        self.layout, self.nnz = prepare_layout(layout)
        self.block = block_size(block)
        self.spdims = tuple(self.layout.shape)

    def __call__(self, x, scale=1.0, rpe=None, key_padding_mask=None, attn_mask=None,
                 key_padding_mask_mode="add", attn_mask_mode="add"):
        _checks.tensor(x, "x")
        _checks.float_dtype(x, "x")
        _checks.supported_device(x, "x")
        _checks.ndim(x, "x", 4, "[Z, nnz, block, block]")
        if isinstance(scale, torch.Tensor):
            scale = float(scale)
        s = _checks.scale(scale)
        allowed = (x.dtype, torch.float32) if x.dtype != torch.float64 else (torch.float64,)
        for t, name in ((rpe, "rpe"), (key_padding_mask, "key_padding_mask"),
                        (attn_mask, "attn_mask")):
            if t is None:
                continue
            _checks.tensor(t, name)
            _checks.same_device(t, name, x, "x")
            ok = allowed if name == "rpe" else allowed + (torch.bool,)
            _checks.dtype_in(t, name, ok, f"one of {[str(d) for d in ok]}")
        if rpe is not None:  # DeepSpeed read rpe through its strides: broadcasting works
            H, R, C = self.spdims
            shape = (x.shape[0], H, R * self.block, C * self.block)
            try:
                rpe = rpe.expand(shape)
            except RuntimeError:
                raise ValueError(f"rpe must be broadcastable to [Z, H, R*block, C*block] = "
                                 f"{list(shape)}; got {list(rpe.shape)}") from None
        kpm_mode = _checks.choice(key_padding_mask_mode, "key_padding_mask_mode", MASK_MODES)
        am_mode = _checks.choice(attn_mask_mode, "attn_mask_mode", MASK_MODES)
        return ops.bs_softmax(x, self.layout, self.block, self.nnz, s, rpe, key_padding_mask,
                              attn_mask, kpm_mode, am_mode)


__all__ = ["Softmax"]

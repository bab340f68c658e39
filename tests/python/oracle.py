"""Independent fp64 implementations of the ops for the tests: dense torch code, gradients by
torch.autograd (not the explicit formulas of the library or of the binding's fp64 path)."""
import math

import torch


def _softmax_safe(s):
    # A row of all -inf gives zeros (sciattn's rule for fully masked rows).
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    return e / torch.where(z == 0, torch.ones_like(z), z)


def evoformer(q, k, v, bias1=None, bias2=None, scale=None):
    """q, k, v [B, N, L, H, D] -> [B, N, L, H, D]."""
    D = q.shape[-1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    qh, kh, vh = (x.permute(0, 1, 3, 2, 4) for x in (q, k, v))  # [B, N, H, L, D]
    s = scale * qh @ kh.transpose(-1, -2)
    if bias1 is not None:
        if bias1.dtype == torch.bool:
            bias1 = torch.zeros(bias1.shape, dtype=s.dtype).masked_fill(~bias1, -math.inf)
        s = s + bias1
    if bias2 is not None:
        s = s + bias2
    return (_softmax_safe(s) @ vh).permute(0, 1, 3, 2, 4)


def mask_term(m, mode):
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m.cpu(), -math.inf)
    m = m.double().cpu()
    if mode == "mul":
        return torch.zeros_like(m).masked_fill(m == 0, -math.inf)
    return m


def token_layout(layout, block):
    return layout.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)


def sparse_to_dense(s, layout, block):
    """[Z, nnz, b, b] -> dense [Z, H, R*b, C*b], zero outside the layout."""
    H, R, C = layout.shape
    out = torch.zeros(s.shape[0], H, R * block, C * block, dtype=s.dtype)
    for p, (h, r, c) in enumerate(layout.nonzero().tolist()):
        out[:, h, r * block:(r + 1) * block, c * block:(c + 1) * block] = s[:, p]
    return out


def dense_to_sparse(d, layout, block):
    blocks = [d[:, h, r * block:(r + 1) * block, c * block:(c + 1) * block]
              for h, r, c in layout.nonzero().tolist()]
    return torch.stack(blocks, 1)


def matmul(a, b, layout, block, mode, trans_a, trans_b):
    A = sparse_to_dense(a, layout, block) if mode == "dsd" else a
    B = sparse_to_dense(b, layout, block) if mode == "dds" else b
    A = A.transpose(-1, -2) if trans_a else A
    B = B.transpose(-1, -2) if trans_b else B
    C = A @ B
    return dense_to_sparse(C, layout, block) if mode == "sdd" else C


def softmax(x, layout, block, scale=1.0, rpe=None, kpm=None, am=None, kpm_mode="add",
            am_mode="add"):
    v = sparse_to_dense(x, layout, block) * scale
    if rpe is not None:
        v = v + rpe.to(v.device, torch.float64)
    if kpm is not None:
        v = v + mask_term(kpm.to(v.device), kpm_mode)[:, None, None, :]
    if am is not None:
        v = v + mask_term(am.to(v.device), am_mode)
    v = v.masked_fill(~token_layout(layout, block)[None], -math.inf)
    return dense_to_sparse(_softmax_safe(v), layout, block)


def attention(q, k, v, layout, block, rpe=None, kpm=None, am=None, kpm_mode="add",
              am_mode="mul", causal=False, scale=None):
    """q, k, v [B, H, L, D]: dense attention with the block layout as a mask."""
    L, D = q.shape[-2:]
    scale = 1 / math.sqrt(D) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if rpe is not None:
        s = s + rpe.to(s.device, torch.float64)
    if kpm is not None:
        s = s + mask_term(kpm.to(s.device), kpm_mode)[:, None, None, :]
    if am is not None:
        s = s + mask_term(am.to(s.device), am_mode)
    keep = token_layout(layout, block)[None]
    if causal:
        keep = keep & torch.ones(L, L, dtype=torch.bool).tril()
    s = s.masked_fill(~keep, -math.inf)
    return _softmax_safe(s) @ v

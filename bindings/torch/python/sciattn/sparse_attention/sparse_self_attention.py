"""DeepSpeed's ``SparseSelfAttention`` nn.Module, on sciattn's fused block-sparse attention."""
import torch
from torch import nn

from .. import _checks
from .._ops import ATTENTION_ALGORITHMS, MASK_MODES, ops
from ._layout import block_size, prepare_layout
from .sparsity_config import SparsityConfig


def _crop_nnz(layout):
    """nnz of the top-left n x n crop of every head, for n = 0..N (one 2-D prefix sum)."""
    prefix = layout.sum(0).cumsum(0).cumsum(1)  # [N, N]
    return [0] + prefix.diagonal().tolist()


def _expand(t, name, shape):
    try:
        return t.expand(shape)
    except RuntimeError:
        raise ValueError(f"{name} must be broadcastable to {list(shape)}; got {list(t.shape)}") \
            from None


class SparseSelfAttention(nn.Module):
    """Block-sparse self-attention: softmax(scale Q K^T + rpe + masks) V on the blocks of the
    config's layout, query, key, value [B, H, L, D] (a key given as [B, H, D, L] is transposed
    back, as in DeepSpeed). The layout for length L is the top-left crop of
    make_layout(max_seq_length). DeepSpeed's arguments, plus keyword-only `causal` (token-level
    causal masking inside the diagonal blocks) and `algorithm` ('fused', the default, never
    materialises the scores; 'composite' is DeepSpeed's sdd -> softmax -> dsd; 'reference')."""

    def __init__(self, sparsity_config=SparsityConfig(num_heads=4), key_padding_mask_mode="add",
                 attn_mask_mode="mul", max_seq_length=2048, *, causal=False,
                 algorithm="fused"):
        super().__init__()
        self.sparsity_config = sparsity_config
        if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) \
                or max_seq_length < 1:
            raise ValueError(f"max_seq_length must be a positive int; got {max_seq_length!r}")
        self.max_seq_length = max_seq_length
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode
        self._kpm_mode = _checks.choice(key_padding_mask_mode, "key_padding_mask_mode", MASK_MODES)
        self._am_mode = _checks.choice(attn_mask_mode, "attn_mask_mode", MASK_MODES)
        self.causal = bool(causal)
        self.algorithm = algorithm
        self._algorithm = _checks.choice(algorithm, "algorithm", ATTENTION_ALGORITHMS)
        self.block = block_size(sparsity_config.block, "sparsity_config.block")
        master_layout = sparsity_config.make_layout(max_seq_length)
        layout, _ = prepare_layout(master_layout, "sparsity_config.make_layout(max_seq_length)",
                                   count=False)
        n_blocks = max_seq_length // self.block
        if layout.shape[1:] != (n_blocks, n_blocks):
            raise ValueError(f"sparsity_config.make_layout({max_seq_length}) must have shape "
                             f"[H, {n_blocks}, {n_blocks}]; got {list(layout.shape)}")
        # The buffer DeepSpeed saves in checkpoints (make_layout's tensor itself, as in DeepSpeed:
        # no copy, which at 65,536 tokens and block 16 would be another 2.1 GB); the ops read a
        # uint8 CPU copy of it.
        self.register_buffer("master_layout", layout)
        self._set_layout(layout, checked=True)

    def _set_layout(self, layout, checked=False):
        # The ops' copy is uint8 (they read a layout in its own dtype): at 65,536 tokens, block 64
        # and 16 heads an int64 copy is 134 MB, 2.1 GB at block 16. A layout from a checkpoint is
        # checked first, since narrowing would turn a value such as 256 into 0.
        if not checked:
            layout, _ = prepare_layout(layout, "master_layout", count=False)
        self._layout_cpu = layout.detach().to("cpu", torch.uint8).contiguous()
        self._crop_nnz = _crop_nnz(self._layout_cpu)
        # One crop (a view) per length, kept: the ops cache the layout's index (and its copy on
        # each CUDA device) per layout tensor object, so a fresh view on every call would rebuild
        # and re-upload the index every time.
        self._crops = {}

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._set_layout(self.master_layout)

    @staticmethod
    def transpose_key_for_scores(x, L):
        """DeepSpeed's rule: a key whose third dim is not L is [B, H, D, L]; transpose it back."""
        if x.size(2) != L:
            return x.permute(0, 1, 3, 2)
        return x

    def forward(self, query, key, value, rpe=None, key_padding_mask=None, attn_mask=None):
        """query, key, value [B, H, L, D] -> [B, H, L, D]. rpe broadcastable to [B, H, L, L];
        key_padding_mask [B, L] (size-1 dims are squeezed, as in DeepSpeed); attn_mask [L, L]."""
        for t, name in ((query, "query"), (key, "key"), (value, "value")):
            _checks.tensor(t, name)
        _checks.float_dtype(query, "query")
        _checks.supported_device(query, "query")
        _checks.ndim(query, "query", 4, "[B, H, L, D]")
        _checks.not_empty(query, "query", "[B, H, L, D]")
        B, H, L, _ = query.shape
        _checks.ndim(key, "key", 4, "[B, H, L, D]")
        key = self.transpose_key_for_scores(key, L)
        for t, name in ((key, "key"), (value, "value")):
            _checks.same_dtype(t, name, query, "query")
            _checks.same_device(t, name, query, "query")
        if query.shape != key.shape or key.shape != value.shape:
            raise NotImplementedError(
                f"only self-attention is supported: query, key and value must have the same shape; "
                f"got {list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
        if L % self.block != 0:
            raise ValueError(f"Sequence Length, {L}, needs to be dividable by Block size "
                             f"{self.block}! (pad it with SparseAttentionUtils.pad_to_block_size)")
        if L > self.max_seq_length:
            raise ValueError(f"query has length L = {L} > max_seq_length = {self.max_seq_length}; "
                             "build the module with a larger max_seq_length")
        if self._layout_cpu.shape[0] != H:
            raise ValueError(f"query has H = {H} heads but the layout has "
                             f"{self._layout_cpu.shape[0]} (sparsity_config.num_heads must be {H})")
        n = L // self.block
        layout = self._crops.get(n)
        if layout is None:
            layout = self._crops[n] = self._layout_cpu[:, :n, :n]
        nnz = self._crop_nnz[n]
        low = query.dtype != torch.float64
        mask_dtypes = (query.dtype, torch.float32, torch.bool) if low else (torch.float64,
                                                                            torch.bool)
        if rpe is not None:
            _checks.tensor(rpe, "rpe")
            _checks.same_device(rpe, "rpe", query, "query")
            if rpe.dtype not in mask_dtypes[:2]:
                rpe = rpe.to(query.dtype)
            rpe = _expand(rpe, "rpe", (B, H, L, L))
        if key_padding_mask is not None:
            _checks.tensor(key_padding_mask, "key_padding_mask")
            _checks.same_device(key_padding_mask, "key_padding_mask", query, "query")
            for d in range(key_padding_mask.dim() - 1, 0, -1):
                key_padding_mask = key_padding_mask.squeeze(dim=d)
            if key_padding_mask.dtype not in mask_dtypes:
                key_padding_mask = key_padding_mask.to(query.dtype)
            _checks.shape(key_padding_mask, "key_padding_mask", (B, L), "[B, L]")
        if attn_mask is not None:
            _checks.tensor(attn_mask, "attn_mask")
            _checks.same_device(attn_mask, "attn_mask", query, "query")
            attn_mask = attn_mask.squeeze()
            if attn_mask.dtype not in mask_dtypes:
                attn_mask = attn_mask.to(query.dtype)
            _checks.shape(attn_mask, "attn_mask", (L, L), "[L, L]")
        out, _ = ops.sparse_attention_fwd(query, key, value, layout, self.block, nnz, rpe,
                                          key_padding_mask, attn_mask, None, self.causal,
                                          self._kpm_mode, self._am_mode, self._algorithm)
        return out


__all__ = ["SparseSelfAttention"]

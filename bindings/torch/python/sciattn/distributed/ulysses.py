"""DeepSpeed-Ulysses sequence parallelism (Python package layer): DistributedAttention with
DeepSpeed's interface, the sequence all-to-all it is made of, and the helpers that give a rank its
slice of the sequence and of the heads (with the sparsity layouts of those heads)."""
import torch
import torch.distributed as dist
from torch import nn

from ..sparse_attention.sparsity_config import SparsityConfig
from ._collectives import SeqAllToAll, group_size_rank, shares

_NAME = "sciattn.distributed.DistributedAttention"


def _group(group):
    return dist.group.WORLD if group is None else group


def _dim(index, ndim, name, who):
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{who}: {name} must be an int; got {type(index).__name__}")
    if not -ndim <= index < ndim:
        raise ValueError(f"{who}: {name} = {index} is not a dimension of a {ndim}-dimensional "
                         "tensor")
    return index % ndim


def _heads(num_heads, size, uneven, who, what):
    """Each rank's share of num_heads after the all-to-all; the error of an uneven split."""
    if num_heads % size == 0:
        return [num_heads // size] * size
    if not uneven:
        raise ValueError(
            f"{who}: {what}: h = {num_heads} heads cannot be split evenly over the P = {size} "
            f"ranks of the sequence group (h % P = {num_heads % size}); use a head count "
            "divisible by P, or uneven_heads=True (ranks then hold h // P or h // P + 1 heads)")
    if num_heads < size:
        raise ValueError(f"{who}: {what}: h = {num_heads} heads are fewer than the P = {size} "
                         "ranks of the sequence group; every rank needs at least one head")
    return shares(num_heads, size)


def all_to_all(x, scatter_idx, gather_idx, group=None):
    """The sequence all-to-all, differentiable: this rank cuts x along scatter_idx into P equal
    pieces (piece j goes to rank j) and concatenates the pieces it receives along gather_idx in
    rank order. all_to_all(all_to_all(x, s, g), g, s) is x, bit for bit. Raises ValueError when
    x.shape[scatter_idx] % P != 0. Every rank must pass a tensor of the same shape."""
    who = "sciattn.distributed.all_to_all"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: x must be a torch.Tensor; got {type(x).__name__}")
    size, rank = group_size_rank(group, who)
    s = _dim(scatter_idx, x.dim(), "scatter_idx", who)
    g = _dim(gather_idx, x.dim(), "gather_idx", who)
    if s == g:
        raise ValueError(f"{who}: scatter_idx and gather_idx must name different dimensions; "
                         f"both are {s}")
    n = x.shape[s]
    if n % size != 0:
        raise ValueError(f"{who}: x has size {n} in dimension {s} (scatter_idx), which the P = "
                         f"{size} ranks cannot share evenly (size % P = {n % size})")
    return SeqAllToAll.apply(x, s, g, _group(group), rank, [n // size] * size,
                             [x.shape[g]] * size)


def split_sequence(x, dim=0, group=None):
    """This rank's slice of a whole sequence: x cut along `dim` into P equal consecutive pieces,
    piece r for rank r (a view; differentiable). Raises ValueError naming s, P and s % P when the
    length s is not a multiple of P: pad the sequence first."""
    who = "sciattn.distributed.split_sequence"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: x must be a torch.Tensor; got {type(x).__name__}")
    size, rank = group_size_rank(group, who)
    d = _dim(dim, x.dim(), "dim", who)
    s = x.shape[d]
    if s % size != 0:
        raise ValueError(f"{who}: the sequence length s = {s} (dimension {d}) is not a multiple "
                         f"of the P = {size} ranks of the sequence group (s % P = {s % size}); "
                         "pad it to a multiple of P")
    n = s // size
    return x.narrow(d, rank * n, n)


def head_range(num_heads, group=None, *, uneven_heads=False):
    """The heads this rank computes inside DistributedAttention (default scatter_idx, or
    whichever dimension is scattered): range(start, stop) of the global head indices, the r-th of
    P consecutive equal shares (with uneven_heads=True, the first h % P ranks hold one more)."""
    who = "sciattn.distributed.head_range"
    size, rank = group_size_rank(group, who)
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"{who}: num_heads must be a positive int; got {num_heads!r}")
    counts = _heads(num_heads, size, uneven_heads, who, "num_heads")
    start = sum(counts[:rank])
    return range(start, start + counts[rank])


class HeadSliceSparsityConfig(SparsityConfig):
    """The heads [start, stop) of another sparsity config: make_layout(seq_len) is
    base.make_layout(seq_len)[start:stop]. A rank's SparseSelfAttention inside
    DistributedAttention sees only its slice of the heads, so it is built from this config
    (head_slice_config makes it for the rank). The base config's seeded layouts are the same on
    every rank, so the ranks' slices tile the whole layout."""

    def __init__(self, base, start, stop):
        if not isinstance(base, SparsityConfig):
            raise TypeError("sciattn.distributed.HeadSliceSparsityConfig: base must be a "
                            f"SparsityConfig; got {type(base).__name__}")
        if not 0 <= start < stop <= base.num_heads:
            raise ValueError("sciattn.distributed.HeadSliceSparsityConfig: heads "
                             f"[{start}, {stop}) are not a non-empty range of the base config's "
                             f"{base.num_heads} heads")
        super().__init__(stop - start, base.block, base.different_layout_per_head,
                         seed=base.seed)
        self.base, self.start, self.stop = base, start, stop

    def make_layout(self, seq_len):
        # contiguous(): the slice of a [H, R, C] layout would otherwise keep the whole tensor.
        return self.base.make_layout(seq_len)[self.start:self.stop].contiguous()


def head_slice_config(sparsity_config, group=None, *, uneven_heads=False):
    """The sparsity config of this rank's heads (head_range) of `sparsity_config`, for the
    SparseSelfAttention that DistributedAttention calls on this rank."""
    heads = head_range(sparsity_config.num_heads, group, uneven_heads=uneven_heads)
    return HeadSliceSparsityConfig(sparsity_config, heads.start, heads.stop)


class DistributedAttention(nn.Module):
    """DeepSpeed-Ulysses attention (deepspeed.sequence.layer.DistributedAttention's interface):
    each of the P ranks of sequence_process_group holds query, key and value [s/P, b, h, d] (a
    consecutive slice of the sequence, split_sequence). An all-to-all turns each into
    [s, b, h/P, d] (the whole sequence, a slice of the heads: head_range), local_attention(q, k,
    v, *args, **kwargs) runs on that, and a second all-to-all brings its output [s, b, h/P, d']
    back to [s/P, b, h, d']. Autograd flows through both all-to-alls.

    scatter_idx (the heads) and gather_idx (the sequence) are the dimensions of the input that
    the first all-to-all scatters and gathers; the second one swaps their roles. [b, s/P, h, d]
    inputs take gather_idx=1, or forward(..., batch_dim_idx=0) with the default indices (as in
    DeepSpeed: the indices then name dimensions of the sequence-first layout, and dimensions 0
    and 1 are swapped). The local attention must keep the scattered and gathered dimensions of
    its output where the inputs had them.

    h % P != 0 raises ValueError naming h, P and h % P unless uneven_heads=True, which gives the
    first h % P ranks one head more (DeepSpeed's uneven-heads split); head_range and
    head_slice_config follow the same split. Every rank must hold the same s/P (split_sequence
    raises on s % P != 0)."""

    def __init__(self, local_attention, sequence_process_group, scatter_idx=2, gather_idx=0,
                 *, uneven_heads=False):
        super().__init__()
        if not callable(local_attention):
            raise TypeError(f"{_NAME}: local_attention must be callable (a module or function "
                            f"of q, k, v); got {type(local_attention).__name__}")
        for value, name in ((scatter_idx, "scatter_idx"), (gather_idx, "gather_idx")):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{_NAME}: {name} must be an int; got {type(value).__name__}")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx
        self.uneven_heads = bool(uneven_heads)

    def _dims(self, ndim, batch_dim_idx):
        s = _dim(self.scatter_idx, ndim, "scatter_idx", _NAME)
        g = _dim(self.gather_idx, ndim, "gather_idx", _NAME)
        if batch_dim_idx is not None:
            if batch_dim_idx not in (0, 1):
                raise ValueError(f"{_NAME}: batch_dim_idx must be 0 ([b, s/P, h, d]) or 1 "
                                 f"([s/P, b, h, d]); got {batch_dim_idx!r}")
            if batch_dim_idx == 0:
                swap = {0: 1, 1: 0}
                s, g = swap.get(s, s), swap.get(g, g)
        if s == g:
            raise ValueError(f"{_NAME}: scatter_idx and gather_idx must name different "
                             f"dimensions; both are {s}")
        return s, g

    def forward(self, query, key, value, *args, batch_dim_idx=None, **kwargs):
        """query, key, value [s/P, b, h, d] (default indices) -> [s/P, b, h, d_out]. args and
        kwargs go to local_attention; batch_dim_idx=0 declares [b, s/P, h, d] tensors."""
        size, rank = group_size_rank(self.spg, _NAME)
        group = _group(self.spg)
        layers = []
        for x, name in ((query, "query"), (key, "key"), (value, "value")):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{_NAME}: {name} must be a torch.Tensor; got "
                                f"{type(x).__name__}")
            s, g = self._dims(x.dim(), batch_dim_idx)
            counts = _heads(x.shape[s], size, self.uneven_heads, _NAME,
                            f"{name}, dimension {s} (scatter_idx)")
            layers.append(SeqAllToAll.apply(x, s, g, group, rank, counts,
                                            [x.shape[g]] * size))
        out = self.local_attn(*layers, *args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{_NAME}: local_attention must return one tensor; got "
                            f"{type(out).__name__}")
        # The second all-to-all cuts the output's sequence (whole on every rank) into equal
        # pieces and puts the heads back together in rank order. Its dimension scatter_idx holds
        # this rank's heads, each of the same width: 1 for a heads dimension, d for Megatron's
        # flattened [s, b, h/P * d] output.
        qs, qg = self._dims(query.dim(), batch_dim_idx)
        counts = _heads(query.shape[qs], size, self.uneven_heads, _NAME,
                        f"query, dimension {qs} (scatter_idx)")
        s, g = self._dims(out.dim(), batch_dim_idx)
        seq = query.shape[qg] * size
        if out.shape[g] != seq or out.shape[s] % counts[rank] != 0:
            raise ValueError(f"{_NAME}: local_attention returned shape {list(out.shape)}; "
                             f"expected the whole sequence ({seq}) in dimension {g} and this "
                             f"rank's {counts[rank]} heads (or a multiple: heads x width) in "
                             f"dimension {s}")
        width = out.shape[s] // counts[rank]
        return SeqAllToAll.apply(out, g, s, group, rank, [seq // size] * size,
                                 [c * width for c in counts])


__all__ = ["DistributedAttention", "all_to_all", "split_sequence", "head_range",
           "head_slice_config", "HeadSliceSparsityConfig"]

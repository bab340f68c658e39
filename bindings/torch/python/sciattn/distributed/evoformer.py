"""Evoformer attention with the MSA axis (N) sharded over a process group (Python package layer),
as in FastFold's dynamic axial parallelism: each rank holds [B, N_r, L, H, D] rows of the MSA."""
import torch

from ..evoformer import evoformer_attention as _local_evoformer_attention
from ._collectives import SumGradOverRanks, group_size_rank

_NAME = "sciattn.distributed.evoformer_attention"


def evoformer_attention(q, k, v, bias1=None, bias2=None, scale=None, *, group=None,
                        algorithm="tiled"):
    """sciattn.evoformer_attention on this rank's rows of the MSA: q, k, v [B, N_r, L, H, D] and
    bias1 [B, N_r, 1, 1, L] are this rank's shard of the N axis (usually N_r = N / P; the ranks
    may hold different N_r), bias2 [B, 1, H, L, L] is replicated (the same tensor on every rank).
    Returns this rank's [B, N_r, L, H, D] rows of the output.

    The forward is local: every output row depends only on its own row of q, k, v and bias1, and
    on bias2. So are the gradients of q, k, v and bias1. bias2's gradient is a sum over all N
    rows: each rank's partial sum is all-gathered and the P partial sums are added in rank order
    0..P-1 in float32 and rounded once to bias2's dtype, so every rank gets the same full
    gradient, bit for bit the same from run to run for a given P, equal to the single-process
    call's within rounding. When bias2 requires grad, every rank of the group must run the
    backward of this call (the sum is a collective). group: the process group sharding N
    (default: the whole world)."""
    size, _ = group_size_rank(group, _NAME)
    if isinstance(bias2, torch.Tensor) and bias2.requires_grad and torch.is_grad_enabled():
        bias2 = SumGradOverRanks.apply(bias2, torch.distributed.group.WORLD if group is None
                                       else group, size)
    return _local_evoformer_attention(q, k, v, bias1, bias2, scale, algorithm=algorithm)


__all__ = ["evoformer_attention"]

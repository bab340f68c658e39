"""Sequence parallelism over torch.distributed (any backend: NCCL on GPUs, gloo on CPUs):

    from sciattn import distributed as sp
    attn = sp.DistributedAttention(local_attention, group)  # DeepSpeed-Ulysses: [s/P, b, h, d]
    out = sp.evoformer_attention(q, k, v, bias1, bias2, group=group)  # [B, N/P, L, H, D]

The collectives are torch.distributed's functional all_to_all_single and all_gather, which
torch.compile traces. See docs/distributed.md."""
from .evoformer import evoformer_attention
from .ulysses import (DistributedAttention, HeadSliceSparsityConfig, all_to_all, head_range,
                      head_slice_config, split_sequence)

__all__ = ["DistributedAttention", "evoformer_attention", "all_to_all", "split_sequence",
           "head_range", "head_slice_config", "HeadSliceSparsityConfig"]

"""sciattn for PyTorch: Evoformer attention and block-sparse attention with DeepSpeed's APIs.

    import sciattn
    out = sciattn.evoformer_attention(q, k, v, bias1, bias2)          # [B, N, L, H, D]
    out = sciattn.DS4Sci_EvoformerAttention(Q, K, V, [mask_bias, pair_bias])
    from sciattn.sparse_attention import SparseSelfAttention, FixedSparsityConfig
    from sciattn.distributed import DistributedAttention       # sequence parallelism
    from sciattn.optim import CPUAdamW                         # the trainer's CPU AdamW
    from sciattn.training import DynamicLossScaler, AdaptiveGradClipper, \
        tiled_lm_head_cross_entropy                            # the trainer's training parts

The ops are torch.library ops (torch.ops.sciattn.*) with CPU kernels, CUDA kernels in CUDA
builds, fake (meta) kernels for torch.compile, and autograd formulas. See docs/python.md.
"""
from . import _ops  # noqa: F401  (loads the extension; fake kernels, Python autograd)
from ._ops import built_with_cuda, cuda_kernels
from .evoformer import DS4Sci_EvoformerAttention, evoformer_attention
from . import sparse_attention  # noqa: F401
from . import deepspeed4science  # noqa: F401
from . import distributed  # noqa: F401
from . import optim  # noqa: F401
from . import training  # noqa: F401

__version__ = "0.1.0"
__all__ = [
    "evoformer_attention",
    "DS4Sci_EvoformerAttention",
    "sparse_attention",
    "distributed",
    "optim",
    "training",
    "built_with_cuda",
    "cuda_kernels",
]

"""Drop-in for ``deepspeed.ops.sparse_attention``: sparsity configs, MatMul, Softmax,
SparseSelfAttention, BertSparseSelfAttention and SparseAttentionUtils, on sciattn's kernels."""
from .bert_sparse_self_attention import BertSparseSelfAttention
from .config import sparsity_config_from_deepspeed
from .matmul import MatMul
from .softmax import Softmax
from .sparse_attention_utils import SparseAttentionUtils
from .sparse_self_attention import SparseSelfAttention
from .sparsity_config import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                              DenseSparsityConfig, FixedSparsityConfig,
                              LocalSlidingWindowSparsityConfig, SparsityConfig,
                              VariableSparsityConfig)

__all__ = [
    "SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig", "VariableSparsityConfig",
    "BigBirdSparsityConfig", "BSLongformerSparsityConfig", "LocalSlidingWindowSparsityConfig",
    "MatMul", "Softmax", "SparseSelfAttention", "BertSparseSelfAttention", "SparseAttentionUtils",
    "sparsity_config_from_deepspeed",
]

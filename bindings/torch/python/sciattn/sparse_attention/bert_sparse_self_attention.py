"""DeepSpeed's ``BertSparseSelfAttention``: BERT's Q/K/V projections + SparseSelfAttention."""
from torch import nn

from .sparse_self_attention import SparseSelfAttention
from .sparsity_config import FixedSparsityConfig


class BertSparseSelfAttention(nn.Module):
    """forward(hidden_states [B, L, hidden], attention_mask) -> [B, L, hidden]; the mask is
    BERT's additive key-padding mask ([B, 1, 1, L] or [B, L]; bool True = keep also works)."""

    def __init__(self, config, sparsity_config=FixedSparsityConfig(num_heads=4)):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(f"The hidden size ({config.hidden_size}) is not a multiple of the "
                             f"number of attention heads ({config.num_attention_heads})")
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        # DeepSpeed used max_seq_length = 2048 always (DeepSpeed #1177); longer models get theirs.
        max_len = max(2048, int(getattr(config, "max_position_embeddings", 0) or 0))
        max_len -= max_len % sparsity_config.block
        self.sparse_self_attention = SparseSelfAttention(sparsity_config, max_seq_length=max_len)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(*new_x_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        context_layer = self.sparse_self_attention(query_layer, key_layer, value_layer,
                                                   key_padding_mask=attention_mask)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(*new_context_layer_shape)


__all__ = ["BertSparseSelfAttention"]

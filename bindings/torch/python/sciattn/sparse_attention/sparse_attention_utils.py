"""DeepSpeed's ``SparseAttentionUtils``: padding helpers and the conversion of Hugging Face BERT /
RoBERTa models to block-sparse self-attention (working with current ``transformers``)."""
import math

import torch
from torch import nn

from .bert_sparse_self_attention import BertSparseSelfAttention
from .sparsity_config import SparsityConfig


def _hf_key_padding_mask(attention_mask):
    """The key-padding mask [B, L] in a Hugging Face attention mask: None; a 2-D 0/1 mask; or the
    4-D [B, 1, Lq, Lk] mask an encoder builds (bool True = attend, or additive float). Encoder
    masks of BERT-like models only mask keys, so every query row is the same and row 0 is it."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 4:
        return attention_mask[:, 0, 0, :]
    if attention_mask.dim() == 3:
        return attention_mask[:, 0, :]
    if attention_mask.dim() == 2 and attention_mask.dtype != torch.bool \
            and not attention_mask.is_floating_point():
        return attention_mask != 0
    return attention_mask


class _HFBertSparseSelfAttention(BertSparseSelfAttention):
    """BertSparseSelfAttention with the call convention of the Hugging Face layer it replaces:
    forward(hidden_states, attention_mask=None, ...) -> (context, None) (no attention weights).
    The state-dict keys stay query/key/value as in the original layer."""

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        if kwargs.get("output_attentions"):
            raise ValueError("sparse self-attention does not return attention weights; "
                             "call the model with output_attentions=False")
        context = super().forward(hidden_states, _hf_key_padding_mask(attention_mask))
        return context, None


def _base_model(model):
    for name in ("bert", "roberta"):
        if hasattr(model, name):
            return getattr(model, name), name
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in ("bert", "roberta") and hasattr(model, "encoder"):
        return model, model_type
    raise ValueError('Please extend "extend_position_embedding" function to support your model '
                     'type. It currently only supports "bert" & "roberta"!')


class SparseAttentionUtils:
    """Static helpers, as DeepSpeed's (decisions in docs/migrating_from_deepspeed.md)."""

    @staticmethod
    def extend_position_embedding(model, max_position):
        """Extends the position embeddings of a BERT or RoBERTa model (or a model holding one as
        .bert / .roberta) to max_position by repeating the trained table; every row is set."""
        base, kind = _base_model(model)
        emb = base.embeddings.position_embeddings
        old = emb.weight.data
        offset = 2 if kind == "roberta" else 0
        total = max_position + offset
        if total <= old.size(0):
            raise ValueError(f"max_position ({max_position}) must be larger than the model's "
                             f"{old.size(0) - offset} positions")
        body = old[offset:]
        reps = math.ceil((total - offset) / body.size(0))
        new = torch.cat([old[:offset], body.repeat(reps, 1)[: total - offset]], dim=0)
        new_emb = nn.Embedding(total, old.size(1), padding_idx=emb.padding_idx,
                               device=old.device, dtype=old.dtype)
        new_emb.weight.data.copy_(new)
        base.embeddings.position_embeddings = new_emb
        # Hugging Face keeps [1, max_positions] position_ids / token_type_ids buffers.
        for name in ("position_ids", "token_type_ids"):
            buf = getattr(base.embeddings, name, None)
            if isinstance(buf, torch.Tensor):
                if name == "position_ids":
                    value = torch.arange(total, device=buf.device, dtype=buf.dtype)[None]
                else:
                    value = torch.zeros((1, total), device=buf.device, dtype=buf.dtype)
                base.embeddings.register_buffer(name, value, persistent=False)
        model.config.max_position_embeddings = total
        if model.config is not base.config:
            base.config.max_position_embeddings = total
        print(f"Extended position embeddings to {max_position}")
        return model

    @staticmethod
    def update_tokenizer_model_max_length(tokenizer, max_position):
        """Sets tokenizer.model_max_length (and its init_kwargs) to max_position."""
        tokenizer.model_max_length = max_position
        tokenizer.init_kwargs["model_max_length"] = max_position
        print(f"updated tokenizer model max imum length to {max_position}")
        return tokenizer

    @staticmethod
    def replace_model_self_attention_with_sparse_self_attention(
            model, max_position, sparsity_config=SparsityConfig(num_heads=4)):
        """Replaces the self-attention of every layer of a BERT or RoBERTa model with
        sparse self-attention (the layers keep their Q/K/V weights) and sets the config's
        max_position_embeddings (RoBERTa: max_position + 2)."""
        base, kind = _base_model(model)
        total = max_position + (2 if kind == "roberta" else 0)
        model.config.max_position_embeddings = total
        base.config.max_position_embeddings = total
        SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(
            base.config, base.encoder.layer, sparsity_config)
        return model

    @staticmethod
    def replace_self_attention_layer_with_sparse_self_attention_layer(
            config, layers, sparsity_config=SparsityConfig(num_heads=4)):
        """Replaces layer.attention.self of each layer with a sparse self-attention module that
        reuses the layer's query, key and value Linears."""
        for layer in layers:
            old = layer.attention.self
            sparse = _HFBertSparseSelfAttention(config, sparsity_config)
            sparse.query = old.query
            sparse.key = old.key
            sparse.value = old.value
            sparse.to(old.query.weight.device)
            layer.attention.self = sparse
        return layers

    @staticmethod
    def pad_to_block_size(block_size, input_ids, attention_mask, token_type_ids, position_ids,
                          inputs_embeds, pad_token_id, model_embeddings):
        """Pads the inputs along the sequence so that its length is a multiple of block_size.
        Returns (pad_len, input_ids, attention_mask, token_type_ids, position_ids,
        inputs_embeds). A missing attention_mask is created (1 = token, 0 = padding)."""
        if input_ids is not None:
            batch_size, seq_len = input_ids.shape
            device = input_ids.device
        elif inputs_embeds is not None:
            batch_size, seq_len = inputs_embeds.shape[:-1]
            device = inputs_embeds.device
        else:
            raise ValueError("pad_to_block_size needs input_ids or inputs_embeds")
        pad_len = (block_size - seq_len % block_size) % block_size
        if pad_len > 0:
            pad = nn.functional.pad
            if inputs_embeds is not None:
                pad_ids = torch.full((batch_size, pad_len), pad_token_id, dtype=torch.long,
                                     device=device)
                inputs_embeds = torch.cat([inputs_embeds, model_embeddings(pad_ids)], dim=-2)
            if input_ids is not None:
                input_ids = pad(input_ids, (0, pad_len), value=pad_token_id)
            if position_ids is not None:
                position_ids = pad(position_ids, (0, pad_len), value=pad_token_id)
            if attention_mask is None:
                attention_mask = torch.ones((batch_size, seq_len), dtype=torch.long,
                                            device=device)
            attention_mask = pad(attention_mask, (0, pad_len), value=False)
            if token_type_ids is not None:
                token_type_ids = pad(token_type_ids, (0, pad_len), value=0)
        return pad_len, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

    @staticmethod
    def unpad_sequence_output(pad_len, sequence_output):
        """Removes the pad_len positions pad_to_block_size added: sequence_output[:, :-pad_len]."""
        if pad_len > 0:
            sequence_output = sequence_output[:, :-pad_len]
        return sequence_output


__all__ = ["SparseAttentionUtils"]

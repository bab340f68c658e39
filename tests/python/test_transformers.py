"""SparseAttentionUtils with current Hugging Face transformers: a tiny randomly initialised BERT
(no download) converted with replace_model_self_attention_with_sparse_self_attention runs
forward and backward, and with a Dense layout matches the original model (tolerance rule against
the original model in fp64); RoBERTa position-embedding extension; padding helpers."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import assert_close_rule, run_or_skip  # noqa: E402
from sciattn.sparse_attention import (BertSparseSelfAttention, DenseSparsityConfig,  # noqa: E402
                                      FixedSparsityConfig, SparseAttentionUtils)


def tiny_config(cls, attn="sdpa", **kw):
    return cls(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=48, max_position_embeddings=128, attn_implementation=attn, **kw)


def inputs(device, B=2, L=48, pad=10):
    ids = torch.randint(3, 99, (B, L), device=device)
    mask = torch.ones(B, L, dtype=torch.long, device=device)
    mask[1, L - pad:] = 0
    return ids, mask


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_bert_dense_layout_matches_original(device, attn):
    model = transformers.BertModel(tiny_config(transformers.BertConfig, attn)).to(device).eval()
    ids, mask = inputs(device)
    ref32 = model(input_ids=ids, attention_mask=mask).last_hidden_state
    ref64 = copy.deepcopy(model).double()(input_ids=ids, attention_mask=mask).last_hidden_state
    sparse = copy.deepcopy(model)
    SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(
        sparse, max_position=128, sparsity_config=DenseSparsityConfig(num_heads=2))
    assert all(isinstance(layer.attention.self, BertSparseSelfAttention)
               for layer in sparse.encoder.layer)
    # The layers keep their trained Q/K/V.
    assert torch.equal(sparse.encoder.layer[0].attention.self.query.weight,
                       model.encoder.layer[0].attention.self.query.weight)
    out = run_or_skip(sparse, input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close_rule("last_hidden_state", out, ref32, ref64, torch.float32)
    # Backward through the sparse layers reaches every projection.
    sparse.train()
    sparse(input_ids=ids, attention_mask=mask).last_hidden_state.square().mean().backward()
    for layer in sparse.encoder.layer:
        grad = layer.attention.self.query.weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_bert_for_masked_lm_sparse_with_padding(device):
    model = transformers.BertForMaskedLM(tiny_config(transformers.BertConfig)).to(device)
    SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(
        model, max_position=128, sparsity_config=FixedSparsityConfig(num_heads=2, num_local_blocks=2))
    ids, mask = inputs(device, L=40, pad=5)
    pad_len, ids_p, mask_p, tt_p, pos_p, emb_p = SparseAttentionUtils.pad_to_block_size(
        16, ids, mask, torch.zeros_like(ids), None, None, 0, model.bert.embeddings)
    assert pad_len == 8 and ids_p.shape == (2, 48) and mask_p[:, 40:].eq(0).all()
    assert tt_p.shape == (2, 48) and pos_p is None and emb_p is None
    logits = run_or_skip(model, input_ids=ids_p, attention_mask=mask_p,
                         token_type_ids=tt_p).logits
    logits = SparseAttentionUtils.unpad_sequence_output(pad_len, logits)
    assert logits.shape == (2, 40, 99) and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    assert torch.isfinite(model.bert.encoder.layer[0].attention.self.value.weight.grad).all()


def test_pad_to_block_size_without_mask_and_with_embeddings(device):
    emb = torch.nn.Embedding(99, 8).to(device)
    x = emb(torch.randint(0, 99, (2, 20), device=device))
    pad_len, ids, mask, tt, pos, x_p = SparseAttentionUtils.pad_to_block_size(
        16, None, None, None, torch.arange(20, device=device).expand(2, 20), x, 1, emb)
    assert pad_len == 12 and ids is None and tt is None
    assert mask.shape == (2, 32) and mask[:, :20].eq(1).all() and mask[:, 20:].eq(0).all()
    assert pos[:, 20:].eq(1).all() and torch.equal(x_p[:, :20], x)
    assert torch.equal(x_p[:, 20:], emb(torch.ones(2, 12, dtype=torch.long, device=device)))
    same = SparseAttentionUtils.pad_to_block_size(16, torch.zeros(2, 32, dtype=torch.long), None,
                                                  None, None, None, 0, None)
    assert same[0] == 0 and same[2] is None
    out = torch.randn(2, 32, 4)
    assert SparseAttentionUtils.unpad_sequence_output(0, out) is out


def test_roberta_extend_position_embedding(device):
    model = transformers.RobertaForMaskedLM(
        tiny_config(transformers.RobertaConfig, pad_token_id=1)).to(device)
    old = model.roberta.embeddings.position_embeddings.weight.detach().clone()  # 128 rows
    SparseAttentionUtils.extend_position_embedding(model, 300)
    new = model.roberta.embeddings.position_embeddings.weight
    assert new.shape == (302, 32) and model.config.max_position_embeddings == 302
    assert torch.equal(new[:2], old[:2])
    body = old[2:]
    assert torch.equal(new[2:2 + 126], body) and torch.equal(new[128:254], body)
    assert torch.equal(new[254:302], body[:48])  # every row set, up to max_position
    SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(
        model, 300, FixedSparsityConfig(num_heads=2))
    assert model.config.max_position_embeddings == 302
    ids = torch.randint(3, 99, (1, 288), device=device)
    logits = run_or_skip(model, input_ids=ids).logits
    assert logits.shape == (1, 288, 99) and torch.isfinite(logits).all()


def test_bert_extend_position_embedding_and_tokenizer(device):
    model = transformers.BertModel(tiny_config(transformers.BertConfig)).to(device)
    old = model.embeddings.position_embeddings.weight.detach().clone()
    SparseAttentionUtils.extend_position_embedding(model, 320)
    new = model.embeddings.position_embeddings.weight
    assert new.shape == (320, 32) and torch.equal(new[256:], old[:64])
    assert model.embeddings.position_ids.shape == (1, 320)

    class Tok:
        model_max_length = 128
        init_kwargs = {"model_max_length": 128}

    tok = SparseAttentionUtils.update_tokenizer_model_max_length(Tok(), 320)
    assert tok.model_max_length == 320 and tok.init_kwargs["model_max_length"] == 320
    with pytest.raises(ValueError, match="bert"):
        SparseAttentionUtils.extend_position_embedding(torch.nn.Linear(2, 2), 10)

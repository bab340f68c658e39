"""Sparsity configs: DeepSpeed's constructor defaults and attributes, the worked layouts of
spec/block_sparse.md section 1.9 (DeepSpeed's actual output), the seeded random blocks, the
crop rule, constructor validation, and the DeepSpeed JSON helper."""
import json
import random

import pytest
import torch

from sciattn.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                      DenseSparsityConfig, FixedSparsityConfig,
                                      LocalSlidingWindowSparsityConfig, SparseSelfAttention,
                                      SparsityConfig, VariableSparsityConfig,
                                      sparsity_config_from_deepspeed)


def grid(text):
    return torch.tensor([[int(c) for c in row] for row in text.split()], dtype=torch.int64)


def heads(layout):
    return [layout[h] for h in range(layout.shape[0])]


# (config, seq_len, expected grid of head 0) from spec 1.9.
WORKED = {
    "fixed_bi": (lambda: FixedSparsityConfig(1), 128,
                 "11110001 11110001 11110001 11110001 00011111 00011111 00011111 00011111"),
    "fixed_uni": (lambda: FixedSparsityConfig(1, attention="unidirectional"), 128,
                  "10000000 11000000 11100000 11110000 00011000 00011100 00011110 00011111"),
    "fixed_160": (lambda: FixedSparsityConfig(1), 160,
                  "1111000101 1111000101 1111000101 1111000101 0001111101 0001111101 0001111101 "
                  "0001111101 0001000111 0001000111"),
    "fixed_160_horizontal": (lambda: FixedSparsityConfig(1, horizontal_global_attention=True),
                             160,
                             "1111000101 1111000101 1111000101 1111111111 0001111101 0001111101 "
                             "0001111101 1111111111 0001000111 1111111111"),
    # DeepSpeed leaks (2,3) and (6,7) here; sciattn's layout is DeepSpeed's without them.
    "fixed_G2_uni": (lambda: FixedSparsityConfig(1, num_global_blocks=2,
                                                 attention="unidirectional"), 128,
                     "10000000 11000000 11100000 11110000 00111000 00111100 00111110 00111111"),
    "bslongformer_bi": (lambda: BSLongformerSparsityConfig(1), 128,
                        "11111111 11100000 11110000 10111000 10011100 10001110 10000111 "
                        "10000011"),
    "bslongformer_uni": (lambda: BSLongformerSparsityConfig(1, attention="unidirectional"), 128,
                         "10000000 11000000 11100000 10110000 10011000 10001100 10000110 "
                         "10000011"),
    "bslongformer_range": (lambda: BSLongformerSparsityConfig(1, global_block_indices=[1],
                                                              global_block_end_indices=[3]), 128,
                           "11100000 11111111 11111111 01111000 01111100 01101110 01100111 "
                           "01100011"),
    "local_uni": (lambda: LocalSlidingWindowSparsityConfig(1), 128,
                  "10000000 11000000 01100000 00110000 00011000 00001100 00000110 00000011"),
    "local_bi": (lambda: LocalSlidingWindowSparsityConfig(1, attention="bidirectional"), 128,
                 "11000000 11100000 01110000 00111000 00011100 00001110 00000111 00000011"),
    "local_w4": (lambda: LocalSlidingWindowSparsityConfig(1, num_sliding_window_blocks=4), 128,
                 "10000000 11000000 11100000 01110000 00111000 00011100 00001110 00000111"),
    "variable_123_uni": (lambda: VariableSparsityConfig(1, local_window_blocks=[1, 2, 3],
                                                        attention="unidirectional"), 160,
                         "1000000000 1100000000 1110000000 1001000000 1001100000 1001110000 "
                         "1000001000 1000001100 1000001110 1000000001"),
    "bigbird_seed0": (lambda: BigBirdSparsityConfig(1, seed=0), 128,
                      "11111111 11100010 11110000 10111000 10011101 10001110 10001111 10000011"),
    "dense": (lambda: DenseSparsityConfig(1), 64, "1111 1111 1111 1111"),
}


@pytest.mark.parametrize("name", list(WORKED))
def test_worked_layouts(name):
    make, seq_len, expected = WORKED[name]
    layout = make().make_layout(seq_len)
    assert layout.dtype == torch.int64
    assert torch.equal(layout[0], grid(expected)), f"\n{layout[0]}"


def test_fixed_per_head_patterns():
    layout = FixedSparsityConfig(4, different_layout_per_head=True,
                                 num_different_global_patterns=4).make_layout(128)
    expected = ["11110001 11110001 11110001 11110001 00011111 00011111 00011111 00011111",
                "11110010 11110010 11110010 11110010 00101111 00101111 00101111 00101111",
                "11110100 11110100 11110100 11110100 01001111 01001111 01001111 01001111",
                "11111000 11111000 11111000 11111000 10001111 10001111 10001111 10001111"]
    for h, e in enumerate(expected):
        assert torch.equal(layout[h], grid(e))


def test_random_blocks_follow_cpython_random():
    """BigBird's random column of row r is the r-th random.sample(range(8), 1) after seed(s)."""
    for seed in (0, 7, 12345):
        layout = BigBirdSparsityConfig(1, num_sliding_window_blocks=1, num_global_blocks=1,
                                       seed=seed).make_layout(128)[0]
        rng = random.Random(seed)
        for r in range(8):
            (col,) = rng.sample(range(8), 1)
            assert layout[r, col] == 1
    a = BigBirdSparsityConfig(2, seed=1).make_layout(512)
    assert torch.equal(a, BigBirdSparsityConfig(2, seed=1).make_layout(512))
    assert not torch.equal(a, BigBirdSparsityConfig(2, seed=2).make_layout(512))


def test_crop_differs_from_fresh_layout():
    config = FixedSparsityConfig(1)
    module = SparseSelfAttention(config, max_seq_length=2048)
    crop = module.master_layout[0, :10, :10]
    assert torch.equal(crop[0], grid("1111000100")[0])
    assert torch.equal(config.make_layout(160)[0, 0], grid("1111000101")[0])


@pytest.mark.parametrize("cls,defaults", [
    (DenseSparsityConfig, dict(block=16, different_layout_per_head=False)),
    (FixedSparsityConfig, dict(block=16, different_layout_per_head=False, num_local_blocks=4,
                               num_global_blocks=1, attention="bidirectional",
                               horizontal_global_attention=False,
                               num_different_global_patterns=1)),
    (VariableSparsityConfig, dict(block=16, different_layout_per_head=False, num_random_blocks=0,
                                  local_window_blocks=[4], global_block_indices=[0],
                                  global_block_end_indices=None, attention="bidirectional",
                                  horizontal_global_attention=False)),
    (BigBirdSparsityConfig, dict(block=16, different_layout_per_head=False, num_random_blocks=1,
                                 num_sliding_window_blocks=3, num_global_blocks=1,
                                 attention="bidirectional")),
    (BSLongformerSparsityConfig, dict(block=16, different_layout_per_head=False,
                                      num_sliding_window_blocks=3, global_block_indices=[0],
                                      global_block_end_indices=None, attention="bidirectional")),
    (LocalSlidingWindowSparsityConfig, dict(block=16, num_sliding_window_blocks=3,
                                            attention="unidirectional")),
])
def test_deepspeed_defaults(cls, defaults):
    config = cls(num_heads=4)
    for k, v in defaults.items():
        assert getattr(config, k) == v, k
    assert config.num_heads == 4 and config.num_layout_heads == 1 and config.seed == 0
    layout = config.make_layout(256)
    assert layout.shape == (4, 16, 16)
    for h in range(1, 4):  # shared layout propagated to every head
        assert torch.equal(layout[h], layout[0])


def test_base_class_and_helpers():
    base = SparsityConfig(num_heads=2, block=16)
    assert base.setup_layout(64).shape == (2, 4, 4)
    with pytest.raises(ValueError, match="dividable by Block size 16"):
        base.setup_layout(40)
    with pytest.raises(NotImplementedError, match="make_layout"):
        base.make_layout(64)
    with pytest.raises(NotImplementedError, match="make_layout"):
        SparseSelfAttention()  # DeepSpeed's default config has no layout


@pytest.mark.parametrize("make,error,words", [
    (lambda: FixedSparsityConfig(1, num_local_blocks=4, num_global_blocks=3), ValueError,
     "global blocks"),
    (lambda: FixedSparsityConfig(1, attention="sideways"), NotImplementedError, "attention"),
    (lambda: FixedSparsityConfig(1, attention="unidirectional",
                                 horizontal_global_attention=True), ValueError, "horizontal"),
    (lambda: FixedSparsityConfig(1, num_different_global_patterns=2), ValueError,
     "num_different_global_patterns"),
    (lambda: VariableSparsityConfig(1, global_block_indices=[0, 2],
                                    global_block_end_indices=[1]), ValueError, "length"),
    (lambda: VariableSparsityConfig(1, global_block_indices=[3], global_block_end_indices=[2]),
     ValueError, "smaller"),
    (lambda: BigBirdSparsityConfig(1, attention="x"), NotImplementedError, "attention"),
    (lambda: BSLongformerSparsityConfig(1, attention="x"), ValueError, "attention"),
    (lambda: LocalSlidingWindowSparsityConfig(1, attention="x"), ValueError, "attention"),
    (lambda: DenseSparsityConfig(0), ValueError, "num_heads"),
    (lambda: DenseSparsityConfig(2, block=24), ValueError, "block"),
    (lambda: DenseSparsityConfig(2, seed=-1), ValueError, "seed"),
    (lambda: DenseSparsityConfig("2"), TypeError, "num_heads"),
    (lambda: VariableSparsityConfig(1, local_window_blocks="4"), TypeError,
     "local_window_blocks"),
])
def test_constructor_validation(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_make_layout_validation():
    with pytest.raises(ValueError, match="seq_len|block"):
        FixedSparsityConfig(1).make_layout(100)
    with pytest.raises(ValueError, match="num_random_blocks"):
        BigBirdSparsityConfig(1, num_random_blocks=9).make_layout(128)


def test_deepspeed_json(tmp_path):
    ds = {"train_batch_size": 8, "sparse_attention": {
        "mode": "bigbird", "block": 32, "different_layout_per_head": True,
        "num_sliding_window_blocks": 5, "num_global_blocks": 2}}
    config = sparsity_config_from_deepspeed(ds, num_heads=4, seed=3)
    assert isinstance(config, BigBirdSparsityConfig)
    assert (config.block, config.num_random_blocks, config.num_sliding_window_blocks,
            config.num_global_blocks, config.seed) == (32, 0, 5, 2, 3)  # JSON default R = 0
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    assert torch.equal(sparsity_config_from_deepspeed(str(path), 4, seed=3).make_layout(256),
                       config.make_layout(256))
    fixed = sparsity_config_from_deepspeed('{"sparse_attention": {}}', num_heads=2)
    assert isinstance(fixed, FixedSparsityConfig) and fixed.num_local_blocks == 4
    variable = sparsity_config_from_deepspeed(
        {"mode": "variable", "local_window_blocks": [1, 2], "global_block_end_indices": [2]}, 2)
    assert variable.local_window_blocks == [1, 2] and variable.global_block_end_indices == [2]
    with pytest.raises(ValueError, match="num_local_blockz"):
        sparsity_config_from_deepspeed({"sparse_attention": {"num_local_blockz": 4}}, 2)
    with pytest.raises(ValueError, match="mode"):
        sparsity_config_from_deepspeed({"sparse_attention": {"mode": "sparse"}}, 2)
    with pytest.raises(TypeError, match="config"):
        sparsity_config_from_deepspeed(42, 2)

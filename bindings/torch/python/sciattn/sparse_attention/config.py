"""Reads the ``sparse_attention`` section of a DeepSpeed JSON config into a sparsity config."""
import json
import os

from .._ops import ops
from .sparsity_config import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                              DenseSparsityConfig, FixedSparsityConfig, VariableSparsityConfig)

_CLASSES = {
    "dense": DenseSparsityConfig,
    "fixed": FixedSparsityConfig,
    "variable": VariableSparsityConfig,
    "bigbird": BigBirdSparsityConfig,
    "bslongformer": BSLongformerSparsityConfig,
}


def sparsity_config_from_deepspeed(config, num_heads, seed=0):
    """The sparsity config described by a DeepSpeed config's "sparse_attention" section.

    config: a dict (the whole DeepSpeed config or the section alone), a JSON string, or a path
    to a JSON file. `mode` and the keys of that mode are read with DeepSpeed's JSON defaults (note
    bigbird's num_random_blocks is 0 there); unknown keys, wrong types and duplicate keys are
    ValueErrors naming the key. num_heads and seed are not part of DeepSpeed's JSON."""
    if isinstance(config, dict):
        text = json.dumps(config)
    elif isinstance(config, (str, os.PathLike)):
        s = os.fspath(config)
        if s.lstrip().startswith("{"):
            text = s
        else:
            with open(s, encoding="utf-8") as f:
                text = f.read()
    else:
        raise TypeError(f"config must be a dict, a JSON string or a path; "
                        f"got {type(config).__name__}")
    fields = json.loads(ops.parse_deepspeed_sparsity_config(text, num_heads, seed))
    mode = fields.pop("mode")
    return _CLASSES[mode](seed=seed, **fields)


__all__ = ["sparsity_config_from_deepspeed"]

"""DeepSpeed's sparsity configs (``deepspeed.ops.sparse_attention.sparsity_config``): the same
class names, constructor arguments, defaults, attributes and ``make_layout``; the layouts are
computed by sciattn's C++ code (bit-identical to DeepSpeed's where DeepSpeed's are valid; see
docs/migrating_from_deepspeed.md). Every config also takes a keyword-only ``seed`` for its random
blocks (the layout equals DeepSpeed's after ``random.seed(seed)``)."""
import torch

from .._ops import ops

_DIRECTIONS = ("bidirectional", "unidirectional")


def _int(value, name, minimum=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


def _bool(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return value


def _int_list(value, name, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list of ints; got {type(value).__name__}")
    return [_int(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _check_global_ranges(starts, ends):
    """DeepSpeed's checks of global_block_indices / global_block_end_indices (Variable,
    BSLongformer)."""
    if ends is None:
        return
    if len(starts) != len(ends):
        raise ValueError(f"Global block start indices length, {len(starts)}, must be same as "
                         f"global block end indices length, {len(ends)}!")
    for s, e in zip(starts, ends):
        if s >= e:
            raise ValueError(f"Global block start index, {s}, must be smaller than global block "
                             f"end index, {e}!")


class SparsityConfig:
    """Base class: num_heads, block, different_layout_per_head (DeepSpeed's). A subclass that
    implements make_layout(seq_len) -> [num_heads, seq_len/block, seq_len/block] 0/1 tensor works
    with every sciattn op."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, *, seed=0):
        self.num_heads = _int(num_heads, "num_heads", 1)
        self.block = _int(block, "block", 1)
        self.different_layout_per_head = _bool(different_layout_per_head,
                                               "different_layout_per_head")
        self.num_layout_heads = num_heads if different_layout_per_head else 1
        self.seed = _int(seed, "seed", 0)

    def setup_layout(self, seq_len):
        """A zero layout [num_heads, seq_len/block, seq_len/block] of dtype int64."""
        if seq_len % self.block != 0:
            raise ValueError(
                f"Sequence Length, {seq_len}, needs to be dividable by Block size {self.block}!")
        num_blocks = seq_len // self.block
        return torch.zeros((self.num_heads, num_blocks, num_blocks), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout):
        """Copies head 0 into every head unless different_layout_per_head."""
        if not self.different_layout_per_head:
            layout[1:self.num_heads, :, :] = layout[0, :, :]
        return layout

    def make_layout(self, seq_len):
        raise NotImplementedError(
            f"{type(self).__name__} has no make_layout: SparsityConfig is the base class; use one "
            "of DenseSparsityConfig, FixedSparsityConfig, VariableSparsityConfig, "
            "BigBirdSparsityConfig, BSLongformerSparsityConfig, LocalSlidingWindowSparsityConfig, "
            "or a subclass that implements make_layout(seq_len)")

    # -- built-in configs: the C++ layout builder --
    _mode = None

    def _fields(self):
        return dict(
            different_layout_per_head=getattr(self, "different_layout_per_head", False),
            num_local_blocks=getattr(self, "num_local_blocks", 4),
            num_global_blocks=getattr(self, "num_global_blocks", 1),
            attention=getattr(self, "attention", "bidirectional"),
            horizontal_global_attention=getattr(self, "horizontal_global_attention", False),
            num_different_global_patterns=getattr(self, "num_different_global_patterns", 1),
            num_random_blocks=getattr(self, "num_random_blocks", 0),
            local_window_blocks=list(getattr(self, "local_window_blocks", [4])),
            global_block_indices=list(getattr(self, "global_block_indices", [0])),
            global_block_end_indices=(None if getattr(self, "global_block_end_indices", None)
                                      is None else list(self.global_block_end_indices)),
            num_sliding_window_blocks=getattr(self, "num_sliding_window_blocks", 3),
        )

    def _build(self, seq_len, max_seq_length=0):
        return ops.sparsity_layout(self._mode, self.num_heads, self.block, seq_len=seq_len,
                                   max_seq_length=max_seq_length, seed=self.seed,
                                   **self._fields())

    def _validate(self):
        self._build(0)

    def _check_attention(self, attention, error=NotImplementedError):
        if attention not in _DIRECTIONS:
            raise error(f"{type(self).__name__}: only 'unidirectional' or 'bidirectional' "
                        f"attention is supported; got attention={attention!r}")
        return attention

    def _make(self, seq_len):
        seq_len = _int(seq_len, "seq_len", 1)
        return self._build(seq_len)

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class DenseSparsityConfig(SparsityConfig):
    """Every block is 1 (dense attention)."""
    _mode = "dense"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, *, seed=0):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        self._validate()

    def make_layout(self, seq_len):
        return self._make(seq_len)


class FixedSparsityConfig(SparsityConfig):
    """OpenAI's "fixed" pattern: local windows of num_local_blocks blocks plus global blocks."""
    _mode = "fixed"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_local_blocks=4,
                 num_global_blocks=1, attention="bidirectional",
                 horizontal_global_attention=False, num_different_global_patterns=1, *, seed=0):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        self.num_local_blocks = _int(num_local_blocks, "num_local_blocks")
        self.num_global_blocks = _int(num_global_blocks, "num_global_blocks")
        if num_global_blocks > 0 and num_local_blocks % num_global_blocks != 0:
            raise ValueError(f"Number of blocks in a local window, {num_local_blocks}, must be "
                             f"dividable by number of global blocks, {num_global_blocks}!")
        self.attention = self._check_attention(attention)
        self.horizontal_global_attention = _bool(horizontal_global_attention,
                                                 "horizontal_global_attention")
        if attention != "bidirectional" and horizontal_global_attention:
            raise ValueError('only "bi-directional" attentions can support horizontal global '
                             "attention!")
        self.num_different_global_patterns = _int(num_different_global_patterns,
                                                  "num_different_global_patterns")
        self._validate()

    def make_layout(self, seq_len):
        return self._make(seq_len)


class VariableSparsityConfig(SparsityConfig):
    """Random blocks, local windows of variable sizes, and global blocks by index or range."""
    _mode = "variable"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=0,
                 local_window_blocks=[4], global_block_indices=[0],  # noqa: B006 (DeepSpeed's)
                 global_block_end_indices=None, attention="bidirectional",
                 horizontal_global_attention=False, *, seed=0):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        self.num_random_blocks = _int(num_random_blocks, "num_random_blocks")
        self.local_window_blocks = _int_list(local_window_blocks, "local_window_blocks")
        self.global_block_indices = _int_list(global_block_indices, "global_block_indices")
        self.global_block_end_indices = _int_list(global_block_end_indices,
                                                  "global_block_end_indices", allow_none=True)
        _check_global_ranges(self.global_block_indices, self.global_block_end_indices)
        self.attention = self._check_attention(attention)
        self.horizontal_global_attention = _bool(horizontal_global_attention,
                                                 "horizontal_global_attention")
        if attention != "bidirectional" and horizontal_global_attention:
            raise ValueError('only "bi-directional" attentions can support horizontal global '
                             "attention!")
        self._validate()

    def make_layout(self, seq_len):
        return self._make(seq_len)


class BigBirdSparsityConfig(SparsityConfig):
    """BigBird: random blocks, a sliding window and the first num_global_blocks blocks global."""
    _mode = "bigbird"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=1,
                 num_sliding_window_blocks=3, num_global_blocks=1, attention="bidirectional", *,
                 seed=0):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        self.num_random_blocks = _int(num_random_blocks, "num_random_blocks")
        self.num_sliding_window_blocks = _int(num_sliding_window_blocks,
                                              "num_sliding_window_blocks")
        self.num_global_blocks = _int(num_global_blocks, "num_global_blocks")
        self.attention = self._check_attention(attention)
        self._validate()

    def make_layout(self, seq_len):
        return self._make(seq_len)


class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer: a sliding window plus global blocks by index or range."""
    _mode = "bslongformer"

    def __init__(self, num_heads, block=16, different_layout_per_head=False,
                 num_sliding_window_blocks=3, global_block_indices=[0],  # noqa: B006
                 global_block_end_indices=None, attention="bidirectional", *, seed=0):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        self.num_sliding_window_blocks = _int(num_sliding_window_blocks,
                                              "num_sliding_window_blocks")
        self.global_block_indices = _int_list(global_block_indices, "global_block_indices")
        self.global_block_end_indices = _int_list(global_block_end_indices,
                                                  "global_block_end_indices", allow_none=True)
        _check_global_ranges(self.global_block_indices, self.global_block_end_indices)
        # DeepSpeed accepts any string here (only 'unidirectional' is causal); sciattn rejects.
        self.attention = self._check_attention(attention, ValueError)
        self._validate()

    def make_layout(self, seq_len):
        return self._make(seq_len)


class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """A sliding window only, shared by all heads; unidirectional by default (DeepSpeed's)."""
    _mode = "local_sliding_window"

    def __init__(self, num_heads, block=16, num_sliding_window_blocks=3,
                 attention="unidirectional", *, seed=0):
        super().__init__(num_heads, block, False, seed=seed)
        self.num_sliding_window_blocks = _int(num_sliding_window_blocks,
                                              "num_sliding_window_blocks")
        self.attention = self._check_attention(attention, ValueError)
        self._validate()

    def make_layout(self, seq_len):
        return self._make(seq_len)


__all__ = [
    "SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig", "VariableSparsityConfig",
    "BigBirdSparsityConfig", "BSLongformerSparsityConfig", "LocalSlidingWindowSparsityConfig",
]

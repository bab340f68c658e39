// Block-sparse attention: DeepSpeed-compatible sparsity configs and layouts (and, in a later
// section, the block-sparse tensor ops). Public API layer (plain C++17, no third-party headers).
//
// A layout says which (query block, key block) pairs of each head are computed: a 0/1 tensor of
// shape [num_heads, L/block, L/block]. The configs, their parameters, defaults and algorithms are
// those of DeepSpeed's `deepspeed.ops.sparse_attention.sparsity_config` (see
// docs/block_sparse_layouts.md), with the differences listed there: every unidirectional layout is
// causal at block level, random blocks come from a seeded CPython-compatible generator, and
// block sizes are 16, 32, 64 or 128.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sciattn/status.h"

namespace sciattn {

// =================================================================================================
// Layouts
// =================================================================================================

// A block layout: blocks[h][r][c] is 1 when query block r of head h attends to key block c.
// Row-major [num_heads, num_row_blocks, num_col_blocks]. The configs below always make square
// layouts; the ops accept rectangular ones (DeepSpeed's MatMul does).
struct Layout {
  int64_t num_heads = 0;
  int64_t num_row_blocks = 0;
  int64_t num_col_blocks = 0;
  std::vector<uint8_t> blocks;  // [num_heads, num_row_blocks, num_col_blocks], each 0 or 1

  // A layout of the given shape, all zeros.
  static Layout zeros(int64_t num_heads, int64_t num_row_blocks, int64_t num_col_blocks);

  int64_t size() const { return num_heads * num_row_blocks * num_col_blocks; }
  int64_t index(int64_t h, int64_t r, int64_t c) const {
    return (h * num_row_blocks + r) * num_col_blocks + c;
  }
  uint8_t at(int64_t h, int64_t r, int64_t c) const {
    return blocks[static_cast<size_t>(index(h, r, c))];
  }
  uint8_t& at(int64_t h, int64_t r, int64_t c) {
    return blocks[static_cast<size_t>(index(h, r, c))];
  }

  friend bool operator==(const Layout& a, const Layout& b) {
    return a.num_heads == b.num_heads && a.num_row_blocks == b.num_row_blocks &&
           a.num_col_blocks == b.num_col_blocks && a.blocks == b.blocks;
  }
  friend bool operator!=(const Layout& a, const Layout& b) { return !(a == b); }
};

// Number of nonzero blocks of the whole layout (DeepSpeed's `layout.sum()`, the nnz of the
// block-sparse tensor format) and of one head.
int64_t layout_nnz(const Layout& layout);
int64_t layout_head_nnz(const Layout& layout, int64_t head);
// nnz / (num_heads * rows * cols); 0 for an empty layout.
double layout_density(const Layout& layout);
// The longest block row over all heads. Row-parallel kernels pay for it (spec 1.10).
int64_t layout_max_row_nnz(const Layout& layout);
// True when no head has a block above the diagonal (col > row): causal at block level.
bool layout_is_block_causal(const Layout& layout);
// The layout as text: per head a line "head h:" then one row of 0/1 digits per block row.
std::string layout_to_string(const Layout& layout);

// =================================================================================================
// Sparsity configs (DeepSpeed's classes; defaults are DeepSpeed's class defaults)
// =================================================================================================

// Block sizes the block-sparse ops run with (spec Decision 5). DeepSpeed's layout classes accept
// any block; its kernels need a multiple of 16.
inline constexpr int64_t kSupportedBlockSizes[] = {16, 32, 64, 128};
inline constexpr int64_t kDefaultBlock = 16;
// SparseSelfAttention builds its layout once for this length and crops it (spec 1.9).
inline constexpr int64_t kDefaultMaxSeqLength = 2048;
// The largest layout make_layout() builds (num_heads * N * N entries, one byte each), so that a
// mistyped length fails with a message instead of exhausting memory.
inline constexpr int64_t kMaxLayoutEntries = int64_t{1} << 32;

bool is_supported_block_size(int64_t block);

// DeepSpeed's `attention` parameter. DeepSpeed takes the strings "bidirectional" and
// "unidirectional"; unidirectional layouts here are always causal at block level (Decision 3).
enum class AttentionDirection { kBidirectional, kUnidirectional };
const char* attention_direction_name(AttentionDirection direction);  // "bidirectional", ...
std::optional<AttentionDirection> parse_attention_direction(std::string_view name);

// Fields every config has.
struct SparsityCommon {
  int64_t num_heads = 0;  // required (DeepSpeed has no default): the layer's attention heads
  int64_t block = kDefaultBlock;  // block size in tokens: 16, 32, 64 or 128
  // Seed of the CPython-compatible generator of random blocks (BigBird, Variable): the layout
  // equals DeepSpeed's after `random.seed(seed)`. Configs without random blocks ignore it.
  uint64_t seed = 0;
};

// DenseSparsityConfig: every block is 1.
struct DenseSparsityConfig : SparsityCommon {
  bool different_layout_per_head = false;  // accepted and ignored, as in DeepSpeed
};

// FixedSparsityConfig: OpenAI's "fixed" pattern. Local windows of num_local_blocks blocks, plus
// num_global_blocks "representative" global blocks per window (the last ones by default).
struct FixedSparsityConfig : SparsityCommon {
  bool different_layout_per_head = false;
  int64_t num_local_blocks = 4;   // must be a multiple of num_global_blocks
  int64_t num_global_blocks = 1;  // >= 1
  AttentionDirection attention = AttentionDirection::kBidirectional;
  bool horizontal_global_attention = false;  // bidirectional only: global rows see everything
  // Heads h use the (h mod P)-th representative position of each window, counted from the end;
  // P > 1 needs different_layout_per_head and P <= num_local_blocks / num_global_blocks.
  int64_t num_different_global_patterns = 1;
};

// VariableSparsityConfig: random blocks, local windows of variable sizes, global blocks given by
// index (or by [start, end) ranges).
struct VariableSparsityConfig : SparsityCommon {
  bool different_layout_per_head = false;
  int64_t num_random_blocks = 0;  // per block row
  // Sizes of the consecutive local windows from block 0; the last size repeats to the end.
  std::vector<int64_t> local_window_blocks = {4};
  std::vector<int64_t> global_block_indices = {0};
  // Absent (DeepSpeed's None): each index is one global block. Present: global block ranges
  // [global_block_indices[i], global_block_end_indices[i]).
  std::optional<std::vector<int64_t>> global_block_end_indices;
  AttentionDirection attention = AttentionDirection::kBidirectional;
  bool horizontal_global_attention = false;  // bidirectional only
};

// BigBirdSparsityConfig: random blocks, a sliding window and the first num_global_blocks blocks
// global (rows and columns).
struct BigBirdSparsityConfig : SparsityCommon {
  bool different_layout_per_head = false;
  int64_t num_random_blocks = 1;          // per block row
  int64_t num_sliding_window_blocks = 3;  // odd; an even value acts as the next odd one
  int64_t num_global_blocks = 1;
  AttentionDirection attention = AttentionDirection::kBidirectional;
};

// BSLongformerSparsityConfig: a sliding window plus global blocks given by index or range.
struct BSLongformerSparsityConfig : SparsityCommon {
  bool different_layout_per_head = false;
  int64_t num_sliding_window_blocks = 3;
  std::vector<int64_t> global_block_indices = {0};
  std::optional<std::vector<int64_t>> global_block_end_indices;  // as in VariableSparsityConfig
  AttentionDirection attention = AttentionDirection::kBidirectional;
};

// LocalSlidingWindowSparsityConfig: a sliding window only; the layout is shared by all heads.
// Unidirectional (the default) keeps self plus num_sliding_window_blocks / 2 past blocks.
struct LocalSlidingWindowSparsityConfig : SparsityCommon {
  int64_t num_sliding_window_blocks = 3;
  AttentionDirection attention = AttentionDirection::kUnidirectional;  // DeepSpeed's default
};

// A layout supplied by the user for exactly one length: layout.num_row_blocks ==
// layout.num_col_blocks == seq_len / block. layout.num_heads is num_heads, or 1 to share one
// layout between all heads.
struct UserSparsityConfig : SparsityCommon {
  Layout layout;
};

using SparsityConfig =
    std::variant<DenseSparsityConfig, FixedSparsityConfig, VariableSparsityConfig,
                 BigBirdSparsityConfig, BSLongformerSparsityConfig,
                 LocalSlidingWindowSparsityConfig, UserSparsityConfig>;

// The kind of a config. The names are DeepSpeed's JSON `mode` names ("dense", "fixed",
// "variable", "bigbird", "bslongformer") plus "local_sliding_window" and "user".
enum class SparsityMode {
  kDense,
  kFixed,
  kVariable,
  kBigBird,
  kBSLongformer,
  kLocalSlidingWindow,
  kUser
};
SparsityMode sparsity_mode(const SparsityConfig& config);
const char* sparsity_mode_name(SparsityMode mode);
std::optional<SparsityMode> parse_sparsity_mode(std::string_view name);
// The config of `mode` with DeepSpeed's class defaults and the given num_heads (a user config
// gets an empty layout, which the caller must fill).
SparsityConfig default_sparsity_config(SparsityMode mode, int64_t num_heads);
// The fields shared by every config.
const SparsityCommon& sparsity_common(const SparsityConfig& config);
SparsityCommon& sparsity_common(SparsityConfig& config);
// "FixedSparsityConfig(num_heads=4, block=16, num_local_blocks=4, ...)".
std::string to_string(const SparsityConfig& config);

// The checks that do not depend on the sequence length (DeepSpeed's constructor checks, plus
// ours: num_heads >= 1, a supported block, no negative counts or indices). The message names
// the offending parameter and says what would be accepted.
Status validate_sparsity_config(const SparsityConfig& config);

// The layout for sequence length seq_len: [num_heads, seq_len / block, seq_len / block].
// Equals DeepSpeed's `random.seed(seed); config.make_layout(seq_len)` wherever DeepSpeed's
// layout is valid (see docs/block_sparse_layouts.md for the fixed defects). Fails when the
// config is invalid, seq_len is not a positive multiple of block, or a parameter needs more
// blocks than seq_len has.
Status make_layout(const SparsityConfig& config, int64_t seq_len, Layout* out);

// SparseSelfAttention's rule: the layout for length seq_len is the top-left
// [seq_len / block, seq_len / block] crop of every head of a layout built for a longer length.
// Fails unless seq_len is a positive multiple of block that fits in `full`.
Status crop_layout(const Layout& full, int64_t block, int64_t seq_len, Layout* out);
// make_layout(config, max_seq_length) cropped to seq_len: what SparseSelfAttention with
// `max_seq_length` uses for an input of length seq_len. This differs from
// make_layout(config, seq_len) for Fixed and Variable (global blocks near the end move) and for
// the random blocks of BigBird and Variable.
Status make_layout_for_length(const SparsityConfig& config, int64_t max_seq_length, int64_t seq_len,
                              Layout* out);

// =================================================================================================
// DeepSpeed JSON config (the "sparse_attention" section of a DeepSpeed config file)
// =================================================================================================

// Reads `mode` ("dense", "fixed" (the default), "variable", "bigbird", "bslongformer") and the
// parameters that DeepSpeed's JSON path reads for that mode, with DeepSpeed's JSON defaults
// (note: bigbird's num_random_blocks defaults to 0 there, not 1). The text is either a whole
// DeepSpeed config with a "sparse_attention" object (its other keys are ignored) or that object
// alone. num_heads and seed are not part of DeepSpeed's JSON and are passed here. Fails, with a
// message naming the key, on malformed JSON, duplicate keys, unknown modes or keys, wrong types
// and values the config does not accept.
Status parse_deepspeed_sparsity_config(std::string_view json_text, int64_t num_heads,
                                       SparsityConfig* out, uint64_t seed = 0);
// The same, reading the text from a file.
Status load_deepspeed_sparsity_config(const std::string& path, int64_t num_heads,
                                      SparsityConfig* out, uint64_t seed = 0);

// =================================================================================================
// Block-sparse tensors and ops (MatMul sdd/dsd/dds, Softmax, SparseSelfAttention)
// =================================================================================================
// The block-sparse ops (spec section 2: the (Z, nnz, block, block) tensor format in
// layout.nonzero() order, its row and column indexes, and the ops' Params structs with
// can_implement / workspace_size / run) are declared in sciattn/block_sparse_ops.h, which
// includes this header; they take a Layout from the functions above.

}  // namespace sciattn

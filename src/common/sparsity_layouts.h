// Internal entry points of the sparsity layouts (DeepSpeed's SparsityConfig algorithms, spec
// sections 1.0-1.6). Host-only common layer (sciattn::detail); the public API is block_sparse.h.
#pragma once

#include <cstdint>
#include <vector>

#include "sciattn/block_sparse.h"
#include "sciattn/status.h"

namespace sciattn::detail {

struct LayoutBuildOptions {
  // Build DeepSpeed's grid even where it is defective (spec Decision 3): Fixed with more than one
  // global block and Variable with global ranges put unidirectional global blocks above the
  // diagonal, Variable draws unidirectional random blocks from every column, and unidirectional
  // BigBird with num_random_blocks >= 2 fails ("Sample larger than population"). Only the tests
  // use it, to check the algorithms bit for bit against DeepSpeed's grids and to show what the
  // fixes change.
  bool reproduce_deepspeed_defects = false;
};

// Where the painters of the configs write a layout: the dense [H, N, N] tensor (make_layout) or
// sorted column lists per row (build_sparse_layout_rows), so that both builds run the same
// painters and draw the random blocks in the same order. Ranges arrive clipped to [0, N), not
// empty; a row or column may be painted several times.
class LayoutSink {
 public:
  virtual ~LayoutSink() = default;
  // Sets rows [r0, r1) x columns [c0, c1) of one head.
  virtual void fill(int64_t head, int64_t r0, int64_t r1, int64_t c0, int64_t c1) = 0;
  // Removes every block above the diagonal, in every head; called once, after all painting.
  virtual void make_block_causal() = 0;
  // Every head becomes a copy of head 0 (the only head painted).
  virtual void share_first_head() = 0;
  // A user config's layout: of this N, with num_heads heads or one shared head.
  virtual void copy_user_layout(const Layout& user) = 0;
};

// The nonzero blocks of a (cropped) layout, row by row: what the index is built from without the
// dense layout.
struct SparseLayoutRows {
  int64_t num_heads = 0;   // H
  int64_t num_blocks = 0;  // n: block rows and columns of each head
  // Heads stored: num_heads, or 1 when every head is a copy of head 0.
  int64_t stored_heads = 0;
  // [stored_heads * n + 1] the columns of row r of stored head h are
  // cols[row_offsets[h * n + r] .. row_offsets[h * n + r + 1] - 1], ascending, each once.
  std::vector<int64_t> row_offsets;
  std::vector<int64_t> cols;
  std::vector<int64_t> rows;  // [cols.size()] the row of each listed block (r above)
};

// make_layout_for_length(config, max_seq_length, seq_len) as row lists, without the dense layout:
// the same blocks, and the same Status and message on every failure.
Status build_sparse_layout_rows(const SparsityConfig& config, int64_t max_seq_length,
                                int64_t seq_len, SparseLayoutRows* out);

// crop_layout's check (its message) for a layout of full_rows x full_cols blocks.
Status check_crop(int64_t full_rows, int64_t full_cols, int64_t block, int64_t seq_len);
// make_layout_for_length's check that seq_len <= max_seq_length.
Status check_length_for_crop(int64_t max_seq_length, int64_t seq_len);

// make_layout() with options.
Status build_layout(const SparsityConfig& config, int64_t seq_len,
                    const LayoutBuildOptions& options, Layout* out);

// num_heads * rows * cols, or false when it overflows int64 or a size is negative.
inline bool checked_layout_entries(int64_t num_heads, int64_t rows, int64_t cols, int64_t* out) {
  if (num_heads < 0 || rows < 0 || cols < 0) return false;
  int64_t per_head = 0;
  return !__builtin_mul_overflow(rows, cols, &per_head) &&
         !__builtin_mul_overflow(num_heads, per_head, out);
}

// DeepSpeed's class name of a mode ("FixedSparsityConfig", ...), the prefix of every message.
const char* sparsity_class_name(SparsityMode mode);

}  // namespace sciattn::detail

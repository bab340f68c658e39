// Internal entry points of the sparsity layouts (DeepSpeed's SparsityConfig algorithms, spec
// sections 1.0-1.6). Host-only common layer (sciattn::detail); the public API is block_sparse.h.
#pragma once

#include <cstdint>

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

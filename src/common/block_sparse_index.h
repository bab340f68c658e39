// The builds behind the public index functions (src/block_sparse_index.cpp): the row-wise (CSR)
// and column-wise (CSC) indexes of a layout or of a config's row lists, and the split of their
// lines into pieces of work. Host-only common layer (sciattn::detail); the callers have checked
// the arguments.
#pragma once

#include <cstdint>

#include "common/sparsity_layouts.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/status.h"

namespace sciattn::detail {

// The index of a layout whose sizes are checked (>= 1, blocks.size() their product, the token
// sizes within int64) with a supported block size. Fails, naming the entry, when an entry of
// layout.blocks is neither 0 nor 1.
Status index_from_layout(const Layout& layout, int64_t block, BlockSparseIndex* out);

// The index of a config's row lists (build_sparse_layout_rows), without the dense layout.
Status index_from_rows(SparseLayoutRows rows, int64_t block, BlockSparseIndex* out);

// default_split_blocks(index) of the public API: twice the mean line of the stored heads, at
// least 16 blocks.
int64_t default_split_blocks(const BlockSparseIndex& index);

// Re-makes the index's row and column splits with pieces of at most max_blocks (>= 1) blocks and
// drops its device copy, which holds the old splits.
void split_work(int64_t max_blocks, BlockSparseIndex* index);

}  // namespace sciattn::detail

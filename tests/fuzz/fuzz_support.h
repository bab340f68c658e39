// What the fuzz targets share: a failed expectation that libFuzzer reports as a crash (with the
// input that caused it), and the check that a config's two index builds agree. Test layer
// (tests/fuzz).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::fuzz {

// Stops the run, and libFuzzer saves the input, when `ok` is false.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz expectation failed: %s\n", what);
  std::abort();
}

inline bool same_split(const BlockSparseWorkSplit& a, const BlockSparseWorkSplit& b) {
  return a.max_blocks == b.max_blocks && a.line_items == b.line_items &&
         a.item_line == b.item_line && a.item_begin == b.item_begin && a.item_end == b.item_end &&
         a.split_lines == b.split_lines && a.max_pieces_per_line == b.max_pieces_per_line;
}

// A valid config at `blocks` blocks (a crop of one more block than that): the dense route
// (make_layout_for_length, then build_block_sparse_index, the definition) and the config route
// (build_sparse_attention_index) must give the same Status and, when they build, the same index.
inline void check_layout_and_indexes(const SparsityConfig& config, int64_t blocks) {
  // A valid config with millions of heads builds a layout of as many gigabytes as asked for; past
  // 2^22 entries the build only measures the allocator, and libFuzzer's memory limit would stop
  // the run, so such configs are checked by validate_sparsity_config alone.
  constexpr int64_t kMaxLayoutEntries = int64_t{1} << 22;
  if (sparsity_common(config).num_heads > kMaxLayoutEntries / (blocks * blocks)) return;
  const int64_t block = sparsity_common(config).block;
  const int64_t seq_len = blocks * block, max_seq_length = seq_len + block;
  Layout layout;
  Status dense = make_layout_for_length(config, max_seq_length, seq_len, &layout);
  BlockSparseIndex want;
  if (dense.ok()) dense = build_block_sparse_index(layout, block, &want);
  BlockSparseIndex got;
  const Status direct = build_sparse_attention_index(config, max_seq_length, seq_len, &got);
  require(dense.code() == direct.code() && dense.message() == direct.message(),
          "the dense and the config routes disagree on the Status");
  if (!dense.ok()) {
    require(!dense.message().empty(), "a rejection without a message");
    return;
  }
  require(layout.num_row_blocks == blocks && layout.num_col_blocks == blocks,
          "the layout does not have the crop's size");
  for (uint8_t b : layout.blocks) require(b <= 1, "a layout entry other than 0 or 1");
  require(got.nnz == layout_nnz(layout) && got.nnz == want.nnz, "nnz differs");
  require(got.head == want.head && got.row == want.row && got.col == want.col &&
              got.row_offsets == want.row_offsets && got.col_offsets == want.col_offsets &&
              got.col_rows == want.col_rows && got.col_blocks == want.col_blocks &&
              got.layout_heads == want.layout_heads && got.max_row_nnz == want.max_row_nnz &&
              got.max_col_nnz == want.max_col_nnz,
          "the two index builds differ");
  require(same_split(got.row_split, want.row_split) && same_split(got.col_split, want.col_split),
          "the two work splits differ");
}

}  // namespace sciattn::fuzz

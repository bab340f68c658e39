// Builds the BlockSparseIndex of a layout: the nonzero enumeration in DeepSpeed's order and the
// row-wise (CSR) and column-wise (CSC) indexes the kernels walk. Host-only common layer.
#include <algorithm>
#include <string>
#include <utility>

#include "common/tensor_checks.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn {
namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

}  // namespace

Status build_block_sparse_index(const Layout& layout, int64_t block, BlockSparseIndex* out) {
  if (out == nullptr) return Status::invalid_argument("out is a null pointer");
  if (!is_supported_block_size(block)) {
    return Status::invalid_argument("block must be 16, 32, 64 or 128; got " + str(block));
  }
  if (layout.num_heads < 1 || layout.num_row_blocks < 1 || layout.num_col_blocks < 1) {
    return Status::invalid_argument(
        "layout must have num_heads, num_row_blocks and num_col_blocks >= 1; got [" +
        str(layout.num_heads) + ", " + str(layout.num_row_blocks) + ", " +
        str(layout.num_col_blocks) + "]");
  }
  int64_t entries = 0, tokens = 0;
  // The ops address [R*b, C*b] matrices (rpe, attn_mask) with int64; keep that product in range.
  if (!detail::checked_product({layout.num_heads, layout.num_row_blocks, layout.num_col_blocks},
                               &entries) ||
      !detail::checked_product({layout.num_row_blocks, layout.num_col_blocks, block, block},
                               &tokens)) {
    return Status::invalid_argument("layout is too large: its sizes in tokens overflow int64");
  }
  if (layout.blocks.size() != static_cast<size_t>(entries)) {
    return Status::invalid_argument(
        "layout.blocks has " + std::to_string(layout.blocks.size()) +
        " entries but num_heads * num_row_blocks * num_col_blocks = " + str(entries));
  }
  BlockSparseIndex ix;
  ix.block = block;
  ix.num_heads = layout.num_heads;
  ix.num_row_blocks = layout.num_row_blocks;
  ix.num_col_blocks = layout.num_col_blocks;
  const int64_t H = ix.num_heads, R = ix.num_row_blocks, C = ix.num_col_blocks;

  // The enumeration and the CSR: one pass in (h, I, J) order, layout.nonzero()'s order (spec 2.1).
  ix.row_offsets.assign(static_cast<size_t>(H * R + 1), 0);
  std::vector<int64_t> col_counts(static_cast<size_t>(H * C), 0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t r = 0; r < R; ++r) {
      int64_t in_row = 0;
      for (int64_t c = 0; c < C; ++c) {
        const uint8_t v = layout.at(h, r, c);
        if (v > 1) {
          return Status::invalid_argument("layout.blocks entry (head " + str(h) + ", row " +
                                          str(r) + ", col " + str(c) + ") is " + str(v) +
                                          "; entries must be 0 or 1");
        }
        if (v == 0) continue;
        ix.head.push_back(h);
        ix.row.push_back(r);
        ix.col.push_back(c);
        ++col_counts[static_cast<size_t>(h * C + c)];
        ++in_row;
      }
      ix.row_offsets[static_cast<size_t>(h * R + r + 1)] =
          ix.row_offsets[static_cast<size_t>(h * R + r)] + in_row;
      ix.max_row_nnz = std::max(ix.max_row_nnz, in_row);
    }
  }
  ix.nnz = static_cast<int64_t>(ix.head.size());

  // The CSC: a counting sort of the enumeration by (h, J). Walking p in increasing order keeps
  // each column's blocks in increasing row order.
  ix.col_offsets.assign(static_cast<size_t>(H * C + 1), 0);
  for (int64_t k = 0; k < H * C; ++k) {
    ix.col_offsets[static_cast<size_t>(k + 1)] =
        ix.col_offsets[static_cast<size_t>(k)] + col_counts[static_cast<size_t>(k)];
    ix.max_col_nnz = std::max(ix.max_col_nnz, col_counts[static_cast<size_t>(k)]);
  }
  ix.col_rows.assign(static_cast<size_t>(ix.nnz), 0);
  ix.col_blocks.assign(static_cast<size_t>(ix.nnz), 0);
  std::vector<int64_t> fill(ix.col_offsets.begin(), ix.col_offsets.end() - 1);
  for (int64_t p = 0; p < ix.nnz; ++p) {
    const auto key =
        static_cast<size_t>(ix.head[static_cast<size_t>(p)] * C + ix.col[static_cast<size_t>(p)]);
    const auto slot = static_cast<size_t>(fill[key]++);
    ix.col_rows[slot] = ix.row[static_cast<size_t>(p)];
    ix.col_blocks[slot] = p;
  }
  *out = std::move(ix);
  return Status::ok_status();
}

Status build_sparse_attention_index(const SparsityConfig& config, int64_t max_seq_length,
                                    int64_t seq_len, BlockSparseIndex* out) {
  if (out == nullptr) return Status::invalid_argument("out is a null pointer");
  Layout layout;
  Status s = make_layout_for_length(config, max_seq_length, seq_len, &layout);
  if (!s.ok()) return s;
  return build_block_sparse_index(layout, sparsity_common(config).block, out);
}

}  // namespace sciattn

// The public functions of the block-sparse index: build it from a layout or from a config, split
// its lines into pieces of work, and upload its device copy. They check their arguments and hand
// the work to the builds in src/common/block_sparse_index.cpp, or to the CUDA back end for the
// upload. The one entry point of each.
#include <string>
#include <utility>

#include "common/allocation_status.h"
#include "common/block_sparse_index.h"
#include "common/sparsity_layouts.h"
#include "common/tensor_checks.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#ifdef SCIATTN_WITH_CUDA
#include "cuda/block_sparse/block_sparse_ops_cuda.h"
#endif

namespace sciattn {
namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

Status sparse_attention_index(const SparsityConfig& config, int64_t max_seq_length, int64_t seq_len,
                              BlockSparseIndex* out) {
  const int64_t block = sparsity_common(config).block;
  if (sparsity_mode(config) == SparsityMode::kUser) {
    // A user layout is given densely already: scanning it is the cheapest route.
    Layout layout;
    Status s = make_layout_for_length(config, max_seq_length, seq_len, &layout);
    if (!s.ok()) return s;
    return build_block_sparse_index(layout, block, out);
  }
  // The configs' painters write row lists directly: O(nnz + R) per head instead of a scan of the
  // dense [H, R, C] layout (16.7 M entries at 65,536 tokens and block 64, under 1% of them set).
  detail::SparseLayoutRows rows;
  Status s = detail::build_sparse_layout_rows(config, max_seq_length, seq_len, &rows);
  if (!s.ok()) return s;
  return detail::index_from_rows(std::move(rows), block, out);
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
  return detail::status_of_allocating(
      "build_block_sparse_index", [&] { return detail::index_from_layout(layout, block, out); });
}

int64_t default_split_blocks(const BlockSparseIndex& index) {
  return detail::default_split_blocks(index);
}

Status split_block_sparse_work(int64_t max_blocks, BlockSparseIndex* index) {
  if (index == nullptr) return Status::invalid_argument("index is a null pointer");
  if (max_blocks < 1) {
    return Status::invalid_argument("max_blocks must be >= 1; got " + str(max_blocks));
  }
  return detail::status_of_allocating("split_block_sparse_work", [&] {
    detail::split_work(max_blocks, index);
    return Status::ok_status();
  });
}

Status build_sparse_attention_index(const SparsityConfig& config, int64_t max_seq_length,
                                    int64_t seq_len, BlockSparseIndex* out) {
  if (out == nullptr) return Status::invalid_argument("out is a null pointer");
  return detail::status_of_allocating("build_sparse_attention_index", [&] {
    return sparse_attention_index(config, max_seq_length, seq_len, out);
  });
}

Status upload_block_sparse_index(BlockSparseIndex* index, int device) {
  if (index == nullptr) return Status::invalid_argument("index is a null pointer");
#ifdef SCIATTN_WITH_CUDA
  return detail::status_of_allocating(
      "upload_block_sparse_index", [&] { return cuda::upload_block_sparse_index(index, device); });
#else
  (void)device;
  return Status::not_supported(
      "this build of sciattn has no CUDA support; configure with the `cuda` or `gpu` preset "
      "(SCIATTN_WITH_CUDA=ON)");
#endif
}

}  // namespace sciattn

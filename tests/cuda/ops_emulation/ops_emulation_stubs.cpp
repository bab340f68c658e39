// The parts of the CUDA back end that the GPU ops' test suite needs besides the ops themselves,
// for the host emulation (tests/cuda/ops_emulation): the device index "uploaded" to host memory,
// one device, and the fused attention entry points (never called by the suite). Developer tool.
#include <cstdlib>
#include <memory>
#include <vector>
#include "common/block_sparse_checks.h"
#include "common/block_sparse_device_index.h"
#include "sciattn/device.h"
namespace sciattn {
BlockSparseDeviceIndex::~BlockSparseDeviceIndex() {
  std::free(memory);
}
int cuda_device_count() {
  return 1;
}
namespace detail {
Status check_device_index(const BlockSparseIndex& ix, const void*) {
  if (!ix.device)
    return Status::invalid_argument(
        "index: the tensors are on a CUDA device but the index has not been uploaded; call "
        "upload_block_sparse_index(&index, device) once after building it");
  return Status::ok_status();
}
}  // namespace detail
Status upload_block_sparse_index(BlockSparseIndex* ix, int) {
  auto d = std::make_shared<BlockSparseDeviceIndex>();
  const size_t n = ix->stored_nnz(), rows = ix->row_offsets.size(), cols = ix->col_offsets.size();
  const size_t total = 5 * n + rows + cols + 8;
  int32_t* m = static_cast<int32_t*>(std::calloc(total, 4));
  d->memory = m;
  size_t at = 0;
  auto put = [&](const std::vector<int64_t>& v) {
    int32_t* p = m + at;
    for (size_t i = 0; i < v.size(); ++i) p[i] = (int32_t)v[i];
    at += v.size() + 1;
    return p;
  };
  d->block = ix->block;
  d->num_heads = ix->num_heads;
  d->num_row_blocks = ix->num_row_blocks;
  d->num_col_blocks = ix->num_col_blocks;
  d->nnz = ix->nnz;
  d->layout_heads = ix->layout_heads;
  d->stored_nnz = ix->stored_nnz();
  d->head = put(ix->head);
  d->row = put(ix->row);
  d->col = put(ix->col);
  d->row_offsets = put(ix->row_offsets);
  d->col_offsets = put(ix->col_offsets);
  d->col_rows = put(ix->col_rows);
  d->col_blocks = put(ix->col_blocks);
  ix->device = d;
  return Status::ok_status();
}
namespace cuda {
using detail::AttentionShape;
Status check_sparse_attention_fused_cuda(const SparseAttentionForwardParams&,
                                         const AttentionShape&) {
  std::abort();
}
Status check_sparse_attention_fused_cuda(const SparseAttentionBackwardParams&,
                                         const AttentionShape&) {
  std::abort();
}
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionForwardParams&,
                                                  const AttentionShape&) {
  std::abort();
}
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionBackwardParams&,
                                                  const AttentionShape&) {
  std::abort();
}
Status run_sparse_attention_fused_cuda(const SparseAttentionForwardParams&, const AttentionShape&,
                                       void*, Stream) {
  std::abort();
}
Status run_sparse_attention_fused_cuda(const SparseAttentionBackwardParams&, const AttentionShape&,
                                       void*, Stream) {
  std::abort();
}
}  // namespace cuda
}  // namespace sciattn

// The GPU MatMul / Softmax / composite attention: not written yet (issue 5); every entry point
// reports kNotSupported. CUDA layer (host code).
#include "cuda/block_sparse_ops_cuda.h"

namespace sciattn::cuda {
namespace {
Status not_yet(const char* op) {
  return Status::not_supported(std::string(op) +
                               " has no CUDA kernels in this version yet; pass CPU tensors");
}
}  // namespace

Status check_block_sparse_matmul_cuda(const BlockSparseMatMulParams&) {
  return not_yet("the block-sparse MatMul");
}
Status check_block_sparse_matmul_cuda(const BlockSparseMatMulBackwardParams&) {
  return not_yet("the block-sparse MatMul");
}
Status check_block_sparse_softmax_cuda(const BlockSparseSoftmaxParams&) {
  return not_yet("the block-sparse Softmax");
}
Status check_block_sparse_softmax_cuda(const BlockSparseSoftmaxBackwardParams&) {
  return not_yet("the block-sparse Softmax");
}
size_t block_sparse_matmul_workspace_size_cuda(const BlockSparseMatMulParams&) {
  return 0;
}
size_t block_sparse_matmul_workspace_size_cuda(const BlockSparseMatMulBackwardParams&) {
  return 0;
}
size_t block_sparse_softmax_workspace_size_cuda(const BlockSparseSoftmaxParams&) {
  return 0;
}
size_t block_sparse_softmax_workspace_size_cuda(const BlockSparseSoftmaxBackwardParams&) {
  return 0;
}
Status run_block_sparse_matmul_cuda(const BlockSparseMatMulParams&, void*, Stream) {
  return not_yet("the block-sparse MatMul");
}
Status run_block_sparse_matmul_cuda(const BlockSparseMatMulBackwardParams&, void*, Stream) {
  return not_yet("the block-sparse MatMul");
}
Status run_block_sparse_softmax_cuda(const BlockSparseSoftmaxParams&, void*, Stream) {
  return not_yet("the block-sparse Softmax");
}
Status run_block_sparse_softmax_cuda(const BlockSparseSoftmaxBackwardParams&, void*, Stream) {
  return not_yet("the block-sparse Softmax");
}
Status check_sparse_attention_composite_cuda(const SparseAttentionForwardParams&,
                                             const detail::AttentionShape&) {
  return not_yet("composite sparse attention");
}
Status check_sparse_attention_composite_cuda(const SparseAttentionBackwardParams&,
                                             const detail::AttentionShape&) {
  return not_yet("composite sparse attention");
}
size_t sparse_attention_composite_workspace_size_cuda(const SparseAttentionForwardParams&,
                                                      const detail::AttentionShape&) {
  return 0;
}
size_t sparse_attention_composite_workspace_size_cuda(const SparseAttentionBackwardParams&,
                                                      const detail::AttentionShape&) {
  return 0;
}
Status run_sparse_attention_composite_cuda(const SparseAttentionForwardParams&,
                                           const detail::AttentionShape&, void*, Stream) {
  return not_yet("composite sparse attention");
}
Status run_sparse_attention_composite_cuda(const SparseAttentionBackwardParams&,
                                           const detail::AttentionShape&, void*, Stream) {
  return not_yet("composite sparse attention");
}

}  // namespace sciattn::cuda

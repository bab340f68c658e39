// The CUDA back end of the block-sparse MatMul and Softmax, and of the composite sparse attention
// built on them, as the ops' dispatch point sees it: plain C++ declarations (no CUDA headers),
// defined under src/cuda/block_sparse/. The common checks (common/block_sparse_checks.h) and
// detail::check_device_index have passed before any of these is called; p.index->device is the
// uploaded index.
#pragma once

#include <cstddef>

#include "common/block_sparse_checks.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cuda {

// upload_block_sparse_index (src/block_sparse_index.cpp) on a CUDA build: packs the index and
// copies it to `device` (index is not null).
Status upload_block_sparse_index(BlockSparseIndex* index, int device);

// What the GPU kernels accept beyond the common checks (ok when nothing more is needed).
Status check_block_sparse_matmul_cuda(const BlockSparseMatMulParams& p);
Status check_block_sparse_matmul_cuda(const BlockSparseMatMulBackwardParams& p);
Status check_block_sparse_softmax_cuda(const BlockSparseSoftmaxParams& p);
Status check_block_sparse_softmax_cuda(const BlockSparseSoftmaxBackwardParams& p);

// Device workspace bytes (exact: the launch carves the same layout).
size_t block_sparse_matmul_workspace_size_cuda(const BlockSparseMatMulParams& p);
size_t block_sparse_matmul_workspace_size_cuda(const BlockSparseMatMulBackwardParams& p);
size_t block_sparse_softmax_workspace_size_cuda(const BlockSparseSoftmaxParams& p);
size_t block_sparse_softmax_workspace_size_cuda(const BlockSparseSoftmaxBackwardParams& p);

// Queue the op on `stream` (asynchronous; errors the kernels raise show at the next sync).
Status run_block_sparse_matmul_cuda(const BlockSparseMatMulParams& p, void* workspace,
                                    Stream stream);
Status run_block_sparse_matmul_cuda(const BlockSparseMatMulBackwardParams& p, void* workspace,
                                    Stream stream);
Status run_block_sparse_softmax_cuda(const BlockSparseSoftmaxParams& p, void* workspace,
                                     Stream stream);
Status run_block_sparse_softmax_cuda(const BlockSparseSoftmaxBackwardParams& p, void* workspace,
                                     Stream stream);

// SparseAttentionAlgorithm::kComposite on the GPU: sdd -> softmax -> dsd with W and P held in
// fp32 in the workspace, as on the CPU (cpu/sparse_attention_composite.cpp).
Status check_sparse_attention_composite_cuda(const SparseAttentionForwardParams& p,
                                             const detail::AttentionShape& s);
Status check_sparse_attention_composite_cuda(const SparseAttentionBackwardParams& p,
                                             const detail::AttentionShape& s);
size_t sparse_attention_composite_workspace_size_cuda(const SparseAttentionForwardParams& p,
                                                      const detail::AttentionShape& s);
size_t sparse_attention_composite_workspace_size_cuda(const SparseAttentionBackwardParams& p,
                                                      const detail::AttentionShape& s);
Status run_sparse_attention_composite_cuda(const SparseAttentionForwardParams& p,
                                           const detail::AttentionShape& s, void* workspace,
                                           Stream stream);
Status run_sparse_attention_composite_cuda(const SparseAttentionBackwardParams& p,
                                           const detail::AttentionShape& s, void* workspace,
                                           Stream stream);

}  // namespace sciattn::cuda

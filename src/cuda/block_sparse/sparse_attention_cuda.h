// The CUDA back end of the fused block-sparse attention (SparseAttentionAlgorithm::kFused) as the
// ops' dispatch point sees it: plain C++ declarations (no CUDA headers), defined under
// src/cuda/block_sparse/. The common checks and detail::check_device_index have passed before
// any of these is called; p.index->device is the uploaded index.
#pragma once

#include <cstddef>

#include "common/block_sparse_checks.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cuda {

// What the fused kernels accept beyond the common checks (head dim, dtype, block, ...).
Status check_sparse_attention_fused_cuda(const SparseAttentionForwardParams& p,
                                         const detail::AttentionShape& s);
Status check_sparse_attention_fused_cuda(const SparseAttentionBackwardParams& p,
                                         const detail::AttentionShape& s);

// Device workspace bytes (exact: the launch carves the same layout).
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionForwardParams& p,
                                                  const detail::AttentionShape& s);
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionBackwardParams& p,
                                                  const detail::AttentionShape& s);

// Queue the forward / backward on `stream`.
Status run_sparse_attention_fused_cuda(const SparseAttentionForwardParams& p,
                                       const detail::AttentionShape& s, void* workspace,
                                       Stream stream);
Status run_sparse_attention_fused_cuda(const SparseAttentionBackwardParams& p,
                                       const detail::AttentionShape& s, void* workspace,
                                       Stream stream);

}  // namespace sciattn::cuda

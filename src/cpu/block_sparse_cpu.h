// The CPU execution path of the block-sparse ops: MatMul kernels on logical (already transposed)
// views, the Softmax, and the composite and fused sparse attention. CPU layer.
//
// Every kernel splits its work into tasks that own disjoint outputs and run sequentially inside,
// so the bits of every result are the same for any thread count. Each takes the thread count and
// a workspace of the size its *_workspace_size function reports for that count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/block_sparse_checks.h"
#include "cpu/block_sparse_tiles.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cpu {

// ---- MatMul kernels. Dense operands are logical 4-D views (a transposed operand is a view with
// its last two strides swapped); a sparse operand is [Z, nnz, b, b] and trans_s reads it as the
// transpose of its logical matrix.

// c (sparse) = x [Z, H, R*b, K] * y [Z, H, K, C*b] on the layout's blocks.
size_t sdd_workspace_size(const BlockSparseIndex& ix, int64_t k, int threads);
void sdd(const BlockSparseIndex& ix, const TensorView& x, const TensorView& y, const TensorView& c,
         int threads, void* workspace);

// out [Z, H, M, N] = op(s) * y [Z, H, Kin, N].
size_t dsd_workspace_size(const BlockSparseIndex& ix, int64_t n, int threads);
void dsd(const BlockSparseIndex& ix, const TensorView& s, bool trans_s, const TensorView& y,
         const TensorView& out, int threads, void* workspace);

// out [Z, H, M, N] = x [Z, H, M, Kin] * op(s).
size_t dds_workspace_size(const BlockSparseIndex& ix, int threads);
void dds(const BlockSparseIndex& ix, const TensorView& x, const TensorView& s, bool trans_s,
         const TensorView& out, int threads, void* workspace);

// The public MatMul, forward and backward (the backward is expressed through the three kernels).
size_t matmul_workspace_size(const BlockSparseMatMulParams& p, const detail::MatMulShape& s,
                             int threads);
void run_matmul(const BlockSparseMatMulParams& p, int threads, void* workspace);
size_t matmul_backward_workspace_size(const BlockSparseMatMulBackwardParams& p,
                                      const detail::MatMulShape& s, int threads);
void run_matmul_backward(const BlockSparseMatMulBackwardParams& p, int threads, void* workspace);

// ---- Softmax. y may be x (in place); lse, when present, is a [Z, H, R*b] f32 view that gets
// each row's log-sum-exp (-inf for a fully masked row; rows of empty block rows are not written).
size_t softmax_workspace_size(const BlockSparseIndex& ix, int threads);
void softmax_forward(const BlockSparseIndex& ix, int64_t batch, const TensorView& x,
                     const TensorView& y, const ScoreTerms& terms, const TensorView* lse,
                     int threads, void* workspace);
// dx may be dy (in place).
size_t softmax_backward_workspace_size(const BlockSparseIndex& ix, int threads);
void softmax_backward(const BlockSparseIndex& ix, int64_t batch, const TensorView& y,
                      const TensorView& dy, const TensorView& dx, float scale, int threads,
                      void* workspace);

// ---- Sparse attention.
ScoreTerms attention_score_terms(const SparseAttentionOptions& o, float scale,
                                 const TensorView& rpe, const TensorView& key_padding_mask,
                                 const TensorView& attn_mask);

size_t composite_forward_workspace_size(const SparseAttentionForwardParams& p,
                                        const detail::AttentionShape& s, int threads);
void composite_forward(const SparseAttentionForwardParams& p, const detail::AttentionShape& s,
                       int threads, void* workspace);
size_t composite_backward_workspace_size(const SparseAttentionBackwardParams& p,
                                         const detail::AttentionShape& s, int threads);
void composite_backward(const SparseAttentionBackwardParams& p, const detail::AttentionShape& s,
                        int threads, void* workspace);

size_t fused_forward_workspace_size(const SparseAttentionForwardParams& p,
                                    const detail::AttentionShape& s, int threads);
void fused_forward(const SparseAttentionForwardParams& p, const detail::AttentionShape& s,
                   int threads, void* workspace);
size_t fused_backward_workspace_size(const SparseAttentionBackwardParams& p,
                                     const detail::AttentionShape& s, int threads);
void fused_backward(const SparseAttentionBackwardParams& p, const detail::AttentionShape& s,
                    int threads, void* workspace);

}  // namespace sciattn::cpu

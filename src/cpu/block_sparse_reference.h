// The block-sparse reference: plain, obviously correct loops that follow the formulas of spec
// section 2, the specification the kernels are tested against. CPU layer. Acc = float for the
// public kReference attention and the tests' low-precision reference, double for the tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/block_sparse_checks.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cpu {

// C of a MatMul in Acc, into a packed buffer of the result's logical shape: [Z, nnz, b, b] for
// sdd, [Z, H, M, N] for dsd and dds. Every element is a dot product over the sparse operand's
// logical matrix (zero outside the layout). Test helper: allocates its own lookup table.
template <typename Acc>
void reference_matmul(const BlockSparseMatMulParams& p, Acc* c);

// dA and dB of a MatMul in Acc from the definition C = op(A) op(B) (for sdd, C only on the
// layout): d op(A)[i, k] = sum_j dC[i, j] op(B)[k, j] and d op(B)[k, j] = sum_i op(A)[i, k]
// dC[i, j], stored in a's and b's own shapes (transposed back; a sparse gradient on its layout).
// da / db are packed buffers of a's / b's shapes, or nullptr to skip. Test helper.
template <typename Acc>
void reference_matmul_backward(const BlockSparseMatMulBackwardParams& p, Acc* da, Acc* db);

// The Softmax's y (forward) or dx (backward) in Acc, packed [Z, nnz, b, b]. Test helpers.
template <typename Acc>
void reference_softmax(const BlockSparseSoftmaxParams& p, Acc* y);
template <typename Acc>
void reference_softmax_backward(const BlockSparseSoftmaxBackwardParams& p, Acc* dx);

// Dense attention with the layout as a mask, in Acc. out [B, H, L, D] and lse [B, H, L] packed;
// `row` is scratch of L values. A row with no unmasked key gets out = 0 and lse = -inf.
template <typename Acc>
void reference_attention_forward(const SparseAttentionForwardParams& p,
                                 const detail::AttentionShape& s, Acc* out, Acc* lse, Acc* row);

// Its exact gradient: recomputes the softmax (reads neither p.out nor p.lse). dq, dk, dv are
// packed [B, H, L, D] (overwritten); `row` and `drow` are scratch of L values each.
template <typename Acc>
void reference_attention_backward(const SparseAttentionBackwardParams& p,
                                  const detail::AttentionShape& s, Acc* dq, Acc* dk, Acc* dv,
                                  Acc* row, Acc* drow);

// The public kReference algorithm: fp32 buffers carved from the workspace, then the results
// rounded into the caller's tensors. One thread.
size_t reference_forward_workspace_size(const detail::AttentionShape& s);
size_t reference_backward_workspace_size(const detail::AttentionShape& s);
void run_reference_forward(const SparseAttentionForwardParams& p, const detail::AttentionShape& s,
                           void* workspace);
void run_reference_backward(const SparseAttentionBackwardParams& p, const detail::AttentionShape& s,
                            void* workspace);

}  // namespace sciattn::cpu

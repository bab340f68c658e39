// Validation of the block-sparse ops' Params (MatMul, Softmax, sparse attention, padding), shared
// by every back end. Host-only common layer: each message names the Params field and says what
// would be accepted.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "sciattn/block_sparse_ops.h"

namespace sciattn::detail {

#define SCIATTN_BS_RETURN_IF_ERROR(expr) \
  do {                                   \
    Status status_ = (expr);             \
    if (!status_.ok()) return status_;   \
  } while (0)

// The sizes of a MatMul call: the logical problem C[M, N] = op(A)[M, K] * op(B)[K, N] per (z, h).
struct MatMulShape {
  int64_t batch = 0;  // Z
  int64_t heads = 0;  // H
  int64_t m = 0, n = 0, k = 0;
};

// Sizes of a sparse attention call: Q, K, V, O are [B, H, L, D].
struct AttentionShape {
  int64_t batch = 0, heads = 0, len = 0, dim = 0;
};

// index is present and internally consistent (its arrays have the sizes its counts say), so the
// kernels cannot index out of its arrays. Cheap: it does not re-derive the index from a layout.
Status check_index(const BlockSparseIndex* index);

// A tensor whose strides may be anything, including a non-unit last stride (a transposed view)
// and 0 (broadcast): the checks of check_tensor except the unit last stride.
Status check_tensor_any_strides(const TensorView& t, const char* name, const char* symbolic,
                                const std::vector<int64_t>& sizes,
                                std::initializer_list<DType> dtypes, Device device);

// A sparse tensor [Z, nnz, b, b] of `index` (Z read off the tensor when z < 0).
Status check_sparse_tensor(const TensorView& t, const char* name, const BlockSparseIndex& index,
                           int64_t z, std::initializer_list<DType> dtypes, Device device);

// True when a and b are the same view: data, dtype, device, rank, sizes and strides.
bool same_view(const TensorView& a, const TensorView& b);

Status check_num_threads(int num_threads);

Status check_matmul(const BlockSparseMatMulParams& p, MatMulShape* shape);
Status check_matmul_backward(const BlockSparseMatMulBackwardParams& p, MatMulShape* shape);

// Z of the call is returned in *batch.
Status check_softmax(const BlockSparseSoftmaxParams& p, int64_t* batch);
Status check_softmax_backward(const BlockSparseSoftmaxBackwardParams& p, int64_t* batch);

Status check_attention_forward(const SparseAttentionForwardParams& p, AttentionShape* shape);
Status check_attention_backward(const SparseAttentionBackwardParams& p, AttentionShape* shape);

// The effective scale: options.scale or 1 / sqrt(D).
float attention_scale(const SparseAttentionOptions& options, int64_t dim);

// Checks of the padding helpers.
Status check_pad(const TensorView& src, int dim, int64_t block, const TensorView& dst);
Status check_unpad(const TensorView& src, int dim, const TensorView& dst);
Status check_padding_key_mask(int64_t valid_len, MaskMode mode, const TensorView& dst);

}  // namespace sciattn::detail

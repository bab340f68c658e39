// The launchers of the GPU block-sparse kernels (MatMul sdd / dsd / dds on logical views, the
// Softmax forward and backward), shared by the ops' dispatch and the composite attention. CUDA
// layer, host side: plain C++ plus the runtime's stream type; the kernels live in
// block_sparse_matmul.cu and block_sparse_softmax.cu.
//
// Every launcher takes logical views: a dense operand is a rank-4 TensorView [Z, H, rows, cols]
// with any strides (a transpose is a view with the last two strides swapped, as on the CPU), a
// sparse operand is [Z, nnz, b, b] with stride 1 on its last dimension. Operands may have
// different dtypes where the composite attention needs it (fp32 scores times a bf16 V); the
// launchers report kNotSupported for a combination that is not instantiated.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/block_sparse_device_index.h"
#include "cuda/common/device_guard.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cuda::bs {

// The view with its last two dimensions swapped (op(X) = X^T without a copy).
inline TensorView transposed(const TensorView& t) {
  TensorView r = t;
  const int64_t size = r.sizes[2], stride = r.strides[2];
  r.sizes[2] = r.sizes[3];
  r.strides[2] = r.strides[3];
  r.sizes[3] = size;
  r.strides[3] = stride;
  return r;
}

// c[z, p] = x[z, h_p, I_p*b .. +b, :] * y[z, h_p, :, J_p*b .. +b] for every block p.
// x [Z, H, R*b, K], y [Z, H, K, C*b] (any strides), c [Z, nnz, b, b].
// Supported dtypes (x, y, c): all one of f32 / f16 / bf16, or x = y in f16 / bf16 and c f32.
Status launch_sdd(const BlockSparseDeviceIndex& ix, const TensorView& x, const TensorView& y,
                  const TensorView& c, cudaStream_t stream);

// out = op(S) * y with S sparse [Z, nnz, b, b] (op = transpose when trans_s); y [Z, H, Kin, N]
// and out [Z, H, Mout, N] dense with any strides. Every element of out is written (rows of
// empty block lines get zeros). Dtypes (s, y, out): all one type, or s f32 with y = out in f16 /
// bf16. The output's block lines (block rows of op(S)) are worked in the pieces of the index's
// work split (row_split, or col_split when trans_s): a line cut into several pieces has each
// piece's sum written to `partial` (dsd_partial_elems floats; null when that is 0) and a second
// kernel adds them in piece order, so the result is deterministic.
Status launch_dsd(const BlockSparseDeviceIndex& ix, const TensorView& s, bool trans_s,
                  const TensorView& y, const TensorView& out, float* partial, cudaStream_t stream);

// out = x * op(S): x [Z, H, M, Kin] and out [Z, H, M, Nout] dense with any strides, S sparse.
// All three in one dtype. Block columns of op(S) in the pieces of col_split (row_split when
// trans_s), with `partial` (dds_partial_elems floats) as for launch_dsd.
Status launch_dds(const BlockSparseDeviceIndex& ix, const TensorView& x, const TensorView& s,
                  bool trans_s, const TensorView& out, float* partial, cudaStream_t stream);

// The fp32 partial sums a launch_dsd with `batch` batches and n output columns, or a launch_dds
// with m output rows, needs for the split lines of its direction: [batch * H / G, split pieces,
// rows, columns of one output block line].
inline int64_t dsd_partial_elems(const BlockSparseIndex& ix, bool trans_s, int64_t batch,
                                 int64_t n) {
  const BlockSparseWorkSplit& w = trans_s ? ix.col_split : ix.row_split;
  const int64_t repeats = ix.layout_heads > 0 ? ix.num_heads / ix.layout_heads : 0;
  return batch * repeats * w.split_pieces() * ix.block * n;
}
inline int64_t dds_partial_elems(const BlockSparseIndex& ix, bool trans_s, int64_t batch,
                                 int64_t m) {
  const BlockSparseWorkSplit& w = trans_s ? ix.row_split : ix.col_split;
  const int64_t repeats = ix.layout_heads > 0 ? ix.num_heads / ix.layout_heads : 0;
  return batch * repeats * w.split_pieces() * m * ix.block;
}

// The terms added to a score before the softmax (see cpu::ScoreTerms): absent tensors have a
// null data pointer.
struct SoftmaxTerms {
  float scale = 1.0f;
  TensorView rpe;               // [Z, H, R*b, C*b]  f32, f16 or bf16
  TensorView key_padding_mask;  // [Z, C*b]  f32, f16, bf16 or bool
  TensorView attn_mask;         // [R*b, C*b]  f32, f16, bf16 or bool
  MaskMode key_padding_mask_mode = MaskMode::kAdd;
  MaskMode attn_mask_mode = MaskMode::kAdd;
  bool causal = false;
};

// y = softmax over each row's layout entries of x with the terms; y may be x (in place). lse
// [Z, H, R*b] f32 is written when present (-inf for rows without any unmasked key).
Status launch_softmax_forward(const BlockSparseDeviceIndex& ix, int64_t batch, const TensorView& x,
                              const TensorView& y, const SoftmaxTerms& terms, const TensorView& lse,
                              cudaStream_t stream);

// dx = scale * y * (dy - sum_row(y * dy)); dx may be dy (in place).
Status launch_softmax_backward(const BlockSparseDeviceIndex& ix, int64_t batch, const TensorView& y,
                               const TensorView& dy, const TensorView& dx, float scale,
                               cudaStream_t stream);

}  // namespace sciattn::cuda::bs

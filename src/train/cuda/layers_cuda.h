// Launchers of the trainer's CUDA kernels (host declarations; the kernels are in the .cu files
// beside). CUDA layer of the trainer: the CUDA back end (cuda_backend.cpp) checks the calls'
// TensorViews and calls these with raw device pointers. Each returns the launch's error
// (cudaGetLastError) and queues its work on `stream`; none allocates. Element types: `dtype` is
// the compute dtype (f32, f16 or bf16) of every non-float pointer.
//
// Determinism: no floating-point atomics. Sums over tokens that end in a weight or bias gradient
// follow backend.h's rule: per chunk of `chunk` rows from row 0, a fixed-order sum, and the chunk
// sums added to the gradient in chunk order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sciattn/dtype.h"

namespace sciattn::train::cuda {

// out[b*L + t] = wte[tokens[b*L + t]] + (wpe ? wpe[t] : 0), fp32 sum rounded once. A token
// outside [0, V) gives a NaN row and is reported in *bad_token (report_bad_token).
cudaError_t embedding_forward(DType dtype, void* out, const int32_t* tokens, const void* wte,
                              const void* wpe, int64_t B, int64_t L, int64_t C, int64_t V,
                              unsigned long long* bad_token, cudaStream_t stream);

// dwte[v] += the rows of dout whose token is v, added in token order (a stable sort of the
// tokens, then one walk per run of equal tokens: the CPU's order, so the fp32 results equal the
// CPU's); dwpe[t] += dout[b*L + t] for b in order. Bad tokens are skipped and reported.
size_t embedding_backward_workspace(int64_t tokens, int64_t V);
cudaError_t embedding_backward(DType dtype, float* dwte, float* dwpe, const void* dout,
                               const int32_t* tokens, int64_t B, int64_t L, int64_t C, int64_t V,
                               void* workspace, size_t workspace_bytes,
                               unsigned long long* bad_token, cudaStream_t stream);

// LayerNorm forward over rows of C (one warp per row; mean and biased variance in fp32, two
// passes).
cudaError_t layernorm_forward(DType dtype, void* out, float* mean, float* rstd, const void* in,
                              const void* weight, const void* bias, int64_t N, int64_t C, float eps,
                              cudaStream_t stream);
// din += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)), g = dout * weight (one warp per row).
cudaError_t layernorm_backward_input(DType dtype, void* din, const void* dout, const void* in,
                                     const void* weight, const float* mean, const float* rstd,
                                     int64_t N, int64_t C, cudaStream_t stream);

// Workspace of the column sums below for N rows of `cols` columns, `values` sums per column.
size_t column_sums_workspace(int64_t N, int64_t cols, int64_t chunk, int values);
// dweight += sum_t dout * xhat, dbias += sum_t dout (chunked as above).
cudaError_t layernorm_backward_params(DType dtype, float* dweight, float* dbias, const void* dout,
                                      const void* in, const float* mean, const float* rstd,
                                      int64_t N, int64_t C, int64_t chunk, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);
// dbias += sum_t dout[t] over rows of OC (chunked as above).
cudaError_t bias_backward(DType dtype, float* dbias, const void* dout, int64_t N, int64_t OC,
                          int64_t chunk, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream);
// out[t] += bias, rows of OC (for products whose bias cannot ride in cuBLASLt's epilogue).
cudaError_t add_bias(DType dtype, void* out, const void* bias, int64_t N, int64_t OC,
                     cudaStream_t stream);

// GELU (tanh approximation) and its derivative times dout; in place allowed.
cudaError_t gelu_forward(DType dtype, void* out, const void* in, int64_t n, cudaStream_t stream);
cudaError_t gelu_backward(DType dtype, void* din, const void* in, const void* dout, int64_t n,
                          cudaStream_t stream);
// out = a + b; out may be a or b.
cudaError_t add(DType dtype, void* out, const void* a, const void* b, int64_t n,
                cudaStream_t stream);
// Rotary "rotate half" on q and k of qkv [B, L, 3, H, D] in place; angles in fp64 as the CPU
// forms them.
cudaError_t rotary(DType dtype, void* qkv, int64_t B, int64_t L, int64_t H, int64_t D, float base,
                   bool inverse, cudaStream_t stream);

// Row copies (strides in bytes): for b < B and l < dst_rows, dst row (b, l) = src row (b, l) when
// l < src_rows, else zeros. Pads [B, L, row] to [B, Lp, row], unpads, and interleaves the
// attention's dq, dk, dv into dqkv.
cudaError_t copy_rows(void* dst, int64_t dst_batch_stride, int64_t dst_row_stride, const void* src,
                      int64_t src_batch_stride, int64_t src_row_stride, int64_t B, int64_t dst_rows,
                      int64_t src_rows, int64_t row_bytes, cudaStream_t stream);

// dst = src over a view of `rank` (1 to 6) dimensions of `sizes` with element strides per side
// (any values), elements of `elem_bytes` bytes copied bit for bit (strided_copy.cu). Runs of a
// last dimension packed on both sides move in the widest unit up to 16 bytes that the addresses,
// strides and run length allow; the views must not overlap.
cudaError_t strided_copy(void* dst, const int64_t* dst_strides, const void* src,
                         const int64_t* src_strides, const int64_t* sizes, int rank,
                         size_t elem_bytes, cudaStream_t stream);

// Cross-entropy of `rows` rows of logits [rows, V] (compute dtype) in place: one block per row,
// max, then the sum of exp(l - max) in fp32 (fixed order), lse = max + log(sum); losses[r] =
// lse - logits[target] (when losses is given); with `grad` the row is overwritten with
// grad_scale * (softmax - onehot(target)). A target outside [0, V) gives a NaN loss, no onehot,
// and is reported.
cudaError_t cross_entropy(DType dtype, void* logits, float* losses, const int32_t* targets,
                          int64_t rows, int64_t V, float grad_scale, bool grad,
                          unsigned long long* bad_token, cudaStream_t stream);

}  // namespace sciattn::train::cuda

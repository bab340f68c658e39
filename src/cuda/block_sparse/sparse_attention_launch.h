// Launchers of the fused block-sparse attention kernels: one explicit instantiation per (dtype,
// head dim) in its own generated .cu file, plus the dtype-generic and fp32 ones
// (sparse_attention_f32.cu). CUDA layer (host code; included by the dispatch and the instances).
#pragma once

#include <cuda_runtime.h>

#include "cuda/block_sparse/sparse_attention_params.h"

namespace sciattn::cuda {

// T is __half or __nv_bfloat16; kHeadDim (32, 64 or 128) the instantiated (padded) head dim.
// The forward runs the tile-row kernel and, when rows are split, the combine kernel.
template <typename T, int kHeadDim>
cudaError_t launch_sparse_attention_forward(const SparseAttentionDeviceParams& p,
                                            cudaStream_t stream);

// dK/dV, dQ and the sums of split lines; delta must already be in p.delta.
template <typename T, int kHeadDim>
cudaError_t launch_sparse_attention_backward(const SparseAttentionDeviceParams& p,
                                             cudaStream_t stream);

// delta_i = <dO_i, O_i> into p.delta, for T = float, __half or __nv_bfloat16.
template <typename T>
cudaError_t launch_sparse_attention_delta(const SparseAttentionDeviceParams& p,
                                          cudaStream_t stream);

// fp32 inputs: exact fp32 kernels on the CUDA cores, one thread per output row walking its whole
// line (no splits, no workspace beyond delta); the backward needs delta in p.delta.
cudaError_t launch_sparse_attention_forward_f32(const SparseAttentionDeviceParams& p,
                                                cudaStream_t stream);
cudaError_t launch_sparse_attention_backward_f32(const SparseAttentionDeviceParams& p,
                                                 cudaStream_t stream);

}  // namespace sciattn::cuda

// Launchers of the Evoformer kernels, one explicit instantiation per (dtype, head dim) in its own
// generated .cu file. CUDA layer (host code; included by the dispatch and the instances).
#pragma once

#include <cuda_runtime.h>

#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

// T is __half or __nv_bfloat16; kHeadDim is the instantiated (padded) head dim.
template <typename T, int kHeadDim>
cudaError_t launch_evoformer_forward(const EvoformerDeviceParams& p, cudaStream_t stream);

// delta (into p.delta), dK/dV (with the dbias1 partial), dQ and dbias2 (or its chunk partials).
template <typename T, int kHeadDim>
cudaError_t launch_evoformer_backward(const EvoformerDeviceParams& p, cudaStream_t stream);

// fp32 inputs: exact fp32 kernels on the CUDA cores (evoformer_f32_kernels.cu); the backward
// needs delta in p.delta and writes dbias2 itself (one chunk).
cudaError_t launch_evoformer_forward_f32(const EvoformerDeviceParams& p, cudaStream_t stream);
cudaError_t launch_evoformer_backward_f32(const EvoformerDeviceParams& p, cudaStream_t stream);

// The dtype-generic pieces of the backward.
template <typename T>
cudaError_t launch_evoformer_backward_delta(const EvoformerDeviceParams& p, cudaStream_t stream);
cudaError_t launch_evoformer_backward_dbias_reduce(const EvoformerDeviceParams& p,
                                                   cudaStream_t stream);

// The padded copies of a call's unaligned biases and inputs, in one launch
// (detail::CudaInputCopies; evoformer_row_copy.cu), overlapped with the kernels before it where
// `overlap` (common/overlapped_launch.h).
cudaError_t launch_evoformer_row_copies(const EvoformerCopyJobs& jobs, bool overlap,
                                        cudaStream_t stream);

// CTAs of each kernel (also used to reject shapes whose 1-D grid would pass 2^31 - 1).
int64_t evoformer_forward_ctas(const EvoformerDeviceParams& p);
int64_t evoformer_dkdv_ctas(const EvoformerDeviceParams& p);
int64_t evoformer_dq_ctas(const EvoformerDeviceParams& p);
int64_t evoformer_dbias2_ctas(const EvoformerDeviceParams& p);

}  // namespace sciattn::cuda

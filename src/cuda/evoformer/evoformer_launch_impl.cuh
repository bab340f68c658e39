// The bodies of the per-instantiation launchers (see evoformer_launch.h). CUDA layer.
#pragma once

#include "cuda/evoformer/evoformer_bwd_kernels.cuh"
#include "cuda/evoformer/evoformer_fwd_kernel.cuh"
#include "cuda/evoformer/evoformer_launch.h"

namespace sciattn::cuda {

// Launches `kernel` on a 1-D grid with `smem_bytes` of dynamic shared memory, raising the
// kernel's shared-memory limit first when it needs more than the default 48 KiB.
template <typename Kernel>
cudaError_t launch_1d(Kernel kernel, int64_t ctas, int threads, size_t smem_bytes,
                      const EvoformerDeviceParams& p, cudaStream_t stream) {
  if (ctas == 0) return cudaSuccess;
  if (smem_bytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem_bytes));
    if (e != cudaSuccess) return e;
  }
  kernel<<<static_cast<unsigned>(ctas), threads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int kHeadDim>
cudaError_t launch_evoformer_forward(const EvoformerDeviceParams& p, cudaStream_t stream) {
  return launch_1d(evoformer_fwd_kernel<T, kHeadDim>, evoformer_forward_ctas(p),
                   EvoformerFwdTile::kThreads, sizeof(EvoformerFwdSmem<T, kHeadDim>), p, stream);
}

// Shared memory a block may opt into on sm_90 (227 KiB).
constexpr size_t kMaxSmemPerBlock = 227 * 1024;

template <typename T, int kHeadDim>
cudaError_t launch_evoformer_backward(const EvoformerDeviceParams& params, cudaStream_t stream) {
  const size_t smem = sizeof(EvoformerBwdSmem<T, kHeadDim>);
  // The dK/dV kernel keeps each chunk's dbias2 partial in shared memory when it fits; otherwise
  // it accumulates in the workspace directly.
  EvoformerDeviceParams p = params;
  const int64_t q_tiles = (p.len + EvoformerBwdTile::kBlock - 1) / EvoformerBwdTile::kBlock;
  const size_t dbias2_bytes =
      static_cast<size_t>(q_tiles) * EvoformerBwdTile::kBlock * 64 * sizeof(float);
  p.dbias2_in_smem = p.dbias2_partial != nullptr && smem + dbias2_bytes <= kMaxSmemPerBlock;
  cudaError_t e = launch_1d(evoformer_bwd_dkdv_kernel<T, kHeadDim>, evoformer_dkdv_ctas(p),
                            EvoformerBwdTile::kThreads,
                            smem + (p.dbias2_in_smem ? dbias2_bytes : 0), p, stream);
  if (e != cudaSuccess) return e;
  return launch_1d(evoformer_bwd_dq_kernel<T, kHeadDim>, evoformer_dq_ctas(p),
                   EvoformerBwdTile::kThreads, smem, p, stream);
}

}  // namespace sciattn::cuda

// The bodies of the per-instantiation launchers (see evoformer_launch.h). CUDA layer.
#pragma once

#include <type_traits>

#include "cuda/common/kernel_smem_config.h"
#include "cuda/common/overlapped_launch.h"
#include "cuda/evoformer/evoformer_bwd_fused_wgmma_kernel.cuh"
#include "cuda/evoformer/evoformer_bwd_kernels.cuh"
#include "cuda/evoformer/evoformer_bwd_wgmma_kernels.cuh"
#include "cuda/evoformer/evoformer_fwd_kernel.cuh"
#include "cuda/evoformer/evoformer_fwd_wgmma_kernel.cuh"
#include "cuda/evoformer/evoformer_launch.h"

namespace sciattn::cuda {

// Launches `kernel` on a 1-D grid with `smem_bytes` of dynamic shared memory, raising the
// kernel's shared-memory limit first when it needs more than the default 48 KiB. The carveout is
// set to the most shared memory: with the driver's own choice (200 KB) the dK/dV and dQ kernels'
// fourth CTA per SM at head dim 32 (4 x 50.3 KB) did not fit. Overlapped with the kernel before
// it where p.overlap_launches (the kernels start with enter_overlapped_grid()).
template <typename Kernel>
cudaError_t launch_1d(Kernel kernel, int64_t ctas, int threads, size_t smem_bytes,
                      const EvoformerDeviceParams& p, cudaStream_t stream) {
  if (ctas == 0) return cudaSuccess;
  const cudaError_t e =
      configure_kernel_smem(reinterpret_cast<const void*>(kernel), smem_bytes, true);
  if (e != cudaSuccess) return e;
  return launch_overlapped(kernel, dim3(static_cast<unsigned>(ctas)), threads, smem_bytes, stream,
                           p.overlap_launches != 0, 1, p);
}

// Shared memory of the staged bias tiles (`stages` buffers of each bias present) of a kernel
// whose tiles have `rows` rows of bias2.
inline size_t bias_stage_smem(const EvoformerDeviceParams& p, int rows, int stages = 2) {
  return static_cast<size_t>(stages) * static_cast<size_t>(bias_stage_bytes(p.bias2_type, rows) +
                                                           bias_stage_bytes(p.bias1_type, 1));
}

// Whether a launch of `bytes` of shared memory per block fits what the call may use
// (EvoformerDeviceParams::smem_limit; 0: no limit given).
inline bool smem_fits(const EvoformerDeviceParams& p, size_t bytes) {
  return p.smem_limit == 0 || bytes <= static_cast<size_t>(p.smem_limit);
}

// Launches the mma.sync kernel `Kernel<kStages>` with two stages of streamed tiles when their
// shared memory (smem(2)) fits the call's limit, else with one where the head dim has that form
// (kEvoformerOneStage; else two, and configure_kernel_smem's error names the sizes).
template <int kHeadDim, typename KernelOf, typename SmemOf>
cudaError_t launch_staged(const KernelOf& kernel_of, const SmemOf& smem, int64_t ctas, int threads,
                          const EvoformerDeviceParams& p, cudaStream_t stream) {
  if constexpr (kEvoformerOneStage<kHeadDim>) {
    if (!smem_fits(p, smem(2))) {
      return launch_1d(kernel_of(std::integral_constant<int, 1>{}), ctas, threads, smem(1), p,
                       stream);
    }
  }
  return launch_1d(kernel_of(std::integral_constant<int, 2>{}), ctas, threads, smem(2), p, stream);
}

// Head dims 32, 64 and 128 with the host's wgmma_tiles run the forward, dK/dV, dQ and dbias2
// kernels on the warpgroup MMA (evoformer_*_wgmma_kernel*.cuh); the other head dims and layouts
// the mma.sync ones.
template <int kHeadDim>
constexpr bool kEvoformerWgmmaHeadDim = kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128;

template <typename T, int kHeadDim>
cudaError_t launch_evoformer_forward(const EvoformerDeviceParams& p, cudaStream_t stream) {
  if constexpr (kEvoformerWgmmaHeadDim<kHeadDim>) {
    if (p.wgmma_tiles) {
      return with_bias_types<T, true>(p, [&](auto types) {
        return launch_1d(evoformer_fwd_wgmma_kernel<T, kHeadDim, decltype(types)>,
                         evoformer_forward_ctas(p), kWgmmaThreads,
                         evoformer_fwd_wgmma_smem<kHeadDim>(p), p, stream);
      });
    }
  }
  return launch_staged<kHeadDim>(
      [](auto stages) { return evoformer_fwd_kernel<T, kHeadDim, decltype(stages)::value>; },
      [&](int stages) {
        return (stages == 2 ? sizeof(EvoformerFwdSmem<T, kHeadDim, 2>)
                            : sizeof(EvoformerFwdSmem<T, kHeadDim, 1>)) +
               bias_stage_smem(p, EvoformerFwdTile::kBlockM, stages);
      },
      evoformer_forward_ctas(p), EvoformerFwdTile::kThreads, p, stream);
}

// The fused dK/dV/dQ kernel's plan for this call (head dim 32 on the warpgroup path): the host
// plan's (detail::cuda_fused_backward_plan: CTAs per slice, 0 for the separate kernels, and
// query-tile buffers) for the call's shape and bias2 stage.
inline detail::CudaFusedBackwardPlan evoformer_fused_backward_plan(const EvoformerDeviceParams& p) {
  return detail::cuda_fused_backward_plan({p.batch, p.n, p.len, p.heads, p.dim},
                                          bias_stage_bytes(p.bias2_type, kWgmmaRows));
}

// Launches `kernel` as `pairs` clusters of two CTAs (1-D), with `smem_bytes` of dynamic shared
// memory each (overlapped as launch_1d's).
template <typename Kernel>
cudaError_t launch_cluster_pairs(Kernel kernel, int64_t pairs, size_t smem,
                                 const EvoformerDeviceParams& p, cudaStream_t stream) {
  const cudaError_t e = configure_kernel_smem(reinterpret_cast<const void*>(kernel), smem, true);
  if (e != cudaSuccess) return e;
  return launch_overlapped(kernel, dim3(static_cast<unsigned>(2 * pairs)), kWgmmaThreads, smem,
                           stream, p.overlap_launches != 0, 2, p);
}

// Launches the fused kernel as planned: a plain launch for one CTA per slice (two or three
// query-tile buffers), clusters of two for two.
template <typename T, int kHeadDim>
cudaError_t launch_evoformer_backward_fused(const EvoformerDeviceParams& p,
                                            const detail::CudaFusedBackwardPlan& plan,
                                            cudaStream_t stream) {
  const int64_t tiles = (p.len + kWgmmaRows - 1) / kWgmmaRows;
  const int64_t slices = p.batch * p.n * p.heads;
  const size_t smem = static_cast<size_t>(detail::cuda_fused_backward_smem(
      tiles, plan.ranks, plan.stages, bias_stage_bytes(p.bias2_type, kWgmmaRows)));
  return with_bias_types<T>(p, [&](auto types) {
    using BiasTypes = decltype(types);
    if (plan.ranks == 2) {
      return launch_cluster_pairs(evoformer_bwd_fused_wgmma_kernel<T, kHeadDim, 2, BiasTypes, 2>,
                                  slices, smem, p, stream);
    }
    if (plan.stages == 3) {
      return launch_1d(evoformer_bwd_fused_wgmma_kernel<T, kHeadDim, 1, BiasTypes, 3>, slices,
                       kWgmmaThreads, smem, p, stream);
    }
    return launch_1d(evoformer_bwd_fused_wgmma_kernel<T, kHeadDim, 1, BiasTypes, 2>, slices,
                     kWgmmaThreads, smem, p, stream);
  });
}

// The warpgroup backward: at head dim 32 where evoformer_fused_backward_plan picks the fused
// kernel, the fused dK/dV/dQ kernel (one or two CTAs per (b, n, h) slice); else dQ first, then
// dK/dV. Where p.delta_from_out_tiles the fused kernel or dQ computes delta from its dO and O
// tiles and writes it for the kernels after it; else the delta kernel runs first.
// Then dbias2 when asked for.
template <typename T, int kHeadDim>
cudaError_t launch_evoformer_backward_wgmma(const EvoformerDeviceParams& p, cudaStream_t stream) {
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  const size_t bias_smem = bias_stage_smem(p, EvoformerBwdTile::kBlock);
  cudaError_t e = cudaSuccess;
  bool fused = false;
  if constexpr (kHeadDim == 32) {
    const detail::CudaFusedBackwardPlan plan = evoformer_fused_backward_plan(p);
    if (plan.ranks > 0) {
      fused = true;
      if (!p.delta_from_out_tiles) {
        e = launch_evoformer_backward_delta<T>(p, stream);
        if (e != cudaSuccess) return e;
      }
      e = launch_evoformer_backward_fused<T, kHeadDim>(p, plan, stream);
    }
  }
  if (!fused) {
    if (!p.delta_from_out_tiles) {
      e = launch_evoformer_backward_delta<T>(p, stream);
      if (e != cudaSuccess) return e;
    }
    const size_t smem = Smem::kBwdBytes + 1024 + bias_smem;
    e = with_bias_types<T>(p, [&](auto types) {
      return launch_1d(evoformer_bwd_dq_wgmma_kernel<T, kHeadDim, decltype(types)>,
                       evoformer_dq_ctas(p), kWgmmaThreads, smem, p, stream);
    });
    if (e != cudaSuccess) return e;
    e = with_bias_types<T>(p, [&](auto types) {
      return launch_1d(evoformer_bwd_dkdv_wgmma_kernel<T, kHeadDim, decltype(types)>,
                       evoformer_dkdv_ctas(p), kWgmmaThreads, smem, p, stream);
    });
  }
  if (e != cudaSuccess || p.dbias2 == nullptr) return e;
  return with_bias_types<T>(p, [&](auto types) {
    return launch_1d(evoformer_bwd_dbias2_wgmma_kernel<T, kHeadDim, decltype(types)>,
                     evoformer_dbias2_ctas(p), kWgmmaThreads * Smem::kDbias2Groups,
                     Smem::kDbias2Bytes + 1024, p, stream);
  });
}

// The backward: the warpgroup kernels where the host chose them (wgmma_tiles), else delta, then
// the mma.sync dK/dV, dQ and (when asked for) dbias2 kernels.
template <typename T, int kHeadDim>
cudaError_t launch_evoformer_backward(const EvoformerDeviceParams& p, cudaStream_t stream) {
  if constexpr (kEvoformerWgmmaHeadDim<kHeadDim>) {
    if (p.wgmma_tiles) return launch_evoformer_backward_wgmma<T, kHeadDim>(p, stream);
  }
  cudaError_t e = launch_evoformer_backward_delta<T>(p, stream);
  if (e != cudaSuccess) return e;
  const auto smem = [&](int stages) {
    return (stages == 2 ? sizeof(EvoformerBwdSmem<T, kHeadDim, 2>)
                        : sizeof(EvoformerBwdSmem<T, kHeadDim, 1>)) +
           bias_stage_smem(p, EvoformerBwdTile::kBlock, stages);
  };
  e = launch_staged<kHeadDim>(
      [](auto stages) { return evoformer_bwd_dkdv_kernel<T, kHeadDim, decltype(stages)::value>; },
      smem, evoformer_dkdv_ctas(p), EvoformerBwdTile::kThreads, p, stream);
  if (e != cudaSuccess) return e;
  e = launch_staged<kHeadDim>(
      [](auto stages) { return evoformer_bwd_dq_kernel<T, kHeadDim, decltype(stages)::value>; },
      smem, evoformer_dq_ctas(p), EvoformerBwdTile::kThreads, p, stream);
  if (e != cudaSuccess || p.dbias2 == nullptr) return e;
  return launch_staged<kHeadDim>(
      [](auto stages) { return evoformer_bwd_dbias2_kernel<T, kHeadDim, decltype(stages)::value>; },
      [](int stages) {
        return stages == 2 ? sizeof(EvoformerDbias2Smem<T, kHeadDim, 2>)
                           : sizeof(EvoformerDbias2Smem<T, kHeadDim, 1>);
      },
      evoformer_dbias2_ctas(p), EvoformerDbias2Tile<kHeadDim>::kThreads, p, stream);
}

}  // namespace sciattn::cuda

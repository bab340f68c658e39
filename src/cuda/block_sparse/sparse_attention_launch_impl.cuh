// The bodies of the per-instantiation launchers of the fused block-sparse attention (see
// sparse_attention_launch.h). CUDA layer.
#pragma once

#include <type_traits>

#include "cuda/block_sparse/sparse_attention_bwd_kernels.cuh"
#include "cuda/block_sparse/sparse_attention_bwd_wgmma_kernels.cuh"
#include "cuda/block_sparse/sparse_attention_causal_dkdv_wgmma_kernel.cuh"
#include "cuda/block_sparse/sparse_attention_causal_dq_wgmma_kernel.cuh"
#include "cuda/block_sparse/sparse_attention_causal_fwd_wgmma_kernel.cuh"
#include "cuda/block_sparse/sparse_attention_fwd_kernel.cuh"
#include "cuda/block_sparse/sparse_attention_fwd_wgmma_kernel.cuh"
#include "cuda/block_sparse/sparse_attention_launch.h"
#include "cuda/common/kernel_smem_config.h"

namespace sciattn::cuda {

// Launches `kernel` on a 1-D grid of `ctas` CTAs of `threads` threads with `smem_bytes` of dynamic
// shared memory, raising the kernel's limit first when it needs more than the default 48 KiB.
template <typename Kernel, typename... Args>
cudaError_t launch_sparse_grid(Kernel kernel, int64_t ctas, unsigned threads, size_t smem_bytes,
                               cudaStream_t stream, const Args&... args) {
  if (ctas == 0) return cudaSuccess;
  const cudaError_t e =
      configure_kernel_smem(reinterpret_cast<const void*>(kernel), smem_bytes, false);
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(ctas), threads, smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

// The same with SparseTile::kThreads threads per CTA (every kernel but the dense causal ones).
template <typename Kernel, typename... Args>
cudaError_t launch_sparse_1d(Kernel kernel, int64_t ctas, size_t smem_bytes, cudaStream_t stream,
                             const Args&... args) {
  return launch_sparse_grid(kernel, ctas, SparseTile::kThreads, smem_bytes, stream, args...);
}

// Whether a forward and a backward run as dense causal attention
// (sparse_attention_causal_*_wgmma_kernel.cuh):
// the warpgroup kernels' tiles, the causal rule over a layout holding every block at or below the
// diagonal, no score terms, and a positive finite scale (the kernel takes the raw scores' maxima).
inline bool runs_causal_dense(const SparseAttentionDeviceParams& p) {
  return p.wgmma_tiles && p.causal && !p.has_terms && p.tiles.lower_complete && p.scale > 0.0f &&
         p.scale <= 3.0e38f;
}

// The fused kernels come in two instantiations: packed entries (layout blocks of 16 or 32, rows
// gathered slot by slot) and whole-tile entries (blocks of 64 and more; EntrySlots). Where the
// host's wgmma_tiles holds (16-bit aligned tensors of head dim 64 or 128, L a multiple of 64)
// both run on the warpgroup-MMA kernels, elsewhere on the mma.sync ones.
template <typename T, int kHeadDim>
cudaError_t launch_sparse_attention_forward(const SparseAttentionDeviceParams& p,
                                            cudaStream_t stream) {
  const int64_t ctas = p.batch * p.tiles.head_repeat * p.tiles.rows.pieces;
  cudaError_t e = cudaSuccess;
  bool launched = false;
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    if (runs_causal_dense(p)) {
      return launch_sparse_grid(sparse_attention_causal_fwd_wgmma_kernel<T, kHeadDim>,
                                sparse_causal_ctas(p.batch, p.heads, p.len), kCausalThreads,
                                SparseCausalFwdSmem<kHeadDim>::kLaunchBytes, stream, p);
    }
    if (p.wgmma_tiles) {
      const auto kernel = p.tiles.sub > 1 ? sparse_attention_fwd_wgmma_kernel<T, kHeadDim, true>
                                          : sparse_attention_fwd_wgmma_kernel<T, kHeadDim, false>;
      e = launch_sparse_1d(kernel, ctas, SparseFwdWgmmaSmem<T, kHeadDim>::kLaunchBytes, stream, p);
      launched = true;
    }
  }
  if (!launched) {
    const auto kernel = p.tiles.sub > 1 ? sparse_attention_fwd_kernel<T, kHeadDim, true>
                                        : sparse_attention_fwd_kernel<T, kHeadDim, false>;
    e = launch_sparse_1d(kernel, ctas, sizeof(SparseFwdSmem<T, kHeadDim>), stream, p);
  }
  if (e != cudaSuccess || p.tiles.rows.num_split_lines == 0) return e;
  return launch_sparse_1d(sparse_attention_fwd_combine_kernel<T, kHeadDim>,
                          p.batch * p.tiles.head_repeat * p.tiles.rows.num_split_lines *
                              SplitLineChunk<kHeadDim>::kCtasPerLine,
                          0, stream, p);
}

template <typename T, int kHeadDim>
cudaError_t launch_sparse_attention_backward(const SparseAttentionDeviceParams& p,
                                             cudaStream_t stream) {
  const int64_t dkdv_ctas = p.batch * p.tiles.head_repeat * p.tiles.cols.pieces;
  const int64_t dq_ctas = p.batch * p.tiles.head_repeat * p.tiles.rows.pieces;
  cudaError_t e = cudaSuccess;
  bool launched = false;
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    // Dense causal attention: dK / dV and dQ from their own kernels, whole lines (no partials).
    if (runs_causal_dense(p)) {
      const int64_t ctas = sparse_causal_ctas(p.batch, p.heads, p.len);
      e = launch_sparse_grid(sparse_attention_causal_dkdv_wgmma_kernel<T, kHeadDim>, ctas,
                             kCausalThreads, SparseCausalDkdvSmem<kHeadDim>::kLaunchBytes, stream,
                             p);
      if (e != cudaSuccess) return e;
      return launch_sparse_grid(sparse_attention_causal_dq_wgmma_kernel<T, kHeadDim>, ctas,
                                kCausalThreads, SparseCausalDqSmem<kHeadDim>::kLaunchBytes, stream,
                                p);
    }
    if (p.wgmma_tiles) {
      const size_t smem = SparseBwdWgmmaSmem<kHeadDim>::kLaunchBytes;
      const bool packed = p.tiles.sub > 1;
      e = launch_sparse_1d(packed ? sparse_attention_dkdv_wgmma_kernel<T, kHeadDim, true>
                                  : sparse_attention_dkdv_wgmma_kernel<T, kHeadDim, false>,
                           dkdv_ctas, smem, stream, p);
      if (e != cudaSuccess) return e;
      e = launch_sparse_1d(packed ? sparse_attention_dq_wgmma_kernel<T, kHeadDim, true>
                                  : sparse_attention_dq_wgmma_kernel<T, kHeadDim, false>,
                           dq_ctas, smem, stream, p);
      if (e != cudaSuccess) return e;
      launched = true;
    }
  }
  if (!launched) {
    // Two stages of streamed tiles where they fit the call's shared memory (smem_limit, 0: not
    // given), else one where the head dim has that form (kSparseOneStage).
    const auto mma_sync = [&](auto stages) {
      constexpr int kStages = decltype(stages)::value;
      const size_t smem = sizeof(SparseBwdSmem<T, kHeadDim, kStages>);
      const bool packed = p.tiles.sub > 1;
      cudaError_t err =
          launch_sparse_1d(packed ? sparse_attention_dkdv_kernel<T, kHeadDim, true, kStages>
                                  : sparse_attention_dkdv_kernel<T, kHeadDim, false, kStages>,
                           dkdv_ctas, smem, stream, p);
      if (err != cudaSuccess) return err;
      return launch_sparse_1d(packed ? sparse_attention_dq_kernel<T, kHeadDim, true, kStages>
                                     : sparse_attention_dq_kernel<T, kHeadDim, false, kStages>,
                              dq_ctas, smem, stream, p);
    };
    bool one_stage = false;
    if constexpr (kSparseOneStage<kHeadDim>) {
      one_stage = p.smem_limit > 0 &&
                  sizeof(SparseBwdSmem<T, kHeadDim, 2>) > static_cast<size_t>(p.smem_limit);
      if (one_stage) e = mma_sync(std::integral_constant<int, 1>{});
    }
    if (!one_stage) e = mma_sync(std::integral_constant<int, 2>{});
    if (e != cudaSuccess) return e;
  }
  // The split lines' partials, added in piece order (each kernel reads what the kernels above
  // wrote on the same stream).
  auto sum = [&](const BlockSparseDeviceIndex::TileWork& work, const float* partial, void* out,
                 const int64_t stride[4]) {
    if (work.num_split_lines == 0) return cudaSuccess;
    SparseSumTarget target{partial, out, {stride[0], stride[1], stride[2], stride[3]}};
    return launch_sparse_1d(sparse_attention_sum_kernel<T, kHeadDim>,
                            p.batch * p.tiles.head_repeat * work.num_split_lines *
                                SplitLineChunk<kHeadDim>::kCtasPerLine,
                            0, stream, p, work, target);
  };
  e = sum(p.tiles.cols, p.dk_partial, p.dk, p.dk_stride);
  if (e != cudaSuccess) return e;
  e = sum(p.tiles.cols, p.dv_partial, p.dv, p.dv_stride);
  if (e != cudaSuccess) return e;
  return sum(p.tiles.rows, p.dq_partial, p.dq, p.dq_stride);
}

}  // namespace sciattn::cuda

// What the Evoformer kernels on Hopper's warpgroup MMA (evoformer_fwd_wgmma_kernel.cuh,
// evoformer_bwd_wgmma_kernels.cuh) share: their shared-memory layout and the copy of 64 rows of a
// [B, N, L, H, D] slice into a swizzled tile. CUDA layer.
#pragma once

#include <cstdint>

#include "cuda/evoformer/evoformer_device_utils.cuh"
#include "cuda/wgmma_tiles.cuh"

namespace sciattn::cuda {

// The swizzled tiles of the CTA, each on a 1024-byte boundary from the aligned base: the forward's
// Q, K[2], V[2]; the dK/dV and dQ kernels' fixed tiles A, B (dK/dV: K, V; dQ: Q, dO) and streamed
// tiles C[2], D[2] (dK/dV: Q, dO; dQ: K, V), then the streamed query rows' lse[2][64] and
// delta[2][64] (dK/dV; the dQ kernel keeps its rows' delta in the first 64). The bias stages
// (evoformer_device_utils.cuh) follow at kFwdBytes or kBwdBytes; a launch asks for 1024 bytes more
// for the base's rounding.
template <int kHeadDim>
struct EvoformerWgmmaSmem {
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128,
                "swizzled rows (cuda/wgmma.cuh): head dim 32, 64 or 128");
  static constexpr uint32_t kTileBytes = kWgmmaRows * kHeadDim * 2;
  static constexpr uint32_t kQ = 0, kK = kTileBytes, kV = 3 * kTileBytes;
  static constexpr uint32_t kFwdBytes = 5 * kTileBytes;
  static constexpr uint32_t kA = 0, kB = kTileBytes, kC = 2 * kTileBytes, kD = 4 * kTileBytes;
  static constexpr uint32_t kStats = 6 * kTileBytes;
  static constexpr uint32_t kBwdBytes = kStats + 4 * kWgmmaRows * sizeof(float);
  // The dbias2 kernel (kDbias2Groups warpgroups of 64 query rows over one 64-key block): per
  // stage, each warpgroup's Q and dO tiles, then K and V (tile x of stage st at
  // (kDbias2Tiles st + x) kTileBytes: Q of group w at x = w, dO at kDbias2Groups + w, K and V
  // after), then lse[stages][rows], delta[stages][rows], bias1_log2[2][64] and (head dim 32) the
  // bias2 cells. Three stages at
  // head dims 32 (72 KB: two CTAs per SM) and 64 (144 KB), two at 128 (128 KB): one CTA per SM.
  static constexpr int kDbias2Groups = kHeadDim <= 64 ? 2 : 1;
  static constexpr int kDbias2Rows = kDbias2Groups * kWgmmaRows;
  static constexpr int kDbias2Tiles = 2 * kDbias2Groups + 2;
  static constexpr int kDbias2Stages = kHeadDim <= 64 ? 3 : 2;
  static constexpr uint32_t kDbias2Stats = kDbias2Stages * kDbias2Tiles * kTileBytes;
  // With two CTAs per SM (head dim 32: 128 registers a thread) each thread's 32 cells of bias2
  // wait in shared memory ([j][e][thread] fp32, 32 KB) instead of registers.
  static constexpr bool kDbias2CellsInRegisters = kHeadDim > 32;
  static constexpr uint32_t kDbias2Cells =
      kDbias2Stats + (2 * kDbias2Stages * kDbias2Rows + 2 * kWgmmaRows) * sizeof(float);
  static constexpr uint32_t kDbias2Bytes =
      kDbias2Cells +
      (kDbias2CellsInRegisters ? 0 : 32 * kDbias2Groups * kWgmmaThreads * sizeof(float));
};

// Rows [row0, row0 + 64) of a slice (the host's wgmma_tiles: 16-byte aligned rows of exactly
// kHeadDim elements, offsets below 2^31) into the swizzled tile at `tile`; rows at or past L are
// zero-filled. `thread`: as copy_tile_swizzled's.
template <typename T, int kHeadDim>
__device__ __forceinline__ void copy_slice_swizzled(uint32_t tile, const SliceSource& src,
                                                    int64_t row0, int64_t len,
                                                    int thread = static_cast<int>(threadIdx.x)) {
  const int32_t row_bytes = static_cast<int32_t>(src.row_stride * static_cast<int64_t>(sizeof(T)));
  copy_tile_swizzled<kHeadDim>(tile, static_cast<const char*>(src.base) + row0 * row_bytes,
                               row_bytes, len - row0, thread);
}

}  // namespace sciattn::cuda

// The two tile products the mma.sync attention kernels are made of, on a warp's 16 rows: S-like
// (A B^T against 64 rows of a shared tile) and O-like (X B, X the fp32 accumulators of an S-like
// product rounded to T), with the block-sparse kernels' optional skipping of 16-column groups.
// CUDA layer, shared by the kernel families.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/device_utils.cuh"

namespace sciattn::cuda {

// A fragment (16 rows x kHeadDim) of a shared tile, for use as the MMA's A operand.
template <typename T, int kSteps, int kPitch>
__device__ __forceinline__ void load_a_frags(uint32_t frag[kSteps][4], const T* tile, int g,
                                             int t) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) load_a_frag<T, kPitch>(frag[s], tile, s, g, t);
}

// The block-sparse kernels skip the pairs of n8 tiles (16-column sub-blocks) that a warp does
// not need, by a warp-uniform mask `keep` (bit j, j even, for the pair j, j + 1; 0xFF = all). A
// test inside an unrolled MMA loop costs a branch and a WARPSYNC (mma.sync and ldmatrix are
// warp-collective) and splits the loop the compiler would otherwise schedule as one block: ~290
// extra instructions in the D = 128 forward's S loop and 24% of its time. So such loops come twice,
// and a tile whose pairs are all kept (every tile when the layout blocks are 64 or larger) takes
// the copy without tests. kSplit = false keeps one copy, with the tests (for kernels at a register
// cap, where the second copy's schedule spills).
template <bool kSplit = true, typename Fn>
__device__ __forceinline__ void with_kept_pairs(uint32_t keep, const Fn& fn) {
  if (kSplit && keep == 0xFFu) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}
// Whether bit `bit` of `keep` is set, known true at compile time in with_kept_pairs' first copy.
template <typename AllKept>
__device__ __forceinline__ bool pair_kept(AllKept, uint32_t keep, int bit) {
  return AllKept::value || ((keep >> bit) & 1u) != 0;
}

// acc[j] (16 x 8, j = 0..7) = A (16 x kHeadDim, fragments) * rows^T, rows = 64 rows of `tile`.
// Pairs of n8 tiles whose bit (of j, j even) is clear in `keep` are left at 0.
template <typename T, int kSteps, int kPitch, bool kSplit = true>
__device__ __forceinline__ void mma_rows_t(float acc[8][4], const uint32_t a[kSteps][4],
                                           const T* tile, int g, int t, uint32_t keep = 0xFF) {
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  with_kept_pairs<kSplit>(keep, [&](auto all) {
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      if (!pair_kept(all, keep, j)) continue;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint32_t bf[2][2];
        load_b_frags_of_rows<T, kPitch>(bf, tile, j, s, g, t);
        mma_16816<T>(acc[j], a[s], bf[0]);
        mma_16816<T>(acc[j + 1], a[s], bf[1]);
      }
    }
  });
}

// out[i] (16 x kHeadDim) += X (16 x 64, given as fp32 accumulators of eight n8 tiles) * tile,
// tile = 64 rows x kHeadDim in shared memory. X is rounded to T for the tensor cores. k-steps kk
// whose bit 2 kk is clear in `keep` are skipped (X is zero there).
template <typename T, int kOutTiles, int kPitch, bool kSplit = true>
__device__ __forceinline__ void mma_acc_tile(float out[kOutTiles][4], const float x[8][4],
                                             const T* tile, int g, int t, uint32_t keep = 0xFF) {
  with_kept_pairs<kSplit>(keep, [&](auto all) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (!pair_kept(all, keep, 2 * kk)) continue;
      const uint32_t a[4] = {ElementTraits<T>::pack(x[2 * kk][0], x[2 * kk][1]),
                             ElementTraits<T>::pack(x[2 * kk][2], x[2 * kk][3]),
                             ElementTraits<T>::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                             ElementTraits<T>::pack(x[2 * kk + 1][2], x[2 * kk + 1][3])};
      mma_acc_k_major<T, kOutTiles, kPitch>(out, a, tile, kk, g, t);
    }
  });
}

}  // namespace sciattn::cuda

// What the block-sparse warpgroup-MMA kernels (sparse_attention_fwd_wgmma_kernel.cuh,
// sparse_attention_bwd_wgmma_kernels.cuh) need to walk list entries of either kind
// (EntrySlots): a slice of aligned rows, the copy of an entry's 64 rows into a swizzled tile
// (one contiguous slice for blocks of 64 and more, gathered slot by slot for packed blocks of 16
// and 32), and the zeroing of probabilities outside a warp's kept column groups, which the
// warpgroup products cannot skip the way the mma.sync kernels' per-warp products do. CUDA layer.
#pragma once

#include "cuda/block_sparse/sparse_attention_device.cuh"
#include "cuda/wgmma_tiles.cuh"

namespace sciattn::cuda {

// The (b, h) slice of a [B, H, L, D] tensor as a byte base and a 32-bit row step (whole tiles of
// aligned rows, the host's wgmma_tiles).
struct RowSlice {
  const char* base;
  int32_t row_bytes;
  __device__ __forceinline__ const char* row(int64_t r) const { return base + r * row_bytes; }
};
template <typename T>
__device__ __forceinline__ RowSlice row_slice(const void* data, const int64_t stride[4], int64_t b,
                                              int64_t h) {
  return {static_cast<const char*>(data) + (b * stride[0] + h * stride[1]) * sizeof(T),
          static_cast<int32_t>(stride[2] * sizeof(T))};
}

// Starts cp.async copies of a list entry's 64 rows (row r: slots.token(entry, r)) of two slices
// (K and V, or Q and dO) into the swizzled tiles at shared addresses tile_a and tile_b. An
// unpacked entry is one contiguous 64-row slice of each (copy_tile_swizzled); a packed one is
// gathered with copy_tile_swizzled's split of the chunks (thread x: chunk column x % (kHeadDim /
// 8) of every (128 / (kHeadDim / 8))-th row), each row's source found through its slot once for
// both slices, and the rows of an empty slot zero-filled (nothing is read for them). The host's
// wgmma_tiles (L a multiple of 64) puts every token of a used slot inside L.
template <int kHeadDim, bool kPacked>
__device__ __forceinline__ void copy_entry_swizzled(uint32_t tile_a, const RowSlice& a,
                                                    uint32_t tile_b, const RowSlice& b,
                                                    const EntrySlots<kPacked>& slots,
                                                    const int32_t* entry) {
  if constexpr (!kPacked) {
    const int64_t row0 = slots.token(entry, 0);
    copy_tile_swizzled<kHeadDim>(tile_a, a.row(row0), a.row_bytes);
    copy_tile_swizzled<kHeadDim>(tile_b, b.row(row0), b.row_bytes);
  } else {
    constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
    constexpr int kWidth = kSwizzleBytes<kHeadDim>;
    static_assert(kRowStep % 8 == 0, "a thread's rows must share their swizzle");
    const int c = static_cast<int>(threadIdx.x) % kChunks,
              r0 = static_cast<int>(threadIdx.x) / kChunks;
    const uint32_t dst = swizzled_chunk_offset<kWgmmaRows, kWidth>(r0, c);
#pragma unroll
    for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
      const int64_t token = slots.token(entry, r0 + i * kRowStep);
      const bool used = token >= 0;
      const int bytes = used ? 16 : 0;
      const uint32_t to = dst + i * kRowStep * kWidth;
      cp_async_16_to(tile_a + to, used ? a.row(token) + c * 16 : a.base, bytes);
      cp_async_16_to(tile_b + to, used ? b.row(token) + c * 16 : b.base, bytes);
    }
  }
}

// Zeroes the n8 column tiles of a warp's 16 x 64 probabilities (or dS) that lie outside `keep`
// (warp_column_groups): in a plain packed entry the score code leaves values there that the
// mma.sync kernels' products skip, but a warpgroup product reads every column. keep is the same
// for the whole warp; 0xFF (every group) costs one test.
__device__ __forceinline__ void zero_outside_keep(float (&x)[SparseTile::kSize / 8][4],
                                                  uint32_t keep) {
  if (keep == 0xFFu) return;
#pragma unroll
  for (int j = 0; j < SparseTile::kSize / 8; ++j) {
    const bool kept = (keep >> j) & 1u;
#pragma unroll
    for (int v = 0; v < 4; ++v) x[j][v] = kept ? x[j][v] : 0.0f;
  }
}

}  // namespace sciattn::cuda

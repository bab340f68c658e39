// What the block-sparse warpgroup-MMA kernels (sparse_attention_fwd_wgmma_kernel.cuh,
// sparse_attention_bwd_wgmma_kernels.cuh) need to walk list entries of either kind
// (EntrySlots): a slice of aligned rows, the copy of an entry's 64 rows into a swizzled tile
// (one contiguous slice for blocks of 64 and more, gathered slot by slot for packed blocks of 16
// and 32), and the zeroing of probabilities outside a warp's kept column groups, which the
// warpgroup products cannot skip the way the mma.sync kernels' per-warp products do. CUDA layer.
#pragma once

#include "cuda/block_sparse/sparse_attention_device.cuh"
#include "cuda/common/wgmma_tiles.cuh"

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

// One thread's share of copying list entries' 64 rows (row r: slots.token(entry, r)) of two
// slices (K and V, or Q and dO) into swizzled tiles, worked out once per CTA. An unpacked entry
// is one contiguous 64-row slice of each (copy_tile_swizzled). A packed one is gathered with
// copy_tile_swizzled's split of the chunks (thread x: chunk column c = x % (kHeadDim / 8) of rows
// r0 + i * kRowStep, r0 = x / (kHeadDim / 8) < kRowStep); since a unit (a layout block of 16 or
// 32 rows) is a whole number of kRowStep-row steps, row i's slot (i * kRowStep) >> shift and its
// step inside the unit do not depend on the thread, so a row's source is this thread's chunk of
// unit 0 plus the slot's unit times the unit's bytes plus the step's bytes: one slot load and
// one multiply-add per row, shared by both slices. Rows of an empty slot (-1) are zero-filled
// (nothing is read; the address is unit 0's). The host's wgmma_tiles (lean tiles: 64 rows' bytes
// fit 31 bits; L a multiple of 64) keeps the 32-bit unit and step sizes exact and puts every
// token of a used slot inside L.
template <int kHeadDim, bool kPacked>
struct EntryRowCopier {
  static constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
  static constexpr int kCopies = kWgmmaRows / kRowStep;
  static constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  static constexpr int kStepShift = kRowStep == 16 ? 4 : 3;
  static_assert(kRowStep == 1 << kStepShift && kRowStep <= 16,
                "a unit of 16 or 32 rows is whole row steps");
  RowSlice a, b;                  // unpacked: the slices
  const char *a_chunk, *b_chunk;  // packed: this thread's chunk of row r0 of unit 0
  int32_t a_unit, b_unit;         // bytes from one unit to the next (row bytes * 2^shift)
  int32_t a_step, b_step;         // bytes of kRowStep rows
  uint32_t dst;                   // this thread's first chunk in a tile
  int shift;                      // log2 of the unit's rows

  __device__ __forceinline__ EntryRowCopier(const RowSlice& slice_a, const RowSlice& slice_b,
                                            int unit_shift)
      : a(slice_a), b(slice_b), shift(unit_shift) {
    if constexpr (kPacked) {
      const int c = static_cast<int>(threadIdx.x) % kChunks,
                r0 = static_cast<int>(threadIdx.x) / kChunks;
      a_chunk = slice_a.base + (r0 * slice_a.row_bytes + c * 16);
      b_chunk = slice_b.base + (r0 * slice_b.row_bytes + c * 16);
      a_unit = slice_a.row_bytes * (1 << unit_shift);
      b_unit = slice_b.row_bytes * (1 << unit_shift);
      a_step = slice_a.row_bytes * kRowStep;
      b_step = slice_b.row_bytes * kRowStep;
      dst = swizzled_chunk_offset<kWgmmaRows, kWidth>(r0, c);
    }
  }

  // Starts the copies of the entry's rows into the tiles at shared addresses tile_a, tile_b (with
  // kBoth false, of the first slice into tile_a alone: the forward's Q of a packed tile row).
  template <bool kBoth = true>
  __device__ __forceinline__ void copy(uint32_t tile_a, uint32_t tile_b,
                                       const EntrySlots<kPacked>& slots,
                                       const int32_t* entry) const {
    if constexpr (!kPacked) {
      const int64_t row0 = slots.token(entry, 0);
      copy_tile_swizzled<kHeadDim>(tile_a, a.row(row0), a.row_bytes);
      if constexpr (kBoth) copy_tile_swizzled<kHeadDim>(tile_b, b.row(row0), b.row_bytes);
    } else {
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int slot = (i * kRowStep) >> shift;
        const int step = ((i * kRowStep) >> kStepShift) - (slot << (shift - kStepShift));
        const int32_t unit = entry[slot];
        const bool used = unit >= 0;
        const int64_t u = used ? unit : 0;
        const uint32_t to = dst + i * kRowStep * kWidth;
        cp_async_16_to(tile_a + to, a_chunk + (u * a_unit + step * a_step), used ? 16 : 0);
        if constexpr (kBoth) {
          cp_async_16_to(tile_b + to, b_chunk + (u * b_unit + step * b_step), used ? 16 : 0);
        }
      }
    }
  }
};

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

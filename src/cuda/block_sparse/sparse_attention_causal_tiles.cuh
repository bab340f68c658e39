// What the dense causal kernels of the fused sparse attention share
// (sparse_attention_causal_*_wgmma_kernel.cuh): the forward and the dQ kernel take 128 queries per
// CTA of two warpgroups, one 64-row tile each, walking the key tiles from 0 to its diagonal (K
// and V stream through kStages shared buffers, warpgroup 0 copying K and warpgroup 1 V); the dK /
// dV kernel takes 128 keys and walks the query tiles from its diagonal on; the longest lines are
// launched first. Run where the layout holds every block at or below the diagonal under the causal
// rule with no score terms (runs_causal_dense in sparse_attention_launch_impl.cuh), on Hopper's
// warpgroup MMA. CUDA layer.
#pragma once

#include "cuda/block_sparse/sparse_attention_params.h"
#include "cuda/block_sparse/sparse_attention_wgmma_entries.cuh"
#include "cuda/common/device_utils.cuh"
#include "cuda/common/wgmma_tiles.cuh"

namespace sciattn::cuda {

// Two warpgroups, 64 query rows each.
constexpr int kCausalWarpgroups = 2;
constexpr int kCausalThreads = kCausalWarpgroups * kWgmmaThreads;
constexpr int kCausalQueries = kCausalWarpgroups * kWgmmaRows;

// CTAs of a launch: one per (128-query tile, batch, head).
inline int64_t sparse_causal_ctas(int64_t batch, int64_t heads, int64_t len) {
  return batch * heads * ((len + kCausalQueries - 1) / kCausalQueries);
}

// The calling thread in its CTA of two warpgroups, and the diagonal tile's mask, which keeps the
// elements of an m64 x 64 accumulator (rows 16 warp + g, + 8; columns 8 n8 + 2 t, + 1) whose
// column c and row r satisfy kKeep(c, r).
struct CausalThread {
  int wg;          // warpgroup (0, 1), known warp-uniform (warpgroup_index)
  int thread;      // in the warpgroup
  int warp, g, t;  // warp in the warpgroup; lane / 4, lane % 4 (the fragments' row and column)

  __device__ __forceinline__ CausalThread()
      : wg(warpgroup_index()),
        thread(static_cast<int>(threadIdx.x) % kWgmmaThreads),
        warp(thread / 32),
        g((thread % 32) / 4),
        t(thread % 4) {}

  template <typename Keep>
  __device__ __forceinline__ void mask(float (&s)[8][4], const Keep& keep) const {
#pragma unroll
    for (int n8 = 0; n8 < 8; ++n8)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int r = warp * 16 + g + 8 * (x >> 1), c = n8 * 8 + 2 * t + (x & 1);
        if (!keep(c, r)) s[n8][x] = kNegInf;
      }
  }
};

// This thread's place: its CTA's (batch, head) and query tile, its warpgroup's rows and key tiles.
struct CausalRows : CausalThread {
  int64_t b, h;
  int64_t first_row;  // this warpgroup's first query
  int walk;           // key tiles the CTA walks (both warpgroups take part in every barrier)
  int mine;           // key tiles of this warpgroup: through its diagonal tile; 0 past L

  __device__ __forceinline__ explicit CausalRows(const SparseAttentionDeviceParams& p) {
    // CTA x: query tile (longest first), then (batch, head).
    const int64_t slices = p.batch * p.heads;
    const int64_t query_tiles = (p.len + kCausalQueries - 1) / kCausalQueries;
    const int64_t qt = query_tiles - 1 - static_cast<int64_t>(blockIdx.x) / slices;
    const int64_t slice = static_cast<int64_t>(blockIdx.x) % slices;
    b = slice / p.heads;
    h = slice % p.heads;
    first_row = qt * kCausalQueries + wg * kWgmmaRows;
    // L is a multiple of 64, so the last query tile may hold one warpgroup's rows.
    const int64_t key_tiles = p.len / kWgmmaRows;
    walk = static_cast<int>(2 * qt + 2 < key_tiles ? 2 * qt + 2 : key_tiles);
    mine = first_row < p.len ? static_cast<int>(2 * qt) + wg + 1 : 0;
  }

  // This thread's two query rows (an m64 accumulator's rows warp * 16 + g and + 8).
  __device__ __forceinline__ int64_t row(int r) const { return first_row + warp * 16 + g + 8 * r; }

  // Removes the keys past each query in the diagonal tile (key tile mine - 1, which starts at
  // this warpgroup's first query): key c of the tile lies past query r when c > r.
  __device__ __forceinline__ void mask_diagonal(float (&s)[8][4]) const {
    mask(s, [](int c, int r) { return c <= r; });
  }
};

// kStages K tiles then kStages V tiles from shared address `base`, each a swizzled 64-row tile on
// a 1024-byte boundary; a key tile j occupies buffer j % kStages of both.
template <int kHeadDim, int kStages>
struct CausalKeyStages {
  static constexpr uint32_t kTileBytes = kWgmmaRows * kHeadDim * 2;
  static constexpr uint32_t kBytes = 2 * kStages * kTileBytes;
  uint32_t base;
  __device__ __forceinline__ uint32_t k(int j) const { return base + (j % kStages) * kTileBytes; }
  __device__ __forceinline__ uint32_t v(int j) const {
    return base + (kStages + j % kStages) * kTileBytes;
  }
  // Starts this thread's copies of key tile j: warpgroup 0 copies its K rows, warpgroup 1 its V
  // rows (whole 64-row tiles inside L).
  __device__ __forceinline__ void load(int j, const CausalRows& at, const RowSlice& k_src,
                                       const RowSlice& v_src) const {
    const RowSlice src = {at.wg == 0 ? k_src.base : v_src.base,
                          at.wg == 0 ? k_src.row_bytes : v_src.row_bytes};
    copy_tile_swizzled<kHeadDim>(at.wg == 0 ? k(j) : v(j), src.row(int64_t{j} * kWgmmaRows),
                                 src.row_bytes, kWgmmaRows, at.thread);
  }
};

// The stages of a walk whose iteration j reads streamed tiles j - kKeep .. j + kAhead (the row
// kernels: kKeep 1, key tile j - 1's V or K in the previous tile's product; kAhead 1, warpgroup 1
// issues tile j + 1's products at the end of iteration j). The prologue starts tiles
// 0 .. kPrologue - 1, one commit group each; step(j) waits for tile j + kAhead's copies, shows
// them to the async proxy and, through the barrier, to the CTA. Past the barrier every thread has
// finished iteration j - 1, so the products that read tile j - 1 - kKeep are done and its buffers
// take tile j + kPrologue. One commit group per step (empty past the end), so tile j + kAhead is
// complete once kPrologue - 1 - kAhead later groups may still run.
template <int kStages, int kKeep, int kAhead>
struct CausalStages {
  static constexpr int kPrologue = kStages - 1 - kKeep;
  static_assert(kPrologue - 1 - kAhead >= 0, "too few stages for the tiles an iteration reads");

  template <typename Load>
  __device__ __forceinline__ static void prologue(int walk, const Load& load) {
#pragma unroll
    for (int j = 0; j < kPrologue; ++j) {
      if (j < walk) load(j);
      cp_async_commit();
    }
  }
  template <typename Load>
  __device__ __forceinline__ static void step(int j, int walk, const Load& load) {
    cp_async_wait<kPrologue - 1 - kAhead>();
    fence_proxy_async_shared();
    __syncthreads();
    if (j + kPrologue < walk) load(j + kPrologue);
    cp_async_commit();
  }
};

// The same place for the dK / dV kernel (sparse_attention_causal_dkdv_wgmma_kernel.cuh): its CTA
// takes 128 keys (one 64-row tile per warpgroup) and walks the query tiles from its diagonal to
// the end of the sequence; the longest key tiles are launched first.
struct CausalCols : CausalThread {
  int64_t b, h;
  int64_t first_key;   // this warpgroup's first key
  int64_t first_tile;  // the CTA's first query tile (its diagonal: 2 x its key tile)
  int walk;            // query tiles the CTA walks (both warpgroups take part in every barrier)
  int begin;           // this warpgroup's first tile of the walk (its diagonal: 0 or 1); walk when
                       // its keys lie past L

  __device__ __forceinline__ explicit CausalCols(const SparseAttentionDeviceParams& p) {
    const int64_t slices = p.batch * p.heads;
    const int64_t kt = static_cast<int64_t>(blockIdx.x) / slices;  // key tile, longest first
    const int64_t slice = static_cast<int64_t>(blockIdx.x) % slices;
    b = slice / p.heads;
    h = slice % p.heads;
    first_key = kt * kCausalQueries + wg * kWgmmaRows;
    first_tile = 2 * kt;
    walk = static_cast<int>(p.len / kWgmmaRows - first_tile);
    begin = first_key < p.len ? wg : walk;
  }

  // This thread's two keys (an m64 accumulator's rows warp * 16 + g and + 8).
  __device__ __forceinline__ int64_t key(int r) const { return first_key + warp * 16 + g + 8 * r; }

  // Removes, in the diagonal tile of S^T (rows: this warpgroup's keys; columns: the queries of
  // the tile that starts at its first key), the queries before each key: column c < row r.
  __device__ __forceinline__ void mask_diagonal(float (&s)[8][4]) const {
    mask(s, [](int c, int r) { return c >= r; });
  }
};

}  // namespace sciattn::cuda

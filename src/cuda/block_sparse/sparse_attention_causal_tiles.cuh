// What the dense causal kernels of the fused sparse attention share (the forward and the dQ
// kernel, sparse_attention_causal_*_wgmma_kernel.cuh): a CTA of two warpgroups over 128 queries,
// one 64-row tile each, walking the key tiles from 0 to its diagonal; the longest query tiles are
// launched first; K and V tiles stream through kStages shared buffers, warpgroup 0 copying K and
// warpgroup 1 V. Run where the layout holds every block at or below the diagonal under the causal
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

// This thread's place: its CTA's (batch, head) and query tile, its warpgroup's rows and key tiles.
struct CausalRows {
  int64_t b, h;
  int64_t first_row;  // this warpgroup's first query
  int walk;           // key tiles the CTA walks (both warpgroups take part in every barrier)
  int mine;           // key tiles of this warpgroup: through its diagonal tile; 0 past L
  int wg;             // warpgroup (0, 1), known warp-uniform (warpgroup_index)
  int thread;         // in the warpgroup
  int warp, g, t;     // warp in the warpgroup; lane / 4, lane % 4 (the fragments' row and column)

  __device__ __forceinline__ explicit CausalRows(const SparseAttentionDeviceParams& p) {
    wg = warpgroup_index();
    thread = static_cast<int>(threadIdx.x) % kWgmmaThreads;
    warp = thread / 32;
    g = (thread % 32) / 4;
    t = thread % 4;
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
#pragma unroll
    for (int n8 = 0; n8 < 8; ++n8)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int r = warp * 16 + g + 8 * (x >> 1), c = n8 * 8 + 2 * t + (x & 1);
        if (c > r) s[n8][x] = kNegInf;
      }
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

// The step that starts iteration j of a walk over `walk` key tiles: waits for key tile
// j + kAhead's copies, shows them to the async proxy and, through the barrier, to the CTA; past it
// every thread has finished iteration j - 1, so the products that read key tile j - 2 are done and
// its buffers take tile j + kStages - 2. Iteration j reads key tiles j - 1 .. j + kAhead (kAhead
// 1: warpgroup 1 issues tile j + 1's products at the end of iteration j). One commit group per
// step (empty past the end), so tile j + kAhead is complete once kStages - 3 - kAhead later
// groups may still run.
template <int kStages, int kAhead, typename Load>
__device__ __forceinline__ void causal_next_stage(int j, int walk, const Load& load) {
  static_assert(kStages >= 3 + kAhead, "iteration j holds key tiles j - 1 .. j + kAhead");
  cp_async_wait<kStages - 3 - kAhead>();
  fence_proxy_async_shared();
  __syncthreads();
  if (j + kStages - 2 < walk) load(j + kStages - 2);
  cp_async_commit();
}

}  // namespace sciattn::cuda

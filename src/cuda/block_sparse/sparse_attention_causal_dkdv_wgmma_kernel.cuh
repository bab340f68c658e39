// The dK / dV kernel of the fused sparse attention backward for dense causal attention (the
// forward's condition: a layout holding every block at or below the diagonal under the causal
// rule, no score terms), on Hopper's warpgroup MMA (sm_90a). A CTA of two warpgroups takes 128
// keys, one 64-row tile each with its K and V fixed in shared memory, and walks the query tiles
// from its diagonal to the end of the sequence (sparse_attention_causal_tiles.cuh), so each
// streamed Q / dO tile with its lse and delta serves 128 keys instead of the lists' kernel's 64.
// Per query tile: S^T = K Q^T and dP^T = V dO^T issued together, P^T and dS^T = P^T (dP^T -
// delta), then dV += P^T dO and dK += dS^T Q issued together. Warpgroup 1 runs half a tile
// behind warpgroup 0, issuing the next tile's S^T and dP^T at the end of each iteration (as the
// row kernels do). Each dK / dV row is one thread's, written once: deterministic. CUDA layer.
#pragma once

#include <type_traits>

#include "cuda/block_sparse/sparse_attention_bwd_kernels.cuh"
#include "cuda/block_sparse/sparse_attention_causal_tiles.cuh"
#include "cuda/common/wgmma.cuh"

namespace sciattn::cuda {

// Its shared memory: each warpgroup's K and V tiles, then kStages stages of a query tile's Q, dO
// (swizzled tiles on 1024-byte boundaries), lse and delta (64 floats each); 1024 bytes extra for
// the base's rounding.
template <int kHeadDim>
struct SparseCausalDkdvSmem {
  static constexpr int kStages = 4;
  // Iteration j reads query tile j and warpgroup 1 issues tile j + 1's products at its end.
  using Stages = CausalStages<kStages, /*kKeep=*/0, /*kAhead=*/1>;
  static constexpr uint32_t kTileBytes = kWgmmaRows * kHeadDim * 2;
  static constexpr uint32_t kStatsBytes = 2 * kWgmmaRows * sizeof(float);
  static constexpr uint32_t kStageBytes = 2 * kTileBytes + 1024;  // stats padded to 1024
  static_assert(kStatsBytes <= 1024, "a stage's lse and delta");
  static constexpr uint32_t kK = 0, kV = kCausalWarpgroups * kTileBytes;
  static constexpr uint32_t kStage0 = 2 * kCausalWarpgroups * kTileBytes;
  static constexpr size_t kLaunchBytes = kStage0 + size_t{kStages} * kStageBytes + 1024;
  // Stage s's Q and dO tiles and its stats.
  __device__ __forceinline__ static uint32_t q(int s) { return kStage0 + s * kStageBytes; }
  __device__ __forceinline__ static uint32_t dout(int s) { return q(s) + kTileBytes; }
  __device__ __forceinline__ static uint32_t stats(int s) { return q(s) + 2 * kTileBytes; }
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kCausalThreads, 1)
    sparse_attention_causal_dkdv_wgmma_kernel(const SparseAttentionDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  using Smem = SparseCausalDkdvSmem<kHeadDim>;
  constexpr int kStages = Smem::kStages;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const CausalCols at(p);
  const uint32_t k_tile = smem.address + Smem::kK + at.wg * Smem::kTileBytes;
  const uint32_t v_tile = smem.address + Smem::kV + at.wg * Smem::kTileBytes;
  const auto lse_of = [&](int j) {
    return reinterpret_cast<const float*>(smem.pointer + Smem::stats(j % kStages));
  };
  const auto delta_of = [&](int j) { return lse_of(j) + kWgmmaRows; };

  // Query tile j of the walk: warpgroup 0 copies its Q rows and lse, warpgroup 1 its dO rows and
  // delta (whole 64-row tiles inside L). Each thread's sources are worked out once: tile j's are
  // tile 0's plus j tiles of rows.
  const RowSlice q_src = row_slice<T>(p.q, p.q_stride, at.b, at.h);
  const RowSlice do_src = row_slice<T>(p.dout, p.dout_stride, at.b, at.h);
  const RowSlice rows = at.wg == 0 ? q_src : do_src;
  const char* const rows0 = rows.row(at.first_tile * kWgmmaRows);
  const int64_t rows_step = int64_t{kWgmmaRows} * rows.row_bytes;
  const uint32_t rows_dst = at.wg == 0 ? Smem::q(0) : Smem::dout(0);
  // Stats: lse (strided) or delta (packed) of row first_tile * 64 + thread.
  const float* stat0 = nullptr;
  int64_t stat_step = 0;
  if (at.wg == 0) {
    stat0 = p.lse + at.b * p.lse_stride[0] + at.h * p.lse_stride[1] +
            (at.first_tile * kWgmmaRows + at.thread) * p.lse_stride[2];
    stat_step = kWgmmaRows * p.lse_stride[2];
  } else {
    stat0 = p.delta + (at.b * p.heads + at.h) * p.len + at.first_tile * kWgmmaRows + at.thread;
    stat_step = kWgmmaRows;
  }
  const uint32_t stat_dst = Smem::stats(0) + (at.wg * kWgmmaRows + at.thread) * sizeof(float);
  const auto load = [&](int j) {
    const uint32_t stage = (j % kStages) * Smem::kStageBytes;
    copy_tile_swizzled<kHeadDim>(smem.address + rows_dst + stage, rows0 + j * rows_step,
                                 rows.row_bytes, kWgmmaRows, at.thread);
    if (at.thread < kWgmmaRows) {
      cp_async_4(smem.pointer + stat_dst + stage, stat0 + j * stat_step, 4);
    }
  };
  if (at.begin < at.walk) {
    const RowSlice k_src = row_slice<T>(p.k, p.k_stride, at.b, at.h);
    const RowSlice v_src = row_slice<T>(p.v, p.v_stride, at.b, at.h);
    copy_tile_swizzled<kHeadDim>(k_tile, k_src.row(at.first_key), k_src.row_bytes, kWgmmaRows,
                                 at.thread);
    copy_tile_swizzled<kHeadDim>(v_tile, v_src.row(at.first_key), v_src.row_bytes, kWgmmaRows,
                                 at.thread);
  }
  Smem::Stages::prologue(at.walk, load);

  const float scale_log2 = p.scale * kLog2e;
  float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[i][x] = dv[i][x] = 0.0f;
  float pt[8][4], dpt[8][4];
  // Iteration j of the walk for this warpgroup (j >= begin), its issue pattern fixed per call
  // site as in the row kernels (kFirst: this warpgroup's first tile, nothing in flight; kEarly:
  // S^T and dP^T were issued by the iteration before; kNext: issue tile j + 1's at the end).
  const auto step = [&](int j, auto first, auto early, auto next) {
    constexpr bool kFirst = decltype(first)::value, kEarly = decltype(early)::value;
    constexpr bool kNext = decltype(next)::value;
    Smem::Stages::step(j, at.walk, load);
    const int s = j % kStages;
    if constexpr (kFirst || !kEarly) {
      wgmma_tile_nt_issue<T, kHeadDim>(pt, k_tile, smem.address + Smem::q(s));
      wgmma_tile_nt_issue<T, kHeadDim>(dpt, v_tile, smem.address + Smem::dout(s));
    }
    wgmma_wait<0>();
    wgmma_pin(pt);
    wgmma_pin(dpt);
    if (j == at.begin) at.mask_diagonal(pt);
    // P^T = 2^(S^T scale_log2 - lse_log2), lse per query column.
    const float* lse = lse_of(j);
#pragma unroll
    for (int n8 = 0; n8 < 8; ++n8) {
      const float2 lse2 = lse_pair_log2(lse, n8, at.t);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        pt[n8][x] = fast_exp2(fmaf(pt[n8][x], scale_log2, (x & 1) ? -lse2.y : -lse2.x));
      }
    }
    // dS^T = P^T (dP^T - delta) (in dpt), then dV += P^T dO and dK += dS^T Q (times scale when
    // written) issued together; the other warpgroup's element-wise work overlaps them.
    uint32_t p_frags[4][4], ds_frags[4][4];
    pack_a_fragments<T>(p_frags, pt);
    const float* delta = delta_of(j);
#pragma unroll
    for (int n8 = 0; n8 < 8; ++n8)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        dpt[n8][x] = pt[n8][x] * (dpt[n8][x] - delta[n8 * 8 + 2 * at.t + (x & 1)]);
      }
    pack_a_fragments<T>(ds_frags, dpt);
    wgmma_acc_packed_issue<T, kHeadDim>(dv, p_frags, smem.address + Smem::dout(s));
    wgmma_acc_packed_issue<T, kHeadDim>(dk, ds_frags, smem.address + Smem::q(s));
    wgmma_tile_done<0>(dv);
    wgmma_pin(dk);
    wgmma_pin_fragments(p_frags);
    wgmma_pin_fragments(ds_frags);
    if constexpr (kNext) {
      const int n = (j + 1) % kStages;
      wgmma_tile_nt_issue<T, kHeadDim>(pt, k_tile, smem.address + Smem::q(n));
      wgmma_tile_nt_issue<T, kHeadDim>(dpt, v_tile, smem.address + Smem::dout(n));
    }
  };
  constexpr std::true_type kYes{};
  constexpr std::false_type kNo{};
  if (at.begin >= at.walk) {
    // Keys past L: only the copies and the barriers.
    for (int j = 0; j < at.walk; ++j) Smem::Stages::step(j, at.walk, load);
    return;
  }
  if (at.wg == 0) {
    step(0, kYes, kNo, kNo);
    for (int j = 1; j < at.walk; ++j) step(j, kNo, kNo, kNo);
  } else {
    // Tile 0 lies before these keys: only its barrier. Then tiles 1 .. walk - 1 (walk >= 2).
    Smem::Stages::step(0, at.walk, load);
    if (at.walk == 2) {
      step(1, kYes, kNo, kNo);
    } else {
      step(1, kYes, kNo, kYes);
      for (int j = 2; j < at.walk - 1; ++j) step(j, kNo, kYes, kYes);
      step(at.walk - 1, kNo, kYes, kNo);
    }
  }

  const int64_t my_keys[2] = {at.key(0), at.key(1)};
  const float dk_factor[2] = {p.scale, p.scale}, dv_factor[2] = {1.0f, 1.0f};
  store_slice_rows<T, kOutTiles>(dk, dk_factor, p.dk, p.dk_stride, at.b, at.h, my_keys, p.len,
                                 p.dim, at.t, p.grads_paired);
  store_slice_rows<T, kOutTiles>(dv, dv_factor, p.dv, p.dv_stride, at.b, at.h, my_keys, p.len,
                                 p.dim, at.t, p.grads_paired);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda

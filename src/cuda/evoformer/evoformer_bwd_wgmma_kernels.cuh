// The Evoformer attention backward's dK/dV, dQ and dbias2 kernels on Hopper's warpgroup MMA
// (wgmma, sm_90a), for head dims 32, 64 and 128 with aligned Q/K/V/O/dO (the host's wgmma_tiles).
// Same grids, bias stages, probability / dS code, epilogues and determinism as
// evoformer_bwd_kernels.cuh's (shared helpers; the reduction kernel is the same launch, while
// delta comes from the dQ kernel instead of a kernel of its own where it reads O as tiles); the
// products of a tile
// run as warpgroup MMAs on swizzled shared tiles (cuda/common/wgmma.cuh), two products with
// operands in shared memory issued together:
//   dK/dV kernel (fixed K, V; streamed Q, dO):  S^T = K Q^T, dP^T = V dO^T (shared x shared),
//                                               dV += P^T dO, dK += dS^T Q (registers x shared)
//   dQ kernel (fixed Q, dO; streamed K, V):     S = Q K^T, dP = dO V^T, dQ += dS K; it runs
//                                               first and, where O is read as tiles
//                                               (delta_from_out_tiles), computes delta = rowsum(dO
//                                               * O) from its dO and O tiles
//   dbias2 kernel (Q, dO, K, V of each n):      S = Q K^T, dP = dO V^T (the sum of dS over the
//                                               chunk's n stays in registers)
// Any L: rows past L are zero-filled and handled as in the mma.sync kernels. CUDA layer.
#pragma once

#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/evoformer/evoformer_bias_types.cuh"
#include "cuda/evoformer/evoformer_bwd_kernels.cuh"
#include "cuda/evoformer/evoformer_wgmma_tiles.cuh"

namespace sciattn::cuda {

// The dK/dV and fused kernels' query tiles (64 queries of the CTA's (b, n, h) slice against its
// 64 keys from key0): Q and dO into kStages buffers of swizzled tiles (Q at q_tiles + buf *
// kTileBytes, dO at do_tiles + ...), the rows' lse and delta into stats (lse of buffer buf at
// stats + 64 buf, delta at stats + 64 (kStages + buf)), and bias2's tile [those queries][the keys]
// into its stage (bias2_stages + buf * the stage's bytes). Whole tiles through per-thread streams
// at head dim 32 (282 against 307 us at triangle 384 in the dK/dV kernel; at 64 their registers
// spill at three CTAs per SM: 151 against 141 us at [1,256,256,4,64]), masked where rows or bias2
// columns reach past L (EvoformerQueryTileStreams); other biases and head dims through the generic
// copies (copy_slice_swizzled). In the caller's cp.async group.
template <typename T, int kHeadDim, int kStages = 2, TileCols kCols = TileCols::kExact>
struct EvoformerQueryTileLoader {
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  static constexpr bool kStreamed = kHeadDim <= 32;
  SliceSource q_src, do_src;
  uint32_t q_tiles, do_tiles;
  float* stats;
  unsigned char* bias2_stages;
  int bias2_stage_bytes;
  int64_t b, bn, h, key0;
  EvoformerQueryTileStreams<kHeadDim, kCols> streams;

  __device__ __forceinline__ EvoformerQueryTileLoader(
      const EvoformerDeviceParams& p, const SliceSource& q_src_, const SliceSource& do_src_,
      int64_t b_, int64_t bn_, int64_t h_, int64_t key0_, uint32_t q_tiles_, uint32_t do_tiles_,
      float* stats_, unsigned char* bias2_stages_, BiasType bias2_type)
      : q_src(q_src_),
        do_src(do_src_),
        q_tiles(q_tiles_),
        do_tiles(do_tiles_),
        stats(stats_),
        bias2_stages(bias2_stages_),
        bias2_stage_bytes(bias_stage_bytes(bias2_type, kWgmmaRows)),
        b(b_),
        bn(bn_),
        h(h_),
        key0(key0_),
        streams(p, q_src_, do_src_, b_, bn_, h_, key0_, bias2_type) {}

  __device__ __forceinline__ uint32_t q_tile(int buf) const {
    return q_tiles + buf * Smem::kTileBytes;
  }
  __device__ __forceinline__ uint32_t do_tile(int buf) const {
    return do_tiles + buf * Smem::kTileBytes;
  }
  __device__ __forceinline__ float* lse(int buf) const { return stats + buf * kWgmmaRows; }
  __device__ __forceinline__ float* delta(int buf) const {
    return stats + (kStages + buf) * kWgmmaRows;
  }
  __device__ __forceinline__ unsigned char* bias2_stage(int buf) const {
    return bias2_stages + buf * bias2_stage_bytes;
  }

  // Starts query tile qt's copies into buffer `buf`. With `o_tile` (a shared-window address; 0:
  // none) O's rows of the tile come too, into that swizzled tile, and no delta is copied: the
  // caller computes it from the dO and O tiles (delta_of_copied_rows, before the barrier).
  __device__ __forceinline__ void load(const EvoformerDeviceParams& p, int64_t qt, int buf,
                                       uint32_t o_tile = 0) const {
    const int64_t q0 = qt * kWgmmaRows;
    float* const delta_dst = o_tile != 0 ? nullptr : delta(buf);
    if (o_tile != 0) {
      copy_slice_swizzled<T, kHeadDim, kCols>(
          o_tile, slice_of(p.out, p.out_stride, p.vec_out, sizeof(T), b, bn - b * p.n, h), q0, p);
    }
    if constexpr (kStreamed) {
      const bool keys_whole = key0 + kWgmmaRows <= p.len;
      if (streams.usable && keys_whole && q0 + kWgmmaRows <= p.len) {
        streams.copy(qt, q_tile(buf), do_tile(buf), lse(buf), delta_dst,
                     shared_address(bias2_stage(buf)));
        return;
      }
      if (keys_whole ? streams.usable : streams.last_usable) {
        streams.copy_masked(
            p, qt, key0, q_tile(buf), do_tile(buf), lse(buf), delta_dst,
            shared_address(bias2_stage(buf)),
            static_cast<const char*>(q_src.base) + q0 * q_src.row_stride * 2,
            static_cast<const char*>(do_src.base) + q0 * do_src.row_stride * 2,
            static_cast<const char*>(p.bias2) +
                (b * p.bias2_stride[0] + h * p.bias2_stride[1] + q0 * p.bias2_stride[2] + key0) *
                    2);
        return;
      }
    }
    copy_slice_swizzled<T, kHeadDim, kCols>(q_tile(buf), q_src, q0, p);
    copy_slice_swizzled<T, kHeadDim, kCols>(do_tile(buf), do_src, q0, p);
    copy_query_tile_stats_and_bias<kWgmmaThreads>(p, b, bn, h, key0, q0, q0 + kWgmmaRows <= p.len,
                                                  lse(buf), delta_dst, bias2_stage(buf));
  }
};

// A key tile's sums, zeroed: dK and dV (fp32 accumulators of its 64 keys x head dim) and this
// thread's share of its two keys' dbias1 (the sum over queries of dS).
template <int kOutTiles>
__device__ __forceinline__ void zero_key_tile_sums(float (&dk)[kOutTiles][4],
                                                   float (&dv)[kOutTiles][4],
                                                   float (&key_dbias1)[2]) {
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  key_dbias1[0] = key_dbias1[1] = 0.0f;
}

// A step of the dK/dV loop (the keys' K and V tiles against query tile `buf` of `queries`) up to
// dS: S^T = K Q^T and dP^T = V dO^T issued together, P^T from S^T while dP^T runs, dV += P^T dO
// (which waits for both), then dS^T = P^T (dP^T - delta) in pt, each key's share of dbias1 added
// to key_dbias1. bias2_type: the kernel's (evoformer_bias_types.cuh).
template <typename T, int kHeadDim, int kStages, TileCols kCols>
__device__ __forceinline__ void evoformer_dkdv_wgmma_ds(
    float (&pt)[8][4], float (&dv)[kHeadDim / 8][4], float (&key_dbias1)[2], uint32_t k_tile,
    uint32_t v_tile, const EvoformerQueryTileLoader<T, kHeadDim, kStages, kCols>& queries, int buf,
    BiasType bias2_type, float scale_log2, const float (&key_bias1)[2], int warp, int lane) {
  float dpt[8][4];
  wgmma_tile_nt_issue<T, kHeadDim>(pt, k_tile, queries.q_tile(buf));
  wgmma_tile_nt_issue<T, kHeadDim>(dpt, v_tile, queries.do_tile(buf));
  wgmma_tile_done<1>(pt);
  evoformer_transposed_probabilities(pt, scale_log2, key_bias1, queries.bias2_stage(buf),
                                     bias2_type, queries.lse(buf), warp, lane);
  wgmma_acc_tile<T, kHeadDim>(dv, pt, queries.do_tile(buf));
  wgmma_tile_done<0>(dpt);
  evoformer_transposed_ds(pt, dpt, queries.delta(buf), key_dbias1, lane % 4);
}

template <typename T, int kHeadDim, typename BiasTypes>
__global__ void __launch_bounds__(kWgmmaThreads, kEvoformerWgmmaDkdvCtas<kHeadDim>)
    evoformer_bwd_dkdv_wgmma_kernel(const EvoformerDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  enter_overlapped_grid();
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  const BiasTypes types(p);
  constexpr int kOutTiles = kHeadDim / 8;
  static_assert(
      EvoformerBwdTile::kBlock == kWgmmaRows && EvoformerBwdTile::kThreads == kWgmmaThreads,
      "the mma.sync kernel's grid and bias stages");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const uint32_t k_tile = smem.address + Smem::kA, v_tile = smem.address + Smem::kB;

  const TileHeadSlice at = decode_tile_head_slice(blockIdx.x, p);
  const int64_t h = at.h, b = at.b, n = at.n, bn = at.bn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const int64_t key0 = at.tile * kWgmmaRows;
  const int64_t my_keys[2] = {key0 + warp * 16 + lane / 4, key0 + warp * 16 + lane / 4 + 8};
  const int64_t q_tiles = (p.len + kWgmmaRows - 1) / kWgmmaRows;

  const EvoformerQueryTileLoader<T, kHeadDim, 2, BiasTypes::kCols> queries(
      p, slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h),
      slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h), b, bn, h, key0,
      smem.address + Smem::kC, smem.address + Smem::kD,
      reinterpret_cast<float*>(smem.pointer + Smem::kStats), smem.pointer + Smem::kBwdBytes,
      types.bias2);
  auto load_query_tile = [&](int64_t qt, int buf) { queries.load(p, qt, buf); };
  auto convert_lse = [&](int buf) { stage_lse_to_log2<kWgmmaRows>(queries.lse(buf)); };
  uint32_t key_bias1_bits[2];  // converted at the first step, after the tiles' wait
  load_key_bias1_bits(key_bias1_bits, p, b, n, my_keys);
  copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(
      k_tile, slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h), key0, p);
  copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(
      v_tile, slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h), key0, p);
  load_query_tile(0, 0);
  cp_async_commit();

  float key_bias1[2] = {0.0f, 0.0f};
  float dk[kOutTiles][4], dv[kOutTiles][4], key_dbias1[2];
  zero_key_tile_sums(dk, dv, key_dbias1);
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t qt = 0; qt < q_tiles; ++qt) {
    const int buf = static_cast<int>(qt & 1);
    next_stage(qt, q_tiles, buf, load_query_tile, convert_lse);
    if (qt == 0) key_bias1_from_bits(key_bias1, key_bias1_bits, types.bias1);
    float pt[8][4];
    evoformer_dkdv_wgmma_ds(pt, dv, key_dbias1, k_tile, v_tile, queries, buf, types.bias2,
                            scale_log2, key_bias1, warp, lane);
    wgmma_acc_tile<T, kHeadDim>(dk, pt, queries.q_tile(buf));  // dK += dS^T Q (scaled when written)
  }

  evoformer_finish_dkdv<T, kHeadDim>(p, dk, dv, key_dbias1, b, n, h, bn, my_keys, t,
                                     written_dim<kHeadDim, BiasTypes>(p));
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

template <typename T, int kHeadDim, typename BiasTypes>
__global__ void __launch_bounds__(kWgmmaThreads, kEvoformerWgmmaDqCtas<kHeadDim>)
    evoformer_bwd_dq_wgmma_kernel(const EvoformerDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  enter_overlapped_grid();
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  const BiasTypes types(p);
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const uint32_t q_tile = smem.address + Smem::kA, do_tile = smem.address + Smem::kB;

  const TileHeadSlice at = decode_tile_head_slice(blockIdx.x, p);
  const int64_t h = at.h, b = at.b, n = at.n, bn = at.bn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const int64_t q0 = at.tile * kWgmmaRows;
  const int64_t my_rows[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
  const int64_t k_tiles = (p.len + kWgmmaRows - 1) / kWgmmaRows;

  const EvoformerKeyTileLoader<T, kHeadDim, true, BiasTypes::kCols> keys(
      p, b, n, h, q0, smem.address + Smem::kC, smem.address + Smem::kD,
      smem.pointer + Smem::kBwdBytes, types.bias1, types.bias2);
  auto load_key_tile = [&](int64_t kt, int buf) { keys.load(p, kt, buf); };
  copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(
      q_tile, slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h), q0, p);
  copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(
      do_tile, slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h), q0, p);
  // delta_i = <dO_i, O_i> of the CTA's rows: where the host set delta_from_out_tiles, O's rows
  // come in the same cp.async group as Q and dO, into V's second buffer, which only key tile 1
  // uses; at the first step each thread sums the dO * O of the chunks it copied before the
  // barrier (delta_of_copied_rows), so that tile 1's copies may start right after it, and delta
  // goes to shared memory for this CTA and to the workspace for the dK/dV and dbias2 kernels,
  // which run after this one. Else the delta kernel, launched before this one, wrote it.
  const bool delta_from_tiles = p.delta_from_out_tiles != 0;
  if (delta_from_tiles) {
    copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(
        keys.v_tile(1), slice_of(p.out, p.out_stride, p.vec_out, sizeof(T), b, n, h), q0, p);
  }
  load_key_tile(0, 0);
  cp_async_commit();

  // The rows' lse in log2 units (+inf for a padded or fully masked row: P = 0 with no
  // per-element check) and, from the delta kernel, their delta (0 past L), loaded before the
  // first tiles' wait so that their latency overlaps it.
  float lse_log2[2], delta[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse_log2[r] = lse_log2_of(
        my_rows[r] < p.len
            ? p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]]
            : kNegInf);
    if (!delta_from_tiles && my_rows[r] < p.len) {
      delta[r] = p.delta[(bn * p.heads + h) * p.len + my_rows[r]];
    }
  }
  // This CTA's rows' delta from the tiles, in the stats area (the pointers are formed where they
  // are used, so that none stays live across the loop).
  const auto delta_rows = [&] { return reinterpret_cast<float*>(smem.pointer + Smem::kStats); };
  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const int buf = static_cast<int>(kt & 1);
    next_stage(kt, k_tiles, buf, load_key_tile, [&](int) {
      if (kt == 0 && delta_from_tiles) {
        delta_of_copied_rows<T, kHeadDim>(
            smem.pointer + Smem::kB,
            smem.pointer + (Smem::kD + Smem::kTileBytes) /* keys.v_tile(1) */, delta_rows(),
            p.delta + (bn * p.heads + h) * p.len + q0, p.len - q0);
      }
    });
    if (kt == 0 && delta_from_tiles) {
      delta[0] = delta_rows()[my_rows[0] - q0];
      delta[1] = delta_rows()[my_rows[1] - q0];
    }
    // S = Q K^T and dP = dO V^T issued together, the tile's biases read while they run, P from
    // S while dP runs.
    float dots[8][4], ds[8][4];
    wgmma_tile_nt_issue<T, kHeadDim>(dots, q_tile, keys.k_tile(buf));
    wgmma_tile_nt_issue<T, kHeadDim>(ds, do_tile, keys.v_tile(buf));
    float pr[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) pr[j][0] = pr[j][1] = pr[j][2] = pr[j][3] = 0.0f;
    add_staged_biases(pr, keys.bias1_stage(buf), types.bias1, keys.bias2_stage(buf), types.bias2,
                      warp * 16, lane);
    wgmma_tile_done<1>(dots);
    evoformer_row_probabilities(pr, dots, scale_log2, lse_log2, kt * kWgmmaRows, p.len, t);
    wgmma_tile_done<0>(ds);
    evoformer_row_ds(ds, pr, delta);                        // dS = P (dP - delta)
    wgmma_acc_tile<T, kHeadDim>(dq, ds, keys.k_tile(buf));  // dQ += dS K
  }
  store_rows<T, kOutTiles>(dq, p.scale, p.dq, p.dq_stride, b, n, h, my_rows, p.len,
                           written_dim<kHeadDim, BiasTypes>(p), t, p.grads_paired);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

// One CTA per (tile of dbias2[b, h], chunk of N), as evoformer_bwd_dbias2_kernel (whose grid,
// bias handling and store it shares): the sum over the chunk's n of dS in order, S and dP of each
// n recomputed from its Q, dO, K and V tiles. The tile is 128 queries (two warpgroups, each with
// its own Q and dO rows, sharing the K and V tiles) x 64 keys at head dim 64 and 64 x 64 at 128.
// Per n the CTA does little arithmetic on many bytes of tiles (6 per cell at head dim 64), so the
// tiles run three stages deep there, and bias2, which does not depend on n, stays in registers
// (in shared memory at head dim 32, whose two CTAs per SM leave 128 registers a thread).
template <typename T, int kHeadDim, typename BiasTypes>
__global__ void __launch_bounds__(kWgmmaThreads* EvoformerWgmmaSmem<kHeadDim>::kDbias2Groups,
                                  detail::cuda_dbias2_ctas_per_sm(kHeadDim))
    evoformer_bwd_dbias2_wgmma_kernel(const EvoformerDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  enter_overlapped_grid();
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  const BiasTypes types(p);
  constexpr int kStages = Smem::kDbias2Stages, kGroups = Smem::kDbias2Groups;
  constexpr int kRows = Smem::kDbias2Rows, kThreads = kGroups * kWgmmaThreads;
  static_assert(detail::cuda_dbias2_rows(kHeadDim) == kRows, "the host plan's dbias2 tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const auto tile = [&](int x, int st) {
    return smem.address + (st * Smem::kDbias2Tiles + x) * Smem::kTileBytes;
  };
  float* const stats = reinterpret_cast<float*>(smem.pointer + Smem::kDbias2Stats);
  const auto lse_of = [&](int st) { return stats + st * kRows; };
  const auto delta_of = [&](int st) { return stats + (kStages + st) * kRows; };
  const auto bias1_of = [&](int parity) {
    return stats + 2 * kStages * kRows + parity * kWgmmaRows;
  };

  const Dbias2Cta at = decode_dbias2_cta(p);
  const int64_t h = at.h, b = at.b;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / 4, group_thread = static_cast<int>(threadIdx.x) % kWgmmaThreads;
  const int64_t q0 = at.query_block * kRows, k0 = at.key_block * kWgmmaRows;
  const int64_t group_q0 = q0 + group * kWgmmaRows;
  const int my_row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};  // in the tile's rows

  // Each warpgroup copies its own Q and dO rows; K and V are split between the warpgroups (one
  // copier per thread: Q or dO, then K or V; with one warpgroup, K and V). The copiers start at
  // the chunk's first n and move one n on per copy.
  const auto copier = [&](const void* data, const int64_t stride[4], int64_t row0) {
    const SliceSource src = slice_of(data, stride, 1, sizeof(T), b, 0, h);
    const int32_t row_bytes =
        static_cast<int32_t>(src.row_stride * static_cast<int64_t>(sizeof(T)));
    SwizzledTileCopier<kHeadDim, BiasTypes::kCols> copy(
        static_cast<const char*>(src.base) + row0 * row_bytes, row_bytes, p.len - row0,
        group_thread, static_cast<int>(2 * p.load_dim));
    copy.advance(at.n_begin * stride[1] * static_cast<int64_t>(sizeof(T)));
    return copy;
  };
  const auto n_bytes = [](const int64_t stride[4]) {
    return stride[1] * static_cast<int64_t>(sizeof(T));
  };
  SwizzledTileCopier<kHeadDim, BiasTypes::kCols> q_copy = copier(p.q, p.q_stride, group_q0);
  SwizzledTileCopier<kHeadDim, BiasTypes::kCols> do_copy = copier(p.dout, p.dout_stride, group_q0);
  const bool copies_k = kGroups == 1 || group == 0;
  SwizzledTileCopier<kHeadDim, BiasTypes::kCols> kv_copy =
      copies_k ? copier(p.k, p.k_stride, k0) : copier(p.v, p.v_stride, k0);
  SwizzledTileCopier<kHeadDim, BiasTypes::kCols> v_copy =
      copier(p.v, p.v_stride, k0);  // one warpgroup only
  const int64_t q_n_bytes = n_bytes(p.q_stride), do_n_bytes = n_bytes(p.dout_stride),
                kv_n_bytes = copies_k ? n_bytes(p.k_stride) : n_bytes(p.v_stride),
                v_n_bytes = n_bytes(p.v_stride);
  const int kv_tile = 2 * kGroups + (copies_k ? 0 : 1);
  // The row statistics of n: thread r < kRows copies row q0 + r's lse and delta (rows past L get
  // lse +inf and delta 0, written once per stage below, so P = 0 there).
  static_assert(kThreads >= kRows, "one thread per row's statistics");
  const int stat_row = static_cast<int>(threadIdx.x);
  const bool stat_copied = stat_row < kRows && q0 + stat_row < p.len;
  const int64_t lse_n = p.lse_stride[0], delta_n = p.heads * p.len;
  const float* lse_next = p.lse + (b * p.n + at.n_begin) * lse_n + h * p.lse_stride[1] +
                          (q0 + stat_row) * p.lse_stride[2];
  const float* delta_next = p.delta + (b * p.n + at.n_begin) * delta_n + h * p.len + q0 + stat_row;
  if (stat_row < kRows && !stat_copied) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      lse_of(st)[stat_row] = __builtin_huge_valf();
      delta_of(st)[stat_row] = 0.0f;
    }
  }
  // Starts the copies of n's tiles and row statistics into stage st, as one cp.async group (an
  // empty one past the chunk, so that every iteration waits for the same group count). Called
  // for n = at.n_begin, at.n_begin + 1, ... in order: each call moves the sources one n on.
  auto load_n = [&](int64_t n, int st) {
    if (n < at.n_end) {
      q_copy.copy(tile(group, st));
      do_copy.copy(tile(kGroups + group, st));
      kv_copy.copy(tile(kv_tile, st));
      if (kGroups == 1) v_copy.copy(tile(2 * kGroups + 1, st));
      q_copy.advance(q_n_bytes);
      do_copy.advance(do_n_bytes);
      kv_copy.advance(kv_n_bytes);
      if (kGroups == 1) v_copy.advance(v_n_bytes);
      if (stat_copied) {
        cp_async_4(lse_of(st) + stat_row, lse_next, 4);
        cp_async_4(delta_of(st) + stat_row, delta_next, 4);
      }
      lse_next += lse_n;
      delta_next += delta_n;
    }
    cp_async_commit();
  };
#pragma unroll
  for (int st = 0; st + 1 < kStages; ++st) load_n(at.n_begin + st, st);
  // bias1 of n is read into a register one n ahead and stored at the end of the iteration.
  if (threadIdx.x < kWgmmaRows) {
    bias1_of(0)[threadIdx.x] =
        kLog2e * bias_from_bits(dbias2_bias1_bits(p, b, at.n_begin, k0), types.bias1);
  }
  float bias2_cells[8][4];  // this thread's cells of bias2 (it does not depend on n)
  dbias2_bias2_cells(bias2_cells, p, b, h, q0, k0, my_row, lane);
  float* const bias2_cells_smem = reinterpret_cast<float*>(smem.pointer + Smem::kDbias2Cells);
  if constexpr (!Smem::kDbias2CellsInRegisters) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        bias2_cells_smem[(j * 4 + e) * kThreads + threadIdx.x] = bias2_cells[j][e];
  }

  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  int st = 0;  // the stage of n
  for (int64_t n = at.n_begin; n < at.n_end; ++n) {
    const int parity = static_cast<int>((n - at.n_begin) & 1);
    // n + 1's bias1, loaded here and converted where it is stored, below (the conversion would
    // wait for the load right away).
    const uint32_t bias1_next =
        n + 1 < at.n_end ? dbias2_bias1_bits(p, b, n + 1, k0) : neutral_bias_bits(types.bias1);
    cp_async_wait<kStages - 2>();  // n's group is complete (n + 1's may still run)
    fence_proxy_async_shared();
    // Past this barrier n's tiles are visible to the whole CTA and every thread has finished
    // n - 1, so its stage (st + kStages - 1, mod kStages) is refilled for n + kStages - 1 and
    // bias1_of(parity ^ 1), which n - 1 read, is written below: one barrier per n.
    __syncthreads();
    load_n(n + kStages - 1, st == 0 ? kStages - 1 : st - 1);
    float lse_log2[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse_log2[r] = lse_log2_of(lse_of(st)[my_row[r]]);
      row_delta[r] = delta_of(st)[my_row[r]];
    }
    // The cells of column pairs j0 .. j0 + kPairs - 1 from S and dP of those columns.
    auto add_cells = [&](const auto& dot, const auto& dp, int j0) {
      constexpr int kPairs = std::extent_v<std::remove_reference_t<decltype(dot)>>;
#pragma unroll
      for (int jj = 0; jj < kPairs; ++jj) {
        const int j = j0 + jj;
        float cells[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          cells[e] = Smem::kDbias2CellsInRegisters
                         ? bias2_cells[j][e]
                         : bias2_cells_smem[(j * 4 + e) * kThreads + threadIdx.x];
        }
        dbias2_add_cells(acc[j], dot[jj], dp[jj], cells, bias1_of(parity), j, lane, scale_log2,
                         lse_log2, row_delta);
      }
    };
    if constexpr (Smem::kDbias2CellsInRegisters) {
      float dot[8][4], dp[8][4];
      wgmma_tile_nt_issue<T, kHeadDim>(dot, tile(group, st), tile(2 * kGroups, st));  // S = Q K^T
      wgmma_tile_nt_issue<T, kHeadDim>(dp, tile(kGroups + group, st),
                                       tile(2 * kGroups + 1, st));  // dP = dO V^T
      wgmma_tile_done<0>(dot);
      wgmma_pin(dp);
      add_cells(dot, dp, 0);
    } else {
      // At two CTAs per SM (128 registers a thread) S and dP of all 64 keys (64 registers) made
      // ptxas spill; one half of the keys at a time holds half of them.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float dot[4][4], dp[4][4];
        wgmma_half_tile_nt_issue<T, kHeadDim>(dot, tile(group, st), tile(2 * kGroups, st), half);
        wgmma_half_tile_nt_issue<T, kHeadDim>(dp, tile(kGroups + group, st),
                                              tile(2 * kGroups + 1, st), half);
        wgmma_tile_done<0>(dot);
        wgmma_pin(dp);
        add_cells(dot, dp, 4 * half);
      }
    }
    if (threadIdx.x < kWgmmaRows && n + 1 < at.n_end)
      bias1_of(parity ^ 1)[threadIdx.x] = kLog2e * bias_from_bits(bias1_next, types.bias1);
    st = st + 1 == kStages ? 0 : st + 1;
  }

  store_dbias2_tile(p, acc, b, h, at.chunk, q0, k0, my_row, lane % 4);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda

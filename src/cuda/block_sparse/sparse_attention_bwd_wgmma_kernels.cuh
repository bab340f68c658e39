// The fused block-sparse attention backward on Hopper's warpgroup MMA (wgmma, sm_90a), under the
// forward's condition (SparseAttentionDeviceParams::wgmma_tiles, with dO as well) and over list
// entries of either kind, whole tiles or packed blocks of 16 and 32 (the forward's file says
// how; here the probabilities outside a warp's kept groups are zeroed). The same two kernels as
// sparse_attention_bwd_kernels.cuh, with their probability, dS and output code, and the same
// determinism (every output element owned by one thread, split lines through fp32 partials); the
// four products of a tile run as warpgroup MMAs on 128-byte swizzled shared tiles
// (cuda/common/wgmma.cuh):
//   dK/dV kernel (fixed K, V; streamed Q, dO):  S^T = K Q^T, dP^T = V dO^T (shared x shared),
//                                               dV += P^T dO, dK += dS^T Q (registers x shared)
//   dQ kernel (fixed Q, dO; streamed K, V):     S = Q K^T, dP = dO V^T, dQ += dS K
// CUDA layer.
#pragma once

#include "cuda/block_sparse/sparse_attention_bwd_kernels.cuh"
#include "cuda/block_sparse/sparse_attention_wgmma_entries.cuh"
#include "cuda/common/wgmma.cuh"

namespace sciattn::cuda {

// Shared memory of both kernels: the fixed tiles A and B, the streamed tiles C and D
// double-buffered, each on a 1024-byte boundary, then the streamed query rows' lse and delta
// (dK/dV kernel); 1024 bytes extra for rounding the base up inside the kernel.
template <int kHeadDim>
struct SparseBwdWgmmaSmem {
  static constexpr uint32_t kTileBytes = SparseTile::kSize * kHeadDim * 2;
  static_assert(kTileBytes % 1024 == 0, "every tile must start on a swizzle-pattern boundary");
  static constexpr uint32_t kA = 0, kB = kTileBytes, kC = 2 * kTileBytes, kD = 4 * kTileBytes;
  static constexpr uint32_t kStats = 6 * kTileBytes;  // float lse[2][64], delta[2][64]
  static constexpr size_t kLaunchBytes = kStats + 4 * SparseTile::kSize * sizeof(float) + 1024;
};

template <typename T, int kHeadDim, bool kPacked>
__global__ void __launch_bounds__(SparseTile::kThreads, kHeadDim <= 64 ? 3 : 1)
    sparse_attention_dkdv_wgmma_kernel(const SparseAttentionDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  using Smem = SparseBwdWgmmaSmem<kHeadDim>;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const auto q_tile = [&](int buf) { return smem.address + Smem::kC + buf * Smem::kTileBytes; };
  const auto do_tile = [&](int buf) { return smem.address + Smem::kD + buf * Smem::kTileBytes; };
  float* const stats = reinterpret_cast<float*>(smem.pointer + Smem::kStats);
  const auto lse_of = [&](int buf) { return stats + buf * SparseTile::kSize; };
  const auto delta_of = [&](int buf) { return stats + (2 + buf) * SparseTile::kSize; };

  const PieceOf at = decode_piece(p.tiles.cols, p.tiles);
  const int64_t b = at.b, h = at.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int my_k[2] = {warp * 16 + g, warp * 16 + g + 8};

  const EntrySlots<kPacked> slots(p.tiles.col_slots, p.tiles);
  // The tile column's keys, gathered for a packed layout.
  const TileLineTokens<kPacked> keys(slots, p.tiles.col_units, p.tiles, at);
  int64_t my_keys[2];
  keys.outputs(my_keys, slots, my_k, p.len);
  const EntryRowCopier<kHeadDim, kPacked> q_do(row_slice<T>(p.q, p.q_stride, b, h),
                                               row_slice<T>(p.dout, p.dout_stride, b, h),
                                               p.tiles.shift);
  auto load_entry = [&](int e, int buf) {
    const int32_t* entry = slots.of(e);
    q_do.copy(q_tile(buf), do_tile(buf), slots, entry);
    load_sparse_row_stats(lse_of(buf), delta_of(buf), p, b, h, slots, entry);
  };
  if (at.begin < at.end) {
    const RowSlice k_src = row_slice<T>(p.k, p.k_stride, b, h);
    const RowSlice v_src = row_slice<T>(p.v, p.v_stride, b, h);
    if constexpr (kPacked) {
      const EntryRowCopier<kHeadDim, true> kv(k_src, v_src, p.tiles.shift);
      kv.copy(smem.address + Smem::kA, smem.address + Smem::kB, slots, keys.units);
    } else {
      copy_tile_swizzled<kHeadDim>(smem.address + Smem::kA, k_src.row(keys.first), k_src.row_bytes);
      copy_tile_swizzled<kHeadDim>(smem.address + Smem::kB, v_src.row(keys.first), v_src.row_bytes);
    }
    load_entry(at.begin, 0);
    cp_async_commit();
  }

  float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[i][x] = dv[i][x] = 0.0f;

  for (int e = at.begin; e < at.end; ++e) {
    const int buf = (e - at.begin) & 1;
    next_stage(e, at.end, buf, load_entry);
    // P^T from S^T = K Q^T; dV += P^T dO.
    float pt[8][4];
    wgmma_tile_nt<T, kHeadDim>(pt, smem.address + Smem::kA, q_tile(buf));
    const int mask = p.tiles.col_masks[e];
    transposed_probabilities<kPacked>(pt, p, lse_of(buf), slots, slots.of(e), mask, keys, my_k, b,
                                      h, t);
    // P^T = 0 in the query groups this warp's key block row does not keep: dV and dK get nothing
    // from them (dS^T = P^T (...) is 0 there too).
    if constexpr (kPacked) zero_outside_keep(pt, warp_column_groups(p, mask, warp, true));
    wgmma_acc_tile<T, kHeadDim>(dv, pt, do_tile(buf));
    // dP^T = V dO^T, dS^T = P^T (dP^T - delta); dK += dS^T Q (times scale when written).
    {
      float dpt[8][4];
      wgmma_tile_nt<T, kHeadDim>(dpt, smem.address + Smem::kB, do_tile(buf));
      transposed_ds(pt, dpt, delta_of(buf), t);
    }
    wgmma_acc_tile<T, kHeadDim>(dk, pt, q_tile(buf));
  }

  finish_dkdv_rows<T, kHeadDim>(p, at, dk, dv, my_keys, warp, g, t);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

template <typename T, int kHeadDim, bool kPacked>
__global__ void __launch_bounds__(SparseTile::kThreads, kHeadDim <= 64 ? 3 : 1)
    sparse_attention_dq_wgmma_kernel(const SparseAttentionDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  using Smem = SparseBwdWgmmaSmem<kHeadDim>;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const auto k_tile = [&](int buf) { return smem.address + Smem::kC + buf * Smem::kTileBytes; };
  const auto v_tile = [&](int buf) { return smem.address + Smem::kD + buf * Smem::kTileBytes; };

  const PieceOf at = decode_piece(p.tiles.rows, p.tiles);
  const int64_t b = at.b, h = at.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int my_r[2] = {warp * 16 + g, warp * 16 + g + 8};

  const EntrySlots<kPacked> slots(p.tiles.row_slots, p.tiles);
  // The tile row's queries, gathered for a packed layout.
  const TileLineTokens<kPacked> queries(slots, p.tiles.row_units, p.tiles, at);
  int64_t my_rows[2];
  queries.outputs(my_rows, slots, my_r, p.len);
  const EntryRowCopier<kHeadDim, kPacked> kv(row_slice<T>(p.k, p.k_stride, b, h),
                                             row_slice<T>(p.v, p.v_stride, b, h), p.tiles.shift);
  auto load_entry = [&](int e, int buf) { kv.copy(k_tile(buf), v_tile(buf), slots, slots.of(e)); };
  if (at.begin < at.end) {
    const RowSlice q_src = row_slice<T>(p.q, p.q_stride, b, h);
    const RowSlice do_src = row_slice<T>(p.dout, p.dout_stride, b, h);
    if constexpr (kPacked) {
      const EntryRowCopier<kHeadDim, true> q_do(q_src, do_src, p.tiles.shift);
      q_do.copy(smem.address + Smem::kA, smem.address + Smem::kB, slots, queries.units);
    } else {
      copy_tile_swizzled<kHeadDim>(smem.address + Smem::kA, q_src.row(queries.first),
                                   q_src.row_bytes);
      copy_tile_swizzled<kHeadDim>(smem.address + Smem::kB, do_src.row(queries.first),
                                   do_src.row_bytes);
    }
    load_entry(at.begin, 0);
    cp_async_commit();
  }

  // The rows' lse in log2 units (+inf for a row without any kept key: P = 0) and delta; L is a
  // multiple of 64, so every row is inside but an empty slot's (my_rows = L).
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = at.begin < at.end && my_rows[r] < p.len;
    lse_log2[r] = lse_log2_of(
        valid ? p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]]
              : kNegInf);
    delta[r] = valid ? p.delta[(b * p.heads + h) * p.len + my_rows[r]] : 0.0f;
  }

  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (int e = at.begin; e < at.end; ++e) {
    const int buf = (e - at.begin) & 1;
    next_stage(e, at.end, buf, load_entry);
    float pr[8][4];
    wgmma_tile_nt<T, kHeadDim>(pr, smem.address + Smem::kA, k_tile(buf));
    const int mask = p.tiles.row_masks[e];
    row_probabilities<kPacked>(pr, p, lse_log2, slots, slots.of(e), mask, queries, my_r, b, h, t);
    // P = 0 in the key groups this warp's query block row does not keep (dS = 0 there).
    if constexpr (kPacked) zero_outside_keep(pr, warp_column_groups(p, mask, warp, false));
    float ds[8][4];  // dP = dO V^T, then dS = P (dP - delta)
    wgmma_tile_nt<T, kHeadDim>(ds, smem.address + Smem::kB, v_tile(buf));
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) ds[j][x] = pr[j][x] * (ds[j][x] - delta[x >> 1]);
    wgmma_acc_tile<T, kHeadDim>(dq, ds, k_tile(buf));  // dQ += dS K
  }

  finish_dq_rows<T, kHeadDim>(p, at, dq, my_rows, warp, g, t);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda

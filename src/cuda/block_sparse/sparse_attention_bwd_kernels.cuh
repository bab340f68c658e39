// The fused block-sparse attention backward on tensor cores, deterministic by construction (no
// floating-point atomics; every output element is owned by one thread of one CTA):
//   1. delta_i = <dO_i, O_i> (sparse_attention_f32.cu, dtype-generic), in the workspace
//   2. sparse_attention_dkdv_kernel: per (piece of a 64-key tile column, batch): dK, dV over the
//      piece's entries of 64 queries (the column list; queries gathered from the entry's slots)
//   3. sparse_attention_dq_kernel: per (piece of a 64-query tile row, batch): dQ over the piece's
//      entries of 64 keys (the row list)
//   4. sparse_attention_sum_kernel: the pieces of split lines, written as fp32 partials, added
//      in piece order
// Both recompute P = exp(S - lse) from the forward's lse; dS is formed in fp32 from fp32 P. CUDA
// layer; instantiated per (dtype, head dim) in generated files.
#pragma once

#include "cuda/block_sparse/sparse_attention_device.cuh"

namespace sciattn::cuda {

// kStages buffers of the streamed tiles (stream_tile, common/device_utils.cuh): two, or one where
// the device's shared memory per block cannot hold two (head dim 128 on sm_86 and sm_89).
template <typename T, int kHeadDim, int kStages = 2>
struct SparseBwdSmem {
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kTile = SparseTile::kSize * kPitch;
  T a[kTile];                             // dK/dV kernel: K of this key tile; dQ kernel: Q
  T b[kTile];                             // dK/dV kernel: V; dQ kernel: dO
  T c[kStages][kTile];                    // the streamed tile: Q (dK/dV) or K (dQ)
  T d[kStages][kTile];                    // the streamed tile: dO (dK/dV) or V (dQ)
  float lse[kStages][SparseTile::kSize];  // lse and delta of the streamed query rows (dK/dV)
  float delta[kStages][SparseTile::kSize];
};

// The head dims whose backward kernels also exist with one stage of streamed tiles.
template <int kHeadDim>
constexpr bool kSparseOneStage = kHeadDim >= 128;

// Fragments kept in registers up to head dim 64; at 128 they are re-read from shared memory
// (the accumulators of dK and dV, or dQ, already take 64-128 registers).
template <int kHeadDim>
constexpr bool kSparseFragsInRegisters = kHeadDim <= 64;

// Up to head dim 64 the backward kernels are held to 168 registers so that three CTAs share an SM
// (their shared memory allows three; at 171+ registers only two fit, which the ldmatrix version
// reached unbounded: 1.37 / 1.17 ms for dK/dV / dQ at 12% occupancy).
template <int kHeadDim>
constexpr int kSparseBwdMinCtas = kHeadDim <= 64 ? 3 : 1;

// Starts the cp.async loads of a CTA's own tile line into smem.a and smem.b (dK/dV kernel: K and
// V of its keys; dQ kernel: Q and dO of its queries): 64 consecutive rows from the line's first
// token, or a packed line's units slot by slot.
template <typename T, int kHeadDim, bool kPacked, typename Smem>
__device__ __forceinline__ void load_own_tile(Smem& smem, const StridedSlice& a_src,
                                              const StridedSlice& b_src,
                                              const EntrySlots<kPacked>& slots,
                                              const TileLineTokens<kPacked>& line,
                                              const SparseAttentionDeviceParams& p) {
  constexpr int kPitch = Smem::kPitch;
  if constexpr (kPacked) {
    load_slot_rows<T, kHeadDim, kPitch>(smem.a, a_src, slots, line.units, p.len, p.dim);
    load_slot_rows<T, kHeadDim, kPitch>(smem.b, b_src, slots, line.units, p.len, p.dim);
  } else {
    load_slice_rows<T, SparseTile::kSize, kHeadDim, kPitch>(smem.a, a_src, line.first, p.len,
                                                            p.dim);
    load_slice_rows<T, SparseTile::kSize, kHeadDim, kPitch>(smem.b, b_src, line.first, p.len,
                                                            p.dim);
  }
}

// P^T (16 keys x 64 queries of a warp) from the raw S^T = K Q^T in pt, in place, with the score
// terms: P^T = exp2(S^T log2(e) - lse log2(e)); a query column's lse comes in log2 units from
// lse_pair_log2 (+inf for a row without any kept key: P = 0 with no per-element test). The
// thread's rows are keys and its columns queries, so the layout bit and the terms are read with
// (query, key) swapped. In a plain entry the query groups outside the warp's `keep` get values
// that nothing reads (the products skip their k-steps); computing them costs less than per-group
// tests, which split the loops into small blocks.
template <bool kPacked>
__device__ __forceinline__ void transposed_probabilities(
    float (&pt)[8][4], const SparseAttentionDeviceParams& p, const float* lse,
    const EntrySlots<kPacked>& slots, const int32_t* entry, int mask,
    const TileLineTokens<kPacked>& keys, const int (&my_k)[2], int64_t b, int64_t h, int t) {
  const float scale_log2 = p.scale * kLog2e;
  const auto queries = slots.span(entry);
  if (tile_is_plain(p, queries.first, queries.last, keys.last)) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lse2 = lse_pair_log2(lse, j, t);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        pt[j][x] = fast_exp2(fmaf(pt[j][x], scale_log2, (x & 1) ? -lse2.y : -lse2.x));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lse2 = lse_pair_log2(lse, j, t);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int kc = my_k[x >> 1], qc = j * 8 + 2 * t + (x & 1);
        // An empty key slot (-1) has its mask bits clear, so element_kept removes it.
        const int64_t i = slots.token(entry, qc), jj = keys.token(slots, kc);
        const float s =
            element_kept(p, mask, qc, kc, i, jj) ? score_of(p, pt[j][x], b, h, i, jj) : kNegInf;
        pt[j][x] = fast_exp2(fmaf(s, kLog2e, (x & 1) ? -lse2.y : -lse2.x));
      }
    }
  }
}

// dS^T = P^T (dP^T - delta) in place (pt), delta per query column.
__device__ __forceinline__ void transposed_ds(float (&pt)[8][4], const float (&dpt)[8][4],
                                              const float* delta, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) pt[j][x] *= dpt[j][x] - delta[j * 8 + 2 * t + (x & 1)];
}

// P (16 queries x 64 keys of a warp) from the raw S = Q K^T in pr, in place, with the score terms
// and the rows' lse in log2 units (+inf: P = 0). In a plain entry the key groups outside `keep`
// get values that nothing reads (the dQ product skips their k-steps).
template <bool kPacked>
__device__ __forceinline__ void row_probabilities(
    float (&pr)[8][4], const SparseAttentionDeviceParams& p, const float (&lse_log2)[2],
    const EntrySlots<kPacked>& slots, const int32_t* entry, int mask,
    const TileLineTokens<kPacked>& queries, const int (&my_r)[2], int64_t b, int64_t h, int t) {
  const float scale_log2 = p.scale * kLog2e;
  const auto keys = slots.span(entry);
  if (tile_is_plain(p, queries.first, queries.last, keys.last)) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        pr[j][x] = fast_exp2(fmaf(pr[j][x], scale_log2, -lse_log2[x >> 1]));
      }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int r = my_r[x >> 1], c = j * 8 + 2 * t + (x & 1);
        // An empty query slot (-1) has its mask bits clear, so element_kept removes it.
        const int64_t i = queries.token(slots, r), jj = slots.token(entry, c);
        const float s =
            element_kept(p, mask, r, c, i, jj) ? score_of(p, pr[j][x], b, h, i, jj) : kNegInf;
        pr[j][x] = fast_exp2(fmaf(s, kLog2e, -lse_log2[x >> 1]));
      }
    }
  }
}

// dK (times scale) and dV of a key tile's 16 rows per warp: to the tensors, or, for a piece of
// a split column, to its fp32 partial slot.
template <typename T, int kHeadDim>
__device__ __forceinline__ void finish_dkdv_rows(
    const SparseAttentionDeviceParams& p, const PieceOf& at, const float (&dk)[kHeadDim / 8][4],
    const float (&dv)[kHeadDim / 8][4], const int64_t (&my_keys)[2], int warp, int g, int t) {
  constexpr int kOutTiles = kHeadDim / 8;
  const int64_t b = at.b, h = at.h;
  if (at.slot >= 0) {
    const int64_t slot = at.partial(p.tiles.cols.slots) * int64_t{SparseTile::kSize} * kHeadDim;
    store_partial_rows<kHeadDim>(dk, p.scale, p.dk_partial + slot, warp, g, t);
    store_partial_rows<kHeadDim>(dv, 1.0f, p.dv_partial + slot, warp, g, t);
    return;
  }
  const float dk_factor[2] = {p.scale, p.scale}, dv_factor[2] = {1.0f, 1.0f};
  store_slice_rows<T, kOutTiles>(dk, dk_factor, p.dk, p.dk_stride, b, h, my_keys, p.len, p.dim, t,
                                 p.grads_paired);
  store_slice_rows<T, kOutTiles>(dv, dv_factor, p.dv, p.dv_stride, b, h, my_keys, p.len, p.dim, t,
                                 p.grads_paired);
}

// dQ (times scale) of a query tile's 16 rows per warp: to the tensor or to a split row's partial.
template <typename T, int kHeadDim>
__device__ __forceinline__ void finish_dq_rows(const SparseAttentionDeviceParams& p,
                                               const PieceOf& at,
                                               const float (&dq)[kHeadDim / 8][4],
                                               const int64_t (&my_rows)[2], int warp, int g,
                                               int t) {
  constexpr int kOutTiles = kHeadDim / 8;
  const int64_t b = at.b, h = at.h;
  if (at.slot >= 0) {
    const int64_t slot = at.partial(p.tiles.rows.slots) * int64_t{SparseTile::kSize} * kHeadDim;
    store_partial_rows<kHeadDim>(dq, p.scale, p.dq_partial + slot, warp, g, t);
    return;
  }
  const float dq_factor[2] = {p.scale, p.scale};
  store_slice_rows<T, kOutTiles>(dq, dq_factor, p.dq, p.dq_stride, b, h, my_rows, p.len, p.dim, t,
                                 p.grads_paired);
}

template <typename T, int kHeadDim, bool kPacked, int kStages = 2>
__global__ void __launch_bounds__(SparseTile::kThreads, kSparseBwdMinCtas<kHeadDim>)
    sparse_attention_dkdv_kernel(const SparseAttentionDeviceParams p) {
  using Smem = SparseBwdSmem<T, kHeadDim, kStages>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kHeadDim / 16;
  constexpr int kOutTiles = kHeadDim / 8;
  constexpr bool kRegs = kSparseFragsInRegisters<kHeadDim>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  const PieceOf at = decode_piece(p.tiles.cols, p.tiles);
  const int64_t b = at.b, h = at.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int my_k[2] = {warp * 16 + g, warp * 16 + g + 8};  // keys inside the tile

  // The column list's entries: slots of query units (common/sparse_attention_tiles.h); the tile
  // column's own keys, gathered like an entry's for a packed layout.
  const EntrySlots<kPacked> slots(p.tiles.col_slots, p.tiles);
  const TileLineTokens<kPacked> keys(slots, p.tiles.col_units, p.tiles, at);
  int64_t my_keys[2];
  keys.outputs(my_keys, slots, my_k, p.len);
  const StridedSlice q_src = slice_bh<T>(p.q, p.q_stride, p.vec_q, b, h, p.lean_tiles);
  const StridedSlice do_src = slice_bh<T>(p.dout, p.dout_stride, p.vec_dout, b, h, p.lean_tiles);
  if (at.begin < at.end) {
    const StridedSlice k_src = slice_bh<T>(p.k, p.k_stride, p.vec_k, b, h, p.lean_tiles);
    const StridedSlice v_src = slice_bh<T>(p.v, p.v_stride, p.vec_v, b, h, p.lean_tiles);
    load_own_tile<T, kHeadDim, kPacked>(smem, k_src, v_src, slots, keys, p);
    const int32_t* first = slots.of(at.begin);
    load_slot_rows<T, kHeadDim, kPitch>(smem.c[0], q_src, slots, first, p.len, p.dim);
    load_slot_rows<T, kHeadDim, kPitch>(smem.d[0], do_src, slots, first, p.len, p.dim);
    load_sparse_row_stats(smem.lse[0], smem.delta[0], p, b, h, slots, first);
    cp_async_commit();
  }

  uint32_t k_frag[kRegs ? kSteps : 1][4], v_frag[kRegs ? kSteps : 1][4];
  float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[i][x] = dv[i][x] = 0.0f;

  for (int e = at.begin; e < at.end; ++e) {
    const int32_t* entry = slots.of(e);  // the entry's query units
    const int mask = p.tiles.col_masks[e];
    const int buf = stream_tile<kStages>(e - at.begin, at.end - at.begin, [&](int to, int64_t i) {
      const int32_t* next = slots.of(at.begin + static_cast<int>(i));
      load_slot_rows<T, kHeadDim, kPitch>(smem.c[to], q_src, slots, next, p.len, p.dim);
      load_slot_rows<T, kHeadDim, kPitch>(smem.d[to], do_src, slots, next, p.len, p.dim);
      load_sparse_row_stats(smem.lse[to], smem.delta[to], p, b, h, slots, next);
    });
    __syncthreads();
    const T* kw = smem.a + warp * 16 * kPitch;
    const T* vw = smem.b + warp * 16 * kPitch;
    if constexpr (kRegs) {
      if (e == at.begin) {
        load_a_frags<T, kSteps, kPitch>(k_frag, kw, g, t);
        load_a_frags<T, kSteps, kPitch>(v_frag, vw, g, t);
      }
    }
    const T* q_tile = smem.c[buf];
    const T* do_tile = smem.d[buf];
    const float* lse = smem.lse[buf];
    const float* delta = smem.delta[buf];

    // A warp whose 16 keys have no layout sub-block in this tile gets nothing from it; the others
    // skip the query sub-blocks they lack.
    const uint32_t keep = warp_column_groups(p, mask, warp, /*rows_are_keys=*/true);
    if (keep != 0) {
      // P^T (this warp's 16 keys x 64 queries) from S^T = K Q^T and the score terms. The thread's
      // rows are keys and its columns queries, so the layout bit and the terms are read with
      // (query, key) swapped.
      float pt[8][4];
      sparse_mma_rows_t<T, kSteps, kPitch, kHeadDim, kRegs>(pt, k_frag, kw, q_tile, g, t, keep);
      transposed_probabilities<kPacked>(pt, p, lse, slots, entry, mask, keys, my_k, b, h, t);
      // dV += P^T dO.
      mma_acc_tile<T, kOutTiles, kPitch, kSplitKeptLoops<kHeadDim>>(dv, pt, do_tile, g, t, keep);
      // dP^T = V dO^T, then dS^T = P^T (dP^T - delta), in place.
      {
        float ds[8][4];
        sparse_mma_rows_t<T, kSteps, kPitch, kHeadDim, kRegs>(ds, v_frag, vw, do_tile, g, t, keep);
        transposed_ds(pt, ds, delta, t);
      }
      // dK += dS^T Q (times scale when written).
      mma_acc_tile<T, kOutTiles, kPitch, kSplitKeptLoops<kHeadDim>>(dk, pt, q_tile, g, t, keep);
    }
    __syncthreads();  // the buffers of this tile are refilled next iteration
  }

  finish_dkdv_rows<T, kHeadDim>(p, at, dk, dv, my_keys, warp, g, t);
}

template <typename T, int kHeadDim, bool kPacked, int kStages = 2>
__global__ void __launch_bounds__(SparseTile::kThreads, kSparseBwdMinCtas<kHeadDim>)
    sparse_attention_dq_kernel(const SparseAttentionDeviceParams p) {
  using Smem = SparseBwdSmem<T, kHeadDim, kStages>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kHeadDim / 16;
  constexpr int kOutTiles = kHeadDim / 8;
  constexpr bool kRegs = kSparseFragsInRegisters<kHeadDim>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  const PieceOf at = decode_piece(p.tiles.rows, p.tiles);
  const int64_t b = at.b, h = at.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int my_r[2] = {warp * 16 + g, warp * 16 + g + 8};

  // The row list's entries: slots of key units (common/sparse_attention_tiles.h); the tile row's
  // own queries, gathered like an entry's for a packed layout.
  const EntrySlots<kPacked> slots(p.tiles.row_slots, p.tiles);
  const TileLineTokens<kPacked> queries(slots, p.tiles.row_units, p.tiles, at);
  int64_t my_rows[2];
  queries.outputs(my_rows, slots, my_r, p.len);
  const StridedSlice k_src = slice_bh<T>(p.k, p.k_stride, p.vec_k, b, h, p.lean_tiles);
  const StridedSlice v_src = slice_bh<T>(p.v, p.v_stride, p.vec_v, b, h, p.lean_tiles);
  if (at.begin < at.end) {
    const StridedSlice q_src = slice_bh<T>(p.q, p.q_stride, p.vec_q, b, h, p.lean_tiles);
    const StridedSlice do_src = slice_bh<T>(p.dout, p.dout_stride, p.vec_dout, b, h, p.lean_tiles);
    load_own_tile<T, kHeadDim, kPacked>(smem, q_src, do_src, slots, queries, p);
    const int32_t* first = slots.of(at.begin);
    load_slot_rows<T, kHeadDim, kPitch>(smem.c[0], k_src, slots, first, p.len, p.dim);
    load_slot_rows<T, kHeadDim, kPitch>(smem.d[0], v_src, slots, first, p.len, p.dim);
    cp_async_commit();
  }

  // The rows' lse in log2 units: +inf for a padded row or one without any kept key (P = 0).
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = my_rows[r] < p.len && at.begin < at.end;
    lse_log2[r] = lse_log2_of(
        valid ? p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]]
              : kNegInf);
    delta[r] = valid ? p.delta[(b * p.heads + h) * p.len + my_rows[r]] : 0.0f;
  }

  uint32_t q_frag[kRegs ? kSteps : 1][4], do_frag[kRegs ? kSteps : 1][4];
  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (int e = at.begin; e < at.end; ++e) {
    const int32_t* entry = slots.of(e);  // the entry's key units
    const int mask = p.tiles.row_masks[e];
    const int buf = stream_tile<kStages>(e - at.begin, at.end - at.begin, [&](int to, int64_t i) {
      const int32_t* next = slots.of(at.begin + static_cast<int>(i));
      load_slot_rows<T, kHeadDim, kPitch>(smem.c[to], k_src, slots, next, p.len, p.dim);
      load_slot_rows<T, kHeadDim, kPitch>(smem.d[to], v_src, slots, next, p.len, p.dim);
    });
    __syncthreads();
    const T* qw = smem.a + warp * 16 * kPitch;
    const T* dow = smem.b + warp * 16 * kPitch;
    if constexpr (kRegs) {
      if (e == at.begin) {
        load_a_frags<T, kSteps, kPitch>(q_frag, qw, g, t);
        load_a_frags<T, kSteps, kPitch>(do_frag, dow, g, t);
      }
    }
    // As in the forward: a warp skips the tile when its 16 rows have no sub-block in it, and the
    // key sub-blocks it lacks otherwise.
    const uint32_t keep = warp_column_groups(p, mask, warp, /*rows_are_keys=*/false);
    if (keep != 0) {
      float pr[8][4];
      sparse_mma_rows_t<T, kSteps, kPitch, kHeadDim, kRegs>(pr, q_frag, qw, smem.c[buf], g, t,
                                                            keep);
      row_probabilities<kPacked>(pr, p, lse_log2, slots, entry, mask, queries, my_r, b, h, t);
      {
        float ds[8][4];  // dP = dO V^T, then dS = P (dP - delta)
        sparse_mma_rows_t<T, kSteps, kPitch, kHeadDim, kRegs>(ds, do_frag, dow, smem.d[buf], g, t,
                                                              keep);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int x = 0; x < 4; ++x) ds[j][x] = pr[j][x] * (ds[j][x] - delta[x >> 1]);
        mma_acc_tile<T, kOutTiles, kPitch, kSplitKeptLoops<kHeadDim>>(dq, ds, smem.c[buf], g, t,
                                                                      keep);  // dQ += dS K
      }
    }
    __syncthreads();
  }

  finish_dq_rows<T, kHeadDim>(p, at, dq, my_rows, warp, g, t);
}

// Where the sum kernel reads the partials of one gradient and writes its sum.
struct SparseSumTarget {
  const float* partial;  // [B, work.slots, 64 x kHeadDim]
  void* out;             // [B, H, L, D], unit stride on D
  int64_t stride[4];
};

// The pieces of the split lines of `work`, added in piece order:
// SplitLineChunk<kHeadDim>::kCtasPerLine CTAs per (split line, batch);
// out[b, h, tile * 64 + r, d] = sum over the line's pieces of partial[slot][r][d].
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(SparseTile::kThreads)
    sparse_attention_sum_kernel(const SparseAttentionDeviceParams p,
                                const BlockSparseDeviceIndex::TileWork work,
                                const SparseSumTarget target) {
  const SplitLineChunk<kHeadDim> at(work, p.tiles);
  if (at.row >= p.len) return;
  constexpr int64_t kSlot = int64_t{SparseTile::kSize} * kHeadDim;
  const float* first = target.partial + at.first_slot * kSlot + at.tile_row * kHeadDim + at.d;
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int q = 0; q < at.pieces; ++q) {
    const float4 x = *reinterpret_cast<const float4*>(first + q * kSlot);
    sum[0] += x.x;
    sum[1] += x.y;
    sum[2] += x.z;
    sum[3] += x.w;
  }
  T* out = static_cast<T*>(target.out) + at.b * target.stride[0] + at.h * target.stride[1];
  store_four(out + at.row * target.stride[2], at.d, p.dim, sum);
}

}  // namespace sciattn::cuda

// The fused block-sparse attention forward on tensor cores (m16n8k16, fp32 accumulate): one CTA
// per (piece of a 64-query tile row, batch), four warps of 16 query rows, streaming over the
// piece's entries (64 keys each, gathered from their slots) with an online softmax. K/V tiles are
// double-buffered with cp.async. A whole tile row writes O and the fp32 log-sum-exp; a piece of a
// split row writes its unnormalised O, row maxima and row sums to an fp32 slot, and the combine
// kernel merges the pieces in order. CUDA layer; instantiated per (dtype, head dim) in generated
// files.
#pragma once

#include "cuda/block_sparse/sparse_attention_device.cuh"

namespace sciattn::cuda {

template <typename T, int kHeadDim>
struct SparseFwdSmem {
  // Rows padded by 8 elements (16 bytes): a warp's fragment reads walk 8 rows and fall in
  // different banks, and every row start stays 16-byte aligned for cp.async.
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kTile = SparseTile::kSize * kPitch;
  T q[kTile];
  T k[2][kTile];
  T v[2][kTile];
};

// The scores of a 16 x 64 warp tile from its raw dot products s (this thread's m16n8 accumulator
// elements), with their terms; removed elements (outside L, the layout's blocks, the causal rule)
// become -inf.
template <bool kPacked>
__device__ __forceinline__ void tile_scores(float (&s)[SparseTile::kSize / 8][4],
                                            const SparseAttentionDeviceParams& p, uint32_t keep,
                                            const EntrySlots<kPacked>& slots, const int32_t* entry,
                                            int mask, const TileLineTokens<kPacked>& queries,
                                            const int (&my_r)[2], int64_t b, int64_t h, int t) {
  constexpr int kScoreTiles = SparseTile::kSize / 8;
  const auto keys = slots.span(entry);
  if (tile_is_plain(p, queries.first, queries.last, keys.last)) {
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) s[j][x] *= p.scale;
    // -inf in the column groups outside `keep` (an entry of blocks of 16 or 32), which the
    // row maxima and sums below must not see. Setting them costs less than skipping their
    // exponentials: per-group tests split the loops below into small blocks (measured 5-9%
    // slower at blocks 16 and 64).
    if (keep != 0xFFu) {
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j)
        if (((keep >> j) & 1u) == 0)
#pragma unroll
          for (int x = 0; x < 4; ++x) s[j][x] = kNegInf;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int r = my_r[x >> 1], c = j * 8 + 2 * t + (x & 1);
        // An empty query slot (-1) has its mask bits clear, so element_kept removes it.
        const int64_t i = queries.token(slots, r), jj = slots.token(entry, c);
        s[j][x] = element_kept(p, mask, r, c, i, jj) ? score_of(p, s[j][x], b, h, i, jj) : kNegInf;
      }
  }
}

// One key tile's step of the online softmax: the tile's row maxima, the running maxima and sums
// rescaled, s turned into the tile's probabilities exp(s - max) * 2^-prob_shift (bf16's guard
// against an fp32 overflow of O, cuda/common/probability_shift.h), and O rescaled.
template <int kOutTiles>
__device__ __forceinline__ void online_softmax_step(float (&s)[SparseTile::kSize / 8][4],
                                                    float prob_shift, float (&row_max)[2],
                                                    float (&row_sum)[2],
                                                    float (&o_acc)[kOutTiles][4]) {
  constexpr int kScoreTiles = SparseTile::kSize / 8;
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int j = 0; j < kScoreTiles; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) tile_max[x >> 1] = fmaxf(tile_max[x >> 1], s[j][x]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The four threads of a row (t = 0..3) hold its 64 columns between them.
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
  }
  float rescale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float new_max = fmaxf(row_max[r], tile_max[r]);
    // While every key so far is removed the max stays -inf; shift by 0 so that exp of the -inf
    // scores gives 0 instead of exp(-inf - -inf) = NaN.
    const float shift_log2 = new_max == kNegInf ? 0.0f : new_max * kLog2e;
    rescale[r] = fast_exp2(row_max[r] * kLog2e - shift_log2);
    row_max[r] = new_max;
    row_sum[r] *= rescale[r];
    const float p_shift_log2 = shift_log2 + prob_shift;
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
      s[j][2 * r] = fast_exp2(fmaf(s[j][2 * r], kLog2e, -p_shift_log2));
      s[j][2 * r + 1] = fast_exp2(fmaf(s[j][2 * r + 1], kLog2e, -p_shift_log2));
      row_sum[r] += s[j][2 * r] + s[j][2 * r + 1];
    }
  }
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) {
    o_acc[i][0] *= rescale[0];
    o_acc[i][1] *= rescale[0];
    o_acc[i][2] *= rescale[1];
    o_acc[i][3] *= rescale[1];
  }
}

// After the last key tile: a whole row writes O and the fp32 log-sum-exp, a piece of a split row
// its unnormalised O and row statistics for the combine kernel.
template <typename T, int kHeadDim>
__device__ __forceinline__ void finish_forward_rows(
    const SparseAttentionDeviceParams& p, const PieceOf& at, float (&o_acc)[kHeadDim / 8][4],
    float (&row_max)[2], float (&row_sum)[2], const int (&my_r)[2], const int64_t (&my_rows)[2],
    int warp, int g, int t) {
  constexpr int kOutTiles = kHeadDim / 8;
  const int64_t b = at.b, h = at.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  if (at.slot >= 0) {
    // A piece of a split row: the unnormalised O and the row statistics, for the combine kernel.
    float* slot =
        p.fwd_partial + at.partial(p.tiles.rows.slots) *
                            (int64_t{SparseTile::kSize} * kHeadDim + 2 * SparseTile::kSize);
    store_partial_rows<kHeadDim>(o_acc, 1.0f, slot, warp, g, t);
    if (t == 0) {
      float* stats = slot + SparseTile::kSize * kHeadDim;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        stats[my_r[r]] = row_max[r];
        stats[SparseTile::kSize + my_r[r]] = row_sum[r];
      }
    }
    return;
  }
  // A whole row: a row without any unmasked key has sum 0 and gets output 0, lse -inf. The sum
  // is at least 2^-prob_shift otherwise (the row's largest term is exp(0) 2^-prob_shift,
  // prob_shift <= 62), so the fast reciprocal and log are accurate to ~2^-22; a row with a NaN
  // score has a NaN sum (fmaxf drops NaN from the max,
  // but exp of the score does not), which must give NaN: the tests are != 0, not > 0.
  const float inv[2] = {row_sum[0] != 0.0f ? __fdividef(1.0f, row_sum[0]) : 0.0f,
                        row_sum[1] != 0.0f ? __fdividef(1.0f, row_sum[1]) : 0.0f};
  store_slice_rows<T, kOutTiles>(o_acc, inv, p.out, p.out_stride, b, h, my_rows, p.len, p.dim, t,
                                 p.out_paired);
  if (p.lse != nullptr && t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (my_rows[r] >= p.len) continue;
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]] =
          row_sum[r] != 0.0f ? row_max[r] + fmaf(p.prob_shift_log2, kLn2, __logf(row_sum[r]))
                             : kNegInf;
    }
  }
}

// Up to head dim 64 the kernel fits in 128 registers, so four CTAs share an SM (three at 129+,
// the shared memory allows four).
template <typename T, int kHeadDim, bool kPacked>
__global__ void __launch_bounds__(SparseTile::kThreads, kHeadDim <= 64 ? 4 : 1)
    sparse_attention_fwd_kernel(const SparseAttentionDeviceParams p) {
  using Smem = SparseFwdSmem<T, kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kHeadDim / 16;               // k-steps of S = Q K^T
  constexpr int kScoreTiles = SparseTile::kSize / 8;  // n8 tiles of a score row block
  constexpr int kOutTiles = kHeadDim / 8;             // n8 tiles of O
  // At head dim 128 Q's fragments are re-read from shared memory for each key tile instead of
  // living in 32 registers across the loop, which keeps the kernel free of spills.
  constexpr bool kQInRegisters = kHeadDim <= 64;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  const PieceOf at = decode_piece(p.tiles.rows, p.tiles);
  const int64_t b = at.b, h = at.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int my_r[2] = {warp * 16 + g, warp * 16 + g + 8};  // rows inside the tile

  // The row list's entries: slots of key units (common/sparse_attention_tiles.h); the tile row's
  // own queries, gathered like an entry's for a packed layout.
  const EntrySlots<kPacked> slots(p.tiles.row_slots, p.tiles);
  const TileLineTokens<kPacked> queries(slots, p.tiles.row_units, p.tiles, at);
  int64_t my_rows[2];
  queries.outputs(my_rows, slots, my_r, p.len);

  const StridedSlice q_src = slice_bh<T>(p.q, p.q_stride, p.vec_q, b, h, p.lean_tiles);
  const StridedSlice k_src = slice_bh<T>(p.k, p.k_stride, p.vec_k, b, h, p.lean_tiles);
  const StridedSlice v_src = slice_bh<T>(p.v, p.v_stride, p.vec_v, b, h, p.lean_tiles);

  float row_max[2] = {kNegInf, kNegInf};  // running max of the (natural-unit) scores
  float row_sum[2] = {0.0f, 0.0f};        // this thread's share of the running sum
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
  uint32_t q_frag[kQInRegisters ? kSteps : 1][4];

  if (at.begin < at.end) {
    if constexpr (kPacked) {
      load_slot_rows<T, kHeadDim, kPitch>(smem.q, q_src, slots, queries.units, p.len, p.dim);
    } else {
      load_slice_rows<T, SparseTile::kSize, kHeadDim, kPitch>(smem.q, q_src, queries.first, p.len,
                                                              p.dim);
    }
    const int32_t* first = slots.of(at.begin);
    load_slot_rows<T, kHeadDim, kPitch>(smem.k[0], k_src, slots, first, p.len, p.dim);
    load_slot_rows<T, kHeadDim, kPitch>(smem.v[0], v_src, slots, first, p.len, p.dim);
    cp_async_commit();
  }

  for (int e = at.begin; e < at.end; ++e) {
    const int buf = (e - at.begin) & 1;
    const int32_t* entry = slots.of(e);  // the entry's key units
    const int mask = p.tiles.row_masks[e];
    // Start the next tile's K and V into the other buffer (freed by the barrier that ended the
    // previous iteration), then wait for this tile's.
    if (e + 1 < at.end) {
      const int32_t* next = slots.of(e + 1);
      load_slot_rows<T, kHeadDim, kPitch>(smem.k[buf ^ 1], k_src, slots, next, p.len, p.dim);
      load_slot_rows<T, kHeadDim, kPitch>(smem.v[buf ^ 1], v_src, slots, next, p.len, p.dim);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* qw = smem.q + warp * 16 * kPitch;
    if constexpr (kQInRegisters) {
      if (e == at.begin) load_a_frags<T, kSteps, kPitch>(q_frag, qw, g, t);
    }

    // A warp whose 16 rows have no layout sub-block in this tile adds nothing (every score is
    // removed): it skips the tile, and the others skip the sub-blocks they lack.
    const uint32_t keep = warp_column_groups(p, mask, warp, /*rows_are_keys=*/false);
    if (keep != 0) {
      // S = Q K^T for this warp's 16 rows and the tile's 64 keys.
      static_assert(kScoreTiles == 8, "the MMA helpers work on 16 x 64 score tiles");
      float s[kScoreTiles][4];
      sparse_mma_rows_t<T, kSteps, kPitch, kHeadDim, kQInRegisters>(s, q_frag, qw, smem.k[buf], g,
                                                                    t, keep);
      tile_scores<kPacked>(s, p, keep, slots, entry, mask, queries, my_r, b, h, t);
      online_softmax_step<kOutTiles>(s, p.prob_shift_log2, row_max, row_sum, o_acc);
      // O += P V (pairs of n8 tiles outside `keep` hold P = 0 and are skipped).
      mma_acc_tile<T, kOutTiles, kPitch, kSplitKeptLoops<kHeadDim>>(o_acc, s, smem.v[buf], g, t,
                                                                    keep);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  finish_forward_rows<T, kHeadDim>(p, at, o_acc, row_max, row_sum, my_r, my_rows, warp, g, t);
}

// Merges the pieces of the split rows, in piece order: SplitLineChunk<kHeadDim>::kCtasPerLine
// CTAs per (split row, batch).
//   M = max_p m_p,  sum = sum_p l_p exp(m_p - M),  O = sum_p O_p exp(m_p - M) / sum,
//   lse = M + log(sum) + prob_shift ln 2  (O = 0 and lse = -inf when sum is 0; the pieces' sums
//   carry the factor 2^-prob_shift of their probabilities, which O's ratio cancels).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(SparseTile::kThreads)
    sparse_attention_fwd_combine_kernel(const SparseAttentionDeviceParams p) {
  const SplitLineChunk<kHeadDim> at(p.tiles.rows, p.tiles);
  if (at.row >= p.len) return;
  constexpr int64_t kOut = int64_t{SparseTile::kSize} * kHeadDim;
  constexpr int64_t kSlot = kOut + 2 * SparseTile::kSize;
  const float* first = p.fwd_partial + at.first_slot * kSlot;
  const int r = at.tile_row;
  // A piece with a NaN score has max -inf (fmaxf drops NaN) but a NaN sum: merge unless every
  // piece's sum is 0 (a fully masked row), so that the NaN reaches O and lse.
  float m = kNegInf;
  bool any_key = false;
  for (int q = 0; q < at.pieces; ++q) {
    m = fmaxf(m, first[q * kSlot + kOut + r]);
    any_key = any_key || first[q * kSlot + kOut + SparseTile::kSize + r] != 0.0f;
  }
  float sum = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (any_key) {
    for (int q = 0; q < at.pieces; ++q) {
      const float* slot = first + q * kSlot;
      const float f = exp2f((slot[kOut + r] - m) * kLog2e);
      sum += slot[kOut + SparseTile::kSize + r] * f;
      const float4 x = *reinterpret_cast<const float4*>(slot + r * kHeadDim + at.d);
      o[0] += x.x * f;
      o[1] += x.y * f;
      o[2] += x.z * f;
      o[3] += x.w * f;
    }
  }
  const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;
  for (float& x : o) x *= inv;
  T* out = static_cast<T*>(p.out) + at.b * p.out_stride[0] + at.h * p.out_stride[1];
  store_four(out + at.row * p.out_stride[2], at.d, p.dim, o);
  if (at.d == 0 && p.lse != nullptr) {
    p.lse[at.b * p.lse_stride[0] + at.h * p.lse_stride[1] + at.row * p.lse_stride[2]] =
        sum != 0.0f ? m + fmaf(p.prob_shift_log2, kLn2, logf(sum)) : kNegInf;
  }
}

}  // namespace sciattn::cuda

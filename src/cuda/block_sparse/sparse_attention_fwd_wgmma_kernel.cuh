// The fused block-sparse attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), for
// aligned tensors of the instantiated head dim 64 or 128 with L a multiple of 64 (the host's
// `wgmma_tiles`), over list entries of either kind (EntrySlots): whole 64-token tiles (layout
// blocks of 64 and more) or packed entries of blocks of 16 and 32, whose K / V rows are gathered
// slot by slot (EntryRowCopier) and whose warps keep their own block row's column groups
// (tile_scores sets the others to -inf). One CTA per (piece of a 64-query tile row, batch) as
// sparse_attention_fwd_kernel, whose score, online-softmax and output code it shares; what differs
// is how the two products run: the four warps issue them together as one warpgroup, S = Q K^T as
// head dim / 16 m64n64k16 steps reading Q and K straight from shared memory, and O += P V as four
// m64nDk16 steps with P from registers, instead of per-warp mma.sync m16n8k16 with ldmatrix
// fragment loads (at head dim 128: 128 MMAs and 72 ldmatrix per warp and tile become 12
// instructions). Tiles are stored in the 128-byte swizzled layout (cuda/common/wgmma.cuh). CUDA
// layer.
#pragma once

#include "cuda/block_sparse/sparse_attention_fwd_kernel.cuh"
#include "cuda/block_sparse/sparse_attention_wgmma_entries.cuh"
#include "cuda/common/wgmma.cuh"

namespace sciattn::cuda {

// Its shared memory: Q, then K and V double-buffered, each tile on a 1024-byte boundary (the
// dynamic shared memory is rounded up to one inside the kernel, hence the extra 1024 bytes).
template <typename T, int kHeadDim>
struct SparseFwdWgmmaSmem {
  static constexpr uint32_t kTileBytes = SparseTile::kSize * kHeadDim * 2;
  static_assert(kTileBytes % 1024 == 0, "every tile must start on a swizzle-pattern boundary");
  static constexpr uint32_t kQ = 0, kK = kTileBytes, kV = 3 * kTileBytes;
  static constexpr size_t kLaunchBytes = 5 * size_t{kTileBytes} + 1024;
};

template <typename T, int kHeadDim, bool kPacked>
__global__ void __launch_bounds__(SparseTile::kThreads, kHeadDim <= 64 ? 4 : 2)
    sparse_attention_fwd_wgmma_kernel(const SparseAttentionDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  static_assert(SparseTile::kThreads == kWgmmaThreads && SparseTile::kSize == kWgmmaRows,
                "one warpgroup over 64-row tiles");
  using Smem = SparseFwdWgmmaSmem<T, kHeadDim>;
  constexpr int kScoreTiles = SparseTile::kSize / 8;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = aligned_smem(smem_raw).address;
  const uint32_t q_tile = base + Smem::kQ;
  // Buffer `buf` of K and V (arithmetic, not an array a runtime index would put on the stack).
  const auto k_tile = [&](int buf) { return base + Smem::kK + buf * Smem::kTileBytes; };
  const auto v_tile = [&](int buf) { return base + Smem::kV + buf * Smem::kTileBytes; };

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

  const RowSlice q_src = row_slice<T>(p.q, p.q_stride, b, h);
  const EntryRowCopier<kHeadDim, kPacked> kv(row_slice<T>(p.k, p.k_stride, b, h),
                                             row_slice<T>(p.v, p.v_stride, b, h), p.tiles.shift);
  auto load_kv = [&](int e, int buf) { kv.copy(k_tile(buf), v_tile(buf), slots, slots.of(e)); };

  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;

  if (at.begin < at.end) {
    if constexpr (kPacked) {
      const EntryRowCopier<kHeadDim, true> q_copy(q_src, q_src, p.tiles.shift);
      q_copy.template copy</*kBoth=*/false>(q_tile, q_tile, slots, queries.units);
    } else {
      copy_tile_swizzled<kHeadDim>(q_tile, q_src.row(queries.first), q_src.row_bytes);
    }
    load_kv(at.begin, 0);
    cp_async_commit();
  }

  for (int e = at.begin; e < at.end; ++e) {
    const int buf = (e - at.begin) & 1;
    next_stage(e, at.end, buf, load_kv);

    float s[kScoreTiles][4];
    wgmma_tile_nt<T, kHeadDim>(s, q_tile, k_tile(buf));

    // A packed entry: this warp's 16 rows lie in one block row, which keeps some of the
    // entry's column groups (none: every score -inf, P = 0).
    const int mask = p.tiles.row_masks[e];
    const uint32_t keep = kPacked ? warp_column_groups(p, mask, warp, false) : 0xFFu;
    tile_scores<kPacked>(s, p, keep, slots, slots.of(e), mask, queries, my_r, b, h, t);
    online_softmax_step<kOutTiles>(s, p.prob_shift_log2, row_max, row_sum, o_acc);

    // O += P V, P (rounded to T) as the A operand straight from the score registers.
    wgmma_acc_tile<T, kHeadDim>(o_acc, s, v_tile(buf));
  }

  finish_forward_rows<T, kHeadDim>(p, at, o_acc, row_max, row_sum, my_r, my_rows, warp, g, t);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda

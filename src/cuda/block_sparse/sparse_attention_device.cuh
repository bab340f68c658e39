// Device helpers of the fused block-sparse attention kernels: strided tile loads, the score terms
// (rpe, masks, causal, the layout's sub-block mask) and the row statistics. CUDA layer; the MMA
// and fragment helpers are the ones the Evoformer kernels use too (src/cuda/common).
#pragma once

#include "cuda/block_sparse/sparse_attention_params.h"
#include "cuda/common/accumulator_row_store.cuh"
#include "cuda/common/device_utils.cuh"
#include "cuda/common/mma_tiles.cuh"    // load_a_frags, mma_rows_t, mma_acc_tile
#include "cuda/common/tile_copies.cuh"  // copy_tile_lean

namespace sciattn::cuda {

struct SparseTile {
  static constexpr int kSize = 64;  // rows and columns of a kernel tile (SparseAttentionTiles)
  static constexpr int kWarps = 4;  // 16 rows each
  static constexpr int kThreads = kWarps * 32;
};

// The (b, h) slice of a [B, H, L, D] tensor: element (row, d) is at base[row * row_stride +
// d * col_stride]. DeepSpeed's pre-transposed key has col_stride != 1 (and no 16-byte copies).
struct StridedSlice {
  const void* base;
  int64_t row_stride, col_stride;
  int vec;
  int lean;  // whole tiles may take the lean copy (SparseAttentionDeviceParams::lean_tiles)
};

template <typename T>
__device__ __forceinline__ StridedSlice slice_bh(const void* data, const int64_t stride[4], int vec,
                                                 int64_t b, int64_t h, int lean) {
  return {static_cast<const T*>(data) + b * stride[0] + h * stride[1], stride[2], stride[3], vec,
          lean};
}

// Starts loading rows [row0, row0 + kRows) x [0, kHeadDim) of a slice into shared memory (row
// pitch kPitch); rows >= len and columns >= dim are zero-filled, so padding adds nothing to any
// product. With 16-byte copies the load is cp.async (the caller commits and waits); otherwise it
// is element by element and complete on return (the barrier before use publishes it).
template <typename T, int kRows, int kHeadDim, int kPitch>
__device__ __forceinline__ void load_slice_rows(T* smem, const StridedSlice& src, int64_t row0,
                                                int64_t len, int64_t dim) {
  const T* base = static_cast<const T*>(src.base);
  if (src.lean && row0 + kRows <= len) {
    // The usual tile: no per-chunk bounds test or select, 32-bit offsets.
    const int32_t row_bytes = static_cast<int32_t>(src.row_stride * sizeof(T));
    copy_tile_lean<kRows, kHeadDim / 8, kPitch* static_cast<int>(sizeof(T)), SparseTile::kThreads>(
        shared_address(smem), reinterpret_cast<const char*>(base + row0 * src.row_stride),
        row_bytes);
  } else if (src.vec) {
    copy_rows_async<T, kRows, kHeadDim / 8, kPitch, SparseTile::kThreads>(
        smem, base, src.row_stride, row0, len, dim);
  } else {
    const T zero = ElementTraits<T>::from_float(0.0f);
#pragma unroll 1
    for (int e = threadIdx.x; e < kRows * kHeadDim; e += SparseTile::kThreads) {
      const int r = e / kHeadDim, d = e % kHeadDim;
      const int64_t row = row0 + r;
      smem[r * kPitch + d] =
          (row < len && d < dim) ? base[row * src.row_stride + d * src.col_stride] : zero;
    }
  }
}

// The slot side of the list entries a kernel walks (common/sparse_attention_tiles.h): entry e
// has `sub` slots of one column (or row) unit each, ascending, -1 in empty ones (whose mask bits
// are all clear). kPacked: layout blocks of 16 or 32, several blocks per entry, whose rows are
// gathered one by one; otherwise one slot of a whole 64-token tile (blocks of 64 and more), a
// contiguous slice. The kernels are instantiated for both, so that blocks of 64 and 128 carry
// none of the gather's code (per-row slot lookups in the copies and the element path; with it
// they ran 3-5% slower).
template <bool kPacked>
struct EntrySlots {
  static constexpr int kTileShift = 6;  // log2(SparseTile::kSize)
  const int32_t* slots;                 // [entries * sub]
  int sub, shift;

  __device__ EntrySlots(const int32_t* all, const BlockSparseDeviceIndex::Tiles& tiles)
      : slots(all), sub(kPacked ? tiles.sub : 1), shift(kPacked ? tiles.shift : kTileShift) {}

  // Entry e's slots.
  __device__ __forceinline__ const int32_t* of(int e) const {
    return slots + (kPacked ? int64_t{e} * sub : int64_t{e});
  }
  // The token at position c (0..63) along the entry's slot side: slot c >> shift's unit plus the
  // offset inside it; -1 in an empty slot.
  __device__ __forceinline__ int64_t token(const int32_t* entry, int c) const {
    if constexpr (kPacked) {
      const int32_t unit = entry[c >> shift];
      return unit < 0 ? -1 : (int64_t{unit} << shift) + (c & ((1 << shift) - 1));
    } else {
      return (int64_t{entry[0]} << kTileShift) + c;
    }
  }
  // The first and last token of the entry's slots. Used slots ascend and empty ones (-1) come
  // last, so the last used unit is the largest; sub is 2 or 4 (blocks of 32 or 16), so the
  // loop is unrolled with predicated loads instead of running a loop of `sub` trips.
  struct Span {
    int64_t first, last;
  };
  __device__ __forceinline__ Span span(const int32_t* entry) const {
    const int64_t first = int64_t{entry[0]} << shift;
    if constexpr (!kPacked) return {first, first + (1 << kTileShift) - 1};
    constexpr int kMaxSub = SparseTile::kSize / 16;
    int32_t last = entry[0];
#pragma unroll
    for (int k = 1; k < kMaxSub; ++k)
      if (k < sub && entry[k] > last) last = entry[k];
    return {first, ((int64_t{last} + 1) << shift) - 1};
  }
};

// Starts loading the 64 rows of a list entry's slot side (row r: slots.token(entry, r)) into
// shared memory, as load_slice_rows: rows of empty slots, rows >= len and columns >= dim are
// zero-filled. An unpacked entry is load_slice_rows itself.
template <typename T, int kHeadDim, int kPitch, bool kPacked>
__device__ __forceinline__ void load_slot_rows(T* smem, const StridedSlice& src,
                                               const EntrySlots<kPacked>& slots,
                                               const int32_t* entry, int64_t len, int64_t dim) {
  constexpr int kRows = SparseTile::kSize;
  if constexpr (!kPacked) {
    load_slice_rows<T, kRows, kHeadDim, kPitch>(smem, src, slots.token(entry, 0), len, dim);
  } else {
    const T* base = static_cast<const T*>(src.base);
    if (src.vec) {
      // copy_rows_async's split of the copies (a fixed chunk column per thread, every kRowStep-th
      // row), each row's source found through its slot.
      constexpr int kChunks = kHeadDim / 8, kRowStep = SparseTile::kThreads / kChunks;
      constexpr int kIters = (kRows + kRowStep - 1) / kRowStep;
      const int r0 = static_cast<int>(threadIdx.x) / kChunks,
                c = static_cast<int>(threadIdx.x) % kChunks;
      const bool column_inside = c * 8 < dim;
      T* dst = smem + r0 * kPitch + c * 8;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int r = r0 + i * kRowStep;
        if (kRows % kRowStep != 0 && r >= kRows) break;
        const int64_t row = slots.token(entry, r);
        const bool valid = column_inside && row >= 0 && row < len;
        cp_async_16(dst + i * kRowStep * kPitch, valid ? base + row * src.row_stride + c * 8 : base,
                    valid ? 16 : 0);
      }
    } else {
      const T zero = ElementTraits<T>::from_float(0.0f);
#pragma unroll 1
      for (int e = threadIdx.x; e < kRows * kHeadDim; e += SparseTile::kThreads) {
        const int r = e / kHeadDim, d = e % kHeadDim;
        const int64_t row = slots.token(entry, r);
        smem[r * kPitch + d] = (row >= 0 && row < len && d < dim)
                                   ? base[row * src.row_stride + d * src.col_stride]
                                   : zero;
      }
    }
  }
}

// The additive value of a mask element: kMul (not bool) maps 0 to -inf and anything else to 0;
// kAdd and bool masks are added as read (a bool already reads as 0 / -inf).
__device__ __forceinline__ float mask_value(const void* base, BiasType type, int mul,
                                            int64_t offset) {
  const float x = load_bias(base, type, offset);
  return mul ? (x == 0.0f ? kNegInf : 0.0f) : x;
}

// The score of element (i, j) of (b, h) from its raw dot product, in the CPU path's order
// (ScoreTerms::apply): dot * scale, + rpe, + key padding mask, + attention mask. The caller has
// checked that (i, j) is inside the matrix and kept by the layout and the causal rule.
__device__ __forceinline__ float score_of(const SparseAttentionDeviceParams& p, float dot,
                                          int64_t b, int64_t h, int64_t i, int64_t j) {
  float s = dot * p.scale;
  if (p.has_terms) {
    if (p.rpe_type != BiasType::kNone) {
      s += load_bias(
          p.rpe, p.rpe_type,
          b * p.rpe_stride[0] + h * p.rpe_stride[1] + i * p.rpe_stride[2] + j * p.rpe_stride[3]);
    }
    if (p.kpm_type != BiasType::kNone) {
      s += mask_value(p.kpm, p.kpm_type, p.kpm_mul, b * p.kpm_stride[0] + j * p.kpm_stride[1]);
    }
    if (p.attn_type != BiasType::kNone) {
      s += mask_value(p.attn, p.attn_type, p.attn_mul, i * p.attn_stride[0] + j * p.attn_stride[1]);
    }
  }
  return s;
}

// Whether tile element (r, c) (query row r, key column c inside the tile, i and j in the whole
// matrix) takes part: inside L x L, its layout sub-block present in `mask`, and not removed by
// the causal rule.
__device__ __forceinline__ bool element_kept(const SparseAttentionDeviceParams& p, int mask, int r,
                                             int c, int64_t i, int64_t j) {
  if (i >= p.len || j >= p.len) return false;
  if (p.causal && j > i) return false;
  if (mask != p.tiles.full_mask) {
    const int bit = (r >> p.tiles.shift) * p.tiles.sub + (c >> p.tiles.shift);
    if (((mask >> bit) & 1) == 0) return false;
  }
  return true;
}

// Whether an entry (queries first_row..last_row, keys up to last_col: the ends of its two sides,
// a contiguous tile or an EntrySlots span) needs no per-element work: it lies inside L x L, off
// the causal diagonal (or the call is not causal) and no score term applies. Then the only removed
// elements are the layout's: a warp's 16 rows lie in one block row of the entry (blocks are 16
// or larger), so its element (r, c) is kept exactly when c's 16-column group is in the warp's
// warp_column_groups mask; the score is dot * scale there. True for every entry of the usual
// calls (no masks, L a multiple of 64, off the diagonal), blocks of 16 and 32 included.
__device__ __forceinline__ bool tile_is_plain(const SparseAttentionDeviceParams& p,
                                              int64_t first_row, int64_t last_row,
                                              int64_t last_col) {
  return !p.has_terms && last_row < p.len && last_col < p.len &&
         (!p.causal || last_col <= first_row);
}

// The 16-column groups of a tile that warp `warp` needs, as a mask over the eight n8 column
// tiles (both bits of a group set or clear): with layout blocks of 16 or 32 a tile holds several
// sub-blocks, a warp's 16 rows lie in one of them, and the columns of its absent sub-blocks have
// no kept element, so their MMAs would only produce values the element checks remove (scores
// -inf, probabilities 0). rows_are_keys: the warp's rows are keys and the tile's columns queries
// (the dK/dV kernel); the mask bits stay (query sub-block, key sub-block).
__device__ __forceinline__ uint32_t warp_column_groups(const SparseAttentionDeviceParams& p,
                                                       int mask, int warp, bool rows_are_keys) {
  if (mask == p.tiles.full_mask) return 0xFFu;
  const int mine = (warp * 16) >> p.tiles.shift;
  uint32_t keep = 0;
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const int other = (j * 8) >> p.tiles.shift;
    const int bit = rows_are_keys ? other * p.tiles.sub + mine : mine * p.tiles.sub + other;
    if ((mask >> bit) & 1) keep |= 3u << j;
  }
  return keep;
}

// Starts copying the lse and delta of the 64 query rows of a column-list entry (row r:
// slots.token(entry, r)) of (b, h) into shared memory in the caller's cp.async group. Rows of
// empty slots or past L get lse = -inf (probability 0) and delta = 0.
template <bool kPacked>
__device__ __forceinline__ void load_sparse_row_stats(float* lse, float* delta,
                                                      const SparseAttentionDeviceParams& p,
                                                      int64_t b, int64_t h,
                                                      const EntrySlots<kPacked>& slots,
                                                      const int32_t* entry) {
  for (int r = threadIdx.x; r < SparseTile::kSize; r += SparseTile::kThreads) {
    const int64_t q = slots.token(entry, r);
    if (q >= 0 && q < p.len) {
      cp_async_4(lse + r, p.lse + b * p.lse_stride[0] + h * p.lse_stride[1] + q * p.lse_stride[2],
                 4);
      cp_async_4(delta + r, p.delta + (b * p.heads + h) * p.len + q, 4);
    } else {
      lse[r] = kNegInf;
      delta[r] = 0.0f;
    }
  }
}

// P = exp(s - lse) for a natural-unit score s; a row without any unmasked key (lse = -inf) has
// P = 0, as on the CPU.
__device__ __forceinline__ float prob_of(float s, float lse) {
  return lse == kNegInf ? 0.0f : exp2f((s - lse) * kLog2e);
}

// Writes this warp's 16 rows (rows[r], r = 0..1 of this thread) x dim of an accumulator, row r
// times factor[r], into the (b, h) slice of a [B, H, L, D] output with unit stride on D
// (store_accumulator_row: 32-bit stores of pairs; with `pairs_aligned`, the *_paired flags, no test
// per row). Warp-collective: every lane calls it.
template <typename T, int kOutTiles>
__device__ __forceinline__ void store_slice_rows(const float acc[kOutTiles][4],
                                                 const float factor[2], void* base,
                                                 const int64_t stride[4], int64_t b, int64_t h,
                                                 const int64_t rows[2], int64_t len, int64_t dim,
                                                 int t, bool pairs_aligned) {
  T* out = static_cast<T*>(base) + b * stride[0] + h * stride[1];
  const bool may_start_odd = rows_may_start_odd(out, stride[2]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool write = rows[r] < len;
    store_accumulator_row<T, kOutTiles>(out + (write ? rows[r] : 0) * stride[2], acc, r, factor[r],
                                        dim, t, pairs_aligned, may_start_odd, write);
  }
}

// Writes this warp's rows of an accumulator times `factor` into a [64 x kHeadDim] fp32 partial
// (row-major; rows of this tile numbered from 0).
template <int kHeadDim>
__device__ __forceinline__ void store_partial_rows(const float acc[kHeadDim / 8][4], float factor,
                                                   float* partial, int warp, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* row = partial + (warp * 16 + g + 8 * r) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      *reinterpret_cast<float2*>(row + i * 8 + 2 * t) =
          make_float2(acc[i][2 * r] * factor, acc[i][2 * r + 1] * factor);
    }
  }
}

// The piece of a 1-D grid of (piece, batch, head repeat) CTAs: piece fastest. The tile lists
// hold the index's G stored heads; a piece of stored head g's lists is worked for heads
// g + k * G, k < head_repeat, as if the batch were head_repeat times larger.
struct PieceOf {
  int64_t b, h, tile;    // batch, head and tile line (row or column) of the piece
  int64_t line;          // the stored line: stored head * num_tiles + tile
  int64_t bk;            // (batch, head repeat) pair: b * head_repeat + k, which counts slots
  int begin, end, slot;  // its range in the tile list, and its partial slot (-1: whole line)
  // The piece's fp32 partial, counted over (bk, slot) for a list with `slots` slots.
  __device__ __forceinline__ int64_t partial(int slots) const { return bk * slots + slot; }
};

__device__ __forceinline__ PieceOf decode_piece(const BlockSparseDeviceIndex::TileWork& w,
                                                const BlockSparseDeviceIndex::Tiles& tiles) {
  // 32-bit division throughout (the grid has fewer than 2^31 CTAs): a 64-bit divide is a
  // software sequence several times longer.
  PieceOf o;
  const uint32_t block = blockIdx.x, pieces = static_cast<uint32_t>(w.pieces),
                 repeat = static_cast<uint32_t>(tiles.head_repeat),
                 num_tiles = static_cast<uint32_t>(tiles.num_tiles);
  const int piece = static_cast<int>(block % pieces);
  const uint32_t bk = block / pieces;
  o.bk = bk;
  o.b = bk / repeat;
  const uint32_t line = static_cast<uint32_t>(w.item_line[piece]);
  o.h = line / num_tiles + (bk % repeat) * static_cast<uint32_t>(tiles.layout_heads);
  o.tile = line % num_tiles;
  o.line = line;
  o.begin = w.item_begin[piece];
  o.end = w.item_end[piece];
  o.slot = w.item_slot[piece];
  return o;
}

// The tokens of a CTA's own tile line (a tile row's queries, a tile column's keys): 64
// consecutive tokens from `first` (blocks of 64 and more), or, for a packed layout, the block
// lines its group holds (Tiles::row_units / col_units, read like an entry's slots: position c is
// token c & (b - 1) of unit c >> shift, -1 in an empty slot, whose mask bits are clear in every
// entry). Lines with long lists are grouped (common/sparse_attention_tiles.h), so a tile line's
// tokens need not be consecutive.
template <bool kPacked>
struct TileLineTokens {
  const int32_t* units;  // packed: the tile line's `sub` units
  int64_t first, last;   // its first and last token, read once (each entry's tile_is_plain)

  __device__ __forceinline__ TileLineTokens(const EntrySlots<kPacked>& slots,
                                            const int32_t* all_units,
                                            const BlockSparseDeviceIndex::Tiles& tiles,
                                            const PieceOf& at)
      : units(kPacked ? all_units + at.line * tiles.sub : nullptr) {
    if constexpr (kPacked) {
      const auto span = slots.span(units);  // a packed tile line's first unit is always used
      first = span.first;
      last = span.last;
    } else {
      first = at.tile * SparseTile::kSize;
      last = first + SparseTile::kSize - 1;
    }
  }

  // The token at position c (0 .. 63), -1 in an empty slot.
  __device__ __forceinline__ int64_t token(const EntrySlots<kPacked>& slots, int c) const {
    if constexpr (kPacked) {
      return slots.token(units, c);
    } else {
      return first + c;
    }
  }
  // The tokens of positions mine for the outputs; `len` (nothing written) in an empty slot.
  __device__ __forceinline__ void outputs(int64_t (&out)[2], const EntrySlots<kPacked>& slots,
                                          const int (&mine)[2], int64_t len) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t at = token(slots, mine[r]);
      out[r] = kPacked && at < 0 ? len : at;
    }
  }
};

// The part of a split line's 64 x kHeadDim output one CTA of the combine and sum kernels
// writes: each thread owns four consecutive columns of one row, so a CTA covers 128 * 4 /
// kHeadDim rows and a line takes kHeadDim / 8 CTAs (8 at head dim 64). Spreading a line over
// several CTAs matters: a layout has few split lines (BigBird's global rows), each with tens of
// pieces, and one CTA per line left the GPU nearly idle (0.49 ms for 16 lines at 65,536 tokens).
template <int kHeadDim>
struct SplitLineChunk {
  static constexpr int kThreadsPerRow = kHeadDim / 4;
  static constexpr int kRowsPerCta = SparseTile::kThreads / kThreadsPerRow;
  static constexpr int kCtasPerLine = SparseTile::kSize / kRowsPerCta;
  static_assert(kHeadDim % 4 == 0 && SparseTile::kThreads % kThreadsPerRow == 0 &&
                    SparseTile::kSize % kRowsPerCta == 0,
                "a split line's rows divide evenly among CTAs");
  int64_t b, h;                                        // batch and head of the line
  static constexpr int64_t kNoRow = int64_t{1} << 62;  // above every L
  int64_t row;         // this thread's row in the whole [L] (>= len: nothing to write)
  int tile_row;        // the same inside the line's 64-row tile
  int d;               // its first column
  int pieces;          // the line's pieces
  int64_t first_slot;  // the partial slot of its first piece, counted over (bk, slot)
  __device__ SplitLineChunk(const BlockSparseDeviceIndex::TileWork& work,
                            const BlockSparseDeviceIndex::Tiles& tiles) {
    const int64_t cta = blockIdx.x;
    const int64_t group = cta % kCtasPerLine, line_cta = cta / kCtasPerLine;
    const int line = work.split_lines[line_cta % work.num_split_lines];
    const int64_t bk = line_cta / work.num_split_lines;  // (batch, head repeat), as in PieceOf
    b = bk / tiles.head_repeat;
    h = line / tiles.num_tiles + (bk % tiles.head_repeat) * tiles.layout_heads;
    tile_row = static_cast<int>(group) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
    if (work.line_units == nullptr) {
      row = int64_t{line % tiles.num_tiles} * SparseTile::kSize + tile_row;
    } else {  // a packed layout's tile column: its units' keys (none in an empty slot)
      const int32_t unit = work.line_units[int64_t{line} * tiles.sub + (tile_row >> tiles.shift)];
      row = unit < 0 ? kNoRow
                     : (int64_t{unit} << tiles.shift) + (tile_row & ((1 << tiles.shift) - 1));
    }
    d = (threadIdx.x % kThreadsPerRow) * 4;
    pieces = work.line_items[line + 1] - work.line_items[line];
    first_slot = bk * work.slots + work.item_slot[work.line_items[line]];
  }
};

// Writes four consecutive columns d.. of one output row, up to dim.
template <typename T>
__device__ __forceinline__ void store_four(T* row, int d, int64_t dim, const float v[4]) {
#pragma unroll
  for (int x = 0; x < 4; ++x)
    if (d + x < dim) row[d + x] = ElementTraits<T>::from_float(v[x]);
}

// Whether the fused kernels of a head dim take with_kept_pairs' test-free copy of their MMA loops
// for tiles whose sub-blocks are all kept. Not at D = 64: those kernels sit at their register caps
// (launch bounds) and the second copy's schedule spills there (ptxas, bf16: forward 8 -> 40 bytes
// of stack, dK/dV 64 -> 88); at D = 32 and 128 it spills nothing.
template <int kHeadDim>
constexpr bool kSplitKeptLoops = kHeadDim != 64;

// acc[j] (16 x 8, j = 0..7) = A (16 x kHeadDim: rows warp*16.. of `a_tile`) * rows^T, rows = the
// 64 rows of `tile`; the A fragments are read from shared memory step by step. Pairs of n8 tiles
// clear in `keep` are left at 0, as in mma_rows_t.
template <typename T, int kSteps, int kPitch, bool kSplit = true>
__device__ __forceinline__ void mma_rows_t_smem(float acc[8][4], const T* a_tile, const T* tile,
                                                int g, int t, uint32_t keep) {
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  with_kept_pairs<kSplit>(keep, [&](auto all) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      uint32_t a[4];
      load_a_frag<T, kPitch>(a, a_tile, s, g, t);
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        if (!pair_kept(all, keep, j)) continue;
        uint32_t bf[2][2];
        load_b_frags_of_rows<T, kPitch>(bf, tile, j, s, g, t);
        mma_16816<T>(acc[j], a, bf[0]);
        mma_16816<T>(acc[j + 1], a, bf[1]);
      }
    }
  });
}

// acc = A rows^T for a fused kernel of head dim kHeadDim: A from its fragments in registers
// (kRegs; `frags` holds kSteps of them) or step by step from shared memory (`a_tile`), with the
// head dim's choice of loop copies (kSplitKeptLoops).
template <typename T, int kSteps, int kPitch, int kHeadDim, bool kRegs, int kFragSteps>
__device__ __forceinline__ void sparse_mma_rows_t(float acc[8][4],
                                                  const uint32_t (&frags)[kFragSteps][4],
                                                  const T* a_tile, const T* tile, int g, int t,
                                                  uint32_t keep) {
  constexpr bool kSplit = kSplitKeptLoops<kHeadDim>;
  if constexpr (kRegs) {
    static_assert(kFragSteps == kSteps, "fragments in registers: one per k-step");
    mma_rows_t<T, kSteps, kPitch, kSplit>(acc, frags, tile, g, t, keep);
  } else {
    mma_rows_t_smem<T, kSteps, kPitch, kSplit>(acc, a_tile, tile, g, t, keep);
  }
}

}  // namespace sciattn::cuda

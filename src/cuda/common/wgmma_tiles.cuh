// The 64-row tile machinery that the attention kernels on Hopper's warpgroup MMA share (the
// block-sparse and the Evoformer wgmma kernels): copying rows into the swizzled tile layout of
// cuda/common/wgmma.cuh (per call, per moving slice, or as a per-thread stream of tiles), the
// double-buffer step, the CTA's 1024-byte aligned shared base, and the two
// tile products every attention kernel is made of, S-like (A B^T, both operands in shared memory)
// and O-like (X B, X the fp32 accumulators of an S-like product, rounded to T). One CTA is one
// warpgroup of four warps; warp w owns rows 16w..16w+15 of every 64-row accumulator, in the
// layout of mma.sync m16n8's (cuda/common/wgmma.cuh). CUDA layer.
#pragma once

#include <cstdint>

#include "cuda/common/tile_copies.cuh"  // shared_address, cp_async_16_to, cp_async_*
#include "cuda/common/wgmma.cuh"

namespace sciattn::cuda {

constexpr int kWgmmaRows = 64;      // rows of every tile and accumulator
constexpr int kWgmmaThreads = 128;  // one warpgroup

// How a kernel instantiation's tiles hold rows of D 16-bit elements (kHeadDim the instantiated
// head dim; the Evoformer kernels' bias-type structs carry it, evoformer_bias_types.cuh):
//   kExact:  D = kHeadDim, rows 16-byte aligned: whole chunks, no column test anywhere;
//   kPadded: D < kHeadDim a multiple of 8, rows 16-byte aligned: the same copies, a thread's chunk
//            past D (fixed per thread: its chunk column) zero-filled by a source size of 0.
//   kPieces: D < kHeadDim, rows 4-byte aligned (an even D; or an odd D read from one element
//            before each row, as rows of D + 1: the Evoformer forward's shifted slices): each
//            16-byte chunk as four 4-byte pieces (copy_chunk_pieces_to), the bytes past the row
//            zero-filled; four copy instructions per chunk, so only the Evoformer forward reads
//            rows this way, and only where D is near the head dim.
// (Rows of any other D or alignment are copied into kPadded rows before the kernels run: the
// Evoformer dispatch's staged copies.)
enum class TileCols { kExact, kPadded, kPieces };

// The calling thread's warpgroup in its CTA, broadcast from lane 0 so that the compiler knows it
// is the same across the warp: code that branches on it (a warpgroup's own tile count) then keeps
// its wgmma products on a convergent path, which ptxas needs to leave them asynchronous (it
// serializes every wgmma of a kernel with one in a path it sees as divergent).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWgmmaThreads, 0);
}

// Source size of a 16-byte chunk copy (16, or 0: zero-filled, nothing read) of chunk column c in
// rows of `dim_bytes` bytes (TileCols::kPadded).
__device__ __forceinline__ int chunk_source_bytes(int c, int dim_bytes) {
  return c * 16 < dim_bytes ? 16 : 0;
}
// The bytes of chunk column c inside rows of `dim_bytes` bytes (TileCols::kPieces: 0 to 16, even).
__device__ __forceinline__ int chunk_bytes_inside(int c, int dim_bytes) {
  const int inside = dim_bytes - c * 16;
  return inside >= 16 ? 16 : (inside > 0 ? inside : 0);
}

// A 16-byte chunk as four 4-byte cp.async pieces (TileCols::kPieces), `src` 4-byte aligned, of
// which `inside` bytes (even, 0 to 16) lie in the row: piece j reads those of its bytes that do (4,
// 2 or 0; a piece that reads nothing takes `src` as its address) and zero-fills the rest.
__device__ __forceinline__ void copy_chunk_pieces_to(uint32_t dst, const char* src, int inside) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int left = inside - 4 * j;
    cp_async_4_to(dst + 4 * j, left > 0 ? src + 4 * j : src, left >= 4 ? 4 : (left > 0 ? left : 0));
  }
}
// One chunk copy of a padded tile's form: four pieces (kPieces), else one 16-byte cp.async
// (`bytes`: 16, or 0 to zero-fill it).
template <bool kPieces>
__device__ __forceinline__ void copy_chunk_to(uint32_t dst, const char* src, int bytes) {
  if constexpr (kPieces) {
    copy_chunk_pieces_to(dst, src, bytes);
  } else {
    cp_async_16_to(dst, src, bytes);
  }
}

// Starts cp.async copies of 64 rows x kHeadDim 16-bit columns whose first element is at `rows`
// (rows `row_bytes` apart, 16-byte aligned) into the swizzled tile at shared address `tile`;
// rows at or past `rows_inside` are zero-filled (nothing is read for them). Thread x owns chunk
// column x % (kHeadDim / 8) of every (128 / (kHeadDim / 8))-th row, so its swizzle (row % 8 is
// the same for all its rows) and both its offsets are fixed across the copy. A whole tile
// (rows_inside >= 64, a value the caller knows per tile) takes the copy without tests. `thread`:
// the calling thread's index in the warpgroup that makes the copy (0..127).
// kPadded (TileCols::kPadded): rows of `dim_bytes` bytes (a multiple of 16 below 2 kHeadDim), the
// chunks past them zero-filled too (a thread's chunk column, so its source size, is fixed; its
// reads start at the row's first chunk and read nothing); with kPieces (TileCols::kPieces) rows
// of any even `dim_bytes`, 4-byte aligned, each chunk in pieces. Without kPadded `dim_bytes` is
// unused and the code is the head dim's alone, written apart: folding the head dim's copies into
// the padded form (a source size that is a constant 16) changed how nvcc scheduled the aligned
// kernels.
template <int kHeadDim, bool kPadded = false, bool kPieces = false>
__device__ __forceinline__ void copy_tile_swizzled(uint32_t tile, const char* rows,
                                                   int32_t row_bytes, int64_t rows_inside = 64,
                                                   int thread = static_cast<int>(threadIdx.x),
                                                   [[maybe_unused]] int dim_bytes = 2 * kHeadDim) {
  constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
  constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  static_assert(kRowStep % 8 == 0, "a thread's rows must share their swizzle");
  const int c = thread % kChunks, r0 = thread / kChunks;
  if constexpr (kPadded) {
    const int bytes = kPieces ? chunk_bytes_inside(c, dim_bytes) : chunk_source_bytes(c, dim_bytes);
    const char* src = rows + (r0 * row_bytes + (bytes != 0 ? c * 16 : 0));
    const uint32_t dst = tile + swizzled_chunk_offset<kWgmmaRows, kWidth>(r0, c);
    if (rows_inside >= kWgmmaRows) {
#pragma unroll
      for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
        copy_chunk_to<kPieces>(dst + i * kRowStep * kWidth, src + i * kRowStep * row_bytes, bytes);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
        const bool inside = r0 + i * kRowStep < rows_inside;
        copy_chunk_to<kPieces>(dst + i * kRowStep * kWidth,
                               inside ? src + i * kRowStep * row_bytes : rows, inside ? bytes : 0);
      }
    }
    return;
  }
  const char* src = rows + (r0 * row_bytes + c * 16);
  const uint32_t dst = tile + swizzled_chunk_offset<kWgmmaRows, kWidth>(r0, c);
  if (rows_inside >= kWgmmaRows) {
#pragma unroll
    for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
      cp_async_16_to(dst + i * kRowStep * kWidth, src + i * kRowStep * row_bytes, 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
      const bool inside = r0 + i * kRowStep < rows_inside;
      cp_async_16_to(dst + i * kRowStep * kWidth, inside ? src + i * kRowStep * row_bytes : rows,
                     inside ? 16 : 0);
    }
  }
}

// Zeroes column 0 of the rows of the swizzled tile at `tile` (a generic pointer into shared
// memory) whose chunk 0 this thread copies (copy_tile_swizzled's mapping, which the slice streams
// share): a shifted slice's column before its rows, which holds the element before each row.
// Called between this thread's cp.async wait and the barrier that shows the tile to the CTA (and
// before the proxy fence that shows it to wgmma), so that it lands after the copy's write.
template <int kHeadDim>
__device__ __forceinline__ void zero_first_column_swizzled(
    unsigned char* tile, int thread = static_cast<int>(threadIdx.x)) {
  constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
  constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  if (thread % kChunks != 0) return;
  unsigned char* const first =
      tile + swizzled_chunk_offset<kWgmmaRows, kWidth>(thread / kChunks, 0);
#pragma unroll
  for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
    *reinterpret_cast<uint16_t*>(first + i * kRowStep * kWidth) = 0;
  }
}

// copy_tile_swizzled for a loop that copies the same rows of a moving slice (the dbias2 kernel's
// Q, dO, K and V of each n): this thread's addressing is worked out once, so that a copy is
// kCopies cp.async from one pointer plus fixed offsets, with no branch (the rows-past-L test is a
// bit mask, turned into the copies' zero-fill sizes), and the next slice is a 64-bit add
// (`advance`) instead of a multiply from the loop's index.
// kCols (TileCols): kPadded, rows of D (`dim_bytes`, a multiple of 16) in whole aligned chunks,
// the chunks past D zero-filled; kExact, rows of exactly kHeadDim elements in whole aligned
// chunks.
template <int kHeadDim, TileCols kCols = TileCols::kExact>
struct SwizzledTileCopier {
  static constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
  static constexpr int kCopies = kWgmmaRows / kRowStep;
  static constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  static_assert(kRowStep % 8 == 0, "a thread's rows must share their swizzle");
  const char* rows;  // the current slice's tile: its first row
  int32_t first;     // this thread's first chunk, in bytes from `rows`
  int32_t step;      // bytes between this thread's successive rows (kRowStep rows)
  uint32_t dst;      // this thread's first chunk in a tile
  uint32_t inside;   // bit i: this thread's i-th row is inside the tensor (and its chunk in D)
  int chunk_bytes;   // kPadded: bytes of this thread's chunk inside D

  // `rows`: the tile's first row, rows `row_bytes` apart, `rows_inside` of them inside the tensor;
  // `thread`: as copy_tile_swizzled's.
  __device__ __forceinline__ SwizzledTileCopier(const char* tile_rows, int32_t row_bytes,
                                                int64_t rows_inside, int thread,
                                                int dim_bytes = 2 * kHeadDim)
      : rows(tile_rows),
        first((thread / kChunks) * row_bytes + (thread % kChunks) * 16),
        step(kRowStep * row_bytes),
        dst(swizzled_chunk_offset<kWgmmaRows, kWidth>(thread / kChunks, thread % kChunks)),
        inside(0),
        chunk_bytes(16) {
    if constexpr (kCols == TileCols::kPadded) {
      chunk_bytes = chunk_source_bytes(thread % kChunks, dim_bytes);
    }
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      if (chunk_bytes > 0 && thread / kChunks + i * kRowStep < rows_inside) inside |= 1u << i;
    }
  }

  // Starts the copies of the current slice's tile into the tile at `tile`. A row past the tensor
  // (or a chunk past D) is zero-filled: its copy reads nothing (its address is the
  // tile's first row's).
  __device__ __forceinline__ void copy(uint32_t tile) const {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool in = (inside >> i) & 1u;
      cp_async_16_to(tile + dst + i * kRowStep * kWidth, in ? rows + (first + i * step) : rows,
                     in ? 16 : 0);
    }
  }

  // Moves to the slice `bytes` further on.
  __device__ __forceinline__ void advance(int64_t bytes) {
    rows += bytes;
  }
};

// One thread's share of a stream of equally shaped tile copies (the tiles a CTA's loop copies one
// after another), worked out once: tile t's copies are kCopies 16-byte chunks from
// src + t * advance + i * step (global memory) to dst + i * kDstStep from the tile's shared
// base, each an add and a cp.async (no per-tile address arithmetic from the CTA's coordinates).
// kSourceBytes: every copy of this thread reads `bytes` (16, or 0: its chunk is zero-filled and
// nothing is read; TileCols::kPadded's chunks past D); else whole chunks, and `bytes` is unused.
// kPieces (with kSourceBytes; TileCols::kPieces): `bytes` is the chunk's bytes inside its row (0
// to 16), each chunk copied as four 4-byte pieces.
template <int kCopies, int kDstStep, bool kSourceBytes = false, bool kPieces = false>
struct ChunkStream {
  static_assert(kSourceBytes || !kPieces, "pieces read a source size");
  const char* src;  // this thread's first chunk of tile 0
  int32_t step;     // bytes between this thread's chunks of a tile
  int32_t advance;  // bytes from one tile to the next
  uint32_t dst;     // this thread's first chunk in a tile
  int32_t bytes;    // kSourceBytes: the copies' source size

  __device__ __forceinline__ void copy(uint32_t tile, int64_t t) const {
    const char* const from = src + t * advance;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      if constexpr (kSourceBytes) {
        copy_chunk_to<kPieces>(tile + dst + i * kDstStep, from + i * step, bytes);
      } else {
        cp_async_16_to(tile + dst + i * kDstStep, from + i * step, 16);
      }
    }
  }

  // The same for a loop that copies tiles 0, 1, 2, ... in order: copies the next tile and moves
  // on to the one after it (a pointer carried in registers, no per-tile address arithmetic).
  __device__ __forceinline__ void copy_next(uint32_t tile) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      if constexpr (kSourceBytes) {
        copy_chunk_to<kPieces>(tile + dst + i * kDstStep, src + i * step, bytes);
      } else {
        cp_async_16_to(tile + dst + i * kDstStep, src + i * step, 16);
      }
    }
    src += advance;
  }

  // copy_next for a tile some of whose chunks lie outside the tensor (a partial last tile, rows
  // past L): copy i reads its chunk where in(i) holds (`in`: a callable of the copy's index, whose
  // tests the compiler keeps as predicates, or ChunkBits); the others are zero-filled and read
  // nothing (their address is `fallback`, a chunk inside the tensor).
  template <typename In>
  __device__ __forceinline__ void copy_next_masked(uint32_t tile, const In& in,
                                                   const char* fallback) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool read = in(i);
      const int size = kSourceBytes ? bytes : 16;
      copy_chunk_to<kPieces>(tile + dst + i * kDstStep, read ? src + i * step : fallback,
                             read ? size : 0);
    }
    src += advance;
  }
  // The same for tile t (copy's).
  template <typename In>
  __device__ __forceinline__ void copy_masked(uint32_t tile, int64_t t, const In& in,
                                              const char* fallback) const {
    const char* const from = src + t * advance;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool read = in(i);
      const int size = kSourceBytes ? bytes : 16;
      copy_chunk_to<kPieces>(tile + dst + i * kDstStep, read ? from + i * step : fallback,
                             read ? size : 0);
    }
  }
};

// A ChunkStream mask as bits: copy i reads its chunk where bit i is set.
struct ChunkBits {
  uint32_t bits;
  __device__ __forceinline__ bool operator()(int i) const { return (bits >> i) & 1u; }
};

// The compiler sees a wgmma's accumulators written when the instruction is issued; this empty
// statement, placed after the wait, keeps every later read (and, before the issue, every earlier
// write) of them on its side.
template <int kTiles>
__device__ __forceinline__ void wgmma_pin(float (&d)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// The pipeline's step at iteration e of [.., end) (buffer buf): wait for this iteration's copies
// (the only group in flight), make them visible to the async proxy (wgmma reads shared memory
// through it) and, through the barrier, to the whole CTA. Past the barrier every thread has also
// finished iteration e - 1, so iteration e + 1's copies start into its buffer (buf ^ 1) right
// away: one barrier per iteration, none at the end of the loop body.
// `arrived(buf)` runs between the wait and the barrier, where this thread's own copies of the
// iteration are complete and visible to it: it may rewrite them in place before the barrier shows
// them to the CTA.
template <typename Index, typename Load, typename Arrived>
__device__ __forceinline__ void next_stage(Index e, Index end, int buf, const Load& load,
                                           const Arrived& arrived) {
  cp_async_wait<0>();
  arrived(buf);
  fence_proxy_async_shared();
  __syncthreads();
  if (e + 1 < end) {
    load(e + 1, buf ^ 1);
    cp_async_commit();
  }
}
template <typename Index, typename Load>
__device__ __forceinline__ void next_stage(Index e, Index end, int buf, const Load& load) {
  next_stage(e, end, buf, load, [](int) {});
}

// The same over kStages buffers (iteration e in buffer e % kStages = buf): the caller starts
// iterations 0 .. kStages - 2 before the loop, one cp.async group each, and every step commits one
// group (empty past the end), so iteration e's group is complete once at most kStages - 2 are
// pending. Past the barrier every thread has finished iteration e - 1, whose buffer takes
// iteration e + kStages - 1. Copies run kStages - 1 iterations ahead instead of one.
template <int kStages, typename Index, typename Load, typename Arrived>
__device__ __forceinline__ void next_stage_of(Index e, Index end, int buf, const Load& load,
                                              const Arrived& arrived) {
  static_assert(kStages >= 2, "at least two buffers");
  cp_async_wait<kStages - 2>();
  arrived(buf);
  fence_proxy_async_shared();
  __syncthreads();
  const Index next = e + kStages - 1;
  if (next < end) load(next, buf == 0 ? kStages - 1 : buf - 1);
  cp_async_commit();
}

// The CTA's 1024-byte aligned shared base (the swizzle pattern's period), as a shared-window
// address and as a pointer; launches ask for 1024 bytes more than their tiles for the rounding.
struct AlignedSmem {
  uint32_t address;
  unsigned char* pointer;
};
__device__ __forceinline__ AlignedSmem aligned_smem(unsigned char* raw) {
  const uint32_t raw_address = shared_address(raw);
  const uint32_t address = (raw_address + 1023u) & ~1023u;
  return {address, raw + (address - raw_address)};
}

// Issues x (64 x 64, fp32 accumulators) = A B^T, A and B K-major swizzled tiles of kHeadDim
// columns (kHeadDim / 16 k-steps), as one commit group; x must not be touched until
// wgmma_tile_done<pending>(x), where `pending` counts the groups issued after this one that may
// still run. Issuing two products before waiting (S and dP) or doing other work meanwhile (the
// biases) overlaps them with it.
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_tile_nt_issue(float (&x)[8][4], uint32_t a_tile,
                                                    uint32_t b_tile) {
  constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  wgmma_pin(x);
  wgmma_fence();
#pragma unroll
  for (int st = 0; st < kHeadDim / 16; ++st) {
    wgmma_m64n64k16_ss<T>(x, k_major_step<kWgmmaRows, kWidth>(a_tile, st),
                          k_major_step<kWgmmaRows, kWidth>(b_tile, st), st > 0 ? 1 : 0);
  }
  wgmma_commit();
}
template <int kPending, int kTiles>
__device__ __forceinline__ void wgmma_tile_done(float (&x)[kTiles][4]) {
  wgmma_wait<kPending>();
  wgmma_pin(x);
}

// x (64 x 32) = A B^T for B's rows [32 half, 32 half + 32) (the keys of one half of a K tile),
// issued as wgmma_tile_nt_issue's products are. 32 rows are whole swizzle atoms (8 rows), so the
// half's descriptors are the tile's from 32 rows further on.
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_half_tile_nt_issue(float (&x)[4][4], uint32_t a_tile,
                                                         uint32_t b_tile, int half) {
  constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  const uint32_t b_half = b_tile + static_cast<uint32_t>(half * 32 * kWidth);
  wgmma_pin(x);
  wgmma_fence();
#pragma unroll
  for (int st = 0; st < kHeadDim / 16; ++st) {
    wgmma_m64n32k16_ss<T>(x, k_major_step<kWgmmaRows, kWidth>(a_tile, st),
                          k_major_step<kWgmmaRows, kWidth>(b_half, st), st > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// x = A B^T as above, waited for.
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_tile_nt(float (&x)[8][4], uint32_t a_tile, uint32_t b_tile) {
  wgmma_tile_nt_issue<T, kHeadDim>(x, a_tile, b_tile);
  wgmma_tile_done<0>(x);
}

// X (64 x 64, fp32 accumulators) rounded to T as the A fragments of the four k16 steps of an
// O-like product: a[kk] holds this thread's columns 16 kk + 2 t, + 1 (a[kk][0]: row g, [1]: row
// g + 8) and 16 kk + 8 + 2 t, + 1 ([2]: row g, [3]: row g + 8).
template <typename T>
__device__ __forceinline__ void pack_a_fragments(uint32_t (&a)[4][4], const float (&x)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = ElementTraits<T>::pack(x[2 * kk][0], x[2 * kk][1]);
    a[kk][1] = ElementTraits<T>::pack(x[2 * kk][2], x[2 * kk][3]);
    a[kk][2] = ElementTraits<T>::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[kk][3] = ElementTraits<T>::pack(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

// The A fragments of an O-like product in flight stay this thread's until the wait that completes
// it: this empty statement, placed after that wait, keeps their registers from being reused for
// anything computed in between (the product reads them asynchronously).
__device__ __forceinline__ void wgmma_pin_fragments(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// Issues out (64 x kHeadDim, fp32) += A (pack_a_fragments) * B, B an MN-major swizzled tile of 64
// rows, as one commit group: neither `out` nor `a` may be touched until
// wgmma_tile_done<pending>(out) and wgmma_pin_fragments(a). All four k-steps' fragments are formed
// before the fence, so no register changes between the products (ptxas would otherwise fence before
// each).
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_acc_packed_issue(float (&out)[kHeadDim / 8][4],
                                                       const uint32_t (&a)[4][4], uint32_t b_tile) {
  wgmma_pin(out);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64nNk16_rs_tb<T, kHeadDim>(
        out, a[kk], mn_major_step<kWgmmaRows, kSwizzleBytes<kHeadDim>>(b_tile, kk), 1);
  }
  wgmma_commit();
}

// out (64 x kHeadDim, fp32) += A (pack_a_fragments) * B as above, waited for.
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_acc_packed(float (&out)[kHeadDim / 8][4],
                                                 const uint32_t (&a)[4][4], uint32_t b_tile) {
  wgmma_acc_packed_issue<T, kHeadDim>(out, a, b_tile);
  wgmma_wait<0>();
  wgmma_pin(out);
}

// out (64 x kHeadDim, fp32) += X (64 x 64, fp32 accumulators, rounded to T) * B, B an MN-major
// swizzled tile of 64 rows.
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_acc_tile(float (&out)[kHeadDim / 8][4],
                                               const float (&x)[8][4], uint32_t b_tile) {
  uint32_t a[4][4];
  pack_a_fragments<T>(a, x);
  wgmma_acc_packed<T, kHeadDim>(out, a, b_tile);
}

}  // namespace sciattn::cuda

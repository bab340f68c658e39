// What the Evoformer kernels on Hopper's warpgroup MMA (evoformer_fwd_wgmma_kernel.cuh,
// evoformer_bwd_wgmma_kernels.cuh) share: their shared-memory layout, the CTAs per SM they are
// compiled for, the copy of 64 rows of a [B, N, L, H, D] slice into a swizzled tile, and the
// per-thread streams (ChunkStream) that copy whole key tiles (forward, dQ) and query tiles (dK/dV),
// and the backward's delta from the dO and O tiles a thread copied. CUDA layer.
#pragma once

#include <cstdint>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/wgmma_tiles.cuh"
#include "cuda/evoformer/evoformer_tile_copies.cuh"

namespace sciattn::cuda {

// The swizzled tiles of the CTA, each on a 1024-byte boundary from the aligned base: the forward's
// Q, K[2], V[2]; the dK/dV and dQ kernels' fixed tiles A, B (dK/dV: K, V; dQ: Q, dO) and streamed
// tiles C[2], D[2] (dK/dV: Q, dO; dQ: K, V), then the streamed query rows' lse[2][64] and
// delta[2][64] (dK/dV; the dQ kernel keeps its rows' delta in the first 64, and its O tile, when
// it reads one, takes D[1] until its first step has summed it). The bias stages
// (common/device_utils.cuh) follow at kFwdBytes or kBwdBytes; a launch asks for 1024 bytes more
// for the base's rounding.
template <int kHeadDim>
struct EvoformerWgmmaSmem {
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128,
                "swizzled rows (cuda/common/wgmma.cuh): head dim 32, 64 or 128");
  static constexpr uint32_t kTileBytes = kWgmmaRows * kHeadDim * 2;
  static constexpr uint32_t kQ = 0, kK = kTileBytes, kV = 3 * kTileBytes;
  static constexpr uint32_t kFwdBytes = 5 * kTileBytes;
  static constexpr uint32_t kA = 0, kB = kTileBytes, kC = 2 * kTileBytes, kD = 4 * kTileBytes;
  static constexpr uint32_t kStats = 6 * kTileBytes;
  static constexpr uint32_t kBwdBytes = kStats + 4 * kWgmmaRows * sizeof(float);
  // The fused backward (evoformer_bwd_fused_wgmma_kernel.cuh): the dK/dV kernel's tiles and row
  // statistics, then dS^T of the step (64 keys x 64 queries, 16-bit, rows of 128 bytes in the
  // 128-byte swizzle) on the next 1024-byte boundary; the slice's dQ and the bias stages follow
  // at kFusedBytes.
  static constexpr uint32_t kFusedDs = (kBwdBytes + 1023) / 1024 * 1024;
  static constexpr uint32_t kFusedBytes = kFusedDs + kWgmmaRows * kWgmmaRows * 2;
  // The dbias2 kernel (kDbias2Groups warpgroups of 64 query rows over one 64-key block): per
  // stage, each warpgroup's Q and dO tiles, then K and V (tile x of stage st at
  // (kDbias2Tiles st + x) kTileBytes: Q of group w at x = w, dO at kDbias2Groups + w, K and V
  // after), then lse[stages][rows], delta[stages][rows], bias1_log2[2][64] and (head dim 32) the
  // bias2 cells. Three stages at head dims 32 (72 KB of tiles, two CTAs per SM) and 64 (144 KB,
  // one), two at 128 (128 KB, one).
  static constexpr int kDbias2Groups = kHeadDim <= 64 ? 2 : 1;
  static constexpr int kDbias2Rows = kDbias2Groups * kWgmmaRows;
  static constexpr int kDbias2Tiles = 2 * kDbias2Groups + 2;
  static constexpr int kDbias2Stages = kHeadDim <= 64 ? 3 : 2;
  static constexpr uint32_t kDbias2Stats = kDbias2Stages * kDbias2Tiles * kTileBytes;
  // With two CTAs per SM (head dim 32: 128 registers a thread) each thread's 32 cells of bias2
  // wait in shared memory ([j][e][thread] fp32, 32 KB) instead of registers.
  static constexpr bool kDbias2CellsInRegisters = kHeadDim > 32;
  static constexpr uint32_t kDbias2Cells =
      kDbias2Stats + (2 * kDbias2Stages * kDbias2Rows + 2 * kWgmmaRows) * sizeof(float);
  static constexpr uint32_t kDbias2Bytes =
      kDbias2Cells +
      (kDbias2CellsInRegisters ? 0 : 32 * kDbias2Groups * kWgmmaThreads * sizeof(float));
};

// delta_i = <dO_i, O_i> of the 64 rows of two swizzled tiles of kHeadDim 16-bit columns (dO and O
// of the same rows, columns past D and rows past L zero-filled) that this thread's own copies
// filled: copy_tile_swizzled's mapping, which the slice streams share (chunk thread % kChunks of
// rows thread / kChunks + i kRowStep). Called between this thread's cp.async wait and the barrier
// that shows the tiles to the CTA, like zero_first_column_swizzled: each thread multiplies its own
// chunks, visible to it after its own wait; the kChunks threads of a row (consecutive lanes) add
// their sums by shuffles in a fixed order; the row's chunk-0 thread writes delta to
// `rows_delta[row]` (shared memory, read after the barrier) and, for rows below `rows_inside`, to
// `global_delta[row]` for the kernels that run later.
template <typename T, int kHeadDim>
__device__ __forceinline__ void delta_of_copied_rows(const unsigned char* do_tile,
                                                     const unsigned char* o_tile, float* rows_delta,
                                                     float* global_delta, int64_t rows_inside) {
  static_assert(sizeof(T) == 2, "16-bit tiles");
  constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
  constexpr int kWidth = kSwizzleBytes<kHeadDim>;
  const int c = static_cast<int>(threadIdx.x) % kChunks,
            r0 = static_cast<int>(threadIdx.x) / kChunks;
#pragma unroll
  for (int i = 0; i < kWgmmaRows / kRowStep; ++i) {
    const int row = r0 + i * kRowStep;
    const uint32_t at = swizzled_chunk_offset<kWgmmaRows, kWidth>(row, c);
    const uint4 ov = *reinterpret_cast<const uint4*>(o_tile + at);
    const uint4 gv = *reinterpret_cast<const uint4*>(do_tile + at);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* ge = reinterpret_cast<const T*>(&gv);
    float sum = 0.0f;
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      sum += ElementTraits<T>::to_float(oe[x]) * ElementTraits<T>::to_float(ge[x]);
    }
#pragma unroll
    for (int m = 1; m < kChunks; m *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (c == 0) {
      rows_delta[row] = sum;
      if (row < rows_inside) global_delta[row] = sum;
    }
  }
}

// CTAs per SM the forward, dQ and dK/dV kernels are compiled for (their shared memory allows as
// many). At head dim 32 the dK/dV kernel runs three (168 registers a thread): with four, its 128
// registers spilled and triangle 384 took 325 us instead of 281.
template <int kHeadDim>
constexpr int kEvoformerWgmmaFwdCtas = kHeadDim <= 32 ? 4 : (kHeadDim <= 64 ? 3 : 2);
template <int kHeadDim>
constexpr int kEvoformerWgmmaDqCtas = kHeadDim <= 32 ? 4 : (kHeadDim <= 64 ? 3 : 1);
template <int kHeadDim>
constexpr int kEvoformerWgmmaDkdvCtas = kHeadDim <= 64 ? 3 : 1;

// The (b, n, h) slice of a Q, K or V (16-bit) as a kernel of tiles kCols reads it: slice_of's,
// and for TileCols::kPieces with p.shifted_slices (an odd D read in place) one that starts on a
// 2-byte boundary moved back one element, shift 1 (SliceSource; the host makes Q, K and V shift
// alike, evoformer_params::forward_reads_in_place).
template <TileCols kCols>
__device__ __forceinline__ SliceSource evoformer_slice_of(const void* data, const int64_t stride[4],
                                                          int vec, const EvoformerDeviceParams& p,
                                                          int64_t b, int64_t n, int64_t h) {
  SliceSource s = slice_of(data, stride, vec, 2, b, n, h);
  if constexpr (kCols == TileCols::kPieces) {
    s.shift = p.shifted_slices & static_cast<int>((reinterpret_cast<uintptr_t>(s.base) >> 1) & 1);
    s.base = static_cast<const char*>(s.base) - 2 * s.shift;
  }
  return s;
}

// The bytes of a row of `src` that a kernel of tiles kCols copies (kPadded: the staged rows of
// p.load_dim; kPieces: the row's D, or D + 1 from the element before it in a shifted slice).
template <TileCols kCols>
__device__ __forceinline__ int slice_row_bytes(const SliceSource& src,
                                               const EvoformerDeviceParams& p) {
  if constexpr (kCols == TileCols::kPieces) {
    return static_cast<int>(2 * (p.dim + src.shift));
  } else {
    return static_cast<int>(2 * p.load_dim);
  }
}

// Rows [row0, row0 + 64) of a slice (offsets below 2^31) into the swizzled tile at `tile`; rows at
// or past L are zero-filled. kCols (the kernel's, TileCols): kExact, 16-byte aligned rows of
// exactly kHeadDim elements; kPadded, aligned rows of p.load_dim elements in whole chunks, the
// chunks past them zero-filled; kPieces, 4-byte aligned rows (slice_row_bytes) in 4-byte pieces.
// `thread`: as copy_tile_swizzled's.
template <typename T, int kHeadDim, TileCols kCols = TileCols::kExact>
__device__ __forceinline__ void copy_slice_swizzled(uint32_t tile, const SliceSource& src,
                                                    int64_t row0, const EvoformerDeviceParams& p,
                                                    int thread = static_cast<int>(threadIdx.x)) {
  const int32_t row_bytes = static_cast<int32_t>(src.row_stride * static_cast<int64_t>(sizeof(T)));
  const char* rows = static_cast<const char*>(src.base) + row0 * row_bytes;
  if constexpr (kCols != TileCols::kExact) {
    copy_tile_swizzled<kHeadDim, true, kCols == TileCols::kPieces>(
        tile, rows, row_bytes, p.len - row0, thread, slice_row_bytes<kCols>(src, p));
  } else {
    copy_tile_swizzled<kHeadDim>(tile, rows, row_bytes, p.len - row0, thread);
  }
}

// The ChunkStream of this thread's chunks of consecutive 64-row tiles of a [B, N, L, H, D] slice
// (16-bit, the host's wgmma_tiles) into the swizzled tile layout: tile t is rows [64 t, 64 t + 64).
// kCols (TileCols): kPadded, rows of p.load_dim elements, this thread's chunk zero-filled when it
// lies past them (its reads then start at the row's first chunk and read nothing); kPieces, the
// same for rows of slice_row_bytes, each chunk in 4-byte pieces.
template <int kHeadDim, TileCols kCols = TileCols::kExact>
struct SliceTileStream {
  static constexpr int kChunks = kHeadDim / 8, kRowStep = kWgmmaThreads / kChunks;
  using Stream = ChunkStream<kWgmmaRows / kRowStep, kRowStep * kSwizzleBytes<kHeadDim>,
                             kCols != TileCols::kExact, kCols == TileCols::kPieces>;
  __device__ __forceinline__ static Stream of(const SliceSource& src) {
    const int c = static_cast<int>(threadIdx.x) % kChunks,
              r = static_cast<int>(threadIdx.x) / kChunks;
    const int32_t row_bytes = static_cast<int32_t>(src.row_stride * 2);
    return {static_cast<const char*>(src.base) + (r * row_bytes + c * 16), kRowStep * row_bytes,
            kWgmmaRows * row_bytes,
            swizzled_chunk_offset<kWgmmaRows, kSwizzleBytes<kHeadDim>>(r, c)};
  }
  // The same for rows shorter than the head dim (kPadded, kPieces: slice_row_bytes): this
  // thread's chunk past them reads nothing.
  __device__ __forceinline__ static Stream of(const SliceSource& src,
                                              const EvoformerDeviceParams& p) {
    static_assert(kCols != TileCols::kExact, "rows of the head dim: of(src)");
    const int c = static_cast<int>(threadIdx.x) % kChunks;
    const int row_bytes = slice_row_bytes<kCols>(src, p);
    const int bytes = kCols == TileCols::kPieces ? chunk_bytes_inside(c, row_bytes)
                                                 : chunk_source_bytes(c, row_bytes);
    Stream stream = of(src);
    if (bytes == 0) stream.src -= c * 16;
    stream.bytes = bytes;
    return stream;
  }
};

// SliceTileStream<kHeadDim, kCols>::of for the call's rows (p read only for rows shorter than
// the head dim).
template <int kHeadDim, TileCols kCols>
__device__ __forceinline__ typename SliceTileStream<kHeadDim, kCols>::Stream slice_stream(
    const SliceSource& src, [[maybe_unused]] const EvoformerDeviceParams& p) {
  if constexpr (kCols != TileCols::kExact) {
    return SliceTileStream<kHeadDim, kCols>::of(src, p);
  } else {
    return SliceTileStream<kHeadDim, kCols>::of(src);
  }
}

// A 16-bit bias staged whole (a tile of 64 rows x 64 columns in the stage layout of
// bias_stage_pitch: 144-byte rows): thread x copies chunk x % 8 of rows x / 8 + 16 i.
using BiasTileStream = ChunkStream<4, 16 * (64 * 2 + 16)>;
__device__ __forceinline__ bool bias_streamed(BiasType type, int staged) {
  return type == BiasType::kNone ||
         ((type == BiasType::kBF16 || type == BiasType::kF16) && staged != 0);
}
// Element (0, 0) of tile 0 at `tile0` (a 16-bit bias's rows `row_stride` elements apart, the
// host's bias2_lean: 16 rows' bytes fit 32 bits), tiles `advance` bytes apart.
__device__ __forceinline__ BiasTileStream bias_tile_stream(const char* tile0, int64_t row_stride,
                                                           int32_t advance) {
  const int x = static_cast<int>(threadIdx.x);
  const int32_t row_bytes = static_cast<int32_t>(row_stride * 2);
  return {tile0 + (x / 8) * row_bytes + (x % 8) * 16, 16 * row_bytes, advance,
          static_cast<uint32_t>((x / 8) * (64 * 2 + 16) + (x % 8) * 16)};
}

// The copies of key tiles in the forward and dQ wgmma kernels (K and V rows [64 t, 64 t + 64), and
// the 16-bit staged biases' columns of them), this thread's addresses worked out once per CTA.
// `usable`: each bias absent, or 16-bit, staged and, bias2, lean; then whole key tiles take them,
// unmasked where the CTA's 64 query rows (bias2's rows) are inside L or their rows past L still
// lie inside bias2 (EvoformerKeyTileLoader::rows_streamed), else with the chunks of rows past L
// zero-filled (copy_next_masked) in the CTA of the last query rows. `last_usable`: the partial
// last key tile takes them too, masked, because every bias's rows end on a whole chunk (so a chunk
// is either inside a row or past it). Other tiles take the generic copies (copy_slice_swizzled,
// copy_key_tile_biases). kStageBias1 = false: bias1 is not copied (the forward reads it into
// registers itself). The bias types are the kernel's (evoformer_bias_types.cuh), so that fixed
// ones leave no test in the copies.
template <int kHeadDim, bool kStageBias1 = true, TileCols kCols = TileCols::kExact>
struct EvoformerKeyTileStreams {
  typename SliceTileStream<kHeadDim, kCols>::Stream k, v;
  BiasTileStream bias2;
  ChunkStream<1, 0> bias1;  // the 64 keys' 128 bytes: threads 0..7
  bool usable, last_usable, has_bias2, has_bias1;

  __device__ __forceinline__ EvoformerKeyTileStreams(const EvoformerDeviceParams& p,
                                                     const SliceSource& k_src,
                                                     const SliceSource& v_src, int64_t b, int64_t n,
                                                     int64_t h, int64_t row0, BiasType bias1_type,
                                                     BiasType bias2_type)
      : k(slice_stream<kHeadDim, kCols>(k_src, p)),
        v(slice_stream<kHeadDim, kCols>(v_src, p)),
        bias2{},
        bias1{},
        has_bias2(bias2_type != BiasType::kNone),
        has_bias1(kStageBias1 && bias1_type != BiasType::kNone) {
    usable = bias_streamed(bias2_type, p.bias2_lean) &&
             (!kStageBias1 || bias_streamed(bias1_type, p.bias1_staged));
    last_usable =
        usable && (!has_bias2 || p.bias2_cols % 8 == 0) && (!has_bias1 || p.bias1_cols % 8 == 0);
    if (has_bias2) {
      bias2 = bias_tile_stream(
          static_cast<const char*>(p.bias2) +
              (b * p.bias2_stride[0] + h * p.bias2_stride[1] + row0 * p.bias2_stride[2]) * 2,
          p.bias2_stride[2], kWgmmaRows * 2);
    }
    if (has_bias1) {
      bias1 = {static_cast<const char*>(p.bias1) +
                   (b * p.bias1_stride[0] + n * p.bias1_stride[1]) * 2 + threadIdx.x * 16,
               0, kWgmmaRows * 2, threadIdx.x * 16};
    }
  }

  // Starts key tile t's copies (shared-window addresses of its K and V tiles and bias stages).
  __device__ __forceinline__ void copy(int64_t t, uint32_t k_tile, uint32_t v_tile,
                                       uint32_t bias2_stage, uint32_t bias1_stage) const {
    k.copy(k_tile, t);
    v.copy(v_tile, t);
    if (has_bias2) bias2.copy(bias2_stage, t);
    if (has_bias1 && threadIdx.x < 8) bias1.copy(bias1_stage, t);
  }
  // The same for tiles copied in order from tile 0 (copy_next's).
  __device__ __forceinline__ void copy_next(uint32_t k_tile, uint32_t v_tile, uint32_t bias2_stage,
                                            uint32_t bias1_stage) {
    k.copy_next(k_tile);
    v.copy_next(v_tile);
    if (has_bias2) bias2.copy_next(bias2_stage);
    if (has_bias1 && threadIdx.x < 8) bias1.copy_next(bias1_stage);
  }

  // Which of this thread's copies of the key tile at col0 read a chunk inside the tensors, for a
  // CTA whose query rows start at row0: the tile's key rows below L and the CTA's query rows
  // (bias2's rows) below L, each at most 64, and whether this thread's bias chunks lie inside their
  // bias's rows. Counts in 32 bits, each copy's test made where it is used (copy_next_masked).
  struct Inside {
    int keys, rows;
    bool bias2_chunk, bias1_chunk;
  };
  __device__ __forceinline__ static Inside inside(const EvoformerDeviceParams& p, int64_t row0,
                                                  int64_t col0) {
    const int x = static_cast<int>(threadIdx.x);
    const int64_t keys = p.len - col0, rows = p.len - row0;
    return {keys < kWgmmaRows ? static_cast<int>(keys) : kWgmmaRows,
            rows < kWgmmaRows ? static_cast<int>(rows) : kWgmmaRows,
            col0 + 8 * (x % 8) + 8 <= p.bias2_cols, col0 + 8 * x + 8 <= p.bias1_cols};
  }

  // copy_next for a key tile with chunks outside the tensors (`in`, from inside()); those read
  // nothing and are zero-filled (their addresses are the tensors' first chunks: p.k, p.v,
  // p.bias2, p.bias1, whose buffers the streams' copies need 16-byte aligned).
  __device__ __forceinline__ void copy_next_masked(uint32_t k_tile, uint32_t v_tile,
                                                   uint32_t bias2_stage, uint32_t bias1_stage,
                                                   const Inside& in,
                                                   const EvoformerDeviceParams& p) {
    k.copy_next_masked(k_tile, key_rows(in), static_cast<const char*>(p.k));
    v.copy_next_masked(v_tile, key_rows(in), static_cast<const char*>(p.v));
    if (has_bias2) bias2.copy_next_masked(bias2_stage, bias2_cells(in), bias2_fallback(p));
    if (has_bias1 && threadIdx.x < 8) {
      bias1.copy_next_masked(bias1_stage, bias1_cells(in), static_cast<const char*>(p.bias1));
    }
  }
  // The same for tile t (copy's).
  __device__ __forceinline__ void copy_masked(int64_t t, uint32_t k_tile, uint32_t v_tile,
                                              uint32_t bias2_stage, uint32_t bias1_stage,
                                              const Inside& in,
                                              const EvoformerDeviceParams& p) const {
    k.copy_masked(k_tile, t, key_rows(in), static_cast<const char*>(p.k));
    v.copy_masked(v_tile, t, key_rows(in), static_cast<const char*>(p.v));
    if (has_bias2) bias2.copy_masked(bias2_stage, t, bias2_cells(in), bias2_fallback(p));
    if (has_bias1 && threadIdx.x < 8) {
      bias1.copy_masked(bias1_stage, t, bias1_cells(in), static_cast<const char*>(p.bias1));
    }
  }

 private:
  // The copies' tests: K and V copy i holds row x / kChunks + i kRowStep of the tile; bias2 copy i
  // row x / 8 + 16 i of the CTA's query rows (chunk x % 8); bias1's one copy chunk x.
  __device__ __forceinline__ static auto key_rows(const Inside& in) {
    using Slice = SliceTileStream<kHeadDim, kCols>;
    return [row = static_cast<int>(threadIdx.x) / Slice::kChunks, keys = in.keys](int i) {
      return row + i * Slice::kRowStep < keys;
    };
  }
  __device__ __forceinline__ static auto bias2_cells(const Inside& in) {
    return [row = static_cast<int>(threadIdx.x) / 8, in](int i) {
      return in.bias2_chunk && row + 16 * i < in.rows;
    };
  }
  __device__ __forceinline__ static auto bias1_cells(const Inside& in) {
    return [chunk = in.bias1_chunk](int) { return chunk; };
  }
  __device__ __forceinline__ static const char* bias2_fallback(const EvoformerDeviceParams& p) {
    return static_cast<const char*>(p.bias2);
  }
};

// The forward's and dQ's key-tile copies: K and V rows [64 t, 64 t + 64) of the (b, n, h) slice
// into the double-buffered swizzled tiles (buffer `buf` at k_tiles / v_tiles + buf * kTileBytes)
// and the tile's columns of the biases into their stages (bias2's rows row0 .. row0 + 63), whole
// tiles through EvoformerKeyTileStreams, a partial last tile and other biases through the
// generic copies (copy_slice_swizzled). In the caller's cp.async group.
template <typename T, int kHeadDim, bool kStageBias1 = true, TileCols kCols = TileCols::kExact>
struct EvoformerKeyTileLoader {
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  SliceSource k_src, v_src;
  uint32_t k_tiles, v_tiles;
  unsigned char* bias2_stages;
  unsigned char* bias1_stages;
  int bias2_stage_bytes, bias1_stage_bytes;
  int64_t b, n, h, row0;
  EvoformerKeyTileStreams<kHeadDim, kStageBias1, kCols> streams;
  // Whole key tiles take the unmasked stream copies: the CTA's 64 query rows lie inside L, or
  // there is no bias2, or bias2's rows past L of this slice still lie inside its memory
  // (p.bias2_reach: the next slice's rows, whose values reach only score rows past L).
  bool rows_streamed;

  // The bias stages start at `bias_stages` (bias2's two, then bias1's two where kStageBias1).
  __device__ __forceinline__ EvoformerKeyTileLoader(const EvoformerDeviceParams& p, int64_t b_,
                                                    int64_t n_, int64_t h_, int64_t row0_,
                                                    uint32_t k_tiles_, uint32_t v_tiles_,
                                                    unsigned char* bias_stages, BiasType bias1_type,
                                                    BiasType bias2_type)
      : k_src(evoformer_slice_of<kCols>(p.k, p.k_stride, p.vec_k, p, b_, n_, h_)),
        v_src(evoformer_slice_of<kCols>(p.v, p.v_stride, p.vec_v, p, b_, n_, h_)),
        k_tiles(k_tiles_),
        v_tiles(v_tiles_),
        bias2_stages(bias_stages),
        bias1_stages(bias_stages + 2 * bias_stage_bytes(bias2_type, kWgmmaRows)),
        bias2_stage_bytes(bias_stage_bytes(bias2_type, kWgmmaRows)),
        bias1_stage_bytes(kStageBias1 ? bias_stage_bytes(bias1_type, 1) : 0),
        b(b_),
        n(n_),
        h(h_),
        row0(row0_),
        streams(p, k_src, v_src, b_, n_, h_, row0_, bias1_type, bias2_type) {
    rows_streamed = row0 + kWgmmaRows <= p.len || !streams.has_bias2 || bias2_rows_reachable(p);
  }

  __device__ __forceinline__ uint32_t k_tile(int buf) const {
    return k_tiles + buf * Smem::kTileBytes;
  }
  __device__ __forceinline__ uint32_t v_tile(int buf) const {
    return v_tiles + buf * Smem::kTileBytes;
  }
  __device__ __forceinline__ unsigned char* bias2_stage(int buf) const {
    return bias2_stages + buf * bias2_stage_bytes;
  }
  __device__ __forceinline__ unsigned char* bias1_stage(int buf) const {
    return bias1_stages + buf * bias1_stage_bytes;
  }

  // Starts key tile `tile`'s copies into buffer `buf`.
  __device__ __forceinline__ void load(const EvoformerDeviceParams& p, int64_t tile,
                                       int buf) const {
    const int64_t col0 = tile * kWgmmaRows;
    const bool whole = col0 + kWgmmaRows <= p.len;
    if (streams.usable && whole && rows_streamed) {
      streams.copy(tile, k_tile(buf), v_tile(buf), shared_address(bias2_stage(buf)),
                   shared_address(bias1_stage(buf)));
    } else if (whole ? streams.usable : streams.last_usable) {
      streams.copy_masked(tile, k_tile(buf), v_tile(buf), shared_address(bias2_stage(buf)),
                          shared_address(bias1_stage(buf)), Streams::inside(p, row0, col0), p);
    } else {
      load_generic(p, col0, buf);
    }
  }
  // The same for a loop that loads tiles 0, 1, 2, ... in order (each exactly once).
  __device__ __forceinline__ void load_next(const EvoformerDeviceParams& p, int64_t tile, int buf) {
    const int64_t col0 = tile * kWgmmaRows;
    const bool whole = col0 + kWgmmaRows <= p.len;
    if (streams.usable && whole && rows_streamed) {
      streams.copy_next(k_tile(buf), v_tile(buf), shared_address(bias2_stage(buf)),
                        shared_address(bias1_stage(buf)));
    } else if (whole ? streams.usable : streams.last_usable) {
      streams.copy_next_masked(k_tile(buf), v_tile(buf), shared_address(bias2_stage(buf)),
                               shared_address(bias1_stage(buf)), Streams::inside(p, row0, col0), p);
    } else {
      load_generic(p, col0, buf);
    }
  }

 private:
  using Streams = EvoformerKeyTileStreams<kHeadDim, kStageBias1, kCols>;
  // Whether every chunk of bias2's rows row0 .. row0 + 63 of this slice lies inside bias2's
  // memory: the last row's first and last columns do (offsets are linear in the row).
  __device__ __forceinline__ bool bias2_rows_reachable(const EvoformerDeviceParams& p) const {
    const int64_t last =
        b * p.bias2_stride[0] + h * p.bias2_stride[1] + (row0 + kWgmmaRows - 1) * p.bias2_stride[2];
    return last >= p.bias2_reach[0] && last + p.bias2_cols - 1 <= p.bias2_reach[1];
  }
  __device__ __forceinline__ void load_generic(const EvoformerDeviceParams& p, int64_t col0,
                                               int buf) const {
    copy_slice_swizzled<T, kHeadDim, kCols>(k_tile(buf), k_src, col0, p);
    copy_slice_swizzled<T, kHeadDim, kCols>(v_tile(buf), v_src, col0, p);
    copy_key_tile_biases<kWgmmaRows, kWgmmaThreads, BiasCopyWidths::kAll, kStageBias1>(
        p, b, n, h, row0, col0, col0 + kWgmmaRows <= p.len, bias2_stage(buf), bias1_stage(buf));
  }
};

// The same for the dK/dV wgmma kernel's query tiles: Q and dO rows [64 t, 64 t + 64), their lse
// and delta (threads 0..63, one row each; no delta where delta_dst is null), and bias2's tile
// [those queries][the CTA's 64 keys]. `usable`: bias2 absent or 16-bit, staged and lean; then whole
// query tiles of a CTA whose keys are inside L take copy, and a partial last query tile takes
// copy_masked. `last_usable`: the CTA of the last keys, whose bias2 columns reach past L, takes
// copy_masked too, because bias2's rows end on a whole chunk.
template <int kHeadDim, TileCols kCols = TileCols::kExact>
struct EvoformerQueryTileStreams {
  typename SliceTileStream<kHeadDim, kCols>::Stream q, dout;
  BiasTileStream bias2;
  const float* lse;  // row threadIdx.x of tile 0 (threads 0..63)
  const float* delta;
  int64_t lse_advance;  // elements from a tile's lse row to the next tile's
  bool usable, last_usable, has_bias2;

  __device__ __forceinline__ EvoformerQueryTileStreams(const EvoformerDeviceParams& p,
                                                       const SliceSource& q_src,
                                                       const SliceSource& do_src, int64_t b,
                                                       int64_t bn, int64_t h, int64_t key0,
                                                       BiasType bias2_type)
      : q(slice_stream<kHeadDim, kCols>(q_src, p)),
        dout(slice_stream<kHeadDim, kCols>(do_src, p)),
        bias2{},
        lse(p.lse + bn * p.lse_stride[0] + h * p.lse_stride[1] + threadIdx.x * p.lse_stride[2]),
        delta(p.delta + (bn * p.heads + h) * p.len + threadIdx.x),
        lse_advance(kWgmmaRows * p.lse_stride[2]),
        has_bias2(bias2_type != BiasType::kNone) {
    usable = bias_streamed(bias2_type, p.bias2_lean);
    last_usable = usable && (!has_bias2 || p.bias2_cols % 8 == 0);
    if (has_bias2) {
      bias2 = bias_tile_stream(static_cast<const char*>(p.bias2) +
                                   (b * p.bias2_stride[0] + h * p.bias2_stride[1] + key0) * 2,
                               p.bias2_stride[2],
                               static_cast<int32_t>(kWgmmaRows * p.bias2_stride[2] * 2));
    }
  }

  __device__ __forceinline__ void copy(int64_t t, uint32_t q_tile, uint32_t do_tile, float* lse_dst,
                                       float* delta_dst, uint32_t bias2_stage) const {
    q.copy(q_tile, t);
    dout.copy(do_tile, t);
    if (threadIdx.x < kWgmmaRows) {
      cp_async_4(lse_dst + threadIdx.x, lse + t * lse_advance, 4);
      if (delta_dst != nullptr) cp_async_4(delta_dst + threadIdx.x, delta + t * kWgmmaRows, 4);
    }
    if (has_bias2) bias2.copy(bias2_stage, t);
  }

  // copy for a query tile with chunks outside the tensors: Q and dO rows at or past L, bias2's
  // rows there and its chunks past bias2's columns (keys from key0) zero-filled, reading nothing
  // (their addresses are the tile's first chunks: `q0_row`, `do0_row`, `bias2_0`); the rows past
  // L get lse = +inf and delta = 0 (load_row_stats's).
  __device__ __forceinline__ void copy_masked(const EvoformerDeviceParams& p, int64_t t,
                                              int64_t key0, uint32_t q_tile, uint32_t do_tile,
                                              float* lse_dst, float* delta_dst,
                                              uint32_t bias2_stage, const char* q0_row,
                                              const char* do0_row, const char* bias2_0) const {
    using Slice = SliceTileStream<kHeadDim, kCols>;
    const int x = static_cast<int>(threadIdx.x);
    const int64_t rows_inside = p.len - t * kWgmmaRows;
    uint32_t rows = 0;
#pragma unroll
    for (int i = 0; i < kWgmmaRows / Slice::kRowStep; ++i) {
      if (x / Slice::kChunks + i * Slice::kRowStep < rows_inside) rows |= 1u << i;
    }
    q.copy_masked(q_tile, t, ChunkBits{rows}, q0_row);
    dout.copy_masked(do_tile, t, ChunkBits{rows}, do0_row);
    if (x < kWgmmaRows) {
      if (x < rows_inside) {
        cp_async_4(lse_dst + x, lse + t * lse_advance, 4);
        if (delta_dst != nullptr) cp_async_4(delta_dst + x, delta + t * kWgmmaRows, 4);
      } else {
        lse_dst[x] = __builtin_huge_valf();
        if (delta_dst != nullptr) delta_dst[x] = 0.0f;
      }
    }
    if (has_bias2) {
      const bool chunk = key0 + 8 * (x % 8) + 8 <= p.bias2_cols;
      uint32_t cells = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (chunk && x / 8 + 16 * i < rows_inside) cells |= 1u << i;
      }
      bias2.copy_masked(bias2_stage, t, ChunkBits{cells}, bias2_0);
    }
  }
};

}  // namespace sciattn::cuda

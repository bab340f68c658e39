// The tile copies that the Evoformer kernels' loops repeat every iteration (the next 64 rows of K
// and V, or of Q and dO, and the bias tiles that go with them), for tiles that lie wholly inside
// the moving dimension: every 16-byte chunk is either inside or outside the tensor, so a copy is
// a fixed, unrolled set of cp.async with 32-bit bounds tests, its geometry (chunks per row, rows
// per thread, stage pitch) known at compile time. The generic copies (load_tile,
// stage_bias_tile), which also handle a partial last tile, unaligned tensors and rows that end
// inside a chunk, tested every chunk against 64-bit bounds and clamps: ~370 instructions per key
// tile and thread in the forward at head dim 32, against ~470 for all of the score and softmax
// work (docs/perf/evoformer_cuda.md v15). A first version kept per-stream state (pointers and
// steps) across the loop; at the backward kernels' 128-register cap that spilled (dK/dV: 146
// bytes), so the copies here derive everything from values the loop holds anyway.
// The usual tile (every chunk inside, D a whole tile, offsets below 2^31: p.lean_tiles,
// p.bias2_lean) takes copy_tile_lean: the tile's base, computed from the CTA's coordinates in the
// uniform datapath, plus a 32-bit offset per thread, with no test or select per chunk (with v17's
// other changes: 17% fewer instructions in the forward at triangle 256, docs/perf v17).
// CUDA layer.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/device_utils.cuh"

namespace sciattn::cuda {

// The shared-window address of a pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* smem) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(smem));
}

// cp.async of 16 bytes to a shared-window address; zero-fills when `bytes` is 0 (then nothing is
// read from `src`).
__device__ __forceinline__ void cp_async_16_to(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// Starts 16-byte cp.async copies of a tile of kRows rows of kRowChunks chunks whose element
// (0, 0) is at `tile` (inside the tensor) and whose rows are `row_stride` bytes apart, into the
// stage at shared address `stage` (rows kPitchBytes apart), in the caller's group; chunks of rows
// >= rows_inside or columns >= chunks_inside are zero-filled. Thread x owns chunk column x %
// kRowChunks and every (kThreads / kRowChunks)-th row from x / kRowChunks, as copy_rows_async.
template <int kRows, int kRowChunks, int kPitchBytes, int kThreads>
__device__ __forceinline__ void copy_tile(uint32_t stage, const char* tile, int64_t row_stride,
                                          int rows_inside, int chunks_inside) {
  static_assert(kThreads % kRowChunks == 0, "a thread's chunk column must not change");
  constexpr int kRowStep = kThreads / kRowChunks;
  constexpr int kIters = (kRows + kRowStep - 1) / kRowStep;
  const int c = static_cast<int>(threadIdx.x) % kRowChunks;
  const int r0 = static_cast<int>(threadIdx.x) / kRowChunks;
  const bool column_inside = c < chunks_inside;
  const char* src = tile + r0 * row_stride + c * 16;
  const int64_t src_step = kRowStep * row_stride;
  const uint32_t dst = stage + static_cast<uint32_t>(r0 * kPitchBytes + c * 16);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int r = r0 + i * kRowStep;
    if (kRows % kRowStep != 0 && r >= kRows) break;
    const bool inside = column_inside && r < rows_inside;
    cp_async_16_to(dst + i * kRowStep * kPitchBytes, inside ? src : tile, inside ? 16 : 0);
    src += src_step;
  }
}

// copy_tile for a tile wholly inside its tensor whose byte offsets fit 31 bits (p.lean_tiles,
// p.bias2_lean): no bounds test or source select per chunk, and a thread's addresses are the
// tile's (per-CTA, uniform) base plus a 32-bit offset.
template <int kRows, int kRowChunks, int kPitchBytes, int kThreads>
__device__ __forceinline__ void copy_tile_lean(uint32_t stage, const char* tile,
                                               int32_t row_bytes) {
  static_assert(kThreads % kRowChunks == 0, "a thread's chunk column must not change");
  constexpr int kRowStep = kThreads / kRowChunks;
  constexpr int kIters = (kRows + kRowStep - 1) / kRowStep;
  const int c = static_cast<int>(threadIdx.x) % kRowChunks;
  const int r0 = static_cast<int>(threadIdx.x) / kRowChunks;
  const char* src = tile + (r0 * row_bytes + c * 16);
  const uint32_t dst = stage + static_cast<uint32_t>(r0 * kPitchBytes + c * 16);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    if (kRows % kRowStep != 0 && r0 + i * kRowStep >= kRows) break;
    cp_async_16_to(dst + i * kRowStep * kPitchBytes, src + i * kRowStep * row_bytes, 16);
  }
}

// Rows [row0, row0 + kRows) of a Q/K/V/dO slice with copy_tile_lean (p.lean_tiles, the rows
// inside L).
template <typename T, int kRows, int kTileDim, int kPitch, int kThreads>
__device__ __forceinline__ void copy_slice_tile_lean(T* stage, const SliceSource& src,
                                                     int64_t row0) {
  const int32_t row_bytes = static_cast<int32_t>(src.row_stride * sizeof(T));
  copy_tile_lean<kRows, kTileDim / 8, kPitch* static_cast<int>(sizeof(T)), kThreads>(
      shared_address(stage), static_cast<const char*>(src.base) + row0 * row_bytes, row_bytes);
}

// The lse and delta of query rows [q0, q0 + kRows), all inside L, into shared memory: threads
// 0 .. kRows - 1 copy one of each, in the caller's cp.async group.
template <int kRows, int kThreads>
__device__ __forceinline__ void copy_row_stats_whole(float* lse, float* delta,
                                                     const EvoformerDeviceParams& p, int64_t bn,
                                                     int64_t h, int64_t q0) {
  static_assert(kThreads >= kRows, "one thread per query row's statistics");
  const int r = static_cast<int>(threadIdx.x);
  if (r < kRows) {
    cp_async_4(lse + r,
               p.lse + bn * p.lse_stride[0] + h * p.lse_stride[1] + (q0 + r) * p.lse_stride[2], 4);
    cp_async_4(delta + r, p.delta + (bn * p.heads + h) * p.len + q0 + r, 4);
  }
}

// Rows [row0, row0 + kRows) of a Q/K/V/dO slice, all inside it, as load_tile copies them (chunks
// at or past dim zero-filled). src.vec slices only.
template <typename T, int kRows, int kTileDim, int kPitch, int kThreads>
__device__ __forceinline__ void copy_whole_slice_tile(T* stage, const SliceSource& src,
                                                      int64_t row0, int64_t dim) {
  const int64_t row_bytes = src.row_stride * static_cast<int64_t>(sizeof(T));
  copy_tile<kRows, kTileDim / 8, kPitch* static_cast<int>(sizeof(T)), kThreads>(
      shared_address(stage), static_cast<const char*>(src.base) + row0 * row_bytes, row_bytes,
      kRows, static_cast<int>((dim + 7) / 8));
}

// Which bias element widths a kernel copies with copy_bias_tile: all, or only 2 bytes (a bias in
// the inputs' dtype, AlphaFold's case). Each width is its own unrolled copy; in the backward
// kernels, at their 128-register cap, the three together cost 36-52 bytes of spill (head dim 32),
// so they take the generic copy for fp32 and boolean biases.
enum class BiasCopyWidths { kAll, kTwoBytes };
template <BiasCopyWidths kWidths>
__device__ __forceinline__ bool bias_width_copied(BiasType type) {
  return kWidths == BiasCopyWidths::kAll || bias_bytes(type) == 2;
}

// Whether a bias tile whose rows hold `cols_inside` (<= 64) elements inside the tensor can be
// copied by copy_bias_tile: its rows end on a 16-byte chunk (else the last chunk needs
// stage_bias_tile's element-wise copy).
__device__ __forceinline__ bool bias_rows_end_on_chunk(BiasType type, int64_t cols_inside) {
  return cols_inside >= 64 || (cols_inside * static_cast<int64_t>(bias_bytes(type))) % 16 == 0;
}

// stage_bias_tile's asynchronous copy (kRows rows of 64 elements, rows padded by 16 bytes) for a
// tile whose rows end on a 16-byte chunk (bias_rows_end_on_chunk): element (0, 0) at element
// `offset` of `base`, rows `row_stride` elements apart, rows_inside rows and cols_inside columns
// inside. `lean` (the bias's *_lean condition, or a single row) lets a tile wholly inside take
// copy_tile_lean.
template <int kRows, int kThreads, BiasCopyWidths kWidths>
__device__ __forceinline__ void copy_bias_tile(unsigned char* stage, const void* base,
                                               BiasType type, int64_t offset, int64_t row_stride,
                                               int rows_inside, int cols_inside, bool lean) {
  const uint32_t to = shared_address(stage);
  const int elem = static_cast<int>(bias_bytes(type));
  const char* tile = static_cast<const char*>(base) + offset * elem;
  const int chunks_inside = cols_inside * elem / 16;
  const auto copy = [&](auto elem_bytes) {
    constexpr int kElem = decltype(elem_bytes)::value;
    constexpr int kChunks = 4 * kElem, kPitchBytes = 64 * kElem + 16;
    if (lean && rows_inside >= kRows && chunks_inside == kChunks) {
      copy_tile_lean<kRows, kChunks, kPitchBytes, kThreads>(
          to, tile, static_cast<int32_t>(row_stride * kElem));
    } else {
      copy_tile<kRows, kChunks, kPitchBytes, kThreads>(to, tile, row_stride * kElem, rows_inside,
                                                       chunks_inside);
    }
  };
  if constexpr (kWidths == BiasCopyWidths::kTwoBytes) {
    copy(std::integral_constant<int, 2>{});
    return;
  }
  switch (elem) {
    case 4:
      copy(std::integral_constant<int, 4>{});
      break;
    case 2:
      copy(std::integral_constant<int, 2>{});
      break;
    default:
      copy(std::integral_constant<int, 1>{});
      break;
  }
}

// Starts copying the lse and delta of query rows [q0, q0 + kRows) into shared memory, in the
// caller's cp.async group (plain loads here would stall every thread at the next barrier).
// Rows past L get lse = +inf and delta = 0, so that their P = exp2(x - inf) is exactly 0 whatever
// the biases are, and a padded row adds nothing anywhere without a per-element check.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_row_stats(float* lse, float* delta,
                                               const EvoformerDeviceParams& p, int64_t bn,
                                               int64_t h, int64_t q0) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int64_t q = q0 + r;
    if (q < p.len) {
      cp_async_4(lse + r, p.lse + bn * p.lse_stride[0] + h * p.lse_stride[1] + q * p.lse_stride[2],
                 4);
      cp_async_4(delta + r, p.delta + (bn * p.heads + h) * p.len + q, 4);
    } else {
      lse[r] = __builtin_huge_valf();
      delta[r] = 0.0f;
    }
  }
}

// Rows [row0, row0 + 64) of two slices of one head (K and V, or Q and dO) into their stages:
// the lean copy when the tile is whole and both are aligned, load_tile otherwise.
template <typename T, int kTileDim, int kPitch, int kThreads>
__device__ __forceinline__ void copy_slice_pair_tile(const EvoformerDeviceParams& p, bool whole,
                                                     const SliceSource& a_src, T* a_dst,
                                                     const SliceSource& b_src, T* b_dst,
                                                     int64_t row0) {
  constexpr int kRows = 64;
  if (whole && p.lean_tiles) {
    copy_slice_tile_lean<T, kRows, kTileDim, kPitch, kThreads>(a_dst, a_src, row0);
    copy_slice_tile_lean<T, kRows, kTileDim, kPitch, kThreads>(b_dst, b_src, row0);
  } else if (whole && a_src.vec && b_src.vec) {
    copy_whole_slice_tile<T, kRows, kTileDim, kPitch, kThreads>(a_dst, a_src, row0, p.dim);
    copy_whole_slice_tile<T, kRows, kTileDim, kPitch, kThreads>(b_dst, b_src, row0, p.dim);
  } else {
    load_tile<T, kRows, kTileDim, kPitch, kThreads>(a_dst, a_src, row0, p.len, p.dim);
    load_tile<T, kRows, kTileDim, kPitch, kThreads>(b_dst, b_src, row0, p.len, p.dim);
  }
}

// The bias copies of one key tile for the kernels whose CTA holds a block of kRows query rows from
// row0 and loops over 64-key tiles (the forward and dQ): its bias2 tile [query rows][keys] and its
// bias1 entries (kBias1: the forward on the warpgroup MMA reads bias1 itself), each into the
// stage the caller names, in the caller's cp.async group. `whole`: the key tile lies inside L
// (lean copies where the bias allows them; the generic ones else).
template <int kRows, int kThreads, BiasCopyWidths kWidths, bool kBias1 = true>
__device__ __forceinline__ void copy_key_tile_biases(const EvoformerDeviceParams& p, int64_t b,
                                                     int64_t n, int64_t h, int64_t row0,
                                                     int64_t col0, bool whole,
                                                     unsigned char* bias2_stage,
                                                     unsigned char* bias1_stage) {
  constexpr int kKeys = 64;
  const int64_t rows_inside = p.len - row0;
  if (p.bias2_type != BiasType::kNone) {
    const int64_t offset =
        b * p.bias2_stride[0] + h * p.bias2_stride[1] + row0 * p.bias2_stride[2] + col0;
    if (whole && p.bias2_staged && bias_width_copied<kWidths>(p.bias2_type)) {
      copy_bias_tile<kRows, kThreads, kWidths>(
          bias2_stage, p.bias2, p.bias2_type, offset, p.bias2_stride[2],
          static_cast<int>(rows_inside < kRows ? rows_inside : kRows), kKeys, p.bias2_lean);
    } else {
      stage_bias_tile<kRows, kThreads>(bias2_stage, p.bias2, p.bias2_type, offset,
                                       p.bias2_stride[2], rows_inside, p.len - col0,
                                       p.bias2_staged);
    }
  }
  if (kBias1 && p.bias1_type != BiasType::kNone) {
    const int64_t offset = b * p.bias1_stride[0] + n * p.bias1_stride[1] + col0;
    if (whole && p.bias1_staged && bias_width_copied<kWidths>(p.bias1_type)) {
      copy_bias_tile<1, kThreads, kWidths>(bias1_stage, p.bias1, p.bias1_type, offset, 0, 1, kKeys,
                                           true);
    } else {
      stage_bias_tile<1, kThreads>(bias1_stage, p.bias1, p.bias1_type, offset, 0, 1, p.len - col0,
                                   p.bias1_staged);
    }
  }
}

// The copies of one key tile for the forward and dQ kernels: the tile's K and V rows and its
// biases (copy_key_tile_biases), in the caller's cp.async group. Whole key tiles take the lean
// copies above; a partial last tile and unaligned tensors the generic ones.
template <typename T, int kRows, int kTileDim, int kPitch, int kThreads, BiasCopyWidths kWidths>
__device__ __forceinline__ void copy_key_tile(const EvoformerDeviceParams& p,
                                              const SliceSource& k_src, const SliceSource& v_src,
                                              int64_t b, int64_t n, int64_t h, int64_t row0,
                                              T* k_dst, T* v_dst, unsigned char* bias2_stage,
                                              unsigned char* bias1_stage, int64_t col0) {
  const bool whole = col0 + 64 <= p.len;
  copy_slice_pair_tile<T, kTileDim, kPitch, kThreads>(p, whole, k_src, k_dst, v_src, v_dst, col0);
  copy_key_tile_biases<kRows, kThreads, kWidths>(p, b, n, h, row0, col0, whole, bias2_stage,
                                                 bias1_stage);
}

// The row statistics and bias copies of one query tile for the dK/dV kernel (one CTA = one
// block of 64 keys from key0, looping over 64-query tiles): its rows' lse and delta and its bias2
// tile [queries][keys], in the caller's cp.async group. `whole`: the query tile lies inside L
// (then the bias2 tile takes the lean copy when its rows end on a 16-byte chunk; a last key
// block of a length that is not a multiple of 8 may not); the generic copies else.
template <int kThreads>
__device__ __forceinline__ void copy_query_tile_stats_and_bias(const EvoformerDeviceParams& p,
                                                               int64_t b, int64_t bn, int64_t h,
                                                               int64_t key0, int64_t q0, bool whole,
                                                               float* lse_dst, float* delta_dst,
                                                               unsigned char* bias2_stage) {
  constexpr int kQueries = 64;
  if (whole) {
    copy_row_stats_whole<kQueries, kThreads>(lse_dst, delta_dst, p, bn, h, q0);
  } else {
    load_row_stats<kQueries, kThreads>(lse_dst, delta_dst, p, bn, h, q0);
  }
  if (p.bias2_type != BiasType::kNone) {
    const int64_t offset =
        b * p.bias2_stride[0] + h * p.bias2_stride[1] + q0 * p.bias2_stride[2] + key0;
    const int64_t cols_inside = p.len - key0 < kQueries ? p.len - key0 : kQueries;
    if (whole && p.bias2_staged && bias_width_copied<BiasCopyWidths::kTwoBytes>(p.bias2_type) &&
        bias_rows_end_on_chunk(p.bias2_type, cols_inside)) {
      copy_bias_tile<kQueries, kThreads, BiasCopyWidths::kTwoBytes>(
          bias2_stage, p.bias2, p.bias2_type, offset, p.bias2_stride[2], kQueries,
          static_cast<int>(cols_inside), p.bias2_lean);
    } else {
      stage_bias_tile<kQueries, kThreads>(bias2_stage, p.bias2, p.bias2_type, offset,
                                          p.bias2_stride[2], p.len - q0, cols_inside,
                                          p.bias2_staged);
    }
  }
}

// The copies of one query tile for the dK/dV kernel: the tile's Q and dO rows (lean copies for
// whole tiles, as copy_key_tile), then copy_query_tile_stats_and_bias.
template <typename T, int kTileDim, int kPitch, int kThreads>
__device__ __forceinline__ void copy_query_tile(const EvoformerDeviceParams& p,
                                                const SliceSource& q_src, const SliceSource& do_src,
                                                int64_t b, int64_t bn, int64_t h, int64_t key0,
                                                T* q_dst, T* do_dst, float* lse_dst,
                                                float* delta_dst, unsigned char* bias2_stage,
                                                int64_t q0) {
  const bool whole = q0 + 64 <= p.len;
  copy_slice_pair_tile<T, kTileDim, kPitch, kThreads>(p, whole, q_src, q_dst, do_src, do_dst, q0);
  copy_query_tile_stats_and_bias<kThreads>(p, b, bn, h, key0, q0, whole, lse_dst, delta_dst,
                                           bias2_stage);
}

}  // namespace sciattn::cuda

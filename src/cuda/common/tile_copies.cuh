// Tile copies for kernel loops that copy a tile of rows every iteration (the next 64 rows of K
// and V, or of Q and dO, and the bias tiles that go with them), for tiles that lie wholly inside
// the moving dimension: every 16-byte chunk is either inside or outside the tensor, so a copy is
// a fixed, unrolled set of cp.async with 32-bit bounds tests, its geometry (chunks per row, rows
// per thread, stage pitch) known at compile time. The generic copies of device_utils.cuh
// (load_tile, stage_bias_tile), which also handle a partial last tile, unaligned tensors and rows
// that end inside a chunk, test every chunk against 64-bit bounds and clamp: ~370 instructions
// per key tile and thread in the Evoformer forward at head dim 32, against ~470 for all of its
// score and softmax work. The copies keep no per-stream state (pointers and steps) across the
// loop: at the backward kernels' 128-register cap such state spilled (146 bytes in dK/dV), so
// they derive everything from values the loop holds anyway.
// The usual tile (every chunk inside, D a whole tile, offsets below 2^31) takes copy_tile_lean:
// the tile's base, computed from the CTA's coordinates in the uniform datapath, plus a 32-bit
// offset per thread, with no test or select per chunk (together with the grid decoding of
// fast_divisor.h, 17% fewer instructions in the Evoformer forward at triangle 256).
// CUDA layer, shared by the kernel families.
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
// cp.async of 4 bytes to a shared-window address (both 4-byte aligned), reading `bytes` (0, 2 or
// 4; the rest zero-filled, nothing read for 0). Cached in L1 (.ca, the only form below 16 bytes),
// which serves a 16-byte chunk's other pieces.
__device__ __forceinline__ void cp_async_4_to(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
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

}  // namespace sciattn::cuda

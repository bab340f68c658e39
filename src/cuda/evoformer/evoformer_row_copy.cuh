// The device side of the row copies (evoformer_row_copy.cu's kernel): copy_rows, one block's share
// of one padded copy (EvoformerRowCopyArgs), each thread writing whole 16-byte chunks of packed,
// padded rows. A header so that the kernel emulator (tests/cuda/emulation) runs the same code.
// CUDA layer (device code).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/fast_divisor.h"
#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

// Element type of each width: the copy moves bits and never converts.
template <int kBytes>
struct CopyBits;
template <>
struct CopyBits<1> {
  using type = uint8_t;
};
template <>
struct CopyBits<2> {
  using type = uint16_t;
};
template <>
struct CopyBits<4> {
  using type = uint32_t;
};

// Word `first + k` of w (k in 0..3: the shift's whole words), by selects so that w stays in
// registers.
template <int kFirst>
__device__ __forceinline__ uint32_t word_at(const uint32_t (&w)[8], int k) {
  uint32_t r = w[kFirst];
  r = k == 1 ? w[kFirst + 1] : r;
  r = k == 2 ? w[kFirst + 2] : r;
  r = k == 3 ? w[kFirst + 3] : r;
  return r;
}

// The low 32 bits of (hi:lo) >> bits (bits < 32): one funnel shift on the GPU.
__device__ __forceinline__ uint32_t shift_pair_right(uint32_t lo, uint32_t hi, int bits) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, static_cast<unsigned>(bits));
#else
  return static_cast<uint32_t>(((uint64_t{hi} << 32) | lo) >> bits);
#endif
}

// The 16 bytes at `at` (any alignment) from the aligned 16-byte blocks that cover them, one load
// each, shifted into place: two loads and a few selects and funnel shifts instead of one load per
// element. Both blocks must lie inside the tensor's memory.
__device__ __forceinline__ uint4 load_16_bytes(const unsigned char* at) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(at);
  const uint4* block = reinterpret_cast<const uint4*>(address & ~uintptr_t{15});
  const int offset = static_cast<int>(address & 15);
  const uint4 first = block[0];
  if (offset == 0) return first;
  const uint4 second = block[1];
  const uint32_t w[8] = {first.x,  first.y,  first.z,  first.w,
                         second.x, second.y, second.z, second.w};
  const int k = offset / 4, bits = (offset % 4) * 8;
  const uint32_t v[5] = {word_at<0>(w, k), word_at<1>(w, k), word_at<2>(w, k), word_at<3>(w, k),
                         word_at<4>(w, k)};
  return {shift_pair_right(v[0], v[1], bits), shift_pair_right(v[1], v[2], bits),
          shift_pair_right(v[2], v[3], bits), shift_pair_right(v[3], v[4], bits)};
}

// The row of chunk x (its coordinates over outer) and the chunk's first element in it.
struct ChunkAt {
  int64_t i[4], j0;
};
// By divisions of Index (uint32_t where every chunk's index fits: a fraction of 64-bit ones).
template <typename Index>
__device__ __forceinline__ ChunkAt chunk_at(Index x, Index chunks_per_row, Index o1, Index o2,
                                            Index o3, int per_chunk) {
  Index row = x / chunks_per_row;
  const int64_t j0 = static_cast<int64_t>(x - row * chunks_per_row) * per_chunk;
  const Index i3 = row % o3;
  row /= o3;
  const Index i2 = row % o2;
  row /= o2;
  const Index i1 = row % o1, i0 = row / o1;
  return {{static_cast<int64_t>(i0), static_cast<int64_t>(i1), static_cast<int64_t>(i2),
           static_cast<int64_t>(i3)},
          j0};
}
// By the copy's fast divisors (x < 2^31): a multiply-high, an add and a shift per division
// instead of a ~20-instruction sequence, which held the copies at 2.2-2.6 TB/s.
__device__ __forceinline__ ChunkAt chunk_at_fast(uint32_t x, const EvoformerRowCopyArgs& a,
                                                 int per_chunk) {
  QuotientRemainder r = fast_divmod(x, a.row_chunks_div);
  const int64_t j0 = static_cast<int64_t>(r.remainder) * per_chunk;
  r = fast_divmod(r.quotient, a.outer_div[2]);
  const uint32_t i3 = r.remainder;
  r = fast_divmod(r.quotient, a.outer_div[1]);
  const uint32_t i2 = r.remainder;
  r = fast_divmod(r.quotient, a.outer_div[0]);
  return {{r.quotient, r.remainder, i2, i3}, j0};
}

// This block's share of copy `a` (a grid-stride loop over its chunks along x). Index: uint32_t
// where every chunk's index fits (its divisions are a fraction of 64-bit ones), else int64_t;
// kFast: every index below 2^31, the divisions by the copy's fast divisors.
// A row with unit stride along it has its chunk's elements loaded as one shifted 16-byte load
// (load_16_bytes) wherever the two blocks it reads lie inside the tensor's aligned blocks; the
// chunks at the tensor's ends and strided rows load element by element.
template <int kBytes, typename Index, bool kFast>
__device__ void copy_rows(const EvoformerRowCopyArgs& a) {
  static_assert(!kFast || std::is_same_v<Index, uint32_t>, "fast divisors take 32-bit indices");
  using E = typename CopyBits<kBytes>::type;
  constexpr int kPerChunk = 16 / kBytes;
  const Index chunks_per_row = static_cast<Index>(a.row / kPerChunk);
  const Index o1 = static_cast<Index>(a.outer[1]), o2 = static_cast<Index>(a.outer[2]),
              o3 = static_cast<Index>(a.outer[3]);
  const Index chunks = static_cast<Index>(a.outer[0]) * o1 * o2 * o3 * chunks_per_row;
  const E* src = static_cast<const E*>(a.src);
  uint4* dst = static_cast<uint4*>(a.dst);
  // The aligned 16-byte blocks wholly inside the tensor's memory: [blocks_begin, blocks_end).
  const uintptr_t blocks_begin =
      (reinterpret_cast<uintptr_t>(src + a.reach[0]) + 15) & ~uintptr_t{15};
  const uintptr_t blocks_end = reinterpret_cast<uintptr_t>(src + a.reach[1] + 1) & ~uintptr_t{15};
  const bool unit_stride = a.len_stride == 1;
  for (Index x = blockIdx.x * Index{blockDim.x} + threadIdx.x; x < chunks;
       x += Index{gridDim.x} * blockDim.x) {
    ChunkAt c;
    if constexpr (kFast) {
      c = chunk_at_fast(x, a, kPerChunk);
    } else {
      c = chunk_at<Index>(x, chunks_per_row, o1, o2, o3, kPerChunk);
    }
    const int64_t j0 = c.j0;
    if (j0 >= a.len) {  // a chunk wholly past the row (staged rows may end 8 or more past D)
      dst[x] = uint4{0u, 0u, 0u, 0u};
      continue;
    }
    const E* from = src + c.i[0] * a.outer_stride[0] + c.i[1] * a.outer_stride[1] +
                    c.i[2] * a.outer_stride[2] + c.i[3] * a.outer_stride[3];
    union {
      uint4 chunk;
      E elems[kPerChunk];
    } out;
    const uintptr_t at = reinterpret_cast<uintptr_t>(from + j0);
    const uintptr_t blocks_read = (at & ~uintptr_t{15}) + ((at & 15) != 0 ? 32 : 16);
    if (unit_stride && (at & ~uintptr_t{15}) >= blocks_begin && blocks_read <= blocks_end) {
      out.chunk = load_16_bytes(reinterpret_cast<const unsigned char*>(at));
      if (j0 + kPerChunk > a.len) {
#pragma unroll
        for (int e = 0; e < kPerChunk; ++e) {
          if (j0 + e >= a.len) out.elems[e] = E{0};
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < kPerChunk; ++e) {
        const int64_t j = j0 + e;
        out.elems[e] = j < a.len ? from[j * a.len_stride] : E{0};
      }
    }
    dst[x] = out.chunk;
  }
}

}  // namespace sciattn::cuda

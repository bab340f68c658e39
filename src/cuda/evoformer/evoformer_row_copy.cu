// The padded copies of biases and inputs whose rows do not start on 16-byte boundaries or do not
// end on one (detail::CudaInputCopies), all of a call's in one launch: blockIdx.y picks the copy,
// and each thread writes one 16-byte chunk of a packed, padded row at a time, gathering its
// elements from the tensor in whatever strides it has (rows with unit stride as shifted 16-byte
// loads), zeros past the row's end. It reads each
// tensor once and writes it once, about the bytes of one of the kernels' own passes over it; one
// launch instead of one per copy saves a launch's latency and tail per extra copy (the two bias
// copies of a short length took 3.5-3.9 us each on the H100, mostly that). Overlapped with the
// kernels before and after it on sm_90 (overlapped_launch.h). CUDA layer.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/overlapped_launch.h"
#include "cuda/evoformer/evoformer_launch.h"

namespace sciattn::cuda {
namespace {

// Element type of each width: the copy moves bits and never converts.
template <int kBytes>
struct Bits;
template <>
struct Bits<1> {
  using type = uint8_t;
};
template <>
struct Bits<2> {
  using type = uint16_t;
};
template <>
struct Bits<4> {
  using type = uint32_t;
};

int64_t chunks_of(const EvoformerRowCopyArgs& a) {
  return a.outer[0] * a.outer[1] * a.outer[2] * a.outer[3] * (a.row * a.elem_bytes / 16);
}

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
  return {__funnelshift_r(v[0], v[1], bits), __funnelshift_r(v[1], v[2], bits),
          __funnelshift_r(v[2], v[3], bits), __funnelshift_r(v[3], v[4], bits)};
}

// This block's share of copy `a` (a grid-stride loop over its chunks along x). Index: uint32_t
// where every chunk's index fits (its divisions are a fraction of 64-bit ones), else int64_t.
// A row with unit stride along it has its chunk's elements loaded as one shifted 16-byte load
// (load_16_bytes) wherever the two blocks it reads lie inside the tensor's aligned blocks; the
// chunks at the tensor's ends and strided rows load element by element.
template <int kBytes, typename Index>
__device__ void copy_rows(const EvoformerRowCopyArgs& a) {
  using E = typename Bits<kBytes>::type;
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
    Index row = x / chunks_per_row;
    const int64_t j0 = static_cast<int64_t>(x - row * chunks_per_row) * kPerChunk;
    const Index i3 = row % o3;
    row /= o3;
    const Index i2 = row % o2;
    row /= o2;
    const Index i1 = row % o1, i0 = row / o1;
    const E* from = src + i0 * a.outer_stride[0] + i1 * a.outer_stride[1] + i2 * a.outer_stride[2] +
                    i3 * a.outer_stride[3];
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

// The copies of `jobs`, copy blockIdx.y in this block (__grid_constant__: the copy is picked at
// run time from the parameters without first copying them all to local memory).
template <typename Index>
__global__ void evoformer_row_copies_kernel(const __grid_constant__ EvoformerCopyJobs jobs) {
  enter_overlapped_grid();
  const EvoformerRowCopyArgs& a = jobs.job[blockIdx.y];
  switch (a.elem_bytes) {
    case 1:
      copy_rows<1, Index>(a);
      break;
    case 2:
      copy_rows<2, Index>(a);
      break;
    default:
      copy_rows<4, Index>(a);
      break;
  }
}

}  // namespace

cudaError_t launch_evoformer_row_copies(const EvoformerCopyJobs& jobs, bool overlap,
                                        cudaStream_t stream) {
  int64_t most = 0;
  for (int i = 0; i < jobs.count; ++i) {
    const int b = jobs.job[i].elem_bytes;
    if (b != 1 && b != 2 && b != 4) return cudaErrorInvalidValue;
    most = std::max(most, chunks_of(jobs.job[i]));
  }
  if (most == 0) return cudaSuccess;
  // About 16 blocks per SM of a 132-SM device in all, each copy's blocks looping over its chunks.
  const int threads = 256;
  const int64_t per_copy = std::max<int64_t>(1, 132 * 16 / jobs.count);
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((most + threads - 1) / threads, per_copy)),
      static_cast<unsigned>(jobs.count));
  // The grid-stride loop's last step stays below 2^32 too.
  if (most + int64_t{grid.x} * threads < (int64_t{1} << 32)) {
    return launch_overlapped(evoformer_row_copies_kernel<uint32_t>, grid, threads, 0, stream,
                             overlap, 1, jobs);
  }
  return launch_overlapped(evoformer_row_copies_kernel<int64_t>, grid, threads, 0, stream, overlap,
                           1, jobs);
}

}  // namespace sciattn::cuda

// The padded copy of a bias whose rows do not start on 16-byte boundaries
// (detail::CudaBiasCopies): each thread writes one 16-byte chunk of a padded row, gathering its
// elements from the bias in whatever strides it has, zeros past the row's end. It reads the bias
// once and writes it once, about the bytes of one of the kernels' own passes over it. CUDA layer.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

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

template <int kBytes>
__global__ void evoformer_bias_copy_kernel(const EvoformerBiasCopyArgs a) {
  using E = typename Bits<kBytes>::type;
  constexpr int kPerChunk = 16 / kBytes;
  const int64_t chunks_per_row = a.row / kPerChunk;
  const int64_t rows = a.outer[0] * a.outer[1] * a.outer[2];
  const E* src = static_cast<const E*>(a.src);
  uint4* dst = static_cast<uint4*>(a.dst);
  for (int64_t x = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; x < rows * chunks_per_row;
       x += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = x / chunks_per_row, j0 = (x % chunks_per_row) * kPerChunk;
    const int64_t i2 = row % a.outer[2], i01 = row / a.outer[2];
    const int64_t i1 = i01 % a.outer[1], i0 = i01 / a.outer[1];
    const E* from = src + i0 * a.outer_stride[0] + i1 * a.outer_stride[1] + i2 * a.outer_stride[2];
    union {
      uint4 chunk;
      E elems[kPerChunk];
    } out;
#pragma unroll
    for (int e = 0; e < kPerChunk; ++e) {
      const int64_t j = j0 + e;
      out.elems[e] = j < a.len ? from[j * a.len_stride] : E{0};
    }
    dst[x] = out.chunk;
  }
}

}  // namespace

cudaError_t launch_evoformer_bias_copy(const EvoformerBiasCopyArgs& a, cudaStream_t stream) {
  const int64_t chunks = a.outer[0] * a.outer[1] * a.outer[2] * (a.row * a.elem_bytes / 16);
  if (chunks == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>((chunks + threads - 1) / threads, 132 * 16));
  switch (a.elem_bytes) {
    case 1:
      evoformer_bias_copy_kernel<1><<<grid, threads, 0, stream>>>(a);
      break;
    case 2:
      evoformer_bias_copy_kernel<2><<<grid, threads, 0, stream>>>(a);
      break;
    case 4:
      evoformer_bias_copy_kernel<4><<<grid, threads, 0, stream>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace sciattn::cuda

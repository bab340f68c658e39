// The padded copies of biases and inputs whose rows do not start on 16-byte boundaries or do not
// end on one (detail::CudaInputCopies): each thread writes one 16-byte chunk of a packed, padded
// row, gathering its elements from the tensor in whatever strides it has, zeros past the row's
// end. It reads the tensor once and writes it once, about the bytes of one of the kernels' own
// passes over it. CUDA layer.
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

// Index: uint32_t where every chunk's index fits (its divisions are a fraction of 64-bit ones),
// else int64_t.
template <int kBytes, typename Index>
__global__ void evoformer_row_copy_kernel(const EvoformerRowCopyArgs a) {
  using E = typename Bits<kBytes>::type;
  constexpr int kPerChunk = 16 / kBytes;
  const Index chunks_per_row = static_cast<Index>(a.row / kPerChunk);
  const Index o1 = static_cast<Index>(a.outer[1]), o2 = static_cast<Index>(a.outer[2]),
              o3 = static_cast<Index>(a.outer[3]);
  const Index chunks = static_cast<Index>(a.outer[0]) * o1 * o2 * o3 * chunks_per_row;
  const E* src = static_cast<const E*>(a.src);
  uint4* dst = static_cast<uint4*>(a.dst);
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
#pragma unroll
    for (int e = 0; e < kPerChunk; ++e) {
      const int64_t j = j0 + e;
      out.elems[e] = j < a.len ? from[j * a.len_stride] : E{0};
    }
    dst[x] = out.chunk;
  }
}

template <int kBytes>
cudaError_t launch_row_copy(const EvoformerRowCopyArgs& a, int64_t chunks, cudaStream_t stream) {
  const int threads = 256;
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>((chunks + threads - 1) / threads, 132 * 16));
  // The grid-stride loop's last step stays below 2^32 too.
  if (chunks + int64_t{grid} * threads < (int64_t{1} << 32)) {
    evoformer_row_copy_kernel<kBytes, uint32_t><<<grid, threads, 0, stream>>>(a);
  } else {
    evoformer_row_copy_kernel<kBytes, int64_t><<<grid, threads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_evoformer_row_copy(const EvoformerRowCopyArgs& a, cudaStream_t stream) {
  const int64_t chunks =
      a.outer[0] * a.outer[1] * a.outer[2] * a.outer[3] * (a.row * a.elem_bytes / 16);
  if (chunks == 0) return cudaSuccess;
  switch (a.elem_bytes) {
    case 1:
      return launch_row_copy<1>(a, chunks, stream);
    case 2:
      return launch_row_copy<2>(a, chunks, stream);
    case 4:
      return launch_row_copy<4>(a, chunks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sciattn::cuda

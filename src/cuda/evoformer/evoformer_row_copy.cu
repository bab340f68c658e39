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
#include "cuda/evoformer/evoformer_row_copy.cuh"

namespace sciattn::cuda {
namespace {

int64_t chunks_of(const EvoformerRowCopyArgs& a) {
  return a.outer[0] * a.outer[1] * a.outer[2] * a.outer[3] * (a.row * a.elem_bytes / 16);
}

// The copies of `jobs`, copy blockIdx.y in this block (__grid_constant__: the copy is picked at
// run time from the parameters without first copying them all to local memory).
template <typename Index, bool kFast>
__global__ void evoformer_row_copies_kernel(const __grid_constant__ EvoformerCopyJobs jobs) {
  enter_overlapped_grid();
  const EvoformerRowCopyArgs& a = jobs.job[blockIdx.y];
  switch (a.elem_bytes) {
    case 1:
      copy_rows<1, Index, kFast>(a);
      break;
    case 2:
      copy_rows<2, Index, kFast>(a);
      break;
    default:
      copy_rows<4, Index, kFast>(a);
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
  // The grid-stride loop's last step stays below 2^31 (the fast divisors' range) or 2^32 too.
  const int64_t last = most + int64_t{grid.x} * threads;
  if (last < (int64_t{1} << 31)) {
    return launch_overlapped(evoformer_row_copies_kernel<uint32_t, true>, grid, threads, 0, stream,
                             overlap, 1, jobs);
  }
  if (last < (int64_t{1} << 32)) {
    return launch_overlapped(evoformer_row_copies_kernel<uint32_t, false>, grid, threads, 0, stream,
                             overlap, 1, jobs);
  }
  return launch_overlapped(evoformer_row_copies_kernel<int64_t, false>, grid, threads, 0, stream,
                           overlap, 1, jobs);
}

}  // namespace sciattn::cuda

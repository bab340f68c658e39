// Kernel launches that may overlap the kernel before them in the stream (programmatic dependent
// launch, sm_90 and later): the launch carries cudaLaunchAttributeProgrammaticStreamSerialization,
// and the kernel must start with enter_overlapped_grid() (grid_dependency.cuh), which waits for
// the kernels before it to complete. A chain of short kernels (a call's padded copies, delta, the
// backward, the bias reduction) then pays its launch latencies while the kernel before it runs.
// Where `overlap` is false (devices before sm_90) the launch is a plain one. CUDA layer (host
// code).
#pragma once

#include <cuda_runtime.h>

namespace sciattn::cuda {

// Launches kernel(args...) on `grid` x `threads` with `smem_bytes` of dynamic shared memory,
// overlapped with the kernel before it where `overlap`, in clusters of `cluster` CTAs along x
// where `cluster` > 1.
template <typename... Params, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes,
                              cudaStream_t stream, bool overlap, int cluster, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = static_cast<unsigned>(cluster);
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace sciattn::cuda

// Device queries for a CUDA build (SCIATTN_WITH_CUDA=ON). CUDA layer.
// The runtime is linked statically and the driver is never linked: on a machine without a driver
// or GPU, cudaGetDeviceCount fails and we report 0 devices.
#include <cuda_runtime.h>

#include "sciattn/device.h"

namespace sciattn {

bool built_with_cuda() {
  return true;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace sciattn

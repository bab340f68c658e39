// A kernel's shared-memory attributes, set once per kernel and device. CUDA layer (host code).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/common/device_guard.h"

namespace sciattn::cuda {

// Before launching `kernel` with `smem_bytes` of dynamic shared memory on the current device:
// raises its dynamic shared-memory limit when `smem_bytes` is above the default 48 KiB and, with
// `max_carveout`, asks for the largest shared-memory carveout. Each attribute is set once per
// kernel and device (the limit again only for a larger size): the attributes stay with the
// context, and cudaFuncSetAttribute costs 2-3 us of host time a call, which a small Evoformer
// call would pay ten times.
// A request above the device's per-block limit (99 KiB on sm_86 and sm_89, 163 KiB on sm_80,
// 227 KiB on sm_90) fails with cudaErrorInvalidValue and leaves launch_failure_note saying how
// much was asked for and allowed.
inline cudaError_t configure_kernel_smem(const void* kernel, size_t smem_bytes, bool max_carveout) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> limit_set;  // (kernel, device) -> bytes
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = limit_set.find({kernel, device});
  const bool first = it == limit_set.end();
  if (!first && it->second >= smem_bytes) return cudaSuccess;
  int limit = 0;
  e = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  if (smem_bytes > static_cast<size_t>(limit)) {
    launch_failure_note() = "the kernel needs " + std::to_string(smem_bytes) +
                            " bytes of shared memory per block; " + "this GPU allows " +
                            std::to_string(limit) +
                            ": this shape is not supported on this architecture yet";
    return cudaErrorInvalidValue;
  }
  if (first && max_carveout) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
  }
  if (smem_bytes > 48 * 1024) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem_bytes));
    if (e != cudaSuccess) return e;
  }
  limit_set[{kernel, device}] = first ? smem_bytes : std::max(smem_bytes, it->second);
  return cudaSuccess;
}

}  // namespace sciattn::cuda

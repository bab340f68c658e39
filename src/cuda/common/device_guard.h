// Host helpers every CUDA dispatch shares: a cudaError_t as a Status, and running a launch on
// the device that holds the call's tensors. CUDA layer (host code).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "sciattn/status.h"

namespace sciattn::cuda {

// ok for cudaSuccess, else kDeviceError naming `what` and the runtime's message.
inline Status device_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok_status();
  return Status(StatusCode::kDeviceError, std::string(what) + ": " + cudaGetErrorString(e));
}

// Runs `launch` with the device that holds `tensor` current, restoring the caller's device
// afterwards. The library links its own static CUDA runtime, whose current device is not the
// caller's (PyTorch's runtime is another copy), so tensors on cuda:1 would otherwise be launched
// on device 0.
template <typename Launch>
Status on_device_of(const void* tensor, const Launch& launch) {
  cudaPointerAttributes attributes{};
  int current = 0;
  if (cudaPointerGetAttributes(&attributes, tensor) != cudaSuccess ||
      cudaGetDevice(&current) != cudaSuccess || attributes.device < 0 ||
      attributes.device == current) {
    cudaGetLastError();  // a host pointer or an old driver: launch where we are
    return launch();
  }
  const cudaError_t e = cudaSetDevice(attributes.device);
  if (e != cudaSuccess) return device_status(e, "cudaSetDevice to the tensors' device");
  const Status status = launch();
  cudaSetDevice(current);
  return status;
}

}  // namespace sciattn::cuda

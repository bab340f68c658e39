// Host helpers every CUDA dispatch shares: a cudaError_t as a Status, and running a launch on
// the device that holds the call's tensors once that device is known to run this build's kernels.
// CUDA layer (host code).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/device_arch.h"
#include "sciattn/status.h"

namespace sciattn::cuda {

// What a launch helper that failed on this thread found out beyond its cudaError_t (a kernel's
// shared memory above the device's limit: configure_kernel_smem); device_status adds it to its
// message and clears it.
inline std::string& launch_failure_note() {
  thread_local std::string note;
  return note;
}

// ok for cudaSuccess, else kDeviceError naming `what`, the runtime's message and the launch
// helper's note.
inline Status device_status(cudaError_t e, const char* what) {
  std::string& note = launch_failure_note();
  if (e == cudaSuccess) {
    note.clear();
    return Status::ok_status();
  }
  std::string message = std::string(what) + ": " + cudaGetErrorString(e);
  if (!note.empty()) message += " (" + note + ")";
  note.clear();
  return Status(StatusCode::kDeviceError, message);
}

// Runs `launch` with the device that holds `tensor` current, restoring the caller's device
// afterwards, unless that device cannot run this build's kernels (current_device_kernels' error).
// The library links its own static CUDA runtime, whose current device is not the caller's
// (PyTorch's runtime is another copy), so tensors on cuda:1 would otherwise be launched on
// device 0.
template <typename Launch>
Status on_device_of(const void* tensor, const Launch& launch) {
  auto checked_launch = [&] {
    DeviceKernels kernels;
    const Status usable = current_device_kernels(&kernels);
    return usable.ok() ? launch() : usable;
  };
  cudaPointerAttributes attributes{};
  int current = 0;
  if (cudaPointerGetAttributes(&attributes, tensor) != cudaSuccess ||
      cudaGetDevice(&current) != cudaSuccess || attributes.device < 0 ||
      attributes.device == current) {
    cudaGetLastError();  // a host pointer or an old driver: launch where we are
    return checked_launch();
  }
  const cudaError_t e = cudaSetDevice(attributes.device);
  if (e != cudaSuccess) return device_status(e, "cudaSetDevice to the tensors' device");
  const Status status = checked_launch();
  cudaSetDevice(current);
  return status;
}

}  // namespace sciattn::cuda

// Device queries for a CUDA build (SCIATTN_WITH_CUDA=ON). CUDA layer.
// The runtime is linked statically and the driver is never linked: on a machine without a driver
// or GPU, cudaGetDeviceCount fails and we report 0 devices.
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/device_arch.h"
#include "sciattn/device.h"

namespace sciattn {
namespace {

Status runtime_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok_status();
  cudaGetLastError();
  return Status(StatusCode::kDeviceError, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

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

Status cuda_allocate(size_t bytes, void** ptr) {
  *ptr = nullptr;
  if (bytes == 0) return Status::ok_status();
  return runtime_status(cudaMalloc(ptr, bytes), "cudaMalloc");
}

Status cuda_free(void* ptr) {
  return ptr == nullptr ? Status::ok_status() : runtime_status(cudaFree(ptr), "cudaFree");
}

Status cuda_copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return Status::ok_status();
  return runtime_status(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice),
                        "cudaMemcpy (host to device)");
}

Status cuda_copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return Status::ok_status();
  return runtime_status(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
                        "cudaMemcpy (device to host)");
}

Status cuda_synchronize(Stream stream) {
  return runtime_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)),
                        "cudaStreamSynchronize");
}

std::string cuda_device_description() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cuda_device_count() == 0 || cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
}

Status cuda_check_kernels(std::string* kernels, int device) {
  if (kernels != nullptr) kernels->clear();
  const int count = cuda_device_count();
  if (count == 0) return Status::not_supported("no CUDA device is visible on this machine");
  if (device < -1 || device >= count) {
    return Status::invalid_argument("device " + std::to_string(device) + " does not exist; this " +
                                    "machine has " + std::to_string(count) +
                                    " CUDA device(s): 0 to " + std::to_string(count - 1) +
                                    ", or -1 for the current one");
  }
  int current = 0;
  Status s = runtime_status(cudaGetDevice(&current), "cudaGetDevice");
  if (!s.ok()) return s;
  if (device >= 0 && device != current) {
    s = runtime_status(cudaSetDevice(device), "cudaSetDevice");
    if (!s.ok()) return s;
  }
  cuda::DeviceKernels k;
  s = cuda::current_device_kernels(&k);
  if (device >= 0 && device != current) cudaSetDevice(current);
  if (s.ok() && kernels != nullptr) *kernels = k.warpgroup_mma ? "warpgroup" : "portable";
  return s;
}

Status cuda_memory_info(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = 0;
  *total_bytes = 0;
  if (cuda_device_count() == 0) {
    return Status::not_supported("no CUDA device is visible on this machine");
  }
  return runtime_status(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

}  // namespace sciattn

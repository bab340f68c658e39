// current_device_kernels (device_arch.h). CUDA layer.
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "cuda/common/build_archs.h"
#include "cuda/common/device_arch.h"
#include "cuda/common/device_guard.h"
#include "cuda/common/kernel_path.h"

namespace sciattn::cuda {
namespace {

// Static shared memory of image_probe_kernel in sm_90a code; none in any other.
constexpr int kHopperMarkerInts = 256;

// Never launched: cudaFuncGetAttributes on it says which of the build's images the runtime picked
// for the device (binaryVersion, ptxVersion) and, through its static shared memory, whether that
// image is sm_90a's, the one that holds the warpgroup kernels.
__global__ void image_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int marker[kHopperMarkerInts];
  marker[threadIdx.x % kHopperMarkerInts] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = marker[(threadIdx.x + 1) % kHopperMarkerInts];
#else
  out[threadIdx.x] = static_cast<int>(threadIdx.x);
#endif
}

struct DeviceEntry {
  Status status;
  DeviceKernels kernels;
};

std::string capability(int major, int minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

DeviceEntry probe(int device) {
  DeviceEntry e;
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    e.status = device_status(err, "cudaGetDeviceProperties");
    return e;
  }
  DeviceKernels& k = e.kernels;
  k.major = prop.major;
  k.minor = prop.minor;
  k.name = prop.name;
  const std::string here = k.name + " (device " + std::to_string(device) + ", compute capability " +
                           capability(k.major, k.minor) + ")";
  if (k.major < 8) {
    e.status = Status::not_supported(
        "sciattn's CUDA kernels need compute capability 8.0 or newer (A100, A10, A40, L4, L40, "
        "RTX 30 and 40 series, H100, H200); this GPU is " +
        here + ". The CPU path runs everything: keep the tensors on the CPU");
    return e;
  }
  cudaFuncAttributes attr{};
  err = cudaFuncGetAttributes(&attr, image_probe_kernel);
  if (err != cudaSuccess) {
    cudaGetLastError();
    const std::string arch = std::to_string(k.major) + std::to_string(k.minor);
    e.status = Status::not_supported(
        "this build of sciattn has CUDA kernels for the architectures " +
        std::string(kBuildCudaArchs) + " (SCIATTN_CUDA_ARCHS), none of which runs on " + here +
        " (" + cudaGetErrorString(err) + "); rebuild with -DSCIATTN_CUDA_ARCHS=\"" + arch +
        (arch == "90" ? "a" : "") + "\" (CMake) or TORCH_CUDA_ARCH_LIST=\"" +
        capability(k.major, k.minor) + "\" (the Python package)");
    return e;
  }
  k.smem_limit = static_cast<int>(prop.sharedMemPerBlockOptin);
  k.binary_arch = attr.binaryVersion;
  k.ptx_arch = attr.ptxVersion;
  k.warpgroup_mma =
      kBuildHasWarpgroupMma && attr.sharedSizeBytes >= kHopperMarkerInts * sizeof(int);
  return e;
}

}  // namespace

Status current_device_kernels(DeviceKernels* out) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return device_status(err, "cudaGetDevice");
  KernelPath path = KernelPath::kAuto;
  const Status read = kernel_path_of(std::getenv(kKernelPathVariable), &path);
  if (!read.ok()) return read;
  static std::mutex mutex;
  static std::map<int, DeviceEntry> entries;
  DeviceEntry entry;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = entries.find(device);
    if (it == entries.end()) it = entries.emplace(device, probe(device)).first;
    entry = it->second;
  }
  if (!entry.status.ok()) return entry.status;
  *out = entry.kernels;
  if (path != KernelPath::kAuto) out->warpgroup_mma = false;
  if (path == KernelPath::kPortable99k && out->smem_limit > kSmem99k) out->smem_limit = kSmem99k;
  return Status::ok_status();
}

}  // namespace sciattn::cuda

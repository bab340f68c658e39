// Where tensors live and how work is ordered on a device. Public API layer (plain C++17).
#pragma once

namespace sciattn {

enum class Device : int { kCpu = 0, kCuda = 1 };

const char* device_name(Device d);  // "cpu", "cuda"

// An opaque handle to the queue a call runs on: a cudaStream_t for Device::kCuda (nullptr is the
// default stream), ignored on the CPU.
struct Stream {
  void* handle = nullptr;
};

// True when this library was built with its CUDA kernels (SCIATTN_WITH_CUDA=ON).
bool built_with_cuda();
// Number of usable CUDA devices; 0 without a CUDA build, a driver or a GPU. Never fails.
int cuda_device_count();

}  // namespace sciattn

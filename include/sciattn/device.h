// Where tensors live and how work is ordered on a device. Public API layer (plain C++17).
#pragma once

#include <cstddef>
#include <string>

#include "sciattn/status.h"

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

// Device memory for callers that have no framework of their own (the command-line program,
// examples, tests): thin wrappers of the CUDA runtime on the current device. Each returns
// kNotSupported in a build without CUDA and kDeviceError, with the runtime's message, when the
// runtime fails. A framework user (PyTorch) allocates with its own allocator instead.
Status cuda_allocate(size_t bytes, void** ptr);  // *ptr = nullptr for 0 bytes
Status cuda_free(void* ptr);                     // nullptr is fine
Status cuda_copy_to_device(void* device_dst, const void* host_src, size_t bytes);
Status cuda_copy_to_host(void* host_dst, const void* device_src, size_t bytes);
// Waits for the work queued on `stream` (Stream{} = the default stream) and reports any error
// the kernels raised.
Status cuda_synchronize(Stream stream = {});
// "NVIDIA H200 (sm_90, 132 SMs)" for the current device; empty without one.
std::string cuda_device_description();
// Whether CUDA device `device` (-1: the current one) can run this build's CUDA kernels, and which:
// ok, with `kernels` (optional) set to "warpgroup" (Hopper's sm_90a kernels where they apply) or
// "portable" (the mma.sync kernels of every architecture from sm_80); else kNotSupported saying
// what is missing (no CUDA build, no such device, a GPU older than sm_80, no code for its
// architecture in this build: SCIATTN_CUDA_ARCHS), or kInvalidArgument for a bad
// SCIATTN_CUDA_KERNELS. Every CUDA call checks this itself; a caller may ask first to fail before
// it allocates anything.
Status cuda_check_kernels(std::string* kernels = nullptr, int device = -1);
// Free and total memory of the current device in bytes (the runtime's cudaMemGetInfo), for a
// caller that wants to know whether its tensors will fit before it allocates them.
Status cuda_memory_info(size_t* free_bytes, size_t* total_bytes);

}  // namespace sciattn

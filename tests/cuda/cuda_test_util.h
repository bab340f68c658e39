// Device-memory helpers shared by the GPU suites (label gpu): the skip when no GPU is present, a
// device copy of a host tensor's whole storage with the matching view, and raw device buffers.
// Test layer (tests/cuda).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>

#include "cpu/evoformer_test_util.h"
#include "sciattn/device.h"

#define SKIP_WITHOUT_GPU() \
  if (sciattn::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"

namespace sciattn::test {

// A device copy of a HostTensor's whole storage (poison and padding included), and the matching
// device view; copy_to brings the storage back, so writes outside the view show as well.
class DeviceCopy {
 public:
  explicit DeviceCopy(const HostTensor& h) {
    if (!h.present()) return;
    bytes_ = h.storage_bytes();
    EXPECT_EQ(cudaMalloc(&base_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(base_, h.base(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    view_ = h.view();
    view_.data =
        static_cast<std::byte*>(base_) + (static_cast<const std::byte*>(h.data()) - h.base());
    view_.device = Device::kCuda;
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  ~DeviceCopy() { cudaFree(base_); }
  const TensorView& view() const { return view_; }
  void copy_to(HostTensor& h) const {
    if (base_ != nullptr) {
      ASSERT_EQ(cudaMemcpy(h.base(), base_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  TensorView view_{};
};

// `bytes` of device memory (none for 0). With `poison` every byte is 0xff, so that a kernel that
// reads workspace it has not written produces NaNs the comparison catches.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes, bool poison = false) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
      if (poison) {
        EXPECT_EQ(cudaMemset(ptr, 0xff, bytes), cudaSuccess);
      }
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  void* ptr = nullptr;
};

}  // namespace sciattn::test

// Device copies of the command-line program's host buffers, for runs with --device cuda. Tools
// layer (public API only: sciattn/device.h's memory helpers).
#pragma once

#include <cstddef>

#include "run_support.h"
#include "sciattn/device.h"
#include "sciattn/status.h"

namespace sciattn::tools {

// Device memory holding a copy of a host buffer's bytes, and the host view re-pointed at it (same
// sizes and strides, device kCuda). An absent host buffer gives an absent view. Owns the memory.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror() { (void)cuda_free(ptr_); }

  // Allocates and copies `host` to the device.
  Status upload(const HostBuffer& host);
  // Copies the device bytes back into `host` (the buffer it was made from).
  Status download(HostBuffer& host) const;
  const TensorView& view() const { return view_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  TensorView view_{};
};

// A device workspace of a given size.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch() { (void)cuda_free(ptr_); }
  Status resize(size_t bytes);
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace sciattn::tools

// Device copies of the command-line program's host buffers, for runs with --device cuda. Tools
// layer (public API only: sciattn/device.h's memory helpers).
#pragma once

#include <cstddef>
#include <vector>

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

// "cuda" when this build has CUDA and a GPU is visible, else "cpu": the commands' default device.
const char* default_device_name();

// OK when a command can run on `device`; for kCuda without a CUDA build or a visible GPU, a
// kNotSupported Status that says which ("--device cuda: ...").
Status check_device_usable(Device device);

// Puts one tensor of a run where the run happens: on the CPU *view is host.view; on the GPU the
// mirror gets a device copy of host and *view points at it. An absent host buffer stays absent.
Status place_tensor(Device device, const HostBuffer& host, DeviceMirror& mirror, TensorView* view);

// The workspace of a run's calls, on the run's device (host bytes or device memory), reused
// from call to call.
class RunWorkspace {
 public:
  explicit RunWorkspace(Device device) : device_(device) {}
  // Makes room for `bytes` and sets *ptr to it (nullptr for 0 bytes on the GPU).
  Status get(size_t bytes, void** ptr);

 private:
  Device device_;
  std::vector<std::byte> host_;
  DeviceScratch scratch_;
};

}  // namespace sciattn::tools

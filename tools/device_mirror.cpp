// Device copies of host buffers (see device_mirror.h). Tools layer.
#include "device_mirror.h"

namespace sciattn::tools {

Status DeviceMirror::upload(const HostBuffer& host) {
  view_ = host.view;
  if (!host.view.present()) return Status::ok_status();
  Status s = cuda_free(ptr_);
  ptr_ = nullptr;
  if (!s.ok()) return s;
  bytes_ = host.bytes.size();
  s = cuda_allocate(bytes_, &ptr_);
  if (s.ok()) s = cuda_copy_to_device(ptr_, host.bytes.data(), bytes_);
  if (!s.ok()) return s;
  const auto offset = static_cast<const std::byte*>(host.view.data) - host.bytes.data();
  view_.data = static_cast<std::byte*>(ptr_) + offset;
  view_.device = Device::kCuda;
  return Status::ok_status();
}

Status DeviceMirror::download(HostBuffer& host) const {
  if (ptr_ == nullptr) return Status::ok_status();
  return cuda_copy_to_host(host.bytes.data(), ptr_, bytes_);
}

Status DeviceScratch::resize(size_t bytes) {
  if (bytes == bytes_ && (ptr_ != nullptr || bytes == 0)) return Status::ok_status();
  Status s = cuda_free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  if (!s.ok()) return s;
  s = cuda_allocate(bytes, &ptr_);
  if (s.ok()) bytes_ = bytes;
  return s;
}

const char* default_device_name() {
  return built_with_cuda() && cuda_device_count() > 0 ? "cuda" : "cpu";
}

Status check_device_usable(Device device) {
  if (device != Device::kCuda || cuda_device_count() > 0) return Status::ok_status();
  return Status::not_supported(built_with_cuda()
                                   ? "--device cuda: no CUDA device is visible on this machine"
                                   : "--device cuda: this build of sciattn has no CUDA support "
                                     "(build with scripts/setup.sh on a machine with nvcc)");
}

Status place_tensor(Device device, const HostBuffer& host, DeviceMirror& mirror, TensorView* view) {
  *view = host.view;
  if (device != Device::kCuda) return Status::ok_status();
  const Status s = mirror.upload(host);
  *view = mirror.view();
  return s;
}

Status RunWorkspace::get(size_t bytes, void** ptr) {
  if (device_ != Device::kCuda) {
    host_.assign(bytes, std::byte{0});
    *ptr = host_.data();
    return Status::ok_status();
  }
  const Status s = scratch_.resize(bytes);
  *ptr = scratch_.data();
  return s;
}

}  // namespace sciattn::tools

// Device copies of host buffers (see device_mirror.h). Tools layer.
#include "device_mirror.h"

#include <filesystem>
#include <system_error>

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

namespace {

// Whether the machine has an NVIDIA GPU with its driver loaded, as far as a build without the CUDA
// runtime can tell: the driver lists its GPUs under /proc/driver/nvidia/gpus.
bool nvidia_gpu_present() {
  std::error_code ec;
  const std::filesystem::path gpus = "/proc/driver/nvidia/gpus";
  return std::filesystem::is_directory(gpus, ec) &&
         std::filesystem::directory_iterator(gpus, ec) != std::filesystem::directory_iterator();
}

}  // namespace

Status check_device_usable(Device device) {
  if (device != Device::kCuda) return Status::ok_status();
  if (cuda_device_count() > 0) {
    // A GPU this build's kernels cannot run on: one message before any work (--device cuda).
    const Status kernels = cuda_check_kernels();
    if (kernels.ok()) return kernels;
    return Status(kernels.code(), "--device cuda: " + kernels.message());
  }
  if (built_with_cuda()) {
    return Status::not_supported(
        "--device cuda: this build of sciattn has CUDA support, but no CUDA device is visible "
        "(no NVIDIA GPU, or its driver is not loaded: `nvidia-smi` lists the GPUs the driver "
        "sees); run on a machine with an NVIDIA GPU of compute capability 8.0 or newer (A100, A10, "
        "L4, L40, H100, H200), or use --device cpu");
  }
  if (nvidia_gpu_present()) {
    return Status::not_supported(
        "--device cuda: this build of sciattn has no CUDA support, but this machine has an NVIDIA "
        "GPU; build the CUDA kernels with scripts/setup.sh (it builds the `gpu` preset when nvcc "
        "and a GPU are present), or use --device cpu");
  }
  return Status::not_supported(
      "--device cuda: this build of sciattn has no CUDA support, and this machine has no NVIDIA "
      "GPU (its driver lists none); the CUDA kernels need one of compute capability 8.0 or newer "
      "(A100, A10, L4, L40, H100, H200): run on a machine with one, building sciattn there with "
      "scripts/setup.sh, or use --device cpu");
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

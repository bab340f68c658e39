// Device queries for a build without CUDA (SCIATTN_WITH_CUDA=OFF). CPU layer.
#include "sciattn/device.h"

namespace sciattn {

bool built_with_cuda() {
  return false;
}
int cuda_device_count() {
  return 0;
}

namespace {
Status no_cuda() {
  return Status::not_supported(
      "this build of sciattn has no CUDA support; configure with the `cuda` or `gpu` preset "
      "(SCIATTN_WITH_CUDA=ON)");
}
}  // namespace

Status cuda_allocate(size_t, void** ptr) {
  *ptr = nullptr;
  return no_cuda();
}
Status cuda_free(void* ptr) {
  return ptr == nullptr ? Status::ok_status() : no_cuda();
}
Status cuda_copy_to_device(void*, const void*, size_t) {
  return no_cuda();
}
Status cuda_copy_to_host(void*, const void*, size_t) {
  return no_cuda();
}
Status cuda_synchronize(Stream) {
  return no_cuda();
}
std::string cuda_device_description() {
  return "";
}
Status cuda_check_kernels(std::string* kernels, int) {
  if (kernels != nullptr) kernels->clear();
  return no_cuda();
}
Status cuda_memory_info(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = 0;
  *total_bytes = 0;
  return no_cuda();
}

}  // namespace sciattn

// The CUDA back end's and the GPU optimizer kernels' entry points in a build without CUDA: each
// says so (kNotSupported), so that callers need no #ifdef. Trainer layer (host code).
#include <string>

#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/cuda_optimizer.h"

namespace sciattn::train {
namespace {

Status no_cuda(const char* what) {
  return Status::not_supported(std::string(what) +
                               ": this build of sciattn has no CUDA (configure with "
                               "SCIATTN_WITH_CUDA=ON, e.g. the `cuda` or `gpu` preset)");
}

}  // namespace

Status make_cuda_backend(const CudaBackendOptions&, std::unique_ptr<CudaBackend>* out) {
  if (out != nullptr) out->reset();
  return no_cuda("make_cuda_backend");
}

Status make_cuda_backend(const CudaBackendOptions&, std::unique_ptr<Backend>* out) {
  if (out != nullptr) out->reset();
  return no_cuda("make_cuda_backend");
}

Status cuda_device_memory(int, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (free_bytes != nullptr) *free_bytes = 0;
  if (total_bytes != nullptr) *total_bytes = 0;
  return no_cuda("cuda_device_memory");
}

Status cuda_adamw_step(const AdamWHyperparams&, int64_t, float, float*, const float*, float*,
                       float*, int64_t, void*, DType, Stream) {
  return no_cuda("cuda_adamw_step");
}

size_t cuda_sum_squares_workspace(int64_t) {
  return 0;
}

Status cuda_sum_squares(const float*, int64_t, void*, size_t, Stream, SumSquares* out) {
  if (out != nullptr) *out = SumSquares{};
  return no_cuda("cuda_sum_squares");
}

Status cuda_scale_in_place(float*, int64_t, float, Stream) {
  return no_cuda("cuda_scale_in_place");
}

Status cuda_unscale_and_check(float*, int64_t, float, void*, size_t, Stream, bool* overflow) {
  if (overflow != nullptr) *overflow = false;
  return no_cuda("cuda_unscale_and_check");
}

Status cuda_cast(const void*, DType, void*, DType, int64_t, Stream) {
  return no_cuda("cuda_cast");
}

}  // namespace sciattn::train

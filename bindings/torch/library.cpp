// The sciattn torch library: TORCH_LIBRARY(sciattn) with the build query, and the op families'
// kernels registered for CPU and CUDA tensors. The ops are defined by op family, each file with
// its schemas (TORCH_LIBRARY_FRAGMENT) and kernels: evoformer_ops.cpp, block_sparse_ops.cpp,
// layout_ops.cpp, and train_ops.cpp (the trainer's optimizer, loss scaler and clipper, for
// sciattn.optim and sciattn.training); autograd.cpp adds the attention ops' autograd and
// sciattn/_ops.py their fake kernels for torch.compile. Binding layer.
#include <torch/library.h>

#include <string>

#include "kernel_registry.h"
#include "sciattn/device.h"

namespace sciattn::torch_ext {
namespace {

bool built_with_cuda_op() {
  return built_with_cuda();
}

// "warpgroup" or "portable" for CUDA device `device` (-1: the current one of the library's own
// runtime), or the error that says why it cannot run this build's kernels.
std::string cuda_kernels_op(int64_t device) {
  std::string kernels;
  const Status s = cuda_check_kernels(&kernels, static_cast<int>(device));
  TORCH_CHECK(s.ok(), "sciattn: ", s.message());
  return kernels;
}

}  // namespace
}  // namespace sciattn::torch_ext

TORCH_LIBRARY(sciattn, m) {
  m.def("built_with_cuda() -> bool", &sciattn::torch_ext::built_with_cuda_op);
  m.def("cuda_kernels(int device) -> str", &sciattn::torch_ext::cuda_kernels_op);
}

TORCH_LIBRARY_IMPL(sciattn, CPU, m) {
  sciattn::torch_ext::register_evoformer_kernels(m);
  sciattn::torch_ext::register_block_sparse_kernels(m);
  sciattn::torch_ext::register_train_kernels(m);
}

#ifdef SCIATTN_TORCH_CUDA
TORCH_LIBRARY_IMPL(sciattn, CUDA, m) {
  sciattn::torch_ext::register_evoformer_kernels(m);
  sciattn::torch_ext::register_block_sparse_kernels(m);
}
#endif

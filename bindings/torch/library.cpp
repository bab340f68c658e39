// The sciattn torch library: TORCH_LIBRARY(sciattn) with the build query. The ops are defined
// by op family, each file with its schemas (TORCH_LIBRARY_FRAGMENT) and kernels:
// evoformer_ops.cpp, block_sparse_ops.cpp, layout_ops.cpp; autograd.cpp adds the attention ops'
// autograd and sciattn/_ops.py their fake kernels for torch.compile. Binding layer.
#include <torch/library.h>

#include "sciattn/device.h"

namespace sciattn::torch_ext {
namespace {

bool built_with_cuda_op() {
  return built_with_cuda();
}

}  // namespace
}  // namespace sciattn::torch_ext

TORCH_LIBRARY(sciattn, m) {
  m.def("built_with_cuda() -> bool", &sciattn::torch_ext::built_with_cuda_op);
}

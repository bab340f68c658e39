// The CPU and CUDA kernels of each op family of the torch binding, registered by library.cpp for
// both dispatch keys (the library itself dispatches on the tensors' device), and the CPU-only
// kernels of the training ops. Binding layer.
#pragma once

#include <torch/library.h>

namespace sciattn::torch_ext {

void register_evoformer_kernels(torch::Library& m);     // evoformer_ops.cpp
void register_block_sparse_kernels(torch::Library& m);  // block_sparse_ops.cpp
void register_train_kernels(torch::Library& m);         // train_ops.cpp (CPU only)

}  // namespace sciattn::torch_ext

// The block-sparse index of a layout tensor for the ops of the binding: built once per layout
// tensor (and uploaded once per CUDA device), then kept for the next calls with that tensor while
// its data is unchanged. Binding layer (public API only).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "sciattn/block_sparse_ops.h"

namespace sciattn::torch_ext {

// The index of `layout` ([H, R, C] of 0s and 1s, any integer or bool dtype, any device) for an
// op on `like`'s device: host arrays for CPU tensors, plus the device copy on like's CUDA device
// for CUDA tensors. nnz is what the caller sized the sparse tensors with; a layout with another
// count is refused. The index stays alive while the caller holds it, even if the cache drops it.
std::shared_ptr<const BlockSparseIndex> cached_index_of(const at::Tensor& layout, int64_t block,
                                                        int64_t nnz, const at::Tensor& like);

}  // namespace sciattn::torch_ext

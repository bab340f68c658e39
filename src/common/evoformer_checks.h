// Validation of Evoformer attention Params, shared by the CPU and CUDA back ends.
// Host-only common layer.
#pragma once

#include <cstdint>

#include "sciattn/evoformer.h"

namespace sciattn::detail {

// The problem size, read off q: Q, K, V are [B, N, L, H, D].
struct EvoformerShape {
  int64_t batch = 0;  // B
  int64_t n = 0;      // N: the dimension that is not attended over
  int64_t len = 0;    // L: the attended length (queries and keys)
  int64_t heads = 0;  // H
  int64_t dim = 0;    // D
};

// Check every argument (shapes, dtypes, devices, strides, overlaps, options) and return the
// shape. Does not look at the workspace.
Status check_evoformer_forward(const EvoformerForwardParams& p, EvoformerShape* shape);
Status check_evoformer_backward(const EvoformerBackwardParams& p, EvoformerShape* shape);

// The effective softmax scale: options.scale or 1/sqrt(D).
float evoformer_scale(const EvoformerOptions& options, int64_t dim);

}  // namespace sciattn::detail

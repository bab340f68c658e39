// What happens to the accumulated gradients between the last backward and the optimizer: the
// cross-rank reduction, fp16 overflow detection and unscaling (standard or "ds_enhanced"), and
// the global norm. Public API of the trainer (plain C++17): on host memory, or on a Backend's
// memory through its elementwise calls (the GPU path).
#pragma once

#include <cstdint>

#include "sciattn/status.h"
#include "sciattn/train/communicator.h"

namespace sciattn::train {

class Backend;

// Sum of squares (in double) and finiteness of n floats. The sum is formed over fixed chunks of
// kNormChunk elements whose partial sums are added in chunk order, so the result does not depend
// on the thread count.
inline constexpr int64_t kNormChunk = 16384;
struct SumSquares {
  double sum = 0.0;
  bool finite = true;  // no Inf or NaN among the elements
};
SumSquares sum_squares(const float* data, int64_t n);

// data[i] *= factor (OpenMP).
void scale_in_place(float* data, int64_t n, float factor);

// How fp16 gradients are scaled across ranks (fp16.type).
enum class Fp16Scaling {
  // DeepSpeed's default order: reduce the scaled gradients, then check the reduced result for
  // overflow and unscale it.
  kStandard,
  // "ds_enhanced": each rank checks its own scaled gradients and unscales them before any
  // reduction; the overflow flags are combined with a max, so all ranks skip together:
  //   g_r = (S * grad L_r) / S on rank r;  overflow = max_r overflow_r;  g = (1/N) sum_r g_r
  kDsEnhanced,
};

struct ReducedGradients {
  bool overflow = false;  // an Inf or NaN somewhere (after the max over ranks)
  double norm = 0.0;      // global L2 norm of the unscaled, reduced gradients (if no overflow)
  // What the optimizer still has to multiply the gradients by to unscale them: 1 / loss_scale
  // for kStandard (the buffer stays scaled), 1 for kDsEnhanced (already unscaled in place).
  float pending_scale = 1.0f;
};

// Runs the reduction in the order of `scaling` on the rank's accumulated gradients (n floats,
// scaled by loss_scale; loss_scale 1 without fp16). On overflow the gradients are left as they
// are and the norm is not computed.
Status reduce_gradients(Communicator& comm, Fp16Scaling scaling, double loss_scale, float* grads,
                        int64_t n, ReducedGradients* out);
// The same order of operations on gradients in `backend`'s memory: the sums of squares and the
// unscaling run there (Backend::sum_squares, scale_in_place); the communicator gets that memory.
Status reduce_gradients(Communicator& comm, Backend& backend, Fp16Scaling scaling,
                        double loss_scale, float* grads, int64_t n, ReducedGradients* out);

}  // namespace sciattn::train

// AdamW on the CPU with DeepSpeedCPUAdam's arithmetic: vectorised (the compiler's SIMD, compiled
// for AVX-512, AVX2 and baseline x86-64 and picked at run time) and threaded with OpenMP. Public
// API of the trainer (plain C++17); the trainer's optimizer and, later, a torch binding use it.
#pragma once

#include <cstdint>
#include <string>

#include "sciattn/dtype.h"
#include "sciattn/status.h"

namespace sciattn::train {

// The arguments of DeepSpeedCPUAdam (and of DeepSpeed's "AdamW" / "Adam" optimizer configs).
struct AdamWHyperparams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // true: decoupled weight decay (AdamW), param -= lr * weight_decay * param before the update;
  // false: L2 (Adam), grad += weight_decay * param.
  bool adamw_mode = true;
  bool bias_correction = true;
};

// Checks the hyperparameters (lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, all finite);
// the message names the field.
Status validate_adamw(const AdamWHyperparams& h);

// One step over n elements, element by element (DeepSpeed's Step_1 order of operations):
//   g  = grads[i] * grad_scale                  (grad_scale folds unscaling and clipping in)
//   g += weight_decay * p                       (Adam mode only)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   u  = m / (sqrt(v) * bc2 + eps),   bc2 = 1 / sqrt(1 - beta2^step)  (1 without bias correction)
//   p += (-lr * weight_decay) * p               (AdamW mode only)
//   p += (-lr / bc1) * u,             bc1 = 1 - beta1^step             (1 without bias correction)
// `step` is the 1-based count of applied steps (DeepSpeed's state['step'] after its increment);
// beta^step is computed from it with std::pow in double, so a resumed run needs only the count.
// The result does not depend on the thread count or the instruction set chosen (no fused
// multiply-add is contracted). params, grads, exp_avg, exp_avg_sq: n floats each, not
// overlapping (grads may be const memory).
Status cpu_adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                      const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n);

// The same step, also writing the updated parameters rounded to `copy_dtype` (kF16 or kBF16,
// nearest even) into param_copy (n elements): the fp32-master-weights variant for a GPU that
// computes in 16 bits while its optimizer runs here (DeepSpeed's adam_update_copy).
Status cpu_adamw_step_copy(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                           const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                           void* param_copy, DType copy_dtype);

// The instruction set the vectorised kernel runs with on this CPU: "avx512f", "avx2" or
// "baseline".
std::string cpu_adamw_isa();

}  // namespace sciattn::train

// The per-step constants of AdamW, formed on the host once per step in the order and precision
// DeepSpeed's CPU Adam forms them; the CPU AdamW (adamw.cpp) and the CUDA kernels
// (cuda/optimizer.cu) both take them, so that every element's update has the same bits on either.
// Trainer layer (host code), internal.
#pragma once

#include <cstdint>

#include "sciattn/train/adamw.h"

namespace sciattn::train {

struct AdamWCoefficients {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float bias_correction2;  // 1 / sqrt(1 - beta2^step), or 1
  float eps;
  float step_size;    // -lr / (1 - beta1^step), or -lr
  float param_decay;  // -lr * weight_decay (AdamW mode)
  float grad_decay;   // weight_decay (Adam mode)
  float grad_scale;
};

// For step `step` (1, 2, ...) of hyperparameters `h`, gradients multiplied by `grad_scale`.
AdamWCoefficients adamw_coefficients(const AdamWHyperparams& h, int64_t step, float grad_scale);

}  // namespace sciattn::train

// fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py): a static
// scale, or DynamicLossScaler's update rule with hysteresis. Public API of the trainer (plain
// C++17).
#pragma once

#include <cstdint>

#include "sciattn/status.h"

namespace sciattn::train {

// DeepSpeed's fp16 section, as far as the scaler reads it.
struct LossScalerConfig {
  bool dynamic = true;                  // fp16.loss_scale == 0
  double static_scale = 1.0;            // fp16.loss_scale when > 0
  int initial_scale_power = 16;         // the dynamic scale starts at 2^initial_scale_power
  int64_t scale_window = 1000;          // fp16.loss_scale_window
  int hysteresis = 2;                   // fp16.hysteresis (DeepSpeed's delayed_shift)
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis
  double min_scale = 1.0;               // fp16.min_loss_scale
  double scale_factor = 2.0;            // DeepSpeed's fixed factor
  // DeepSpeed stops the run when a step overflows at min_scale with no hysteresis left.
  bool raise_error_at_min_scale = true;
};

// Checks the fields; the message names the fp16 key (e.g. "fp16.hysteresis must be >= 1").
Status validate_loss_scaler(const LossScalerConfig& config);

// What a checkpoint keeps (DeepSpeed's DynamicLossScaler attributes).
struct LossScalerState {
  double cur_scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int cur_hysteresis = 1;
};

// DeepSpeed's update rule, called once per optimizer step with that step's overflow flag:
//   overflow:    if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / factor, min)
//                  (an error instead when scale already equals min and raise_error_at_min_scale)
//                else cur_hysteresis -= 1;
//                last_overflow_iter = cur_iter
//   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis
//                if (cur_iter - last_overflow_iter) % window == 0:
//                  if not consecutive_hysteresis: cur_hysteresis = hysteresis
//                  scale *= factor
//   cur_iter += 1
// A static scaler never changes. In both kinds the trainer skips a step whose gradients hold an
// Inf or a NaN (DeepSpeed's overflow check runs whatever the scaler).
class LossScaler {
 public:
  LossScaler() = default;
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return state_.cur_scale; }
  const LossScalerConfig& config() const { return config_; }
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }

  // Applies the rule above. Fails (the scale unchanged) when an overflow arrives at the minimum
  // scale with raise_error_at_min_scale set; the message says so and names fp16.min_loss_scale.
  Status update(bool overflow);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace sciattn::train

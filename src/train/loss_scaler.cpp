// fp16 loss scaling with DeepSpeed's DynamicLossScaler rule. Trainer layer (host code).
#include "sciattn/train/loss_scaler.h"

#include <cmath>
#include <string>

namespace sciattn::train {

Status validate_loss_scaler(const LossScalerConfig& c) {
  if (!c.dynamic && !(c.static_scale > 0.0 && std::isfinite(c.static_scale))) {
    return Status::invalid_argument(
        "fp16.loss_scale must be 0 (dynamic) or a finite number > 0; "
        "got " +
        std::to_string(c.static_scale));
  }
  if (c.initial_scale_power < 0 || c.initial_scale_power > 127) {
    return Status::invalid_argument("fp16.initial_scale_power must be in [0, 127]; got " +
                                    std::to_string(c.initial_scale_power));
  }
  if (c.scale_window < 1) {
    return Status::invalid_argument("fp16.loss_scale_window must be >= 1; got " +
                                    std::to_string(c.scale_window));
  }
  if (c.hysteresis < 1) {
    return Status::invalid_argument("fp16.hysteresis must be >= 1; got " +
                                    std::to_string(c.hysteresis));
  }
  if (!(c.min_scale > 0.0) || !std::isfinite(c.min_scale)) {
    return Status::invalid_argument("fp16.min_loss_scale must be a finite number > 0; got " +
                                    std::to_string(c.min_scale));
  }
  if (!(c.scale_factor > 1.0) || !std::isfinite(c.scale_factor)) {
    return Status::invalid_argument("the loss scale factor must be > 1; got " +
                                    std::to_string(c.scale_factor));
  }
  return Status::ok_status();
}

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  state_.cur_scale =
      config.dynamic ? std::ldexp(1.0, config.initial_scale_power) : config.static_scale;
  state_.cur_iter = 0;
  state_.last_overflow_iter = -1;
  state_.cur_hysteresis = config.hysteresis;
}

Status LossScaler::update(bool overflow) {
  if (!config_.dynamic) return Status::ok_status();
  LossScalerState& s = state_;
  if (overflow) {
    if (config_.hysteresis == 1 || s.cur_hysteresis == 1) {
      if (s.cur_scale == config_.min_scale && config_.raise_error_at_min_scale) {
        return Status::invalid_argument(
            "the gradients overflowed with the loss scale already at fp16.min_loss_scale (" +
            std::to_string(config_.min_scale) +
            ") and no hysteresis left: training cannot continue (DeepSpeed stops here too); "
            "lower the learning rate, clip gradients, or use bf16");
      }
      s.cur_scale = std::max(s.cur_scale / config_.scale_factor, config_.min_scale);
    } else {
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (config_.consecutive_hysteresis) s.cur_hysteresis = config_.hysteresis;
    if ((s.cur_iter - s.last_overflow_iter) % config_.scale_window == 0) {
      if (!config_.consecutive_hysteresis) s.cur_hysteresis = config_.hysteresis;
      s.cur_scale *= config_.scale_factor;
    }
  }
  s.cur_iter += 1;
  return Status::ok_status();
}

}  // namespace sciattn::train

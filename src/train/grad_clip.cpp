// Fixed and adaptive gradient clipping (the rule is in grad_clip.h). Trainer layer (host code).
#include "sciattn/train/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace sciattn::train {
namespace {

// Median of values (sorted copy); the mean of the two middle values for an even count.
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

}  // namespace

const char* clip_mode_name(ClipMode mode) {
  switch (mode) {
    case ClipMode::kNone:
      return "none";
    case ClipMode::kFixed:
      return "fixed";
    case ClipMode::kAdaptive:
      return "adaptive";
  }
  return "?";
}

Status validate_grad_clip(const GradClipConfig& c) {
  if (c.mode == ClipMode::kNone) return Status::ok_status();
  if (!(c.threshold > 0.0) || !std::isfinite(c.threshold)) {
    return Status::invalid_argument(
        "gradient_clipping threshold must be a finite number > 0; got " +
        std::to_string(c.threshold));
  }
  if (c.mode == ClipMode::kAdaptive) {
    if (c.history_window < 1) {
      return Status::invalid_argument("gradient_clipping.history_window must be >= 1; got " +
                                      std::to_string(c.history_window));
    }
    if (!(c.adjustment_factor > 0.0 && c.adjustment_factor <= 1.0)) {
      return Status::invalid_argument(
          "gradient_clipping.adjustment_factor must be in (0, 1]; got " +
          std::to_string(c.adjustment_factor));
    }
  }
  return Status::ok_status();
}

GradClipper::GradClipper(const GradClipConfig& config) : config_(config) {
  threshold_ =
      config.mode == ClipMode::kNone ? std::numeric_limits<double>::infinity() : config.threshold;
}

ClipStep GradClipper::step(double norm) {
  ClipStep s;
  s.norm = norm;
  s.threshold = threshold_;
  s.next_threshold = threshold_;
  if (config_.mode == ClipMode::kNone) return s;
  const double c = threshold_ / (norm + kClipEpsilon);
  s.coefficient = c < 1.0 ? c : 1.0;
  if (config_.mode == ClipMode::kAdaptive) {
    history_.push_back(norm);
    while (static_cast<int64_t>(history_.size()) > config_.history_window) history_.pop_front();
    std::vector<double> values(history_.begin(), history_.end());
    const double m = median(values);
    for (double& v : values) v = std::fabs(v - m);
    const double spread = kClipMadToSigma * median(values);
    const double target = m + kClipTargetSpreads * spread;
    const double a = config_.adjustment_factor;
    threshold_ = std::min(std::max(target, (1.0 - a) * threshold_), (1.0 + a) * threshold_);
    s.next_threshold = threshold_;
  }
  return s;
}

Status GradClipper::set_state(double threshold, const std::vector<double>& history) {
  if (config_.mode == ClipMode::kNone) return Status::ok_status();
  if (!(threshold > 0.0)) {
    return Status::invalid_argument("the clipping threshold must be > 0; got " +
                                    std::to_string(threshold));
  }
  if (static_cast<int64_t>(history.size()) > config_.history_window) {
    return Status::invalid_argument("the clipping history holds " + std::to_string(history.size()) +
                                    " norms, more than gradient_clipping.history_window (" +
                                    std::to_string(config_.history_window) + ")");
  }
  threshold_ = threshold;
  history_.assign(history.begin(), history.end());
  return Status::ok_status();
}

}  // namespace sciattn::train

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR formulas. Trainer layer (host code).
#include "sciattn/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace sciattn::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

// DeepSpeed's warmup_num_steps after max(2, .).
int64_t warmup_steps(const LrScheduleConfig& c) {
  return std::max<int64_t>(2, c.warmup_num_steps);
}

// The warmup fraction gamma(i) for 0 <= i < w.
double warmup_gamma(const LrScheduleConfig& c, int64_t i) {
  const int64_t w = warmup_steps(c);
  if (c.warmup_type == WarmupType::kLog) {
    return (1.0 / std::log(static_cast<double>(w))) * std::log(static_cast<double>(i + 1));
  }
  return static_cast<double>(i) / static_cast<double>(w);
}

Status bad(const char* key, const std::string& why) {
  return Status::invalid_argument(std::string("scheduler.params.") + key + " " + why);
}

}  // namespace

const char* lr_schedule_name(LrScheduleType type) {
  switch (type) {
    case LrScheduleType::kConstant:
      return "constant";
    case LrScheduleType::kWarmupLR:
      return "WarmupLR";
    case LrScheduleType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

Status validate_lr_schedule(const LrScheduleConfig& c) {
  auto rate_ok = [](double v) { return v >= 0.0 && std::isfinite(v); };
  if (!rate_ok(c.base_lr)) {
    return Status::invalid_argument("optimizer.params.lr must be a finite number >= 0; got " +
                                    std::to_string(c.base_lr));
  }
  if (c.type == LrScheduleType::kConstant) return Status::ok_status();
  if (c.warmup_num_steps < 0) {
    return bad("warmup_num_steps", "must be >= 0; got " + std::to_string(c.warmup_num_steps));
  }
  if (c.type == LrScheduleType::kWarmupLR || c.type == LrScheduleType::kWarmupDecayLR) {
    if (!rate_ok(c.warmup_min_lr)) {
      return bad("warmup_min_lr",
                 "must be a finite number >= 0; got " + std::to_string(c.warmup_min_lr));
    }
    if (!rate_ok(c.warmup_max_lr)) {
      return bad("warmup_max_lr",
                 "must be a finite number >= 0; got " + std::to_string(c.warmup_max_lr));
    }
  }
  if (c.type == LrScheduleType::kWarmupDecayLR && c.total_num_steps < 1) {
    return bad("total_num_steps", "must be >= 1; got " + std::to_string(c.total_num_steps));
  }
  if (c.type == LrScheduleType::kWarmupCosineLR) {
    if (c.total_num_steps <= warmup_steps(c)) {
      return bad("total_num_steps",
                 "(" + std::to_string(c.total_num_steps) +
                     ") must exceed max(2, warmup_num_steps) = " + std::to_string(warmup_steps(c)) +
                     " for WarmupCosineLR (DeepSpeed divides by their difference)");
    }
    if (!(c.warmup_min_ratio >= 0.0 && c.warmup_min_ratio <= 1.0)) {
      return bad("warmup_min_ratio",
                 "must be in [0, 1]; got " + std::to_string(c.warmup_min_ratio));
    }
    if (!(c.cos_min_ratio >= 0.0 && c.cos_min_ratio <= 1.0)) {
      return bad("cos_min_ratio", "must be in [0, 1]; got " + std::to_string(c.cos_min_ratio));
    }
  }
  return Status::ok_status();
}

double learning_rate(const LrScheduleConfig& c, int64_t i) {
  const int64_t w = warmup_steps(c);
  switch (c.type) {
    case LrScheduleType::kConstant:
      return c.base_lr;
    case LrScheduleType::kWarmupLR:
    case LrScheduleType::kWarmupDecayLR: {
      if (i < 0) return c.warmup_min_lr;
      double gamma = 1.0;
      if (i < w) {
        gamma = warmup_gamma(c, i);
      } else if (c.type == LrScheduleType::kWarmupDecayLR) {
        gamma = std::max(0.0, static_cast<double>(c.total_num_steps - i) /
                                  std::max(1.0, static_cast<double>(c.total_num_steps - w)));
      }
      return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
    }
    case LrScheduleType::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < w) {
        ratio = warmup_gamma(c, i);
        ratio = c.warmup_min_ratio + ratio * (1.0 - c.warmup_min_ratio);
      } else {
        const double real_last_step = static_cast<double>(i - w + 1);
        const double real_total_steps = static_cast<double>(c.total_num_steps - w);
        ratio = (1.0 + std::cos(kPi * real_last_step / real_total_steps)) / 2.0;
        ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * ratio);
      }
      return c.base_lr * ratio;
    }
  }
  return c.base_lr;
}

}  // namespace sciattn::train

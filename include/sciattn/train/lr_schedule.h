// Learning-rate schedules with DeepSpeed's exact formulas (deepspeed/runtime/lr_schedules.py:
// WarmupLR, WarmupDecayLR, WarmupCosineLR) and its stepping convention. Public API of the
// trainer (plain C++17).
//
// DeepSpeed's convention: the scheduler starts at last_batch_iteration = -1, which sets the first
// step's rate (WarmupLR and WarmupDecayLR: warmup_min_lr; WarmupCosineLR: 0), and the engine calls
// scheduler.step() after every applied optimizer step (never after an overflowed one). So the k-th
// applied step (k = 1, 2, ...) runs with learning_rate(schedule, k - 2).
#pragma once

#include <cstdint>
#include <string_view>

#include "sciattn/status.h"

namespace sciattn::train {

enum class LrScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
const char* lr_schedule_name(LrScheduleType type);  // "constant", "WarmupLR", ...

enum class WarmupType { kLog, kLinear };  // DeepSpeed's warmup_type "log" (default) / "linear"

struct LrScheduleConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  double base_lr = 1e-3;  // the optimizer's lr: the constant rate, and WarmupCosineLR's org_lr
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  // All warmups. DeepSpeed uses max(2, warmup_num_steps).
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR / WarmupCosineLR
  int64_t total_num_steps = 0;
  // WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
};

// Checks the fields (rates >= 0 and finite, warmup_num_steps >= 0, total_num_steps >= 1 where
// used; WarmupCosineLR needs total_num_steps > max(2, warmup_num_steps), since DeepSpeed divides
// by their difference). The message names the scheduler.params key.
Status validate_lr_schedule(const LrScheduleConfig& config);

// DeepSpeed's get_lr() at last_batch_iteration (>= -1):
//   w = max(2, warmup_num_steps); i = last_batch_iteration
//   gamma(i) = ln(i + 1) / ln(w) (log) or i / w (linear), for i < w
//   WarmupLR:       i < 0: warmup_min_lr;   min + (max - min) * (i < w ? gamma(i) : 1)
//   WarmupDecayLR:  as WarmupLR below w;  then min + (max - min) *
//                   max(0, (total - i) / max(1, total - w))
//   WarmupCosineLR: i < 0: 0;  i < w: base_lr * (wmin + gamma(i) * (1 - wmin));  then
//                   base_lr * max(0, cmin + (1 - cmin) * (1 + cos(pi * (i - w + 1) / (total - w)))
//                   / 2)
//   constant:       base_lr
double learning_rate(const LrScheduleConfig& config, int64_t last_batch_iteration);

}  // namespace sciattn::train

// Gradient clipping by the global L2 norm: a fixed threshold (DeepSpeed's "gradient_clipping":
// <number>) or an adaptive one that follows the distribution of recent gradient norms. Public API
// of the trainer (plain C++17).
//
// Adaptive rule (docs/training.md writes it as a formula; tests/python/clip_reference.py is the
// same rule in Python and the C++ is tested against it). State: the threshold tau (starting at
// `threshold`) and the norms of the last `history_window` applied steps. For a step whose global
// norm (unscaled gradients, before clipping) is g:
//   1. coefficient c = tau / (g + 1e-6) when that is below 1, else 1   (gradients *= c)
//   2. history <- history + [g], keeping the last history_window norms
//   3. m = median(history), s = 1.4826 * median(|h - m| for h in history)   (robust spread)
//   4. target = m + 3 * s
//   5. tau <- min(max(target, (1 - a) * tau), (1 + a) * tau),   a = adjustment_factor
// Overflowed (skipped) steps neither clip nor enter the history. Medians of an even count are the
// mean of the two middle values. Everything is in double.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "sciattn/status.h"

namespace sciattn::train {

enum class ClipMode { kNone, kFixed, kAdaptive };
const char* clip_mode_name(ClipMode mode);  // "none", "fixed", "adaptive"

struct GradClipConfig {
  ClipMode mode = ClipMode::kNone;
  double threshold = 1.0;          // fixed: the maximum norm; adaptive: the starting threshold
  int64_t history_window = 1000;   // adaptive: norms kept
  double adjustment_factor = 0.2;  // adaptive: the threshold moves by at most this fraction of
                                   // itself per step
};

// Robust-spread multiplier and the number of spreads above the median that the target sits.
inline constexpr double kClipMadToSigma = 1.4826;
inline constexpr double kClipTargetSpreads = 3.0;
// Added to the norm before dividing (DeepSpeed's clip_grad_norm_ epsilon).
inline constexpr double kClipEpsilon = 1e-6;

// threshold > 0 and finite; adaptive: history_window >= 1, 0 < adjustment_factor <= 1. The
// message names the gradient_clipping key.
Status validate_grad_clip(const GradClipConfig& config);

// What one step did, for logs and for the Python comparison.
struct ClipStep {
  double norm = 0.0;            // g
  double threshold = 0.0;       // tau used for this step
  double coefficient = 1.0;     // c
  double next_threshold = 0.0;  // tau after the update
};

class GradClipper {
 public:
  GradClipper() = default;
  explicit GradClipper(const GradClipConfig& config);

  const GradClipConfig& config() const { return config_; }
  // The threshold the next step will use (fixed: the configured one; none: +infinity).
  double threshold() const { return threshold_; }
  const std::deque<double>& history() const { return history_; }

  // Applies rules 1-5 to the norm of an applied step (finite, >= 0) and returns what it did.
  ClipStep step(double norm);

  // Checkpoint state: the threshold and the history, oldest first. set_state rejects a history
  // longer than the window or a non-positive threshold.
  Status set_state(double threshold, const std::vector<double>& history);

 private:
  GradClipConfig config_;
  double threshold_ = 0.0;
  std::deque<double> history_;
};

}  // namespace sciattn::train

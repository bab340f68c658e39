// The trainer's reusable parts as torch ops, for sciattn.optim and sciattn.training: the CPU AdamW
// step over lists of tensors (CPU kernel), and the loss scaler's and the gradient clipper's rules
// as functions of their state (no tensors). The code is the trainer's own (sciattn_train_core), so
// a PyTorch user and `sciattn train` run the same arithmetic. Binding layer.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_registry.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/grad_clip.h"
#include "sciattn/train/loss_scaler.h"
#include "tensor_args.h"

namespace sciattn::torch_ext {
namespace {

using train::AdamWHyperparams;
using train::ClipMode;
using train::GradClipConfig;
using train::GradClipper;
using train::LossScaler;
using train::LossScalerConfig;
using train::LossScalerState;

// Elements below which a further thread of the AdamW step costs more than it saves (a thread's
// wake-up is a few microseconds; the step moves 28 bytes per element at tens of GB/s).
constexpr int64_t kAdamWMinPerThread = 1 << 15;

// A tensor of the AdamW step: on the CPU, contiguous, of `dtype` (or, when dtype is kHalf, of
// either 16-bit type) and with `numel` elements. `what` is the argument name, `i` its index.
void check_adamw_tensor(const at::Tensor& t, const char* what, size_t i, at::ScalarType dtype,
                        int64_t numel) {
  TORCH_CHECK_VALUE(t.defined(), "sciattn.cpu_adamw_step_: ", what, "[", i, "] is undefined");
  TORCH_CHECK_VALUE(t.is_cpu(), "sciattn.cpu_adamw_step_: ", what, "[", i, "] is on ", t.device(),
                    "; the CPU AdamW takes CPU tensors");
  if (dtype == at::kHalf) {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
                     "sciattn.cpu_adamw_step_: ", what, "[", i, "] has dtype ", t.scalar_type(),
                     "; expected float16 or bfloat16");
  } else {
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, "sciattn.cpu_adamw_step_: ", what, "[", i,
                     "] has dtype ", t.scalar_type(), "; expected ", dtype);
  }
  TORCH_CHECK_VALUE(t.is_contiguous(), "sciattn.cpu_adamw_step_: ", what, "[", i,
                    "] must be contiguous");
  TORCH_CHECK_VALUE(t.numel() == numel, "sciattn.cpu_adamw_step_: ", what, "[", i, "] has ",
                    t.numel(), " elements but params[", i, "] has ", numel);
}

// One AdamW step (DeepSpeedCPUAdam's arithmetic, include/sciattn/train/adamw.h) for each tensor
// of the lists, with per-tensor step counts. With param_copies (empty or one per parameter), each
// updated fp32 parameter is also written, rounded, into its float16 or bfloat16 copy.
void cpu_adamw_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                     at::TensorList exp_avg_sq, c10::ArrayRef<int64_t> steps, double lr,
                     double beta1, double beta2, double eps, double weight_decay, bool adamw_mode,
                     bool bias_correction, double grad_scale, at::TensorList param_copies) {
  const size_t n = params.size();
  TORCH_CHECK_VALUE(
      grads.size() == n && exp_avg.size() == n && exp_avg_sq.size() == n && steps.size() == n,
      "sciattn.cpu_adamw_step_: params, grads, exp_avg, exp_avg_sq and steps must "
      "have the same length; got ",
      n, ", ", grads.size(), ", ", exp_avg.size(), ", ", exp_avg_sq.size(), ", ", steps.size());
  TORCH_CHECK_VALUE(param_copies.empty() || param_copies.size() == n,
                    "sciattn.cpu_adamw_step_: param_copies must be empty or hold one tensor per "
                    "parameter (",
                    n, "); got ", param_copies.size());
  AdamWHyperparams h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(beta1);
  h.beta2 = static_cast<float>(beta2);
  h.eps = static_cast<float>(eps);
  h.weight_decay = static_cast<float>(weight_decay);
  h.adamw_mode = adamw_mode;
  h.bias_correction = bias_correction;
  check_status(train::validate_adamw(h), "cpu_adamw_step_");
  // Every tensor is checked before the first one is updated, so a bad list changes nothing.
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = params[i].numel();
    check_adamw_tensor(params[i], "params", i, at::kFloat, numel);
    check_adamw_tensor(grads[i], "grads", i, at::kFloat, numel);
    check_adamw_tensor(exp_avg[i], "exp_avg", i, at::kFloat, numel);
    check_adamw_tensor(exp_avg_sq[i], "exp_avg_sq", i, at::kFloat, numel);
    if (!param_copies.empty())
      check_adamw_tensor(param_copies[i], "param_copies", i, at::kHalf, numel);
  }
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(steps[i] >= 1, "sciattn.cpu_adamw_step_: steps[", i,
                      "] must be >= 1 (the 1-based count of applied steps); got ", steps[i]);
  }
  // One parallel region for the whole list, each thread taking a contiguous share of the
  // concatenated elements and running the step on its pieces of each tensor with a team of one
  // (omp_set_num_threads(1) applies to the regions this thread opens). One region per tensor
  // instead costs a fork and a barrier per tensor, which a GPT's hundreds of small tensors feel,
  // and far more on a busy machine, where every barrier waits for a descheduled thread (100
  // tensors of 42M parameters: 229 ms with two threads against 53 ms with one, on two shared
  // cores). The update is element by element, so the split does not change a bit.
  std::vector<int64_t> offsets(n + 1, 0);
  for (size_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + params[i].numel();
  const int64_t total = offsets[n];
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(num_threads(), total / kAdamWMinPerThread));
  const auto scale = static_cast<float>(grad_scale);
  std::vector<Status> failures(static_cast<size_t>(threads));
#pragma omp parallel num_threads(static_cast <int>(threads))
  {
    omp_set_num_threads(1);
    const int64_t t = omp_get_thread_num();
    const int64_t count = omp_get_num_threads();
    const int64_t per = (total + count - 1) / count;
    const int64_t begin = std::min(total, per * t);
    const int64_t end = std::min(total, begin + per);
    // The first tensor that ends after `begin`.
    size_t i = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), begin) -
                                   offsets.begin() - 1);
    for (; i < n && offsets[i] < end; ++i) {
      const int64_t lo = std::max(begin, offsets[i]) - offsets[i];
      const int64_t hi = std::min(end, offsets[i + 1]) - offsets[i];
      if (hi <= lo) continue;
      float* p = params[i].data_ptr<float>() + lo;
      const float* g = grads[i].data_ptr<float>() + lo;
      float* m = exp_avg[i].data_ptr<float>() + lo;
      float* v = exp_avg_sq[i].data_ptr<float>() + lo;
      Status s;
      if (param_copies.empty()) {
        s = train::cpu_adamw_step(h, steps[i], scale, p, g, m, v, hi - lo);
      } else {
        const at::Tensor& copy = param_copies[i];
        s = train::cpu_adamw_step_copy(
            h, steps[i], scale, p, g, m, v, hi - lo, static_cast<uint16_t*>(copy.data_ptr()) + lo,
            copy.scalar_type() == at::kHalf ? DType::kF16 : DType::kBF16);
      }
      if (!s.ok() && failures[static_cast<size_t>(t)].ok()) failures[static_cast<size_t>(t)] = s;
    }
  }
  for (const Status& s : failures) check_status(s, "cpu_adamw_step_");
}

std::string cpu_adamw_isa() {
  return train::cpu_adamw_isa();
}

// ---- loss scaling ----

LossScalerConfig loss_scaler_config(bool dynamic, double static_scale, int64_t initial_scale_power,
                                    int64_t scale_window, int64_t hysteresis,
                                    bool consecutive_hysteresis, double min_scale) {
  // The int fields are range-checked before narrowing, with the fp16 key in the message.
  TORCH_CHECK_VALUE(initial_scale_power >= 0 && initial_scale_power <= 127,
                    "fp16.initial_scale_power must be in [0, 127]; got ", initial_scale_power);
  TORCH_CHECK_VALUE(hysteresis >= 1 && hysteresis <= 1000000,
                    "fp16.hysteresis must be in [1, 1000000]; got ", hysteresis);
  LossScalerConfig c;
  c.dynamic = dynamic;
  c.static_scale = static_scale;
  c.initial_scale_power = static_cast<int>(initial_scale_power);
  c.scale_window = scale_window;
  c.hysteresis = static_cast<int>(hysteresis);
  c.consecutive_hysteresis = consecutive_hysteresis;
  c.min_scale = min_scale;
  check_status(train::validate_loss_scaler(c), "DynamicLossScaler");
  return c;
}

using ScalerState = std::tuple<double, int64_t, int64_t, int64_t>;

ScalerState to_tuple(const LossScalerState& s) {
  return {s.cur_scale, s.cur_iter, s.last_overflow_iter, static_cast<int64_t>(s.cur_hysteresis)};
}

// The state of a new scaler: (cur_scale, cur_iter, last_overflow_iter, cur_hysteresis).
ScalerState loss_scaler_init(bool dynamic, double static_scale, int64_t initial_scale_power,
                             int64_t scale_window, int64_t hysteresis, bool consecutive_hysteresis,
                             double min_scale) {
  return to_tuple(
      LossScaler(loss_scaler_config(dynamic, static_scale, initial_scale_power, scale_window,
                                    hysteresis, consecutive_hysteresis, min_scale))
          .state());
}

// LossScaler::update on the given state; returns the next state. An overflow at the minimum scale
// (with raise_error_at_min_scale) is a RuntimeError, as DeepSpeed raises.
ScalerState loss_scaler_update(bool dynamic, double static_scale, int64_t initial_scale_power,
                               int64_t scale_window, int64_t hysteresis,
                               bool consecutive_hysteresis, double min_scale,
                               bool raise_error_at_min_scale, double cur_scale, int64_t cur_iter,
                               int64_t last_overflow_iter, int64_t cur_hysteresis, bool overflow) {
  LossScalerConfig c = loss_scaler_config(dynamic, static_scale, initial_scale_power, scale_window,
                                          hysteresis, consecutive_hysteresis, min_scale);
  c.raise_error_at_min_scale = raise_error_at_min_scale;
  TORCH_CHECK_VALUE(cur_hysteresis >= 1 && cur_hysteresis <= hysteresis,
                    "DynamicLossScaler state: cur_hysteresis must be in [1, hysteresis = ",
                    hysteresis, "]; got ", cur_hysteresis);
  TORCH_CHECK_VALUE(cur_scale > 0.0 && std::isfinite(cur_scale),
                    "DynamicLossScaler state: cur_scale must be a finite number > 0; got ",
                    cur_scale);
  LossScaler scaler(c);
  LossScalerState s;
  s.cur_scale = cur_scale;
  s.cur_iter = cur_iter;
  s.last_overflow_iter = last_overflow_iter;
  s.cur_hysteresis = static_cast<int>(cur_hysteresis);
  scaler.set_state(s);
  const Status status = scaler.update(overflow);
  TORCH_CHECK(status.ok(), "sciattn.DynamicLossScaler: ", status.message());
  return to_tuple(scaler.state());
}

// ---- gradient clipping ----

GradClipConfig clip_config(const std::string& mode, double threshold, int64_t history_window,
                           double adjustment_factor) {
  GradClipConfig c;
  if (mode == "none") {
    c.mode = ClipMode::kNone;
  } else if (mode == "fixed") {
    c.mode = ClipMode::kFixed;
  } else if (mode == "adaptive") {
    c.mode = ClipMode::kAdaptive;
  } else {
    TORCH_CHECK_VALUE(false, "gradient_clipping.type must be 'fixed' or 'adaptive'; got '", mode,
                      "'");
  }
  c.threshold = threshold;
  c.history_window = history_window;
  c.adjustment_factor = adjustment_factor;
  check_status(train::validate_grad_clip(c), "AdaptiveGradClipper");
  return c;
}

// The threshold a new clipper starts with (+inf when mode is "none").
double grad_clip_init(const std::string& mode, double threshold, int64_t history_window,
                      double adjustment_factor) {
  return GradClipper(clip_config(mode, threshold, history_window, adjustment_factor)).threshold();
}

// GradClipper::step for the norm of an applied step, from the state (tau, history); returns the
// coefficient, the next threshold and the next history.
std::tuple<double, double, std::vector<double>> grad_clip_step(
    const std::string& mode, double threshold, int64_t history_window, double adjustment_factor,
    double tau, c10::ArrayRef<double> history, double norm) {
  GradClipper clipper(clip_config(mode, threshold, history_window, adjustment_factor));
  check_status(clipper.set_state(tau, std::vector<double>(history.begin(), history.end())),
               "AdaptiveGradClipper");
  TORCH_CHECK_VALUE(std::isfinite(norm) && norm >= 0.0,
                    "sciattn.AdaptiveGradClipper: norm must be finite and >= 0 (a step whose "
                    "gradients overflowed is skipped, not clipped); got ",
                    norm);
  const train::ClipStep s = clipper.step(norm);
  return {s.coefficient, clipper.threshold(),
          std::vector<double>(clipper.history().begin(), clipper.history().end())};
}

}  // namespace

void register_train_kernels(torch::Library& m) {
  m.impl("cpu_adamw_step_", &cpu_adamw_step_);
}

}  // namespace sciattn::torch_ext

TORCH_LIBRARY_FRAGMENT(sciattn, m) {
  m.def(
      "cpu_adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avg, "
      "Tensor(c!)[] exp_avg_sq, int[] steps, float lr, float beta1, float beta2, float eps, "
      "float weight_decay, bool adamw_mode, bool bias_correction, float grad_scale, "
      "Tensor(d!)[] param_copies) -> ()");
  m.def("cpu_adamw_isa() -> str", &sciattn::torch_ext::cpu_adamw_isa);
  m.def(
      "loss_scaler_init(bool dynamic, float static_scale, int initial_scale_power, "
      "int scale_window, int hysteresis, bool consecutive_hysteresis, float min_scale) "
      "-> (float, int, int, int)",
      &sciattn::torch_ext::loss_scaler_init);
  m.def(
      "loss_scaler_update(bool dynamic, float static_scale, int initial_scale_power, "
      "int scale_window, int hysteresis, bool consecutive_hysteresis, float min_scale, "
      "bool raise_error_at_min_scale, float cur_scale, int cur_iter, int last_overflow_iter, "
      "int cur_hysteresis, bool overflow) -> (float, int, int, int)",
      &sciattn::torch_ext::loss_scaler_update);
  m.def(
      "grad_clip_init(str mode, float threshold, int history_window, float adjustment_factor) "
      "-> float",
      &sciattn::torch_ext::grad_clip_init);
  m.def(
      "grad_clip_step(str mode, float threshold, int history_window, float adjustment_factor, "
      "float tau, float[] history, float norm) -> (float, float, float[])",
      &sciattn::torch_ext::grad_clip_step);
}

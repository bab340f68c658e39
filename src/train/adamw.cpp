// CPU AdamW (DeepSpeedCPUAdam's arithmetic): one loop body, compiled for AVX-512, AVX2 and
// baseline x86-64 (GCC's target_clones picks one at load time), run on contiguous per-thread
// ranges. Trainer layer (host code).
#include "sciattn/train/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "adamw_coefficients.h"

namespace sciattn::train {
namespace {

using Coefficients = AdamWCoefficients;

enum class Copy { kNone, kF16, kBF16 };

// The update of elements [0, n). kDecoupled: AdamW's decay of the parameter; kL2: Adam's decay
// folded into the gradient. The operations are those of the header, one rounding each, so every
// instruction set gives the same bits (the target is built with -ffp-contract=off).
template <bool kDecoupled, bool kL2, Copy kCopy>
inline __attribute__((always_inline)) void adam_body(const Coefficients& c, float* __restrict p,
                                                     const float* __restrict g, float* __restrict m,
                                                     float* __restrict v, uint16_t* __restrict copy,
                                                     int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float grad = g[i] * c.grad_scale;
    float param = p[i];
    if constexpr (kL2) grad = param * c.grad_decay + grad;
    float momentum = m[i] * c.beta1;
    momentum = grad * c.one_minus_beta1 + momentum;
    float variance = v[i] * c.beta2;
    variance = (grad * grad) * c.one_minus_beta2 + variance;
    float update = std::sqrt(variance);
    update = update * c.bias_correction2 + c.eps;
    update = momentum / update;
    if constexpr (kDecoupled) param = param * c.param_decay + param;
    param = update * c.step_size + param;
    m[i] = momentum;
    v[i] = variance;
    p[i] = param;
    if constexpr (kCopy == Copy::kF16) copy[i] = float_to_f16_bits(param);
    if constexpr (kCopy == Copy::kBF16) copy[i] = float_to_bf16_bits(param);
  }
}

#define SCIATTN_ADAM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// One entry point per variant, each cloned per instruction set (target_clones does not apply to
// templates).
#define SCIATTN_ADAM_VARIANT(name, decoupled, l2, copy)                                    \
  SCIATTN_ADAM_CLONES void name(const Coefficients& c, float* p, const float* g, float* m, \
                                float* v, uint16_t* out, int64_t n) {                      \
    adam_body<decoupled, l2, copy>(c, p, g, m, v, out, n);                                 \
  }
SCIATTN_ADAM_VARIANT(adam_plain, false, false, Copy::kNone)
SCIATTN_ADAM_VARIANT(adam_decoupled, true, false, Copy::kNone)
SCIATTN_ADAM_VARIANT(adam_l2, false, true, Copy::kNone)
SCIATTN_ADAM_VARIANT(adam_plain_f16, false, false, Copy::kF16)
SCIATTN_ADAM_VARIANT(adam_decoupled_f16, true, false, Copy::kF16)
SCIATTN_ADAM_VARIANT(adam_l2_f16, false, true, Copy::kF16)
SCIATTN_ADAM_VARIANT(adam_plain_bf16, false, false, Copy::kBF16)
SCIATTN_ADAM_VARIANT(adam_decoupled_bf16, true, false, Copy::kBF16)
SCIATTN_ADAM_VARIANT(adam_l2_bf16, false, true, Copy::kBF16)
#undef SCIATTN_ADAM_VARIANT

using Kernel = void (*)(const Coefficients&, float*, const float*, float*, float*, uint16_t*,
                        int64_t);

Kernel pick_kernel(const AdamWHyperparams& h, Copy copy) {
  const bool decay = h.weight_decay > 0.0f;
  const int kind = !decay ? 0 : h.adamw_mode ? 1 : 2;
  static constexpr Kernel kTable[3][3] = {
      {adam_plain, adam_decoupled, adam_l2},
      {adam_plain_f16, adam_decoupled_f16, adam_l2_f16},
      {adam_plain_bf16, adam_decoupled_bf16, adam_l2_bf16},
  };
  return kTable[static_cast<int>(copy)][kind];
}

// Elements per thread range are multiples of this, so every range but the last starts on a
// 64-byte line and is a whole number of AVX-512 vectors.
constexpr int64_t kRangeAlign = 16;

Status run(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
           const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n, uint16_t* copy,
           Copy copy_kind) {
  Status valid = validate_adamw(h);
  if (!valid.ok()) return valid;
  if (step < 1) {
    return Status::invalid_argument(
        "AdamW step must be >= 1 (the 1-based count of applied "
        "steps); got " +
        std::to_string(step));
  }
  if (n < 0) return Status::invalid_argument("AdamW: n must be >= 0; got " + std::to_string(n));
  if (!std::isfinite(grad_scale)) {
    return Status::invalid_argument("AdamW: grad_scale must be finite; got " +
                                    std::to_string(grad_scale));
  }
  if (n > 0 &&
      (params == nullptr || grads == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr)) {
    return Status::invalid_argument("AdamW: params, grads, exp_avg and exp_avg_sq must be given");
  }
  const Coefficients c = adamw_coefficients(h, step, grad_scale);
  const Kernel kernel = pick_kernel(h, copy_kind);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t per = ((n + threads - 1) / threads + kRangeAlign - 1) / kRangeAlign * kRangeAlign;
    const int64_t begin = std::min(n, per * omp_get_thread_num());
    const int64_t end = std::min(n, begin + per);
    if (end > begin) {
      kernel(c, params + begin, grads + begin, exp_avg + begin, exp_avg_sq + begin,
             copy != nullptr ? copy + begin : nullptr, end - begin);
    }
  }
  return Status::ok_status();
}

}  // namespace

AdamWCoefficients adamw_coefficients(const AdamWHyperparams& h, int64_t step, float grad_scale) {
  AdamWCoefficients c{};
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.one_minus_beta2 = 1.0f - h.beta2;
  float bias_correction1 = 1.0f;
  c.bias_correction2 = 1.0f;
  if (h.bias_correction) {
    const double s = static_cast<double>(step);
    bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), s));
    c.bias_correction2 =
        static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), s)));
  }
  c.eps = h.eps;
  c.step_size = -1.0f * h.lr / bias_correction1;
  c.param_decay = -1.0f * h.lr * h.weight_decay;
  c.grad_decay = h.weight_decay;
  c.grad_scale = grad_scale;
  return c;
}

Status validate_adamw(const AdamWHyperparams& h) {
  auto bad = [](const char* name, float value, const char* accepted) {
    return Status::invalid_argument(std::string("optimizer.params.") + name + " must be " +
                                    accepted + "; got " + std::to_string(value));
  };
  if (!(h.lr >= 0.0f) || !std::isfinite(h.lr)) return bad("lr", h.lr, "a finite number >= 0");
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f)) return bad("betas[0]", h.beta1, "in [0, 1)");
  if (!(h.beta2 >= 0.0f && h.beta2 < 1.0f)) return bad("betas[1]", h.beta2, "in [0, 1)");
  if (!(h.eps > 0.0f) || !std::isfinite(h.eps)) return bad("eps", h.eps, "a finite number > 0");
  if (!(h.weight_decay >= 0.0f) || !std::isfinite(h.weight_decay)) {
    return bad("weight_decay", h.weight_decay, "a finite number >= 0");
  }
  return Status::ok_status();
}

Status cpu_adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                      const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n) {
  return run(h, step, grad_scale, params, grads, exp_avg, exp_avg_sq, n, nullptr, Copy::kNone);
}

Status cpu_adamw_step_copy(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                           const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                           void* param_copy, DType copy_dtype) {
  if (copy_dtype != DType::kF16 && copy_dtype != DType::kBF16) {
    return Status::invalid_argument(std::string("AdamW copy_dtype must be f16 or bf16; got ") +
                                    dtype_name(copy_dtype));
  }
  if (n > 0 && param_copy == nullptr) {
    return Status::invalid_argument("AdamW: param_copy must be given");
  }
  return run(h, step, grad_scale, params, grads, exp_avg, exp_avg_sq, n,
             static_cast<uint16_t*>(param_copy),
             copy_dtype == DType::kF16 ? Copy::kF16 : Copy::kBF16);
}

std::string cpu_adamw_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "baseline";
}

}  // namespace sciattn::train

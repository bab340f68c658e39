// The trainer's optimizer-side pieces: CPU AdamW against a scalar reference (bitwise) and a
// textbook fp64 AdamW; DeepSpeed's LR schedules at chosen steps; the loss scaler's sequences
// (overflow, hysteresis, window, min scale); fixed and adaptive clipping; the gradient reduction
// with an injected Inf for standard and ds_enhanced fp16 scaling. Test layer (cpu).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "sciattn/train/adamw.h"
#include "sciattn/train/grad_clip.h"
#include "sciattn/train/gradients.h"
#include "sciattn/train/loss_scaler.h"
#include "sciattn/train/lr_schedule.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

// DeepSpeed's Step_1 loop, one element at a time, written out here (compiled with
// -ffp-contract=off like the library).
void scalar_adamw(const AdamWHyperparams& h, int64_t step, float grad_scale, float* p,
                  const float* g, float* m, float* v, int64_t n) {
  const float one_minus_beta1 = 1.0f - h.beta1, one_minus_beta2 = 1.0f - h.beta2;
  float bc1 = 1.0f, bc2 = 1.0f;
  if (h.bias_correction) {
    bc1 =
        static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step)));
    bc2 = static_cast<float>(
        1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step))));
  }
  const float step_size = -1.0f * h.lr / bc1;
  const float w_decay = -1.0f * h.lr * h.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    float grad = g[i] * grad_scale;
    float param = p[i];
    if (h.weight_decay > 0.0f && !h.adamw_mode) grad = param * h.weight_decay + grad;
    float mom = m[i] * h.beta1;
    mom = grad * one_minus_beta1 + mom;
    float var = v[i] * h.beta2;
    var = (grad * grad) * one_minus_beta2 + var;
    float u = std::sqrt(var);
    u = u * bc2 + h.eps;
    u = mom / u;
    if (h.weight_decay > 0.0f && h.adamw_mode) param = param * w_decay + param;
    param = u * step_size + param;
    m[i] = mom;
    v[i] = var;
    p[i] = param;
  }
}

TEST(TrainAdamW, EqualsTheScalarReferenceBitForBit) {
  std::printf("AdamW kernel: %s\n", cpu_adamw_isa().c_str());
  // Sizes that are not multiples of any vector width or of the thread count, and tiny ones.
  for (int64_t n : {int64_t{10007}, int64_t{257}, int64_t{1}, int64_t{17}}) {
    for (int variant = 0; variant < 4; ++variant) {
      AdamWHyperparams h;
      h.lr = 3e-3f;
      h.beta1 = 0.9f;
      h.beta2 = 0.95f;
      h.eps = 1e-8f;
      h.weight_decay = variant == 0 ? 0.0f : 0.1f;
      h.adamw_mode = variant != 2;
      h.bias_correction = variant != 3;
      std::vector<float> p = random_floats(static_cast<size_t>(n), 1), m(n, 0.0f), v(n, 0.0f);
      std::vector<float> rp = p, rm = m, rv = v;
      for (int64_t step = 1; step <= 5; ++step) {
        const std::vector<float> g = random_floats(static_cast<size_t>(n), 100 + step, 3.0f);
        ASSERT_TRUE(cpu_adamw_step(h, step, 0.5f, p.data(), g.data(), m.data(), v.data(), n).ok());
        scalar_adamw(h, step, 0.5f, rp.data(), g.data(), rm.data(), rv.data(), n);
      }
      EXPECT_TRUE(bitwise_equal(p.data(), rp.data(), n)) << "params, variant " << variant;
      EXPECT_TRUE(bitwise_equal(m.data(), rm.data(), n)) << "exp_avg, variant " << variant;
      EXPECT_TRUE(bitwise_equal(v.data(), rv.data(), n)) << "exp_avg_sq, variant " << variant;
    }
  }
}

// PyTorch's AdamW in fp64: p *= 1 - lr wd; m, v; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
TEST(TrainAdamW, MatchesTextbookAdamWInDouble) {
  const int64_t n = 257;
  AdamWHyperparams h;
  h.lr = 1e-2f;
  h.weight_decay = 0.05f;
  std::vector<float> p = random_floats(n, 7), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> P(p.begin(), p.end()), M(n, 0.0), Vv(n, 0.0);
  for (int64_t t = 1; t <= 20; ++t) {
    const std::vector<float> g = random_floats(n, 300 + t);
    ASSERT_TRUE(cpu_adamw_step(h, t, 1.0f, p.data(), g.data(), m.data(), v.data(), n).ok());
    const double b1 = h.beta1, b2 = h.beta2, lr = h.lr;
    for (int64_t i = 0; i < n; ++i) {
      P[i] *= 1.0 - lr * static_cast<double>(h.weight_decay);
      M[i] = b1 * M[i] + (1 - b1) * g[i];
      Vv[i] = b2 * Vv[i] + (1 - b2) * static_cast<double>(g[i]) * g[i];
      const double bc1 = 1 - std::pow(b1, static_cast<double>(t)),
                   bc2 = 1 - std::pow(b2, static_cast<double>(t));
      P[i] -= lr / bc1 * M[i] / (std::sqrt(Vv[i]) / std::sqrt(bc2) + static_cast<double>(h.eps));
    }
  }
  expect_close(p, P, 1e-5, "AdamW vs fp64 textbook");
}

TEST(TrainAdamW, CopyOutWrites16BitParameters) {
  const int64_t n = 1001;
  AdamWHyperparams h;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    std::vector<float> p = random_floats(n, 9), m(n, 0.0f), v(n, 0.0f);
    std::vector<float> p2 = p, m2 = m, v2 = v;
    std::vector<uint16_t> copy(n, 0xFFFF);
    const std::vector<float> g = random_floats(n, 10);
    ASSERT_TRUE(
        cpu_adamw_step_copy(h, 1, 1.0f, p.data(), g.data(), m.data(), v.data(), n, copy.data(), dt)
            .ok());
    ASSERT_TRUE(cpu_adamw_step(h, 1, 1.0f, p2.data(), g.data(), m2.data(), v2.data(), n).ok());
    EXPECT_TRUE(bitwise_equal(p.data(), p2.data(), n));
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = dt == DType::kF16 ? float_to_f16_bits(p[i]) : float_to_bf16_bits(p[i]);
      ASSERT_EQ(copy[i], want) << dtype_name(dt) << " element " << i;
    }
  }
}

TEST(TrainAdamW, BadArgumentsAreNamed) {
  AdamWHyperparams h;
  float x = 0;
  h.beta2 = 1.0f;
  Status s = cpu_adamw_step(h, 1, 1.0f, &x, &x, &x, &x, 1);
  EXPECT_NE(s.message().find("optimizer.params.betas[1]"), std::string::npos) << s.message();
  h = AdamWHyperparams{};
  s = cpu_adamw_step(h, 0, 1.0f, &x, &x, &x, &x, 1);
  EXPECT_NE(s.message().find("step must be >= 1"), std::string::npos) << s.message();
  s = cpu_adamw_step_copy(h, 1, 1.0f, &x, &x, &x, &x, 1, &x, DType::kF32);
  EXPECT_NE(s.message().find("copy_dtype"), std::string::npos) << s.message();
}

// ---- schedules: DeepSpeed's formulas written out at chosen iterations ----

TEST(TrainSchedule, WarmupLR) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupLR;
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 100;
  EXPECT_EQ(learning_rate(c, -1), 1e-5);  // before the first scheduler.step(): min
  EXPECT_EQ(learning_rate(c, 0), 1e-5);   // ln(1) = 0
  // ln(10) / ln(100) = 1/2.
  EXPECT_NEAR(learning_rate(c, 9), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-15);
  EXPECT_NEAR(learning_rate(c, 99), 1e-5 + (1e-3 - 1e-5) * std::log(100.0) / std::log(100.0),
              1e-15);
  EXPECT_EQ(learning_rate(c, 100), 1e-3);
  EXPECT_EQ(learning_rate(c, 5000), 1e-3);
  c.warmup_type = WarmupType::kLinear;
  EXPECT_NEAR(learning_rate(c, 25), 1e-5 + (1e-3 - 1e-5) * 0.25, 1e-15);
  // warmup_num_steps below 2 acts as 2 (DeepSpeed's max(2, .)).
  c.warmup_num_steps = 0;
  EXPECT_NEAR(learning_rate(c, 1), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-15);
  EXPECT_EQ(learning_rate(c, 2), 1e-3);
}

TEST(TrainSchedule, WarmupDecayLR) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupDecayLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 6e-5;
  c.warmup_num_steps = 100;
  c.total_num_steps = 1100;
  EXPECT_EQ(learning_rate(c, -1), 0.0);
  EXPECT_NEAR(learning_rate(c, 9), 3e-5, 1e-18);
  EXPECT_EQ(learning_rate(c, 100), 6e-5);  // (1100 - 100) / (1100 - 100)
  EXPECT_NEAR(learning_rate(c, 600), 3e-5, 1e-18);
  EXPECT_EQ(learning_rate(c, 1100), 0.0);
  EXPECT_EQ(learning_rate(c, 2000), 0.0);  // max(0, .)
  // total below warmup: the divisor is max(1, total - w).
  c.total_num_steps = 50;
  EXPECT_EQ(learning_rate(c, 100), 0.0);
}

TEST(TrainSchedule, WarmupCosineLR) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupCosineLR;
  c.base_lr = 2e-4;
  c.warmup_min_ratio = 0.1;
  c.warmup_num_steps = 10;
  c.total_num_steps = 110;
  c.cos_min_ratio = 0.01;
  EXPECT_EQ(learning_rate(c, -1), 0.0);  // DeepSpeed's get_lr before its first step
  EXPECT_NEAR(learning_rate(c, 0), 2e-4 * 0.1, 1e-18);
  // i = 9 < w: ratio = ln(10) / ln(10) = 1 -> 0.1 + 1 * 0.9.
  EXPECT_NEAR(learning_rate(c, 9), 2e-4, 1e-18);
  // i = 59: real step 50 of 100 -> (1 + cos(pi / 2)) / 2 = 0.5 -> 0.01 + 0.99 * 0.5.
  EXPECT_NEAR(learning_rate(c, 59), 2e-4 * (0.01 + 0.99 * 0.5), 1e-18);
  // i = 109: real step 100 of 100 -> cos(pi) = -1 -> cos_min_ratio.
  EXPECT_NEAR(learning_rate(c, 109), 2e-4 * 0.01, 1e-18);
  EXPECT_TRUE(validate_lr_schedule(c).ok());
  c.total_num_steps = 10;
  Status s = validate_lr_schedule(c);
  EXPECT_NE(s.message().find("scheduler.params.total_num_steps"), std::string::npos) << s.message();
}

// ---- loss scaler ----

TEST(TrainLossScaler, DynamicSequenceWithHysteresisAndWindow) {
  LossScalerConfig c;
  c.initial_scale_power = 4;  // 16
  c.scale_window = 3;
  c.hysteresis = 2;
  c.min_scale = 2;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 16.0);
  // iter 0: overflow, hysteresis 2 -> 1, scale stays.
  ASSERT_TRUE(s.update(true).ok());
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  // iter 1: overflow with hysteresis 1: halve.
  ASSERT_TRUE(s.update(true).ok());
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_EQ(s.state().last_overflow_iter, 1);
  // iters 2, 3: clean; (iter - 1) % 3 != 0.
  ASSERT_TRUE(s.update(false).ok());
  ASSERT_TRUE(s.update(false).ok());
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);  // not consecutive: reset only at a window
  // iter 4: (4 - 1) % 3 == 0: double and reset the hysteresis.
  ASSERT_TRUE(s.update(false).ok());
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  // Three overflows in a row: 16 (hyst 2 -> 1), 8, 4, then 2 = min.
  for (double want : {16.0, 8.0, 4.0, 2.0}) {
    ASSERT_TRUE(s.update(true).ok());
    EXPECT_EQ(s.scale(), want);
  }
  // At the minimum with no hysteresis left: DeepSpeed raises.
  Status st = s.update(true);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("fp16.min_loss_scale"), std::string::npos) << st.message();
  EXPECT_EQ(s.scale(), 2.0);
}

TEST(TrainLossScaler, ConsecutiveHysteresisResetsOnEveryCleanStep) {
  LossScalerConfig c;
  c.initial_scale_power = 3;
  c.scale_window = 100;
  c.hysteresis = 2;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  ASSERT_TRUE(s.update(true).ok());   // hysteresis 2 -> 1
  ASSERT_TRUE(s.update(false).ok());  // reset to 2
  ASSERT_TRUE(s.update(true).ok());   // 2 -> 1 again, no halving
  EXPECT_EQ(s.scale(), 8.0);
  ASSERT_TRUE(s.update(true).ok());
  EXPECT_EQ(s.scale(), 4.0);
}

TEST(TrainLossScaler, MinScaleClampsAndStaticNeverMoves) {
  LossScalerConfig c;
  c.initial_scale_power = 2;
  c.hysteresis = 1;
  c.min_scale = 3;
  LossScaler s(c);
  ASSERT_TRUE(s.update(true).ok());
  EXPECT_EQ(s.scale(), 3.0);  // max(4 / 2, 3)
  LossScalerConfig st;
  st.dynamic = false;
  st.static_scale = 128;
  LossScaler fixed(st);
  for (bool o : {true, false, true}) ASSERT_TRUE(fixed.update(o).ok());
  EXPECT_EQ(fixed.scale(), 128.0);
  st.static_scale = -1;
  EXPECT_NE(validate_loss_scaler(st).message().find("fp16.loss_scale"), std::string::npos);
}

// ---- clipping ----

TEST(TrainClip, FixedClipsAboveTheThresholdOnly) {
  GradClipConfig c;
  c.mode = ClipMode::kFixed;
  c.threshold = 1.0;
  GradClipper clip(c);
  EXPECT_EQ(clip.step(0.5).coefficient, 1.0);
  EXPECT_DOUBLE_EQ(clip.step(4.0).coefficient, 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip.threshold(), 1.0);
}

TEST(TrainClip, AdaptiveFollowsTheRuleStepByStep) {
  GradClipConfig c;
  c.mode = ClipMode::kAdaptive;
  c.threshold = 1.0;
  c.history_window = 3;
  c.adjustment_factor = 0.5;
  GradClipper clip(c);
  // Step 1: g = 2, tau = 1 -> c = 1 / 2.000001; history [2]: m = 2, s = 0 -> target 2;
  // tau = min(max(2, 0.5), 1.5) = 1.5.
  ClipStep s = clip.step(2.0);
  EXPECT_DOUBLE_EQ(s.coefficient, 1.0 / (2.0 + 1e-6));
  EXPECT_EQ(s.next_threshold, 1.5);
  // Step 2: g = 1 -> c = 1; history [2, 1]: m = 1.5, MAD = 0.5 -> target 1.5 + 3 * 1.4826 * 0.5;
  // tau = min(max(target, 0.75), 2.25) = 2.25.
  s = clip.step(1.0);
  EXPECT_EQ(s.coefficient, 1.0);
  EXPECT_EQ(s.next_threshold, 2.25);
  // Steps 3, 4: history [1, 1, 1] after the window drops the 2 -> target 1 -> tau falls by half
  // per step at most: 2.25 -> max(target of [2,1,1] = 1, 1.125) = 1.125 -> max(1, 0.5625) = 1.
  s = clip.step(1.0);
  EXPECT_EQ(s.next_threshold, 1.125);
  s = clip.step(1.0);
  EXPECT_EQ(clip.history().size(), 3u);
  EXPECT_EQ(s.next_threshold, 1.0);
  // A spike is clipped to the threshold and moves it by at most half.
  s = clip.step(100.0);
  EXPECT_DOUBLE_EQ(s.coefficient, 1.0 / (100.0 + 1e-6));
  EXPECT_EQ(s.next_threshold, 1.0);  // median of [1, 1, 100] is 1, MAD 0
}

TEST(TrainClip, BadConfigAndStateAreNamed) {
  GradClipConfig c;
  c.mode = ClipMode::kAdaptive;
  c.history_window = 0;
  EXPECT_NE(validate_grad_clip(c).message().find("gradient_clipping.history_window"),
            std::string::npos);
  c.history_window = 2;
  GradClipper clip(c);
  EXPECT_FALSE(clip.set_state(1.0, {1, 2, 3}).ok());
  EXPECT_FALSE(clip.set_state(0.0, {}).ok());
}

// ---- the gradient path ----

TEST(TrainGradients, SumOfSquaresDoesNotDependOnThreads) {
  const std::vector<float> g = random_floats(100003, 5);
  omp_set_num_threads(1);
  const SumSquares one = sum_squares(g.data(), static_cast<int64_t>(g.size()));
  omp_set_num_threads(2);
  const SumSquares two = sum_squares(g.data(), static_cast<int64_t>(g.size()));
  EXPECT_EQ(one.sum, two.sum);
  EXPECT_TRUE(one.finite);
}

TEST(TrainGradients, InjectedInfIsAnOverflowInBothScalings) {
  SingleRankCommunicator comm;
  for (Fp16Scaling scaling : {Fp16Scaling::kStandard, Fp16Scaling::kDsEnhanced}) {
    for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
      std::vector<float> g = random_floats(50000, 3);
      g[31337] = bad;
      ReducedGradients r;
      ASSERT_TRUE(reduce_gradients(comm, scaling, 1024.0, g.data(), 50000, &r).ok());
      EXPECT_TRUE(r.overflow);
    }
  }
}

TEST(TrainGradients, StandardAndDsEnhancedAgreeOnOneRank) {
  SingleRankCommunicator comm;
  const std::vector<float> g0 = random_floats(4097, 4, 100.0f);
  std::vector<float> a = g0, b = g0;
  ReducedGradients ra, rb;
  ASSERT_TRUE(reduce_gradients(comm, Fp16Scaling::kStandard, 256.0, a.data(), 4097, &ra).ok());
  ASSERT_TRUE(reduce_gradients(comm, Fp16Scaling::kDsEnhanced, 256.0, b.data(), 4097, &rb).ok());
  EXPECT_FALSE(ra.overflow);
  EXPECT_EQ(ra.pending_scale, 1.0f / 256.0f);  // standard leaves the buffer scaled
  EXPECT_EQ(rb.pending_scale, 1.0f);           // ds_enhanced unscaled it in place
  EXPECT_TRUE(bitwise_equal(a.data(), g0.data(), a.size()));
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], g0[i] / 256.0f);
  EXPECT_NEAR(ra.norm, rb.norm, 1e-12 * ra.norm);
  double want = 0;
  for (float x : g0) want += static_cast<double>(x) * x;
  EXPECT_NEAR(ra.norm, std::sqrt(want) / 256.0, 1e-12 * ra.norm);
}

}  // namespace
}  // namespace sciattn::train

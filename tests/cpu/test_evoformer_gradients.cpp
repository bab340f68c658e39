// Tests of the Evoformer backward: first the test's own fp64 gradients against central finite
// differences of its fp64 forward, then the library's reference and tiled backward (every dtype,
// bias combination and layout) against those fp64 gradients, and fully masked rows.
// Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "evoformer_test_util.h"

namespace sciattn {
namespace {

using namespace sciattn::test;

// ---- The fp64 oracle checks itself: gradients against finite differences. ----

double naive_loss(const NaiveProblem& p, const std::vector<double>& dout) {
  const NaiveForward f = naive_forward(p);
  double loss = 0.0;
  for (size_t i = 0; i < dout.size(); ++i) loss += dout[i] * f.out[i];
  return loss;
}

// Central differences of loss = sum(dout * out) with respect to every element of one input. In
// fp64 with step 1e-5 the truncation error is about h^2 = 1e-10 and the cancellation error about
// 1e-16 / h = 1e-11, so 1e-7 (relative to the gradient's size, at least 1) is a tight bound.
// A masked (-inf) bias element has no gradient: the oracle must give exactly 0 there.
::testing::AssertionResult matches_finite_differences(const std::string& what, NaiveProblem p,
                                                      std::vector<double> NaiveProblem::*input,
                                                      const std::vector<double>& analytic,
                                                      const std::vector<double>& dout) {
  constexpr double kStep = 1e-5;
  constexpr double kTol = 1e-7;
  std::vector<double>& x = p.*input;
  if (analytic.size() != x.size()) {
    return ::testing::AssertionFailure()
           << what << ": gradient has " << analytic.size() << " elements, input " << x.size();
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    if (!std::isfinite(x0)) {
      if (analytic[i] != 0.0) {
        return ::testing::AssertionFailure()
               << what << "[" << i << "]: masked element has gradient " << analytic[i];
      }
      continue;
    }
    x[i] = x0 + kStep;
    const double up = naive_loss(p, dout);
    x[i] = x0 - kStep;
    const double down = naive_loss(p, dout);
    x[i] = x0;
    const double fd = (up - down) / (2.0 * kStep);
    if (!(std::fabs(fd - analytic[i]) <= kTol * std::max(1.0, std::fabs(analytic[i])))) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "]: analytic " << analytic[i] << ", finite difference " << fd;
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> normal_vector(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

NaiveProblem random_problem(std::mt19937_64& rng, EvoShape s, double scale, bool with_bias1,
                            bool with_bias2) {
  NaiveProblem p;
  p.s = s;
  p.scale = scale;
  p.q = normal_vector(rng, numel_of(s.qkv()));
  p.k = normal_vector(rng, numel_of(s.qkv()));
  p.v = normal_vector(rng, numel_of(s.qkv()));
  if (with_bias1) p.bias1 = normal_vector(rng, s.B * s.N * s.L);
  if (with_bias2) p.bias2 = normal_vector(rng, s.B * s.H * s.L * s.L);
  return p;
}

void expect_all_gradients_match(const NaiveProblem& p, const std::vector<double>& dout) {
  const NaiveGrads g = naive_backward(p, dout);
  EXPECT_TRUE(matches_finite_differences("dq", p, &NaiveProblem::q, g.dq, dout));
  EXPECT_TRUE(matches_finite_differences("dk", p, &NaiveProblem::k, g.dk, dout));
  EXPECT_TRUE(matches_finite_differences("dv", p, &NaiveProblem::v, g.dv, dout));
  if (!p.bias1.empty()) {
    EXPECT_TRUE(matches_finite_differences("dbias1", p, &NaiveProblem::bias1, g.dbias1, dout));
  }
  if (!p.bias2.empty()) {
    EXPECT_TRUE(matches_finite_differences("dbias2", p, &NaiveProblem::bias2, g.dbias2, dout));
  }
}

TEST(NaiveEvoformer, ForwardOfAHandComputedExample) {
  // Scores [0, log 3] give probabilities [1/4, 3/4], so out = 1/4 * 1 + 3/4 * 5 = 4 and
  // lse = log(1 + 3) = log 4.
  NaiveProblem p;
  p.s = EvoShape{1, 1, 2, 1, 1};
  p.scale = 1.0;
  p.q = {1.0, 0.0};
  p.k = {0.0, std::log(3.0)};
  p.v = {1.0, 5.0};
  const NaiveForward f = naive_forward(p);
  EXPECT_NEAR(f.out[0], 4.0, 1e-14);
  EXPECT_NEAR(f.lse[0], std::log(4.0), 1e-14);
  // Query row 1 is the zero vector: uniform weights, out = 3 and lse = log 2.
  EXPECT_NEAR(f.out[1], 3.0, 1e-14);
  EXPECT_NEAR(f.lse[1], std::log(2.0), 1e-14);
}

TEST(NaiveEvoformer, BackwardMatchesFiniteDifferencesWithBothBiasesAndMasks) {
  const uint64_t seed = kBaseSeed + 200;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const EvoShape s{2, 2, 4, 2, 3};
  NaiveProblem p = random_problem(rng, s, 0.7, true, true);
  // One masked key (b=0, n=1, j=2); every key of (b=1, n=0), which masks all of its rows; and one
  // fully masked query row (b=0, h=1, i=2) through bias2, for every n.
  p.bias1[static_cast<size_t>((0 * s.N + 1) * s.L + 2)] = -kInf;
  for (int64_t j = 0; j < s.L; ++j) p.bias1[static_cast<size_t>((1 * s.N + 0) * s.L + j)] = -kInf;
  for (int64_t j = 0; j < s.L; ++j) {
    p.bias2[static_cast<size_t>(((0 * s.H + 1) * s.L + 2) * s.L + j)] = -kInf;
  }
  const std::vector<double> dout = normal_vector(rng, numel_of(s.qkv()));
  expect_all_gradients_match(p, dout);

  // The masked rows of the oracle itself: output 0, lse -inf, no gradient.
  const NaiveForward f = naive_forward(p);
  const NaiveGrads g = naive_backward(p, dout);
  for (int64_t i = 0; i < s.L; ++i)
    for (int64_t h = 0; h < s.H; ++h) {
      EXPECT_EQ(f.lse[static_cast<size_t>(((1 * s.N + 0) * s.H + h) * s.L + i)], -kInf);
      for (int64_t d = 0; d < s.D; ++d) {
        EXPECT_EQ(f.out[qkv_at(s, 1, 0, i, h, d)], 0.0);
        EXPECT_EQ(g.dq[qkv_at(s, 1, 0, i, h, d)], 0.0);
        EXPECT_EQ(g.dk[qkv_at(s, 1, 0, i, h, d)], 0.0);
        EXPECT_EQ(g.dv[qkv_at(s, 1, 0, i, h, d)], 0.0);
      }
    }
  for (int64_t n = 0; n < s.N; ++n) {
    EXPECT_EQ(f.lse[static_cast<size_t>(((0 * s.N + n) * s.H + 1) * s.L + 2)], -kInf);
  }
}

TEST(NaiveEvoformer, BackwardMatchesFiniteDifferencesWithoutBiases) {
  const uint64_t seed = kBaseSeed + 201;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const EvoShape s{1, 2, 5, 3, 4};
  const NaiveProblem p = random_problem(rng, s, 0.5, false, false);
  expect_all_gradients_match(p, normal_vector(rng, numel_of(s.qkv())));
}

TEST(NaiveEvoformer, BackwardMatchesFiniteDifferencesAtHeadDimOneAndLargeScale) {
  const uint64_t seed = kBaseSeed + 202;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const EvoShape s{1, 1, 6, 2, 1};
  const NaiveProblem p = random_problem(rng, s, 3.0, false, true);
  expect_all_gradients_match(p, normal_vector(rng, numel_of(s.qkv())));
}

TEST(NaiveEvoformer, LengthOneHasNoScoreGradient) {
  // With one key the softmax is exactly 1 whatever the scores are: out = v, and the gradients of
  // q, k and the biases vanish.
  const uint64_t seed = kBaseSeed + 203;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const EvoShape s{2, 1, 1, 2, 3};
  const NaiveProblem p = random_problem(rng, s, 0.9, true, true);
  const std::vector<double> dout = normal_vector(rng, numel_of(s.qkv()));
  expect_all_gradients_match(p, dout);
  const NaiveForward f = naive_forward(p);
  const NaiveGrads g = naive_backward(p, dout);
  for (size_t i = 0; i < p.v.size(); ++i) {
    EXPECT_NEAR(f.out[i], p.v[i], 1e-15);
    EXPECT_NEAR(g.dq[i], 0.0, 1e-15);
    EXPECT_NEAR(g.dk[i], 0.0, 1e-15);
    EXPECT_NEAR(g.dv[i], dout[i], 1e-15);
  }
}

// ---- The library's backward against the oracle. ----

// The backward reads the forward's output in q's dtype, so in f16 / bf16 its gradients carry an
// error of a few roundoffs of the largest gradient that the fp64 problem does not have (through
// D_i = <dO_i, O_i>). 16 roundoffs bounds it with margin even at head dim 1.
double backward_input_allowance(DType q_dtype) {
  return q_dtype == DType::kF32 ? 0.0 : 16.0 * unit_roundoff(q_dtype);
}

struct GradCheck {
  const char* name;
  const HostTensor* ref;
  const HostTensor* tiled;
  const std::vector<double>* ref64;
};

void check_backward_against_oracle(const EvoInputs& in, bool want_dbias1, bool want_dbias2) {
  const EvoConfig& cfg = in.cfg;
  const NaiveGrads g = naive_backward(to_naive(in), in.dout.values());
  const ForwardRun fwd = run_forward(in, EvoformerCpuAlgorithm::kReference);
  ASSERT_TRUE(fwd.status.ok()) << fwd.status.to_string();
  const BackwardRun ref = run_backward(in, fwd.out, fwd.lse, EvoformerCpuAlgorithm::kReference, 0,
                                       want_dbias1, want_dbias2);
  ASSERT_TRUE(ref.status.ok()) << ref.status.to_string();
  const BackwardRun til = run_backward(in, fwd.out, fwd.lse, EvoformerCpuAlgorithm::kTiled, 0,
                                       want_dbias1, want_dbias2);
  ASSERT_TRUE(til.status.ok()) << til.status.to_string();

  std::vector<GradCheck> checks = {{"dq", &ref.dq, &til.dq, &g.dq},
                                   {"dk", &ref.dk, &til.dk, &g.dk},
                                   {"dv", &ref.dv, &til.dv, &g.dv}};
  if (want_dbias1) checks.push_back({"dbias1", &ref.dbias1, &til.dbias1, &g.dbias1});
  if (want_dbias2) checks.push_back({"dbias2", &ref.dbias2, &til.dbias2, &g.dbias2});
  const double allowance = backward_input_allowance(cfg.dtype);
  for (const GradCheck& c : checks) {
    const DType dt = c.ref->dtype();
    const std::vector<double> ref_vals = c.ref->values();
    const std::vector<double> tiled_vals = c.tiled->values();
    EXPECT_TRUE(
        reference_accurate(std::string("reference ") + c.name, ref_vals, *c.ref64, dt, allowance));
    // A bias gradient is judged at q's dtype (see bias_grad_within_tolerance); dq, dk, dv are
    // stored in q's dtype anyway.
    EXPECT_TRUE(bias_grad_within_tolerance(std::string("tiled ") + c.name, tiled_vals, ref_vals,
                                           *c.ref64, cfg.dtype));
    EXPECT_EQ(c.ref->touched_outside_view(), 0) << "reference wrote outside " << c.name;
    EXPECT_EQ(c.tiled->touched_outside_view(), 0) << "tiled wrote outside " << c.name;
  }
}

class EvoformerBackwardCases : public ::testing::TestWithParam<EvoConfig> {};

TEST_P(EvoformerBackwardCases, ReferenceAndTiledMatchOracle) {
  const EvoConfig& cfg = GetParam();
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  // Every bias gradient that can be asked for is asked for.
  const bool want_dbias1 = in.bias1.present() && in.bias1.dtype() != DType::kBool;
  const bool want_dbias2 = in.bias2.present();
  check_backward_against_oracle(in, want_dbias1, want_dbias2);
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerBackwardCases,
                         ::testing::ValuesIn(all_cases(kBaseSeed + 3000, /*backward=*/true)),
                         CaseName());

// Head dims that exercise every column path of the backward's products (cpu/gemm_acc.h): the
// 16-column panels, the 8-column panel, and each width 1 to 7 of the last columns, at L 45 (the
// score tile's last 13 keys: the 8-column panel and a 5-wide tail) with masked keys.
std::vector<EvoConfig> head_dim_product_cases() {
  std::vector<EvoConfig> cases;
  uint64_t seed = kBaseSeed + 3900;
  for (int64_t D : {2, 3, 4, 13, 22, 40, 58, 100, 127}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      EvoConfig c;
      c.shape = {1, 2, 45, 2, D};
      c.dtype = dt;
      c.bias1 = dt == DType::kF32 ? Bias1Kind::kF32 : Bias1Kind::kBool;
      c.bias2 = Bias2Kind::kSameAsQ;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  return cases;
}

class EvoformerBackwardHeadDims : public ::testing::TestWithParam<EvoConfig> {};

TEST_P(EvoformerBackwardHeadDims, ReferenceAndTiledMatchOracle) {
  const EvoConfig& cfg = GetParam();
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const bool want_dbias1 = in.bias1.present() && in.bias1.dtype() != DType::kBool;
  check_backward_against_oracle(in, want_dbias1, in.bias2.present());
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerBackwardHeadDims,
                         ::testing::ValuesIn(head_dim_product_cases()), CaseName());

TEST(EvoformerBackward, BiasGradientsAreOptional) {
  // dq, dk and dv do not depend on which bias gradients are requested; an absent dbias is not
  // written.
  for (int variant = 0; variant < 3; ++variant) {
    EvoConfig cfg;
    cfg.shape = EvoShape{2, 2, 21, 2, 8};
    cfg.dtype = DType::kF32;
    cfg.bias1 = Bias1Kind::kF32;
    cfg.bias2 = Bias2Kind::kF32;
    cfg.seed = kBaseSeed + 210 + static_cast<uint64_t>(variant);
    SCOPED_TRACE(cfg.str() + " variant " + std::to_string(variant));
    const EvoInputs in = make_inputs(cfg);
    check_backward_against_oracle(in, /*want_dbias1=*/variant == 1, /*want_dbias2=*/variant == 2);
  }
}

// ---- Fully masked rows, forward and backward. ----

struct MaskedRowsCase {
  DType dtype;
  Bias1Kind bias1;  // kBool, or a float kind holding -inf for masked keys
  uint64_t seed;
};

void PrintTo(const MaskedRowsCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " bias1 " << bias1_name(c.bias1) << " " << seed_note(c.seed);
}

std::string masked_case_name(const ::testing::TestParamInfo<MaskedRowsCase>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_bias1" + bias1_name(info.param.bias1);
}

class EvoformerMaskedRows : public ::testing::TestWithParam<MaskedRowsCase> {};

// Masks (b=1, n=0) completely through bias1 (all of its query rows have no key) and row
// (b=0, h=1, i=3) through bias2 (for every n). Those rows must give output exactly 0 and lse
// -inf, and contribute nothing to any gradient; no output may hold a NaN or an infinity.
TEST_P(EvoformerMaskedRows, OutputZeroLseMinusInfAndZeroGradients) {
  const MaskedRowsCase mc = GetParam();
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 2, 19, 2, 8};
  cfg.dtype = mc.dtype;
  cfg.bias1 = mc.bias1;
  cfg.bias2 = Bias2Kind::kF32;
  cfg.seed = mc.seed;
  SCOPED_TRACE(cfg.str());
  const EvoShape& s = cfg.shape;
  EvoInputs in = make_inputs(cfg);
  std::mt19937_64 rng(cfg.seed + 1);
  std::bernoulli_distribution masked_key(0.2);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t j = 0; j < s.L; ++j) {
        const int64_t idx = (b * s.N + n) * s.L + j;
        const bool mask = (b == 1 && n == 0) || masked_key(rng);
        if (in.bias1.dtype() == DType::kBool) {
          in.bias1.set(idx, mask ? 0.0 : 1.0);
        } else if (mask) {
          in.bias1.set(idx, -kInf);
        }
      }
  for (int64_t j = 0; j < s.L; ++j) in.bias2.set(((0 * s.H + 1) * s.L + 3) * s.L + j, -kInf);

  const NaiveProblem np = to_naive(in);
  const NaiveForward f64 = naive_forward(np);
  const NaiveGrads g64 = naive_backward(np, in.dout.values());
  const bool want_dbias1 = in.bias1.dtype() != DType::kBool;

  auto masked_row = [&](int64_t b, int64_t n, int64_t h, int64_t i) {
    return (b == 1 && n == 0) || (b == 0 && h == 1 && i == 3);
  };

  const ForwardRun ref = run_forward(in, EvoformerCpuAlgorithm::kReference);
  ASSERT_TRUE(ref.status.ok()) << ref.status.to_string();
  for (EvoformerCpuAlgorithm algo :
       {EvoformerCpuAlgorithm::kReference, EvoformerCpuAlgorithm::kTiled}) {
    const bool tiled = algo == EvoformerCpuAlgorithm::kTiled;
    SCOPED_TRACE(tiled ? "tiled" : "reference");
    const ForwardRun fwd = run_forward(in, algo);
    ASSERT_TRUE(fwd.status.ok()) << fwd.status.to_string();
    const std::vector<double> out = fwd.out.values();
    const std::vector<double> lse = fwd.lse.values();
    EXPECT_EQ(count_nan(out), 0);
    EXPECT_EQ(count_nan(lse), 0);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t i = 0; i < s.L; ++i) {
            const double l = lse[static_cast<size_t>(((b * s.N + n) * s.H + h) * s.L + i)];
            if (masked_row(b, n, h, i)) {
              EXPECT_EQ(l, -kInf) << "lse of masked row b" << b << " n" << n << " h" << h << " i"
                                  << i;
            } else {
              EXPECT_TRUE(std::isfinite(l)) << "lse b" << b << " n" << n << " h" << h << " i" << i;
            }
            for (int64_t d = 0; d < s.D; ++d) {
              const double o = out[qkv_at(s, b, n, i, h, d)];
              if (masked_row(b, n, h, i)) {
                EXPECT_EQ(o, 0.0) << "out of masked row b" << b << " n" << n << " h" << h << " i"
                                  << i;
              }
            }
          }
    EXPECT_TRUE(within_tolerance("out", out, ref.out.values(), f64.out, cfg.dtype));
    EXPECT_TRUE(within_tolerance("lse", lse, ref.lse.values(), f64.lse, DType::kF32));

    // The backward of the reference forward (shared, so both algorithms see the same out/lse).
    const BackwardRun ref_bwd =
        run_backward(in, ref.out, ref.lse, EvoformerCpuAlgorithm::kReference, 0, want_dbias1, true);
    ASSERT_TRUE(ref_bwd.status.ok()) << ref_bwd.status.to_string();
    const BackwardRun bwd = run_backward(in, ref.out, ref.lse, algo, 0, want_dbias1, true);
    ASSERT_TRUE(bwd.status.ok()) << bwd.status.to_string();
    const std::vector<double> dq = bwd.dq.values(), dk = bwd.dk.values(), dv = bwd.dv.values();
    const std::vector<double> db2 = bwd.dbias2.values();
    for (const std::vector<double>* grad : {&dq, &dk, &dv, &db2}) {
      for (double x : *grad) ASSERT_TRUE(std::isfinite(x)) << "non-finite gradient";
    }
    for (int64_t i = 0; i < s.L; ++i)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t d = 0; d < s.D; ++d) {
          // (b=1, n=0) has no unmasked score at all: no gradient reaches its q, k or v.
          EXPECT_EQ(dq[qkv_at(s, 1, 0, i, h, d)], 0.0);
          EXPECT_EQ(dk[qkv_at(s, 1, 0, i, h, d)], 0.0);
          EXPECT_EQ(dv[qkv_at(s, 1, 0, i, h, d)], 0.0);
          for (int64_t n = 0; n < s.N; ++n) EXPECT_EQ(dq[qkv_at(s, 0, n, 3, 1, d)], 0.0);
        }
    for (int64_t j = 0; j < s.L; ++j) {
      EXPECT_EQ(db2[static_cast<size_t>(((0 * s.H + 1) * s.L + 3) * s.L + j)], 0.0);
    }
    EXPECT_TRUE(within_tolerance("dq", dq, ref_bwd.dq.values(), g64.dq, cfg.dtype));
    EXPECT_TRUE(within_tolerance("dk", dk, ref_bwd.dk.values(), g64.dk, cfg.dtype));
    EXPECT_TRUE(within_tolerance("dv", dv, ref_bwd.dv.values(), g64.dv, cfg.dtype));
    EXPECT_TRUE(
        bias_grad_within_tolerance("dbias2", db2, ref_bwd.dbias2.values(), g64.dbias2, cfg.dtype));
    if (want_dbias1) {
      const std::vector<double> db1 = bwd.dbias1.values();
      for (double x : db1) ASSERT_TRUE(std::isfinite(x)) << "non-finite dbias1";
      for (int64_t j = 0; j < s.L; ++j)
        EXPECT_EQ(db1[static_cast<size_t>((1 * s.N + 0) * s.L + j)], 0.0);
      EXPECT_TRUE(bias_grad_within_tolerance("dbias1", db1, ref_bwd.dbias1.values(), g64.dbias1,
                                             cfg.dtype));
    }
  }
}

std::vector<MaskedRowsCase> masked_rows_cases() {
  std::vector<MaskedRowsCase> cases;
  uint64_t seed = kBaseSeed + 220;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Bias1Kind b1 : {Bias1Kind::kBool, Bias1Kind::kSameAsQ, Bias1Kind::kF32}) {
      if (dt == DType::kF32 && b1 == Bias1Kind::kSameAsQ) continue;
      cases.push_back({dt, b1, seed++});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerMaskedRows, ::testing::ValuesIn(masked_rows_cases()),
                         masked_case_name);

}  // namespace
}  // namespace sciattn

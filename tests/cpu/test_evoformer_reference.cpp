// Tests of the library's fp32 Evoformer reference (EvoformerCpuAlgorithm::kReference), the oracle
// of every other path, against the test's independent fp64 Evoformer: every dtype, bias
// combination, length, head dim, layout and scale, plus the masking rules. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "evoformer_test_util.h"

namespace sciattn {
namespace {

using namespace sciattn::test;

constexpr EvoformerCpuAlgorithm kReference = EvoformerCpuAlgorithm::kReference;

// The reference computes in fp32 and rounds once into the output dtype, so it must match the fp64
// result up to that rounding plus fp32 noise, elementwise (see reference_accurate).
void check_reference_forward(const EvoInputs& in, const ForwardRun& r) {
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const NaiveForward f64 = naive_forward(to_naive(in));
  EXPECT_TRUE(reference_accurate("out", r.out.values(), f64.out, in.cfg.dtype));
  EXPECT_TRUE(reference_accurate("lse", r.lse.values(), f64.lse, DType::kF32));
  EXPECT_EQ(r.out.touched_outside_view(), 0) << "out written outside its view";
  EXPECT_EQ(r.lse.touched_outside_view(), 0) << "lse written outside its view";
}

class EvoformerReferenceCases : public ::testing::TestWithParam<EvoConfig> {};

TEST_P(EvoformerReferenceCases, ForwardMatchesFp64) {
  const EvoConfig& cfg = GetParam();
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  check_reference_forward(in, run_forward(in, kReference));
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerReferenceCases,
                         ::testing::ValuesIn(all_cases(kBaseSeed + 1000, /*backward=*/false)),
                         CaseName());

TEST(EvoformerReference, ForwardWithoutLseWritesTheSameOutput) {
  // lse is optional in the forward; leaving it out must not change the output.
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 2, 33, 2, 16};
  cfg.dtype = DType::kBF16;
  cfg.bias1 = Bias1Kind::kBool;
  cfg.bias2 = Bias2Kind::kF32;
  cfg.seed = kBaseSeed + 100;
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const ForwardRun with = run_forward(in, kReference, 0, /*with_lse=*/true);
  const ForwardRun without = run_forward(in, kReference, 0, /*with_lse=*/false);
  ASSERT_TRUE(with.status.ok()) << with.status.to_string();
  ASSERT_TRUE(without.status.ok()) << without.status.to_string();
  const NaiveForward f64 = naive_forward(to_naive(in));
  EXPECT_TRUE(reference_accurate("out without lse", without.out.values(), f64.out, cfg.dtype));
  EXPECT_TRUE(within_tolerance("out without lse", without.out.values(), with.out.values(), f64.out,
                               cfg.dtype));
}

TEST(EvoformerReference, DefaultScaleIsOneOverSqrtHeadDim) {
  // Leaving the scale out and passing 1/sqrt(D) explicitly describe the same problem.
  EvoConfig cfg;
  cfg.shape = EvoShape{1, 2, 17, 2, 24};
  cfg.bias2 = Bias2Kind::kF32;
  cfg.seed = kBaseSeed + 101;
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  EvoInputs explicit_in = in;
  explicit_in.cfg.scale = static_cast<float>(1.0 / std::sqrt(24.0));
  const ForwardRun a = run_forward(in, kReference);
  const ForwardRun b = run_forward(explicit_in, kReference);
  ASSERT_TRUE(a.status.ok()) << a.status.to_string();
  ASSERT_TRUE(b.status.ok()) << b.status.to_string();
  const NaiveForward f64 = naive_forward(to_naive(in));
  EXPECT_TRUE(reference_accurate("out, default scale", a.out.values(), f64.out, DType::kF32));
  EXPECT_TRUE(reference_accurate("out, explicit scale", b.out.values(), f64.out, DType::kF32));
}

TEST(EvoformerReference, AliasedInputsAreAccepted) {
  // Self-attention may pass one tensor as q, k and v; inputs may overlap each other (only
  // outputs must not overlap anything).
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 2, 13, 2, 8};
  cfg.bias1 = Bias1Kind::kF32;
  cfg.seed = kBaseSeed + 102;
  SCOPED_TRACE(cfg.str());
  EvoInputs in = make_inputs(cfg);
  in.k = in.q;
  in.v = in.q;
  // The copies above own their storage; make the views share one buffer instead.
  EvoformerForwardParams p;
  p.q = in.q.view();
  p.k = in.q.view();
  p.v = in.q.view();
  p.bias1 = in.bias1.view();
  HostTensor out = HostTensor::packed(DType::kF32, cfg.shape.qkv());
  HostTensor lse = HostTensor::packed(DType::kF32, cfg.shape.lse());
  p.out = out.view();
  p.lse = lse.view();
  p.options.cpu_algorithm = kReference;
  const Status s = run_with_workspace(p, nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const NaiveForward f64 = naive_forward(to_naive(in));
  EXPECT_TRUE(reference_accurate("out", out.values(), f64.out, DType::kF32));
  EXPECT_TRUE(reference_accurate("lse", lse.values(), f64.lse, DType::kF32));
}

TEST(EvoformerReference, BoolMaskEqualsAdditiveMinusInfMask) {
  // A bool bias1 (true = attend) means adding 0 or -inf. The same mask given as a float bias1 of
  // 0 / -inf, in f32 and in q's dtype, must give the same result.
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    EvoConfig cfg;
    cfg.shape = EvoShape{2, 3, 29, 2, 16};
    cfg.dtype = dt;
    cfg.bias1 = Bias1Kind::kBool;
    cfg.bias2 = Bias2Kind::kSameAsQ;
    cfg.mask_false_fraction = 0.4;
    cfg.seed = kBaseSeed + 103 + static_cast<uint64_t>(dt);
    SCOPED_TRACE(cfg.str());
    const EvoInputs in = make_inputs(cfg);
    const ForwardRun with_bool = run_forward(in, kReference);
    check_reference_forward(in, with_bool);
    for (DType mask_dt : {DType::kF32, dt}) {
      SCOPED_TRACE(std::string("additive mask in ") + dtype_name(mask_dt));
      EvoInputs add = in;
      add.bias1 = additive_mask(in.bias1, mask_dt);
      const ForwardRun with_add = run_forward(add, kReference);
      check_reference_forward(add, with_add);
      const NaiveForward f64 = naive_forward(to_naive(in));
      EXPECT_TRUE(
          within_tolerance("out", with_add.out.values(), with_bool.out.values(), f64.out, dt));
      EXPECT_TRUE(within_tolerance("lse", with_add.lse.values(), with_bool.lse.values(), f64.lse,
                                   DType::kF32));
    }
  }
}

TEST(EvoformerReference, OpenFoldMaskBiasInF16) {
  // OpenFold builds the mask bias as 1e9 * (mask - 1), which is -inf in f16: masked keys must
  // vanish from the softmax, with no NaN, exactly like the bool mask. One (b, n) is fully masked.
  EvoConfig cfg;
  cfg.shape = EvoShape{1, 3, 40, 4, 32};
  cfg.dtype = DType::kF16;
  cfg.bias1 = Bias1Kind::kBool;
  cfg.bias2 = Bias2Kind::kSameAsQ;
  cfg.mask_false_fraction = 0.3;
  cfg.seed = kBaseSeed + 110;
  SCOPED_TRACE(cfg.str());
  EvoInputs in = make_inputs(cfg);
  for (int64_t j = 0; j < cfg.shape.L; ++j) in.bias1.set(2 * cfg.shape.L + j, 0.0);  // n = 2
  EvoInputs openfold = in;
  openfold.bias1 = additive_mask(in.bias1, DType::kF16, -1e9);
  ASSERT_EQ(openfold.bias1.get(2 * cfg.shape.L), -kInf);
  const ForwardRun r = run_forward(openfold, kReference);
  // The oracle of the OpenFold problem reads -inf from the f16 bias: the same as the bool mask.
  check_reference_forward(openfold, r);
  EXPECT_EQ(count_nan(r.out.values()), 0);
  EXPECT_EQ(count_nan(r.lse.values()), 0);
}

TEST(EvoformerReference, MisalignedWorkspaceIsAccepted) {
  // workspace_size bytes at any alignment are enough (the library aligns inside if it needs to).
  EvoConfig cfg;
  cfg.shape = EvoShape{1, 2, 37, 2, 8};
  cfg.bias1 = Bias1Kind::kF32;
  cfg.bias2 = Bias2Kind::kF32;
  cfg.seed = kBaseSeed + 111;
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  check_reference_forward(in, run_forward(in, kReference, 0, true, /*misalign_workspace=*/true));
  const ForwardRun fwd = run_forward(in, kReference);
  const BackwardRun aligned = run_backward(in, fwd.out, fwd.lse, kReference, 0, true, true);
  const BackwardRun misaligned =
      run_backward(in, fwd.out, fwd.lse, kReference, 0, true, true, true);
  ASSERT_TRUE(aligned.status.ok()) << aligned.status.to_string();
  ASSERT_TRUE(misaligned.status.ok()) << misaligned.status.to_string();
  EXPECT_TRUE(aligned.dq.same_bytes(misaligned.dq));
  EXPECT_TRUE(aligned.dk.same_bytes(misaligned.dk));
  EXPECT_TRUE(aligned.dv.same_bytes(misaligned.dv));
  EXPECT_TRUE(aligned.dbias1.same_bytes(misaligned.dbias1));
  EXPECT_TRUE(aligned.dbias2.same_bytes(misaligned.dbias2));
}

TEST(EvoformerReference, BroadcastBias1ThroughZeroStride) {
  // A mask shared by every n can be passed as a [B, N, 1, 1, L] view with stride 0 over N (any
  // strides are accepted for inputs).
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 3, 21, 2, 8};
  cfg.bias1 = Bias1Kind::kF32;
  cfg.seed = kBaseSeed + 112;
  SCOPED_TRACE(cfg.str());
  EvoInputs in = make_inputs(cfg);
  const EvoShape& s = cfg.shape;
  HostTensor shared =
      HostTensor::with_layout(DType::kF32, s.bias1(), {s.L, 0, s.L, s.L, 1}, 0, s.B * s.L);
  std::mt19937_64 rng(cfg.seed + 1);
  std::normal_distribution<double> dist(0.0, 1.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t j = 0; j < s.L; ++j) shared.set(b * s.N * s.L + j, dist(rng));  // n = 0 writes
  in.bias1 = shared;
  const std::vector<double> vals = in.bias1.values();
  ASSERT_EQ(vals[static_cast<size_t>(s.L + 3)], vals[3]);  // n = 1 reads what n = 0 wrote
  check_reference_forward(in, run_forward(in, kReference));
}

}  // namespace
}  // namespace sciattn

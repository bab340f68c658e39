// NaN and Inf in Evoformer attention on the CPU, both algorithms, every dtype, forward and
// backward (nan_semantics_util.h): a NaN in q reaches its row's output, lse and gradients and
// nothing else; NaN in k, v and bias2 propagate too; a fully masked row still gives 0; and a
// finite result stays finite when V holds values near the top of fp32. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "evoformer_nan_checks.h"

namespace sciattn {
namespace {

using namespace sciattn::test;
constexpr int64_t kB = EvoNanSpot::kB, kN = EvoNanSpot::kN, kI = EvoNanSpot::kI,
                  kH = EvoNanSpot::kH;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct NanCase {
  EvoformerCpuAlgorithm algo;
  DType dtype;
};

std::string name_of(const NanCase& c) {
  return std::string(c.algo == EvoformerCpuAlgorithm::kTiled ? "tiled" : "reference") + "_" +
         dtype_name(c.dtype);
}

class EvoformerNan : public ::testing::TestWithParam<NanCase> {};

TEST_P(EvoformerNan, NanInQReachesItsRowAndNothingElse) {
  const NanCase c = GetParam();
  EvoInputs in = make_inputs(evoformer_nan_config(c.dtype));
  put_nan_in_q(in);
  const ForwardRun f = run_forward(in, c.algo);
  ASSERT_TRUE(f.status.ok()) << f.status.to_string();
  expect_forward_nan_in_row(in.cfg.shape, f.out.values(), f.lse.values());
  const BackwardRun g = run_backward(in, f.out, f.lse, c.algo, 0, true, true);
  ASSERT_TRUE(g.status.ok()) << g.status.to_string();
  expect_backward_nan_from_row(in.cfg.shape, g.dq.values(), g.dk.values(), g.dv.values(),
                               g.dbias1.values(), g.dbias2.values());
}

// A fully masked (b, n) (bias1 -inf on every key) still gives 0 and lse -inf with zero
// gradients, while a NaN in another (b, n) propagates: the mask rule and the NaN rule are told
// apart.
TEST_P(EvoformerNan, FullyMaskedRowsStayZeroBesideANan) {
  const NanCase c = GetParam();
  EvoInputs in = make_inputs(evoformer_nan_config(c.dtype));
  const EvoShape& s = in.cfg.shape;
  for (int64_t j = 0; j < s.L; ++j) in.bias1.set(j, -std::numeric_limits<double>::infinity());
  put_nan_in_q(in);
  const ForwardRun f = run_forward(in, c.algo);
  ASSERT_TRUE(f.status.ok()) << f.status.to_string();
  const std::vector<double> out = f.out.values(), lse = f.lse.values();
  for (int64_t i = 0; i < s.L * s.H * s.D; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], 0.0) << i;
  for (int64_t i = 0; i < s.H * s.L; ++i) {
    ASSERT_EQ(lse[static_cast<size_t>(i)], -std::numeric_limits<double>::infinity()) << i;
  }
  EXPECT_TRUE(std::isnan(out[qkv_at(s, kB, kN, kI, kH, 0)]));
  const BackwardRun g = run_backward(in, f.out, f.lse, c.algo, 0, true, true);
  ASSERT_TRUE(g.status.ok()) << g.status.to_string();
  const std::vector<double> dq = g.dq.values(), dk = g.dk.values(), dv = g.dv.values();
  for (int64_t i = 0; i < s.L * s.H * s.D; ++i) {
    ASSERT_EQ(dq[static_cast<size_t>(i)], 0.0) << i;
    ASSERT_EQ(dk[static_cast<size_t>(i)], 0.0) << i;
    ASSERT_EQ(dv[static_cast<size_t>(i)], 0.0) << i;
  }
  const std::vector<double> db1 = g.dbias1.values();
  for (int64_t j = 0; j < s.L; ++j) ASSERT_EQ(db1[static_cast<size_t>(j)], 0.0) << j;
}

// A NaN in k, v or bias2 reaches the output rows that attend to it.
TEST_P(EvoformerNan, NanInKVAndBias2Propagate) {
  const NanCase c = GetParam();
  for (const char* where : {"k", "v", "bias2"}) {
    SCOPED_TRACE(where);
    EvoInputs in = make_inputs(evoformer_nan_config(c.dtype));
    const EvoShape& s = in.cfg.shape;
    const std::string w = where;
    if (w == "k") in.k.set(static_cast<int64_t>(qkv_at(s, kB, kN, 5, kH, 0)), kNaN);
    if (w == "v") in.v.set(static_cast<int64_t>(qkv_at(s, kB, kN, 5, kH, 0)), kNaN);
    // bias2[b, 0, h, i, j] with i = kI, j = 5: only row kI of every n.
    if (w == "bias2") in.bias2.set(((kB * s.H + kH) * s.L + kI) * s.L + 5, kNaN);
    const ForwardRun f = run_forward(in, c.algo);
    ASSERT_TRUE(f.status.ok()) << f.status.to_string();
    EXPECT_TRUE(nan_exactly_where("out", f.out.values(), [&](int64_t i) {
      const auto x = unravel(i, s.qkv());
      if (x[0] != kB || x[3] != kH) return false;
      if (w == "k") return x[1] == kN;               // every row of the slice, every d
      if (w == "v") return x[1] == kN && x[4] == 0;  // every row, only d = 0
      return x[2] == kI;                             // bias2: row kI of every n
    }));
  }
}

// With every score 0 the output is the mean of V: V filled with 1e37 must give 1e37 (fp32; the
// sum of 150 such rows is inf, so accumulating before normalising overflows).
TEST(EvoformerFinite, LargeValuesStayFinite) {
  for (const EvoformerCpuAlgorithm algo :
       {EvoformerCpuAlgorithm::kTiled, EvoformerCpuAlgorithm::kReference}) {
    SCOPED_TRACE(algo == EvoformerCpuAlgorithm::kTiled ? "tiled" : "reference");
    EvoConfig cfg;
    cfg.shape = {1, 2, 300, 2, 8};
    EvoInputs in = make_inputs(cfg);
    for (int64_t i = 0; i < in.q.numel(); ++i) {
      in.q.set(i, 0.0);
      in.v.set(i, 1e37);
    }
    const ForwardRun f = run_forward(in, algo);
    ASSERT_TRUE(f.status.ok()) << f.status.to_string();
    for (double o : f.out.values()) ASSERT_NEAR(o, 1e37, 1e37 * 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Evoformer, EvoformerNan,
    ::testing::Values(NanCase{EvoformerCpuAlgorithm::kTiled, DType::kF32},
                      NanCase{EvoformerCpuAlgorithm::kTiled, DType::kF16},
                      NanCase{EvoformerCpuAlgorithm::kTiled, DType::kBF16},
                      NanCase{EvoformerCpuAlgorithm::kReference, DType::kF32},
                      NanCase{EvoformerCpuAlgorithm::kReference, DType::kBF16}),
    [](const ::testing::TestParamInfo<NanCase>& p) { return name_of(p.param); });

}  // namespace
}  // namespace sciattn

// Tests of the tiled, multithreaded CPU Evoformer (EvoformerCpuAlgorithm::kTiled): the tolerance
// rule against the fp64 oracle with the library's reference as lowp_ref, bitwise determinism
// across thread counts and runs, and bitwise equality of equivalent masks. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/evoformer_cpu_tiling.h"  // internal: the thread count the calls choose
#include "evoformer_test_util.h"

namespace sciattn {
namespace {

using namespace sciattn::test;

constexpr EvoformerCpuAlgorithm kTiled = EvoformerCpuAlgorithm::kTiled;
constexpr EvoformerCpuAlgorithm kReference = EvoformerCpuAlgorithm::kReference;

class EvoformerTiledCases : public ::testing::TestWithParam<EvoConfig> {};

TEST_P(EvoformerTiledCases, ForwardWithinToleranceOfFp64) {
  const EvoConfig& cfg = GetParam();
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const NaiveForward f64 = naive_forward(to_naive(in));
  const ForwardRun ref = run_forward(in, kReference);
  ASSERT_TRUE(ref.status.ok()) << ref.status.to_string();
  const ForwardRun til = run_forward(in, kTiled);
  ASSERT_TRUE(til.status.ok()) << til.status.to_string();
  EXPECT_TRUE(within_tolerance("out", til.out.values(), ref.out.values(), f64.out, cfg.dtype));
  EXPECT_TRUE(within_tolerance("lse", til.lse.values(), ref.lse.values(), f64.lse, DType::kF32));
  EXPECT_EQ(til.out.touched_outside_view(), 0) << "out written outside its view";
  EXPECT_EQ(til.lse.touched_outside_view(), 0) << "lse written outside its view";
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerTiledCases,
                         ::testing::ValuesIn(all_cases(kBaseSeed + 2000, /*backward=*/false)),
                         CaseName());

// ---- Determinism: the same bits for any thread count, and run to run. ----

struct AllOutputs {
  ForwardRun fwd;
  BackwardRun bwd;
};

// Forward and backward of the tiled path with every bias gradient requested. The backward reads
// the reference forward's out / lse so that only the thread count differs between calls.
AllOutputs run_tiled(const EvoInputs& in, const ForwardRun& ref_fwd, int num_threads) {
  AllOutputs o;
  o.fwd = run_forward(in, kTiled, num_threads);
  o.bwd = run_backward(in, ref_fwd.out, ref_fwd.lse, kTiled, num_threads,
                       in.bias1.present() && in.bias1.dtype() != DType::kBool, in.bias2.present());
  return o;
}

void expect_same_bits(const AllOutputs& a, const AllOutputs& b, const std::string& what) {
  EXPECT_TRUE(a.fwd.out.same_bytes(b.fwd.out)) << what << ": out differs";
  EXPECT_TRUE(a.fwd.lse.same_bytes(b.fwd.lse)) << what << ": lse differs";
  EXPECT_TRUE(a.bwd.dq.same_bytes(b.bwd.dq)) << what << ": dq differs";
  EXPECT_TRUE(a.bwd.dk.same_bytes(b.bwd.dk)) << what << ": dk differs";
  EXPECT_TRUE(a.bwd.dv.same_bytes(b.bwd.dv)) << what << ": dv differs";
  EXPECT_TRUE(a.bwd.dbias1.same_bytes(b.bwd.dbias1)) << what << ": dbias1 differs";
  EXPECT_TRUE(a.bwd.dbias2.same_bytes(b.bwd.dbias2)) << what << ": dbias2 differs";
}

class EvoformerTiledDeterminism : public ::testing::TestWithParam<EvoConfig> {};

TEST_P(EvoformerTiledDeterminism, SameBitsForAnyThreadCountAndRunToRun) {
  const EvoConfig& cfg = GetParam();
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const ForwardRun ref_fwd = run_forward(in, kReference);
  ASSERT_TRUE(ref_fwd.status.ok()) << ref_fwd.status.to_string();
  const AllOutputs one = run_tiled(in, ref_fwd, 1);
  ASSERT_TRUE(one.fwd.status.ok()) << one.fwd.status.to_string();
  ASSERT_TRUE(one.bwd.status.ok()) << one.bwd.status.to_string();
  // 0 means every hardware thread; 7 is more threads than the test machines have cores and does
  // not divide the work evenly.
  for (int threads : {2, 3, 7, 0}) {
    const AllOutputs other = run_tiled(in, ref_fwd, threads);
    ASSERT_TRUE(other.fwd.status.ok()) << other.fwd.status.to_string();
    ASSERT_TRUE(other.bwd.status.ok()) << other.bwd.status.to_string();
    expect_same_bits(one, other, "num_threads " + std::to_string(threads) + " vs 1");
  }
  const AllOutputs again = run_tiled(in, ref_fwd, 0);
  const AllOutputs again2 = run_tiled(in, ref_fwd, 0);
  expect_same_bits(again, again2, "second run");
  // The results are also right (the backward against the fp64 oracle is in the gradients suite).
  const NaiveForward f64 = naive_forward(to_naive(in));
  EXPECT_TRUE(
      within_tolerance("out", one.fwd.out.values(), ref_fwd.out.values(), f64.out, cfg.dtype));
}

std::vector<EvoConfig> determinism_cases() {
  std::vector<EvoConfig> cases;
  auto add = [&](EvoShape s, DType dt, Bias1Kind b1, Bias2Kind b2, Layout in = Layout::kPacked) {
    EvoConfig c;
    c.shape = s;
    c.dtype = dt;
    c.bias1 = b1;
    c.bias2 = b2;
    c.in_layout = in;
    c.seed = kBaseSeed + 2500 + cases.size();
    cases.push_back(c);
  };
  // Several query and key tiles, and more (b, n, h) than threads: any split of the work over
  // threads, including of the dbias sums over heads, rows and n, must not change a bit.
  add({2, 3, 70, 2, 24}, DType::kF32, Bias1Kind::kF32, Bias2Kind::kF32);
  add({2, 3, 70, 2, 24}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ);
  add({1, 5, 33, 3, 16}, DType::kF16, Bias1Kind::kF32, Bias2Kind::kSameAsQ, Layout::kPadded);
  add({1, 1, 150, 2, 32}, DType::kF32, Bias1Kind::kBool, Bias2Kind::kF32);
  add({3, 1, 9, 1, 8}, DType::kBF16, Bias1Kind::kNone, Bias2Kind::kF32);
  // The cases above have too little work for a second thread (common/cpu_threads.h), so they run
  // on one whatever num_threads says. These have enough for two threads in the forward and
  // three in the backward, so the split of the work over threads is exercised as well.
  add({1, 8, 180, 4, 32}, DType::kF32, Bias1Kind::kF32, Bias2Kind::kF32);
  add({1, 8, 180, 4, 32}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerTiledDeterminism,
                         ::testing::ValuesIn(determinism_cases()), CaseName());

// The determinism cases include calls that really run on several threads.
TEST(EvoformerTiled, DeterminismCasesIncludeThreadedCalls) {
  int most_forward = 1, most_backward = 1;
  for (const EvoConfig& c : determinism_cases()) {
    const detail::EvoformerShape s{c.shape.B, c.shape.N, c.shape.L, c.shape.H, c.shape.D};
    most_forward = std::max(most_forward, detail::cpu_forward_threads(7, s));
    most_backward = std::max(most_backward, detail::cpu_backward_threads(7, s, true));
  }
  EXPECT_GE(most_forward, 2);
  EXPECT_GE(most_backward, 3);
}

// ---- Equivalent masks give identical bits. ----

class EvoformerTiledMasks : public ::testing::TestWithParam<DType> {};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& param_info) {
  return dtype_name(param_info.param);
}

// A bool bias1 means adding 0 (true) or -inf (false). The same mask as a float bias1 (f32 and q's
// dtype; for f16 also OpenFold's 1e9 * (mask - 1), which rounds to -inf) must give the same bits
// in the tiled path, forward and backward, including a fully masked (b, n).
TEST_P(EvoformerTiledMasks, BoolMaskEqualsAdditiveMaskBitwise) {
  const DType dt = GetParam();
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 3, 45, 2, 16};
  cfg.dtype = dt;
  cfg.bias1 = Bias1Kind::kBool;
  cfg.bias2 = Bias2Kind::kSameAsQ;
  cfg.mask_false_fraction = 0.35;
  cfg.seed = kBaseSeed + 2600 + static_cast<uint64_t>(dt);
  SCOPED_TRACE(cfg.str());
  EvoInputs in = make_inputs(cfg);
  for (int64_t j = 0; j < cfg.shape.L; ++j)
    in.bias1.set((1 * cfg.shape.N + 2) * cfg.shape.L + j, 0.0);
  const ForwardRun ref_fwd = run_forward(in, kReference);
  ASSERT_TRUE(ref_fwd.status.ok()) << ref_fwd.status.to_string();
  const AllOutputs with_bool = run_tiled(in, ref_fwd, 0);
  ASSERT_TRUE(with_bool.fwd.status.ok()) << with_bool.fwd.status.to_string();
  ASSERT_TRUE(with_bool.bwd.status.ok()) << with_bool.bwd.status.to_string();

  std::vector<std::pair<std::string, HostTensor>> variants;
  variants.emplace_back("f32 -inf mask", additive_mask(in.bias1, DType::kF32));
  if (dt != DType::kF32) variants.emplace_back("q dtype -inf mask", additive_mask(in.bias1, dt));
  if (dt == DType::kF16) {
    variants.emplace_back("f16 1e9 * (mask - 1)", additive_mask(in.bias1, DType::kF16, -1e9));
  }
  const NaiveForward f64 = naive_forward(to_naive(in));
  for (auto& [name, mask] : variants) {
    SCOPED_TRACE(name);
    EvoInputs add = in;
    add.bias1 = mask;
    // The float mask allows dbias1; it is requested but not compared (the bool run has none).
    AllOutputs with_add = run_tiled(add, ref_fwd, 0);
    ASSERT_TRUE(with_add.fwd.status.ok()) << with_add.fwd.status.to_string();
    ASSERT_TRUE(with_add.bwd.status.ok()) << with_add.bwd.status.to_string();
    with_add.bwd.dbias1 = HostTensor();
    expect_same_bits(with_bool, with_add, name);
    EXPECT_EQ(count_nan(with_add.fwd.out.values()), 0);
    EXPECT_TRUE(
        within_tolerance("out", with_add.fwd.out.values(), ref_fwd.out.values(), f64.out, dt));
  }
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerTiledMasks,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         dtype_param_name);

// ---- Odds and ends of the tiled path. ----

TEST(EvoformerTiled, ForwardWithoutLseWritesTheSameOutput) {
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 2, 67, 2, 16};
  cfg.dtype = DType::kBF16;
  cfg.bias1 = Bias1Kind::kBool;
  cfg.bias2 = Bias2Kind::kF32;
  cfg.seed = kBaseSeed + 2700;
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const ForwardRun ref = run_forward(in, kReference);
  const ForwardRun without = run_forward(in, kTiled, 0, /*with_lse=*/false);
  ASSERT_TRUE(ref.status.ok()) << ref.status.to_string();
  ASSERT_TRUE(without.status.ok()) << without.status.to_string();
  const NaiveForward f64 = naive_forward(to_naive(in));
  EXPECT_TRUE(within_tolerance("out without lse", without.out.values(), ref.out.values(), f64.out,
                               cfg.dtype));
  EXPECT_EQ(without.out.touched_outside_view(), 0);
}

TEST(EvoformerTiled, MisalignedWorkspaceGivesTheSameBits) {
  // workspace_size bytes at any alignment are enough, and the alignment changes nothing.
  EvoConfig cfg;
  cfg.shape = EvoShape{1, 2, 77, 2, 16};
  cfg.dtype = DType::kF32;
  cfg.bias1 = Bias1Kind::kF32;
  cfg.bias2 = Bias2Kind::kF32;
  cfg.seed = kBaseSeed + 2701;
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const ForwardRun a = run_forward(in, kTiled, 2);
  const ForwardRun b = run_forward(in, kTiled, 2, true, /*misalign_workspace=*/true);
  ASSERT_TRUE(a.status.ok()) << a.status.to_string();
  ASSERT_TRUE(b.status.ok()) << b.status.to_string();
  EXPECT_TRUE(a.out.same_bytes(b.out));
  EXPECT_TRUE(a.lse.same_bytes(b.lse));
  const BackwardRun c = run_backward(in, a.out, a.lse, kTiled, 2, true, true);
  const BackwardRun d = run_backward(in, a.out, a.lse, kTiled, 2, true, true, true);
  ASSERT_TRUE(c.status.ok()) << c.status.to_string();
  ASSERT_TRUE(d.status.ok()) << d.status.to_string();
  EXPECT_TRUE(c.dq.same_bytes(d.dq));
  EXPECT_TRUE(c.dk.same_bytes(d.dk));
  EXPECT_TRUE(c.dv.same_bytes(d.dv));
  EXPECT_TRUE(c.dbias1.same_bytes(d.dbias1));
  EXPECT_TRUE(c.dbias2.same_bytes(d.dbias2));
}

TEST(EvoformerTiled, BackwardFromTiledForwardMatchesOracle) {
  // The usual pipeline: the backward consumes the tiled forward's own out and lse.
  EvoConfig cfg;
  cfg.shape = EvoShape{2, 2, 50, 2, 32};
  cfg.dtype = DType::kBF16;
  cfg.bias1 = Bias1Kind::kBool;
  cfg.bias2 = Bias2Kind::kSameAsQ;
  cfg.seed = kBaseSeed + 2702;
  SCOPED_TRACE(cfg.str());
  const EvoInputs in = make_inputs(cfg);
  const NaiveGrads g = naive_backward(to_naive(in), in.dout.values());
  const ForwardRun ref_fwd = run_forward(in, kReference);
  const ForwardRun til_fwd = run_forward(in, kTiled);
  ASSERT_TRUE(ref_fwd.status.ok()) << ref_fwd.status.to_string();
  ASSERT_TRUE(til_fwd.status.ok()) << til_fwd.status.to_string();
  const BackwardRun ref = run_backward(in, ref_fwd.out, ref_fwd.lse, kReference, 0, false, true);
  const BackwardRun til = run_backward(in, til_fwd.out, til_fwd.lse, kTiled, 0, false, true);
  ASSERT_TRUE(ref.status.ok()) << ref.status.to_string();
  ASSERT_TRUE(til.status.ok()) << til.status.to_string();
  EXPECT_TRUE(within_tolerance("dq", til.dq.values(), ref.dq.values(), g.dq, cfg.dtype));
  EXPECT_TRUE(within_tolerance("dk", til.dk.values(), ref.dk.values(), g.dk, cfg.dtype));
  EXPECT_TRUE(within_tolerance("dv", til.dv.values(), ref.dv.values(), g.dv, cfg.dtype));
  EXPECT_TRUE(
      within_tolerance("dbias2", til.dbias2.values(), ref.dbias2.values(), g.dbias2, cfg.dtype));
}

}  // namespace
}  // namespace sciattn

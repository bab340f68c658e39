// NaN and Inf in the block-sparse ops on the CPU (nan_semantics_util.h): sparse attention with the
// fused, composite and reference algorithms, forward and backward, in f32, f16 and bf16, and the
// Softmax. A NaN in q reaches its row and what the row attends, nothing else; fully masked rows
// still give 0; a finite result stays finite when V holds values near the top of fp32. Test
// layer (tests/cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "block_sparse_test_util.h"
#include "nan_semantics_util.h"

namespace sciattn {
namespace {

using namespace sciattn::bstest;
using test::nan_exactly_where;
using test::unravel;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kBlock = 16, kB = 2, kH = 2, kN = 3, kL = kN * kBlock, kD = 8;

// Head 0: blocks (0,0), (1,0), (1,1), (2,2); head 1: every block. Block row 1 of head 0 attends
// keys 0..31 only.
Layout nan_layout() {
  Layout l = Layout::zeros(kH, kN, kN);
  l.at(0, 0, 0) = l.at(0, 1, 0) = l.at(0, 1, 1) = l.at(0, 2, 2) = 1;
  for (int64_t r = 0; r < kN; ++r)
    for (int64_t c = 0; c < kN; ++c) l.at(1, r, c) = 1;
  return l;
}

// The NaN goes to q[z=1, h=0, i=20, d=3]: block row 1 of head 0.
constexpr int64_t kZ = 1, kHead = 0, kRow = 20;

struct Tensors {
  HostTensor q, k, v, dout, kpm;
};

Tensors make_tensors(DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensors t;
  for (HostTensor* x : {&t.q, &t.k, &t.v, &t.dout}) {
    *x = HostTensor::packed(dtype, {kB, kH, kL, kD});
    test::fill_normal(*x, rng);
  }
  return t;
}

struct Result {
  Status fwd, bwd;
  HostTensor out, lse, dq, dk, dv;
};

Result run_attention(const BlockSparseIndex& ix, const Tensors& t, DType dtype,
                     SparseAttentionAlgorithm alg) {
  Result r;
  r.out = HostTensor::packed(dtype, {kB, kH, kL, kD});
  r.lse = HostTensor::packed(DType::kF32, {kB, kH, kL});
  SparseAttentionForwardParams f;
  f.index = &ix;
  f.q = t.q.view();
  f.k = t.k.view();
  f.v = t.v.view();
  f.key_padding_mask = t.kpm.view();
  f.out = r.out.view();
  f.lse = r.lse.view();
  f.options.algorithm = alg;
  r.fwd = run_op(f);
  if (!r.fwd.ok()) return r;
  for (HostTensor* g : {&r.dq, &r.dk, &r.dv}) *g = HostTensor::packed(dtype, {kB, kH, kL, kD});
  SparseAttentionBackwardParams b;
  b.index = &ix;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.key_padding_mask = f.key_padding_mask;
  b.out = f.out;
  b.lse = f.lse;
  b.dout = t.dout.view();
  b.dq = r.dq.view();
  b.dk = r.dk.view();
  b.dv = r.dv.view();
  b.options = f.options;
  r.bwd = run_op(b);
  return r;
}

struct Case {
  SparseAttentionAlgorithm alg;
  DType dtype;
};

class SparseAttentionNan : public ::testing::TestWithParam<Case> {};

TEST_P(SparseAttentionNan, NanInQReachesItsRowAndWhatItAttends) {
  const Case c = GetParam();
  const BlockSparseIndex ix = make_index(nan_layout(), kBlock);
  Tensors t = make_tensors(c.dtype, kBaseSeed + 3900);
  t.q.set(((kZ * kH + kHead) * kL + kRow) * kD + 3, kNaN);
  const Result r = run_attention(ix, t, c.dtype, c.alg);
  ASSERT_TRUE(r.fwd.ok()) << r.fwd.to_string();
  ASSERT_TRUE(r.bwd.ok()) << r.bwd.to_string();
  const std::vector<int64_t> qkv = {kB, kH, kL, kD};
  auto row = [&](const std::vector<int64_t>& x) {
    return x[0] == kZ && x[1] == kHead && x[2] == kRow;
  };
  // The row attends the keys of block columns 0 and 1 (0..31): their dK and dV are NaN; keys of
  // the same (z, h) it does not attend may be either (nan_semantics_util.h); all others finite.
  auto key_grad = [&](int64_t i) {
    const auto x = unravel(i, qkv);
    if (x[0] != kZ || x[1] != kHead) return test::Expect::kFinite;
    return x[2] < 2 * kBlock ? test::Expect::kNaN : test::Expect::kEither;
  };
  EXPECT_TRUE(
      nan_exactly_where("out", r.out.values(), [&](int64_t i) { return row(unravel(i, qkv)); }));
  EXPECT_TRUE(nan_exactly_where("lse", r.lse.values(),
                                [&](int64_t i) { return i == (kZ * kH + kHead) * kL + kRow; }));
  EXPECT_TRUE(
      nan_exactly_where("dq", r.dq.values(), [&](int64_t i) { return row(unravel(i, qkv)); }));
  EXPECT_TRUE(test::nan_where("dk", r.dk.values(), key_grad));
  EXPECT_TRUE(test::nan_where("dv", r.dv.values(), key_grad));
}

// Batch 0's keys are all removed by the key padding mask: its rows are fully masked and give 0,
// lse -inf and zero gradients, while batch 1's NaN still propagates.
TEST_P(SparseAttentionNan, FullyMaskedRowsStayZeroBesideANan) {
  const Case c = GetParam();
  const BlockSparseIndex ix = make_index(nan_layout(), kBlock);
  Tensors t = make_tensors(c.dtype, kBaseSeed + 3901);
  t.q.set(((kZ * kH + kHead) * kL + kRow) * kD + 3, kNaN);
  t.kpm = HostTensor::packed(DType::kF32, {kB, kL});
  for (int64_t j = 0; j < kB * kL; ++j) {
    t.kpm.set(j, j < kL ? -std::numeric_limits<double>::infinity() : 0.0);
  }
  const Result r = run_attention(ix, t, c.dtype, c.alg);
  ASSERT_TRUE(r.fwd.ok()) << r.fwd.to_string();
  ASSERT_TRUE(r.bwd.ok()) << r.bwd.to_string();
  const int64_t per_batch = kH * kL * kD;
  for (const HostTensor* x : {&r.out, &r.dq, &r.dk, &r.dv}) {
    const std::vector<double> v = x->values();
    for (int64_t i = 0; i < per_batch; ++i) ASSERT_EQ(v[static_cast<size_t>(i)], 0.0) << i;
  }
  const std::vector<double> lse = r.lse.values();
  for (int64_t i = 0; i < kH * kL; ++i) {
    ASSERT_EQ(lse[static_cast<size_t>(i)], -std::numeric_limits<double>::infinity()) << i;
  }
  EXPECT_TRUE(std::isnan(r.out.values()[((kZ * kH + kHead) * kL + kRow) * kD]));
}

// With every score 0 the output is the mean of V: V filled with 1e37 gives 1e37 (fp32), where
// summing exp(s - max) v before dividing reaches 48e37 = inf.
TEST(SparseAttentionFinite, LargeValuesStayFinite) {
  const BlockSparseIndex ix = make_index(nan_layout(), kBlock);
  for (SparseAttentionAlgorithm alg :
       {SparseAttentionAlgorithm::kFused, SparseAttentionAlgorithm::kComposite,
        SparseAttentionAlgorithm::kReference}) {
    SCOPED_TRACE(sparse_attention_algorithm_name(alg));
    Tensors t = make_tensors(DType::kF32, kBaseSeed + 3902);
    for (int64_t i = 0; i < t.q.numel(); ++i) {
      t.q.set(i, 0.0);
      t.v.set(i, 1e37);
    }
    const Result r = run_attention(ix, t, DType::kF32, alg);
    ASSERT_TRUE(r.fwd.ok()) << r.fwd.to_string();
    for (double o : r.out.values()) ASSERT_NEAR(o, 1e37, 1e37 * 1e-5);
  }
}

// The Softmax: a NaN score makes its row NaN and no other; a fully masked row is 0.
TEST(SoftmaxNan, NanScoreReachesItsRowOnly) {
  const Layout layout = nan_layout();
  const BlockSparseIndex ix = make_index(layout, kBlock);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937_64 rng(kBaseSeed + 3903);
    HostTensor x = HostTensor::packed(dtype, {kB, ix.nnz, kBlock, kBlock});
    test::fill_normal(x, rng);
    // Block p = 1 is (head 0, row 1, col 0); its row r = 4 is logical row 20 of head 0.
    x.set(((kZ * ix.nnz + 1) * kBlock + 4) * kBlock + 7, kNaN);
    HostTensor kpm = HostTensor::packed(DType::kF32, {kB, kL});
    for (int64_t j = 0; j < kB * kL; ++j) kpm.set(j, j < kL ? -kInf : 0.0);  // batch 0 masked
    HostTensor y = HostTensor::packed(dtype, {kB, ix.nnz, kBlock, kBlock});
    BlockSparseSoftmaxParams p;
    p.index = &ix;
    p.x = x.view();
    p.y = y.view();
    p.key_padding_mask = kpm.view();
    const Status s = run_op(p);
    ASSERT_TRUE(s.ok()) << s.to_string();
    const std::vector<double> got = y.values();
    const std::vector<int64_t> sizes = {kB, ix.nnz, kBlock, kBlock};
    EXPECT_TRUE(nan_exactly_where("y", got, [&](int64_t i) {
      const auto at = unravel(i, sizes);
      // Row 4 of the blocks of head 0's block row 1 (blocks 1 and 2), batch 1.
      return at[0] == kZ && (at[1] == 1 || at[1] == 2) && at[2] == 4;
    }));
    for (int64_t i = 0; i < ix.nnz * kBlock * kBlock; ++i) {
      ASSERT_EQ(got[static_cast<size_t>(i)], 0.0) << "batch 0 is fully masked; element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSparse, SparseAttentionNan,
                         ::testing::Values(Case{SparseAttentionAlgorithm::kFused, DType::kF32},
                                           Case{SparseAttentionAlgorithm::kFused, DType::kF16},
                                           Case{SparseAttentionAlgorithm::kFused, DType::kBF16},
                                           Case{SparseAttentionAlgorithm::kComposite, DType::kF32},
                                           Case{SparseAttentionAlgorithm::kComposite, DType::kBF16},
                                           Case{SparseAttentionAlgorithm::kReference, DType::kF32},
                                           Case{SparseAttentionAlgorithm::kReference,
                                                DType::kBF16}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(sparse_attention_algorithm_name(p.param.alg)) + "_" +
                                  dtype_name(p.param.dtype);
                         });

}  // namespace
}  // namespace sciattn

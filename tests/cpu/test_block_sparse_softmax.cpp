// Tests of the block-sparse Softmax, forward and backward: every mask mode (add, mul, bool) of
// key_padding_mask and attn_mask, rpe (including a 0-stride broadcast), scale, causal, fully
// masked rows (0, not NaN, and zero gradient), empty block rows, in-place calls, the tolerance
// rule against the fp64 oracle, a finite-difference check of the oracle's backward, and bitwise
// determinism across thread counts. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "block_sparse_problems.h"
#include "cpu/block_sparse_reference.h"
#include "cpu/block_sparse_tiles.h"  // block_loop_threads: the thread count the calls choose

namespace sciattn {
namespace {

using namespace sciattn::bstest;

struct SMCase {
  DType dtype = DType::kF32;
  int64_t block = 16, Z = 2, H = 2, R = 3, C = 3;
  float scale = 1.0f;
  RpeKind rpe = RpeKind::kNone;
  MaskKind kpm = MaskKind::kNone, attn = MaskKind::kNone;
  bool causal = false;
  bool in_place = false;
  uint64_t seed = kBaseSeed;

  std::string name() const {
    std::string s = std::string(dtype_name(dtype)) + "_b" + std::to_string(block) + "_Z" +
                    std::to_string(Z) + "H" + std::to_string(H) + "R" + std::to_string(R) + "C" +
                    std::to_string(C) + "_rpe" + rpe_name(rpe) + "_kpm" + mask_name(kpm) + "_attn" +
                    mask_name(attn);
    if (scale != 1.0f) s += "_scaled";
    if (causal) s += "_causal";
    if (in_place) s += "_inplace";
    return s + "_s" + std::to_string(seed - kBaseSeed);
  }
};

void PrintTo(const SMCase& c, std::ostream* os) {
  *os << c.name() << " " << seed_note(c.seed);
}

using SMProblem = SoftmaxSuiteProblem<SMCase>;

// rpe in the scores' dtype or in f32, packed, or broadcast: strides 0 on Z and H.
HostTensor rpe_tensor(const SMCase& c) {
  const int64_t rows = c.R * c.block, cols = c.C * c.block;
  switch (c.rpe) {
    case RpeKind::kNone:
      break;
    case RpeKind::kSameDtype:
    case RpeKind::kF32:
      return HostTensor::packed(c.rpe == RpeKind::kF32 ? DType::kF32 : c.dtype,
                                {c.Z, c.H, rows, cols});
    case RpeKind::kBroadcast:
      return HostTensor::with_layout(c.dtype, {c.Z, c.H, rows, cols}, {0, 0, cols, 1}, 0,
                                     rows * cols);
  }
  return HostTensor();
}

// Packed sparse tensors, masks in x's dtype.
SMProblem make_problem(const SMCase& c) {
  return make_softmax_problem(
      c,
      [&](int64_t nnz) {
        return HostTensor::packed(c.dtype, {c.Z, nnz, c.block, c.block});
      },
      [&] { return rpe_tensor(c); }, c.dtype, /*strided_masks=*/false);
}

BlockSparseSoftmaxParams forward_params(const SMProblem& p, const HostTensor& y, int threads = 0) {
  BlockSparseSoftmaxParams f =
      softmax_forward_params(p, p.x.view(), y.view(), p.rpe.view(), p.kpm.view(), p.attn.view());
  f.num_threads = threads;
  return f;
}

// The output tensor: a copy of x for an in-place call, else a fresh poisoned tensor.
HostTensor output_for(const SMProblem& p) {
  if (p.c.in_place) return p.x;
  return HostTensor::packed(p.c.dtype, p.x.sizes());
}

std::vector<SMCase> all_cases() {
  std::vector<SMCase> cases;
  uint64_t seed = kBaseSeed + 300;
  auto add = [&](SMCase c) {
    c.seed = seed++;
    cases.push_back(c);
  };
  // Every mask kind of each mask, in each dtype, with the block rotating through 16, 32, 64.
  int rot = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (MaskKind m : {MaskKind::kAdd, MaskKind::kMul, MaskKind::kBool}) {
      SMCase c;
      c.dtype = dt;
      c.block = int64_t{16} << (rot++ % 3);
      if (c.block == 64) c.R = c.C = 2;
      c.kpm = m;
      c.attn = m == MaskKind::kAdd ? MaskKind::kMul : MaskKind::kAdd;
      c.scale = 0.4f;
      add(c);
    }
  }
  // rpe: in the input dtype, in f32, and broadcast through 0 strides.
  for (RpeKind r : {RpeKind::kSameDtype, RpeKind::kF32, RpeKind::kBroadcast}) {
    SMCase c;
    c.dtype = r == RpeKind::kF32 ? DType::kBF16 : DType::kF16;
    c.rpe = r;
    c.kpm = MaskKind::kBool;
    add(c);
  }
  // Scale alone, causal, in place, a rectangular layout, a single block.
  SMCase c;
  c.scale = 0.125f;
  add(c);
  c = SMCase();
  c.causal = true;
  c.attn = MaskKind::kMul;
  c.block = 32;
  add(c);
  c = SMCase();
  c.in_place = true;
  c.kpm = MaskKind::kAdd;
  c.dtype = DType::kBF16;
  add(c);
  c = SMCase();
  c.R = 2;
  c.C = 4;
  c.rpe = RpeKind::kF32;
  c.kpm = MaskKind::kMul;
  c.attn = MaskKind::kBool;
  add(c);
  c = SMCase();
  c.Z = c.H = c.R = c.C = 1;
  c.block = 64;
  add(c);
  return cases;
}

class SoftmaxCases : public ::testing::TestWithParam<SMCase> {};

TEST_P(SoftmaxCases, ForwardWithinToleranceOfFp64) {
  const SMProblem p = make_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  HostTensor y = output_for(p);
  const BlockSparseSoftmaxParams f = forward_params(p, y);
  // The references read x from p.x (an in-place run overwrites y's copy).
  BlockSparseSoftmaxParams ref_params = f;
  ref_params.x = p.x.view();
  HostTensor ref_out = HostTensor::packed(p.c.dtype, p.x.sizes());
  ref_params.y = ref_out.view();
  const Status s = run_op(f, /*misalign=*/true);
  ASSERT_TRUE(s.ok()) << s.to_string();

  const Vec ref64 = sparse_blocks(softmax_oracle(softmax_oracle_problem(p)), p.layout, p.c.block);
  Vec r64(ref64.size()), lowp(ref64.size());
  std::vector<float> f32(ref64.size());
  cpu::reference_softmax<double>(ref_params, r64.data());
  cpu::reference_softmax<float>(ref_params, f32.data());
  for (size_t i = 0; i < f32.size(); ++i) lowp[i] = round_to(p.c.dtype, f32[i]);
  const auto e = error_stats(r64, ref64);
  EXPECT_LE(e.max_err, 1e-12) << "reference<double> vs oracle";
  EXPECT_TRUE(within_tolerance("y", y.values(), lowp, ref64, p.c.dtype));

  // A fully masked row is 0 (DeepSpeed: NaN): row 1 of every block of block row 0.
  if (p.attn.present()) {
    const Vec got = y.values();
    const int64_t b = p.c.block;
    for (int64_t z = 0; z < p.c.Z; ++z)
      for (int64_t q = 0; q < p.ix.nnz; ++q) {
        if (p.ix.block_row(q) != 0) continue;
        for (int64_t cc = 0; cc < b; ++cc) {
          EXPECT_EQ(got[((z * p.ix.nnz + q) * b + 1) * b + cc], 0.0) << "masked row not 0";
        }
      }
  }
}

TEST_P(SoftmaxCases, BackwardWithinToleranceOfFp64) {
  const SMProblem p = make_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  HostTensor y = output_for(p);
  ASSERT_TRUE(run_op(forward_params(p, y)).ok());
  // dx in place into a copy of dy when the case is in place (DeepSpeed's call).
  HostTensor dx = p.c.in_place ? p.dy : HostTensor::packed(p.c.dtype, p.x.sizes());
  const BlockSparseSoftmaxBackwardParams g =
      softmax_backward_params(p, y.view(), p.c.in_place ? dx.view() : p.dy.view(), dx.view());
  BlockSparseSoftmaxBackwardParams ref_params = g;
  ref_params.dy = p.dy.view();
  ref_params.dx = p.dy.view();  // unused by the reference
  ASSERT_TRUE(run_op(g).ok());

  const Dense4 yl = sparse_logical(y, p.layout, p.c.block);
  const Dense4 dyl = sparse_logical(p.dy, p.layout, p.c.block);
  const Vec ref64 = sparse_blocks(softmax_backward_oracle(p.layout, p.c.block, p.c.scale, yl, dyl),
                                  p.layout, p.c.block);
  std::vector<float> f32(ref64.size());
  cpu::reference_softmax_backward<float>(ref_params, f32.data());
  Vec lowp(ref64.size());
  for (size_t i = 0; i < f32.size(); ++i) lowp[i] = round_to(p.c.dtype, f32[i]);
  EXPECT_TRUE(within_tolerance("dx", dx.values(), lowp, ref64, p.c.dtype));
  // Zero gradient for the fully masked rows (their y is 0).
  if (p.attn.present()) {
    const Vec got = dx.values();
    const int64_t b = p.c.block;
    for (int64_t q = 0; q < p.ix.nnz; ++q) {
      if (p.ix.block_row(q) != 0) continue;
      for (int64_t cc = 0; cc < b; ++cc) EXPECT_EQ(got[(q * b + 1) * b + cc], 0.0);
    }
  }
}

void expect_same_bits_for_any_thread_count(const SMProblem& p) {
  HostTensor y1 = output_for(p);
  ASSERT_TRUE(run_op(forward_params(p, y1, 1)).ok());
  for (int threads : {2, 7}) {
    HostTensor y = output_for(p);
    ASSERT_TRUE(run_op(forward_params(p, y, threads)).ok());
    EXPECT_TRUE(y.same_bytes(y1)) << threads << " threads";
  }
}

TEST_P(SoftmaxCases, SameBitsForAnyThreadCount) {
  const SMProblem p = make_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  expect_same_bits_for_any_thread_count(p);
}

// The cases above have too little work for a second thread (common/cpu_threads.h) and run on one
// whatever num_threads says; this one has enough for two, so the split over threads is exercised.
TEST(Softmax, SameBitsForAnyThreadCountOnSeveralThreads) {
  SMCase c;
  c.block = 64;
  c.Z = 4;
  c.R = c.C = 16;
  c.kpm = MaskKind::kAdd;
  c.seed = kBaseSeed + 395;
  const SMProblem p = make_problem(c);
  SCOPED_TRACE(c.name() + " " + seed_note(c.seed));
  const int64_t tasks = c.Z * c.H * c.R;
  ASSERT_GE(cpu::block_loop_threads(7, tasks, c.Z * p.ix.nnz, c.block, detail::kCpuExpFlops), 2);
  expect_same_bits_for_any_thread_count(p);
}

INSTANTIATE_TEST_SUITE_P(BlockSparse, SoftmaxCases, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<SMCase>& param_info) {
                           return param_info.param.name();
                         });

// Rows of an empty block row have no entries: nothing of y is written for them, and the
// padding of a strided y stays untouched.
TEST(Softmax, EmptyBlockRowsAndPaddingAreNotWritten) {
  Layout layout = Layout::zeros(1, 3, 3);
  layout.at(0, 0, 0) = layout.at(0, 2, 1) = layout.at(0, 2, 2) = 1;  // block row 1 is empty
  const BlockSparseIndex ix = make_index(layout, 16);
  std::mt19937_64 rng(kBaseSeed + 380);
  HostTensor x = HostTensor::packed(DType::kF32, {1, 3, 16, 16});
  test::fill_normal(x, rng);
  HostTensor y = test::make_tensor(DType::kF32, {1, 3, 16, 16}, test::Layout::kPadded);
  BlockSparseSoftmaxParams f;
  f.index = &ix;
  f.x = x.view();
  f.y = y.view();
  ASSERT_TRUE(run_op(f).ok());
  EXPECT_EQ(y.touched_outside_view(), 0);
  EXPECT_EQ(test::count_nan(y.values()), 0);
  // Each row of block (0, 0) sums to 1 by itself; rows of block row 2 sum to 1 over 2 blocks.
  const Vec v = y.values();
  for (int64_t r = 0; r < 16; ++r) {
    double s0 = 0, s2 = 0;
    for (int64_t c = 0; c < 16; ++c) {
      s0 += v[static_cast<size_t>(r * 16 + c)];
      s2 += v[static_cast<size_t>((16 + r) * 16 + c)] + v[static_cast<size_t>((32 + r) * 16 + c)];
    }
    EXPECT_NEAR(s0, 1.0, 1e-6);
    EXPECT_NEAR(s2, 1.0, 1e-6);
  }
}

// The oracle's backward is the gradient of sum(dy * y) w.r.t. x: central differences in fp64.
TEST(Softmax, OracleBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(kBaseSeed + 390);
  const Layout layout = random_layout(2, 2, 2, 0.7, rng);
  const int64_t b = 16;
  SoftmaxProblem o;
  o.layout = &layout;
  o.b = b;
  o.Z = 1;
  o.scale = 0.7;
  o.x = Dense4(1, 2, 2 * b, 2 * b);
  Dense4 dy(1, 2, 2 * b, 2 * b);
  std::normal_distribution<double> n01;
  for (double& v : o.x.v) v = n01(rng);
  for (double& v : dy.v) v = n01(rng);
  o.kpm.assign(static_cast<size_t>(2 * b), 0.0);
  o.kpm[3] = -kInf;
  const Dense4 dx = softmax_backward_oracle(layout, b, o.scale, softmax_oracle(o), dy);
  auto loss = [&](const SoftmaxProblem& q) {
    const Dense4 y = softmax_oracle(q);
    double l = 0;
    for (size_t i = 0; i < y.v.size(); ++i) l += y.v[i] * dy.v[i];
    return l;
  };
  std::uniform_int_distribution<size_t> pick(0, o.x.v.size() - 1);
  int checked = 0;
  for (int t = 0; t < 200 && checked < 40; ++t) {
    const size_t i = pick(rng);
    const int64_t h = static_cast<int64_t>(i / (4 * b * b)),
                  rest = static_cast<int64_t>(i) % (4 * b * b);
    if (!layout.at(h, rest / (2 * b) / b, rest % (2 * b) / b)) continue;
    SoftmaxProblem plus = o, minus = o;
    const double eps = 1e-6;
    plus.x.v[i] += eps;
    minus.x.v[i] -= eps;
    const double fd = (loss(plus) - loss(minus)) / (2 * eps);
    EXPECT_NEAR(dx.v[i], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "element " << i;
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

}  // namespace
}  // namespace sciattn

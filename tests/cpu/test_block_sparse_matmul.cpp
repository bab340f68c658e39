// Tests of the block-sparse MatMul (sdd, dsd, dds with trans_a / trans_b), forward and backward:
// the tolerance rule against the fp64 oracle with the library's fp32 reference as lowp_ref, in
// f32, f16 and bf16, blocks 16/32/64, inner sizes that are not multiples of 16 and larger than a
// tile, strided and transposed-view operands, and bitwise determinism across thread counts.
// Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block_sparse_problems.h"
#include "cpu/block_sparse_reference.h"
#include "cpu/block_sparse_tiles.h"  // block_loop_threads: the thread count the calls choose

namespace sciattn {
namespace {

using namespace sciattn::bstest;

BlockSparseMatMulParams forward_params(const MMProblem& p, const HostTensor& c, int threads = 0) {
  BlockSparseMatMulParams f = matmul_forward_params(p, p.a.view(), p.b.view(), c.view());
  f.num_threads = threads;
  return f;
}

BlockSparseMatMulBackwardParams backward_params(const MMProblem& p, const HostTensor& da,
                                                const HostTensor& db, int threads = 0) {
  BlockSparseMatMulBackwardParams g =
      matmul_backward_params(p, p.a.view(), p.b.view(), p.dc.view(), da.view(), db.view());
  g.num_threads = threads;
  return g;
}

std::vector<MMCase> all_cases() {
  std::vector<MMCase> cases;
  uint64_t seed = kBaseSeed + 100;
  const BlockSparseMatMulMode modes[] = {BlockSparseMatMulMode::kSdd, BlockSparseMatMulMode::kDsd,
                                         BlockSparseMatMulMode::kDds};
  // Every mode, transpose and dtype; the block rotates through 16, 32, 64, and the layout is
  // rectangular (R != C) so that a mixed-up transpose cannot pass.
  int rot = 0;
  for (BlockSparseMatMulMode mode : modes)
    for (int t = 0; t < 4; ++t)
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        MMCase c;
        c.mode = mode;
        c.ta = (t & 1) != 0;
        c.tb = (t & 2) != 0;
        c.dtype = dt;
        c.block = int64_t{16} << (rot++ % 3);
        c.R = c.block == 64 ? 2 : 3;
        c.Z = c.block == 64 ? 1 : 2;  // keeps the plain references quick at the largest block
        c.C = 2;
        c.extra = mode == BlockSparseMatMulMode::kSdd ? 24 : 20;
        c.seed = seed++;
        cases.push_back(c);
      }
  // Inner and dense sizes that break naive tiling: 1, 7 (not a multiple of 16) and 300 (more
  // than one 256-wide tile), strided operands, and a single head and batch.
  for (BlockSparseMatMulMode mode : modes) {
    for (int64_t extra : {1, 7, 300}) {
      MMCase c;
      c.mode = mode;
      c.extra = extra;
      c.ta = extra == 7;
      c.tb = extra == 300;
      c.dtype = extra == 300 ? DType::kBF16 : DType::kF32;
      c.Z = 1;
      c.H = extra == 1 ? 1 : 2;
      c.seed = seed++;
      cases.push_back(c);
    }
    for (DenseStorage st : {DenseStorage::kPadded, DenseStorage::kPermuted}) {
      MMCase c;
      c.mode = mode;
      c.storage = st;
      c.ta = st == DenseStorage::kPermuted;
      c.dtype = DType::kF16;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  return cases;
}

class MatMulCases : public ::testing::TestWithParam<MMCase> {};

TEST_P(MatMulCases, ForwardWithinToleranceOfFp64) {
  const MMProblem p = make_matmul_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  HostTensor c = matmul_output(p, p.c_sizes, p.c_sparse);
  const BlockSparseMatMulParams f = forward_params(p, c);
  const Status s = run_op(f, /*misalign=*/true);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const MatMulOracle o = matmul_oracle(p);
  // lowp_ref: the library's fp32 reference, rounded to the dtype of c.
  Vec lowp(o.c.size()), ref64(o.c.size());
  std::vector<float> as_float(o.c.size());
  cpu::reference_matmul<float>(f, as_float.data());
  for (size_t i = 0; i < lowp.size(); ++i) lowp[i] = round_to(p.c.dtype, as_float[i]);
  cpu::reference_matmul<double>(f, ref64.data());
  // The library's fp64 reference is the oracle itself up to summation order.
  const auto e = error_stats(ref64, o.c);
  EXPECT_LE(e.max_err, 1e-10 * std::max(1.0, e.max_ref)) << "reference<double> vs oracle";
  EXPECT_TRUE(within_tolerance("c", c.values(), lowp, o.c, p.c.dtype));
  EXPECT_EQ(c.touched_outside_view(), 0) << "c written outside its view";
  // The inner size of the FLOP count is K (sdd), N (dsd) or M (dds): the case's `extra`.
  EXPECT_EQ(block_sparse_matmul_flops(f),
            2.0 * static_cast<double>(p.c.Z * p.ix.nnz * p.c.block * p.c.block * p.c.extra));
}

TEST_P(MatMulCases, BackwardWithinToleranceOfFp64) {
  const MMProblem p = make_matmul_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  HostTensor da = matmul_output(p, p.a.sizes(), p.a_sparse);
  HostTensor db = matmul_output(p, p.b.sizes(), p.b_sparse);
  const BlockSparseMatMulBackwardParams g = backward_params(p, da, db);
  const Status s = run_op(g);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const MatMulOracle o = matmul_oracle(p);
  std::vector<float> fa(o.da.size()), fb(o.db.size());
  cpu::reference_matmul_backward<float>(g, fa.data(), fb.data());
  Vec la(fa.size()), lb(fb.size());
  for (size_t i = 0; i < fa.size(); ++i) la[i] = round_to(p.c.dtype, fa[i]);
  for (size_t i = 0; i < fb.size(); ++i) lb[i] = round_to(p.c.dtype, fb[i]);
  Vec ra(o.da.size()), rb(o.db.size());
  cpu::reference_matmul_backward<double>(g, ra.data(), rb.data());
  const auto ea = error_stats(ra, o.da), eb = error_stats(rb, o.db);
  EXPECT_LE(ea.max_err, 1e-10 * std::max(1.0, ea.max_ref)) << "reference<double> da vs oracle";
  EXPECT_LE(eb.max_err, 1e-10 * std::max(1.0, eb.max_ref)) << "reference<double> db vs oracle";
  EXPECT_TRUE(within_tolerance("da", da.values(), la, o.da, p.c.dtype));
  EXPECT_TRUE(within_tolerance("db", db.values(), lb, o.db, p.c.dtype));
  EXPECT_EQ(da.touched_outside_view(), 0);
  EXPECT_EQ(db.touched_outside_view(), 0);

  // Each gradient alone gives the same bits as both together.
  HostTensor da_only = matmul_output(p, p.a.sizes(), p.a_sparse);
  ASSERT_TRUE(run_op(backward_params(p, da_only, HostTensor())).ok());
  EXPECT_TRUE(da_only.same_bytes(da));
  HostTensor db_only = matmul_output(p, p.b.sizes(), p.b_sparse);
  ASSERT_TRUE(run_op(backward_params(p, HostTensor(), db_only)).ok());
  EXPECT_TRUE(db_only.same_bytes(db));
}

void expect_same_bits_for_any_thread_count(const MMProblem& p) {
  HostTensor c1 = matmul_output(p, p.c_sizes, p.c_sparse);
  HostTensor da1 = matmul_output(p, p.a.sizes(), p.a_sparse);
  HostTensor db1 = matmul_output(p, p.b.sizes(), p.b_sparse);
  ASSERT_TRUE(run_op(forward_params(p, c1, 1)).ok());
  ASSERT_TRUE(run_op(backward_params(p, da1, db1, 1)).ok());
  for (int threads : {2, 7}) {
    HostTensor c = matmul_output(p, p.c_sizes, p.c_sparse);
    HostTensor da = matmul_output(p, p.a.sizes(), p.a_sparse);
    HostTensor db = matmul_output(p, p.b.sizes(), p.b_sparse);
    ASSERT_TRUE(run_op(forward_params(p, c, threads)).ok());
    ASSERT_TRUE(run_op(backward_params(p, da, db, threads)).ok());
    EXPECT_TRUE(c.same_bytes(c1)) << threads << " threads: c differs";
    EXPECT_TRUE(da.same_bytes(da1)) << threads << " threads: da differs";
    EXPECT_TRUE(db.same_bytes(db1)) << threads << " threads: db differs";
  }
}

TEST_P(MatMulCases, SameBitsForAnyThreadCount) {
  const MMProblem p = make_matmul_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  expect_same_bits_for_any_thread_count(p);
}

// The cases above have too little work for a second thread (common/cpu_threads.h) and run on one
// whatever num_threads says; these have enough for two in every product, so the split over
// threads is exercised.
TEST(MatMul, SameBitsForAnyThreadCountOnSeveralThreads) {
  uint64_t seed = kBaseSeed + 95;
  for (BlockSparseMatMulMode mode :
       {BlockSparseMatMulMode::kSdd, BlockSparseMatMulMode::kDsd, BlockSparseMatMulMode::kDds}) {
    MMCase c;
    c.mode = mode;
    c.block = 32;
    c.R = c.C = 20;
    c.extra = 384;
    c.seed = seed++;
    const MMProblem p = make_matmul_problem(c);
    SCOPED_TRACE(c.name() + " " + seed_note(c.seed));
    // Every product of the forward and the backward has an inner or outer size of c.extra or more
    // and at least Z * H * R tasks.
    ASSERT_GE(cpu::block_loop_threads(7, c.Z * c.H * c.R, c.Z * p.ix.nnz, c.block, 2.0 * 384), 2);
    expect_same_bits_for_any_thread_count(p);
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSparse, MatMulCases, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<MMCase>& param_info) {
                           return param_info.param.name();
                         });

// DeepSpeed's attention uses of MatMul: W = sdd_nt(Q, K) then O = dsd_nn(P, V) equal dense
// products restricted to the layout, here on a real BigBird layout.
TEST(MatMul, AttentionShapedProductsOnBigBirdLayout) {
  BigBirdSparsityConfig cfg;
  cfg.num_heads = 2;
  cfg.block = 32;
  cfg.seed = 3;
  Layout layout;
  ASSERT_TRUE(make_layout(cfg, 256, &layout).ok());
  const BlockSparseIndex ix = make_index(layout, 32);
  std::mt19937_64 rng(kBaseSeed + 90);
  HostTensor q = HostTensor::packed(DType::kF32, {1, 2, 256, 16});
  HostTensor k = HostTensor::packed(DType::kF32, {1, 2, 256, 16});
  test::fill_normal(q, rng);
  test::fill_normal(k, rng);
  HostTensor w = HostTensor::packed(DType::kF32, {1, ix.nnz, 32, 32});
  BlockSparseMatMulParams f;
  f.index = &ix;
  f.mode = BlockSparseMatMulMode::kSdd;
  f.trans_b = true;
  f.a = q.view();
  f.b = k.view();
  f.c = w.view();
  ASSERT_TRUE(run_op(f).ok());
  const Vec want = sparse_blocks(matmul(dense_op(q, false), dense_op(k, true)), layout, 32);
  const auto e = error_stats(w.values(), want);
  EXPECT_LE(e.max_err, 1e-5 * std::max(1.0, e.max_ref));
}

// A layout without any block is valid (docs/block_sparse_ops.md): sdd gives an empty sparse
// result, dsd and dds give zeros, and the Softmax has nothing to do. The empty sparse tensors may
// come with a null pointer (nothing to address) or a real one.
TEST(MatMul, EmptyLayoutGivesEmptyOrZeroResults) {
  const Layout layout = Layout::zeros(2, 3, 2);
  const BlockSparseIndex ix = make_index(layout, 16);
  ASSERT_EQ(ix.nnz, 0);
  std::mt19937_64 rng(kBaseSeed + 91);
  HostTensor a = HostTensor::packed(DType::kF32, {2, 2, 48, 8});
  HostTensor b = HostTensor::packed(DType::kF32, {2, 2, 8, 32});
  test::fill_normal(a, rng);
  test::fill_normal(b, rng);
  for (const bool null_sparse : {true, false}) {
    SCOPED_TRACE(null_sparse ? "null sparse pointers" : "real sparse pointers");
    HostTensor sparse_storage = HostTensor::packed(DType::kF32, {2, 0, 16, 16});
    TensorView sparse = sparse_storage.view();
    if (null_sparse) sparse.data = nullptr;
    BlockSparseMatMulParams sdd;
    sdd.index = &ix;
    sdd.mode = BlockSparseMatMulMode::kSdd;
    sdd.a = a.view();
    sdd.b = b.view();
    sdd.c = sparse;
    Status s = run_op(sdd);
    ASSERT_TRUE(s.ok()) << s.to_string();

    HostTensor dsd_out = HostTensor::packed(DType::kF32, {2, 2, 48, 5});
    HostTensor y = HostTensor::packed(DType::kF32, {2, 2, 32, 5});
    test::fill_normal(y, rng);
    BlockSparseMatMulParams dsd;
    dsd.index = &ix;
    dsd.mode = BlockSparseMatMulMode::kDsd;
    dsd.a = sparse;
    dsd.b = y.view();
    dsd.c = dsd_out.view();  // poisoned with NaN: every element must be written
    s = run_op(dsd);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (double v : dsd_out.values()) ASSERT_EQ(v, 0.0);

    HostTensor x = HostTensor::packed(DType::kF32, {2, 2, 7, 48});
    HostTensor dds_out = HostTensor::packed(DType::kF32, {2, 2, 7, 32});
    test::fill_normal(x, rng);
    BlockSparseMatMulParams dds;
    dds.index = &ix;
    dds.mode = BlockSparseMatMulMode::kDds;
    dds.a = x.view();
    dds.b = sparse;
    dds.c = dds_out.view();
    s = run_op(dds);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (double v : dds_out.values()) ASSERT_EQ(v, 0.0);

    // The backward of dsd: dS is empty, d op(B) = op(S)^T dC is zero.
    HostTensor db = HostTensor::packed(DType::kF32, {2, 2, 32, 5});
    BlockSparseMatMulBackwardParams bwd;
    bwd.index = &ix;
    bwd.mode = BlockSparseMatMulMode::kDsd;
    bwd.a = sparse;
    bwd.b = y.view();
    bwd.dc = dsd_out.view();
    bwd.db = db.view();
    s = run_op(bwd);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (double v : db.values()) ASSERT_EQ(v, 0.0);

    BlockSparseSoftmaxParams sm;
    sm.index = &ix;
    sm.x = sparse;
    sm.y = sparse;
    s = run_op(sm);
    ASSERT_TRUE(s.ok()) << s.to_string();
    BlockSparseSoftmaxBackwardParams smb;
    smb.index = &ix;
    smb.y = sparse;
    smb.dy = sparse;
    smb.dx = sparse;
    s = run_op(smb);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  // A null pointer stands only for an empty tensor: with blocks it is still an error naming it.
  Layout one = Layout::zeros(2, 3, 2);
  one.at(0, 0, 0) = 1;
  const BlockSparseIndex ix1 = make_index(one, 16);
  BlockSparseMatMulParams bad;
  bad.index = &ix1;
  bad.mode = BlockSparseMatMulMode::kSdd;
  bad.a = a.view();
  bad.b = b.view();
  bad.c = TensorView::contiguous(nullptr, DType::kF32, {2, 1, 16, 16});
  std::string why;
  EXPECT_EQ(can_implement(bad, &why).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(why.find("c is required but is a null pointer"), std::string::npos) << why;
}

}  // namespace
}  // namespace sciattn

// The GPU block-sparse ops (label gpu): MatMul sdd / dsd / dds with every transpose, forward and
// backward; Softmax forward (scale, rpe, both masks in every mode and dtype, causal, in place)
// and backward; the composite sparse attention (kComposite) forward and backward. Each result is
// checked against the fp64 oracle of block_sparse_test_util.h with the tolerance rule, the CPU
// path on the same inputs being lowp_ref; outputs start NaN-poisoned so an unwritten element
// fails; a second run must give the same bytes. Each test skips without a CUDA device. The tests
// with "Small" in their name are the quick subset for compute-sanitizer:
//   --gtest_filter='*Small*'
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cpu/block_sparse_problems.h"
#include "cpu/nan_semantics_util.h"
#include "cuda/cuda_test_util.h"
#include "sciattn/device.h"

namespace sciattn {
namespace {

using namespace sciattn::bstest;
using test::DeviceBuffer;
using test::DeviceCopy;

// ---- device memory ------------------------------------------------------------------------------

// Runs an op on the GPU with a device workspace of exactly workspace_size(p) bytes (one byte past
// an aligned address with `misalign`) on `stream`, and waits for it.
template <class Params>
Status run_gpu(const Params& p, bool misalign = false, cudaStream_t stream = nullptr) {
  const size_t bytes = workspace_size(p);
  DeviceBuffer ws(bytes + (misalign ? 1 : 0));
  void* ptr = ws.ptr == nullptr ? nullptr : static_cast<std::byte*>(ws.ptr) + (misalign ? 1 : 0);
  const Status s = run(p, ptr, bytes, Stream{stream});
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return s;
}

bool same_storage(const HostTensor& a, const HostTensor& b) {
  if (a.present() != b.present()) return false;
  return !a.present() || std::memcmp(a.base(), b.base(), a.storage_bytes()) == 0;
}

void upload(BlockSparseIndex& ix) {
  const Status s = upload_block_sparse_index(&ix, 0);
  ASSERT_TRUE(s.ok()) << s.to_string();
}

// =================================================================================================
// MatMul
// =================================================================================================

MMProblem make_mm_problem(const MMCase& c) {
  MMProblem p = make_matmul_problem(c);
  upload(p.ix);
  return p;
}

std::vector<MMCase> mm_cases() {
  std::vector<MMCase> cases;
  uint64_t seed = kBaseSeed + 2100;
  const BlockSparseMatMulMode modes[] = {BlockSparseMatMulMode::kSdd, BlockSparseMatMulMode::kDsd,
                                         BlockSparseMatMulMode::kDds};
  // Every mode x transpose x dtype; the block rotates through 16, 32, 64 and 128 and the layout
  // is rectangular (R != C), so a mixed-up transpose cannot pass.
  int rot = 0;
  for (BlockSparseMatMulMode mode : modes)
    for (int t = 0; t < 4; ++t)
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        MMCase c;
        c.mode = mode;
        c.ta = (t & 1) != 0;
        c.tb = (t & 2) != 0;
        c.dtype = dt;
        c.block = int64_t{16} << (rot++ % 4);
        c.R = c.block >= 64 ? 2 : 3;
        c.Z = c.block >= 64 ? 1 : 2;
        c.C = c.block == 128 ? 1 : 2;
        if (c.block == 128) c.R = 2;
        // Odd inner / dense sizes: not a multiple of 16 nor of the 64-wide dense tile.
        c.extra = mode == BlockSparseMatMulMode::kSdd ? 40 : 70;
        c.seed = seed++;
        cases.push_back(c);
      }
  // Sizes that break naive tiling (1, 7, a long K / N / M of 300), odd batch and heads, and
  // strided or transposed-in-memory operands; the small ones form the sanitizer subset.
  for (BlockSparseMatMulMode mode : modes) {
    for (int64_t extra : {1, 7, 300}) {
      MMCase c;
      c.mode = mode;
      c.extra = extra;
      c.ta = extra == 7;
      c.tb = extra != 1;
      c.dtype = extra == 300 ? DType::kBF16 : DType::kF32;
      c.Z = extra == 7 ? 3 : 1;
      c.H = extra == 1 ? 1 : 3;
      c.small = extra != 300;
      c.seed = seed++;
      cases.push_back(c);
    }
    for (DenseStorage st : {DenseStorage::kPadded, DenseStorage::kPermuted}) {
      for (int t = 0; t < 4; ++t) {
        MMCase c;
        c.mode = mode;
        c.storage = st;
        c.ta = (t & 1) != 0;
        c.tb = (t & 2) != 0;
        c.dtype = st == DenseStorage::kPadded ? DType::kF16 : DType::kBF16;
        c.block = st == DenseStorage::kPadded ? 32 : 16;
        c.extra = 33;
        c.small = t == 3;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  // Split lines (pieces of one or two blocks): dsd and dds in every transpose walk the row split
  // or the column split, sum pieces into fp32 partials and combine them; with per-head and shared
  // layouts (head repeats), batches, a dense size past one 64-wide tile, and each dtype engine.
  int split_rot = 0;
  for (BlockSparseMatMulMode mode : {BlockSparseMatMulMode::kDsd, BlockSparseMatMulMode::kDds})
    for (int t = 0; t < 4; ++t) {
      MMCase c;
      c.mode = mode;
      c.ta = (t & 1) != 0;
      c.tb = (t & 2) != 0;
      c.dtype = split_rot % 3 == 0 ? DType::kF32 : split_rot % 3 == 1 ? DType::kBF16 : DType::kF16;
      c.block = int64_t{16} << (split_rot % 3);
      c.R = 5;
      c.C = 4;
      c.H = 3;
      c.extra = t == 1 ? 70 : 24;
      c.split = 1 + split_rot % 2;
      c.small = t == 0;
      c.storage = t == 2 ? DenseStorage::kPadded : DenseStorage::kPacked;
      c.seed = seed++;
      ++split_rot;
      cases.push_back(c);
    }
  return cases;
}

class MatMulCuda : public ::testing::TestWithParam<MMCase> {};

TEST_P(MatMulCuda, ForwardMatchesOracleAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const MMProblem p = make_mm_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  const MatMulOracle o = matmul_oracle(p);
  HostTensor cpu = matmul_output(p, p.c_sizes, p.c_sparse);
  ASSERT_TRUE(run_op(matmul_forward_params(p, p.a.view(), p.b.view(), cpu.view())).ok());

  DeviceCopy a(p.a), b(p.b);
  HostTensor got = matmul_output(p, p.c_sizes, p.c_sparse), again = got;
  DeviceCopy c(got), c2(again);
  const Status s = run_gpu(matmul_forward_params(p, a.view(), b.view(), c.view()));
  ASSERT_TRUE(s.ok()) << s.to_string();
  c.copy_to(got);
  EXPECT_TRUE(within_tolerance("c", got.values(), cpu.values(), o.c, p.c.dtype));
  EXPECT_EQ(got.touched_outside_view(), 0) << "c written outside its view";
  ASSERT_TRUE(run_gpu(matmul_forward_params(p, a.view(), b.view(), c2.view())).ok());
  c2.copy_to(again);
  EXPECT_TRUE(same_storage(got, again)) << "a second run gave different bits";
}

TEST_P(MatMulCuda, BackwardMatchesOracle) {
  SKIP_WITHOUT_GPU();
  const MMProblem p = make_mm_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  const MatMulOracle o = matmul_oracle(p);
  HostTensor cpu_da = matmul_output(p, p.a.sizes(), p.a_sparse);
  HostTensor cpu_db = matmul_output(p, p.b.sizes(), p.b_sparse);
  ASSERT_TRUE(run_op(matmul_backward_params(p, p.a.view(), p.b.view(), p.dc.view(), cpu_da.view(),
                                            cpu_db.view()))
                  .ok());

  DeviceCopy a(p.a), b(p.b), dc(p.dc);
  HostTensor da = matmul_output(p, p.a.sizes(), p.a_sparse);
  HostTensor db = matmul_output(p, p.b.sizes(), p.b_sparse);
  HostTensor da_only = da, db_only = db;
  DeviceCopy d_da(da), d_db(db), d_da_only(da_only), d_db_only(db_only);
  const Status s =
      run_gpu(matmul_backward_params(p, a.view(), b.view(), dc.view(), d_da.view(), d_db.view()));
  ASSERT_TRUE(s.ok()) << s.to_string();
  d_da.copy_to(da);
  d_db.copy_to(db);
  EXPECT_TRUE(within_tolerance("da", da.values(), cpu_da.values(), o.da, p.c.dtype));
  EXPECT_TRUE(within_tolerance("db", db.values(), cpu_db.values(), o.db, p.c.dtype));
  EXPECT_EQ(da.touched_outside_view(), 0);
  EXPECT_EQ(db.touched_outside_view(), 0);

  // Each gradient alone gives the same bits as both together.
  ASSERT_TRUE(run_gpu(matmul_backward_params(p, a.view(), b.view(), dc.view(), d_da_only.view(),
                                             TensorView{}))
                  .ok());
  ASSERT_TRUE(run_gpu(matmul_backward_params(p, a.view(), b.view(), dc.view(), TensorView{},
                                             d_db_only.view()))
                  .ok());
  d_da_only.copy_to(da_only);
  d_db_only.copy_to(db_only);
  EXPECT_TRUE(same_storage(da_only, da));
  EXPECT_TRUE(same_storage(db_only, db));
}

INSTANTIATE_TEST_SUITE_P(BlockSparse, MatMulCuda, ::testing::ValuesIn(mm_cases()),
                         [](const ::testing::TestParamInfo<MMCase>& param_info) {
                           return param_info.param.name();
                         });

// DeepSpeed's attention shapes on a real BigBird layout, with the key pre-transposed in memory
// ([B, H, D, L] viewed as [B, H, L, D]): W = sdd_nt(Q, K), then O = dsd_nn(W, V).
TEST(MatMulCudaSmall, AttentionShapedProductsOnBigBirdLayout) {
  SKIP_WITHOUT_GPU();
  BigBirdSparsityConfig cfg;
  cfg.num_heads = 2;
  cfg.block = 32;
  cfg.seed = 3;
  Layout layout;
  ASSERT_TRUE(make_layout(cfg, 256, &layout).ok());
  BlockSparseIndex ix = make_index(layout, 32);
  upload(ix);
  std::mt19937_64 rng(kBaseSeed + 2090);
  HostTensor q = HostTensor::packed(DType::kF16, {1, 2, 256, 64});
  HostTensor k = HostTensor::permuted(DType::kF16, {1, 2, 256, 64}, {0, 1, 3, 2});
  test::fill_normal(q, rng);
  test::fill_normal(k, rng);
  HostTensor w = HostTensor::packed(DType::kF16, {1, ix.nnz, 32, 32});
  DeviceCopy dq(q), dk(k), dw(w);
  BlockSparseMatMulParams f;
  f.index = &ix;
  f.mode = BlockSparseMatMulMode::kSdd;
  f.trans_b = true;
  f.a = dq.view();
  f.b = dk.view();
  f.c = dw.view();
  const Status s = run_gpu(f);
  ASSERT_TRUE(s.ok()) << s.to_string();
  dw.copy_to(w);
  const Vec want = sparse_blocks(matmul(dense_op(q, false), dense_op(k, true)), layout, 32);
  HostTensor cpu = HostTensor::packed(DType::kF16, {1, ix.nnz, 32, 32});
  BlockSparseMatMulParams fc = f;
  fc.a = q.view();
  fc.b = k.view();
  fc.c = cpu.view();
  ASSERT_TRUE(run_op(fc).ok());
  EXPECT_TRUE(within_tolerance("w", w.values(), cpu.values(), want, DType::kF16));
}

// =================================================================================================
// Softmax
// =================================================================================================

struct SMCase {
  DType dtype = DType::kF32;
  int64_t block = 16, Z = 2, H = 2, R = 3, C = 3;
  float scale = 1.0f;
  RpeKind rpe = RpeKind::kNone;
  MaskKind kpm = MaskKind::kNone, attn = MaskKind::kNone;
  DType mask_dtype = DType::kF32;  // of float masks: f32 or x's dtype
  bool causal = false, in_place = false, strided = false, small = false;
  uint64_t seed = kBaseSeed;

  std::string name() const {
    std::string s = std::string(small ? "Small_" : "") + dtype_name(dtype) + "_b" +
                    std::to_string(block) + "_Z" + std::to_string(Z) + "H" + std::to_string(H) +
                    "R" + std::to_string(R) + "C" + std::to_string(C) + "_rpe" + rpe_name(rpe) +
                    "_kpm" + mask_name(kpm) + "_attn" + mask_name(attn) + "_m" +
                    dtype_name(mask_dtype);
    if (scale != 1.0f) s += "_scaled";
    if (causal) s += "_causal";
    if (in_place) s += "_inplace";
    if (strided) s += "_strided";
    return s + "_s" + std::to_string(seed - kBaseSeed);
  }
};

void PrintTo(const SMCase& c, std::ostream* os) {
  *os << c.name() << " " << seed_note(c.seed);
}

using SMProblem = SoftmaxSuiteProblem<SMCase>;

// A sparse tensor of the problem: packed, or with padded strides on Z, nnz and the block rows.
HostTensor sparse_tensor(const SMCase& c, int64_t nnz) {
  const std::vector<int64_t> sizes = {c.Z, nnz, c.block, c.block};
  return c.strided ? test::make_tensor(c.dtype, sizes, test::Layout::kPadded)
                   : HostTensor::packed(c.dtype, sizes);
}

HostTensor rpe_tensor(const SMCase& c) {
  const int64_t rows = c.R * c.block, cols = c.C * c.block;
  switch (c.rpe) {
    case RpeKind::kNone:
      break;
    case RpeKind::kSameDtype:
      return test::make_tensor(c.dtype, {c.Z, c.H, rows, cols}, test::Layout::kPadded);
    case RpeKind::kF32:
      return HostTensor::packed(DType::kF32, {c.Z, c.H, rows, cols});
    case RpeKind::kBroadcast:
      // One [rows, cols] table shared by every batch and head, stored transposed: strides
      // (0, 0, 1, rows).
      return HostTensor::with_layout(c.dtype, {c.Z, c.H, rows, cols}, {0, 0, 1, rows}, 0,
                                     rows * cols);
  }
  return HostTensor();
}

SMProblem make_sm_problem(const SMCase& c) {
  SMProblem p = make_softmax_problem(
      c, [&](int64_t nnz) { return sparse_tensor(c, nnz); }, [&] { return rpe_tensor(c); },
      c.mask_dtype == DType::kF32 ? DType::kF32 : c.dtype, c.strided);
  upload(p.ix);
  return p;
}

// sparse_logical reads a packed tensor; a strided one goes through a packed copy of its values.
HostTensor packed_copy(const HostTensor& t) {
  HostTensor r = HostTensor::packed(t.dtype(), t.sizes());
  const Vec v = t.values();
  for (int64_t i = 0; i < r.numel(); ++i) r.set(i, v[static_cast<size_t>(i)]);
  return r;
}

std::vector<SMCase> sm_cases() {
  std::vector<SMCase> cases;
  uint64_t seed = kBaseSeed + 2300;
  auto add = [&](SMCase c) {
    c.seed = seed++;
    cases.push_back(c);
  };
  // Every mask kind of each mask in each dtype, float masks in f32 and in x's dtype, the block
  // rotating through 16, 32, 64 and 128.
  int rot = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (MaskKind m : {MaskKind::kAdd, MaskKind::kMul, MaskKind::kBool}) {
      SMCase c;
      c.dtype = dt;
      c.block = int64_t{16} << (rot++ % 4);
      if (c.block >= 64) c.R = c.C = 2;
      if (c.block == 128) c.Z = 1;
      c.kpm = m;
      c.attn = m == MaskKind::kAdd ? MaskKind::kMul : MaskKind::kAdd;
      c.mask_dtype = rot % 2 == 0 ? DType::kF32 : dt;
      c.scale = 0.4f;
      add(c);
    }
  }
  // rpe in x's dtype (strided), in f32, and broadcast through 0 strides.
  for (RpeKind r : {RpeKind::kSameDtype, RpeKind::kF32, RpeKind::kBroadcast}) {
    SMCase c;
    c.dtype = r == RpeKind::kF32 ? DType::kBF16 : DType::kF16;
    c.rpe = r;
    c.kpm = MaskKind::kBool;
    add(c);
  }
  SMCase c;
  c.scale = 0.125f;
  c.small = true;
  add(c);
  c = SMCase();
  c.causal = true;
  c.attn = MaskKind::kMul;
  c.block = 32;
  c.small = true;
  add(c);
  c = SMCase();
  c.in_place = true;
  c.kpm = MaskKind::kAdd;
  c.dtype = DType::kBF16;
  c.small = true;
  add(c);
  c = SMCase();
  c.strided = true;
  c.kpm = MaskKind::kMul;
  c.attn = MaskKind::kBool;
  c.dtype = DType::kF16;
  c.small = true;
  add(c);
  c = SMCase();
  c.R = 2;
  c.C = 5;
  c.rpe = RpeKind::kF32;
  c.kpm = MaskKind::kMul;
  c.attn = MaskKind::kBool;
  c.causal = true;
  add(c);
  c = SMCase();
  c.Z = c.H = c.R = c.C = 1;
  c.block = 128;
  c.small = true;
  add(c);
  // Many rows: more rows than one grid-stride pass of a small grid would cover is not needed
  // (the grid covers every row), but a long row (16 blocks) exercises the lanes' loop.
  c = SMCase();
  c.R = 4;
  c.C = 16;
  c.block = 64;
  c.Z = 1;
  c.dtype = DType::kBF16;
  c.kpm = MaskKind::kAdd;
  add(c);
  return cases;
}

class SoftmaxCuda : public ::testing::TestWithParam<SMCase> {};

TEST_P(SoftmaxCuda, ForwardMatchesOracleAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const SMProblem p = make_sm_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  const SoftmaxProblem op = softmax_oracle_problem(p);
  const Vec want = sparse_blocks(softmax_oracle(op), p.layout, p.c.block);

  HostTensor cpu = p.c.in_place ? p.x : sparse_tensor(p.c, p.ix.nnz);
  ASSERT_TRUE(run_op(softmax_forward_params(p, p.x.view(), cpu.view(), p.rpe.view(), p.kpm.view(),
                                            p.attn.view()))
                  .ok());

  DeviceCopy x(p.x), rpe(p.rpe), kpm(p.kpm), attn(p.attn);
  HostTensor got = p.c.in_place ? p.x : sparse_tensor(p.c, p.ix.nnz), again = got;
  DeviceCopy y(got), y2(again);
  const Status s =
      run_gpu(softmax_forward_params(p, x.view(), y.view(), rpe.view(), kpm.view(), attn.view()));
  ASSERT_TRUE(s.ok()) << s.to_string();
  y.copy_to(got);
  EXPECT_TRUE(within_tolerance("y", got.values(), cpu.values(), want, p.c.dtype));
  EXPECT_EQ(got.touched_outside_view(), 0);
  ASSERT_TRUE(
      run_gpu(softmax_forward_params(p, x.view(), y2.view(), rpe.view(), kpm.view(), attn.view()))
          .ok());
  y2.copy_to(again);
  EXPECT_TRUE(same_storage(got, again)) << "a second run gave different bits";
}

TEST_P(SoftmaxCuda, BackwardMatchesOracle) {
  SKIP_WITHOUT_GPU();
  const SMProblem p = make_sm_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  // y: the CPU forward's output, the input both backwards get.
  HostTensor y = sparse_tensor(p.c, p.ix.nnz);
  SMProblem fwd_p = p;
  fwd_p.c.in_place = false;
  ASSERT_TRUE(run_op(softmax_forward_params(fwd_p, p.x.view(), y.view(), p.rpe.view(), p.kpm.view(),
                                            p.attn.view()))
                  .ok());
  const Dense4 y_log = sparse_logical(packed_copy(y), p.layout, p.c.block);
  const Dense4 dy_log = sparse_logical(packed_copy(p.dy), p.layout, p.c.block);
  const Vec want = sparse_blocks(
      softmax_backward_oracle(p.layout, p.c.block, p.c.scale, y_log, dy_log), p.layout, p.c.block);

  HostTensor cpu = p.c.in_place ? p.dy : sparse_tensor(p.c, p.ix.nnz);
  ASSERT_TRUE(run_op(softmax_backward_params(p, y.view(), p.c.in_place ? cpu.view() : p.dy.view(),
                                             cpu.view()))
                  .ok());

  DeviceCopy dy_dev(p.dy), y_dev(y);
  HostTensor got = p.c.in_place ? p.dy : sparse_tensor(p.c, p.ix.nnz);
  DeviceCopy dx(got);
  const Status s = run_gpu(softmax_backward_params(
      p, y_dev.view(), p.c.in_place ? dx.view() : dy_dev.view(), dx.view()));
  ASSERT_TRUE(s.ok()) << s.to_string();
  dx.copy_to(got);
  EXPECT_TRUE(within_tolerance("dx", got.values(), cpu.values(), want, p.c.dtype));
  EXPECT_EQ(got.touched_outside_view(), 0);
}

INSTANTIATE_TEST_SUITE_P(BlockSparse, SoftmaxCuda, ::testing::ValuesIn(sm_cases()),
                         [](const ::testing::TestParamInfo<SMCase>& param_info) {
                           return param_info.param.name();
                         });

// =================================================================================================
// Composite sparse attention
// =================================================================================================

struct ATCase {
  DType dtype = DType::kF32;
  int64_t block = 16, B = 2, H = 2, N = 3, D = 32;  // L = N * block
  AttnLayoutKind layout = AttnLayoutKind::kRandom;
  MaskKind kpm = MaskKind::kNone, attn = MaskKind::kNone;
  RpeKind rpe = RpeKind::kNone;
  bool causal = false, small = false;
  std::optional<float> scale;
  QkvStorage storage = QkvStorage::kPacked;
  int64_t split = 0;  // > 0: the index's work split re-made with pieces of this many blocks
  uint64_t seed = kBaseSeed;

  int64_t L() const { return N * block; }
  std::string name() const {
    static const char* layouts[] = {"random", "bigbird", "fixeduni"};
    std::string s = std::string(small ? "Small_" : "") + dtype_name(dtype) + "_b" +
                    std::to_string(block) + "_B" + std::to_string(B) + "H" + std::to_string(H) +
                    "L" + std::to_string(L()) + "D" + std::to_string(D) + "_" +
                    layouts[static_cast<int>(layout)] + "_kpm" + mask_name(kpm) + "_attn" +
                    mask_name(attn) + "_rpe" + rpe_name(rpe) + "_" + qkv_storage_name(storage);
    if (causal) s += "_causal";
    if (scale) s += "_scaled";
    if (split > 0) s += "_split" + std::to_string(split);
    return s + "_s" + std::to_string(seed - kBaseSeed);
  }
};

void PrintTo(const ATCase& c, std::ostream* os) {
  *os << c.name() << " " << seed_note(c.seed);
}

using ATProblem = AttentionSuiteProblem<ATCase>;

ATProblem make_at_problem(const ATCase& c) {
  ATProblem p = make_attention_problem(c, /*removed=*/0.2);
  if (c.split > 0) {
    EXPECT_TRUE(split_block_sparse_work(c.split, &p.ix).ok());
  }
  upload(p.ix);
  return p;
}

SparseAttentionForwardParams at_forward(const ATProblem& p, const AttnViews& in,
                                        const TensorView& out, const TensorView& lse) {
  return attention_forward_params(p.ix, in, out, lse,
                                  attention_options(p.c, SparseAttentionAlgorithm::kComposite));
}

SparseAttentionBackwardParams at_backward(const ATProblem& p, const AttnViews& in,
                                          const TensorView& out, const TensorView& lse,
                                          const TensorView& dq, const TensorView& dk,
                                          const TensorView& dv) {
  return attention_backward_params(p.ix, in, out, lse, dq, dk, dv,
                                   attention_options(p.c, SparseAttentionAlgorithm::kComposite));
}

std::vector<ATCase> at_cases() {
  std::vector<ATCase> cases;
  uint64_t seed = kBaseSeed + 2500;
  auto add = [&](ATCase c) {
    c.seed = seed++;
    cases.push_back(c);
  };
  // Each dtype at each block, with the masks, rpe, layouts and storages rotating through the
  // cases.
  const QkvStorage storages[] = {QkvStorage::kPacked, QkvStorage::kPadded, QkvStorage::kKeyT};
  int rot = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t block : {16, 32, 64, 128}) {
      ATCase c;
      c.dtype = dt;
      c.block = block;
      c.N = block >= 64 ? 3 : 4;  // BigBird's window needs 3 blocks
      c.B = block == 128 ? 1 : 2;
      c.D = block == 16 ? 64 : 32;
      c.layout = static_cast<AttnLayoutKind>(rot % 3);
      c.kpm = static_cast<MaskKind>(rot % 4);
      c.attn = static_cast<MaskKind>((rot + 2) % 4);
      c.rpe = static_cast<RpeKind>(rot % 4);
      c.storage = storages[rot % 3];
      c.causal = rot % 5 == 1;
      if (rot % 3 == 2) c.scale = 0.3f;
      ++rot;
      add(c);
    }
  }
  // The sanitizer subset: small, with every feature at least once.
  ATCase c;
  c.small = true;
  c.dtype = DType::kBF16;
  c.kpm = MaskKind::kBool;
  c.attn = MaskKind::kMul;
  c.rpe = RpeKind::kBroadcast;
  c.causal = true;
  c.storage = QkvStorage::kKeyT;
  add(c);
  c = ATCase();
  c.small = true;
  c.dtype = DType::kF16;
  c.D = 17;  // a head dim that is not a multiple of 16
  c.B = 1;
  c.H = 3;
  c.kpm = MaskKind::kAdd;
  c.rpe = RpeKind::kF32;
  c.storage = QkvStorage::kPadded;
  add(c);
  c = ATCase();
  c.small = true;
  c.layout = AttnLayoutKind::kFixedUni;
  c.causal = true;
  c.N = 4;
  c.D = 8;
  add(c);
  // Split lines in all four dsd products (P V, P^T dO, dW K, dW^T Q): BigBird's global lines cut
  // into pieces of two blocks, per-head layouts, fp32 (FMA) and bf16 (split TF32).
  c = ATCase();
  c.small = true;
  c.layout = AttnLayoutKind::kBigBird;
  c.N = 6;
  c.H = 3;
  c.split = 2;
  c.kpm = MaskKind::kAdd;
  add(c);
  c.dtype = DType::kBF16;
  c.block = 32;
  c.D = 64;
  c.B = 1;
  c.split = 1;
  c.small = false;
  c.causal = true;
  add(c);
  // 65,536 tokens (the issue's longest length): BigBird at block 64, one head, through sdd ->
  // softmax -> dsd (a sparse tensor of 25 M elements).
  c = ATCase();
  c.dtype = DType::kBF16;
  c.layout = AttnLayoutKind::kBigBird;
  c.block = 64;
  c.N = 1024;
  c.B = 1;
  c.H = 1;
  c.D = 64;
  c.kpm = MaskKind::kAdd;
  add(c);
  return cases;
}

class CompositeCuda : public ::testing::TestWithParam<ATCase> {};

TEST_P(CompositeCuda, ForwardAndBackwardMatchOracleAndAreDeterministic) {
  SKIP_WITHOUT_GPU();
  const ATProblem p = make_at_problem(GetParam());
  SCOPED_TRACE(p.c.name() + " " + seed_note(p.c.seed));
  const AttnProblem a = attention_oracle_problem(p);
  const AttnForward of = attention_oracle(a);
  const AttnGrads og = attention_backward_oracle(a, dense_op(p.dout, false));

  // lowp_ref: the CPU composite on the same inputs.
  const AttnViews host = host_views(p);
  HostTensor out_cpu = qkv_tensor(p.c);
  HostTensor lse_cpu = lse_tensor(p.c);
  ASSERT_TRUE(run_op(at_forward(p, host, out_cpu.view(), lse_cpu.view())).ok());
  HostTensor dq_cpu = qkv_tensor(p.c), dk_cpu = qkv_tensor(p.c), dv_cpu = qkv_tensor(p.c);
  ASSERT_TRUE(run_op(at_backward(p, host, out_cpu.view(), lse_cpu.view(), dq_cpu.view(),
                                 dk_cpu.view(), dv_cpu.view()))
                  .ok());

  DeviceCopy q(p.q), k(p.k), v(p.v), rpe(p.rpe), kpm(p.kpm), attn(p.attn), dout(p.dout);
  const AttnViews dev{q.view(),   k.view(),    v.view(),   rpe.view(),
                      kpm.view(), attn.view(), dout.view()};
  HostTensor out = qkv_tensor(p.c);
  HostTensor lse = lse_tensor(p.c);
  HostTensor dq = qkv_tensor(p.c), dk = qkv_tensor(p.c), dv = qkv_tensor(p.c);
  HostTensor out2 = out, lse2 = lse, dq2 = dq, dk2 = dk, dv2 = dv;
  {
    DeviceCopy d_out(out), d_lse(lse), d_dq(dq), d_dk(dk), d_dv(dv);
    Status s = run_gpu(at_forward(p, dev, d_out.view(), d_lse.view()), /*misalign=*/true);
    ASSERT_TRUE(s.ok()) << s.to_string();
    s = run_gpu(
        at_backward(p, dev, d_out.view(), d_lse.view(), d_dq.view(), d_dk.view(), d_dv.view()));
    ASSERT_TRUE(s.ok()) << s.to_string();
    d_out.copy_to(out);
    d_lse.copy_to(lse);
    d_dq.copy_to(dq);
    d_dk.copy_to(dk);
    d_dv.copy_to(dv);
  }
  EXPECT_TRUE(within_tolerance("out", out.values(), out_cpu.values(), of.out.v, p.c.dtype));
  EXPECT_TRUE(within_tolerance("lse", lse.values(), lse_cpu.values(), of.lse, DType::kF32));
  EXPECT_TRUE(within_tolerance("dq", dq.values(), dq_cpu.values(), og.dq.v, p.c.dtype));
  EXPECT_TRUE(within_tolerance("dk", dk.values(), dk_cpu.values(), og.dk.v, p.c.dtype));
  EXPECT_TRUE(within_tolerance("dv", dv.values(), dv_cpu.values(), og.dv.v, p.c.dtype));
  EXPECT_EQ(out.touched_outside_view() + dq.touched_outside_view() + dk.touched_outside_view() +
                dv.touched_outside_view(),
            0);

  // Again on a stream of its own: the same bytes.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    DeviceCopy d_out(out2), d_lse(lse2), d_dq(dq2), d_dk(dk2), d_dv(dv2);
    ASSERT_TRUE(run_gpu(at_forward(p, dev, d_out.view(), d_lse.view()), false, stream).ok());
    ASSERT_TRUE(run_gpu(at_backward(p, dev, d_out.view(), d_lse.view(), d_dq.view(), d_dk.view(),
                                    d_dv.view()),
                        false, stream)
                    .ok());
    d_out.copy_to(out2);
    d_lse.copy_to(lse2);
    d_dq.copy_to(dq2);
    d_dk.copy_to(dk2);
    d_dv.copy_to(dv2);
  }
  cudaStreamDestroy(stream);
  EXPECT_TRUE(same_storage(out, out2));
  EXPECT_TRUE(same_storage(lse, lse2));
  EXPECT_TRUE(same_storage(dq, dq2));
  EXPECT_TRUE(same_storage(dk, dk2));
  EXPECT_TRUE(same_storage(dv, dv2));
}

INSTANTIATE_TEST_SUITE_P(BlockSparse, CompositeCuda, ::testing::ValuesIn(at_cases()),
                         [](const ::testing::TestParamInfo<ATCase>& param_info) {
                           return param_info.param.name();
                         });

// =================================================================================================
// Rejections and edge cases
// =================================================================================================

// CUDA tensors with an index that was never uploaded: every op refuses, naming `index`.
TEST(BlockSparseCudaSmall, IndexNotUploadedIsRejected) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(kBaseSeed + 2700);
  const Layout layout = random_layout(1, 2, 2, 0.7, rng);
  const BlockSparseIndex ix = make_index(layout, 16);  // not uploaded
  HostTensor x = HostTensor::packed(DType::kF32, {1, ix.nnz, 16, 16});
  HostTensor dense = HostTensor::packed(DType::kF32, {1, 1, 32, 32});
  test::fill_normal(x, rng);
  test::fill_normal(dense, rng);
  HostTensor y = HostTensor::packed(DType::kF32, {1, ix.nnz, 16, 16});
  DeviceCopy dx(x), dd(dense), dy(y);

  BlockSparseMatMulParams mm;
  mm.index = &ix;
  mm.mode = BlockSparseMatMulMode::kSdd;
  mm.a = dd.view();
  mm.b = dd.view();
  mm.c = dy.view();
  std::string why;
  EXPECT_EQ(can_implement(mm, &why).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(why, "index")) << why;
  EXPECT_TRUE(mentions(why, "upload_block_sparse_index")) << why;
  EXPECT_FALSE(run(mm, nullptr, 0).ok());

  BlockSparseSoftmaxParams sm;
  sm.index = &ix;
  sm.x = dx.view();
  sm.y = dy.view();
  EXPECT_EQ(can_implement(sm, &why).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(why, "index")) << why;
  EXPECT_FALSE(run(sm, nullptr, 0).ok());
}

// A sparse tensor of more than 2^31 - 1 elements per batch (a dense 1,024 x 1,024 layout of 64 x
// 64 blocks: 4 G elements, 8 GB in bf16): the GPU MatMul and Softmax refuse it, naming the limit
// and the fused attention, which accepts the same index (it never forms the sparse tensor). Only
// the checks run; the buffers are allocated at their full sizes (so that no view reaches past its
// allocation) but never written. Not in the sanitizer subset (8 GB).
TEST(BlockSparseCudaLimits, SparseTensorPast2To31IsRefusedByTheOpsNotByTheFusedAttention) {
  SKIP_WITHOUT_GPU();
  Layout layout = Layout::zeros(1, 1024, 1024);
  std::fill(layout.blocks.begin(), layout.blocks.end(), uint8_t{1});
  BlockSparseIndex ix = make_index(layout, 64);
  upload(ix);
  const int64_t L = 1024 * 64, D = 64;
  const size_t dense_bytes = static_cast<size_t>(L * D) * 2;
  const size_t sparse_bytes = static_cast<size_t>(ix.nnz) * 64 * 64 * 2;
  DeviceBuffer a(dense_bytes), b(dense_bytes), c(sparse_bytes);
  ASSERT_NE(c.ptr, nullptr) << "could not allocate " << sparse_bytes << " bytes";
  BlockSparseMatMulParams mm;
  mm.index = &ix;
  mm.mode = BlockSparseMatMulMode::kSdd;
  mm.a = TensorView::contiguous(a.ptr, DType::kBF16, {1, 1, L, D}, Device::kCuda);
  mm.b = TensorView::contiguous(b.ptr, DType::kBF16, {1, 1, D, L}, Device::kCuda);
  mm.c = TensorView::contiguous(c.ptr, DType::kBF16, {1, ix.nnz, 64, 64}, Device::kCuda);
  std::string why;
  EXPECT_EQ(can_implement(mm, &why).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(why, "2^31 - 1 elements")) << why;
  EXPECT_TRUE(mentions(why, "fused")) << why;

  BlockSparseSoftmaxParams sm;  // in place
  sm.index = &ix;
  sm.x = sm.y = mm.c;
  EXPECT_EQ(can_implement(sm, &why).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(why, "2^31 - 1 elements")) << why;

  SparseAttentionForwardParams fa;
  fa.index = &ix;
  fa.q = fa.k = fa.v = mm.a;
  fa.out = TensorView::contiguous(b.ptr, DType::kBF16, {1, 1, L, D}, Device::kCuda);
  EXPECT_TRUE(can_implement(fa, &why).ok()) << why;
}

// A layout with a single block: every other block row is empty, and the dsd must write zeros
// there (head 0 has no block at all, so all of its output is exactly 0).
BlockSparseMatMulParams dsd_params(const BlockSparseIndex& ix, const TensorView& s,
                                   const TensorView& y, const TensorView& out) {
  BlockSparseMatMulParams f;
  f.index = &ix;
  f.mode = BlockSparseMatMulMode::kDsd;
  f.a = s;
  f.b = y;
  f.c = out;
  return f;
}

TEST(BlockSparseCudaSmall, DsdOfAnEmptyLineWritesZeros) {
  SKIP_WITHOUT_GPU();
  Layout layout = Layout::zeros(2, 3, 2);
  layout.at(1, 2, 0) = 1;  // one block: every other line of either head is empty
  BlockSparseIndex ix = make_index(layout, 32);
  upload(ix);
  std::mt19937_64 rng(kBaseSeed + 2710);
  HostTensor s = HostTensor::packed(DType::kBF16, {2, ix.nnz, 32, 32});
  HostTensor y = HostTensor::packed(DType::kBF16, {2, 2, 64, 5});
  test::fill_normal(s, rng);
  test::fill_normal(y, rng);
  HostTensor out = HostTensor::packed(DType::kBF16, {2, 2, 96, 5});
  DeviceCopy ds(s), dy(y), dout(out);
  const BlockSparseMatMulParams f = dsd_params(ix, ds.view(), dy.view(), dout.view());
  ASSERT_TRUE(run_gpu(f).ok());
  dout.copy_to(out);
  const Vec got = out.values();
  const Dense4 want = matmul(sparse_logical(s, layout, 32), dense_op(y, false));
  EXPECT_TRUE(within_tolerance("out", got, rounded(want.v, DType::kBF16), want.v, DType::kBF16));
  // Rows of head 0 are all zeros, exactly.
  for (int64_t z = 0; z < 2; ++z)
    for (int64_t i = 0; i < 96 * 5; ++i) {
      EXPECT_EQ(got[static_cast<size_t>(z * 2 * 96 * 5 + i)], 0.0) << "z " << z << " element " << i;
    }
}

// A layout without any block (docs/block_sparse_ops.md: valid): sdd has nothing to write, dsd
// and dds write zeros, the Softmax forward and backward do nothing; the empty sparse tensors have
// null pointers. The index of an empty layout uploads too.
TEST(BlockSparseCudaSmall, EmptyLayoutGivesEmptyOrZeroResults) {
  SKIP_WITHOUT_GPU();
  BlockSparseIndex ix = make_index(Layout::zeros(2, 3, 2), 32);
  ASSERT_EQ(ix.nnz, 0);
  upload(ix);
  std::mt19937_64 rng(kBaseSeed + 2711);
  const TensorView sparse =
      TensorView::contiguous(nullptr, DType::kBF16, {2, 0, 32, 32}, Device::kCuda);
  HostTensor a = HostTensor::packed(DType::kBF16, {2, 2, 96, 8});
  HostTensor b = HostTensor::packed(DType::kBF16, {2, 2, 8, 64});
  HostTensor y = HostTensor::packed(DType::kBF16, {2, 2, 64, 5});
  HostTensor x = HostTensor::packed(DType::kBF16, {2, 2, 7, 96});
  for (HostTensor* t : {&a, &b, &y, &x}) test::fill_normal(*t, rng);
  HostTensor dsd_out = HostTensor::packed(DType::kBF16, {2, 2, 96, 5});  // NaN-poisoned
  HostTensor dds_out = HostTensor::packed(DType::kBF16, {2, 2, 7, 64});
  DeviceCopy da(a), db(b), dy(y), dx(x), d_dsd(dsd_out), d_dds(dds_out);

  BlockSparseMatMulParams sdd;
  sdd.index = &ix;
  sdd.mode = BlockSparseMatMulMode::kSdd;
  sdd.a = da.view();
  sdd.b = db.view();
  sdd.c = sparse;
  Status st = run_gpu(sdd);
  ASSERT_TRUE(st.ok()) << st.to_string();
  st = run_gpu(dsd_params(ix, sparse, dy.view(), d_dsd.view()));
  ASSERT_TRUE(st.ok()) << st.to_string();
  BlockSparseMatMulParams dds;
  dds.index = &ix;
  dds.mode = BlockSparseMatMulMode::kDds;
  dds.a = dx.view();
  dds.b = sparse;
  dds.c = d_dds.view();
  st = run_gpu(dds);
  ASSERT_TRUE(st.ok()) << st.to_string();
  d_dsd.copy_to(dsd_out);
  d_dds.copy_to(dds_out);
  for (double v : dsd_out.values()) ASSERT_EQ(v, 0.0);
  for (double v : dds_out.values()) ASSERT_EQ(v, 0.0);

  BlockSparseSoftmaxParams sm;
  sm.index = &ix;
  sm.x = sparse;
  sm.y = sparse;
  st = run_gpu(sm);
  ASSERT_TRUE(st.ok()) << st.to_string();
  BlockSparseSoftmaxBackwardParams smb;
  smb.index = &ix;
  smb.y = sparse;
  smb.dy = sparse;
  smb.dx = sparse;
  st = run_gpu(smb);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

// The Softmax kernel's merge of the lanes' (max, sum) pairs must not take a row of NaN scores
// (max -inf, sum NaN) for a fully masked one (max -inf, sum 0): a NaN score makes its row NaN,
// and only its row; a fully masked row is still 0 (cpu/nan_semantics_util.h).
TEST(BlockSparseCudaSmall, SoftmaxNanScoreReachesItsRowOnly) {
  SKIP_WITHOUT_GPU();
  Layout layout = Layout::zeros(2, 3, 3);
  layout.at(0, 0, 0) = layout.at(0, 1, 0) = layout.at(0, 1, 1) = layout.at(0, 2, 2) = 1;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 3; ++c) layout.at(1, r, c) = 1;
  BlockSparseIndex ix = make_index(layout, 16);
  upload(ix);
  const int64_t L = 48;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937_64 rng(kBaseSeed + 2712);
    HostTensor x = HostTensor::packed(dtype, {2, ix.nnz, 16, 16});
    test::fill_normal(x, rng);
    // Batch 1: every score of row 4 of head 0's block row 1 (blocks 1 and 2) is NaN, so no lane
    // sees a finite score; and one score of its row 9, beside finite ones.
    for (int64_t c = 0; c < 16; ++c) {
      x.set(((1 * ix.nnz + 1) * 16 + 4) * 16 + c, std::numeric_limits<double>::quiet_NaN());
      x.set(((1 * ix.nnz + 2) * 16 + 4) * 16 + c, std::numeric_limits<double>::quiet_NaN());
    }
    x.set(((1 * ix.nnz + 1) * 16 + 9) * 16 + 2, std::numeric_limits<double>::quiet_NaN());
    HostTensor kpm = HostTensor::packed(DType::kF32, {2, L});
    for (int64_t j = 0; j < 2 * L; ++j) kpm.set(j, j < L ? -kInf : 0.0);  // batch 0 masked
    HostTensor y = HostTensor::packed(dtype, {2, ix.nnz, 16, 16});
    DeviceCopy dx(x), dkpm(kpm), dy(y);
    BlockSparseSoftmaxParams p;
    p.index = &ix;
    p.x = dx.view();
    p.y = dy.view();
    p.key_padding_mask = dkpm.view();
    const Status st = run_gpu(p);
    ASSERT_TRUE(st.ok()) << st.to_string();
    dy.copy_to(y);
    const std::vector<int64_t> sizes = {2, ix.nnz, 16, 16};
    EXPECT_TRUE(test::nan_exactly_where("y", y.values(), [&](int64_t e) {
      const auto at = test::unravel(e, sizes);
      // Rows 4 and 9 of the blocks of head 0's block row 1 (blocks 1 and 2), batch 1.
      return at[0] == 1 && (at[1] == 1 || at[1] == 2) && (at[2] == 4 || at[2] == 9);
    }));
    const std::vector<double> got = y.values();
    for (int64_t e = 0; e < ix.nnz * 256; ++e) {
      ASSERT_EQ(got[static_cast<size_t>(e)], 0.0) << "batch 0 is fully masked; element " << e;
    }
  }
}

// A dsd whose index splits a line asks for the partial sums' workspace (none without a split)
// and refuses a smaller one, naming the workspace, before launching anything.
TEST(BlockSparseCudaSmall, DsdWithSplitLinesNeedsItsWorkspace) {
  SKIP_WITHOUT_GPU();
  Layout layout = Layout::zeros(1, 2, 4);
  for (int64_t c = 0; c < 4; ++c) layout.at(0, 0, c) = 1;  // block row 0: four blocks
  layout.at(0, 1, 2) = 1;
  BlockSparseIndex ix = make_index(layout, 16);
  upload(ix);
  HostTensor s = HostTensor::packed(DType::kF32, {1, ix.nnz, 16, 16});
  HostTensor y = HostTensor::packed(DType::kF32, {1, 1, 64, 8});
  HostTensor out = HostTensor::packed(DType::kF32, {1, 1, 32, 8});
  DeviceCopy ds(s), dy(y), dout(out);
  const BlockSparseMatMulParams f = dsd_params(ix, ds.view(), dy.view(), dout.view());
  EXPECT_EQ(workspace_size(f), 0u) << "no line is split by default";

  ASSERT_TRUE(split_block_sparse_work(1, &ix).ok());
  upload(ix);
  // Row 0 in four pieces, each a 16 x 8 fp32 partial (plus the alignment slack).
  const size_t needed = workspace_size(f);
  EXPECT_GE(needed, size_t{4 * 16 * 8 * sizeof(float)});
  EXPECT_LE(needed, size_t{4 * 16 * 8 * sizeof(float) + 128});
  DeviceBuffer ws(needed);
  const Status small = run(f, ws.ptr, needed - 1, Stream{});
  EXPECT_EQ(small.code(), StatusCode::kWorkspaceTooSmall) << small.to_string();
  EXPECT_TRUE(mentions(small.message(), "workspace")) << small.to_string();
  const Status none = run(f, nullptr, needed, Stream{});
  EXPECT_FALSE(none.ok());
  EXPECT_TRUE(mentions(none.message(), "workspace")) << none.to_string();
  EXPECT_TRUE(run_gpu(f).ok());
}

}  // namespace
}  // namespace sciattn

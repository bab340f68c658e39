// Evoformer attention on the GPU (label gpu): the CUDA kernels against the fp64 oracle with the
// tolerance rule (the CPU reference gives lowp_ref), on the cases of the CPU suites plus the
// GPU's own (every padded head dim, B*N > 65535, fully masked rows); bitwise determinism; every
// output element written (outputs are NaN-poisoned). Each test skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "common/evoformer_cuda_plan.h"
#include "cpu/evoformer_nan_checks.h"
#include "cpu/evoformer_test_util.h"
#include "cuda/cuda_test_util.h"
#include "sciattn/device.h"

namespace sciattn::test {
namespace {

// One GPU forward + backward of a case: the outputs copied back to the host.
struct GpuResult {
  Status forward_status, backward_status;
  HostTensor out, lse, dq, dk, dv, dbias1, dbias2;
};

// The forward's params over device copies of a case's inputs and outputs.
EvoformerForwardParams device_forward_params(const DeviceCopy& q, const DeviceCopy& k,
                                             const DeviceCopy& v, const DeviceCopy& bias1,
                                             const DeviceCopy& bias2, const DeviceCopy& out,
                                             const DeviceCopy& lse) {
  EvoformerForwardParams f;
  f.q = q.view();
  f.k = k.view();
  f.v = v.view();
  f.bias1 = bias1.view();
  f.bias2 = bias2.view();
  f.out = out.view();
  f.lse = lse.view();
  return f;
}

GpuResult run_gpu(const EvoInputs& in, bool want_dbias1, bool want_dbias2) {
  const EvoConfig& cfg = in.cfg;
  GpuResult r;
  DeviceCopy q(in.q), k(in.k), v(in.v), bias1(in.bias1), bias2(in.bias2), dout(in.dout);
  r.out = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  r.lse = HostTensor::packed(DType::kF32, cfg.shape.lse());
  DeviceCopy out(r.out), lse(r.lse);
  EvoformerForwardParams f = device_forward_params(q, k, v, bias1, bias2, out, lse);
  f.options.scale = cfg.scale;
  const size_t fwd_ws_bytes = workspace_size(f);
  DeviceBuffer fwd_ws(fwd_ws_bytes, /*poison=*/true);
  r.forward_status = run(f, fwd_ws.ptr, fwd_ws_bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.copy_to(r.out);
  lse.copy_to(r.lse);
  if (!r.forward_status.ok()) return r;

  r.dq = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  r.dk = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  r.dv = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  if (want_dbias1) r.dbias1 = make_tensor(in.bias1.dtype(), cfg.shape.bias1(), cfg.out_layout);
  if (want_dbias2) r.dbias2 = make_tensor(in.bias2.dtype(), cfg.shape.bias2(), cfg.out_layout);
  DeviceCopy dq(r.dq), dk(r.dk), dv(r.dv), dbias1(r.dbias1), dbias2(r.dbias2);
  const EvoformerBackwardParams b = backward_params_of(f, dout.view(), dq.view(), dk.view(),
                                                       dv.view(), dbias1.view(), dbias2.view());
  const size_t ws_bytes = workspace_size(b);
  DeviceBuffer ws(ws_bytes);
  r.backward_status = run(b, ws.ptr, ws_bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dq.copy_to(r.dq);
  dk.copy_to(r.dk);
  dv.copy_to(r.dv);
  dbias1.copy_to(r.dbias1);
  dbias2.copy_to(r.dbias2);
  return r;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  if (a.present() != b.present()) return false;
  return !a.present() || std::memcmp(a.base(), b.base(), a.storage_bytes()) == 0;
}

// The whole check of one case: GPU vs fp64 oracle with the CPU reference as lowp_ref, and the
// GPU run twice giving identical bytes.
void check_inputs(const EvoInputs& in) {
  const EvoConfig& cfg = in.cfg;
  SCOPED_TRACE(cfg.str());
  const bool want_dbias1 = in.bias1.present() && in.bias1.dtype() != DType::kBool;
  const bool want_dbias2 = in.bias2.present();
  const NaiveProblem naive = to_naive(in);
  const NaiveForward f64 = naive_forward(naive);
  const NaiveGrads g64 = naive_backward(naive, in.dout.values());
  const ForwardRun fref = run_forward(in, EvoformerCpuAlgorithm::kReference);
  ASSERT_TRUE(fref.status.ok()) << fref.status.to_string();
  const BackwardRun bref = run_backward(in, fref.out, fref.lse, EvoformerCpuAlgorithm::kReference,
                                        0, want_dbias1, want_dbias2);
  ASSERT_TRUE(bref.status.ok()) << bref.status.to_string();

  const GpuResult gpu = run_gpu(in, want_dbias1, want_dbias2);
  ASSERT_TRUE(gpu.forward_status.ok()) << gpu.forward_status.to_string();
  ASSERT_TRUE(gpu.backward_status.ok()) << gpu.backward_status.to_string();
  EXPECT_TRUE(within_tolerance("out", gpu.out.values(), fref.out.values(), f64.out, cfg.dtype));
  EXPECT_TRUE(within_tolerance("lse", gpu.lse.values(), fref.lse.values(), f64.lse, cfg.dtype));
  EXPECT_TRUE(within_tolerance("dq", gpu.dq.values(), bref.dq.values(), g64.dq, cfg.dtype));
  EXPECT_TRUE(within_tolerance("dk", gpu.dk.values(), bref.dk.values(), g64.dk, cfg.dtype));
  EXPECT_TRUE(within_tolerance("dv", gpu.dv.values(), bref.dv.values(), g64.dv, cfg.dtype));
  if (want_dbias1) {
    EXPECT_TRUE(bias_grad_within_tolerance("dbias1", gpu.dbias1.values(), bref.dbias1.values(),
                                           g64.dbias1, cfg.dtype));
  }
  if (want_dbias2) {
    EXPECT_TRUE(bias_grad_within_tolerance("dbias2", gpu.dbias2.values(), bref.dbias2.values(),
                                           g64.dbias2, cfg.dtype));
  }

  const GpuResult again = run_gpu(in, want_dbias1, want_dbias2);
  EXPECT_TRUE(same_bytes(gpu.out, again.out)) << "out differs between two runs";
  EXPECT_TRUE(same_bytes(gpu.lse, again.lse)) << "lse differs between two runs";
  EXPECT_TRUE(same_bytes(gpu.dq, again.dq)) << "dq differs between two runs";
  EXPECT_TRUE(same_bytes(gpu.dk, again.dk)) << "dk differs between two runs";
  EXPECT_TRUE(same_bytes(gpu.dv, again.dv)) << "dv differs between two runs";
  EXPECT_TRUE(same_bytes(gpu.dbias1, again.dbias1)) << "dbias1 differs between two runs";
  EXPECT_TRUE(same_bytes(gpu.dbias2, again.dbias2)) << "dbias2 differs between two runs";
}

void check_case(const EvoConfig& cfg) {
  check_inputs(make_inputs(cfg));
}

// The CPU suites' cases in every dtype (f16 and bf16 on tensor cores, f32 on the CUDA cores).
std::vector<EvoConfig> gpu_cases() {
  std::vector<EvoConfig> cases = all_cases(kBaseSeed + 50000, /*backward=*/true);
  // Every head dim the kernels pad (24 -> 32, 96 -> 128) and the instantiated ones (8 runs in
  // 16-wide tiles), at lengths that are not tile multiples.
  uint64_t seed = kBaseSeed + 60000;
  for (int64_t D : {8, 16, 24, 32, 64, 96, 128}) {
    for (int64_t L : {1, 17, 300}) {
      EvoConfig c;
      c.shape = {1, L == 300 ? 1 : 3, L, 2, D};
      c.dtype = (D + L) % 2 == 0 ? DType::kBF16 : DType::kF16;
      c.bias1 = Bias1Kind::kF32;
      c.bias2 = Bias2Kind::kSameAsQ;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // The lengths users bring (not multiples of 8: bias rows that start off 16-byte boundaries,
  // which the kernels read through a padded copy) in every bias combination, with the head dims
  // padded to 32, 64 and 128 and an instantiated one spread over them.
  const int64_t kUnalignedDims[] = {24, 40, 48, 96, 32};
  int spread = 0;
  for (int64_t L : {257, 300, 321, 383, 500}) {
    for (Bias1Kind b1 :
         {Bias1Kind::kNone, Bias1Kind::kSameAsQ, Bias1Kind::kF32, Bias1Kind::kBool}) {
      for (Bias2Kind b2 : {Bias2Kind::kNone, Bias2Kind::kSameAsQ, Bias2Kind::kF32}) {
        EvoConfig c;
        c.shape = {1, 2, L, 2, kUnalignedDims[spread % 5]};
        c.dtype = spread % 2 == 0 ? DType::kBF16 : DType::kF16;
        c.bias1 = b1;
        c.bias2 = b2;
        c.seed = seed++;
        cases.push_back(c);
        ++spread;
      }
    }
  }
  // Head dims padded in whole chunks (PaddedDimTypes on the warpgroup kernels) read from the
  // first D columns of wider rows whose columns past D are poisoned: a copy that reads past D
  // instead of zero-filling there turns the products into NaN.
  for (int64_t D : {24, 48, 120}) {
    for (int64_t L : {129, 300}) {
      EvoConfig c;
      c.shape = {1, 2, L, 2, D};
      c.dtype = L == 129 ? DType::kBF16 : DType::kF16;
      c.bias1 = Bias1Kind::kSameAsQ;
      c.bias2 = D == 48 ? Bias2Kind::kNone : Bias2Kind::kSameAsQ;
      c.in_layout = Layout::kWideRows;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // Head dims that are not multiples of 8, read from staged copies with rows of D rounded up to
  // 8 (detail::CudaInputCopies), the outputs written at D.
  for (int64_t D : {20, 33, 34, 63, 100, 127}) {
    for (int64_t L : {129, 300}) {
      EvoConfig c;
      c.shape = {1, 2, L, 2, D};
      c.dtype = (D + L) % 2 == 0 ? DType::kBF16 : DType::kF16;
      c.bias1 = L == 129 ? Bias1Kind::kBool : Bias1Kind::kSameAsQ;
      c.bias2 = D % 2 == 0 ? Bias2Kind::kSameAsQ : Bias2Kind::kF32;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // Head dims near their head dim that are not multiples of 8, whose forward reads Q, K and V
  // where they are, in 4-byte pieces (InPlaceDimTypes: an even D; an odd D in shifted slices,
  // whose column before each row, in wide rows a poisoned one, is zeroed), with every bias pair
  // those kernels compile (each absent or in the inputs' dtype); the backward reads staged copies.
  for (int64_t D : {26, 31, 58, 63, 116, 127}) {
    for (int pair = 0; pair < 4; ++pair) {  // bit 0: bias1, bit 1: bias2
      EvoConfig c;
      c.shape = {1, 2, pair % 2 == 0 ? 300 : 129, 2, D};
      c.dtype = (D + pair) % 2 == 0 ? DType::kBF16 : DType::kF16;
      c.bias1 = pair & 1 ? Bias1Kind::kSameAsQ : Bias1Kind::kNone;
      c.bias2 = pair & 2 ? Bias2Kind::kSameAsQ : Bias2Kind::kNone;
      c.in_layout = pair == 1 ? Layout::kPacked : Layout::kWideRows;
      c.out_layout = pair == 2 ? Layout::kPadded : Layout::kPacked;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // Lengths that are multiples of 8 but not of 64: both 16-bit biases read in place, the last
  // query and key tiles through the masked streams (rows past L and bias chunks past the rows'
  // ends zero-filled).
  int alternate = 0;
  for (int64_t L : {200, 328}) {
    for (int64_t D : {32, 64}) {
      EvoConfig c;
      c.shape = {1, 2, L, 2, D};
      c.dtype = alternate++ % 3 == 0 ? DType::kBF16 : DType::kF16;
      c.bias1 = Bias1Kind::kSameAsQ;
      c.bias2 = Bias2Kind::kSameAsQ;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // Several key and query tiles with triangle-attention head counts.
  EvoConfig tri;
  tri.shape = {1, 3, 200, 4, 32};
  tri.dtype = DType::kBF16;
  tri.bias1 = Bias1Kind::kBool;
  tri.bias2 = Bias2Kind::kSameAsQ;
  tri.in_layout = Layout::kTransposedNL;
  tri.seed = seed++;
  cases.push_back(tri);
  return cases;
}

class EvoformerCuda : public ::testing::TestWithParam<EvoConfig> {};

TEST_P(EvoformerCuda, MatchesOracleAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  check_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, EvoformerCuda, ::testing::ValuesIn(gpu_cases()), CaseName());

TEST(EvoformerCudaEdges, BatchTimesNAbove65535) {
  SKIP_WITHOUT_GPU();
  EvoConfig c;
  c.shape = {2, 33000, 3, 1, 8};  // B*N = 66000 > 65535, DeepSpeed's grid limit
  c.dtype = DType::kBF16;
  c.bias1 = Bias1Kind::kSameAsQ;
  c.bias2 = Bias2Kind::kSameAsQ;
  c.seed = kBaseSeed + 70000;
  check_case(c);
}

TEST(EvoformerCudaEdges, FullyMaskedRowsGiveZeroNotNaN) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF16, DType::kBF16}) {
    EvoConfig c;
    c.shape = {1, 4, 70, 2, 32};
    c.dtype = dt;
    c.bias1 = Bias1Kind::kBool;
    c.bias2 = Bias2Kind::kSameAsQ;
    c.mask_false_fraction = 1.0;  // every key of every row masked
    c.seed = kBaseSeed + 70001;
    check_case(c);
    // And mostly masked: some rows of some n keep a key or two.
    c.mask_false_fraction = 0.97;
    c.seed = kBaseSeed + 70002;
    check_case(c);
  }
}

// The CTAs of the last query rows read bias2's rows past L where they still lie inside the
// tensor's memory (EvoformerDeviceParams::bias2_reach): here the first L rows of rows of L + 64
// per head, the 64 past L NaN-poisoned. What they hold reaches only score rows past L, which are
// never written: outputs and gradients match the reference with no NaN. L = 200 (rows read in
// place, the last query tile 8 rows inside L) at head dims 32 and 64, every 16-bit bias1.
TEST(EvoformerCudaEdges, Bias2RowsPastLNeverReachTheOutputs) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = kBaseSeed + 70100;
  for (int64_t D : {32, 64}) {
    for (Bias1Kind b1 : {Bias1Kind::kNone, Bias1Kind::kSameAsQ, Bias1Kind::kBool}) {
      EvoConfig c;
      c.shape = {1, 2, 200, 3, D};
      c.dtype = D == 32 ? DType::kBF16 : DType::kF16;
      c.bias1 = b1;
      c.bias2 = Bias2Kind::kSameAsQ;
      c.seed = seed++;
      EvoInputs in = make_inputs(c);
      HostTensor rows = HostTensor::padded(c.dtype, in.bias2.sizes(), {0, 0, 0, 64, 0}, 0);
      for (int64_t i = 0; i < rows.numel(); ++i) rows.set(i, in.bias2.get(i));
      in.bias2 = rows;
      check_inputs(in);
    }
  }
}

// A NaN in q reaches its row's output, lse and gradients and nothing else, as on the CPU
// (cpu/evoformer_nan_checks.h), in every dtype: the kernels' fully-masked test must not take a
// NaN row for a masked one. Head dim 32 (the warpgroup kernels for 16-bit, in CI's instantiation
// list) and 24 (padded: the mma.sync kernels, in the gpu preset's lists).
TEST(EvoformerCudaEdges, NanInQReachesItsRowAndNothingElse) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t dim : {32, 24}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(dim));
      EvoInputs in = make_inputs(evoformer_nan_config(dt, dim));
      put_nan_in_q(in);
      const GpuResult r = run_gpu(in, true, true);
      if (r.forward_status.code() == StatusCode::kNotSupported) continue;  // not instantiated
      ASSERT_TRUE(r.forward_status.ok()) << r.forward_status.to_string();
      ASSERT_TRUE(r.backward_status.ok()) << r.backward_status.to_string();
      expect_forward_nan_in_row(in.cfg.shape, r.out.values(), r.lse.values());
      expect_backward_nan_from_row(in.cfg.shape, r.dq.values(), r.dk.values(), r.dv.values(),
                                   r.dbias1.values(), r.dbias2.values());
    }
  }
}

// V filled with 1e37 (bf16): whatever the scores, the output is the weighted mean of V's rows,
// 1e37, while a row's sum of P V terms passes fp32's largest value
// (cuda/common/probability_shift.h; before that shift these gave inf). Random q, k and biases move
// the row maxima from tile to tile; lse does not depend on V and is checked too. The warpgroup
// kernels (D 32, 64, 128; whole and unaligned lengths, an odd D) and the mma.sync ones (D 16,
// padded 24).
TEST(EvoformerCudaEdges, LargeBf16ValuesStayFinite) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = kBaseSeed + 70500;
  for (const auto& [L, D] : std::initializer_list<std::pair<int64_t, int64_t>>{
           {512, 32}, {300, 32}, {700, 64}, {257, 128}, {400, 16}, {300, 24}, {300, 33}}) {
    EvoConfig c;
    c.shape = {1, 2, L, 2, D};
    c.dtype = DType::kBF16;
    c.bias1 = Bias1Kind::kBool;
    c.bias2 = Bias2Kind::kSameAsQ;
    c.mask_false_fraction = 0.2;
    c.seed = seed++;
    SCOPED_TRACE(c.str());
    EvoInputs in = make_inputs(c);
    for (int64_t i = 0; i < in.v.numel(); ++i) in.v.set(i, 1e37);
    const NaiveForward f64 = naive_forward(to_naive(in));
    const ForwardRun fref = run_forward(in, EvoformerCpuAlgorithm::kReference);
    ASSERT_TRUE(fref.status.ok()) << fref.status.to_string();
    const GpuResult r = run_gpu(in, false, false);
    if (r.forward_status.code() == StatusCode::kNotSupported) continue;  // not instantiated
    ASSERT_TRUE(r.forward_status.ok()) << r.forward_status.to_string();
    EXPECT_TRUE(within_tolerance("out", r.out.values(), fref.out.values(), f64.out, c.dtype));
    EXPECT_TRUE(within_tolerance("lse", r.lse.values(), fref.lse.values(), f64.lse, c.dtype));
  }
}

TEST(EvoformerCudaEdges, Float32AtEveryHeadDimLimit) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = kBaseSeed + 70100;
  for (int64_t D : {1, 31, 32, 33, 128}) {
    EvoConfig c;
    c.shape = {1, 3, 70, 2, D};
    c.dtype = DType::kF32;
    c.bias1 = Bias1Kind::kBool;
    c.bias2 = Bias2Kind::kF32;
    c.mask_false_fraction = 0.3;
    c.seed = seed++;
    check_case(c);
  }
}

// Each bias-type instantiation of the warpgroup kernels (evoformer_bias_types.cuh: the fixed
// pairs, bias1 / bias2 in the inputs' dtype or absent, and the run-time one for the others) at
// head dims 32, 64 and 128, over whole key tiles (the streamed copies, bias1 through registers)
// and a partial last one (the generic copies), in f16 and bf16.
TEST(EvoformerCudaEdges, EveryBiasTypeInstantiation) {
  SKIP_WITHOUT_GPU();
  const std::pair<Bias1Kind, Bias2Kind> pairs[] = {
      {Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ}, {Bias1Kind::kSameAsQ, Bias2Kind::kNone},
      {Bias1Kind::kNone, Bias2Kind::kSameAsQ},    {Bias1Kind::kNone, Bias2Kind::kNone},
      {Bias1Kind::kBool, Bias2Kind::kSameAsQ},    {Bias1Kind::kF32, Bias2Kind::kF32}};
  uint64_t seed = kBaseSeed + 70300;
  for (int64_t D : {32, 64, 128}) {
    for (const auto& [b1, b2] : pairs) {
      EvoConfig c;
      c.shape = {1, 2, 200, 2, D};
      c.dtype = seed % 2 == 0 ? DType::kBF16 : DType::kF16;
      c.bias1 = b1;
      c.bias2 = b2;
      c.mask_false_fraction = 0.2;
      c.seed = seed++;
      SCOPED_TRACE(c.str());
      check_case(c);
    }
  }
}

TEST(EvoformerCudaEdges, Dbias2SplitOverNIntoChunks) {
  SKIP_WITHOUT_GPU();
  // One 64 x 64 tile of dbias2 and N = 40: the dbias2 kernel splits N into chunks whose partials
  // are added afterwards, in f16 and bf16.
  for (DType dt : {DType::kF16, DType::kBF16}) {
    EvoConfig c;
    c.shape = {1, 40, 50, 1, 32};
    c.dtype = dt;
    c.bias1 = Bias1Kind::kSameAsQ;
    c.bias2 = Bias2Kind::kF32;
    c.seed = kBaseSeed + 70200 + static_cast<uint64_t>(dt);
    check_case(c);
  }
}

// The fused dK/dV/dQ kernel (head dim 32, 16-bit, where the host plan takes it: many slices of a
// few tiles), with one CTA per slice and, where the slice's dQ does not fit two CTAs in an SM (an
// fp32 bias2 and L > 320), with clusters of two (CTA r the query tiles qt % 2 == r, partial dK, dV
// and dbias1 exchanged): partial last key tiles (L = 150, 200, 330, 420), an odd tile count in a
// cluster (7: the CTAs' shares differ), one tile, bias2 and none, bias1 as values (dbias1) and as
// a mask, a transposed layout.
struct FusedCase {
  EvoShape shape;
  DType dtype;
  Bias1Kind bias1;
  Bias2Kind bias2;
  Layout layout;
  // Whether two CTAs per SM fit with one and with two CTAs per slice
  // (evoformer_fused_backward_plan decides it from the shared memory), and the CTAs per slice
  // the plan takes then.
  bool fits[2];
  int64_t ranks;
};
const FusedCase kFusedCases[] = {
    {{1, 48, 150, 4, 32},
     DType::kBF16,
     Bias1Kind::kF32,
     Bias2Kind::kSameAsQ,
     Layout::kPacked,
     {true, true},
     1},
    {{1, 64, 200, 4, 32},
     DType::kF16,
     Bias1Kind::kBool,
     Bias2Kind::kNone,
     Layout::kPacked,
     {true, true},
     1},
    {{1, 33, 330, 4, 32},
     DType::kF16,
     Bias1Kind::kSameAsQ,
     Bias2Kind::kF32,
     Layout::kTransposedNL,
     {false, true},
     2},
    {{1, 33, 420, 4, 32},
     DType::kBF16,
     Bias1Kind::kF32,
     Bias2Kind::kF32,
     Layout::kPacked,
     {false, true},
     2},
    {{1, 24, 40, 4, 32},
     DType::kBF16,
     Bias1Kind::kBool,
     Bias2Kind::kSameAsQ,
     Layout::kPacked,
     {true, true},
     1},
    // The fixed bias types (evoformer_bias_types.cuh) with three query-tile buffers (L 150,
    // and 200 without bias2), two (L 360) and clusters of two (L 460).
    {{1, 48, 150, 4, 32},
     DType::kBF16,
     Bias1Kind::kSameAsQ,
     Bias2Kind::kSameAsQ,
     Layout::kPacked,
     {true, true},
     1},
    {{1, 50, 200, 4, 32},
     DType::kF16,
     Bias1Kind::kSameAsQ,
     Bias2Kind::kNone,
     Layout::kPacked,
     {true, true},
     1},
    {{1, 50, 360, 4, 32},
     DType::kBF16,
     Bias1Kind::kSameAsQ,
     Bias2Kind::kSameAsQ,
     Layout::kTransposedNL,
     {true, true},
     1},
    {{1, 33, 460, 4, 32},
     DType::kF16,
     Bias1Kind::kSameAsQ,
     Bias2Kind::kSameAsQ,
     Layout::kPacked,
     {false, true},
     2},
};

// The case as an EvoConfig with `seed`.
EvoConfig config_of(const FusedCase& fc, uint64_t seed) {
  EvoConfig c;
  c.shape = fc.shape;
  c.dtype = fc.dtype;
  c.bias1 = fc.bias1;
  c.bias2 = fc.bias2;
  c.in_layout = fc.layout;
  c.seed = seed;
  return c;
}

// Each case's name: its shape, dtype and bias kinds, so that a filter can pick the small ones
// (the sanitizers' runs).
std::string fused_case_name(const ::testing::TestParamInfo<FusedCase>& info) {
  return config_of(info.param, kBaseSeed).test_name() + "_" + std::to_string(info.index);
}
void PrintTo(const FusedCase& fc, std::ostream* os) {
  *os << "fused case L " << fc.shape.L << ", N " << fc.shape.N << ", CTAs per slice " << fc.ranks;
}

class EvoformerCudaFused : public ::testing::TestWithParam<FusedCase> {};

TEST_P(EvoformerCudaFused, BackwardOverKeyTiles) {
  SKIP_WITHOUT_GPU();
  const FusedCase& fc = GetParam();
  const EvoShape& s = fc.shape;
  ASSERT_EQ(detail::cuda_fused_backward_ranks({s.B, s.N, s.L, s.H, s.D}, fc.fits), fc.ranks)
      << "the plan no longer runs this shape on that cluster size: pick one it does";
  check_case(config_of(fc, kBaseSeed + 70400 + static_cast<uint64_t>(s.N * 1000 + s.L)));
}

INSTANTIATE_TEST_SUITE_P(Fused, EvoformerCudaFused, ::testing::ValuesIn(kFusedCases),
                         fused_case_name);

// On a device that runs the warpgroup kernels (sm_90, SCIATTN_CUDA_KERNELS unset) the forward of
// a D near its head dim reads Q, K and V in place, so its workspace holds no copy of them; a D
// below three quarters of the head dim, and the backward, keep the staged copies.
TEST(EvoformerCudaEdges, ForwardWorkspaceHoldsNoInputCopiesWhenReadInPlace) {
  SKIP_WITHOUT_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (prop.major != 9 || std::getenv("SCIATTN_CUDA_KERNELS") != nullptr) {
    GTEST_SKIP() << "the in-place forward runs on sm_90 with the default kernels";
  }
  const auto workspaces = [](int64_t d) {
    EvoConfig c;
    c.shape = {1, 2, 256, 2, d};  // L 256: the biases need no copy
    c.dtype = DType::kBF16;
    c.bias1 = Bias1Kind::kSameAsQ;
    c.bias2 = Bias2Kind::kSameAsQ;
    const EvoInputs in = make_inputs(c);
    DeviceCopy q(in.q), k(in.k), v(in.v), bias1(in.bias1), bias2(in.bias2), dout(in.dout);
    HostTensor out = make_tensor(c.dtype, c.shape.qkv(), c.out_layout);
    HostTensor lse = HostTensor::packed(DType::kF32, c.shape.lse());
    HostTensor dq = make_tensor(c.dtype, c.shape.qkv(), c.out_layout);
    HostTensor dk = make_tensor(c.dtype, c.shape.qkv(), c.out_layout);
    HostTensor dv = make_tensor(c.dtype, c.shape.qkv(), c.out_layout);
    DeviceCopy o(out), l(lse), gq(dq), gk(dk), gv(dv);
    const EvoformerForwardParams f = device_forward_params(q, k, v, bias1, bias2, o, l);
    const EvoformerBackwardParams b = backward_params_of(f, dout.view(), gq.view(), gk.view(),
                                                         gv.view(), TensorView{}, TensorView{});
    return std::pair<size_t, size_t>{workspace_size(f), workspace_size(b)};
  };
  const size_t copy_bytes = size_t{2} * 256 * 2 * 128 * 2;  // one staged [1, 2, 256, 2, 128]
  for (const int64_t d : {127, 116, 58, 31}) {
    const auto [forward, backward] = workspaces(d);
    EXPECT_EQ(forward, 0u) << d;
    EXPECT_GE(backward, 4 * (copy_bytes / 128) * static_cast<size_t>((d + 7) / 8 * 8)) << d;
  }
  EXPECT_GE(workspaces(33).first, 3 * (copy_bytes / 128) * 40);  // staged at 40 columns
}

TEST(EvoformerCudaEdges, HeadDimAbove128IsRejectedClearly) {
  SKIP_WITHOUT_GPU();
  EvoConfig c;
  c.shape = {1, 1, 8, 1, 160};
  c.dtype = DType::kBF16;
  const EvoInputs in = make_inputs(c);
  const GpuResult r = run_gpu(in, false, false);
  EXPECT_EQ(r.forward_status.code(), StatusCode::kNotSupported);
  EXPECT_NE(r.forward_status.message().find("128"), std::string::npos)
      << r.forward_status.message();
}

}  // namespace
}  // namespace sciattn::test

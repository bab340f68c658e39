// Google Benchmark of Evoformer attention on the GPU (CUDA events, after a warm-up): forward and
// forward + backward (with dbias2) at the shapes of PERFORMANCE.md, bf16 and f16. Reports ms,
// TFLOP/s (forward 4*S*D, backward 10*S*D, S = B*N*H*L*L) and the fraction of the H200's
// measured ceilings (790 TFLOP/s dense bf16, 3.9 T exp/s), and the call's extra memory.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <cstdio>
#include <vector>

#include "device_buffer.h"
#include "sciattn/device.h"
#include "sciattn/evoformer.h"

namespace {

using namespace sciattn;
using bench::DeviceBuffer;
using bench::Fill;

constexpr double kMatmulCeiling = 790e12;
constexpr double kExpCeiling = 3.9e12;

#define CHECK_CUDA(expr)                           \
  do {                                             \
    cudaError_t e_ = (expr);                       \
    if (e_ != cudaSuccess) {                       \
      state.SkipWithError(cudaGetErrorString(e_)); \
      return;                                      \
    }                                              \
  } while (0)

// Arguments: B, N, L, H, D, bias2 (0/1), dtype (1 f16, 2 bf16), backward (0/1).
void BM_EvoformerCuda(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t B = state.range(0), N = state.range(1), L = state.range(2), H = state.range(3),
                D = state.range(4);
  const bool has_bias2 = state.range(5) != 0;
  const DType dt = static_cast<DType>(state.range(6));
  const bool backward = state.range(7) != 0;
  const size_t qkv = static_cast<size_t>(B * N * L * H * D);
  DeviceBuffer q(qkv, dt, 1), k(qkv, dt, 2), v(qkv, dt, 3), dout(qkv, dt, 4);
  DeviceBuffer out(qkv, dt, 5, Fill::kNone), dq(qkv, dt, 6, Fill::kNone),
      dk(qkv, dt, 7, Fill::kNone), dv(qkv, dt, 8, Fill::kNone);
  DeviceBuffer bias1(static_cast<size_t>(B * N * L), dt, 9, Fill::kMask);
  DeviceBuffer bias2(has_bias2 ? static_cast<size_t>(B * H * L * L) : 0, dt, 10);
  DeviceBuffer dbias2(has_bias2 ? static_cast<size_t>(B * H * L * L) : 0, dt, 11, Fill::kNone);
  DeviceBuffer lse(static_cast<size_t>(B * N * H * L), DType::kF32, 12, Fill::kNone);
  for (const DeviceBuffer* t :
       {&q, &k, &v, &dout, &out, &dq, &dk, &dv, &bias1, &bias2, &dbias2, &lse}) {
    if (t->error != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(t->error));
      return;
    }
  }

  EvoformerForwardParams f;
  f.q = TensorView::contiguous(q.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  f.k = TensorView::contiguous(k.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  f.v = TensorView::contiguous(v.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  f.bias1 = TensorView::contiguous(bias1.ptr, dt, {B, N, 1, 1, L}, Device::kCuda);
  if (has_bias2) f.bias2 = TensorView::contiguous(bias2.ptr, dt, {B, 1, H, L, L}, Device::kCuda);
  f.out = TensorView::contiguous(out.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  f.lse = TensorView::contiguous(lse.ptr, DType::kF32, {B * N, H, L}, Device::kCuda);
  EvoformerBackwardParams bw;
  bw.q = f.q;
  bw.k = f.k;
  bw.v = f.v;
  bw.bias1 = f.bias1;
  bw.bias2 = f.bias2;
  bw.out = f.out;
  bw.lse = f.lse;
  bw.dout = TensorView::contiguous(dout.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  bw.dq = TensorView::contiguous(dq.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  bw.dk = TensorView::contiguous(dk.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  bw.dv = TensorView::contiguous(dv.ptr, dt, {B, N, L, H, D}, Device::kCuda);
  if (has_bias2) bw.dbias2 = TensorView::contiguous(dbias2.ptr, dt, {B, 1, H, L, L}, Device::kCuda);
  const size_t fwd_ws_bytes = workspace_size(f), bwd_ws_bytes = workspace_size(bw);
  const size_t ws_bytes = std::max(fwd_ws_bytes, bwd_ws_bytes);
  void* ws = nullptr;
  if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));

  auto call = [&]() -> Status {
    Status s = run(f, ws, fwd_ws_bytes);
    if (s.ok() && backward) s = run(bw, ws, bwd_ws_bytes);
    return s;
  };
  for (int i = 0; i < 3; ++i) {
    const Status s = call();
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      cudaFree(ws);
      return;
    }
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start);
    call();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(ws);
  const double S = static_cast<double>(B * N * H) * static_cast<double>(L * L);
  const double flops = (backward ? 14.0 : 4.0) * S * static_cast<double>(D);
  const double exps = (backward ? 3.0 : 1.0) * S;
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["mm_frac"] =
      benchmark::Counter(flops / kMatmulCeiling, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["exp_frac"] =
      benchmark::Counter(exps / kExpCeiling, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ws_MiB"] = static_cast<double>(backward ? ws_bytes : 0) / (1024.0 * 1024.0);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "N", "L", "H", "D", "bias2", "dtype", "bwd"});
  const std::vector<std::vector<int64_t>> problems = {
      {1, 256, 256, 4, 32, 1},
      {1, 512, 256, 8, 32, 1},
      {1, 256, 512, 8, 32, 0},
      {1, 384, 384, 4, 32, 1},
      {1, 768, 768, 4, 32, 1},
      {1, 1024, 256, 8, 8, 1},
      {1, 256, 256, 4, 64, 1},
      // Head dims below the instantiated one (64): padded in whole chunks (40), and odd (33),
      // whose inputs are staged copies and whose rows start on 2-byte boundaries.
      {1, 256, 256, 4, 40, 1},
      {1, 256, 256, 4, 33, 1},
      // Lengths that are not tile multiples, each beside the same N at L rounded up to 64: a
      // partial last query and key tile (288), and a pair bias whose rows are not 16-byte
      // aligned (250).
      {1, 288, 288, 4, 32, 1},
      {1, 288, 320, 4, 32, 1},
      {1, 250, 250, 4, 32, 1},
      {1, 250, 256, 4, 32, 1},
  };
  for (int64_t dtype : {2, 1})
    for (const auto& s : problems)
      for (int64_t bwd : {0, 1}) b->Args({s[0], s[1], s[2], s[3], s[4], s[5], dtype, bwd});
}

// No MinTime here: a registered one overrides --benchmark_min_time, which scripts/gpu_suite.sh
// sets (BENCH_MIN_TIME, default 0.2 s) so that a device run can trade precision for time.
BENCHMARK(BM_EvoformerCuda)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

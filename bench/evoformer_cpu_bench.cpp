// Google Benchmark of Evoformer attention on the CPU: the tiled path against the naive reference,
// forward and backward, at the demo shapes and at L >= 256 (BM_Evoformer), at small shapes in
// fp32 and bf16 with one and two threads (BM_EvoformerSmall), where starting threads can cost more
// than the work, and the backward over head dims from 2 to 128 (BM_EvoformerHeadDim). Reports
// GFLOP/s (4*S*D forward, 10*S*D backward, S = B*N*H*L*L) and the call's extra memory (its
// workspace).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "sciattn/dtype.h"
#include "sciattn/evoformer.h"

namespace {

using namespace sciattn;

// Storage of one tensor in the problem's dtype.
using Buffer = std::vector<std::byte>;

// Buffers for one problem: inputs and outputs in `dtype` (f32 or bf16), both biases present in
// that dtype, lse in fp32.
struct Problem {
  int64_t B, N, L, H, D;
  DType dtype;
  Buffer q, k, v, bias1, bias2, out, dout, dq, dk, dv, dbias1, dbias2;
  std::vector<float> lse;

  Problem(int64_t b, int64_t n, int64_t l, int64_t h, int64_t d, DType type = DType::kF32)
      : B(b), N(n), L(l), H(h), D(d), dtype(type) {
    const size_t qkv = static_cast<size_t>(B * N * L * H * D);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    auto store = [&](float x, std::byte* dst) {
      if (dtype == DType::kBF16) {
        const uint16_t bits = float_to_bf16_bits(x);
        std::memcpy(dst, &bits, sizeof bits);
      } else {
        std::memcpy(dst, &x, sizeof x);
      }
    };
    auto filled = [&](size_t count, bool random) {
      Buffer x(count * dtype_size(dtype));
      for (size_t i = 0; i < count; ++i)
        store(random ? normal(rng) : 0.0f, &x[i * dtype_size(dtype)]);
      return x;
    };
    q = filled(qkv, true);
    k = filled(qkv, true);
    v = filled(qkv, true);
    dout = filled(qkv, true);
    bias1 = filled(static_cast<size_t>(B * N * L), false);
    bias2 = filled(static_cast<size_t>(B * H * L * L), true);
    out = dq = dk = dv = filled(qkv, false);
    lse.resize(static_cast<size_t>(B * N * H * L));
    dbias1 = bias1;
    dbias2 = bias2;
  }
  TensorView view(Buffer& x, std::initializer_list<int64_t> sizes) {
    return TensorView::contiguous(x.data(), dtype, sizes);
  }
  TensorView qkv_view(Buffer& x) { return view(x, {B, N, L, H, D}); }
  EvoformerForwardParams forward(EvoformerCpuAlgorithm algorithm) {
    EvoformerForwardParams p;
    p.q = qkv_view(q);
    p.k = qkv_view(k);
    p.v = qkv_view(v);
    p.bias1 = view(bias1, {B, N, 1, 1, L});
    p.bias2 = view(bias2, {B, 1, H, L, L});
    p.out = qkv_view(out);
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {B * N, H, L});
    p.options.cpu_algorithm = algorithm;
    return p;
  }
  EvoformerBackwardParams backward(EvoformerCpuAlgorithm algorithm) {
    const EvoformerForwardParams f = forward(algorithm);
    EvoformerBackwardParams p;
    p.q = f.q;
    p.k = f.k;
    p.v = f.v;
    p.bias1 = f.bias1;
    p.bias2 = f.bias2;
    p.out = f.out;
    p.lse = f.lse;
    p.dout = qkv_view(dout);
    p.dq = qkv_view(dq);
    p.dk = qkv_view(dk);
    p.dv = qkv_view(dv);
    p.dbias1 = view(dbias1, {B, N, 1, 1, L});
    p.dbias2 = view(dbias2, {B, 1, H, L, L});
    p.options.cpu_algorithm = algorithm;
    return p;
  }
};

template <typename Params>
void time_op(benchmark::State& state, const Params& p, double flops) {
  std::vector<std::byte> workspace(workspace_size(p));
  for (auto _ : state) {
    const Status s = run(p, workspace.data(), workspace.size());
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["extra_MiB"] = static_cast<double>(workspace.size()) / (1024.0 * 1024.0);
}

// Arguments: B, N, L, H, D, algorithm (0 tiled, 1 reference), direction (0 forward, 1 backward).
void BM_Evoformer(benchmark::State& state) {
  Problem prob(state.range(0), state.range(1), state.range(2), state.range(3), state.range(4));
  const auto algorithm = static_cast<EvoformerCpuAlgorithm>(state.range(5));
  if (state.range(6) == 0) {
    const EvoformerForwardParams p = prob.forward(algorithm);
    time_op(state, p, evoformer_forward_flops(p));
  } else {
    // The backward needs the forward's out and lse.
    const EvoformerForwardParams f = prob.forward(EvoformerCpuAlgorithm::kTiled);
    std::vector<std::byte> ws(workspace_size(f));
    run(f, ws.data(), ws.size());
    const EvoformerBackwardParams p = prob.backward(algorithm);
    time_op(state, p, evoformer_backward_flops(p));
  }
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "N", "L", "H", "D", "ref", "bwd"});
  // The demo shapes (MSA row, MSA column, triangle), then L = 256 and 512 with fewer rows so the
  // naive reference stays within seconds.
  const std::vector<std::vector<int64_t>> problems = {
      {1, 64, 128, 8, 32}, {1, 128, 64, 8, 32}, {1, 128, 128, 4, 32},
      {1, 32, 256, 4, 32}, {1, 8, 512, 4, 32},  {1, 16, 256, 8, 8},
  };
  for (const auto& s : problems)
    for (int64_t bwd : {0, 1})
      for (int64_t ref : {0, 1}) b->Args({s[0], s[1], s[2], s[3], s[4], ref, bwd});
}

BENCHMARK(BM_Evoformer)->Apply(shapes)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);

// Small shapes: B 1, N and H as given, D and L short, f32 and bf16, one and two threads, forward
// and forward + backward (dbias1 and dbias2 requested), tiled and reference. Each call's work is
// a few milliseconds of one core or less, so what a thread costs to start and to join shows.
// Arguments: N, L, H, D, dtype (0 f32, 2 bf16), threads, algorithm (0 tiled, 1 reference),
// direction (0 forward, 1 forward + backward).
void BM_EvoformerSmall(benchmark::State& state) {
  Problem prob(1, state.range(0), state.range(1), state.range(2), state.range(3),
               static_cast<DType>(state.range(4)));
  const auto algorithm = static_cast<EvoformerCpuAlgorithm>(state.range(6));
  EvoformerForwardParams f = prob.forward(algorithm);
  EvoformerBackwardParams b = prob.backward(algorithm);
  f.options.num_threads = b.options.num_threads = static_cast<int>(state.range(5));
  const bool backward = state.range(7) != 0;
  std::vector<std::byte> workspace(std::max(workspace_size(f), workspace_size(b)));
  for (auto _ : state) {
    Status s = run(f, workspace.data(), workspace.size());
    if (s.ok() && backward) s = run(b, workspace.data(), workspace.size());
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  const double flops = evoformer_forward_flops(f) + (backward ? evoformer_backward_flops(b) : 0.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void small_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "L", "H", "D", "dtype", "threads", "ref", "bwd"});
  // [1, 32, 33, 4, 24] is the command-line program's default shape with the head dim it was
  // reported at; then one (b, n, h) at L 128, eight at L 64, and 128 at L 64 and D 64.
  const std::vector<std::vector<int64_t>> problems = {
      {32, 33, 4, 24}, {1, 128, 1, 32}, {2, 64, 4, 32}, {32, 64, 4, 64}};
  for (const auto& s : problems)
    for (int64_t bwd : {0, 1})
      for (int64_t dtype : {0, 2})
        for (int64_t ref : {0, 1})
          for (int64_t threads : {1, 2}) {
            if (ref == 1 && threads == 2) continue;  // the reference has one thread
            b->Args({s[0], s[1], s[2], s[3], dtype, threads, ref, bwd});
          }
}

BENCHMARK(BM_EvoformerSmall)
    ->Apply(small_shapes)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.2);

// Head dims: the backward at [1, 16, 128, 4, D] (fp32, both biases, dbias1 and dbias2) on one
// thread, D from 2 to 128, so that the head dims that are not whole 16-float vectors show
// beside those that are. Argument: D.
void BM_EvoformerHeadDim(benchmark::State& state) {
  Problem prob(1, 16, 128, 4, state.range(0));
  EvoformerForwardParams f = prob.forward(EvoformerCpuAlgorithm::kTiled);
  EvoformerBackwardParams b = prob.backward(EvoformerCpuAlgorithm::kTiled);
  f.options.num_threads = b.options.num_threads = 1;
  std::vector<std::byte> ws(workspace_size(f));
  run(f, ws.data(), ws.size());
  time_op(state, b, evoformer_backward_flops(b));
}

BENCHMARK(BM_EvoformerHeadDim)
    ->ArgName("D")
    ->Arg(2)
    ->Arg(5)
    ->Arg(8)
    ->Arg(12)
    ->Arg(16)
    ->Arg(20)
    ->Arg(24)
    ->Arg(32)
    ->Arg(33)
    ->Arg(40)
    ->Arg(56)
    ->Arg(64)
    ->Arg(100)
    ->Arg(127)
    ->Arg(128)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();

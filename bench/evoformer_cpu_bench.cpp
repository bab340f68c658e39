// Google Benchmark of Evoformer attention on the CPU: the tiled path against the naive reference,
// forward and backward, at the demo shapes and at L >= 256. Reports GFLOP/s (4*S*D forward,
// 10*S*D backward, S = B*N*H*L*L) and the call's extra memory (its workspace).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <random>
#include <vector>

#include "sciattn/evoformer.h"

namespace {

using namespace sciattn;

// Buffers for one problem: all inputs and outputs in fp32, both biases present.
struct Problem {
  int64_t B, N, L, H, D;
  std::vector<float> q, k, v, bias1, bias2, out, lse, dout, dq, dk, dv, dbias1, dbias2;

  Problem(int64_t b, int64_t n, int64_t l, int64_t h, int64_t d) : B(b), N(n), L(l), H(h), D(d) {
    const size_t qkv = static_cast<size_t>(B * N * L * H * D);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    auto random = [&](size_t count) {
      std::vector<float> x(count);
      for (float& e : x) e = normal(rng);
      return x;
    };
    q = random(qkv);
    k = random(qkv);
    v = random(qkv);
    dout = random(qkv);
    bias1.assign(static_cast<size_t>(B * N * L), 0.0f);
    bias2 = random(static_cast<size_t>(B * H * L * L));
    out.resize(qkv);
    dq.resize(qkv);
    dk.resize(qkv);
    dv.resize(qkv);
    lse.resize(static_cast<size_t>(B * N * H * L));
    dbias1.resize(bias1.size());
    dbias2.resize(bias2.size());
  }
  TensorView qkv_view(std::vector<float>& x) {
    return TensorView::contiguous(x.data(), DType::kF32, {B, N, L, H, D});
  }
  EvoformerForwardParams forward(EvoformerCpuAlgorithm algorithm) {
    EvoformerForwardParams p;
    p.q = qkv_view(q);
    p.k = qkv_view(k);
    p.v = qkv_view(v);
    p.bias1 = TensorView::contiguous(bias1.data(), DType::kF32, {B, N, 1, 1, L});
    p.bias2 = TensorView::contiguous(bias2.data(), DType::kF32, {B, 1, H, L, L});
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
    p.dbias1 = TensorView::contiguous(dbias1.data(), DType::kF32, {B, N, 1, 1, L});
    p.dbias2 = TensorView::contiguous(dbias2.data(), DType::kF32, {B, 1, H, L, L});
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

}  // namespace

BENCHMARK_MAIN();

// Google Benchmark of the trainer's CPU pieces: the vectorised AdamW step (elements/s and memory
// GB/s; it reads params, grads, m, v and writes params, m, v: 28 bytes per element) against the
// same update one element at a time on one thread, and one training step of a small GPT
// (tokens/s and GFLOP/s counted as the trainer's MFU counts them). Numbers: docs/training.md.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "sciattn/train/adamw.h"
#include "sciattn/train/backend.h"
#include "sciattn/train/gpt.h"

namespace {

using namespace sciattn;
using namespace sciattn::train;

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void set_counters(benchmark::State& state, int64_t n) {
  state.counters["elements/s"] =
      benchmark::Counter(static_cast<double>(n) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(
      28.0 * static_cast<double>(n) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

// The library's AdamW (AdamW mode, weight decay, bias correction) on n elements, all threads.
void BM_CpuAdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> p = random_floats(n, 1), g = random_floats(n, 2), m(n, 0.0f), v(n, 0.0f);
  AdamWHyperparams h;
  h.weight_decay = 0.01f;
  int64_t step = 0;
  for (auto _ : state) {
    cpu_adamw_step(h, ++step, 1.0f, p.data(), g.data(), m.data(), v.data(), n);
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
  state.SetLabel(cpu_adamw_isa() + ", " + std::to_string(omp_get_max_threads()) + " threads");
}
BENCHMARK(BM_CpuAdamW)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same arithmetic written one element at a time, one thread: what vectorising and threading
// buy.
void BM_ScalarAdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> p = random_floats(n, 1), g = random_floats(n, 2), m(n, 0.0f), v(n, 0.0f);
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    const float bc1 = static_cast<float>(1.0 - std::pow(0.9, static_cast<double>(step)));
    const float bc2 =
        static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(0.999, static_cast<double>(step))));
    for (int64_t i = 0; i < n; ++i) {
      const float grad = g[i];
      const float mom = grad * (1.0f - b1) + m[i] * b1;
      const float var = (grad * grad) * (1.0f - b2) + v[i] * b2;
      const float u = mom / (std::sqrt(var) * bc2 + eps);
      float param = p[i] * (-lr * wd) + p[i];
      p[i] = u * (-lr / bc1) + param;
      m[i] = mom;
      v[i] = var;
    }
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
}
BENCHMARK(BM_ScalarAdamW)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond)->UseRealTime();

// One forward and backward of a GPT micro-batch (d_model 256, 4 layers, 8 heads, sequence 512,
// vocabulary 8192, batch 2) on the CPU back end; arg 1 switches all three memory techniques on.
void BM_GptStep(benchmark::State& state) {
  GptConfig c;
  c.vocab_size = 8192;
  c.d_model = 256;
  c.n_layers = 4;
  c.n_heads = 8;
  c.sequence_length = 512;
  c.max_position_embeddings = 512;
  const int64_t batch = 2, T = batch * c.sequence_length;
  MemoryOptions memory;
  if (state.range(0) == 1) {
    memory.checkpoint_layers = true;
    memory.mlp_tile_tokens = 256;
    memory.lm_head_tile_tokens = 256;
  }
  std::unique_ptr<Backend> be;
  make_cpu_backend({}, &be);
  std::unique_ptr<GptModel> model;
  Status s = GptModel::create(c, nullptr, batch, memory, be.get(), &model);
  if (!s.ok()) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  std::mt19937_64 gen(3);
  std::vector<int32_t> in(T), tg(T);
  for (int64_t i = 0; i < T; ++i) {
    in[i] = static_cast<int32_t>(gen() % 8192);
    tg[i] = static_cast<int32_t>(gen() % 8192);
  }
  for (auto _ : state) {
    model->zero_grads();
    MicroBatchResult r;
    model->forward_backward(in.data(), tg.data(), 1.0f / static_cast<float>(T), &r);
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(T) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(
      model->flops_per_micro_batch() * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
  state.SetLabel(state.range(0) == 1 ? "checkpointing + MLP and LM-head tiles" : "plain");
}
BENCHMARK(BM_GptStep)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

// Google Benchmark of block-sparse self-attention on the GPU (CUDA events, after a warm-up): the
// fused and the composite (sdd -> softmax -> dsd) algorithms, forward and forward + backward,
// B = 1, H = 16, D = 64 and 128, bf16, on DeepSpeed's BigBird, BSLongformer, Fixed and Variable
// layouts (their class defaults) at 4,096, 16,384 and 65,536 tokens with blocks of 64 and 16,
// and two more Fixed forms with the fused algorithm at 16,384 and 65,536: unidirectional with the
// causal rule (layout 4) and with horizontal global attention (layout 5).
// Reports ms, TFLOP/s on the layout's blocks (forward 4 * nnz * b^2 * D per batch, backward 10x;
// sparse_attention_*_flops), the fraction of the H200's measured 790 TFLOP/s, the density and the
// call's extra memory. The peers (dense flash, FlexAttention) are timed by
// bench/compare/block_sparse.py. BM_SparseIndexBuildAndUpload times the once-per-layout metadata
// (the index from the config and its upload) on the same machine.
//
//   bench_sparse_attention_cuda --benchmark_filter='layout:0/L:16384/.*'
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/block_sparse_device_pack.h"  // internal: the upload's steps, timed one by one
#include "device_buffer.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/device.h"

namespace {

using namespace sciattn;
using bench::DeviceBuffer;
using bench::Fill;

constexpr double kMatmulCeiling =
    790e12;  // measured dense bf16 matmul rate of the H200 (docs/perf/)
constexpr int64_t kBatch = 1, kHeads = 16;
constexpr DType kDtype = DType::kBF16;

// The layouts of PERFORMANCE.md, in argument order, then (4) Fixed unidirectional with the
// token-level causal rule, as a causal language model uses it, and (5) Fixed with horizontal
// global attention (its global block rows attend every column).
constexpr SparsityMode kModes[] = {SparsityMode::kBigBird, SparsityMode::kBSLongformer,
                                   SparsityMode::kFixed,   SparsityMode::kVariable,
                                   SparsityMode::kFixed,   SparsityMode::kFixed};
constexpr int64_t kCausalFixed = 4, kHorizontalFixed = 5;

// Layout `layout`'s config with the class defaults for kHeads heads and `block`.
SparsityConfig layout_config(int64_t layout, int64_t block) {
  SparsityConfig config = default_sparsity_config(kModes[layout], kHeads);
  sparsity_common(config).block = block;
  if (layout == kCausalFixed) {
    std::get<FixedSparsityConfig>(config).attention = AttentionDirection::kUnidirectional;
  }
  if (layout == kHorizontalFixed) {
    std::get<FixedSparsityConfig>(config).horizontal_global_attention = true;
  }
  return config;
}

// A row's inputs (the uploaded index and the filled Q, K, V, dO), kept until a row with other
// arguments asks: Google Benchmark calls a row's function more than once (a one-iteration probe,
// then the timed run), and at 65,536 tokens building the index and filling the four inputs took
// seconds of device-machine time on every call.
struct RowInputs {
  int64_t layout, L, block, D;
  BlockSparseIndex index;
  Status status;
  std::unique_ptr<DeviceBuffer> q, k, v, dout;
};

const RowInputs& row_inputs(int64_t layout, int64_t L, int64_t block, int64_t D) {
  static std::unique_ptr<RowInputs> last;
  if (last && last->layout == layout && last->L == L && last->block == block && last->D == D) {
    return *last;
  }
  last.reset();  // free the previous row's buffers first
  auto in = std::make_unique<RowInputs>();
  in->layout = layout;
  in->L = L;
  in->block = block;
  in->D = D;
  in->status = build_sparse_attention_index(layout_config(layout, block), L, L, &in->index);
  if (in->status.ok()) in->status = upload_block_sparse_index(&in->index, 0);
  const size_t n = static_cast<size_t>(kBatch * kHeads * L * D);
  in->q = std::make_unique<DeviceBuffer>(n, kDtype, 1);
  in->k = std::make_unique<DeviceBuffer>(n, kDtype, 2);
  in->v = std::make_unique<DeviceBuffer>(n, kDtype, 3);
  in->dout = std::make_unique<DeviceBuffer>(n, kDtype, 4);
  last = std::move(in);
  return *last;
}

// Arguments: layout (index into kModes), L, block, D, algorithm (0 fused, 1 composite), bwd.
void BM_SparseAttentionCuda(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const SparsityMode mode = kModes[state.range(0)];
  const int64_t L = state.range(1), block = state.range(2), D = state.range(3);
  const auto algorithm =
      state.range(4) == 0 ? SparseAttentionAlgorithm::kFused : SparseAttentionAlgorithm::kComposite;
  const bool backward = state.range(5) != 0;
  const bool causal = state.range(0) == kCausalFixed;
  state.SetLabel(std::string(sparsity_mode_name(mode)) +
                 (causal                               ? " unidirectional causal "
                  : state.range(0) == kHorizontalFixed ? " horizontal global "
                                                       : " ") +
                 sparse_attention_algorithm_name(algorithm) + (backward ? " fwd+bwd" : " fwd"));

  const RowInputs& in = row_inputs(state.range(0), L, block, D);
  Status s = in.status;
  if (!s.ok()) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  const BlockSparseIndex& index = in.index;
  const DeviceBuffer &q = *in.q, &k = *in.k, &v = *in.v, &dout = *in.dout;

  const size_t n = static_cast<size_t>(kBatch * kHeads * L * D);
  DeviceBuffer out(n, kDtype, 0, Fill::kNone), dq(n, kDtype, 0, Fill::kNone),
      dk(n, kDtype, 0, Fill::kNone), dv(n, kDtype, 0, Fill::kNone);
  DeviceBuffer lse(static_cast<size_t>(kBatch * kHeads * L), DType::kF32, 0, Fill::kNone);
  for (const DeviceBuffer* t :
       std::initializer_list<const DeviceBuffer*>{&q, &k, &v, &dout, &out, &dq, &dk, &dv, &lse}) {
    if (t->error != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(t->error));
      return;
    }
  }
  auto view = [&](const DeviceBuffer& t) {
    return TensorView::contiguous(t.ptr, kDtype, {kBatch, kHeads, L, D}, Device::kCuda);
  };
  SparseAttentionForwardParams f;
  f.index = &index;
  f.q = view(q);
  f.k = view(k);
  f.v = view(v);
  f.out = view(out);
  f.lse = TensorView::contiguous(lse.ptr, DType::kF32, {kBatch, kHeads, L}, Device::kCuda);
  f.options.algorithm = algorithm;
  f.options.causal = causal;
  SparseAttentionBackwardParams bw;
  bw.index = &index;
  bw.q = f.q;
  bw.k = f.k;
  bw.v = f.v;
  bw.out = f.out;
  bw.lse = f.lse;
  bw.dout = view(dout);
  bw.dq = view(dq);
  bw.dk = view(dk);
  bw.dv = view(dv);
  bw.options = f.options;
  std::string why;
  s = can_implement(f, &why);
  if (s.ok() && backward) s = can_implement(bw, &why);
  if (!s.ok()) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  const size_t fwd_ws = workspace_size(f), bwd_ws = backward ? workspace_size(bw) : 0;
  const size_t ws_bytes = std::max(fwd_ws, bwd_ws);
  void* ws = nullptr;
  if (ws_bytes > 0 && cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
    cudaGetLastError();
    const std::string msg =
        "workspace of " + std::to_string(ws_bytes >> 20) + " MiB does not fit on the device";
    state.SkipWithError(msg.c_str());
    return;
  }

  auto call = [&]() -> Status {
    Status st = run(f, ws, fwd_ws);
    if (st.ok() && backward) st = run(bw, ws, bwd_ws);
    return st;
  };
  // Warm-up: three calls, which also check that the path runs.
  for (int i = 0; i < 3; ++i) {
    s = call();
    if (s.ok()) s = cuda_synchronize();
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
  const double flops =
      sparse_attention_forward_flops(f) + (backward ? sparse_attention_backward_flops(bw) : 0.0);
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["mm_frac"] =
      benchmark::Counter(flops / kMatmulCeiling, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["density"] =
      static_cast<double>(index.nnz) /
      static_cast<double>(index.num_heads * index.num_row_blocks * index.num_col_blocks);
  state.counters["ws_MiB"] = static_cast<double>(ws_bytes) / (1024.0 * 1024.0);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layout", "L", "block", "D", "alg", "bwd"});
  for (int64_t layout = 0; layout < 4; ++layout)
    for (int64_t L : {4096, 16384, 65536})
      for (int64_t block : {64, 16})
        for (int64_t D : {64, 128})
          for (int64_t alg : {0, 1})
            for (int64_t bwd : {0, 1}) b->Args({layout, L, block, D, alg, bwd});
  for (int64_t layout : {kCausalFixed, kHorizontalFixed})
    for (int64_t L : {16384, 65536})
      for (int64_t block : {64, 16})
        for (int64_t D : {64, 128})
          for (int64_t bwd : {0, 1}) b->Args({layout, L, block, D, 0, bwd});
}

// The metadata of one layout, paid once per layout (it should take well under one attention
// call, or a model's first step pays it noticeably): the index from the config
// (build_sparse_attention_index) and its upload
// (upload_block_sparse_index: the tile index, the int32 packing, cudaMalloc and the blocking
// copy). Wall time of both on the host; the counters split it. Each iteration builds a fresh
// index, as a first call does (its arrays are new memory), and frees it outside the timing.
// Arguments: layout (index into kModes), L, block.
void BM_SparseIndexBuildAndUpload(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const SparsityMode mode = kModes[state.range(0)];
  const int64_t L = state.range(1), block = state.range(2);
  state.SetLabel(sparsity_mode_name(mode));
  SparsityConfig config = default_sparsity_config(mode, kHeads);
  sparsity_common(config).block = block;
  using Clock = std::chrono::steady_clock;
  double index_s = 0.0, upload_s = 0.0;
  double pack_s = 0.0, malloc_s = 0.0, copy_s = 0.0, copy_again_s = 0.0, mb = 0.0;
  for (auto _ : state) {
    auto index = std::make_unique<BlockSparseIndex>();
    const auto t0 = Clock::now();
    Status s = build_sparse_attention_index(config, L, L, index.get());
    const auto t1 = Clock::now();
    if (s.ok()) s = upload_block_sparse_index(index.get(), 0);
    const auto t2 = Clock::now();
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
    index_s += std::chrono::duration<double>(t1 - t0).count();
    upload_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
    // Not timed in the total: the upload's steps again, one by one, on the same index (the
    // library's own sequence: the host step, cudaMalloc, the blocking copy from pageable memory),
    // and the copy once more into the same allocation, to tell first-use costs from transfer.
    detail::PackedBlockSparseIndex packed;
    const auto p0 = Clock::now();
    s = detail::pack_block_sparse_index(*index, &packed);
    const auto p1 = Clock::now();
    void* memory = nullptr;
    const size_t bytes = packed.size() * sizeof(int32_t);
    if (s.ok() && cudaMalloc(&memory, bytes) != cudaSuccess)
      s = Status(StatusCode::kDeviceError, "cudaMalloc");
    const auto p2 = Clock::now();
    if (s.ok() && cudaMemcpy(memory, packed.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
      s = Status(StatusCode::kDeviceError, "cudaMemcpy");
    const auto p3 = Clock::now();
    if (s.ok() && cudaMemcpy(memory, packed.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
      s = Status(StatusCode::kDeviceError, "cudaMemcpy");
    const auto p4 = Clock::now();
    cudaFree(memory);
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
    using Seconds = std::chrono::duration<double>;
    pack_s += Seconds(p1 - p0).count();
    malloc_s += Seconds(p2 - p1).count();
    copy_s += Seconds(p3 - p2).count();
    copy_again_s += Seconds(p4 - p3).count();
    mb = static_cast<double>(bytes) / 1e6;
    index.reset();  // host arrays and device copy freed; not timed
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["index_ms"] = index_s / n * 1e3;
  state.counters["upload_ms"] = upload_s / n * 1e3;
  state.counters["pack_ms"] = pack_s / n * 1e3;
  state.counters["malloc_ms"] = malloc_s / n * 1e3;
  state.counters["copy_ms"] = copy_s / n * 1e3;
  state.counters["copy2_ms"] = copy_again_s / n * 1e3;
  state.counters["MB"] = mb;
}

void index_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layout", "L", "block"});
  for (int64_t layout : {0, 1, 3})  // Fixed (25% dense) is not a sparse layout at these lengths
    for (int64_t L : {16384, 65536})
      for (int64_t block : {64, 16}) b->Args({layout, L, block});
}

BENCHMARK(BM_SparseIndexBuildAndUpload)
    ->Apply(index_shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// No MinTime here: a registered one overrides --benchmark_min_time, which scripts/gpu_suite.sh
// sets (BENCH_MIN_TIME, default 0.2 s) so that a device run can trade precision for time.
BENCHMARK(BM_SparseAttentionCuda)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

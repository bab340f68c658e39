// Google Benchmark of block-sparse self-attention on the CPU: the fused path against the
// composite (DeepSpeed's sdd -> softmax -> dsd) path and against dense attention, forward and
// backward, at L = 1024 and 4096 on DeepSpeed's BigBird and Fixed layouts. Dense attention is
// measured twice: the fused kernel on a dense layout (what sparsity saves with the same kernel)
// and the tiled CPU Evoformer path with N = 1 and no bias (the library's dense attention kernel;
// L = 1024 only, as it takes tens of seconds per call at 4096 on two cores). Counters: GFLOP/s of
// the algorithm's own FLOPs (4 * B * nnz * b^2 * D forward, 10x backward; dense: 4 * B * H * L^2 *
// D), dense-equivalent GFLOP/s (the dense FLOPs over the time: a speed-up over dense shows as a
// rate above dense's own), the layout's density and the call's extra memory (its workspace).
// BM_SparseAttentionSmall times short sequences with one and two threads. BM_BuildIndex times
// building the index of a 65,536-token layout; BM_BuildIndexFromConfig
// times building it from a config (build_sparse_attention_index), the dense route's steps and
// the tile index the GPU upload builds from it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim: BM_FirstBuildOfLayout
#endif
#include <sys/resource.h>  // getrusage: page faults

#include "common/block_sparse_device_pack.h"  // internal: the upload's int32 packing, timed
#include "common/sparse_attention_tiles.h"    // internal: the upload's tile index, timed
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/evoformer.h"

namespace {

using namespace sciattn;

constexpr int64_t kBatch = 1, kHeads = 4, kDim = 64;

enum Path : int64_t { kFused = 0, kComposite = 1, kDenseLayout = 2, kEvoformer = 3 };
enum LayoutKind : int64_t { kBigBird = 0, kFixed = 1, kDenseKind = 2 };

// DeepSpeed's class defaults: BigBird (block 16, 1 random, window 3, 1 global) and Fixed
// (block 16, local windows of 4 blocks, 1 global block, bidirectional).
SparsityConfig layout_config(int64_t kind) {
  if (kind == kDenseKind) {
    DenseSparsityConfig c;
    c.num_heads = kHeads;
    return c;
  }
  if (kind == kBigBird) {
    BigBirdSparsityConfig c;
    c.num_heads = kHeads;
    return c;
  }
  FixedSparsityConfig c;
  c.num_heads = kHeads;
  return c;
}

// Inputs and outputs of one problem, fp32 [B, H, L, D].
struct Problem {
  int64_t L;
  BlockSparseIndex index;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;

  Problem(int64_t len, int64_t kind) : L(len) {
    build_sparse_attention_index(layout_config(kind), L, L, &index);
    const size_t n = static_cast<size_t>(kBatch * kHeads * L * kDim);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    auto random = [&] {
      std::vector<float> x(n);
      for (float& e : x) e = normal(rng);
      return x;
    };
    q = random();
    k = random();
    v = random();
    dout = random();
    out.resize(n);
    dq.resize(n);
    dk.resize(n);
    dv.resize(n);
    lse.resize(static_cast<size_t>(kBatch * kHeads * L));
  }
  TensorView view(std::vector<float>& x) {
    return TensorView::contiguous(x.data(), DType::kF32, {kBatch, kHeads, L, kDim});
  }
  // The same buffer as Evoformer's [B, N=1, L, H, D]: the head and length strides swapped.
  TensorView evo_view(std::vector<float>& x) {
    return TensorView::strided(x.data(), DType::kF32, {kBatch, 1, L, kHeads, kDim},
                               {kHeads * L * kDim, kHeads * L * kDim, kDim, L * kDim, 1});
  }
  SparseAttentionForwardParams forward(Path path) {
    SparseAttentionForwardParams p;
    p.index = &index;
    p.q = view(q);
    p.k = view(k);
    p.v = view(v);
    p.out = view(out);
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {kBatch, kHeads, L});
    p.options.algorithm = path == kComposite ? SparseAttentionAlgorithm::kComposite
                                             : SparseAttentionAlgorithm::kFused;
    return p;
  }
  SparseAttentionBackwardParams backward(Path path) {
    const SparseAttentionForwardParams f = forward(path);
    SparseAttentionBackwardParams p;
    p.index = f.index;
    p.q = f.q;
    p.k = f.k;
    p.v = f.v;
    p.out = f.out;
    p.lse = f.lse;
    p.dout = view(dout);
    p.dq = view(dq);
    p.dk = view(dk);
    p.dv = view(dv);
    p.options = f.options;
    return p;
  }
  EvoformerForwardParams dense_forward() {
    EvoformerForwardParams p;
    p.q = evo_view(q);
    p.k = evo_view(k);
    p.v = evo_view(v);
    p.out = evo_view(out);
    p.lse = TensorView::contiguous(lse.data(), DType::kF32, {kBatch, kHeads, L});
    return p;
  }
  EvoformerBackwardParams dense_backward() {
    const EvoformerForwardParams f = dense_forward();
    EvoformerBackwardParams p;
    p.q = f.q;
    p.k = f.k;
    p.v = f.v;
    p.out = f.out;
    p.lse = f.lse;
    p.dout = evo_view(dout);
    p.dq = evo_view(dq);
    p.dk = evo_view(dk);
    p.dv = evo_view(dv);
    return p;
  }
  double density() const {
    return static_cast<double>(index.nnz) /
           static_cast<double>(kHeads * index.num_row_blocks * index.num_col_blocks);
  }
  double dense_forward_flops() const {
    return 4.0 * static_cast<double>(kBatch * kHeads) * static_cast<double>(L) *
           static_cast<double>(L) * static_cast<double>(kDim);
  }
};

template <typename Params>
void time_op(benchmark::State& state, const Params& p, double flops, double dense_flops,
             double density) {
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
  state.counters["dense_eq_GFLOP/s"] =
      benchmark::Counter(dense_flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["density"] = density;
  state.counters["extra_MiB"] = static_cast<double>(workspace.size()) / (1024.0 * 1024.0);
}

// Arguments: L, layout (0 BigBird, 1 Fixed), path (0 fused, 1 composite, 2 fused on a dense
// layout, 3 Evoformer dense), direction (0 forward, 1 backward).
void BM_SparseAttention(benchmark::State& state) {
  const auto path = static_cast<Path>(state.range(2));
  Problem prob(state.range(0), path == kDenseLayout ? kDenseKind : state.range(1));
  const bool backward = state.range(3) != 0;
  const double dense = prob.dense_forward_flops() * (backward ? 2.5 : 1.0);
  if (path == kEvoformer) {
    const EvoformerForwardParams f = prob.dense_forward();
    if (!backward) {
      time_op(state, f, dense, dense, 1.0);
      return;
    }
    std::vector<std::byte> ws(workspace_size(f));
    run(f, ws.data(), ws.size());  // the backward reads the forward's out and lse
    time_op(state, prob.dense_backward(), dense, dense, 1.0);
    return;
  }
  const SparseAttentionForwardParams f = prob.forward(path);
  if (!backward) {
    time_op(state, f, sparse_attention_forward_flops(f), dense, prob.density());
    return;
  }
  std::vector<std::byte> ws(workspace_size(f));
  run(f, ws.data(), ws.size());
  const SparseAttentionBackwardParams b = prob.backward(path);
  time_op(state, b, sparse_attention_backward_flops(b), dense, prob.density());
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"L", "fixed", "path", "bwd"});
  for (int64_t len : {1024, 4096})
    for (int64_t layout : {kBigBird, kFixed})
      for (int64_t bwd : {0, 1})
        for (int64_t path : {kFused, kComposite, kDenseLayout, kEvoformer}) {
          // Dense attention does not depend on the layout: measure it once per length (under
          // the BigBird rows), and the Evoformer kernel at L = 1024 only.
          if ((path == kDenseLayout || path == kEvoformer) && layout == kFixed) continue;
          if (path == kEvoformer && len > 1024) continue;
          b->Args({len, layout, path, bwd});
        }
}

BENCHMARK(BM_SparseAttention)
    ->Apply(shapes)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);

// Short sequences, where a call's work is a few milliseconds of one core or less and what a
// thread costs to start and to join shows: the Fixed layout at L 64 (dense at block 16), 128 and
// 512, fused and composite, with one and two threads, forward and forward + backward.
// Arguments: L, path (0 fused, 1 composite), threads, direction (0 forward, 1 forward + backward).
void BM_SparseAttentionSmall(benchmark::State& state) {
  Problem prob(state.range(0), kFixed);
  const auto path = static_cast<Path>(state.range(1));
  SparseAttentionForwardParams f = prob.forward(path);
  SparseAttentionBackwardParams b = prob.backward(path);
  f.options.num_threads = b.options.num_threads = static_cast<int>(state.range(2));
  const bool backward = state.range(3) != 0;
  std::vector<std::byte> workspace(std::max(workspace_size(f), workspace_size(b)));
  for (auto _ : state) {
    Status s = run(f, workspace.data(), workspace.size());
    if (s.ok() && backward) s = run(b, workspace.data(), workspace.size());
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  const double flops =
      sparse_attention_forward_flops(f) + (backward ? sparse_attention_backward_flops(b) : 0.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_SparseAttentionSmall)
    ->ArgNames({"L", "path", "threads", "bwd"})
    ->ArgsProduct({{64, 128, 512}, {kFused, kComposite}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.2);

// Building the index (enumeration, CSR, CSC and the work splits) of the largest layouts:
// 65,536 tokens, 16 heads, BigBird and BSLongformer with block 64 and 16 (DeepSpeed's BERT
// recipe). The layout itself is made once outside the timed loop; the index is what a caller
// builds once per layout and keeps. Argument: layout (0 BigBird, 1 BSLongformer), block.
void BM_BuildIndex(benchmark::State& state) {
  constexpr int64_t kTokens = 65536, kIndexHeads = 16;
  const int64_t block = state.range(1);
  SparsityConfig config;
  if (state.range(0) == 0) {
    BigBirdSparsityConfig c;
    c.num_heads = kIndexHeads;
    c.block = block;
    config = c;
  } else {
    BSLongformerSparsityConfig c;
    c.num_heads = kIndexHeads;
    c.block = block;
    config = c;
  }
  Layout layout;
  if (!make_layout(config, kTokens, &layout).ok()) {
    state.SkipWithError("make_layout failed");
    return;
  }
  BlockSparseIndex index;
  for (auto _ : state) {
    if (!build_block_sparse_index(layout, block, &index).ok()) {
      state.SkipWithError("build_block_sparse_index failed");
      return;
    }
    benchmark::DoNotOptimize(index.nnz);
  }
  state.counters["nnz"] = static_cast<double>(index.nnz);
  state.counters["layout_entries_M"] = static_cast<double>(layout.blocks.size()) * 1e-6;
  state.counters["row_pieces"] = static_cast<double>(index.row_split.pieces());
  state.counters["split_rows"] = static_cast<double>(index.row_split.split_lines);
}

BENCHMARK(BM_BuildIndex)
    ->ArgNames({"bslongformer", "block"})
    ->Args({0, 64})
    ->Args({1, 64})
    ->Args({0, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);

// Building the index from a config, as SparseSelfAttention does for each new layout
// (build_sparse_attention_index), at 65,536 tokens with 16 heads and each config's class
// defaults, and the two steps of the dense route for comparison: painting the dense [H, R, C]
// layout (make_layout_for_length) and scanning it (build_block_sparse_index, from a layout made
// outside the timed loop). Arguments: config (0 BigBird, 1 BSLongformer, 2 Fixed, 3 Variable),
// block, part (0 build_sparse_attention_index, 1 make_layout_for_length, 2
// build_block_sparse_index, 3 both dense steps in one call sequence, 4 the host step of
// upload_block_sparse_index: the GPU kernels' tile index of the built index,
// detail::build_sparse_attention_tiles, 5 the whole host step of the upload: the tile index and
// the int32 packing, detail::pack_block_sparse_index, with the packed bytes as a counter).
void BM_BuildIndexFromConfig(benchmark::State& state) {
  constexpr int64_t kTokens = 65536, kIndexHeads = 16;
  const int64_t block = state.range(1);
  const int64_t part = state.range(2);
  constexpr SparsityMode kModes[] = {SparsityMode::kBigBird, SparsityMode::kBSLongformer,
                                     SparsityMode::kFixed, SparsityMode::kVariable};
  SparsityConfig config = default_sparsity_config(kModes[state.range(0)], kIndexHeads);
  sparsity_common(config).block = block;
  Layout layout;
  if (part == 2 && !make_layout_for_length(config, kTokens, kTokens, &layout).ok()) {
    state.SkipWithError("make_layout_for_length failed");
    return;
  }
  BlockSparseIndex index;
  detail::SparseAttentionTiles tiles;
  detail::PackedBlockSparseIndex packed;
  if ((part == 4 || part == 5) &&
      !build_sparse_attention_index(config, kTokens, kTokens, &index).ok()) {
    state.SkipWithError("build_sparse_attention_index failed");
    return;
  }
  for (auto _ : state) {
    Status s;
    if (part == 0) {
      s = build_sparse_attention_index(config, kTokens, kTokens, &index);
    } else if (part == 1) {
      s = make_layout_for_length(config, kTokens, kTokens, &layout);
      benchmark::DoNotOptimize(layout.blocks.data());
    } else if (part == 2) {
      s = build_block_sparse_index(layout, block, &index);
    } else if (part == 4) {
      s = detail::build_sparse_attention_tiles(index, &tiles);
      benchmark::DoNotOptimize(tiles.row_slots.data());
    } else if (part == 5) {
      s = detail::pack_block_sparse_index(index, &packed);
      benchmark::DoNotOptimize(packed.data());
    } else {
      s = make_layout_for_length(config, kTokens, kTokens, &layout);
      if (s.ok()) s = build_block_sparse_index(layout, block, &index);
    }
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
    benchmark::DoNotOptimize(index.nnz);
  }
  if (part != 1) state.counters["nnz"] = static_cast<double>(index.nnz);
  if (part == 5) state.counters["MB"] = static_cast<double>(packed.size() * sizeof(int32_t)) / 1e6;
}

// The metadata of a layout as a process's first build of it meets memory: the index from the
// config and the upload's host step (parts 0 and 5 above) on pages the process has not touched
// yet. Between iterations (untimed) the previous build is freed and malloc_trim returns the
// heap's free pages to the system, so each build faults its memory in afresh, as the first one
// in a process does (where the benchmarks above mostly reuse pages the allocator kept from the
// previous iteration); the code is warm. Counter: minor page faults per build. Arguments:
// config, block (as above).
void BM_FirstBuildOfLayout(benchmark::State& state) {
  constexpr int64_t kTokens = 65536, kIndexHeads = 16;
  constexpr SparsityMode kModes[] = {SparsityMode::kBigBird, SparsityMode::kBSLongformer,
                                     SparsityMode::kFixed, SparsityMode::kVariable};
  SparsityConfig config = default_sparsity_config(kModes[state.range(0)], kIndexHeads);
  sparsity_common(config).block = state.range(1);
  auto minor_faults = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_minflt);
  };
  double faults = 0;
  for (auto _ : state) {
    state.PauseTiming();
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    const double before = minor_faults();
    state.ResumeTiming();
    BlockSparseIndex index;
    detail::PackedBlockSparseIndex packed;
    Status s = build_sparse_attention_index(config, kTokens, kTokens, &index);
    if (s.ok()) s = detail::pack_block_sparse_index(index, &packed);
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
    benchmark::DoNotOptimize(packed.data());
    state.PauseTiming();
    faults += minor_faults() - before;
    {
      // Freed untimed.
      BlockSparseIndex gone = std::move(index);
      detail::PackedBlockSparseIndex gone_packed = std::move(packed);
    }
    state.ResumeTiming();
  }
  state.counters["faults"] = benchmark::Counter(faults, benchmark::Counter::kAvgIterations);
}

BENCHMARK(BM_FirstBuildOfLayout)
    ->ArgNames({"config", "block"})
    ->ArgsProduct({{0, 1, 3}, {64, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.3);

BENCHMARK(BM_BuildIndexFromConfig)
    ->ArgNames({"config", "block", "part"})
    ->ArgsProduct({{0, 1, 2, 3}, {64, 16}, {0, 1, 2, 3, 4, 5}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();

// The fused block-sparse attention on the GPU (label gpu): the CUDA kernels, forward and
// backward, against the fp64 oracle with the tolerance rule (the CPU fused path, which the
// CPU suites check against the same oracle, gives lowp_ref), for every sparsity config, block
// 16/32/64/128, head dims 32/64/128 and a padded one, f16/bf16/f32, both mask modes and bool
// masks, rpe, causal, strided and pre-transposed inputs, empty block rows, fully masked rows, and
// lengths from one block to 65,536 tokens with split rows and columns; bitwise
// determinism; NaN-poisoned outputs; the rejections. Each test skips without a CUDA device.
// Quick subset for compute-sanitizer: --gtest_filter='*Small*'. Test layer (tests/cuda).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
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

// kGlobalLines: a random layout with a few block columns that every block row holds and a few
// block rows that hold every column (equal long lists, which the tile index groups into shared
// tile lines below the tile size).
enum class Config {
  kRandom,
  kDense,
  kFixed,
  kVariable,
  kBigBird,
  kBSLongformer,
  kLocal,
  kGlobalLines,
  kFixedHorizontal,  // Fixed, bidirectional, its global rows attending every column
  kLower             // every block at or below the diagonal (the trainer's dense causal layout)
};

const char* config_name(Config c) {
  static const char* names[] = {"random",       "dense", "fixed",       "variable", "bigbird",
                                "bslongformer", "local", "globallines", "fixedhz",  "lower"};
  return names[static_cast<int>(c)];
}
struct GpuCase {
  DType dtype = DType::kBF16;
  int64_t block = 16, B = 2, H = 2, N = 4, D = 32;  // L = N * block
  Config config = Config::kRandom;
  bool per_head = true;
  MaskKind kpm = MaskKind::kNone, attn = MaskKind::kNone;
  RpeKind rpe = RpeKind::kNone;
  bool causal = false;
  std::optional<float> scale;
  QkvStorage storage = QkvStorage::kPacked;  // kPadded and kKeyT take the element loads
  int64_t split_blocks = 0;  // > 0: split_block_sparse_work(split_blocks) before the upload
  bool masked_row = false;   // query 2 sees no key (fully masked row)
  uint64_t seed = kBaseSeed;

  int64_t L() const { return N * block; }
  std::string name() const {
    // This suite's names call the rpe in q's dtype "same".
    static const char* rpes[] = {"none", "same", "f32", "bcast"};
    std::string s = std::string(dtype_name(dtype)) + "_b" + std::to_string(block) + "_B" +
                    std::to_string(B) + "H" + std::to_string(H) + "L" + std::to_string(L()) + "D" +
                    std::to_string(D) + "_" + config_name(config) + "_kpm" + mask_name(kpm) +
                    "_attn" + mask_name(attn) + "_rpe" + rpes[static_cast<int>(rpe)] + "_" +
                    qkv_storage_name(storage);
    if (causal) s += "_causal";
    if (scale) s += "_scaled";
    if (split_blocks) s += "_split" + std::to_string(split_blocks);
    if (masked_row) s += "_maskedrow";
    return s + "_s" + std::to_string(seed - kBaseSeed);
  }
};

void PrintTo(const GpuCase& c, std::ostream* os) {
  *os << c.name() << " " << seed_note(c.seed);
}

sciattn::Layout make_case_layout(const GpuCase& c, std::mt19937_64& rng) {
  sciattn::Layout layout;
  SparsityConfig cfg;
  switch (c.config) {
    case Config::kRandom:
      return random_layout(c.H, c.N, c.N, 0.4, rng, /*empty_row=*/true, /*empty_col=*/true);
    case Config::kGlobalLines: {
      layout = random_layout(c.H, c.N, c.N, 0.15, rng, /*empty_row=*/false, /*empty_col=*/false);
      // Six to eight columns held by every row of every head, and four to six rows holding every
      // column, at random places.
      const int64_t columns = 6 + static_cast<int64_t>(rng() % 3);
      for (int64_t k = 0; k < columns; ++k) {
        const int64_t col = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.N));
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t r = 0; r < c.N; ++r) layout.at(h, r, col) = 1;
      }
      const int64_t rows = 4 + static_cast<int64_t>(rng() % 3);
      for (int64_t k = 0; k < rows; ++k) {
        const int64_t row = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.N));
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t col = 0; col < c.N; ++col) layout.at(h, row, col) = 1;
      }
      return layout;
    }
    case Config::kLower:
      layout = sciattn::Layout::zeros(c.H, c.N, c.N);
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t r = 0; r < c.N; ++r)
          for (int64_t col = 0; col <= r; ++col) layout.at(h, r, col) = 1;
      return layout;
    case Config::kDense:
      cfg = DenseSparsityConfig{};
      break;
    case Config::kFixed:
    case Config::kFixedHorizontal: {
      FixedSparsityConfig f;
      f.horizontal_global_attention = c.config == Config::kFixedHorizontal;
      f.different_layout_per_head = c.per_head;
      f.num_local_blocks = 4;
      f.num_different_global_patterns = c.per_head ? 2 : 1;
      f.attention =
          c.causal ? AttentionDirection::kUnidirectional : AttentionDirection::kBidirectional;
      cfg = f;
      break;
    }
    case Config::kVariable: {
      VariableSparsityConfig v;
      v.different_layout_per_head = c.per_head;
      v.num_random_blocks = 1;
      v.local_window_blocks = {2, 3};
      v.global_block_indices = {0};
      v.horizontal_global_attention = !c.causal;
      cfg = v;
      break;
    }
    case Config::kBigBird: {
      BigBirdSparsityConfig b;
      b.different_layout_per_head = c.per_head;
      b.num_random_blocks = 1;
      cfg = b;
      break;
    }
    case Config::kBSLongformer: {
      BSLongformerSparsityConfig l;
      l.different_layout_per_head = c.per_head;
      cfg = l;
      break;
    }
    case Config::kLocal:
      cfg = LocalSlidingWindowSparsityConfig{};
      break;
  }
  SparsityCommon& common = sparsity_common(cfg);
  common.num_heads = c.H;
  common.block = c.block;
  common.seed = c.seed;
  const Status s = make_layout(cfg, c.L(), &layout);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return layout;
}

using Problem = AttentionSuiteProblem<GpuCase>;

Problem make_problem(const GpuCase& c) {
  Problem p;
  p.c = c;
  std::mt19937_64 rng(c.seed);
  p.layout = make_case_layout(c, rng);
  p.layout = maybe_shared_heads(p.layout, c.seed);
  p.ix = make_index(p.layout, c.block);
  if (c.split_blocks > 0) {
    EXPECT_TRUE(split_block_sparse_work(c.split_blocks, &p.ix).ok());
  }
  EXPECT_TRUE(upload_block_sparse_index(&p.ix, 0).ok());
  make_qkv_inputs(p, rng);
  const int64_t L = c.L();
  p.rpe = attention_rpe(c.rpe, c.dtype, c.B, c.H, L);
  if (p.rpe.present()) test::fill_normal(p.rpe, rng, 0.5);
  p.kpm = make_mask(c.kpm, c.dtype, {c.B, L}, 0.15, rng);
  p.attn = make_mask(c.attn, c.dtype, {L, L}, 0.15, rng);
  if (c.masked_row && p.attn.present() && L > 2) mask_query_row(p.attn, c.attn, 2);
  return p;
}

SparseAttentionOptions options_of(const GpuCase& c) {
  return attention_options(c, SparseAttentionAlgorithm::kFused);
}

// The CPU fused path (lowp_ref): out / lse, then dq / dk / dv from that out and lse.
struct CpuRun {
  HostTensor out, lse, dq, dk, dv;
};

CpuRun run_cpu(const Problem& p) {
  CpuRun r;
  const AttnViews in = host_views(p);
  r.out = qkv_tensor(p.c);
  r.lse = lse_tensor(p.c);
  Status s =
      run_op(attention_forward_params(p.ix, in, r.out.view(), r.lse.view(), options_of(p.c)));
  EXPECT_TRUE(s.ok()) << s.to_string();
  r.dq = qkv_tensor(p.c);
  r.dk = qkv_tensor(p.c);
  r.dv = qkv_tensor(p.c);
  s = run_op(attention_backward_params(p.ix, in, r.out.view(), r.lse.view(), r.dq.view(),
                                       r.dk.view(), r.dv.view(), options_of(p.c)));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

// One GPU forward and backward (the backward from the GPU forward's out and lse), outputs
// NaN-poisoned before the run and copied back.
struct GpuRun {
  Status forward_status, backward_status;
  HostTensor out, lse, dq, dk, dv;
};

GpuRun run_gpu(const Problem& p) {
  GpuRun r;
  DeviceCopy q(p.q), k(p.k), v(p.v), dout(p.dout), rpe(p.rpe), kpm(p.kpm), attn(p.attn);
  const AttnViews in{q.view(),   k.view(),    v.view(),   rpe.view(),
                     kpm.view(), attn.view(), dout.view()};
  r.out = qkv_tensor(p.c);
  r.lse = lse_tensor(p.c);
  DeviceCopy out(r.out), lse(r.lse);
  const SparseAttentionForwardParams f =
      attention_forward_params(p.ix, in, out.view(), lse.view(), options_of(p.c));
  {
    const size_t bytes = workspace_size(f);
    DeviceBuffer ws(bytes, /*poison=*/true);
    r.forward_status = run(f, ws.ptr, bytes);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  out.copy_to(r.out);
  lse.copy_to(r.lse);
  if (!r.forward_status.ok()) return r;

  r.dq = qkv_tensor(p.c);
  r.dk = qkv_tensor(p.c);
  r.dv = qkv_tensor(p.c);
  DeviceCopy dq(r.dq), dk(r.dk), dv(r.dv);
  const SparseAttentionBackwardParams g =
      attention_backward_params(p.ix, in, f.out, f.lse, dq.view(), dk.view(), dv.view(), f.options);
  {
    const size_t bytes = workspace_size(g);
    DeviceBuffer ws(bytes, /*poison=*/true);
    r.backward_status = run(g, ws.ptr, bytes);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  dq.copy_to(r.dq);
  dk.copy_to(r.dk);
  dv.copy_to(r.dv);
  return r;
}

void check_case(const GpuCase& c) {
  SCOPED_TRACE(c.name() + " " + seed_note(c.seed));
  const Problem p = make_problem(c);
  ASSERT_NE(p.ix.device, nullptr);
  const AttnProblem a = attention_oracle_problem(p);
  const AttnForward o = attention_oracle(a);
  const CpuRun cpu = run_cpu(p);

  const GpuRun gpu = run_gpu(p);
  ASSERT_TRUE(gpu.forward_status.ok()) << gpu.forward_status.to_string();
  ASSERT_TRUE(gpu.backward_status.ok()) << gpu.backward_status.to_string();
  EXPECT_TRUE(within_tolerance("out", gpu.out.values(), cpu.out.values(), o.out.v, c.dtype));
  EXPECT_TRUE(within_tolerance("lse", gpu.lse.values(), cpu.lse.values(), o.lse, DType::kF32));
  // The gradients of the GPU's own forward, against the oracle's (the CPU backward from the CPU
  // forward is lowp_ref: both read an out rounded to the dtype).
  const AttnGrads og = attention_backward_oracle(a, dense_op(p.dout, false));
  EXPECT_TRUE(within_tolerance("dq", gpu.dq.values(), cpu.dq.values(), og.dq.v, c.dtype));
  EXPECT_TRUE(within_tolerance("dk", gpu.dk.values(), cpu.dk.values(), og.dk.v, c.dtype));
  EXPECT_TRUE(within_tolerance("dv", gpu.dv.values(), cpu.dv.values(), og.dv.v, c.dtype));
  EXPECT_EQ(gpu.out.touched_outside_view() + gpu.dq.touched_outside_view() +
                gpu.dk.touched_outside_view() + gpu.dv.touched_outside_view(),
            0)
      << "a kernel wrote outside an output's view";

  const GpuRun again = run_gpu(p);
  EXPECT_TRUE(gpu.out.same_bytes(again.out)) << "out differs between two runs";
  EXPECT_TRUE(gpu.lse.same_bytes(again.lse)) << "lse differs between two runs";
  EXPECT_TRUE(gpu.dq.same_bytes(again.dq)) << "dq differs between two runs";
  EXPECT_TRUE(gpu.dk.same_bytes(again.dk)) << "dk differs between two runs";
  EXPECT_TRUE(gpu.dv.same_bytes(again.dv)) << "dv differs between two runs";
}

// ---- the cases ------------------------------------------------------------------------------

// Small shapes (L <= 256, the sanitizer subset): every config, block, head dim, dtype and
// feature at least once.
std::vector<GpuCase> small_cases() {
  std::vector<GpuCase> cases;
  uint64_t seed = kBaseSeed + 80000;
  auto add = [&](GpuCase c) {
    c.seed = seed++;
    cases.push_back(c);
  };
  const DType dtypes[] = {DType::kBF16, DType::kF16};
  const int64_t blocks[] = {16, 32, 64, 128};
  const int64_t dims[] = {32, 64, 128, 48};
  // Every config type in both dtypes, the block and head dim rotating.
  int rot = 0;
  for (Config cfg : {Config::kRandom, Config::kDense, Config::kFixed, Config::kVariable,
                     Config::kBigBird, Config::kBSLongformer, Config::kLocal}) {
    for (DType dt : dtypes) {
      GpuCase c;
      c.dtype = dt;
      c.config = cfg;
      c.block = blocks[rot % 4];
      c.D = dims[(rot / 2) % 4];
      // At least 3 blocks: BigBird's and BSLongformer's windows need them.
      c.N = c.block == 128 ? 3 : c.block == 64 ? 3 : 256 / c.block;
      if (cfg == Config::kFixed || cfg == Config::kLocal) c.causal = (rot % 2) == 0;
      ++rot;
      add(c);
    }
  }
  // Every mask mode on both masks, with a fully masked row, and rpe of each kind.
  const RpeKind rpes[] = {RpeKind::kF32, RpeKind::kSameDtype, RpeKind::kBroadcast};
  rot = 0;
  for (MaskKind m : {MaskKind::kAdd, MaskKind::kMul, MaskKind::kBool}) {
    for (DType dt : dtypes) {
      GpuCase c;
      c.dtype = dt;
      c.block = blocks[rot % 4];
      c.N = c.block >= 64 ? 2 : 5;
      c.kpm = m;
      c.attn = m == MaskKind::kBool ? MaskKind::kMul : m;
      c.masked_row = true;
      c.rpe = rpes[rot % 3];
      ++rot;
      add(c);
    }
  }
  // Token-level causal on random layouts (rows whose blocks all lie above the diagonal become
  // fully masked), an explicit scale, and a bool attention mask with a fully masked row.
  GpuCase c;
  c.causal = true;
  c.attn = MaskKind::kBool;
  c.masked_row = true;
  c.scale = 0.3f;
  c.dtype = DType::kF16;
  add(c);
  // Strided inputs: padded (element loads, unaligned), heads interleaved, pre-transposed K/V.
  for (QkvStorage st : {QkvStorage::kPadded, QkvStorage::kBLHD, QkvStorage::kKeyT}) {
    c = GpuCase();
    c.storage = st;
    c.kpm = MaskKind::kAdd;
    c.D = st == QkvStorage::kBLHD ? 64 : 32;
    add(c);
  }
  // Odd head dims (padded columns, element loads for D % 8 != 0) and the single block.
  for (int64_t d : {1, 20, 100}) {
    c = GpuCase();
    c.D = d;
    c.dtype = d == 20 ? DType::kF16 : DType::kBF16;
    add(c);
  }
  c = GpuCase();
  c.B = c.H = c.N = 1;
  c.block = 64;
  c.attn = MaskKind::kMul;
  add(c);
  // One block of 16 tokens: a single partial tile, 48 of its rows and columns past L.
  c = GpuCase();
  c.B = c.H = c.N = 1;
  c.block = 16;
  c.kpm = MaskKind::kBool;
  c.dtype = DType::kF16;
  add(c);
  // Forced splits: pieces of one layout block, so that every line of more than one tile is split
  // (forward combine and backward sums), in blocks smaller than and larger than the tile.
  for (int64_t b : {16, 128}) {
    c = GpuCase();
    c.config = Config::kBigBird;
    c.block = b;
    c.N = b == 16 ? 16 : 3;
    c.split_blocks = 1;
    c.kpm = MaskKind::kAdd;
    c.attn = MaskKind::kAdd;
    c.masked_row = true;
    c.D = b == 16 ? 64 : 128;
    add(c);
  }
  // Packed entries (blocks of 16 and 32) on the warpgroup-MMA kernels: 16-bit aligned tensors of
  // head dim 64 or 128 and L a multiple of 64. Random layouts with empty rows and columns (empty
  // slots, warps that keep nothing in an entry), every score term, causal, split lines, and
  // heads-interleaved storage.
  c = GpuCase();
  c.block = 16;
  c.N = 8;
  c.D = 64;
  add(c);
  c = GpuCase();
  c.block = 32;
  c.N = 6;
  c.D = 128;
  c.dtype = DType::kF16;
  c.kpm = MaskKind::kBool;
  c.masked_row = true;
  c.causal = true;
  c.rpe = RpeKind::kF32;
  add(c);
  c = GpuCase();
  c.config = Config::kBigBird;
  c.block = 16;
  c.N = 12;
  c.D = 128;
  c.attn = MaskKind::kAdd;
  c.scale = 0.2f;
  c.split_blocks = 1;
  add(c);
  c = GpuCase();
  c.config = Config::kFixed;
  c.block = 32;
  c.N = 4;
  c.D = 64;
  c.dtype = DType::kF16;
  c.causal = true;
  c.storage = QkvStorage::kBLHD;
  add(c);
  // Block lines with equal long lists sharing tile lines (blocks of 16 and 32): their keys and
  // queries are gathered, not consecutive, so the key padding mask, causal rule, rpe and outputs
  // (split lines' sums and combines included) must find each token's true position; on the
  // warpgroup kernels, the mma.sync ones (L not a multiple of 64, head dim 32; a last tile line
  // with an empty slot) and the fp32 ones; Fixed's own global columns, shared by the heads, and
  // its global rows (horizontal global attention).
  c = GpuCase();
  c.config = Config::kGlobalLines;
  c.N = 32;
  c.D = 64;
  c.causal = true;
  c.kpm = MaskKind::kBool;
  c.masked_row = true;
  add(c);
  c = GpuCase();
  c.config = Config::kGlobalLines;
  c.block = 32;
  c.N = 20;
  c.D = 128;
  c.dtype = DType::kF16;
  c.rpe = RpeKind::kF32;
  c.attn = MaskKind::kAdd;
  c.split_blocks = 1;
  add(c);
  c = GpuCase();
  c.config = Config::kGlobalLines;
  c.N = 37;
  c.D = 32;
  c.kpm = MaskKind::kAdd;
  c.split_blocks = 2;
  add(c);
  c = GpuCase();
  c.config = Config::kFixed;
  c.per_head = false;
  c.N = 32;
  c.D = 64;
  c.split_blocks = 1;
  add(c);
  c = GpuCase();
  c.config = Config::kFixedHorizontal;
  c.N = 32;
  c.D = 64;
  c.split_blocks = 2;
  c.kpm = MaskKind::kAdd;
  add(c);
  // Unidirectional Fixed (causal): its global columns' lists differ (column c is held by the rows
  // from c on) but are long, and share tile columns in order.
  c = GpuCase();
  c.config = Config::kFixed;
  c.causal = true;
  c.N = 48;
  c.D = 128;
  c.dtype = DType::kF16;
  add(c);
  c = GpuCase();
  c.config = Config::kGlobalLines;
  c.dtype = DType::kF32;
  c.N = 20;
  c.D = 33;
  c.causal = true;
  c.kpm = MaskKind::kMul;
  add(c);
  // Dense causal attention (every block at or below the diagonal, or every block, under the
  // causal rule): on sm_90a the forward's causal kernel, 128 queries per CTA, a last query tile
  // of one warpgroup's 64 rows (L 192), an explicit scale, the trainer's [B, L, H, D] rows; with
  // a key padding mask the lists' kernels run instead.
  c = GpuCase();
  c.config = Config::kLower;
  c.block = 64;
  c.N = 3;
  c.D = 128;
  c.causal = true;
  add(c);
  c = GpuCase();
  c.config = Config::kLower;
  c.block = 32;
  c.N = 8;
  c.D = 64;
  c.dtype = DType::kF16;
  c.causal = true;
  c.scale = 0.3f;
  add(c);
  c = GpuCase();
  c.config = Config::kDense;
  c.block = 128;
  c.N = 2;
  c.D = 64;
  c.causal = true;
  c.storage = QkvStorage::kBLHD;
  add(c);
  c = GpuCase();
  c.config = Config::kLower;
  c.block = 64;
  c.N = 3;
  c.D = 128;
  c.causal = true;
  c.kpm = MaskKind::kBool;
  add(c);
  // fp32 on the CUDA cores, with every feature.
  for (int64_t b : {16, 64}) {
    c = GpuCase();
    c.dtype = DType::kF32;
    c.block = b;
    c.N = b == 16 ? 6 : 2;
    c.D = b == 16 ? 33 : 64;
    c.kpm = MaskKind::kBool;
    c.attn = MaskKind::kAdd;
    c.masked_row = true;
    c.rpe = RpeKind::kBroadcast;
    c.causal = b == 16;
    c.storage = b == 16 ? QkvStorage::kKeyT : QkvStorage::kPacked;
    add(c);
  }
  return cases;
}

// Longer sequences: a few thousand tokens and 65,536, where global rows and columns get split by
// the index's default piece size.
std::vector<GpuCase> large_cases() {
  std::vector<GpuCase> cases;
  uint64_t seed = kBaseSeed + 81000;
  // One batch of a config at N blocks of `block` tokens; the caller adds its features.
  auto large = [&](Config config, int64_t block, int64_t N, int64_t H, int64_t D, DType dtype) {
    GpuCase c;
    c.config = config;
    c.block = block;
    c.N = N;
    c.B = 1;
    c.H = H;
    c.D = D;
    c.dtype = dtype;
    c.seed = seed++;
    return c;
  };
  // 4,096 tokens; the global row (64 blocks) is cut into pieces of 16.
  GpuCase c = large(Config::kBigBird, 64, 64, 2, 64, DType::kBF16);
  c.kpm = MaskKind::kAdd;
  cases.push_back(c);
  c = large(Config::kBSLongformer, 16, 128, 2, 128, DType::kF16);  // 2,048 tokens
  c.causal = true;
  cases.push_back(c);
  c = large(Config::kFixed, 32, 40, 2, 32, DType::kBF16);  // 1,280 tokens: 20 tiles
  c.attn = MaskKind::kMul;
  c.masked_row = true;
  cases.push_back(c);
  // Blocks of 16 and 32 with no masks and no causal rule: every entry below the edge is plain
  // (no per-element checks), its blocks packed from several 64-token tiles; the global row and
  // column are split.
  cases.push_back(large(Config::kBigBird, 16, 256, 2, 64, DType::kBF16));  // 4,096 tokens
  cases.push_back(large(Config::kVariable, 32, 96, 2, 128, DType::kF16));  // 3,072 tokens
  // Dense causal attention over long rows: 4,032 tokens (a last query tile of 64 rows) at head
  // dim 128, 3,072 at head dim 64 from every block of 128.
  c = large(Config::kLower, 64, 63, 2, 128, DType::kBF16);
  c.causal = true;
  cases.push_back(c);
  c = large(Config::kDense, 128, 24, 2, 64, DType::kF16);
  c.causal = true;
  cases.push_back(c);
  // 65,536 tokens (the longest length): BigBird's class defaults at block 64, whose global
  // row and column (1,024 tiles) are cut into pieces and merged; a key padding mask. The oracle
  // walks only the layout's blocks (~10 s on one core).
  c = large(Config::kBigBird, 64, 1024, 1, 64, DType::kBF16);
  c.kpm = MaskKind::kAdd;
  cases.push_back(c);
  return cases;
}

class SparseAttentionCuda : public ::testing::TestWithParam<GpuCase> {};

TEST_P(SparseAttentionCuda, MatchesOracleAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  check_case(GetParam());
}

auto case_name = [](const ::testing::TestParamInfo<GpuCase>& info) { return info.param.name(); };

INSTANTIATE_TEST_SUITE_P(Small, SparseAttentionCuda, ::testing::ValuesIn(small_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Large, SparseAttentionCuda, ::testing::ValuesIn(large_cases()), case_name);

// ---- NaN ------------------------------------------------------------------------------------

// A NaN in q reaches its row's output, lse and dQ, and dK / dV of the keys the row attends;
// nothing of another (batch, head) (cpu/nan_semantics_util.h; keys of the same head that the row
// does not attend may go either way). The kernels' fully-masked tests must not take a NaN row for
// a masked one: whole rows, split rows merged by the combine kernel, and the fp32 kernels; head
// dim 32 (mma.sync) and 64 (warpgroup MMA), blocks 16 (packed) and 64 (whole tiles).
TEST(SparseAttentionCudaSmall, NanInQReachesItsRowAndWhatItAttends) {
  SKIP_WITHOUT_GPU();
  struct Variant {
    DType dtype;
    int64_t block, D, split;
  };
  for (const Variant& var : {Variant{DType::kBF16, 16, 32, 0}, Variant{DType::kBF16, 64, 64, 0},
                             Variant{DType::kF16, 16, 64, 1}, Variant{DType::kBF16, 64, 32, 1},
                             Variant{DType::kF32, 16, 32, 0}}) {
    GpuCase c;
    c.dtype = var.dtype;
    c.block = var.block;
    c.D = var.D;
    c.N = 8;
    c.config = Config::kGlobalLines;
    c.split_blocks = var.split;
    c.seed = kBaseSeed + 3950;
    SCOPED_TRACE(c.name());
    Problem p = make_problem(c);
    const int64_t L = c.L(), z = 1, h = 1, i = L / 2 + 3;
    p.q.set(((z * c.H + h) * L + i) * c.D + 5, std::numeric_limits<double>::quiet_NaN());
    const GpuRun r = run_gpu(p);
    if (r.forward_status.code() == StatusCode::kNotSupported) continue;  // not instantiated
    ASSERT_TRUE(r.forward_status.ok()) << r.forward_status.to_string();
    ASSERT_TRUE(r.backward_status.ok()) << r.backward_status.to_string();
    const std::vector<int64_t> qkv = {c.B, c.H, L, c.D};
    auto the_row = [&](int64_t e) {
      const auto x = test::unravel(e, qkv);
      return x[0] == z && x[1] == h && x[2] == i;
    };
    EXPECT_TRUE(test::nan_exactly_where("out", r.out.values(), the_row));
    EXPECT_TRUE(test::nan_exactly_where("lse", r.lse.values(),
                                        [&](int64_t e) { return e == (z * c.H + h) * L + i; }));
    EXPECT_TRUE(test::nan_exactly_where("dq", r.dq.values(), the_row));
    auto key_grad = [&](int64_t e) {
      const auto x = test::unravel(e, qkv);
      if (x[0] != z || x[1] != h) return test::Expect::kFinite;
      return p.layout.at(h, i / c.block, x[2] / c.block) ? test::Expect::kNaN
                                                         : test::Expect::kEither;
    };
    EXPECT_TRUE(test::nan_where("dk", r.dk.values(), key_grad));
    EXPECT_TRUE(test::nan_where("dv", r.dv.values(), key_grad));
  }
}

// ---- large values ---------------------------------------------------------------------------

// V filled with 1e37 (bf16): the output is the weighted mean of V's rows, 1e37, while a row's sum
// of P V terms passes fp32's largest value (cuda/common/probability_shift.h; before that shift
// these gave inf). Whole rows and split rows (merged by the combine kernel), the mma.sync kernels
// (D 32, packed blocks of 16) and the warpgroup ones (D 64, blocks of 64); lse does not depend on
// V and is checked too.
TEST(SparseAttentionCudaSmall, LargeBf16ValuesStayFinite) {
  SKIP_WITHOUT_GPU();
  struct Variant {
    int64_t block, N, D, split;
  };
  for (const Variant& var : {Variant{16, 40, 32, 0}, Variant{64, 12, 64, 0}, Variant{16, 40, 32, 1},
                             Variant{64, 12, 64, 1}}) {
    GpuCase c;
    c.dtype = DType::kBF16;
    c.block = var.block;
    c.N = var.N;
    c.D = var.D;
    c.config = Config::kGlobalLines;
    c.split_blocks = var.split;
    c.seed = kBaseSeed + 3960;
    SCOPED_TRACE(c.name());
    Problem p = make_problem(c);
    for (int64_t i = 0; i < p.v.numel(); ++i) p.v.set(i, 1e37);
    const AttnForward o = attention_oracle(attention_oracle_problem(p));
    const CpuRun cpu = run_cpu(p);
    const GpuRun r = run_gpu(p);
    if (r.forward_status.code() == StatusCode::kNotSupported) continue;  // not instantiated
    ASSERT_TRUE(r.forward_status.ok()) << r.forward_status.to_string();
    EXPECT_TRUE(within_tolerance("out", r.out.values(), cpu.out.values(), o.out.v, c.dtype));
    EXPECT_TRUE(within_tolerance("lse", r.lse.values(), cpu.lse.values(), o.lse, DType::kF32));
  }
}

// ---- rejections -----------------------------------------------------------------------------

// A small valid GPU problem whose params the rejection tests spoil one at a time.
struct Tensors {
  GpuCase c;
  Problem p;
  HostTensor out_h, lse_h;
  std::unique_ptr<DeviceCopy> q, k, v, out, lse;
  SparseAttentionForwardParams f;
  explicit Tensors(GpuCase gc) : c(gc), p(make_problem(gc)) {
    out_h = qkv_tensor(c);
    lse_h = lse_tensor(c);
    q = std::make_unique<DeviceCopy>(p.q);
    k = std::make_unique<DeviceCopy>(p.k);
    v = std::make_unique<DeviceCopy>(p.v);
    out = std::make_unique<DeviceCopy>(out_h);
    lse = std::make_unique<DeviceCopy>(lse_h);
    f.index = &p.ix;
    f.q = q->view();
    f.k = k->view();
    f.v = v->view();
    f.out = out->view();
    f.lse = lse->view();
    f.options = options_of(c);
  }
};

TEST(SparseAttentionCudaSmall, RejectsHeadDimAbove128) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.D = 129;
  c.B = c.H = 1;
  Tensors t(c);
  std::string why;
  const Status s = can_implement(t.f, &why);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << why;
  EXPECT_NE(why.find("D = 129"), std::string::npos) << why;
  EXPECT_NE(why.find("1 to 128"), std::string::npos) << why;
}

TEST(SparseAttentionCudaSmall, RejectsIndexNotUploaded) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.B = c.H = 1;
  Tensors t(c);
  t.p.ix.device.reset();
  std::string why;
  const Status s = can_implement(t.f, &why);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(why, "index")) << why;
  EXPECT_NE(why.find("upload_block_sparse_index"), std::string::npos) << why;
  // And after a re-split, which drops the device copy.
  ASSERT_TRUE(upload_block_sparse_index(&t.p.ix, 0).ok());
  EXPECT_TRUE(can_implement(t.f).ok());
  ASSERT_TRUE(split_block_sparse_work(1, &t.p.ix).ok());
  EXPECT_EQ(can_implement(t.f).code(), StatusCode::kInvalidArgument);
}

TEST(SparseAttentionCudaSmall, RejectsTooSmallWorkspace) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.config = Config::kBigBird;
  c.N = 16;
  c.B = c.H = 1;
  c.split_blocks = 1;  // split rows need forward partials
  Tensors t(c);
  const size_t bytes = workspace_size(t.f);
  ASSERT_GT(bytes, 0u);
  DeviceBuffer ws(bytes, /*poison=*/true);
  EXPECT_EQ(run(t.f, ws.ptr, bytes - 1).code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_TRUE(run(t.f, ws.ptr, bytes).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Unsplit f16/bf16 forward calls need no workspace at all (the API never allocates).
TEST(SparseAttentionCudaSmall, UnsplitForwardNeedsNoWorkspace) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.B = c.H = 1;
  Tensors t(c);
  EXPECT_EQ(workspace_size(t.f), 0u);
  EXPECT_TRUE(run(t.f, nullptr, 0).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The stream is honoured: a call queued on a user stream completes with that stream.
TEST(SparseAttentionCudaSmall, RunsOnTheGivenStream) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.B = c.H = 1;
  Tensors t(c);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Stream s;
  s.handle = stream;
  EXPECT_TRUE(run(t.f, nullptr, 0, s).ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  t.out->copy_to(t.out_h);
  int64_t nan = 0;
  for (double x : t.out_h.values()) nan += std::isnan(x) ? 1 : 0;
  EXPECT_EQ(nan, 0) << "output not written on the stream";
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace sciattn

// The trainer's CUDA back end and GPU optimizer kernels (label gpu) against the CPU back end and
// CPU optimizer, the specification. Every layer call, forward and backward, in f32, bf16 and
// f16, on seeded random inputs with sizes that break naive code (T = 74 tokens: four chunks of
// 16 and a partial one; C = 20, not a multiple of 8; an odd vocabulary; attention lengths padded
// and not), outputs NaN-poisoned before each call, "+=" outputs starting from random values;
// bitwise determinism (every call run twice); the chunked sums' tiling rule; the tiled LM head
// against the untiled one (bitwise); the layout copy of sequence parallelism against the CPU's
// bytes (its views, and more than 2^31 rows); AdamW, the norm, unscaling and casts against the CPU;
// and the rejections, whose messages name the argument. Each test skips without a CUDA device.
//
// The tolerance rule (train_cuda_test_util.h): ref64 is the CPU back end (fp32, sums in token
// order, statistics in fp64) run on the same inputs rounded to the compute dtype; for these sizes
// it is within a few fp32 ulps of an fp64 evaluation, far below the atol. lowp_ref is ref64 with
// its outputs rounded to the dtype they are stored in (the kernels' only rounding), except where
// a kernel rounds an intermediate: the attention (lowp_ref: sciattn's CPU attention op run in the
// dtype) and the LM head (lowp_ref: the CPU's logits rounded, cross-entropy in fp64, the logits'
// gradient rounded, then the CPU's products). f32 outputs formed from the same (exactly
// representable) inputs have lowp_ref = ref64, so only fp32 summation order remains (atol).
// Test layer (tests/cuda).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/lowp_backend.h"
#include "cuda/train_cuda_test_util.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/cuda_optimizer.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/gradients.h"
#include "train/train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

constexpr int64_t kChunk = 16;
constexpr uint64_t kSeed = 0x5c1a77e2;

std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed);
}

// ---- the layer tests, once per compute dtype ----

class TrainCuda : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    dtype_ = GetParam();
    CudaBackendOptions o;
    o.compute_dtype = dtype_;
    o.token_chunk = kChunk;
    const Status s = make_cuda_backend(o, &gpu_);
    ASSERT_TRUE(s.ok()) << s.to_string();
    cpu_ = cpu_backend(kChunk);
  }

  // Random values rounded to the compute dtype (the inputs both back ends see).
  std::vector<float> input(int64_t n, uint64_t seed, float scale = 1.0f) const {
    return rounded(random_floats(static_cast<size_t>(n), seed, scale), dtype_);
  }
  std::vector<float> low(const std::vector<float>& ref) const { return rounded(ref, dtype_); }

  // The compute dtype's tensor, and an f32 one, in the GPU back end's memory.
  std::unique_ptr<DeviceTensor> act(std::vector<int64_t> sizes) {
    return std::make_unique<DeviceTensor>(*gpu_, dtype_, std::move(sizes));
  }
  std::unique_ptr<DeviceTensor> f32(std::vector<int64_t> sizes) {
    return std::make_unique<DeviceTensor>(*gpu_, DType::kF32, std::move(sizes));
  }

  void sync() {
    const Status s = gpu_->synchronize();
    ASSERT_TRUE(s.ok()) << s.to_string();
  }

  DType dtype_ = DType::kF32;
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<Backend> cpu_;
};

#define EXPECT_OK(expr)                               \
  do {                                                \
    const ::sciattn::Status status_ = (expr);         \
    EXPECT_TRUE(status_.ok()) << status_.to_string(); \
  } while (0)
#define ASSERT_OK(expr)                               \
  do {                                                \
    const ::sciattn::Status status_ = (expr);         \
    ASSERT_TRUE(status_.ok()) << status_.to_string(); \
  } while (0)

TEST_P(TrainCuda, EmbeddingForward) {
  const int64_t B = 2, L = 37, V = 53, P = 40;
  for (const int64_t C : {20, 64}) {
    for (const bool learned : {true, false}) {
      const uint64_t seed = kSeed + static_cast<uint64_t>(C) + (learned ? 1000 : 0);
      SCOPED_TRACE("C " + std::to_string(C) + (learned ? " learned" : " rotary") + " " +
                   seed_note(seed));
      const std::vector<int32_t> tokens = random_tokens(static_cast<size_t>(B * L), V, seed);
      std::vector<float> wte = input(V * C, seed + 1), wpe = input(P * C, seed + 2);
      std::vector<float> ref(static_cast<size_t>(B * L * C), NAN);
      ASSERT_OK(cpu_->embedding_forward({tokens.data(), B, L, view(wte, {V, C}),
                                         learned ? view(wpe, {P, C}) : TensorView{},
                                         view(ref, {B * L, C})}));
      DeviceTokens d_tokens(*gpu_, tokens);
      auto d_wte = act({V, C}), d_wpe = act({P, C}), d_out = act({B * L, C});
      d_wte->upload(wte);
      d_wpe->upload(wpe);
      std::vector<std::byte> first;
      for (int run = 0; run < 2; ++run) {
        d_out->poison();
        ASSERT_OK(gpu_->embedding_forward({d_tokens.data(), B, L, d_wte->view(),
                                           learned ? d_wpe->view() : TensorView{}, d_out->view()}));
        sync();
        if (run == 0) {
          first = d_out->raw();
          EXPECT_TRUE(within_tolerance("out", d_out->download(), low(ref), ref, dtype_));
        } else {
          EXPECT_EQ(first, d_out->raw()) << "embedding_forward differs between two runs";
        }
      }
    }
  }
}

TEST_P(TrainCuda, EmbeddingBackwardEqualsTheCpuBitForBit) {
  const int64_t B = 2, L = 37, C = 20, P = 40;
  // V = 7 makes long runs of one token (the sorted walk); V = 53 short ones.
  for (const int64_t V : {7, 53}) {
    const uint64_t seed = kSeed + 10 + static_cast<uint64_t>(V);
    SCOPED_TRACE("V " + std::to_string(V) + " " + seed_note(seed));
    const std::vector<int32_t> tokens = random_tokens(static_cast<size_t>(B * L), V, seed);
    const std::vector<float> dout = input(B * L * C, seed + 1);
    const std::vector<float> dwte0 = random_floats(static_cast<size_t>(V * C), seed + 2),
                             dwpe0 = random_floats(static_cast<size_t>(P * C), seed + 3);
    std::vector<float> dwte = dwte0, dwpe = dwpe0, dout_cpu = dout;
    ASSERT_OK(cpu_->embedding_backward(
        {tokens.data(), B, L, view(dout_cpu, {B * L, C}), view(dwte, {V, C}), view(dwpe, {P, C})}));
    DeviceTokens d_tokens(*gpu_, tokens);
    auto d_dout = act({B * L, C});
    auto d_dwte = f32({V, C}), d_dwpe = f32({P, C});
    d_dout->upload(dout);
    std::vector<std::byte> first_te, first_pe;
    for (int run = 0; run < 2; ++run) {
      d_dwte->upload(dwte0);
      d_dwpe->upload(dwpe0);
      ASSERT_OK(gpu_->embedding_backward(
          {d_tokens.data(), B, L, d_dout->view(), d_dwte->view(), d_dwpe->view()}));
      sync();
      // The same additions in the same order as the CPU: equal bits, in every compute dtype
      // (the rows of dout hold values of the dtype, exact in fp32).
      const std::vector<float> got_te = d_dwte->download(), got_pe = d_dwpe->download();
      EXPECT_EQ(0, std::memcmp(got_te.data(), dwte.data(), dwte.size() * sizeof(float)))
          << "dwte differs from the CPU's";
      EXPECT_EQ(0, std::memcmp(got_pe.data(), dwpe.data(), dwpe.size() * sizeof(float)))
          << "dwpe differs from the CPU's";
      if (run == 0) {
        first_te = d_dwte->raw();
        first_pe = d_dwpe->raw();
      } else {
        EXPECT_EQ(first_te, d_dwte->raw());
        EXPECT_EQ(first_pe, d_dwpe->raw());
      }
    }
  }
}

TEST_P(TrainCuda, LayerNormForward) {
  const int64_t N = 74;
  for (const int64_t C : {20, 64}) {
    const uint64_t seed = kSeed + 20 + static_cast<uint64_t>(C);
    SCOPED_TRACE("C " + std::to_string(C) + " " + seed_note(seed));
    std::vector<float> x = random_floats(static_cast<size_t>(N * C), seed, 2.0f);
    for (float& v : x) v += 0.75f;  // a mean away from zero
    x = rounded(x, dtype_);
    std::vector<float> w = input(C, seed + 1), b = input(C, seed + 2);
    std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)),
        rstd(static_cast<size_t>(N));
    ASSERT_OK(cpu_->layernorm_forward({view(x, {N, C}), view(w, {C}), view(b, {C}),
                                       view(out, {N, C}), view(mean, {N}), view(rstd, {N})}));
    auto d_x = act({N, C}), d_w = act({C}), d_b = act({C}), d_out = act({N, C});
    auto d_mean = f32({N}), d_rstd = f32({N});
    d_x->upload(x);
    d_w->upload(w);
    d_b->upload(b);
    std::vector<std::byte> first;
    for (int run = 0; run < 2; ++run) {
      d_out->poison();
      d_mean->poison();
      d_rstd->poison();
      ASSERT_OK(gpu_->layernorm_forward(
          {d_x->view(), d_w->view(), d_b->view(), d_out->view(), d_mean->view(), d_rstd->view()}));
      sync();
      if (run == 0) {
        first = d_out->raw();
        EXPECT_TRUE(within_tolerance("out", d_out->download(), low(out), out, dtype_));
        EXPECT_TRUE(within_tolerance("mean", d_mean->download(), mean, mean, DType::kF32));
        EXPECT_TRUE(within_tolerance("rstd", d_rstd->download(), rstd, rstd, DType::kF32));
      } else {
        EXPECT_EQ(first, d_out->raw()) << "layernorm_forward differs between two runs";
      }
    }
  }
}

TEST_P(TrainCuda, LayerNormBackward) {
  const int64_t N = 74;
  for (const int64_t C : {20, 64}) {
    const uint64_t seed = kSeed + 30 + static_cast<uint64_t>(C);
    SCOPED_TRACE("C " + std::to_string(C) + " " + seed_note(seed));
    std::vector<float> x = input(N * C, seed, 2.0f), w = input(C, seed + 1), b = input(C, seed + 2),
                       dout = input(N * C, seed + 3), din0 = input(N * C, seed + 4);
    const std::vector<float> dw0 = random_floats(static_cast<size_t>(C), seed + 5),
                             db0 = random_floats(static_cast<size_t>(C), seed + 6);
    std::vector<float> y(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)),
        rstd(static_cast<size_t>(N));
    ASSERT_OK(cpu_->layernorm_forward({view(x, {N, C}), view(w, {C}), view(b, {C}), view(y, {N, C}),
                                       view(mean, {N}), view(rstd, {N})}));
    std::vector<float> din = din0, dw = dw0, db = db0;
    ASSERT_OK(cpu_->layernorm_backward({view(x, {N, C}), view(w, {C}), view(mean, {N}),
                                        view(rstd, {N}), view(dout, {N, C}), view(din, {N, C}),
                                        view(dw, {C}), view(db, {C})}));
    // The GPU reads the CPU's statistics, so both backwards see the same inputs.
    auto d_x = act({N, C}), d_w = act({C}), d_dout = act({N, C}), d_din = act({N, C});
    auto d_mean = f32({N}), d_rstd = f32({N}), d_dw = f32({C}), d_db = f32({C});
    d_x->upload(x);
    d_w->upload(w);
    d_dout->upload(dout);
    d_mean->upload(mean);
    d_rstd->upload(rstd);
    std::vector<std::byte> first_din, first_dw, first_db;
    for (int run = 0; run < 2; ++run) {
      d_din->upload(din0);
      d_dw->upload(dw0);
      d_db->upload(db0);
      ASSERT_OK(
          gpu_->layernorm_backward({d_x->view(), d_w->view(), d_mean->view(), d_rstd->view(),
                                    d_dout->view(), d_din->view(), d_dw->view(), d_db->view()}));
      sync();
      if (run == 0) {
        first_din = d_din->raw();
        first_dw = d_dw->raw();
        first_db = d_db->raw();
        EXPECT_TRUE(within_tolerance("din", d_din->download(), low(din), din, dtype_));
        EXPECT_TRUE(within_tolerance("dweight", d_dw->download(), dw, dw, DType::kF32));
        EXPECT_TRUE(within_tolerance("dbias", d_db->download(), db, db, DType::kF32));
      } else {
        EXPECT_EQ(first_din, d_din->raw()) << "din differs between two runs";
        EXPECT_EQ(first_dw, d_dw->raw()) << "dweight differs between two runs";
        EXPECT_EQ(first_db, d_db->raw()) << "dbias differs between two runs";
      }
    }
    // Tiles of whole chunks ([0, 32), then [32, 74)) give the bits of one call.
    d_dw->upload(dw0);
    d_db->upload(db0);
    d_din->upload(din0);
    const int64_t split = 2 * kChunk;
    const std::pair<int64_t, int64_t> tiles[] = {{0, split}, {split, N - split}};
    for (const auto& [r0, rows] : tiles) {
      ASSERT_OK(gpu_->layernorm_backward(
          {d_x->view({rows, C}, r0 * C), d_w->view(), d_mean->view({rows}, r0),
           d_rstd->view({rows}, r0), d_dout->view({rows, C}, r0 * C),
           d_din->view({rows, C}, r0 * C), d_dw->view(), d_db->view()}));
    }
    sync();
    EXPECT_EQ(first_dw, d_dw->raw()) << "dweight of two tiles differs from one call";
    EXPECT_EQ(first_db, d_db->raw()) << "dbias of two tiles differs from one call";
    EXPECT_EQ(first_din, d_din->raw()) << "din of two tiles differs from one call";
  }
}

TEST_P(TrainCuda, LinearForward) {
  const int64_t N = 74;
  struct Shape {
    int64_t IC, OC;
    bool bias;
  };
  for (const Shape& s : {Shape{20, 36, true}, Shape{64, 48, false}, Shape{64, 40, true}}) {
    const uint64_t seed = kSeed + 40 + static_cast<uint64_t>(s.IC * 100 + s.OC);
    SCOPED_TRACE("IC " + std::to_string(s.IC) + " OC " + std::to_string(s.OC) +
                 (s.bias ? " bias " : " ") + seed_note(seed));
    std::vector<float> x = input(N * s.IC, seed), w = input(s.OC * s.IC, seed + 1),
                       b = input(s.OC, seed + 2);
    std::vector<float> out(static_cast<size_t>(N * s.OC));
    ASSERT_OK(
        cpu_->linear_forward({view(x, {N, s.IC}), view(w, {s.OC, s.IC}),
                              s.bias ? view(b, {s.OC}) : TensorView{}, view(out, {N, s.OC})}));
    auto d_x = act({N, s.IC}), d_w = act({s.OC, s.IC}), d_b = act({s.OC}), d_out = act({N, s.OC});
    d_x->upload(x);
    d_w->upload(w);
    d_b->upload(b);
    std::vector<std::byte> first;
    for (int run = 0; run < 2; ++run) {
      d_out->poison();
      ASSERT_OK(gpu_->linear_forward(
          {d_x->view(), d_w->view(), s.bias ? d_b->view() : TensorView{}, d_out->view()}));
      sync();
      if (run == 0) {
        first = d_out->raw();
        EXPECT_TRUE(within_tolerance("out", d_out->download(), low(out), out, dtype_));
      } else {
        EXPECT_EQ(first, d_out->raw()) << "linear_forward differs between two runs";
      }
    }
  }
}

TEST_P(TrainCuda, LinearBackward) {
  const int64_t N = 74;
  struct Shape {
    int64_t IC, OC;
    bool din, bias;
  };
  for (const Shape& s :
       {Shape{20, 36, true, true}, Shape{64, 48, true, false}, Shape{20, 36, false, true}}) {
    const uint64_t seed = kSeed + 50 + static_cast<uint64_t>(s.IC * 100 + s.OC) + (s.din ? 7 : 0);
    SCOPED_TRACE("IC " + std::to_string(s.IC) + " OC " + std::to_string(s.OC) +
                 (s.din ? " din" : " no din") + (s.bias ? " dbias " : " ") + seed_note(seed));
    std::vector<float> x = input(N * s.IC, seed), w = input(s.OC * s.IC, seed + 1),
                       dout = input(N * s.OC, seed + 2);
    const std::vector<float> dw0 = random_floats(static_cast<size_t>(s.OC * s.IC), seed + 3),
                             db0 = random_floats(static_cast<size_t>(s.OC), seed + 4);
    std::vector<float> din(static_cast<size_t>(N * s.IC)), dw = dw0, db = db0;
    ASSERT_OK(
        cpu_->linear_backward({view(x, {N, s.IC}), view(w, {s.OC, s.IC}), view(dout, {N, s.OC}),
                               s.din ? view(din, {N, s.IC}) : TensorView{}, view(dw, {s.OC, s.IC}),
                               s.bias ? view(db, {s.OC}) : TensorView{}}));
    auto d_x = act({N, s.IC}), d_w = act({s.OC, s.IC}), d_dout = act({N, s.OC}),
         d_din = act({N, s.IC});
    auto d_dw = f32({s.OC, s.IC}), d_db = f32({s.OC});
    d_x->upload(x);
    d_w->upload(w);
    d_dout->upload(dout);
    std::vector<std::byte> first_din, first_dw, first_db;
    for (int run = 0; run < 2; ++run) {
      d_din->poison();
      d_dw->upload(dw0);
      d_db->upload(db0);
      ASSERT_OK(gpu_->linear_backward({d_x->view(), d_w->view(), d_dout->view(),
                                       s.din ? d_din->view() : TensorView{}, d_dw->view(),
                                       s.bias ? d_db->view() : TensorView{}}));
      sync();
      if (run == 0) {
        first_din = d_din->raw();
        first_dw = d_dw->raw();
        first_db = d_db->raw();
        if (s.din) {
          EXPECT_TRUE(within_tolerance("din", d_din->download(), low(din), din, dtype_));
        }
        EXPECT_TRUE(within_tolerance("dweight", d_dw->download(), dw, dw, DType::kF32));
        EXPECT_TRUE(within_tolerance("dbias", d_db->download(), db, db, DType::kF32));
      } else {
        if (s.din) {
          EXPECT_EQ(first_din, d_din->raw()) << "din differs between two runs";
        }
        EXPECT_EQ(first_dw, d_dw->raw()) << "dweight differs between two runs";
        EXPECT_EQ(first_db, d_db->raw()) << "dbias differs between two runs";
      }
    }
    // Tiles of whole chunks give the bits of one call.
    d_dw->upload(dw0);
    d_db->upload(db0);
    const int64_t split = 2 * kChunk;
    const std::pair<int64_t, int64_t> tiles[] = {{0, split}, {split, N - split}};
    for (const auto& [r0, rows] : tiles) {
      ASSERT_OK(gpu_->linear_backward({d_x->view({rows, s.IC}, r0 * s.IC), d_w->view(),
                                       d_dout->view({rows, s.OC}, r0 * s.OC),
                                       s.din ? d_din->view({rows, s.IC}, r0 * s.IC) : TensorView{},
                                       d_dw->view(), s.bias ? d_db->view() : TensorView{}}));
    }
    sync();
    EXPECT_EQ(first_dw, d_dw->raw()) << "dweight of two tiles differs from one call";
    EXPECT_EQ(first_db, d_db->raw()) << "dbias of two tiles differs from one call";
    if (s.din) {
      EXPECT_EQ(first_din, d_din->raw()) << "din of two tiles differs from one call";
    }
  }
}

TEST_P(TrainCuda, GeluForwardAndBackward) {
  const int64_t N = 74, F = 44;
  const uint64_t seed = kSeed + 60;
  SCOPED_TRACE(seed_note(seed));
  std::vector<float> x = input(N * F, seed, 3.0f), dout = input(N * F, seed + 1);
  std::vector<float> y(x.size()), dx(x.size());
  ASSERT_OK(cpu_->gelu_forward({view(x, {N, F}), view(y, {N, F})}));
  ASSERT_OK(cpu_->gelu_backward({view(x, {N, F}), view(dout, {N, F}), view(dx, {N, F})}));
  auto d_x = act({N, F}), d_y = act({N, F}), d_dout = act({N, F}), d_dx = act({N, F});
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "separate outputs");
    std::vector<std::byte> first_y, first_dx;
    for (int run = 0; run < 2; ++run) {
      d_x->upload(x);
      d_dout->upload(dout);
      if (in_place) {
        ASSERT_OK(gpu_->gelu_backward({d_x->view(), d_dout->view(), d_dout->view()}));
        ASSERT_OK(gpu_->gelu_forward({d_x->view(), d_x->view()}));
      } else {
        d_y->poison();
        d_dx->poison();
        ASSERT_OK(gpu_->gelu_forward({d_x->view(), d_y->view()}));
        ASSERT_OK(gpu_->gelu_backward({d_x->view(), d_dout->view(), d_dx->view()}));
      }
      sync();
      const DeviceTensor& out_y = in_place ? *d_x : *d_y;
      const DeviceTensor& out_dx = in_place ? *d_dout : *d_dx;
      if (run == 0) {
        first_y = out_y.raw();
        first_dx = out_dx.raw();
        EXPECT_TRUE(within_tolerance("gelu", out_y.download(), low(y), y, dtype_));
        EXPECT_TRUE(within_tolerance("gelu backward", out_dx.download(), low(dx), dx, dtype_));
      } else {
        EXPECT_EQ(first_y, out_y.raw()) << "gelu_forward differs between two runs";
        EXPECT_EQ(first_dx, out_dx.raw()) << "gelu_backward differs between two runs";
      }
    }
  }
}

TEST_P(TrainCuda, RotaryAndItsInverse) {
  const int64_t B = 2, L = 37;
  // D 8: element accesses (D / 2 is no multiple of a 16-byte vector); D 32 with 3 heads: vectors.
  for (const auto& [H, D] :
       {std::pair<int64_t, int64_t>{2, 8}, std::pair<int64_t, int64_t>{3, 32}}) {
    const int64_t C = H * D;
    const uint64_t seed = kSeed + 70 + static_cast<uint64_t>(D);
    SCOPED_TRACE("H " + std::to_string(H) + " D " + std::to_string(D) + " " + seed_note(seed));
    const std::vector<float> qkv = input(B * L * 3 * C, seed);
    auto d_qkv = act({B, L, 3, H, D});
    for (const bool inverse : {false, true}) {
      SCOPED_TRACE(inverse ? "inverse" : "forward");
      std::vector<float> ref = qkv;
      ASSERT_OK(cpu_->rotary({view(ref, {B, L, 3, H, D}), 10000.0f, inverse}));
      std::vector<std::byte> first;
      for (int run = 0; run < 2; ++run) {
        d_qkv->upload(qkv);
        ASSERT_OK(gpu_->rotary({d_qkv->view(), 10000.0f, inverse}));
        sync();
        if (run == 0) {
          first = d_qkv->raw();
          // Same angles (fp64, rounded once) and the same roundings as the CPU: the fp32 values
          // agree, so the GPU equals lowp_ref.
          EXPECT_TRUE(within_tolerance("qkv", d_qkv->download(), low(ref), ref, dtype_));
        } else {
          EXPECT_EQ(first, d_qkv->raw()) << "rotary differs between two runs";
        }
      }
    }
  }
}

TEST_P(TrainCuda, Add) {
  const int64_t N = 74, C = 20;
  const uint64_t seed = kSeed + 80;
  SCOPED_TRACE(seed_note(seed));
  std::vector<float> a = input(N * C, seed), b = input(N * C, seed + 1), ref(a.size());
  ASSERT_OK(cpu_->add({view(a, {N, C}), view(b, {N, C}), view(ref, {N, C})}));
  auto d_a = act({N, C}), d_b = act({N, C}), d_out = act({N, C});
  d_b->upload(b);
  for (const bool in_place : {false, true}) {
    d_a->upload(a);
    d_out->poison();
    const DeviceTensor& out = in_place ? *d_a : *d_out;
    ASSERT_OK(gpu_->add({d_a->view(), d_b->view(), out.view()}));
    sync();
    EXPECT_TRUE(
        within_tolerance(in_place ? "out = a" : "out", out.download(), low(ref), ref, dtype_));
  }
}

// ---- the layout copy (sequence parallelism) ----

// A view of element `offset` on of `base` with these sizes and element strides.
TensorView strided_view(void* base, DType dtype, Device device, int64_t offset,
                        const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  TensorView v;
  v.data = static_cast<std::byte*>(base) + offset * static_cast<int64_t>(dtype_size(dtype));
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    v.sizes[d] = sizes[d];
    v.strides[d] = strides[d];
  }
  return v;
}

// Row-major strides of `sizes`, the last dimension's rows `pad` elements apart beyond their size.
std::vector<int64_t> packed_strides(const std::vector<int64_t>& sizes, int64_t pad = 0) {
  std::vector<int64_t> st(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    st[d] = stride;
    stride *= sizes[d] + (d + 1 == sizes.size() ? pad : 0);
  }
  return st;
}

struct CopyCase {
  std::string name;
  std::vector<int64_t> sizes, src_strides, dst_strides;
  int64_t src_offset = 0, dst_offset = 0;
};

// The layouts GptModel's all-to-alls connect (gpt_model.cpp): the token split, the head split and
// the chunks, [P, B, Ls, parts, E] in chunk order, copied both ways as the model does.
std::vector<CopyCase> ulysses_cases(int64_t P, int64_t B, int64_t Ls, int64_t parts, int64_t E) {
  const std::vector<int64_t> sizes = {P, B, Ls, parts, E};
  const std::vector<int64_t> token = {E, Ls * parts * P * E, parts * P * E, P * E, 1};
  const std::vector<int64_t> head = {Ls * parts * E, P * Ls * parts * E, parts * E, E, 1};
  const std::vector<int64_t> chunks = packed_strides(sizes);
  const std::string n = "P " + std::to_string(P) + ", B " + std::to_string(B) + ", Ls " +
                        std::to_string(Ls) + ", parts " + std::to_string(parts) + ", E " +
                        std::to_string(E);
  return {{"token split -> chunks, " + n, sizes, token, chunks},
          {"chunks -> head split, " + n, sizes, chunks, head},
          {"head split -> chunks, " + n, sizes, head, chunks},
          {"chunks -> token split, " + n, sizes, chunks, token}};
}

// The CUDA back end's strided_copy gives the CPU back end's bytes on every view: the all-to-alls'
// layouts (runs of E elements, of 16 bytes and more, and of sizes no vector divides), a
// permutation whose last dimension is strided on the source, a last dimension strided on both
// sides, odd lengths at addresses no vector allows, size-1 dimensions up to rank 6, padded rows,
// a packed copy merged into one long run, and a single element. Bytes the view does not cover
// keep their poison on both sides.
TEST_P(TrainCuda, StridedCopyEqualsTheCpuBitForBit) {
  const uint64_t seed = kSeed + 90;
  SCOPED_TRACE(seed_note(seed));
  std::vector<CopyCase> cases;
  for (const auto& u :
       {std::array<int64_t, 5>{2, 2, 5, 3, 12}, std::array<int64_t, 5>{4, 1, 3, 1, 8},
        std::array<int64_t, 5>{2, 1, 7, 3, 5}, std::array<int64_t, 5>{2, 3, 4, 1, 32}}) {
    for (CopyCase& c : ulysses_cases(u[0], u[1], u[2], u[3], u[4])) cases.push_back(c);
  }
  // [3, 5, 7, 6] read from a packed [7, 3, 6, 5] (axes 1, 3, 0, 2 of it).
  cases.push_back({"permutation, source last dimension strided",
                   {3, 5, 7, 6},
                   {30, 1, 90, 5},
                   packed_strides({3, 5, 7, 6})});
  cases.push_back({"last dimension strided on both sides", {9, 13}, {40, 3}, {26, 2}});
  cases.push_back({"odd run at odd addresses", {1001}, {1}, {1}, 1, 3});
  cases.push_back({"odd rows at odd addresses", {7, 9}, {11, 1}, {9, 1}, 1, 0});
  cases.push_back({"rank 6 with size-1 dimensions",
                   {1, 2, 1, 3, 5, 8},
                   packed_strides({1, 2, 1, 3, 5, 8}, 1),
                   packed_strides({1, 2, 1, 3, 5, 8})});
  cases.push_back({"padded rows to packed", {33, 24}, {32, 1}, {24, 1}});
  cases.push_back({"packed, merged into one run",
                   {4, 50, 64},
                   packed_strides({4, 50, 64}),
                   packed_strides({4, 50, 64})});
  cases.push_back({"one element", {1}, {1}, {1}, 2, 5});
  const size_t es = dtype_size(dtype_);
  for (const CopyCase& c : cases) {
    SCOPED_TRACE(c.name);
    int64_t src_extent = c.src_offset + 1, dst_extent = c.dst_offset + 1;
    for (size_t d = 0; d < c.sizes.size(); ++d) {
      src_extent += (c.sizes[d] - 1) * c.src_strides[d];
      dst_extent += (c.sizes[d] - 1) * c.dst_strides[d];
    }
    // Random bytes in, 0xff (NaN in every float dtype) in the destination.
    const std::vector<float> noise = random_floats(static_cast<size_t>(src_extent) * es,
                                                   seed + static_cast<uint64_t>(src_extent));
    std::vector<std::byte> src(static_cast<size_t>(src_extent) * es);
    for (size_t i = 0; i < src.size(); ++i) {
      src[i] = static_cast<std::byte>(static_cast<int>((noise[i] + 1.0f) * 127.5f) & 0xff);
    }
    std::vector<std::byte> cpu_dst(static_cast<size_t>(dst_extent) * es, std::byte{0xff});
    ASSERT_OK(cpu_->strided_copy(
        {strided_view(src.data(), dtype_, Device::kCpu, c.src_offset, c.sizes, c.src_strides),
         strided_view(cpu_dst.data(), dtype_, Device::kCpu, c.dst_offset, c.sizes,
                      c.dst_strides)}));
    void *d_src = nullptr, *d_dst = nullptr;
    ASSERT_OK(gpu_->allocate(src.size(), &d_src));
    ASSERT_OK(gpu_->allocate(cpu_dst.size(), &d_dst));
    ASSERT_OK(gpu_->copy_to_device(d_src, src.data(), src.size()));
    const std::vector<std::byte> poison(cpu_dst.size(), std::byte{0xff});
    ASSERT_OK(gpu_->copy_to_device(d_dst, poison.data(), poison.size()));
    EXPECT_OK(gpu_->strided_copy(
        {strided_view(d_src, dtype_, Device::kCuda, c.src_offset, c.sizes, c.src_strides),
         strided_view(d_dst, dtype_, Device::kCuda, c.dst_offset, c.sizes, c.dst_strides)}));
    sync();
    std::vector<std::byte> got(cpu_dst.size());
    ASSERT_OK(gpu_->copy_to_host(got.data(), d_dst, got.size()));
    gpu_->release(d_src);
    gpu_->release(d_dst);
    EXPECT_TRUE(got == cpu_dst);
    EXPECT_FALSE(cpu_dst == poison) << "the reference wrote nothing";
  }
}

TEST_P(TrainCuda, CausalAttention) {
  const int64_t B = 2, H = 2, D = 32, C = H * D;
  // 37: padded to 48 (block 16); 96: block 32, no padding.
  for (const int64_t L : {37, 96}) {
    const uint64_t seed = kSeed + 90 + static_cast<uint64_t>(L);
    SCOPED_TRACE("L " + std::to_string(L) + " " + seed_note(seed));
    GptConfig config = tiny_config(PositionEncoding::kLearned, true, L);
    config.n_heads = H;
    config.d_model = C;
    AttentionPlan plan;
    ASSERT_OK(plan_attention(config, nullptr, &plan));
    const int64_t Lp = plan.padded_length;
    std::vector<float> qkv = input(B * L * 3 * C, seed), dout = input(B * L * C, seed + 1);
    std::vector<float> out(static_cast<size_t>(B * L * C)), lse(static_cast<size_t>(B * H * Lp)),
        dqkv(qkv.size());
    ASSERT_OK(cpu_->attention_forward(
        {&plan.index, view(qkv, {B, L, 3, H, D}), view(out, {B, L, H, D}), view(lse, {B, H, Lp})}));
    ASSERT_OK(cpu_->attention_backward({&plan.index, view(qkv, {B, L, 3, H, D}),
                                        view(out, {B, L, H, D}), view(lse, {B, H, Lp}),
                                        view(dout, {B, L, H, D}), view(dqkv, {B, L, 3, H, D})}));
    AttentionResult lowp{low(out), lse, low(dqkv)};
    if (dtype_ != DType::kF32) lowp = cpu_attention_in(dtype_, plan.index, qkv, dout, B, L, H, D);

    auto d_qkv = act({B, L, 3, H, D}), d_out = act({B, L, H, D}), d_dout = act({B, L, H, D}),
         d_dqkv = act({B, L, 3, H, D});
    auto d_lse = f32({B, H, Lp});
    d_qkv->upload(qkv);
    d_dout->upload(dout);
    std::vector<std::byte> first_out, first_dqkv;
    for (int run = 0; run < 2; ++run) {
      d_out->poison();
      d_lse->poison();
      d_dqkv->poison();
      // The index is not uploaded: the back end uploads its own copy once.
      ASSERT_OK(
          gpu_->attention_forward({&plan.index, d_qkv->view(), d_out->view(), d_lse->view()}));
      ASSERT_OK(gpu_->attention_backward({&plan.index, d_qkv->view(), d_out->view(), d_lse->view(),
                                          d_dout->view(), d_dqkv->view()}));
      sync();
      if (run == 0) {
        first_out = d_out->raw();
        first_dqkv = d_dqkv->raw();
        EXPECT_TRUE(within_tolerance("out", d_out->download(), lowp.out, out, dtype_));
        EXPECT_TRUE(within_tolerance("lse", d_lse->download(), lowp.lse, lse, DType::kF32));
        EXPECT_TRUE(within_tolerance("dqkv", d_dqkv->download(), lowp.dqkv, dqkv, dtype_));
      } else {
        EXPECT_EQ(first_out, d_out->raw()) << "attention out differs between two runs";
        EXPECT_EQ(first_dqkv, d_dqkv->raw()) << "attention dqkv differs between two runs";
      }
    }
  }
}

TEST_P(TrainCuda, LmHeadTiledAgainstCpuAndUntiled) {
  const int64_t N = 74, C = 20, V = 53, tile = 2 * kChunk;  // tiles of 32, 32 and 10 tokens
  const float grad_scale = 1.0f / 74.0f;
  const uint64_t seed = kSeed + 100;
  SCOPED_TRACE(seed_note(seed));
  std::vector<float> x = input(N * C, seed), w = input(V * C, seed + 1, 2.0f);
  const std::vector<int32_t> targets = random_tokens(static_cast<size_t>(N), V, seed + 2);
  const std::vector<float> dw0 = random_floats(static_cast<size_t>(V * C), seed + 3, 0.1f);
  std::vector<float> losses(static_cast<size_t>(N)), din(static_cast<size_t>(N * C)),
      dw = dw0, logits(static_cast<size_t>(tile * V));
  LmHeadParams cp;
  cp.in = view(x, {N, C});
  cp.weight = view(w, {V, C});
  cp.targets = targets.data();
  cp.losses = view(losses, {N});
  cp.din = view(din, {N, C});
  cp.dweight = view(dw, {V, C});
  cp.logits = view(logits, {tile, V});
  cp.grad_scale = grad_scale;
  cp.tile_rows = tile;
  ASSERT_OK(cpu_->lm_head_loss(cp));
  LmResult lowp{losses, low(din), dw};
  if (dtype_ != DType::kF32)
    lowp = lm_head_lowp(*cpu_, dtype_, x, w, targets, dw0, N, C, V, grad_scale);

  DeviceTokens d_targets(*gpu_, targets);
  auto d_x = act({N, C}), d_w = act({V, C}), d_din = act({N, C}), d_tile = act({tile, V}),
       d_all = act({N, V});
  auto d_losses = f32({N}), d_dw = f32({V, C});
  d_x->upload(x);
  d_w->upload(w);
  LmHeadParams gp;
  gp.in = d_x->view();
  gp.weight = d_w->view();
  gp.targets = d_targets.data();
  gp.losses = d_losses->view();
  gp.din = d_din->view();
  gp.dweight = d_dw->view();
  gp.logits = d_tile->view();
  gp.grad_scale = grad_scale;
  gp.tile_rows = tile;
  std::vector<std::byte> first_losses, first_din, first_dw;
  for (int run = 0; run < 2; ++run) {
    d_losses->poison();
    d_din->poison();
    d_tile->poison();
    d_dw->upload(dw0);
    ASSERT_OK(gpu_->lm_head_loss(gp));
    sync();
    if (run == 0) {
      first_losses = d_losses->raw();
      first_din = d_din->raw();
      first_dw = d_dw->raw();
      EXPECT_TRUE(within_tolerance("losses", d_losses->download(), lowp.losses, losses, dtype_));
      EXPECT_TRUE(within_tolerance("din", d_din->download(), lowp.din, din, dtype_));
      EXPECT_TRUE(within_tolerance("dweight", d_dw->download(), lowp.dweight, dw, dtype_));
    } else {
      EXPECT_EQ(first_losses, d_losses->raw()) << "losses differ between two runs";
      EXPECT_EQ(first_din, d_din->raw()) << "din differs between two runs";
      EXPECT_EQ(first_dw, d_dw->raw()) << "dweight differs between two runs";
    }
  }
  // The loss alone (no gradients) reads the same logits: the same losses.
  LmHeadParams loss_only = gp;
  loss_only.din = TensorView{};
  loss_only.dweight = TensorView{};
  d_losses->poison();
  ASSERT_OK(gpu_->lm_head_loss(loss_only));
  sync();
  EXPECT_EQ(first_losses, d_losses->raw()) << "the loss-only call's losses differ";

  // Untiled: all [N, V] logits from the forward, gradients in the backward; the same chunks, so
  // the same bits as the tiled call.
  d_losses->poison();
  d_din->poison();
  d_all->poison();
  d_dw->upload(dw0);
  ASSERT_OK(gpu_->lm_head_forward(
      {d_x->view(), d_w->view(), d_losses->view(), d_targets.data(), d_all->view()}));
  LmHeadBackwardParams bp;
  bp.in = d_x->view();
  bp.weight = d_w->view();
  bp.targets = d_targets.data();
  bp.logits = d_all->view();
  bp.din = d_din->view();
  bp.dweight = d_dw->view();
  bp.grad_scale = grad_scale;
  ASSERT_OK(gpu_->lm_head_backward(bp));
  sync();
  EXPECT_EQ(first_losses, d_losses->raw()) << "untiled losses differ from the tiled ones";
  EXPECT_EQ(first_din, d_din->raw()) << "untiled din differs from the tiled one";
  EXPECT_EQ(first_dw, d_dw->raw()) << "untiled dweight differs from the tiled one";

  // A tile of one chunk gives the same bits too.
  std::unique_ptr<DeviceTensor> d_small = act({kChunk, V});
  LmHeadParams one_chunk = gp;
  one_chunk.logits = d_small->view();
  one_chunk.tile_rows = kChunk;
  d_losses->poison();
  d_din->poison();
  d_dw->upload(dw0);
  ASSERT_OK(gpu_->lm_head_loss(one_chunk));
  sync();
  EXPECT_EQ(first_losses, d_losses->raw()) << "tiles of one chunk: losses differ";
  EXPECT_EQ(first_din, d_din->raw()) << "tiles of one chunk: din differs";
  EXPECT_EQ(first_dw, d_dw->raw()) << "tiles of one chunk: dweight differs";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TrainCuda,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(dtype_name(param.param));
                         });

// ---- rejections ----

// A bf16 back end and a few small tensors.
class TrainCudaRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    CudaBackendOptions o;
    o.token_chunk = kChunk;
    const Status s = make_cuda_backend(o, &gpu_);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  void expect_rejects(const Status& s, std::initializer_list<const char*> words) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    for (const char* w : words) {
      EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s.message();
    }
  }
  std::unique_ptr<CudaBackend> gpu_;
};

TEST(TrainCudaOptions, RejectionsNameTheOption) {
  std::unique_ptr<CudaBackend> be;
  CudaBackendOptions o;
  o.compute_dtype = DType::kBool;
  Status s = make_cuda_backend(o, &be);
  if (!built_with_cuda()) GTEST_SKIP() << "no CUDA in this build";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compute_dtype"), std::string::npos) << s.message();
  o = CudaBackendOptions{};
  o.token_chunk = 12;
  s = make_cuda_backend(o, &be);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token_chunk"), std::string::npos) << s.message();
  o = CudaBackendOptions{};
  o.device = 1000;
  s = make_cuda_backend(o, &be);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("device"), std::string::npos) << s.message();
  EXPECT_EQ(be, nullptr);
}

TEST_F(TrainCudaRejects, WrongDtypesShapesAndMemory) {
  const int64_t N = 8, C = 4;
  DeviceTensor x(*gpu_, DType::kBF16, {N, C}), w32(*gpu_, DType::kF32, {C, C}),
      out(*gpu_, DType::kBF16, {N, C}), w(*gpu_, DType::kBF16, {C, C});
  expect_rejects(gpu_->linear_forward({x.view(), w32.view(), TensorView{}, out.view()}),
                 {"linear_forward", "weight", "bf16", "f32"});
  expect_rejects(gpu_->linear_forward({x.view(), w.view(), TensorView{}, out.view({N, C + 1})}),
                 {"out", "shape"});
  std::vector<float> host(static_cast<size_t>(N * C));
  expect_rejects(gpu_->linear_forward({view(host, {N, C}), w.view(), TensorView{}, out.view()}),
                 {"in", "CUDA memory"});
  DeviceTensor mean(*gpu_, DType::kBF16, {N}), rstd(*gpu_, DType::kF32, {N}),
      lw(*gpu_, DType::kBF16, {C});
  expect_rejects(gpu_->layernorm_forward(
                     {x.view(), lw.view(), lw.view(), out.view(), mean.view(), rstd.view()}),
                 {"layernorm_forward", "mean", "f32"});
  DeviceTensor dw_bf16(*gpu_, DType::kBF16, {C, C});
  expect_rejects(gpu_->linear_backward(
                     {x.view(), w.view(), out.view(), TensorView{}, dw_bf16.view(), TensorView{}}),
                 {"dweight", "f32"});
}

// strided_copy's refusals (the CPU's words, CUDA memory instead of host memory).
TEST_F(TrainCudaRejects, StridedCopyViews) {
  DeviceTensor a(*gpu_, DType::kBF16, {4, 6}), b(*gpu_, DType::kBF16, {4, 6}),
      f(*gpu_, DType::kF32, {4, 6});
  expect_rejects(gpu_->strided_copy({TensorView{}, b.view()}),
                 {"strided_copy: src and dst must be present"});
  std::vector<float> host(24);
  expect_rejects(gpu_->strided_copy({view(host, {4, 6}), b.view()}),
                 {"strided_copy: src and dst must be in CUDA memory"});
  expect_rejects(gpu_->strided_copy({a.view(), b.view({6, 4})}),
                 {"dst must have src's sizes and dtype", "src [4, 6] bf16, dst [6, 4] bf16"});
  expect_rejects(gpu_->strided_copy({a.view(), f.view()}), {"dst [4, 6] f32"});
  TensorView rank7 = a.view();
  rank7.rank = 7;
  expect_rejects(gpu_->strided_copy({rank7, rank7}), {"rank 1 to 6"});
}

// A copy of more than 2^31 rows (the 64-bit index path) in little memory: the source broadcasts
// two f32 values to every row (stride 0), the destination's rows of [2^16, 2^15 + 1, 2] repeat
// over the first dimension (stride 0), so every row of one value of that dimension lands on
// distinct elements; all must hold the two source values.
TEST(TrainCudaStridedCopy, PastTwoToTheThirtyOneRows) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions o;
  o.compute_dtype = DType::kF32;
  o.token_chunk = kChunk;
  std::unique_ptr<CudaBackend> gpu;
  ASSERT_OK(make_cuda_backend(o, &gpu));
  const int64_t outer = int64_t{1} << 16, inner = (int64_t{1} << 15) + 1;
  ASSERT_GT(outer * inner, int64_t{1} << 31);
  DeviceTensor src(*gpu, DType::kF32, {2}), dst(*gpu, DType::kF32, {inner, 2});
  src.upload({1.5f, -2.25f});
  dst.poison();
  TensorView s = src.view(), d = dst.view();
  s.rank = d.rank = 3;
  const int64_t sizes[3] = {outer, inner, 2}, ss[3] = {0, 0, 1}, ds[3] = {0, 2, 1};
  for (int k = 0; k < 3; ++k) {
    s.sizes[k] = d.sizes[k] = sizes[k];
    s.strides[k] = ss[k];
    d.strides[k] = ds[k];
  }
  ASSERT_OK(gpu->strided_copy({s, d}));
  ASSERT_OK(gpu->synchronize());
  const std::vector<float> got = dst.download();
  int64_t wrong = 0;
  for (int64_t i = 0; i < inner; ++i) {
    const size_t k = static_cast<size_t>(2 * i);
    wrong += got[k] != 1.5f || got[k + 1] != -2.25f ? 1 : 0;
  }
  EXPECT_EQ(wrong, 0);
}

TEST_F(TrainCudaRejects, AttentionWithoutIndexOrWithAMismatchedOne) {
  const int64_t B = 1, L = 32, H = 2, D = 32;
  DeviceTensor qkv(*gpu_, DType::kBF16, {B, L, 3, H, D}), out(*gpu_, DType::kBF16, {B, L, H, D}),
      lse(*gpu_, DType::kF32, {B, H, L});
  expect_rejects(gpu_->attention_forward({nullptr, qkv.view(), out.view(), lse.view()}),
                 {"attention_forward", "index"});
  GptConfig config = tiny_config(PositionEncoding::kLearned, true, L);
  config.n_heads = 2 * H;  // an index for other heads
  config.d_model = 2 * H * D;
  AttentionPlan plan;
  ASSERT_OK(plan_attention(config, nullptr, &plan));
  expect_rejects(gpu_->attention_forward({&plan.index, qkv.view(), out.view(), lse.view()}),
                 {"index", "does not fit"});
}

TEST_F(TrainCudaRejects, LmHeadTileAndTargets) {
  const int64_t N = 8, C = 4, V = 5;
  DeviceTensor x(*gpu_, DType::kBF16, {N, C}), w(*gpu_, DType::kBF16, {V, C}),
      logits(*gpu_, DType::kBF16, {12, V}), losses(*gpu_, DType::kF32, {N});
  DeviceTokens targets(*gpu_, {0, 1, 2, 3, 4, 0, 1, 2});
  LmHeadParams p;
  p.in = x.view();
  p.weight = w.view();
  p.targets = targets.data();
  p.losses = losses.view();
  p.logits = logits.view();
  p.tile_rows = 12;  // not a multiple of the chunk (16)
  expect_rejects(gpu_->lm_head_loss(p), {"tile_rows", "multiple"});
  p.targets = nullptr;
  p.tile_rows = kChunk;
  DeviceTensor tile(*gpu_, DType::kBF16, {kChunk, V});
  p.logits = tile.view();
  expect_rejects(gpu_->lm_head_loss(p), {"targets"});
}

TEST_F(TrainCudaRejects, TokensOutsideTheVocabularyFailTheNextSynchronize) {
  const int64_t L = 6, C = 4, V = 5;
  DeviceTensor wte(*gpu_, DType::kBF16, {V, C}), out(*gpu_, DType::kBF16, {L, C});
  DeviceTokens tokens(*gpu_, {0, 1, 7, 2, -3, 4});
  ASSERT_OK(gpu_->embedding_forward({tokens.data(), 1, L, wte.view(), TensorView{}, out.view()}));
  const Status s = gpu_->synchronize();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  // The first bad position is reported, with its id.
  EXPECT_NE(s.message().find("tokens: id 7 at position 2"), std::string::npos) << s.message();
  EXPECT_OK(gpu_->synchronize());  // reported once

  DeviceTensor x(*gpu_, DType::kBF16, {kChunk, C}), logits(*gpu_, DType::kBF16, {kChunk, V}),
      losses(*gpu_, DType::kF32, {kChunk});
  std::vector<int32_t> ids(static_cast<size_t>(kChunk), 1);
  ids[5] = V;
  DeviceTokens targets(*gpu_, ids);
  ASSERT_OK(
      gpu_->lm_head_forward({x.view(), wte.view(), losses.view(), targets.data(), logits.view()}));
  const Status t = gpu_->synchronize();
  EXPECT_NE(t.message().find("targets: id 5 at position 5"), std::string::npos) << t.to_string();
}

// ---- the optimizer step's kernels ----

class TrainCudaOptimizer : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    CudaBackendOptions o;
    o.compute_dtype = DType::kF32;
    const Status s = make_cuda_backend(o, &gpu_);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_F(TrainCudaOptimizer, AdamWEqualsTheCpuBitForBit) {
  const int64_t n = 100003;  // odd: no vector width divides it
  const uint64_t seed = kSeed + 200;
  SCOPED_TRACE(seed_note(seed));
  const std::vector<float> p0 = random_floats(static_cast<size_t>(n), seed),
                           g = random_floats(static_cast<size_t>(n), seed + 1, 3.0f),
                           m0 = random_floats(static_cast<size_t>(n), seed + 2, 0.1f);
  std::vector<float> v0 = random_floats(static_cast<size_t>(n), seed + 3, 0.01f);
  for (float& x : v0) x = std::fabs(x);
  struct Mode {
    const char* name;
    float weight_decay;
    bool adamw;
  };
  for (const Mode& mode :
       {Mode{"adamw", 0.01f, true}, Mode{"adam l2", 0.01f, false}, Mode{"no decay", 0.0f, true}}) {
    for (const DType copy : {DType::kF32, DType::kBF16, DType::kF16}) {  // kF32: no copy
      SCOPED_TRACE(std::string(mode.name) + ", copy " + dtype_name(copy));
      AdamWHyperparams h;
      h.lr = 3e-3f;
      h.beta1 = 0.9f;
      h.beta2 = 0.95f;
      h.eps = 1e-8f;
      h.weight_decay = mode.weight_decay;
      h.adamw_mode = mode.adamw;
      const int64_t step = 3;
      const float grad_scale = 0.5f;
      std::vector<float> p = p0, m = m0, v = v0;
      std::vector<uint16_t> cpu_copy(static_cast<size_t>(n));
      if (copy == DType::kF32) {
        ASSERT_OK(cpu_adamw_step(h, step, grad_scale, p.data(), g.data(), m.data(), v.data(), n));
      } else {
        ASSERT_OK(cpu_adamw_step_copy(h, step, grad_scale, p.data(), g.data(), m.data(), v.data(),
                                      n, cpu_copy.data(), copy));
      }
      DeviceTensor dp(*gpu_, DType::kF32, {n}), dg(*gpu_, DType::kF32, {n}),
          dm(*gpu_, DType::kF32, {n}), dv(*gpu_, DType::kF32, {n}),
          dc(*gpu_, copy == DType::kF32 ? DType::kBF16 : copy, {n});
      dp.upload(p0);
      dg.upload(g);
      dm.upload(m0);
      dv.upload(v0);
      dc.poison();
      ASSERT_OK(cuda_adamw_step(h, step, grad_scale, static_cast<float*>(dp.data()),
                                static_cast<const float*>(dg.data()),
                                static_cast<float*>(dm.data()), static_cast<float*>(dv.data()), n,
                                copy == DType::kF32 ? nullptr : dc.data(), copy, gpu_->stream()));
      ASSERT_OK(gpu_->synchronize());
      auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same(dp.download(), p)) << "params differ from the CPU AdamW";
      EXPECT_TRUE(same(dm.download(), m)) << "exp_avg differs from the CPU AdamW";
      EXPECT_TRUE(same(dv.download(), v)) << "exp_avg_sq differs from the CPU AdamW";
      if (copy != DType::kF32) {
        const std::vector<std::byte> got = dc.raw();
        EXPECT_EQ(0, std::memcmp(got.data(), cpu_copy.data(), got.size()))
            << "the 16-bit copy differs from the CPU AdamW's";
      }
    }
  }
}

TEST_F(TrainCudaOptimizer, SumOfSquaresAndOverflow) {
  const int64_t n = 3 * kNormChunk + 77;
  const uint64_t seed = kSeed + 210;
  SCOPED_TRACE(seed_note(seed));
  std::vector<float> x = random_floats(static_cast<size_t>(n), seed, 10.0f);
  DeviceTensor d(*gpu_, DType::kF32, {n});
  const size_t ws_bytes = cuda_sum_squares_workspace(n);
  void* ws = nullptr;
  ASSERT_OK(gpu_->allocate(ws_bytes, &ws));
  d.upload(x);
  const SumSquares want = sum_squares(x.data(), n);
  SumSquares got, again;
  ASSERT_OK(
      cuda_sum_squares(static_cast<const float*>(d.data()), n, ws, ws_bytes, gpu_->stream(), &got));
  ASSERT_OK(cuda_sum_squares(static_cast<const float*>(d.data()), n, ws, ws_bytes, gpu_->stream(),
                             &again));
  EXPECT_TRUE(got.finite);
  EXPECT_NEAR(got.sum, want.sum, 1e-12 * want.sum);
  EXPECT_EQ(std::memcmp(&got.sum, &again.sum, sizeof got.sum), 0) << "not deterministic";
  for (const float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<float> y = x;
    y[static_cast<size_t>(2 * kNormChunk + 5)] = bad;
    d.upload(y);
    ASSERT_OK(cuda_sum_squares(static_cast<const float*>(d.data()), n, ws, ws_bytes, gpu_->stream(),
                               &got));
    EXPECT_FALSE(got.finite) << bad;
  }
  // Too small a workspace is refused.
  const Status s =
      cuda_sum_squares(static_cast<const float*>(d.data()), n, ws, 8, gpu_->stream(), &got);
  EXPECT_EQ(s.code(), StatusCode::kWorkspaceTooSmall) << s.to_string();
  gpu_->release(ws);
}

TEST_F(TrainCudaOptimizer, UnscaleAndCheckAndScale) {
  const int64_t n = 5001;
  const uint64_t seed = kSeed + 220;
  SCOPED_TRACE(seed_note(seed));
  const std::vector<float> x = random_floats(static_cast<size_t>(n), seed, 1000.0f);
  const float factor = 1.0f / 1024.0f;
  std::vector<float> want = x;
  scale_in_place(want.data(), n, factor);
  DeviceTensor d(*gpu_, DType::kF32, {n});
  void* ws = nullptr;
  ASSERT_OK(gpu_->allocate(cuda_sum_squares_workspace(n), &ws));
  d.upload(x);
  bool overflow = true;
  ASSERT_OK(cuda_unscale_and_check(static_cast<float*>(d.data()), n, factor, ws,
                                   cuda_sum_squares_workspace(n), gpu_->stream(), &overflow));
  EXPECT_FALSE(overflow);
  std::vector<float> got = d.download();
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
  std::vector<float> y = x;
  y[4999] = NAN;
  d.upload(y);
  ASSERT_OK(cuda_unscale_and_check(static_cast<float*>(d.data()), n, factor, ws,
                                   cuda_sum_squares_workspace(n), gpu_->stream(), &overflow));
  EXPECT_TRUE(overflow);
  d.upload(x);
  ASSERT_OK(cuda_scale_in_place(static_cast<float*>(d.data()), n, factor, gpu_->stream()));
  got = d.download();
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
  gpu_->release(ws);
}

TEST_F(TrainCudaOptimizer, CastsRoundToNearestEven) {
  const int64_t n = 4099;
  const uint64_t seed = kSeed + 230;
  SCOPED_TRACE(seed_note(seed));
  std::vector<float> x = random_floats(static_cast<size_t>(n), seed, 4.0f);
  x[0] = 70000.0f;  // beyond f16: inf
  x[1] = 1e-6f;     // an f16 subnormal
  x[2] = -0.0f;
  DeviceTensor src(*gpu_, DType::kF32, {n});
  src.upload(x);
  for (const DType to : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(to));
    DeviceTensor dst(*gpu_, to, {n}), back(*gpu_, DType::kF32, {n});
    dst.poison();
    ASSERT_OK(cuda_cast(src.data(), DType::kF32, dst.data(), to, n, gpu_->stream()));
    std::vector<std::byte> want(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) store_from_float(want.data(), to, i, x[static_cast<size_t>(i)]);
    EXPECT_EQ(want, dst.raw());
    ASSERT_OK(cuda_cast(dst.data(), to, back.data(), DType::kF32, n, gpu_->stream()));
    EXPECT_EQ(rounded(x, to), back.download());
  }
  DeviceTensor h(*gpu_, DType::kF16, {n}), b(*gpu_, DType::kBF16, {n});
  h.upload(x);
  ASSERT_OK(cuda_cast(h.data(), DType::kF16, b.data(), DType::kBF16, n, gpu_->stream()));
  EXPECT_EQ(rounded(rounded(x, DType::kF16), DType::kBF16), b.download());
}

TEST_F(TrainCudaOptimizer, RejectsHostPointersAndBadArguments) {
  std::vector<float> host(16);
  DeviceTensor d(*gpu_, DType::kF32, {16});
  AdamWHyperparams h;
  Status s = cuda_adamw_step(h, 1, 1.0f, host.data(), static_cast<float*>(d.data()),
                             static_cast<float*>(d.data()), static_cast<float*>(d.data()), 16,
                             nullptr, DType::kF32, gpu_->stream());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("params"), std::string::npos) << s.message();
  s = cuda_adamw_step(h, 0, 1.0f, static_cast<float*>(d.data()), static_cast<float*>(d.data()),
                      static_cast<float*>(d.data()), static_cast<float*>(d.data()), 16, nullptr,
                      DType::kF32, gpu_->stream());
  EXPECT_NE(s.message().find("step"), std::string::npos) << s.message();
  h.beta2 = 1.5f;
  s = cuda_adamw_step(h, 1, 1.0f, static_cast<float*>(d.data()), static_cast<float*>(d.data()),
                      static_cast<float*>(d.data()), static_cast<float*>(d.data()), 16, nullptr,
                      DType::kF32, gpu_->stream());
  EXPECT_NE(s.message().find("betas[1]"), std::string::npos) << s.message();
  s = cuda_cast(d.data(), DType::kBool, d.data(), DType::kF32, 16, gpu_->stream());
  EXPECT_NE(s.message().find("src_dtype"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace sciattn::train

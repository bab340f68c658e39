// The CPU back end's layers against an independent fp64 reference: forwards compared directly,
// backwards against central finite differences of sum(R * layer(x)) in fp64; and the tiling
// guarantees (tiles of whole chunks give the same bits as one call). Test layer (cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sciattn/block_sparse.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

// sum_i R[i] * y[i].
double dot(const std::vector<double>& r, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
  return s;
}

TEST(TrainLayers, EmbeddingForwardAndBackward) {
  const int64_t B = 2, L = 5, C = 6, V = 7, P = 8;
  auto be = cpu_backend(3);
  std::vector<int32_t> tokens = {1, 1, 6, 0, 3, 3, 3, 2, 1, 0};  // repeated ids accumulate
  std::vector<float> wte = random_floats(V * C, 1), wpe = random_floats(P * C, 2);
  std::vector<float> out(B * L * C, NAN);
  ASSERT_TRUE(be->embedding_forward({tokens.data(), B, L, view(wte, {V, C}), view(wpe, {P, C}),
                                     view(out, {B * L, C})})
                  .ok());
  for (int64_t i = 0; i < B * L; ++i) {
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(out[i * C + c], wte[tokens[i] * C + c] + wpe[(i % L) * C + c]);
    }
  }
  std::vector<float> dout = random_floats(B * L * C, 3);
  std::vector<float> dwte(V * C, 0.5f), dwpe(P * C, -0.25f);  // += onto what is there
  ASSERT_TRUE(be->embedding_backward({tokens.data(), B, L, view(dout, {B * L, C}),
                                      view(dwte, {V, C}), view(dwpe, {P, C})})
                  .ok());
  std::vector<double> want_te(V * C, 0.5), want_pe(P * C, -0.25);
  for (int64_t i = 0; i < B * L; ++i) {
    for (int64_t c = 0; c < C; ++c) {
      want_te[tokens[i] * C + c] += dout[i * C + c];
      want_pe[(i % L) * C + c] += dout[i * C + c];
    }
  }
  expect_close(dwte, want_te, 1e-6, "dwte");
  expect_close(dwpe, want_pe, 1e-6, "dwpe");
}

TEST(TrainLayers, EmbeddingRejectsTokensOutsideTheVocabulary) {
  auto be = cpu_backend();
  std::vector<int32_t> tokens = {0, 9};
  std::vector<float> wte(4 * 2), out(2 * 2);
  Status s = be->embedding_forward(
      {tokens.data(), 1, 2, view(wte, {4, 2}), TensorView{}, view(out, {2, 2})});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token 9"), std::string::npos) << s.message();
}

TEST(TrainLayers, LayerNormMatchesFiniteDifferences) {
  const int64_t N = 5, C = 7;
  auto be = cpu_backend();
  std::vector<float> x = random_floats(N * C, 11, 2.0f), w = random_floats(C, 12),
                     b = random_floats(C, 13), r = random_floats(N * C, 14);
  std::vector<float> y(N * C, NAN), mean(N, NAN), rstd(N, NAN);
  const float eps = 1e-5f;
  ASSERT_TRUE(be->layernorm_forward({view(x, {N, C}), view(w, {C}), view(b, {C}), view(y, {N, C}),
                                     view(mean, {N}), view(rstd, {N}), eps})
                  .ok());
  expect_close(y, ref_layernorm(to_double(x), to_double(w), to_double(b), N, C, eps), 1e-5,
               "layernorm forward");
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  ASSERT_TRUE(
      be->layernorm_backward({view(x, {N, C}), view(w, {C}), view(mean, {N}), view(rstd, {N}),
                              view(r, {N, C}), view(dx, {N, C}), view(dw, {C}), view(db, {C})})
          .ok());
  const auto R = to_double(r);
  auto X = to_double(x), W = to_double(w), Bv = to_double(b);
  expect_close(dx,
               finite_differences(
                   [&](const auto& v) { return dot(R, ref_layernorm(v, W, Bv, N, C, eps)); }, X),
               1e-4, "layernorm dx");
  expect_close(dw,
               finite_differences(
                   [&](const auto& v) { return dot(R, ref_layernorm(X, v, Bv, N, C, eps)); }, W),
               1e-4, "layernorm dw");
  expect_close(db,
               finite_differences(
                   [&](const auto& v) { return dot(R, ref_layernorm(X, W, v, N, C, eps)); }, Bv),
               1e-4, "layernorm db");
}

TEST(TrainLayers, LinearMatchesFiniteDifferences) {
  const int64_t N = 10, IC = 6, OC = 5;
  auto be = cpu_backend(4);  // 3 chunks, the last partial
  std::vector<float> x = random_floats(N * IC, 21), w = random_floats(OC * IC, 22),
                     b = random_floats(OC, 23), r = random_floats(N * OC, 24);
  std::vector<float> y(N * OC, NAN);
  ASSERT_TRUE(
      be->linear_forward({view(x, {N, IC}), view(w, {OC, IC}), view(b, {OC}), view(y, {N, OC})})
          .ok());
  auto X = to_double(x), W = to_double(w), Bv = to_double(b);
  const auto R = to_double(r);
  expect_close(y, ref_linear(X, W, &Bv, N, IC, OC), 1e-5, "linear forward");
  std::vector<float> dx(N * IC, NAN), dw(OC * IC, 0.0f), db(OC, 0.0f);
  ASSERT_TRUE(be->linear_backward({view(x, {N, IC}), view(w, {OC, IC}), view(r, {N, OC}),
                                   view(dx, {N, IC}), view(dw, {OC, IC}), view(db, {OC})})
                  .ok());
  expect_close(dx,
               finite_differences(
                   [&](const auto& v) { return dot(R, ref_linear(v, W, &Bv, N, IC, OC)); }, X),
               1e-4, "linear dx");
  expect_close(dw,
               finite_differences(
                   [&](const auto& v) { return dot(R, ref_linear(X, v, &Bv, N, IC, OC)); }, W),
               1e-4, "linear dw");
  expect_close(db,
               finite_differences(
                   [&](const auto& v) { return dot(R, ref_linear(X, W, &v, N, IC, OC)); }, Bv),
               1e-4, "linear db");
}

// A call on all rows equals calls on tiles of whole chunks, bit for bit, for the weight and bias
// gradients (sums over tokens) and every row of the outputs.
TEST(TrainLayers, LinearTilesOfWholeChunksGiveTheSameBits) {
  const int64_t N = 22, IC = 9, OC = 13, chunk = 4;
  auto be = cpu_backend(chunk);
  std::vector<float> x = random_floats(N * IC, 31), w = random_floats(OC * IC, 32),
                     dy = random_floats(N * OC, 33);
  std::vector<float> y_all(N * OC), dx_all(N * IC), dw_all(OC * IC, 0.125f), db_all(OC, 0.5f);
  ASSERT_TRUE(
      be->linear_forward({view(x, {N, IC}), view(w, {OC, IC}), TensorView{}, view(y_all, {N, OC})})
          .ok());
  ASSERT_TRUE(
      be->linear_backward({view(x, {N, IC}), view(w, {OC, IC}), view(dy, {N, OC}),
                           view(dx_all, {N, IC}), view(dw_all, {OC, IC}), view(db_all, {OC})})
          .ok());
  for (int64_t tile : {4, 8, 12, 20}) {
    std::vector<float> y(N * OC), dx(N * IC), dw(OC * IC, 0.125f), db(OC, 0.5f);
    for (int64_t r0 = 0; r0 < N; r0 += tile) {
      const int64_t n = std::min(tile, N - r0);
      auto rows = [&](std::vector<float>& v, int64_t cols) {
        return TensorView::contiguous(v.data() + r0 * cols, DType::kF32, {n, cols});
      };
      ASSERT_TRUE(
          be->linear_forward({rows(x, IC), view(w, {OC, IC}), TensorView{}, rows(y, OC)}).ok());
      ASSERT_TRUE(be->linear_backward({rows(x, IC), view(w, {OC, IC}), rows(dy, OC), rows(dx, IC),
                                       view(dw, {OC, IC}), view(db, {OC})})
                      .ok());
    }
    EXPECT_TRUE(bitwise_equal(y.data(), y_all.data(), y.size())) << "tile " << tile;
    EXPECT_TRUE(bitwise_equal(dx.data(), dx_all.data(), dx.size())) << "tile " << tile;
    EXPECT_TRUE(bitwise_equal(dw.data(), dw_all.data(), dw.size())) << "tile " << tile;
    EXPECT_TRUE(bitwise_equal(db.data(), db_all.data(), db.size())) << "tile " << tile;
  }
}

TEST(TrainLayers, GeluMatchesFiniteDifferences) {
  const int64_t N = 3, F = 11;
  auto be = cpu_backend();
  std::vector<float> x = random_floats(N * F, 41, 4.0f), r = random_floats(N * F, 42);
  x[0] = 30.0f;  // large |u|: the derivative must not overflow
  x[1] = -30.0f;
  std::vector<float> y(N * F, NAN), dx(N * F, NAN);
  ASSERT_TRUE(be->gelu_forward({view(x, {N, F}), view(y, {N, F})}).ok());
  std::vector<double> want(N * F);
  for (size_t i = 0; i < want.size(); ++i) want[i] = ref_gelu(x[i]);
  expect_close(y, want, 1e-5, "gelu forward");
  ASSERT_TRUE(be->gelu_backward({view(x, {N, F}), view(r, {N, F}), view(dx, {N, F})}).ok());
  const auto R = to_double(r);
  expect_close(dx,
               finite_differences(
                   [&](const auto& v) {
                     double s = 0;
                     for (size_t i = 0; i < v.size(); ++i) s += R[i] * ref_gelu(v[i]);
                     return s;
                   },
                   to_double(x)),
               1e-4, "gelu dx");
}

TEST(TrainLayers, RotaryMatchesReferenceAndItsInverseIsTheBackward) {
  const int64_t B = 2, L = 6, H = 2, D = 8;
  auto be = cpu_backend();
  std::vector<float> qkv = random_floats(B * L * 3 * H * D, 51), r = random_floats(qkv.size(), 52);
  std::vector<float> rotated = qkv;
  ASSERT_TRUE(be->rotary({view(rotated, {B, L, 3, H, D}), 10000.0f, false}).ok());
  const auto want = ref_rotary(to_double(qkv), B, L, H, D, 10000.0);
  expect_close(rotated, want, 1e-5, "rotary forward");
  // The backward of y = rot(x) is dx = rot^-1(dy): compare with finite differences.
  std::vector<float> grad = r;
  ASSERT_TRUE(be->rotary({view(grad, {B, L, 3, H, D}), 10000.0f, true}).ok());
  const auto R = to_double(r);
  expect_close(
      grad,
      finite_differences([&](const auto& v) { return dot(R, ref_rotary(v, B, L, H, D, 10000.0)); },
                         to_double(qkv)),
      1e-4, "rotary backward");
}

// Attention through the op with the trainer's causal plans: dense with and without padding (the
// length is not a multiple of 16), and a BigBird layout made causal.
void check_attention(const GptConfig& config, const SparsityConfig* sparse, int64_t B,
                     uint64_t seed, size_t fd_stride = 1) {
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(config, sparse, &plan).ok());
  const int64_t L = config.sequence_length, H = config.n_heads, D = config.head_dim();
  const int64_t C = H * D, Lp = plan.padded_length;
  auto be = cpu_backend();
  std::vector<float> qkv = random_floats(B * L * 3 * C, seed),
                     r = random_floats(B * L * C, seed + 1);
  std::vector<float> out(B * L * C, NAN), lse(B * H * Lp, NAN), dqkv(qkv.size(), NAN);
  ASSERT_TRUE(be->attention_forward({&plan.index, view(qkv, {B, L, 3, H, D}),
                                     view(out, {B, L, H, D}), view(lse, {B, H, Lp})})
                  .ok());
  // Block (i / b, j / b) of head 0 (the configs here share one layout across heads).
  auto keep = [&](int64_t i, int64_t j) {
    const int64_t b = plan.block, n = Lp / b;
    const int64_t s = plan.index.row_begin(0, i / b), e = plan.index.row_end(0, i / b);
    for (int64_t k = s; k < e; ++k) {
      if (plan.index.col[static_cast<size_t>(k)] == j / b) return true;
    }
    (void)n;
    return false;
  };
  expect_close(out, ref_attention(to_double(qkv), B, L, H, D, keep), 1e-5, "attention forward");
  Status bwd = be->attention_backward({&plan.index, view(qkv, {B, L, 3, H, D}),
                                       view(out, {B, L, H, D}), view(lse, {B, H, Lp}),
                                       view(r, {B, L, H, D}), view(dqkv, {B, L, 3, H, D})});
  ASSERT_TRUE(bwd.ok()) << bwd.to_string();
  const auto R = to_double(r);
  expect_close(
      dqkv,
      finite_differences([&](const auto& v) { return dot(R, ref_attention(v, B, L, H, D, keep)); },
                         to_double(qkv), 1e-6, fd_stride),
      1e-4, "attention dqkv");
}

TEST(TrainLayers, DenseCausalAttentionMatchesFiniteDifferences) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, true, 32);  // block 32, no padding
  check_attention(c, nullptr, 1, 61);
}

TEST(TrainLayers, PaddedCausalAttentionMatchesFiniteDifferences) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, true, 13);  // padded to 16
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(c, nullptr, &plan).ok());
  EXPECT_EQ(plan.block, 16);
  EXPECT_EQ(plan.padded_length, 16);
  check_attention(c, nullptr, 2, 71);
}

TEST(TrainLayers, LengthOneAttention) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, true, 1);
  check_attention(c, nullptr, 2, 75);
}

TEST(TrainLayers, BigBirdLayoutIsMadeCausal) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, true, 72);  // 5 blocks of 16, padded
  BigBirdSparsityConfig bb;
  bb.num_heads = c.n_heads;
  bb.block = 16;
  bb.num_random_blocks = 1;
  bb.num_sliding_window_blocks = 3;
  bb.num_global_blocks = 1;
  SparsityConfig sparse = bb;
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(c, &sparse, &plan).ok());
  EXPECT_EQ(plan.padded_length, 80);
  for (size_t k = 0; k < plan.index.row.size(); ++k) {
    EXPECT_LE(plan.index.col[k], plan.index.row[k]) << "a block above the diagonal survived";
  }
  EXPECT_LT(plan.density, 1.0);
  check_attention(c, &sparse, 1, 81, 7);
}

// The LM head: the fused tiled pass and the untiled forward + backward give the same bits for
// tile counts that divide the tokens and that do not; losses and gradients match fp64.
TEST(TrainLayers, LmHeadTiledEqualsUntiledAndMatchesFiniteDifferences) {
  const int64_t N = 10, C = 6, V = 9, chunk = 2;
  auto be = cpu_backend(chunk);
  std::vector<float> x = random_floats(N * C, 91), w = random_floats(V * C, 92);
  std::vector<int32_t> t = random_tokens(N, V, 93);
  const float scale = 0.75f;
  std::vector<float> losses(N, NAN), logits(N * V, NAN), dx(N * C, NAN), dw(V * C, 0.25f);
  ASSERT_TRUE(be->lm_head_forward({view(x, {N, C}), view(w, {V, C}), view(losses, {N}), t.data(),
                                   view(logits, {N, V})})
                  .ok());
  ASSERT_TRUE(
      be->lm_head_backward({view(x, {N, C}), view(w, {V, C}), t.data(), view(logits, {N, V}),
                            view(dx, {N, C}), view(dw, {V, C}), scale})
          .ok());
  for (int64_t tile : {2, 4, 6, 10, 12}) {  // 5, 3 (4 + 4 + 2), 2 (6 + 4), 1, 1 tiles
    std::vector<float> l2(N, NAN), logit_tile(tile * V, NAN), dx2(N * C, NAN), dw2(V * C, 0.25f);
    LmHeadParams p;
    p.in = view(x, {N, C});
    p.weight = view(w, {V, C});
    p.targets = t.data();
    p.losses = view(l2, {N});
    p.din = view(dx2, {N, C});
    p.dweight = view(dw2, {V, C});
    p.logits = view(logit_tile, {tile, V});
    p.grad_scale = scale;
    p.tile_rows = tile;
    ASSERT_TRUE(be->lm_head_loss(p).ok());
    EXPECT_TRUE(bitwise_equal(l2.data(), losses.data(), N)) << "tile " << tile;
    EXPECT_TRUE(bitwise_equal(dx2.data(), dx.data(), dx.size())) << "tile " << tile;
    EXPECT_TRUE(bitwise_equal(dw2.data(), dw.data(), dw.size())) << "tile " << tile;
  }
  // Against fp64: the total loss and scale * its gradients.
  const auto X = to_double(x), W = to_double(w);
  double total = 0;
  for (float l : losses) total += l;
  EXPECT_NEAR(total, ref_lm_loss(X, W, t, N, C, V), 1e-4 * std::fabs(total));
  std::vector<double> gx =
      finite_differences([&](const auto& v) { return ref_lm_loss(v, W, t, N, C, V); }, X);
  std::vector<double> gw =
      finite_differences([&](const auto& v) { return ref_lm_loss(X, v, t, N, C, V); }, W);
  for (double& g : gx) g *= scale;
  for (double& g : gw) g = g * scale + 0.25;
  expect_close(dx, gx, 1e-4, "lm head dx");
  expect_close(dw, gw, 1e-4, "lm head dw");
}

TEST(TrainLayers, LmHeadRejectsATileThatIsNotAWholeNumberOfChunks) {
  auto be = cpu_backend(4);
  std::vector<float> x(8 * 2), w(3 * 2), l(8), logits(6 * 3);
  std::vector<int32_t> t(8, 0);
  LmHeadParams p;
  p.in = view(x, {8, 2});
  p.weight = view(w, {3, 2});
  p.targets = t.data();
  p.losses = view(l, {8});
  p.logits = view(logits, {6, 3});
  p.tile_rows = 6;
  Status s = be->lm_head_loss(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tile_rows (6)"), std::string::npos) << s.message();
}

TEST(TrainLayers, ShapeMismatchNamesTheTensor) {
  auto be = cpu_backend();
  std::vector<float> x(4 * 3), w(5 * 2), y(4 * 5);
  Status s = be->linear_forward({view(x, {4, 3}), view(w, {5, 2}), TensorView{}, view(y, {4, 5})});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("weight must have shape [5, 3]"), std::string::npos) << s.message();
}

// Every way a tensor argument can be wrong gets a message naming the call, the tensor and what
// would be accepted (the checks the CPU and CUDA back ends share, backend_checks.h).
TEST(TrainLayers, TensorArgumentsAreCheckedByName) {
  auto be = cpu_backend();
  std::vector<float> x(4 * 3), w(5 * 3), y(4 * 5);
  std::vector<uint16_t> half(5 * 3);
  auto expect_message = [](const Status& s, const std::string& words) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  expect_message(be->linear_forward({view(x, {4, 3}), TensorView{}, TensorView{}, view(y, {4, 5})}),
                 "linear_forward: weight is missing");
  TensorView on_gpu = view(w, {5, 3});
  on_gpu.device = Device::kCuda;
  expect_message(be->linear_forward({view(x, {4, 3}), on_gpu, TensorView{}, view(y, {4, 5})}),
                 "weight must be in host memory for the CPU back end");
  const TensorView bf16 = TensorView::contiguous(half.data(), DType::kBF16, {5, 3});
  expect_message(be->linear_forward({view(x, {4, 3}), bf16, TensorView{}, view(y, {4, 5})}),
                 "weight must be f32 on the CPU back end; got bf16");
  // [5, 3] read with strides of the transpose: the right sizes, not packed.
  const TensorView transposed = TensorView::strided(w.data(), DType::kF32, {5, 3}, {1, 5});
  expect_message(be->linear_forward({view(x, {4, 3}), transposed, TensorView{}, view(y, {4, 5})}),
                 "weight must be packed (row-major)");
}

TEST(TrainLayers, AttentionArgumentsAreCheckedByName) {
  const GptConfig c = tiny_config(PositionEncoding::kLearned, true, 32);
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(c, nullptr, &plan).ok());
  const int64_t B = 1, L = 32, H = c.n_heads, D = c.head_dim();
  auto be = cpu_backend();
  std::vector<float> qkv(B * L * 3 * H * D), out(B * L * H * D), lse(B * H * L);
  auto expect_message = [](const Status& s, const std::string& words) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  expect_message(be->attention_forward({nullptr, view(qkv, {B, L, 3, H, D}),
                                        view(out, {B, L, H, D}), view(lse, {B, H, L})}),
                 "attention_forward: index missing");
  expect_message(be->attention_forward({&plan.index, view(qkv, {B, L, 3 * H, D}),
                                        view(out, {B, L, H, D}), view(lse, {B, H, L})}),
                 "qkv must have shape [B, L, 3, H, D]; got [1, 32, " + std::to_string(3 * H));
  // Twice the length: 64 tokens need two more block rows than the index has.
  std::vector<float> long_qkv(2 * qkv.size());
  expect_message(be->attention_forward({&plan.index, view(long_qkv, {B, 2 * L, 3, H, D}),
                                        view(out, {B, L, H, D}), view(lse, {B, H, L})}),
                 "does not fit " + std::to_string(H) + " heads and length 64");
  expect_message(be->attention_forward({&plan.index, view(qkv, {B, L, 3, H, D}),
                                        view(out, {B, L, H, D}), view(lse, {B, H, L - 1})}),
                 "attention_forward: lse must have shape [1, " + std::to_string(H) + ", 32]");
}

}  // namespace
}  // namespace sciattn::train

// The GPT model on the CPU back end: each memory technique (per-layer checkpointing, checkpoints
// offloaded to host memory, MLP tiles, LM-head tiles, attention outputs kept) gives bitwise the
// same loss and gradients on and off, alone and together, for tile sizes that divide the tokens and
// that do not; results do not depend on the thread count; the parameter layout, its groups and the
// initialisation are as documented; the parameter hooks come in the documented order; the memory
// plan equals the model's own ledger. Test layer (cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "sciattn/train/plan.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

struct StepResult {
  double loss = 0.0;
  std::vector<float> grads;
};

// Two micro-batches of gradient accumulation on a fresh model.
StepResult run_step(const GptConfig& c, const MemoryOptions& m, int64_t chunk, int threads,
                    const SparsityConfig* sparse = nullptr, int64_t batch = 2,
                    ParameterHooks* hooks = nullptr) {
  auto be = cpu_backend(chunk, threads);
  std::unique_ptr<GptModel> model;
  Status s = GptModel::create(c, sparse, batch, m, be.get(), &model);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return {};
  model->set_parameter_hooks(hooks);
  EXPECT_TRUE(model->zero_grads().ok());
  const size_t T = static_cast<size_t>(batch * c.sequence_length);
  StepResult r;
  for (uint64_t micro = 0; micro < 2; ++micro) {
    const auto in = random_tokens(T, c.vocab_size, 100 + micro);
    const auto tg = random_tokens(T, c.vocab_size, 200 + micro);
    MicroBatchResult out;
    s = model->forward_backward(in.data(), tg.data(), 0.5f / static_cast<float>(T), &out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    r.loss += out.loss_sum;
  }
  r.grads.assign(model->grads(), model->grads() + model->layout().total);
  return r;
}

void expect_same(const StepResult& a, const StepResult& b, const std::string& what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  size_t first = a.grads.size();
  for (size_t i = 0; i < a.grads.size() && first == a.grads.size(); ++i) {
    if (std::memcmp(&a.grads[i], &b.grads[i], sizeof(float)) != 0) first = i;
  }
  EXPECT_EQ(first, a.grads.size()) << what << ": gradients differ first at element " << first;
}

class MemoryTechniques
    : public ::testing::TestWithParam<std::tuple<PositionEncoding, bool, int64_t>> {};

TEST_P(MemoryTechniques, GiveBitwiseEqualGradients) {
  const auto [positions, tied, length] = GetParam();
  const GptConfig c = tiny_config(positions, tied, length);
  const int64_t chunk = 4;  // T = 2 * length tokens: several chunks, the last partial for 13
  const StepResult base = run_step(c, MemoryOptions{}, chunk, 0);
  ASSERT_FALSE(base.grads.empty());
  double norm = 0;
  for (float g : base.grads) norm += static_cast<double>(g) * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_TRUE(std::isfinite(base.loss));

  MemoryOptions ckpt;
  ckpt.checkpoint_layers = true;
  expect_same(base, run_step(c, ckpt, chunk, 0), "checkpointing");
  MemoryOptions offload;
  offload.offload_checkpoints = true;
  expect_same(base, run_step(c, offload, chunk, 0), "offloaded checkpoints");
  for (int64_t tile : {4, 8, 12, 100}) {  // 12 does not divide 24 or 26 tokens; 100 > T
    MemoryOptions mlp;
    mlp.mlp_tile_tokens = tile;
    expect_same(base, run_step(c, mlp, chunk, 0), "MLP tile " + std::to_string(tile));
    MemoryOptions lm;
    lm.lm_head_tile_tokens = tile;
    expect_same(base, run_step(c, lm, chunk, 0), "LM-head tile " + std::to_string(tile));
  }
  MemoryOptions kept = ckpt;
  kept.keep_attention_layers = kAllLayers;
  expect_same(base, run_step(c, kept, chunk, 0), "checkpointing, attention outputs kept");
  kept.keep_attention_layers = 1;  // of 2: layer 1 skips the attention, layer 0 recomputes it
  expect_same(base, run_step(c, kept, chunk, 0), "checkpointing, one layer's outputs kept");
  MemoryOptions kept_alone;  // no checkpointing: every activation is kept anyway
  kept_alone.keep_attention_layers = kAllLayers;
  expect_same(base, run_step(c, kept_alone, chunk, 0), "attention outputs kept alone");
  MemoryOptions all;
  all.checkpoint_layers = true;
  all.mlp_tile_tokens = 8;
  all.lm_head_tile_tokens = 12;
  expect_same(base, run_step(c, all, chunk, 0), "all three");
  all.offload_checkpoints = true;
  expect_same(base, run_step(c, all, chunk, 0), "all four");
  all.keep_attention_layers = kAllLayers;
  expect_same(base, run_step(c, all, chunk, 0), "all five");
  all.offload_attention_outputs = true;
  expect_same(base, run_step(c, all, chunk, 0), "all five, attention outputs offloaded");
  // A tile that is not a multiple of the chunk is rounded up to one (5 -> 8 here).
  MemoryOptions odd;
  odd.mlp_tile_tokens = 5;
  odd.lm_head_tile_tokens = 7;
  expect_same(base, run_step(c, odd, chunk, 0), "tiles rounded up to whole chunks");
}

INSTANTIATE_TEST_SUITE_P(
    Train, MemoryTechniques,
    ::testing::Values(std::make_tuple(PositionEncoding::kLearned, true, int64_t{12}),
                      std::make_tuple(PositionEncoding::kRotary, false, int64_t{12}),
                      std::make_tuple(PositionEncoding::kLearned, false, int64_t{13}),
                      std::make_tuple(PositionEncoding::kRotary, true, int64_t{13})));

// Offloaded checkpoints with more layers than the two buffers that alternate (and one layer,
// where nothing leaves): the same bits, and the host buffer holds layers 0 .. L-2's inputs.
TEST(TrainModel, OffloadedCheckpointsWithManyLayers) {
  for (int64_t layers : {1, 2, 5}) {
    GptConfig c = tiny_config(PositionEncoding::kRotary, true, 13);
    c.n_layers = layers;
    MemoryOptions offload;
    offload.offload_checkpoints = true;
    offload.mlp_tile_tokens = 8;
    MemoryOptions plain;
    expect_same(run_step(c, plain, 4, 0), run_step(c, offload, 4, 0),
                std::to_string(layers) + " layers");
    MemoryLedger ledger;
    ASSERT_TRUE(
        plan_gpt_memory(c, nullptr, 2, offload, DType::kF32, 4, Device::kCpu, &ledger).ok());
    const std::string report = ledger.report();
    EXPECT_EQ(report.find("offloaded checkpoints") != std::string::npos, layers > 1) << report;
  }
}

// Kept attention outputs offloaded with the checkpoints: kept layers 0 .. k - 3 go to host memory
// and come back in the backward through two alternating slots. Every count of kept layers, on
// models with more layers than slots, gives the bits of the plain step (run_step's two
// micro-batches: the second reuses the first's slots and tickets), and the plan is the model's
// ledger.
TEST(TrainModel, OffloadedAttentionOutputsWithManyLayers) {
  auto be = cpu_backend(4);
  for (int64_t layers : {1, 3, 5}) {
    GptConfig c = tiny_config(PositionEncoding::kRotary, true, 13);
    c.n_layers = layers;
    const StepResult plain = run_step(c, MemoryOptions{}, 4, 0);
    for (int64_t kept = 1; kept <= layers; ++kept) {
      MemoryOptions m;
      m.offload_checkpoints = true;
      m.keep_attention_layers = kept;
      m.offload_attention_outputs = true;
      m.mlp_tile_tokens = 8;
      const std::string what =
          std::to_string(kept) + " of " + std::to_string(layers) + " layers kept, offloaded";
      expect_same(plain, run_step(c, m, 4, 0), what);
      std::unique_ptr<GptModel> model;
      ASSERT_TRUE(GptModel::create(c, nullptr, 2, m, be.get(), &model).ok());
      MemoryLedger plan;
      ASSERT_TRUE(plan_gpt_memory(c, nullptr, 2, m, DType::kF32, 4, Device::kCpu, &plan).ok());
      const std::string report = plan.report();
      EXPECT_EQ(report, model->ledger().report()) << what;
      EXPECT_EQ(report.find("offloaded attention outputs") != std::string::npos, kept > 2)
          << report;
    }
  }
}

// The hooks an offloaded optimizer relies on: before_forward in group order, after_backward in
// reverse group order, once per micro-batch each, and each group's gradients final when its
// after_backward comes (nothing adds to them later).
class RecordingHooks final : public ParameterHooks {
 public:
  explicit RecordingHooks(const GptModel** model) : model_(model) {}
  Status before_forward(int64_t g) override {
    calls.push_back("F" + std::to_string(g));
    return Status::ok_status();
  }
  Status after_backward(int64_t g) override {
    calls.push_back("B" + std::to_string(g));
    return Status::ok_status();
  }
  std::vector<std::string> calls;

 private:
  const GptModel** model_;
};

TEST(TrainModel, ParameterHooksComeInGroupOrder) {
  for (bool tiled : {false, true}) {
    const GptConfig c = tiny_config(PositionEncoding::kLearned, !tiled, 12);
    const GptModel* none = nullptr;
    RecordingHooks hooks(&none);
    MemoryOptions m;
    m.lm_head_tile_tokens = tiled ? 8 : 0;
    run_step(c, m, 4, 0, nullptr, 2, &hooks);
    const std::vector<std::string> one = {"F0", "F1", "F2", "F3", "B3", "B2", "B1", "B0"};
    std::vector<std::string> want = one;
    want.insert(want.end(), one.begin(), one.end());  // two micro-batches
    EXPECT_EQ(hooks.calls, want);
  }
  const ParameterLayout layout = gpt_parameter_layout(tiny_config());
  ASSERT_EQ(layout.groups.size(), 4u);
  EXPECT_EQ(layout.groups[0].name, "embeddings");
  EXPECT_EQ(layout.groups[0].begin, 0);
  EXPECT_EQ(layout.groups[1].name, "h0");
  EXPECT_EQ(layout.groups[1].begin, layout.find("h0.ln1_w")->offset);
  EXPECT_EQ(layout.groups[3].name, "head");
  EXPECT_EQ(layout.groups[3].begin, layout.find("lnf_w")->offset);
  EXPECT_EQ(layout.groups[3].end, layout.total);
  for (size_t g = 1; g < layout.groups.size(); ++g) {
    EXPECT_EQ(layout.groups[g].begin, layout.groups[g - 1].end);
  }
}

// The plan (no allocation, no index) lists exactly what create allocates, for every technique.
TEST(TrainModel, MemoryPlanEqualsTheModelsLedger) {
  const GptConfig c = tiny_config(PositionEncoding::kLearned, false, 13);
  auto be = cpu_backend(4);
  for (int k = 0; k < 48; ++k) {
    MemoryOptions m;
    m.checkpoint_layers = (k & 1) != 0;
    m.offload_checkpoints = (k & 2) != 0;
    m.mlp_tile_tokens = (k & 4) != 0 ? 8 : 0;
    m.lm_head_tile_tokens = (k & 8) != 0 ? 12 : 0;
    m.keep_attention_layers = k < 16 ? 0 : k < 32 ? 1 : kAllLayers;
    std::unique_ptr<GptModel> model;
    ASSERT_TRUE(GptModel::create(c, nullptr, 2, m, be.get(), &model).ok());
    MemoryLedger plan;
    ASSERT_TRUE(plan_gpt_memory(c, nullptr, 2, m, DType::kF32, 4, Device::kCpu, &plan).ok());
    EXPECT_EQ(plan.report(), model->ledger().report()) << "techniques " << k;
  }
  // At the 1.3B model's sizes, 1M tokens, bf16 on a GPU, everything on: the checkpoints that
  // leave the device are (L - 1) T C 2 bytes = 23 * 2^20 * 2048 * 2.
  GptConfig big;
  big.vocab_size = 50304;
  big.d_model = 2048;
  big.n_layers = 24;
  big.n_heads = 16;
  big.sequence_length = int64_t{1} << 20;
  big.max_position_embeddings = big.sequence_length;
  MemoryOptions m;
  m.offload_checkpoints = true;
  m.mlp_tile_tokens = 16384;
  m.lm_head_tile_tokens = 16384;
  MemoryLedger plan;
  ASSERT_TRUE(plan_gpt_memory(big, nullptr, 1, m, DType::kBF16, 4096, Device::kCuda, &plan).ok());
  EXPECT_EQ(plan.total(Device::kCpu), uint64_t{23} * (uint64_t{1} << 20) * 2048 * 2);
  // Keeping the attention outputs adds 24 layers' [T, C] bf16 and [H, T] f32 on the device, less
  // the recomputed set's own output and log-sum-exp (blocks of 128 at 1M tokens: no padding).
  m.keep_attention_layers = kAllLayers;
  MemoryLedger kept;
  ASSERT_TRUE(plan_gpt_memory(big, nullptr, 1, m, DType::kBF16, 4096, Device::kCuda, &kept).ok());
  const uint64_t per_layer = (uint64_t{1} << 20) * (2048 * 2 + 16 * 4);
  EXPECT_EQ(kept.total(Device::kCuda) - plan.total(Device::kCuda), 23 * per_layer);
  EXPECT_EQ(kept.total(Device::kCpu), plan.total(Device::kCpu));
  // Some layers only: the recomputed set keeps its own output and log-sum-exp for the others.
  m.keep_attention_layers = 5;
  MemoryLedger some;
  ASSERT_TRUE(plan_gpt_memory(big, nullptr, 1, m, DType::kBF16, 4096, Device::kCuda, &some).ok());
  EXPECT_EQ(some.total(Device::kCuda) - plan.total(Device::kCuda), 5 * per_layer);
  // Offloaded with the checkpoints: two layers' on the device (the recomputed set's own are not
  // held when every layer keeps them) and kept layers 0 .. 21 in host memory.
  m.keep_attention_layers = kAllLayers;
  m.offload_attention_outputs = true;
  MemoryLedger offloaded;
  ASSERT_TRUE(
      plan_gpt_memory(big, nullptr, 1, m, DType::kBF16, 4096, Device::kCuda, &offloaded).ok());
  EXPECT_EQ(offloaded.total(Device::kCuda) - plan.total(Device::kCuda), per_layer);
  EXPECT_EQ(offloaded.total(Device::kCpu) - plan.total(Device::kCpu), 22 * per_layer);
  m.offload_attention_outputs = false;
  m.keep_attention_layers = -1;
  EXPECT_FALSE(plan_gpt_memory(big, nullptr, 1, m, DType::kBF16, 4096, Device::kCuda, &some).ok());
}

// most_kept_attention_layers: the largest k whose plan fits, found by bisection over 0 .. n.
TEST(TrainModel, MostKeptAttentionLayersFillTheBudget) {
  PlanInput in;
  in.model = tiny_config(PositionEncoding::kRotary, false, 13);
  in.model.n_layers = 5;
  in.micro_batch = 2;
  in.memory.checkpoint_layers = true;
  in.compute_dtype = DType::kF32;
  in.device = Device::kCpu;
  in.token_chunk = 4;
  std::vector<uint64_t> host(6);
  for (int64_t k = 0; k <= 5; ++k) {
    PlanInput at = in;
    at.memory.keep_attention_layers = k;
    MemoryPlan plan;
    ASSERT_TRUE(plan_training_memory(at, &plan).ok());
    host[static_cast<size_t>(k)] = plan.host_bytes;
    if (k > 0 && k < 5) {
      EXPECT_GT(host[static_cast<size_t>(k)], host[static_cast<size_t>(k - 1)]);
    }
  }
  // Keeping every layer costs what keeping all but one does: the recomputed set then drops its
  // own output and log-sum-exp.
  EXPECT_EQ(host[5], host[4]);
  auto most = [&](uint64_t budget) {
    int64_t k = -1;
    EXPECT_TRUE(most_kept_attention_layers(in, 0, budget, &k).ok());
    return k;
  };
  EXPECT_EQ(most(host[0] - 1), 0);
  EXPECT_EQ(most(host[0]), 0);
  EXPECT_EQ(most(host[3] - 1), 2);
  EXPECT_EQ(most(host[3]), 3);
  EXPECT_EQ(most(host[4]), 5);
  EXPECT_EQ(most(host[5] * 2), 5);
  in.memory.checkpoint_layers = false;  // nothing to keep without checkpointing
  EXPECT_EQ(most(host[5] * 2), 0);
}

TEST(TrainModel, SharedLayoutIndexIsStoredForOneHead) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, true, 128);
  c.n_heads = 4;
  c.d_model = 32;
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(c, nullptr, &plan).ok());
  const int64_t blocks = 128 / 64;
  EXPECT_EQ(plan.index.num_heads, 4);
  EXPECT_EQ(plan.index.layout_heads, 1);
  EXPECT_EQ(plan.index.stored_nnz(), blocks * (blocks + 1) / 2);
  EXPECT_EQ(plan.index.nnz, 4 * blocks * (blocks + 1) / 2);
  EXPECT_EQ(plan.index.block_head(plan.index.nnz - 1), 3);
  // Long dense sequences take blocks of 128, so that 1M tokens over 16 heads stays below the GPU
  // kernels' 2^31 blocks; shorter ones keep 64, and lengths 128 does not divide too.
  int64_t block = 0, padded = 0;
  c.sequence_length = int64_t{1} << 20;
  ASSERT_TRUE(attention_padding(c, nullptr, &block, &padded).ok());
  EXPECT_EQ(block, 128);
  EXPECT_EQ(padded, c.sequence_length);
  const int64_t n = padded / block;
  EXPECT_LT(16 * n * (n + 1) / 2, (int64_t{1} << 31) - 1);
  c.sequence_length = 32768;
  ASSERT_TRUE(attention_padding(c, nullptr, &block, &padded).ok());
  EXPECT_EQ(block, 64);
  c.sequence_length = 65536 + 64;
  ASSERT_TRUE(attention_padding(c, nullptr, &block, &padded).ok());
  EXPECT_EQ(block, 64);
}

TEST(TrainModel, ResultsDoNotDependOnTheThreadCount) {
  const GptConfig c = tiny_config(PositionEncoding::kRotary, true, 32);
  MemoryOptions m;
  m.lm_head_tile_tokens = 16;
  const StepResult one = run_step(c, m, 8, 1);
  const StepResult two = run_step(c, m, 8, 2);
  expect_same(one, two, "1 thread vs 2 threads");
}

TEST(TrainModel, SparseLayoutTrainsAndCheckpointsBitwise) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, true, 64);
  BSLongformerSparsityConfig lf;
  lf.num_heads = c.n_heads;
  lf.block = 16;
  lf.num_sliding_window_blocks = 3;
  SparsityConfig sparse = lf;
  const StepResult base = run_step(c, MemoryOptions{}, 8, 0, &sparse, 1);
  MemoryOptions ckpt;
  ckpt.checkpoint_layers = true;
  ckpt.mlp_tile_tokens = 24;
  expect_same(base, run_step(c, ckpt, 8, 0, &sparse, 1), "sparse with checkpointing");
}

TEST(TrainModel, ForwardLossEqualsTheTrainingForward) {
  const GptConfig c = tiny_config();
  auto be = cpu_backend(4);
  std::unique_ptr<GptModel> model;
  ASSERT_TRUE(GptModel::create(c, nullptr, 2, MemoryOptions{}, be.get(), &model).ok());
  const auto in = random_tokens(24, c.vocab_size, 5), tg = random_tokens(24, c.vocab_size, 6);
  MicroBatchResult a, b;
  ASSERT_TRUE(model->forward_loss(in.data(), tg.data(), &a).ok());
  ASSERT_TRUE(model->forward_backward(in.data(), tg.data(), 1.0f, &b).ok());
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(a.tokens, 24);
  // At initialisation the loss per token is near ln(vocab).
  EXPECT_NEAR(a.loss_sum / 24.0, std::log(37.0), 0.3);
}

TEST(TrainModel, ParameterLayoutAndInitialisation) {
  GptConfig c = tiny_config(PositionEncoding::kLearned, false);
  const ParameterLayout layout = gpt_parameter_layout(c);
  const int64_t C = 16, F = 64, V = 37, P = 15;
  const int64_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
  EXPECT_EQ(layout.parameter_count(), V * C + P * C + 2 * per_layer + 2 * C + V * C);
  EXPECT_EQ(layout.matmul_parameter_count(), 2 * (3 * C * C + C * C + 2 * F * C) + V * C);
  for (const TensorSlot& s : layout.slots) EXPECT_EQ(s.offset % kSlotAlign, 0) << s.name;
  ASSERT_NE(layout.find("h1.fcproj_w"), nullptr);
  EXPECT_EQ(layout.find("h1.fcproj_w")->shape, (std::vector<int64_t>{C, F}));
  EXPECT_EQ(layout.find("wpe")->shape, (std::vector<int64_t>{P, C}));
  std::vector<float> p(static_cast<size_t>(layout.total), NAN);
  init_gpt_parameters(c, layout, p.data());
  auto values = [&](const char* name) {
    const TensorSlot* s = layout.find(name);
    return std::vector<float>(p.begin() + s->offset, p.begin() + s->offset + s->numel);
  };
  for (float x : values("h0.ln1_w")) EXPECT_EQ(x, 1.0f);
  for (float x : values("h0.qkv_b")) EXPECT_EQ(x, 0.0f);
  auto stddev = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  EXPECT_NEAR(stddev(values("wte")), 0.02, 0.003);
  EXPECT_NEAR(stddev(values("h1.fcproj_w")), 0.01, 0.0015);  // 0.02 / sqrt(2 * 2 layers)
  // The same seed gives the same parameters.
  std::vector<float> q(p.size());
  init_gpt_parameters(c, layout, q.data());
  EXPECT_TRUE(bitwise_equal(p.data(), q.data(), p.size()));
}

TEST(TrainModel, BadSizesAreRejectedByName) {
  GptConfig c = tiny_config();
  auto be = cpu_backend();
  std::unique_ptr<GptModel> model;
  Status s = GptModel::create(c, nullptr, 0, MemoryOptions{}, be.get(), &model);
  EXPECT_NE(s.message().find("train_micro_batch_size_per_gpu"), std::string::npos) << s.message();
  c.n_heads = 3;
  s = GptModel::create(c, nullptr, 1, MemoryOptions{}, be.get(), &model);
  EXPECT_NE(s.message().find("n_heads"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace sciattn::train

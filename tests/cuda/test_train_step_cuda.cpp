// Whole training steps of a tiny GPT on the CUDA back end (label gpu): the loss and every
// parameter gradient of a GptModel step against the CPU back end (f32: within fp32 noise; bf16
// and f16: the tolerance rule, with lowp_ref the CPU layers rounded where the GPU stores 16 bits,
// lowp_backend.h); each memory technique on and off bitwise on the GPU (checkpointing, offloaded
// checkpoints, MLP and LM-head tiles: they change what is kept, never the calls' arithmetic);
// the Trainer on the GPU against the Trainer on the CPU over a few optimizer steps; the
// offloaded optimizer against the GPU optimizer bitwise (same gradients, same norm on the GPU,
// AdamW bit-equal on both sides), through fp16 loss scaling with ds_enhanced, an injected
// overflow, adaptive clipping and accumulation; resume bit for bit; the memory plan against what
// the back end allocated; bad token ids; sequence parallelism on two ranks as threads of one GPU
// (their collectives staged through host memory) against one rank, the model's step and three
// Trainer steps. Each test skips without a CUDA device.
// Test layer (tests/cuda).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cuda/lowp_backend.h"
#include "cuda/train_cuda_test_util.h"
#include "process_temp_dir.h"
#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/plan.h"
#include "sciattn/train/thread_communicator.h"
#include "sciattn/train/trainer.h"
#include "train/train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

#define ASSERT_OK(expr)                               \
  do {                                                \
    const ::sciattn::Status status_ = (expr);         \
    ASSERT_TRUE(status_.ok()) << status_.to_string(); \
  } while (0)

constexpr int64_t kChunk = 16;

std::unique_ptr<Backend> gpu_backend(DType dtype, int64_t chunk = kChunk) {
  CudaBackendOptions o;
  o.compute_dtype = dtype;
  o.token_chunk = chunk;
  std::unique_ptr<Backend> be;
  const Status s = make_cuda_backend(o, &be);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return be;
}

// A GPT whose head dim (32) every build instantiates; lengths that pad (37: block 16, Lp 48)
// and that do not (64: block 64).
GptConfig step_config(PositionEncoding positions, bool tied, int64_t length) {
  GptConfig c = tiny_config(positions, tied, length);
  c.d_model = 64;
  c.n_heads = 2;
  c.n_layers = 3;
  c.vocab_size = 53;
  c.max_position_embeddings = length;
  return c;
}

struct StepResult {
  double loss = 0.0;
  std::vector<float> grads;  // host copy
};

// Two micro-batches of accumulation with the gradient of the sum of the losses (gradients of
// order 1, so that the rule's atol, relative to max(1, |ref|), is not loose). `rounded_weights`
// replaces the model's initial weights (the lowp and ref64 runs use the GPU's rounding).
StepResult model_step(Backend& be, const GptConfig& c, const MemoryOptions& m, int64_t batch,
                      const std::vector<float>* rounded_weights = nullptr) {
  std::unique_ptr<GptModel> model;
  Status s = GptModel::create(c, nullptr, batch, m, &be, &model);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return {};
  if (rounded_weights != nullptr) {
    EXPECT_TRUE(model->set_weights(rounded_weights->data()).ok());
  }
  EXPECT_TRUE(model->zero_grads().ok());
  const size_t T = static_cast<size_t>(batch * c.sequence_length);
  StepResult r;
  for (uint64_t micro = 0; micro < 2; ++micro) {
    const auto in = random_tokens(T, c.vocab_size, 300 + micro);
    const auto tg = random_tokens(T, c.vocab_size, 400 + micro);
    MicroBatchResult out;
    s = model->forward_backward(in.data(), tg.data(), 1.0f, &out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    r.loss += out.loss_sum;
  }
  r.grads.resize(static_cast<size_t>(model->layout().total));
  EXPECT_TRUE(be.copy_to_host(r.grads.data(), model->grads(), r.grads.size() * 4).ok());
  return r;
}

std::vector<float> initial_weights(const GptConfig& c, DType dtype) {
  const ParameterLayout layout = gpt_parameter_layout(c);
  std::vector<float> w(static_cast<size_t>(layout.total));
  init_gpt_parameters(c, layout, w.data());
  return rounded(w, dtype);
}

std::vector<float> slot_of(const std::vector<float>& flat, const TensorSlot& s) {
  return std::vector<float>(flat.begin() + s.offset, flat.begin() + s.offset + s.numel);
}

bool same_bits(const StepResult& a, const StepResult& b) {
  return std::memcmp(&a.loss, &b.loss, sizeof a.loss) == 0 && a.grads == b.grads;
}

class TrainStepCuda : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

TEST_P(TrainStepCuda, WholeStepMatchesTheCpu) {
  const DType dtype = GetParam();
  struct Case {
    PositionEncoding positions;
    bool tied;
    int64_t length;
    int64_t lm_tile;
  };
  for (const Case& k : {Case{PositionEncoding::kLearned, true, 37, 32},
                        Case{PositionEncoding::kRotary, false, 64, 0}}) {
    const GptConfig c = step_config(k.positions, k.tied, k.length);
    SCOPED_TRACE(std::string(position_encoding_name(k.positions)) + ", L " +
                 std::to_string(k.length) + ", " + dtype_name(dtype));
    MemoryOptions m;
    m.lm_head_tile_tokens = k.lm_tile;
    const std::vector<float> w = initial_weights(c, dtype);
    auto gpu = gpu_backend(dtype);
    ASSERT_NE(gpu, nullptr);
    const StepResult got = model_step(*gpu, c, m, 2);
    auto cpu = cpu_backend(kChunk);
    const StepResult ref = model_step(*cpu, c, m, 2, &w);
    StepResult lowp = ref;
    if (dtype != DType::kF32) {
      LowpCpuBackend emulated(cpu_backend(kChunk), dtype);
      lowp = model_step(emulated, c, m, 2, &w);
    }
    ASSERT_EQ(got.grads.size(), ref.grads.size());
    EXPECT_TRUE(within_tolerance("loss", {static_cast<float>(got.loss)},
                                 {static_cast<float>(lowp.loss)}, {static_cast<float>(ref.loss)},
                                 dtype));
    const ParameterLayout layout = gpt_parameter_layout(c);
    for (const TensorSlot& s : layout.slots) {
      EXPECT_TRUE(within_tolerance("gradient of " + s.name, slot_of(got.grads, s),
                                   slot_of(lowp.grads, s), slot_of(ref.grads, s), dtype));
    }
  }
}

TEST_P(TrainStepCuda, MemoryTechniquesAreBitwiseOnTheGpu) {
  const DType dtype = GetParam();
  const GptConfig c = step_config(PositionEncoding::kRotary, true, 37);
  auto gpu = gpu_backend(dtype);
  ASSERT_NE(gpu, nullptr);
  const StepResult base = model_step(*gpu, c, MemoryOptions{}, 2);
  struct Named {
    const char* name;
    MemoryOptions m;
  };
  std::vector<Named> cases(9);
  cases[0].name = "checkpointing";
  cases[0].m.checkpoint_layers = true;
  cases[1].name = "offloaded checkpoints";
  cases[1].m.offload_checkpoints = true;
  cases[2].name = "MLP tiles of 32 (74 tokens: 32, 32, 10)";
  cases[2].m.mlp_tile_tokens = 32;
  cases[3].name = "LM-head tiles of 16";
  cases[3].m.lm_head_tile_tokens = 16;
  cases[4].name = "tiles rounded up to whole chunks (20 -> 32)";
  cases[4].m.mlp_tile_tokens = 20;
  cases[4].m.lm_head_tile_tokens = 20;
  cases[5].name = "all";
  cases[5].m.offload_checkpoints = true;
  cases[5].m.mlp_tile_tokens = 16;
  cases[5].m.lm_head_tile_tokens = 48;
  cases[6].name = "checkpointing, attention outputs kept";
  cases[6].m.checkpoint_layers = true;
  cases[6].m.keep_attention_layers = kAllLayers;
  cases[7].name = "all and the last 2 of 3 layers' attention outputs kept";
  cases[7].m = cases[5].m;
  cases[7].m.keep_attention_layers = 2;
  cases[8].name = "all, every layer's attention outputs kept and offloaded (layer 0's leave)";
  cases[8].m = cases[5].m;
  cases[8].m.keep_attention_layers = kAllLayers;
  cases[8].m.offload_attention_outputs = true;
  for (const Named& k : cases) {
    EXPECT_TRUE(same_bits(base, model_step(*gpu, c, k.m, 2))) << k.name;
  }
  // Deterministic: the same call twice.
  EXPECT_TRUE(same_bits(base, model_step(*gpu, c, MemoryOptions{}, 2))) << "run twice";
}

INSTANTIATE_TEST_SUITE_P(Train, TrainStepCuda,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- the Trainer on the GPU ----

std::string temp_path(const std::string& name) {
  return sciattn::testing::process_temp_dir() + "cuda_" + name;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::unique_ptr<TokenFile> token_file(int64_t vocab, uint64_t seed) {
  std::vector<std::vector<int32_t>> docs;
  for (uint64_t d = 0; d < 12; ++d) docs.push_back(random_tokens(60, vocab - 1, seed + d));
  const std::string path = temp_path("tokens_" + std::to_string(seed) + ".tok");
  EXPECT_TRUE(write_token_file(path, docs, static_cast<uint64_t>(vocab),
                               static_cast<uint32_t>(vocab - 1), Tokenizer::kUnspecified)
                  .ok());
  std::unique_ptr<TokenFile> f;
  EXPECT_TRUE(TokenFile::open(path, &f).ok());
  return f;
}

TrainConfig config_from(const std::string& json) {
  TrainConfig c;
  std::vector<std::string> warnings;
  AutoValues autos;
  autos.device = Device::kCuda;
  const Status s = parse_train_config(json, "\"test\"", 2, autos, &c, &warnings);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return c;
}

std::unique_ptr<Trainer> make_trainer(std::unique_ptr<Backend> be, const GptConfig& g,
                                      const TrainConfig& c, const TokenFile* data,
                                      TrainerOptions o = {}) {
  o.token_chunk = be->token_chunk();
  std::unique_ptr<Trainer> t;
  const Status s = Trainer::create(g, c, o, std::move(be), data, &t);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return t;
}

void run_steps(Trainer& t, int steps, std::vector<double>* losses = nullptr) {
  for (int i = 0; i < steps; ++i) {
    StepReport r;
    const Status s = t.step(&r);
    ASSERT_TRUE(s.ok()) << s.to_string();
    if (losses != nullptr) losses->push_back(r.loss);
  }
}

const char* kFp16Config = R"({
  "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20, "warmup_num_steps": 3}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 2,
           "hysteresis": 1, "type": "ds_enhanced"},
  "gradient_clipping": {"type": "adaptive", "threshold": 0.5, "history_window": 3,
                        "adjustment_factor": 0.3}
})";

// The Trainer computing in f32 on the GPU follows the CPU Trainer: the losses within fp32 noise,
// the parameters after three AdamW steps too, except where a gradient is so near zero that
// summation noise flips its sign and Adam's normalised update moves by up to 2 lr (bounded).
TEST(TrainTrainerCuda, FollowsTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  const GptConfig g = step_config(PositionEncoding::kRotary, false, 37);
  const TrainConfig c = config_from(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
    "gradient_clipping": 1.0})");
  auto data = token_file(g.vocab_size, 5);
  auto gpu = make_trainer(gpu_backend(DType::kF32), g, c, data.get());
  auto cpu = make_trainer(cpu_backend(kChunk), g, c, data.get());
  std::vector<double> lg, lc;
  run_steps(*gpu, 3, &lg);
  run_steps(*cpu, 3, &lc);
  for (size_t i = 0; i < lg.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 1e-5 * std::fabs(lc[i])) << i;
  std::vector<float> pg, pc;
  ASSERT_OK(gpu->master_parameters(&pg));
  ASSERT_OK(cpu->master_parameters(&pc));
  ASSERT_EQ(pg.size(), pc.size());
  size_t moved = 0;
  double worst = 0;
  for (size_t i = 0; i < pg.size(); ++i) {
    const double d = std::fabs(static_cast<double>(pg[i]) - pc[i]);
    worst = std::max(worst, d);
    moved += d > 1e-6 ? 1 : 0;
  }
  EXPECT_LE(worst, 2 * 1e-3 * 3) << "beyond Adam's bound";
  EXPECT_LE(moved, pg.size() / 1000) << moved << " of " << pg.size() << " differ by > 1e-6";
}

// fp16 on the GPU: the injected overflows are skipped (no update) and halve the scale.
TEST(TrainTrainerCuda, Fp16OverflowIsSkippedAndHalvesTheScale) {
  SKIP_WITHOUT_GPU();
  const GptConfig g = step_config(PositionEncoding::kLearned, true, 37);
  const TrainConfig c = config_from(R"({"train_batch_size": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "fp16": {"enabled": true, "initial_scale_power": 10, "hysteresis": 1,
             "loss_scale_window": 1000}})");
  auto data = token_file(g.vocab_size, 6);
  TrainerOptions o;
  o.inject_overflow_steps = {2};
  auto t = make_trainer(gpu_backend(DType::kF16), g, c, data.get(), o);
  StepReport r;
  ASSERT_OK(t->step(&r));
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(std::isfinite(r.loss));
  std::vector<float> before, after;
  ASSERT_OK(t->master_parameters(&before));
  ASSERT_OK(t->step(&r));
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, 1024.0);
  ASSERT_OK(t->master_parameters(&after));
  EXPECT_TRUE(before == after) << "a skipped step changed the parameters";
  ASSERT_OK(t->step(&r));
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 512.0);
  EXPECT_EQ(r.skipped_total, 1);
}

// The offloaded optimizer (and offloaded checkpoints) against the GPU optimizer, and a resume,
// byte for byte in the checkpoint file, for bf16 and for fp16 with ds_enhanced.
TEST(TrainTrainerCuda, OffloadedOptimizerEqualsTheGpuOptimizerAndResumes) {
  SKIP_WITHOUT_GPU();
  const GptConfig g = step_config(PositionEncoding::kRotary, false, 37);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    std::string json = kFp16Config;
    if (dtype == DType::kBF16) {
      json = R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": true}, "gradient_clipping": 0.5})";
    }
    SCOPED_TRACE(dtype_name(dtype));
    const TrainConfig c = config_from(json);
    auto data = token_file(g.vocab_size, 7);
    TrainerOptions o;
    o.inject_overflow_steps = {2};
    o.memory.lm_head_tile_tokens = 32;
    const int kSteps = 6;
    auto plain = make_trainer(gpu_backend(dtype), g, c, data.get(), o);
    run_steps(*plain, kSteps);
    const std::string want = temp_path(std::string("plain_") + dtype_name(dtype) + ".ckpt");
    ASSERT_OK(plain->save_checkpoint(want));

    TrainerOptions off = o;
    off.offload_optimizer = true;
    off.memory.offload_checkpoints = true;
    auto offloaded = make_trainer(gpu_backend(dtype), g, c, data.get(), off);
    run_steps(*offloaded, kSteps);
    const std::string got = temp_path(std::string("offloaded_") + dtype_name(dtype) + ".ckpt");
    ASSERT_OK(offloaded->save_checkpoint(got));
    EXPECT_TRUE(file_bytes(want) == file_bytes(got)) << "offloaded optimizer and checkpoints";

    // Resume on the GPU: half, save, a new trainer, the other half.
    auto first = make_trainer(gpu_backend(dtype), g, c, data.get(), o);
    run_steps(*first, kSteps / 2);
    const std::string half = temp_path(std::string("half_") + dtype_name(dtype) + ".ckpt");
    ASSERT_OK(first->save_checkpoint(half));
    first.reset();
    auto second = make_trainer(gpu_backend(dtype), g, c, data.get(), off);
    ASSERT_OK(second->load_checkpoint(half));
    run_steps(*second, kSteps - kSteps / 2);
    const std::string end = temp_path(std::string("resumed_") + dtype_name(dtype) + ".ckpt");
    ASSERT_OK(second->save_checkpoint(end));
    EXPECT_TRUE(file_bytes(want) == file_bytes(end)) << "resumed (offloaded after the resume)";
  }
}

// The plan against the back end's own count of what it allocated in a step (the attention
// index's device copy is allocated by upload_block_sparse_index, outside that count).
TEST(TrainTrainerCuda, MemoryPlanMatchesTheAllocations) {
  SKIP_WITHOUT_GPU();
  GptConfig g = step_config(PositionEncoding::kRotary, true, 4096);
  g.d_model = 256;
  g.n_heads = 8;
  g.n_layers = 4;
  g.vocab_size = 4099;
  const TrainConfig c = config_from(R"({"train_batch_size": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "bf16": {"enabled": true}})");
  std::vector<std::vector<int32_t>> docs = {random_tokens(20000, g.vocab_size - 1, 8)};
  const std::string path = temp_path("plan.tok");
  ASSERT_OK(write_token_file(path, docs, static_cast<uint64_t>(g.vocab_size),
                             static_cast<uint32_t>(g.vocab_size - 1), Tokenizer::kUnspecified));
  std::unique_ptr<TokenFile> data;
  ASSERT_OK(TokenFile::open(path, &data));
  for (const bool offload : {false, true}) {
    TrainerOptions o;
    o.memory.checkpoint_layers = true;
    o.memory.offload_checkpoints = offload;
    o.memory.mlp_tile_tokens = 1024;
    o.memory.lm_head_tile_tokens = 1024;
    o.offload_optimizer = offload;
    auto t = make_trainer(gpu_backend(DType::kBF16, 512), g, c, data.get(), o);
    run_steps(*t, 1);
    PlanInput in;
    in.model = g;
    in.memory = o.memory;
    in.offload_optimizer = offload;
    in.token_chunk = 512;
    MemoryPlan plan;
    ASSERT_OK(plan_training_memory(in, &plan));
    uint64_t index_device = 0;
    for (const LedgerEntry& e : plan.ledger.entries()) {
      if (e.name == "attention index, device copy") index_device = e.bytes;
    }
    const double planned = static_cast<double>(plan.device_bytes - index_device);
    const double peak = static_cast<double>(t->backend().peak_device_bytes());
    const double slack = 64.0 * (1 << 20);
    EXPECT_LE(peak, planned + slack) << "offload " << offload << "\n" << plan.ledger.report();
    EXPECT_GE(peak, 0.8 * planned - slack) << "offload " << offload << "\n" << plan.ledger.report();
    EXPECT_EQ(plan.host_bytes > uint64_t{0}, true);
  }
}

// ---- sequence parallelism: two ranks on one GPU ----

// A Communicator for device memory over a host one (the thread-per-rank test communicator): a
// call on device buffers waits for the back end's queued work, copies them to host memory, runs
// the host collective and copies the results back on the back end's stream, which it waits for.
// Host pointers (the doubles of the max and the sum) go straight through; split() gives an
// adapter over the inner split, so the sequence-parallel group is staged too. With it, ranks as
// threads on one GPU run the trainer's multi-rank paths on the CUDA back end without NCCL.
class DeviceStaging final : public Communicator {
 public:
  DeviceStaging(Communicator* host, Stream stream)
      : h_(host), stream_(static_cast<cudaStream_t>(stream.handle)) {}
  int rank() const override { return h_->rank(); }
  int world_size() const override { return h_->world_size(); }

  Status all_reduce_mean(float* data, int64_t n) override {
    Staged x(*this, data, bytes(n, DType::kF32), true);
    return x.run([&] { return h_->all_reduce_mean(x.as<float>(), n); }, data);
  }
  Status all_reduce_max(double* value) override { return h_->all_reduce_max(value); }
  Status all_reduce_sum(double* value) override { return h_->all_reduce_sum(value); }
  Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) override {
    Staged x(*this, send, bytes(shard * world_size(), DType::kF32), true);
    if (recv == send + static_cast<int64_t>(rank()) * shard) {
      return x.run(
          [&] {
            return h_->reduce_scatter(x.as<float>(), x.as<float>() + rank() * shard, shard, op);
          },
          const_cast<float*>(send));
    }
    Staged y(*this, recv, bytes(shard, DType::kF32), false);
    if (!x.status().ok()) return x.status();
    return y.run([&] { return h_->reduce_scatter(x.as<float>(), y.as<float>(), shard, op); }, recv);
  }
  Status reduce(float* data, int64_t n, int root, ReduceOp op) override {
    Staged x(*this, data, bytes(n, DType::kF32), true);
    return x.run([&] { return h_->reduce(x.as<float>(), n, root, op); }, data);
  }
  Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) override {
    const size_t one = bytes(shard, dtype);
    const size_t mine = one * static_cast<size_t>(rank());
    if (send == static_cast<const std::byte*>(recv) + mine) {
      Staged y(*this, recv, one * static_cast<size_t>(world_size()), true);
      return y.run([&] { return h_->all_gather(y.as<std::byte>() + mine, y.get(), shard, dtype); },
                   recv);
    }
    Staged x(*this, send, one, true),
        y(*this, recv, one * static_cast<size_t>(world_size()), false);
    if (!x.status().ok()) return x.status();
    return y.run([&] { return h_->all_gather(x.get(), y.get(), shard, dtype); }, recv);
  }
  Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) override {
    const size_t all = bytes(chunk * world_size(), dtype);
    Staged x(*this, send, all, true), y(*this, recv, all, false);
    if (!x.status().ok()) return x.status();
    return y.run([&] { return h_->all_to_all(x.get(), y.get(), chunk, dtype); }, recv);
  }
  Status broadcast(void* data, int64_t n, DType dtype, int root) override {
    Staged x(*this, data, bytes(n, dtype), true);
    return x.run([&] { return h_->broadcast(x.get(), n, dtype, root); }, data);
  }
  Status barrier() override { return h_->barrier(); }
  Status split(int color, int key, std::unique_ptr<Communicator>* out) override {
    std::unique_ptr<Communicator> inner;
    Status s = h_->split(color, key, &inner);
    if (!s.ok()) return s;
    auto group = std::make_unique<DeviceStaging>(inner.get(), Stream{stream_});
    group->owned_ = std::move(inner);
    *out = std::move(group);
    return s;
  }

 private:
  static size_t bytes(int64_t n, DType dtype) {
    return n > 0 ? static_cast<size_t>(n) * dtype_size(dtype) : 0;
  }
  static Status cuda_status(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok_status();
    return Status(StatusCode::kDeviceError, std::string(what) + ": " + cudaGetErrorString(e));
  }
  static bool on_device(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  }

  // A host copy of `n` bytes at p when p is device memory (read from it when `read`), else p.
  class Staged {
   public:
    Staged(DeviceStaging& owner, const void* p, size_t n, bool read)
        : owner_(owner), p_(const_cast<void*>(p)), device_(on_device(p)) {
      if (!device_) return;
      host_.resize(n);
      if (read && n > 0) {
        status_ = cuda_status(cudaStreamSynchronize(owner_.stream_), "waiting for the back end");
        if (status_.ok()) {
          status_ = cuda_status(cudaMemcpy(host_.data(), p, n, cudaMemcpyDeviceToHost),
                                "staging a device buffer");
        }
      }
    }
    void* get() { return device_ ? host_.data() : p_; }
    const Status& status() const { return status_; }
    template <typename T>
    T* as() {
      return static_cast<T*>(get());
    }
    // Runs the host collective, then copies this buffer back to `dst` (device memory) on the
    // back end's stream and waits for it.
    template <typename Fn>
    Status run(Fn&& collective, void* dst) {
      if (!status_.ok()) return status_;
      Status s = collective();
      if (!s.ok() || !device_ || host_.empty()) return s;
      s = cuda_status(
          cudaMemcpyAsync(dst, host_.data(), host_.size(), cudaMemcpyHostToDevice, owner_.stream_),
          "copying a result back");
      if (s.ok()) s = cuda_status(cudaStreamSynchronize(owner_.stream_), "copying a result back");
      return s;
    }

   private:
    DeviceStaging& owner_;
    void* p_;
    bool device_;
    std::vector<std::byte> host_;
    Status status_;
  };

  Communicator* h_;
  cudaStream_t stream_;
  std::unique_ptr<Communicator> owned_;  // a split group's host communicator
};

// A CUDA back end on device 0 whose stream DeviceStaging can wait for.
std::unique_ptr<CudaBackend> staged_backend(DType dtype) {
  CudaBackendOptions o;
  o.compute_dtype = dtype;
  o.token_chunk = kChunk;
  std::unique_ptr<CudaBackend> be;
  const Status s = make_cuda_backend(o, &be);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return be;
}

// GptModel on `sp` ranks of one GPU (threads, each with its own back end), two micro-batches as in
// model_step: the losses and the gradients summed over the ranks (each rank's gradient is that of
// its tokens' losses, so the sum is the whole micro-batches').
StepResult sequence_parallel_step(DType dtype, const GptConfig& c, const MemoryOptions& m,
                                  int64_t batch, int sp) {
  std::vector<double> losses(static_cast<size_t>(sp), 0.0);
  std::vector<std::vector<float>> grads(static_cast<size_t>(sp));
  const std::vector<Status> st = run_thread_ranks(sp, [&](Communicator& comm) {
    auto be = staged_backend(dtype);
    if (be == nullptr) return Status::invalid_argument("no CUDA back end");
    DeviceStaging staged(&comm, be->stream());
    std::unique_ptr<GptModel> model;
    Status s = GptModel::create(c, nullptr, batch, m, be.get(), &model, nullptr, &staged);
    if (s.ok()) s = model->zero_grads();
    const size_t T = static_cast<size_t>(batch * c.sequence_length);
    const auto r = static_cast<size_t>(comm.rank());
    for (uint64_t micro = 0; s.ok() && micro < 2; ++micro) {
      const auto in = random_tokens(T, c.vocab_size, 300 + micro);
      const auto tg = random_tokens(T, c.vocab_size, 400 + micro);
      MicroBatchResult out;
      s = model->forward_backward(in.data(), tg.data(), 1.0f, &out);
      losses[r] += out.loss_sum;
    }
    if (s.ok()) {
      grads[r].resize(static_cast<size_t>(model->layout().total));
      s = be->copy_to_host(grads[r].data(), model->grads(), grads[r].size() * sizeof(float));
    }
    return s;
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  StepResult sum;
  std::vector<double> g(grads[0].size(), 0.0);
  for (int r = 0; r < sp; ++r) {
    sum.loss += losses[static_cast<size_t>(r)];
    const std::vector<float>& gr = grads[static_cast<size_t>(r)];
    if (gr.size() != g.size()) return {};
    for (size_t i = 0; i < g.size(); ++i) g[i] += gr[i];
  }
  sum.grads.assign(g.begin(), g.end());
  return sum;
}

class TrainSequenceParallelCuda : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

// The model's step with sequence_parallel_size 2 on the GPU (each rank 1 of the 2 heads over the
// whole sequence, its half of the tokens elsewhere, the layout copies and all-to-alls between)
// against one rank of the CPU on the whole sequence, by the tolerance rule as
// WholeStepMatchesTheCpu checks one GPU rank: the summed loss and every parameter's summed
// gradient. Lengths whose halves are odd and pad the attention (74: halves of 37, block 16, Lp 80)
// and that do not (64); learned and rotary positions; the memory techniques on the second.
TEST_P(TrainSequenceParallelCuda, StepOnTwoRanksMatchesOneCpuRank) {
  const DType dtype = GetParam();
  struct Case {
    PositionEncoding positions;
    bool tied;
    int64_t length;
    bool techniques;
  };
  for (const Case& k : {Case{PositionEncoding::kLearned, true, 74, false},
                        Case{PositionEncoding::kRotary, false, 64, true}}) {
    const GptConfig c = step_config(k.positions, k.tied, k.length);
    SCOPED_TRACE(std::string(position_encoding_name(k.positions)) + ", L " +
                 std::to_string(k.length) + ", " + dtype_name(dtype));
    MemoryOptions m;
    if (k.techniques) {
      m.offload_checkpoints = true;
      m.mlp_tile_tokens = 32;
      m.lm_head_tile_tokens = 32;
    }
    const std::vector<float> w = initial_weights(c, dtype);
    const StepResult got = sequence_parallel_step(dtype, c, m, 2, 2);
    auto cpu = cpu_backend(kChunk);
    const StepResult ref = model_step(*cpu, c, m, 2, &w);
    StepResult lowp = ref;
    if (dtype != DType::kF32) {
      LowpCpuBackend emulated(cpu_backend(kChunk), dtype);
      lowp = model_step(emulated, c, m, 2, &w);
    }
    ASSERT_EQ(got.grads.size(), ref.grads.size());
    EXPECT_TRUE(within_tolerance("loss", {static_cast<float>(got.loss)},
                                 {static_cast<float>(lowp.loss)}, {static_cast<float>(ref.loss)},
                                 dtype));
    for (const TensorSlot& s : gpt_parameter_layout(c).slots) {
      EXPECT_TRUE(within_tolerance("gradient of " + s.name, slot_of(got.grads, s),
                                   slot_of(lowp.grads, s), slot_of(ref.grads, s), dtype));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Train, TrainSequenceParallelCuda,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// The Trainer with sequence_parallel_size 2 on two ranks of one GPU (f32) follows one rank on the
// GPU over three AdamW steps with the same global batches, with FollowsTheCpuTrainer's bounds:
// the losses within fp32 noise, the parameters too except where a gradient is so near zero that
// summation noise flips its sign (Adam's normalised update: at most 2 lr per step, rare).
TEST(TrainTrainerCudaSequenceParallel, StepsOnTwoRanksFollowOneRank) {
  SKIP_WITHOUT_GPU();
  const GptConfig g = step_config(PositionEncoding::kRotary, false, 38);  // halves of 19 tokens
  const std::string json = R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
    "gradient_clipping": 1.0, "sequence_parallel_size": )";
  auto config = [&](int sp) {
    TrainConfig c;
    std::vector<std::string> warnings;
    AutoValues autos;
    autos.device = Device::kCuda;
    autos.world_size = sp;
    const Status s = parse_train_config(json + std::to_string(sp) + "}", "\"test\"", g.n_heads,
                                        autos, &c, &warnings);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return c;
  };
  auto data = token_file(g.vocab_size, 11);
  constexpr int kSteps = 3;
  std::vector<double> one_losses;
  std::vector<float> one, initial;
  {
    auto t = make_trainer(gpu_backend(DType::kF32), g, config(1), data.get());
    ASSERT_NE(t, nullptr);
    ASSERT_OK(t->master_parameters(&initial));
    run_steps(*t, kSteps, &one_losses);
    ASSERT_OK(t->master_parameters(&one));
  }
  std::vector<double> sp_losses;
  std::vector<float> sp;
  const TrainConfig two = config(2);
  const std::vector<Status> st = run_thread_ranks(2, [&](Communicator& comm) {
    auto be = staged_backend(DType::kF32);
    if (be == nullptr) return Status::invalid_argument("no CUDA back end");
    DeviceStaging staged(&comm, be->stream());
    TrainerOptions o;
    o.token_chunk = be->token_chunk();
    o.communicator = &staged;
    std::unique_ptr<Trainer> t;
    Status s = Trainer::create(g, two, o, std::move(be), data.get(), &t);
    for (int k = 0; s.ok() && k < kSteps; ++k) {
      StepReport r;
      s = t->step(&r);
      if (comm.rank() == 0) sp_losses.push_back(r.loss);
    }
    std::vector<float> p;
    if (s.ok()) s = t->master_parameters(&p);
    if (s.ok() && comm.rank() == 0) sp = std::move(p);
    return s;
  });
  for (size_t r = 0; r < st.size(); ++r)
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  ASSERT_EQ(sp_losses.size(), one_losses.size());
  for (size_t i = 0; i < sp_losses.size(); ++i) {
    EXPECT_NEAR(sp_losses[i], one_losses[i], 1e-5 * std::fabs(one_losses[i])) << "step " << i + 1;
  }
  ASSERT_EQ(sp.size(), one.size());
  size_t moved = 0;
  double worst = 0;
  for (size_t i = 0; i < sp.size(); ++i) {
    const double d = std::fabs(static_cast<double>(sp[i]) - one[i]);
    worst = std::max(worst, d);
    moved += d > 1e-6 ? 1 : 0;
  }
  EXPECT_LE(worst, 2 * 1e-3 * kSteps) << "beyond Adam's bound";
  EXPECT_LE(moved, sp.size() / 1000) << moved << " of " << sp.size() << " differ by > 1e-6";
  // Training happened: each step moves a parameter by up to lr (Adam's normalised update), so
  // three steps move the largest by well over 1e-3. (The losses are of three different random
  // batches, so they need not fall in three steps.)
  double travelled = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    travelled = std::max(travelled, std::fabs(static_cast<double>(one[i]) - initial[i]));
  }
  EXPECT_GT(travelled, 1e-3) << "no training happened";
}

TEST(TrainTrainerCuda, BadTokenIdsAreReportedWithTheirPosition) {
  SKIP_WITHOUT_GPU();
  const GptConfig c = step_config(PositionEncoding::kLearned, true, 37);
  auto gpu = gpu_backend(DType::kBF16);
  std::unique_ptr<GptModel> model;
  ASSERT_OK(GptModel::create(c, nullptr, 1, MemoryOptions{}, gpu.get(), &model));
  std::vector<int32_t> in = random_tokens(37, c.vocab_size, 9), tg = in;
  in[20] = static_cast<int32_t>(c.vocab_size) + 4;
  MicroBatchResult r;
  const Status s = model->forward_backward(in.data(), tg.data(), 1.0f, &r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("position 20"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.message();
  // The back end recovers: a good batch runs.
  in[20] = 1;
  ASSERT_OK(model->forward_backward(in.data(), tg.data(), 1.0f, &r));
  EXPECT_TRUE(std::isfinite(r.loss_sum));
}

}  // namespace
}  // namespace sciattn::train

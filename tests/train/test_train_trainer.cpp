// The training loop: a resumed run continues the same trajectory bit for bit (N steps straight
// vs N/2 + save + resume + N/2, with fp16 loss scaling, an overflowed step, adaptive clipping, a
// cosine schedule, accumulation and epoch wrap-around); overflowed steps are skipped and counted;
// the loss falls on learnable data; checkpoints of another model are refused. Test layer (cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "process_temp_dir.h"
#include "sciattn/train/trainer.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

std::string temp_path(const std::string& name) {
  return sciattn::testing::process_temp_dir() + name;
}

// A token file of `documents` pseudo-random documents over a vocabulary of 37 (a separator 36)
// with a learnable pattern: token t is followed by (3 t + 1) mod 36 most of the time.
std::unique_ptr<TokenFile> pattern_file(int documents, uint64_t seed) {
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> noise = random_tokens(static_cast<size_t>(documents) * 40, 36, seed);
  size_t k = 0;
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> doc = {noise[k++] % 36};
    for (int i = 0; i < 30; ++i) {
      const int32_t next = (3 * doc.back() + 1) % 36;
      doc.push_back(noise[k++] % 9 == 0 ? noise[k] % 36 : next);
    }
    docs.push_back(doc);
  }
  const std::string path = temp_path("pattern_" + std::to_string(seed) + ".tok");
  EXPECT_TRUE(write_token_file(path, docs, 37, 36, Tokenizer::kUnspecified).ok());
  std::unique_ptr<TokenFile> f;
  EXPECT_TRUE(TokenFile::open(path, &f).ok());
  std::remove(path.c_str());
  return f;
}

TrainConfig config_from(const std::string& json, const AutoValues& autos = {}) {
  TrainConfig c;
  std::vector<std::string> warnings;
  Status s = parse_train_config(json, "\"test\"", 2, autos, &c, &warnings);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return c;
}

std::unique_ptr<Trainer> make_trainer(const GptConfig& g, const TrainConfig& c,
                                      const TokenFile* data, TrainerOptions options = {}) {
  options.token_chunk = 8;
  std::unique_ptr<Backend> be;
  CpuBackendOptions bo;
  bo.token_chunk = options.token_chunk;
  EXPECT_TRUE(make_cpu_backend(bo, &be).ok());
  std::unique_ptr<Trainer> t;
  Status s = Trainer::create(g, c, options, std::move(be), data, &t);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return t;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const char* kResumeConfig = R"({
  "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20, "warmup_num_steps": 3}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 2,
           "hysteresis": 1, "type": "ds_enhanced"},
  "gradient_clipping": {"type": "adaptive", "threshold": 0.5, "history_window": 3,
                        "adjustment_factor": 0.3}
})";

TEST(TrainTrainer, ResumeContinuesTheSameTrajectoryBitForBit) {
  const GptConfig g = tiny_config(PositionEncoding::kRotary, true, 12);
  const TrainConfig c = config_from(kResumeConfig);
  auto data = pattern_file(8, 1);  // 8 * 31 tokens: 20 samples of 13, so epochs wrap
  TrainerOptions o;
  o.inject_overflow_steps = {2, 5};
  o.memory.lm_head_tile_tokens = 16;
  const int kSteps = 8;

  auto straight = make_trainer(g, c, data.get(), o);
  for (int i = 0; i < kSteps; ++i) {
    StepReport r;
    ASSERT_TRUE(straight->step(&r).ok());
  }
  EXPECT_EQ(straight->applied_steps(), kSteps - 2);
  EXPECT_GE(straight->data().position().epoch, 1u);
  const std::string path_a = temp_path("straight.ckpt");
  ASSERT_TRUE(straight->save_checkpoint(path_a).ok());

  auto first = make_trainer(g, c, data.get(), o);
  for (int i = 0; i < kSteps / 2; ++i) {
    StepReport r;
    ASSERT_TRUE(first->step(&r).ok());
  }
  const std::string half = temp_path("half.ckpt");
  ASSERT_TRUE(first->save_checkpoint(half).ok());
  first.reset();
  auto second = make_trainer(g, c, data.get(), o);
  ASSERT_TRUE(second->load_checkpoint(half).ok());
  EXPECT_EQ(second->global_step(), kSteps / 2);
  for (int i = 0; i < kSteps / 2; ++i) {
    StepReport r;
    ASSERT_TRUE(second->step(&r).ok());
  }
  const std::string path_b = temp_path("resumed.ckpt");
  ASSERT_TRUE(second->save_checkpoint(path_b).ok());
  // The two files: same parameters, optimizer state, scaler, clipper, data position, bytes.
  EXPECT_TRUE(file_bytes(path_a) == file_bytes(path_b));
  std::string header_a, header_b;
  std::vector<CheckpointTensor> ta, tb;
  ASSERT_TRUE(read_checkpoint(path_a, &header_a, &ta).ok());
  ASSERT_TRUE(read_checkpoint(path_b, &header_b, &tb).ok());
  EXPECT_EQ(header_a, header_b);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].name, tb[i].name);
    EXPECT_TRUE(ta[i].bytes == tb[i].bytes) << ta[i].name;
  }
}

// The offload techniques on the CPU back end, where "host memory" is the back end's own and a
// copy is a memcpy: the same order of calls, hooks and copies as on a GPU. The optimizer offload
// (master weights, m, v in host buffers, gradients copied group by group during the backward,
// the CPU AdamW on a worker thread overlapping the next forward) and the checkpoint offload must
// give the same checkpoint file, byte for byte, as the plain run, through fp16 overflows,
// ds_enhanced unscaling, adaptive clipping, accumulation and a resume.
void run_steps(Trainer& t, int steps) {
  for (int i = 0; i < steps; ++i) {
    StepReport r;
    ASSERT_TRUE(t.step(&r).ok());
  }
}

TEST(TrainTrainer, OffloadedOptimizerAndCheckpointsGiveTheSameBits) {
  const GptConfig g = tiny_config(PositionEncoding::kRotary, false, 12);
  for (const char* type : {"ds_enhanced", "standard"}) {
    std::string json = kResumeConfig;
    if (std::string(type) == "standard") json.replace(json.find("ds_enhanced"), 11, "standard");
    const TrainConfig c = config_from(json);
    auto data = pattern_file(8, 1);
    TrainerOptions o;
    o.inject_overflow_steps = {2, 5};
    o.memory.lm_head_tile_tokens = 16;
    const int kSteps = 7;
    auto plain = make_trainer(g, c, data.get(), o);
    run_steps(*plain, kSteps);
    const std::string want = temp_path(std::string("plain_") + type + ".ckpt");
    ASSERT_TRUE(plain->save_checkpoint(want).ok());

    TrainerOptions off = o;
    off.offload_optimizer = true;
    auto offloaded = make_trainer(g, c, data.get(), off);
    ASSERT_TRUE(offloaded->optimizer_offloaded());
    run_steps(*offloaded, kSteps);
    const std::string got = temp_path(std::string("offloaded_") + type + ".ckpt");
    ASSERT_TRUE(offloaded->save_checkpoint(got).ok());
    EXPECT_TRUE(file_bytes(want) == file_bytes(got)) << type << ": optimizer offload";

    TrainerOptions both = off;
    both.memory.offload_checkpoints = true;
    both.memory.mlp_tile_tokens = 8;
    auto all = make_trainer(g, c, data.get(), both);
    EXPECT_TRUE(all->model().memory_options().checkpoint_layers);
    run_steps(*all, kSteps / 2);
    const std::string half = temp_path(std::string("offloaded_half_") + type + ".ckpt");
    ASSERT_TRUE(all->save_checkpoint(half).ok());
    all.reset();
    auto resumed = make_trainer(g, c, data.get(), both);
    ASSERT_TRUE(resumed->load_checkpoint(half).ok());
    run_steps(*resumed, kSteps - kSteps / 2);
    const std::string end = temp_path(std::string("offloaded_all_") + type + ".ckpt");
    ASSERT_TRUE(resumed->save_checkpoint(end).ok());
    EXPECT_TRUE(file_bytes(want) == file_bytes(end))
        << type << ": both offloads, checkpointing, MLP tiles and a resume";
  }
}

TEST(TrainTrainer, ConfigKeysSwitchTheOffloadsOn) {
  const GptConfig g = tiny_config();
  const TrainConfig c = config_from(R"({"train_batch_size": 2,
    "activation_checkpointing": {"cpu_checkpointing": true},
    "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})");
  EXPECT_TRUE(c.cpu_checkpointing);
  EXPECT_TRUE(c.offload_optimizer);
  auto data = pattern_file(4, 6);
  auto t = make_trainer(g, c, data.get());
  EXPECT_TRUE(t->optimizer_offloaded());
  EXPECT_TRUE(t->model().memory_options().offload_checkpoints);
  EXPECT_TRUE(t->model().memory_options().checkpoint_layers);
  const std::string ledger = t->ledger().report();
  EXPECT_NE(ledger.find("offloaded checkpoints"), std::string::npos) << ledger;
  EXPECT_NE(ledger.find("master weights (f32), offloaded"), std::string::npos) << ledger;
  StepReport r;
  ASSERT_TRUE(t->step(&r).ok());
  EXPECT_TRUE(std::isfinite(r.loss));
}

TEST(TrainTrainer, OverflowedStepsAreSkippedCountedAndHalveTheScale) {
  const GptConfig g = tiny_config();
  const TrainConfig c = config_from(R"({"train_batch_size": 2,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                  "warmup_num_steps": 10, "warmup_type": "linear"}},
    "fp16": {"enabled": true, "initial_scale_power": 10, "hysteresis": 1,
             "loss_scale_window": 1000}})");
  auto data = pattern_file(4, 2);
  TrainerOptions o;
  o.inject_overflow_steps = {2, 3};
  auto t = make_trainer(g, c, data.get(), o);
  std::vector<float> before;
  StepReport r;
  ASSERT_TRUE(t->step(&r).ok());
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 1024.0);
  EXPECT_EQ(r.lr, 0.0);  // the first step runs at warmup_min_lr
  ASSERT_TRUE(t->master_parameters(&before).ok());
  ASSERT_TRUE(t->step(&r).ok());
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.skipped_total, 1);
  EXPECT_EQ(r.loss_scale, 1024.0);
  ASSERT_TRUE(t->step(&r).ok());
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, 512.0);
  EXPECT_EQ(r.skipped_total, 2);
  // Skipped steps changed nothing; the schedule did not advance.
  std::vector<float> after;
  ASSERT_TRUE(t->master_parameters(&after).ok());
  EXPECT_TRUE(after == before);
  ASSERT_TRUE(t->step(&r).ok());
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 256.0);
  EXPECT_EQ(r.lr, 0.0);  // second applied step: iteration 0, linear warmup 0 / 10
  ASSERT_TRUE(t->step(&r).ok());
  EXPECT_NEAR(r.lr, 1e-4, 1e-12);  // third applied step: iteration 1
  EXPECT_EQ(t->global_step(), 5);
  EXPECT_EQ(t->applied_steps(), 3);
}

TEST(TrainTrainer, LossFallsOnLearnableData) {
  const GptConfig g = tiny_config(PositionEncoding::kLearned, true, 16);
  const TrainConfig c = config_from(R"({"train_batch_size": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "gradient_clipping": 1.0})");
  auto data = pattern_file(40, 3);
  auto t = make_trainer(g, c, data.get());
  double first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    StepReport r;
    ASSERT_TRUE(t->step(&r).ok());
    if (i < 3) first += r.loss / 3;
    if (i >= 37) last += r.loss / 3;
    EXPECT_TRUE(std::isfinite(r.grad_norm));
    EXPECT_LE(r.clip_coefficient, 1.0);
  }
  EXPECT_LT(last, first - 1.0) << "first " << first << ", last " << last;
}

TEST(TrainTrainer, CheckpointOfAnotherModelIsRefused) {
  GptConfig g = tiny_config();
  const TrainConfig c = config_from(R"({"train_batch_size": 2})");
  auto data = pattern_file(4, 4);
  auto t = make_trainer(g, c, data.get());
  const std::string path = temp_path("other.ckpt");
  ASSERT_TRUE(t->save_checkpoint(path).ok());
  g.n_layers = 3;
  auto u = make_trainer(g, c, data.get());
  Status s = u->load_checkpoint(path);
  EXPECT_NE(s.message().find("was written for another model"), std::string::npos) << s.message();
  s = u->load_checkpoint(temp_path("none.ckpt"));
  EXPECT_NE(s.message().find("cannot read"), std::string::npos) << s.message();
}

// A checkpoint that cannot be written gets an error naming the path and leaves no file behind:
// neither the checkpoint nor its temporary "<path>.tmp".
TEST(TrainTrainer, UnwritableCheckpointPathIsReportedAndLeavesNothing) {
  const TrainConfig c = config_from(R"({"train_batch_size": 2})");
  auto data = pattern_file(4, 4);
  auto t = make_trainer(tiny_config(), c, data.get());
  const std::string missing_dir = temp_path("no-such-dir") + "/x.ckpt";
  Status s = t->save_checkpoint(missing_dir);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot write \"" + missing_dir + ".tmp\""), std::string::npos)
      << s.message();
  // A folder where the file should go: the temporary file is written, the rename fails.
  const std::string folder = temp_path("folder.ckpt");
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder + "/inside");
  s = t->save_checkpoint(folder);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("\" to \"" + folder + "\""), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(folder + ".tmp"));
  EXPECT_TRUE(std::filesystem::is_directory(folder + "/inside"));
  std::filesystem::remove_all(folder);
}

// Without gradient clipping the clipper's threshold is +infinity (null in the JSON header); the
// checkpoint still loads, and the resumed run continues the straight one bit for bit.
TEST(TrainTrainer, CheckpointWithoutClippingResumes) {
  const GptConfig g = tiny_config();
  const TrainConfig c = config_from(R"({"train_batch_size": 2})");
  ASSERT_EQ(c.clip.mode, ClipMode::kNone);
  auto data = pattern_file(4, 5);
  auto straight = make_trainer(g, c, data.get());
  StepReport r;
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(straight->step(&r).ok());
  const std::string half = temp_path("noclip_half.ckpt"), want = temp_path("noclip_want.ckpt"),
                    got = temp_path("noclip_got.ckpt");
  auto first = make_trainer(g, c, data.get());
  ASSERT_TRUE(first->step(&r).ok());
  ASSERT_TRUE(first->save_checkpoint(half).ok());
  EXPECT_NE(file_bytes(half).find("\"threshold\":null"), std::string::npos);
  auto second = make_trainer(g, c, data.get());
  Status s = second->load_checkpoint(half);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(second->step(&r).ok());
  ASSERT_TRUE(straight->save_checkpoint(want).ok());
  ASSERT_TRUE(second->save_checkpoint(got).ok());
  EXPECT_EQ(file_bytes(want), file_bytes(got));
}

TEST(TrainTrainer, GradientDumpHoldsParamsGradsAndTokens) {
  const GptConfig g = tiny_config();
  const TrainConfig c = config_from(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
    "fp16": {"enabled": true}})");
  auto data = pattern_file(4, 5);
  TrainerOptions o;
  o.dump_gradients_path = temp_path("grads.bin");
  auto t = make_trainer(g, c, data.get(), o);
  StepReport r;
  ASSERT_TRUE(t->step(&r).ok());
  std::string header;
  std::vector<CheckpointTensor> tensors;
  ASSERT_TRUE(read_checkpoint(o.dump_gradients_path, &header, &tensors).ok());
  const size_t slots = t->model().layout().slots.size();
  ASSERT_EQ(tensors.size(), 2 * slots + 2);
  EXPECT_EQ(tensors[slots].name, "grads/wte");
  EXPECT_EQ(tensors.back().name, "batch/targets");
  EXPECT_EQ(tensors.back().shape, (std::vector<int64_t>{4, 12}));
  // Unscaled: the fp16 loss scale (65536) is divided out.
  double norm = 0;
  for (size_t i = slots; i < 2 * slots; ++i) {
    const float* p = reinterpret_cast<const float*>(tensors[i].bytes.data());
    for (size_t k = 0; k < tensors[i].bytes.size() / 4; ++k)
      norm += static_cast<double>(p[k]) * p[k];
  }
  EXPECT_NEAR(std::sqrt(norm), r.grad_norm, 1e-6 * r.grad_norm);
}

}  // namespace
}  // namespace sciattn::train

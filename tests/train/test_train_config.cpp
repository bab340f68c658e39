// The trainer's DeepSpeed config and model file: the honoured keys with DeepSpeed's semantics,
// batch-size arithmetic, "auto", one warning per key that does not apply, and an error naming the
// key for everything else. Test layer (cpu).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sciattn/train/config.h"
#include "sciattn/train/gpt.h"

namespace sciattn::train {
namespace {

// The config of spec/trainer.md section 1, unchanged.
const char* kSpecExample = R"({
  "train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
  "optimizer": {"type": "AdamW", "params": {"lr": 6e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 6e-5,
                "warmup_num_steps": 100, "total_num_steps": 10000}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
           "hysteresis": 2, "min_loss_scale": 1, "type": "ds_enhanced"},
  "bf16": {"enabled": false},
  "gradient_clipping": {"enabled": true, "type": "adaptive", "threshold": 1.0,
                        "history_window": 1000, "adjustment_factor": 0.2},
  "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
                        "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8,
                        "allgather_partitions": true, "reduce_scatter": true,
                        "offload_optimizer": {"device": "cpu", "pin_memory": true}},
  "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": true,
                               "contiguous_memory_optimization": false, "number_checkpoints": null},
  "sequence_parallel_size": 1,
  "sparse_attention": {"mode": "bigbird", "block": 64, "num_random_blocks": 3},
  "steps_per_print": 10, "wall_clock_breakdown": false
})";

TrainConfig parse_ok(const std::string& json, std::vector<std::string>* warnings = nullptr,
                     const AutoValues& autos = {}) {
  TrainConfig c;
  std::vector<std::string> w;
  Status s = parse_train_config(json, "\"ds.json\"", 4, autos, &c, warnings ? warnings : &w);
  EXPECT_TRUE(s.ok()) << s.to_string() << "\n" << json;
  return c;
}

void expect_error(const std::string& json, const std::vector<std::string>& fragments,
                  const AutoValues& autos = {}) {
  TrainConfig c;
  std::vector<std::string> w;
  Status s = parse_train_config(json, "\"ds.json\"", 4, autos, &c, &w);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << json << "\n" << s.to_string();
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), std::string::npos)
        << "message \"" << s.message() << "\" lacks \"" << f << "\"";
  }
}

bool has_warning(const std::vector<std::string>& w, const std::string& fragment) {
  for (const std::string& line : w) {
    if (line.find(fragment) != std::string::npos) return true;
  }
  return false;
}

TEST(TrainConfig, SpecExampleParsesWithDeepSpeedSemantics) {
  std::vector<std::string> w;
  const TrainConfig c = parse_ok(kSpecExample, &w);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.micro_batch_size, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 16);
  EXPECT_EQ(c.optimizer_type, "AdamW");
  EXPECT_FLOAT_EQ(c.optimizer.lr, 6e-5f);
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.01f);
  EXPECT_TRUE(c.optimizer.adamw_mode);
  EXPECT_EQ(c.schedule.type, LrScheduleType::kWarmupDecayLR);
  EXPECT_EQ(c.schedule.total_num_steps, 10000);
  EXPECT_EQ(c.precision, Precision::kFp16);
  EXPECT_TRUE(c.ds_enhanced);
  EXPECT_TRUE(c.loss_scaler.dynamic);
  EXPECT_EQ(c.loss_scaler.hysteresis, 2);
  EXPECT_EQ(c.clip.mode, ClipMode::kAdaptive);
  EXPECT_EQ(c.clip.history_window, 1000);
  EXPECT_TRUE(c.activation_checkpointing);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_TRUE(c.offload_optimizer);
  ASSERT_TRUE(c.sparse_attention.has_value());
  EXPECT_EQ(sparsity_mode(*c.sparse_attention), SparsityMode::kBigBird);
  EXPECT_EQ(sparsity_common(*c.sparse_attention).num_heads, 4);
  EXPECT_EQ(c.steps_per_print, 10);
  // One warning per key that does not apply, each naming its key.
  for (const char* key :
       {"zero_optimization.stage", "zero_optimization.overlap_comm",
        "zero_optimization.contiguous_gradients", "zero_optimization.reduce_bucket_size",
        "zero_optimization.allgather_bucket_size", "zero_optimization.allgather_partitions",
        "zero_optimization.reduce_scatter", "zero_optimization.offload_optimizer.device",
        "activation_checkpointing.cpu_checkpointing",
        "activation_checkpointing.contiguous_memory_optimization", "fp16.enabled"}) {
    EXPECT_TRUE(has_warning(w, std::string("ds.json\": ") + key)) << key;
  }
  EXPECT_EQ(w.size(), 11u);
  for (const std::string& line : w) EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

// overlap_comm acts at stage 2 only (stages 0 and 1 reduce once, after the backward): one
// warning naming the key and the stage, and the value kept.
TEST(TrainConfig, OverlapCommBelowStage2Warns) {
  AutoValues autos;
  autos.world_size = 2;
  for (int stage : {0, 1}) {
    std::vector<std::string> w;
    const TrainConfig c = parse_ok(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + R"(, "overlap_comm": true}})",
                                   &w, autos);
    ASSERT_EQ(w.size(), 1u) << stage;
    EXPECT_NE(w[0].find("zero_optimization.overlap_comm"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("at stage " + std::to_string(stage)), std::string::npos) << w[0];
    EXPECT_TRUE(c.zero.overlap_comm);
    // false asks for nothing that is ignored: no warning.
    std::vector<std::string> none;
    const TrainConfig off = parse_ok(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                                         std::to_string(stage) + R"(, "overlap_comm": false}})",
                                     &none, autos);
    EXPECT_TRUE(none.empty()) << none.front();
    EXPECT_FALSE(off.zero.overlap_comm);
  }
}

// With several data-parallel ranks the ZeRO keys act: no warnings for them, their values kept,
// and the batch arithmetic multiplies by the ranks.
TEST(TrainConfig, ZeroKeysActWithSeveralRanks) {
  AutoValues autos;
  autos.world_size = 4;
  std::vector<std::string> w;
  const std::string json = R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": false,
      "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8, "reduce_scatter": false,
      "allgather_partitions": false}})";
  const TrainConfig c = parse_ok(json, &w, autos);
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
  EXPECT_FALSE(c.zero.reduce_scatter);
  EXPECT_FALSE(c.zero.allgather_partitions);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_FALSE(c.zero.contiguous_gradients);
  EXPECT_EQ(c.data_parallel_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);  // 64 / (2 x 4)
  // Defaults are DeepSpeed's.
  const TrainConfig d =
      parse_ok(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})", &w, autos);
  EXPECT_EQ(d.zero.stage, 2);
  EXPECT_EQ(d.zero.reduce_bucket_size, 500000000);
  EXPECT_TRUE(d.zero.reduce_scatter);
  EXPECT_TRUE(d.zero.allgather_partitions);
  EXPECT_EQ(d.micro_batch_size, 2);  // 8 / 4 ranks, accumulation 1
  // The spec's example (16 = 1 x 16 x ranks) does not fit four ranks: the error shows why.
  expect_error(kSpecExample,
               {"train_batch_size 16 != train_micro_batch_size_per_gpu 1",
                "x gradient_accumulation_steps 16 x data-parallel ranks 4 = 64"},
               autos);
  autos.world_size = 0;
  expect_error(R"({"train_batch_size": 8})", {"the world size must be >= 1; got 0"}, autos);
}

// sequence_parallel_size groups the world's ranks: the batch arithmetic counts the data-parallel
// ranks (world / sequence_parallel_size), and sizes that do not divide are refused by name.
TEST(TrainConfig, SequenceParallelSize) {
  AutoValues autos;
  autos.world_size = 8;
  std::vector<std::string> w;
  const TrainConfig c = parse_ok(
      R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
          "sequence_parallel_size": 2, "zero_optimization": {"stage": 2}})",
      &w, autos);
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_EQ(c.sequence_parallel_size, 2);
  EXPECT_EQ(c.data_parallel_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);  // 16 / (2 x 4 data-parallel ranks)
  // All ranks in one group: one data-parallel rank.
  AutoValues four;
  four.world_size = 4;
  const TrainConfig all =
      parse_ok(R"({"train_batch_size": 3, "sequence_parallel_size": 4})", &w, four);
  EXPECT_EQ(all.data_parallel_size, 1);
  EXPECT_EQ(all.micro_batch_size, 3);
  // The world (the launcher's ranks) must be a multiple: one rank cannot hold a group of 2.
  expect_error(R"({"train_batch_size": 4, "sequence_parallel_size": 2})",
               {"sequence_parallel_size 2 does not divide the world size 1", "use a divisor of 1"});
  autos.world_size = 6;
  expect_error(R"({"train_batch_size": 6, "sequence_parallel_size": 4})",
               {"sequence_parallel_size 4 does not divide the world size 6"}, autos);
  // The model's 4 heads split over the group: 3 does not divide them (6 ranks would do).
  expect_error(R"({"train_batch_size": 6, "sequence_parallel_size": 3})",
               {"sequence_parallel_size 3 does not divide the model's n_heads 4",
                "use a divisor of n_heads"},
               autos);
  expect_error(R"({"train_batch_size": 6, "sequence_parallel_size": 0})",
               {"sequence_parallel_size must be >= 1"}, autos);
}

TEST(TrainConfig, BatchSizeArithmetic) {
  TrainConfig c;
  ASSERT_TRUE(resolve_batch_sizes(16, 2, 0, 1, &c).ok());
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  ASSERT_TRUE(resolve_batch_sizes(16, 0, 4, 1, &c).ok());
  EXPECT_EQ(c.micro_batch_size, 4);
  ASSERT_TRUE(resolve_batch_sizes(0, 3, 5, 1, &c).ok());
  EXPECT_EQ(c.train_batch_size, 15);
  ASSERT_TRUE(resolve_batch_sizes(8, 0, 0, 1, &c).ok());
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  ASSERT_TRUE(resolve_batch_sizes(0, 4, 0, 2, &c).ok());
  EXPECT_EQ(c.train_batch_size, 8);
  ASSERT_TRUE(resolve_batch_sizes(16, 1, 8, 2, &c).ok());
  Status s = resolve_batch_sizes(16, 3, 5, 1, &c);
  EXPECT_NE(s.message().find("train_batch_size 16 != train_micro_batch_size_per_gpu 3 x "
                             "gradient_accumulation_steps 5 x data-parallel ranks 1 = 15"),
            std::string::npos)
      << s.message();
  // 10 / 3 does not divide: the derived accumulation (3) does not multiply back.
  s = resolve_batch_sizes(10, 3, 0, 1, &c);
  EXPECT_NE(s.message().find("= 9"), std::string::npos) << s.message();
  s = resolve_batch_sizes(0, 0, 4, 1, &c);
  EXPECT_NE(s.message().find("train_micro_batch_size_per_gpu must be given"), std::string::npos);
  expect_error(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 3,
                   "gradient_accumulation_steps": 5})",
               {"ds.json", "16 != train_micro_batch_size_per_gpu 3"});
  expect_error(R"({"train_batch_size": 0})", {"train_batch_size must be >= 1; got 0"});
  expect_error(R"({"train_batch_size": "16"})", {"train_batch_size must be an integer"});
}

TEST(TrainConfig, AutoValuesAreFilledOrRefusedByName) {
  AutoValues autos;
  autos.micro_batch_size = 2;
  autos.lr = 3e-4;
  autos.total_num_steps = 500;
  const std::string json = R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto",
                  "warmup_num_steps": 10}},
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})";
  std::vector<std::string> w;
  const TrainConfig c = parse_ok(json, &w, autos);
  EXPECT_EQ(c.micro_batch_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_EQ(c.schedule.total_num_steps, 500);
  EXPECT_DOUBLE_EQ(c.schedule.base_lr, static_cast<double>(3e-4f));
  EXPECT_EQ(c.precision, Precision::kFp32);  // "auto" precision: the CPU path's fp32
  expect_error(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})",
      {"optimizer.params.lr is \"auto\"", "--lr"});
  expect_error(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"betas": "auto"}}})",
      {"optimizer.params.betas is \"auto\"", "cannot fill"});
  expect_error(R"({"train_micro_batch_size_per_gpu": "auto"})",
               {"train_micro_batch_size_per_gpu must be given"});
  expect_error(R"({"train_batch_size": 8, "gradient_clipping": "auto"})",
               {"gradient_clipping is \"auto\"", "--gradient-clipping"});
}

TEST(TrainConfig, KeysThatDoNotApplyWarnOnceEach) {
  std::vector<std::string> w;
  parse_ok(R"({"train_batch_size": 4, "wandb": {"enabled": true}, "prescale_gradients": false,
               "zero_optimization": {"stage": 0, "stage3_max_live_parameters": 1e9},
               "optimizer": {"type": "Adam", "params": {"torch_adam": true}}})",
           &w);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_TRUE(has_warning(w, "wandb exists in DeepSpeed but does not apply"));
  EXPECT_TRUE(has_warning(w, "prescale_gradients exists in DeepSpeed"));
  EXPECT_TRUE(has_warning(w, "zero_optimization.stage3_max_live_parameters"));
  EXPECT_TRUE(has_warning(w, "optimizer.params.torch_adam"));
}

TEST(TrainConfig, UnknownKeysAndWrongTypesAreErrorsNamingTheKey) {
  expect_error(R"({"train_batch_size": 4, "train_batch_sise": 4})",
               {"train_batch_sise is not a DeepSpeed config key"});
  expect_error(R"({"train_batch_size": 4, "fp16": {"enabled": true, "hysterisis": 2}})",
               {"fp16.hysterisis is not a key"});
  expect_error(
      R"({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "beta": 0.9}}})",
      {"optimizer.params.beta is not a key"});
  expect_error(R"({"train_batch_size": 4, "optimizer": {"type": "Lamb"}})",
               {"optimizer.type", "\"Lamb\" is not supported"});
  expect_error(
      R"({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})",
      {"optimizer.params.betas must be a list of two numbers"});
  expect_error(R"({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": -1}}})",
               {"optimizer.params.lr must be a finite number >= 0"});
  expect_error(
      R"({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})",
      {"optimizer.params.amsgrad is not supported"});
  expect_error(
      R"({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})",
      {"scheduler.params.total_num_steps is not a parameter of WarmupLR"});
  expect_error(R"({"train_batch_size": 4, "scheduler": {"type": "OneCycle"}})",
               {"scheduler.type", "\"OneCycle\" is not supported"});
  expect_error(R"({"train_batch_size": 4, "scheduler": {"type": "WarmupDecayLR", "params": {}}})",
               {"scheduler.params.total_num_steps is required"});
  expect_error(
      R"({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})",
      {"scheduler.params.warmup_type must be \"log\" or \"linear\""});
  expect_error(R"({"train_batch_size": 4, "fp16": {"enabled": true, "hysteresis": 0}})",
               {"fp16.hysteresis must be >= 1; got 0"});
  expect_error(R"({"train_batch_size": 4, "fp16": {"enabled": true, "loss_scale_window": 0}})",
               {"fp16.loss_scale_window must be >= 1"});
  expect_error(R"({"train_batch_size": 4, "fp16": {"enabled": true, "type": "fancy"}})",
               {"fp16.type must be \"standard\" or \"ds_enhanced\""});
  expect_error(R"({"train_batch_size": 4, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
               {"fp16 and bf16 are both enabled"});
  expect_error(
      R"({"train_batch_size": 4, "gradient_clipping": {"type": "adaptive", "history_window": 0}})",
      {"gradient_clipping.history_window must be >= 1"});
  expect_error(
      R"({"train_batch_size": 4, "gradient_clipping": {"type": "adaptive", "adjustment_factor": 2}})",
      {"gradient_clipping.adjustment_factor must be in (0, 1]"});
  expect_error(R"({"train_batch_size": 4, "gradient_clipping": {"type": "smart"}})",
               {"gradient_clipping.type must be \"fixed\" or \"adaptive\""});
  expect_error(R"({"train_batch_size": 4, "gradient_clipping": -1})",
               {"gradient_clipping must be >= 0"});
  expect_error(R"({"train_batch_size": 4, "gradient_clipping": [1]})",
               {"gradient_clipping must be a number or an object"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"stage": 3}})",
               {"zero_optimization.stage", "3 (parameter partitioning) is not supported",
                "the supported stages are 0, 1 and 2"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"stage": 4}})",
               {"zero_optimization.stage", "the supported stages are 0, 1 and 2"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"stage": -1}})",
               {"zero_optimization.stage must be >= 0"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"reduce_bucket_size": 0}})",
               {"zero_optimization.reduce_bucket_size must be >= 1"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"allgather_bucket_size": 1.5}})",
               {"zero_optimization.allgather_bucket_size must be an integer"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"reduce_scatter": "yes"}})",
               {"zero_optimization.reduce_scatter must be true or false"});
  expect_error(R"({"train_batch_size": 4, "zero_optimization": {"allgather_partition": true}})",
               {"zero_optimization.allgather_partition is not a key DeepSpeed knows here",
                "allgather_partitions"});
  expect_error(
      R"({"train_batch_size": 4, "zero_optimization": {"offload_optimizer": {"device": "gpu"}}})",
      {"zero_optimization.offload_optimizer.device must be"});
  expect_error(R"({"train_batch_size": 4, "sparse_attention": {"mode": "bigbrd"}})",
               {"ds.json", "unknown mode \"bigbrd\""});
  expect_error(R"({"train_batch_size": 4, "steps_per_print": 0})",
               {"steps_per_print must be >= 1"});
  expect_error(R"({"train_batch_size": 4, "wall_clock_breakdown": 1})",
               {"wall_clock_breakdown must be true or false"});
  expect_error(R"({"train_batch_size": 4, "train_batch_size": 4})",
               {"\"train_batch_size\" appears twice"});
  expect_error(R"({"train_batch_size": 4,)", {"malformed JSON"});
  expect_error(R"([1, 2])", {"must hold a JSON object"});
}

TEST(TrainConfig, AdamModeAndDefaults) {
  TrainConfig c = parse_ok(R"({"train_batch_size": 2,
    "optimizer": {"type": "adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}})");
  EXPECT_EQ(c.optimizer_type, "Adam");
  EXPECT_FALSE(c.optimizer.adamw_mode);
  c = parse_ok(R"({"train_batch_size": 2})");
  EXPECT_EQ(c.optimizer_type, "AdamW");  // no optimizer section: AdamW with torch's defaults
  EXPECT_FLOAT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_EQ(c.schedule.type, LrScheduleType::kConstant);
  EXPECT_EQ(c.clip.mode, ClipMode::kNone);
  EXPECT_EQ(c.steps_per_print, 1);
  // WarmupLR's warmup_max_lr defaults to the optimizer's lr.
  c = parse_ok(R"({"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
                   "scheduler": {"type": "WarmupLR"}})");
  EXPECT_DOUBLE_EQ(c.schedule.warmup_max_lr, static_cast<double>(0.02f));
  c = parse_ok(R"({"train_batch_size": 2, "gradient_clipping": 1.5})");
  EXPECT_EQ(c.clip.mode, ClipMode::kFixed);
  EXPECT_EQ(c.clip.threshold, 1.5);
  c = parse_ok(R"({"train_batch_size": 2, "gradient_clipping": 0})");
  EXPECT_EQ(c.clip.mode, ClipMode::kNone);
  c = parse_ok(R"({"train_batch_size": 2, "fp16": {"enabled": true, "loss_scale": 128}})");
  EXPECT_FALSE(c.loss_scaler.dynamic);
  EXPECT_EQ(c.loss_scaler.static_scale, 128.0);
  EXPECT_FALSE(c.ds_enhanced);
  std::vector<std::string> w;
  c = parse_ok(R"({"train_batch_size": 2, "bfloat16": {"enabled": true}})", &w);
  EXPECT_EQ(c.precision, Precision::kBf16);
  EXPECT_TRUE(has_warning(w, "bfloat16.enabled is true, but the CPU path computes in fp32"));
}

// ---- the model file ----

void expect_model_error(const std::string& json, const std::vector<std::string>& fragments) {
  GptConfig c;
  Status s = parse_gpt_config(json, "\"gpt.json\"", &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << json;
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), std::string::npos)
        << "message \"" << s.message() << "\" lacks \"" << f << "\"";
  }
}

TEST(TrainModelFile, ParsesAndRoundTrips) {
  GptConfig c;
  ASSERT_TRUE(parse_gpt_config(R"({"vocab_size": 50304, "d_model": 2048, "n_layers": 24,
      "n_heads": 16, "sequence_length": 4096, "positions": "rotary", "tie_embeddings": false,
      "seed": 3})",
                               "\"gpt.json\"", &c)
                  .ok());
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.mlp_width(), 8192);
  EXPECT_EQ(c.positions, PositionEncoding::kRotary);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  GptConfig again;
  ASSERT_TRUE(parse_gpt_config(gpt_config_json(c), "\"x\"", &again).ok());
  EXPECT_EQ(gpt_config_json(again), gpt_config_json(c));
  // GPT-2 124M's parameter count (tied, learned positions 1024, vocab 50257).
  GptConfig g2;
  ASSERT_TRUE(parse_gpt_config(R"({"vocab_size": 50257, "d_model": 768, "n_layers": 12,
      "n_heads": 12, "sequence_length": 1024})",
                               "\"g\"", &g2)
                  .ok());
  EXPECT_EQ(gpt_parameter_layout(g2).parameter_count(), 124439808);
}

TEST(TrainModelFile, ErrorsNameTheKey) {
  const std::string base =
      R"("vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "sequence_length": 16)";
  expect_model_error("{" + base + R"(, "n_head": 4})", {"gpt.json", "unknown key \"n_head\""});
  expect_model_error(R"({"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4})",
                     {"lacks \"sequence_length\""});
  expect_model_error(
      R"({"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 5, "sequence_length": 16})",
      {"n_heads must divide d_model (32); got 5"});
  expect_model_error(
      R"({"vocab_size": 64, "d_model": 36, "n_layers": 2, "n_heads": 4, "sequence_length": 16})",
      {"n_heads must leave an even head dim"});
  expect_model_error("{" + base + R"(, "positions": "alibi"})",
                     {"positions must be \"learned\" or \"rotary\"; got \"alibi\""});
  expect_model_error("{" + base + R"(, "max_position_embeddings": 8})",
                     {"max_position_embeddings (8) must be at least sequence_length (16)"});
  expect_model_error("{" + base + R"(, "mlp_ratio": 2.71})", {"mlp_ratio"});
  expect_model_error(
      R"({"vocab_size": "64", "d_model": 32, "n_layers": 2, "n_heads": 4, "sequence_length": 16})",
      {"vocab_size must be an integer"});
  expect_model_error(
      R"({"vocab_size": 1, "d_model": 32, "n_layers": 2, "n_heads": 4, "sequence_length": 16})",
      {"vocab_size must be >= 2"});
  GptConfig c;
  Status s = load_gpt_config("/nonexistent/gpt.json", &c);
  EXPECT_NE(s.message().find("cannot read \"/nonexistent/gpt.json\""), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace sciattn::train

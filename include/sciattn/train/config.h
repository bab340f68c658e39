// The DeepSpeed configuration file as the trainer reads it: the keys it honours with DeepSpeed's
// semantics, "auto" values, keys that exist in DeepSpeed but do not apply here (one warning
// each), and errors that name the key. Public API of the trainer (plain C++17).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sciattn/block_sparse.h"
#include "sciattn/device.h"
#include "sciattn/status.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/grad_clip.h"
#include "sciattn/train/loss_scaler.h"
#include "sciattn/train/lr_schedule.h"

namespace sciattn::train {

// What "auto" values are filled with: the trainer's command line and model file. A key set to
// "auto" whose value is absent here is refused by name (batch sizes excepted: an "auto" batch key
// counts as not given when the other two determine it).
struct AutoValues {
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> micro_batch_size;  // train_micro_batch_size_per_gpu
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> lr;                 // optimizer.params.lr, scheduler's warmup_max_lr
  std::optional<double> weight_decay;       // optimizer.params.weight_decay
  std::optional<double> gradient_clipping;  // gradient_clipping
  std::optional<int64_t> total_num_steps;   // scheduler.params.total_num_steps
  std::optional<int64_t> warmup_num_steps;  // scheduler.params.warmup_num_steps
  std::optional<bool> fp16, bf16;           // fp16.enabled, bf16.enabled (the CPU fills false)
  // The ranks the trainer runs with (the launcher's world size): data-parallel ranks x
  // sequence_parallel_size. The batch-size arithmetic multiplies by the data-parallel ranks
  // (world_size / sequence_parallel_size), and zero_optimization's keys act only with more than
  // one rank (ZeRO's group spans all of them).
  int world_size = 1;
  // Where the trainer will run, for the warnings that depend on it: on the CPU, fp16 / bf16
  // compute in fp32, and cpu_checkpointing and offload_optimizer move nothing (host memory is the
  // back end's; they still run, which is how their logic is tested without a GPU).
  Device device = Device::kCpu;
};

enum class Precision { kFp32, kFp16, kBf16 };

// The zero_optimization keys the multi-rank trainer honours, with DeepSpeed's defaults.
struct ZeroConfig {
  int stage = 0;  // 0: replicated optimizer; 1: optimizer state sharded; 2: also the gradients
  // Stage 2: gradients are reduced in buckets of this many elements as the backward finishes
  // them ("reduce_bucket_size").
  int64_t reduce_bucket_size = 500000000;
  // The updated parameters' all-gather: read and validated; the gather is one call per step.
  int64_t allgather_bucket_size = 500000000;
  // true: each piece of a bucket is reduced to the rank that owns it (stage 1: one
  // reduce-scatter); false: buckets are all-reduced and each rank keeps its shard.
  bool reduce_scatter = true;
  // true: the parameters are all-gathered; false: each rank broadcasts its shard in turn.
  bool allgather_partitions = true;
  // Accepted with DeepSpeed's meaning; on the CPU path the bucket reductions run in the
  // backward's thread between layers, and each parameter group's gradients are contiguous.
  bool overlap_comm = false;
  bool contiguous_gradients = true;
};
const char* precision_name(Precision p);  // "fp32", "fp16", "bf16"

struct TrainConfig {
  // Batch sizes after DeepSpeed's arithmetic: train = micro x accumulation x data-parallel ranks.
  int64_t train_batch_size = 0;
  int64_t micro_batch_size = 0;
  int64_t gradient_accumulation_steps = 0;
  int data_parallel_size = 1;
  // Ulysses sequence parallelism ("sequence_parallel_size"): the ranks that share each sequence,
  // consecutive ranks forming a group (rank r is rank r % size of group r / size). It divides
  // AutoValues::world_size and the model's n_heads (and, checked when the model is built, its
  // sequence_length). data_parallel_size x sequence_parallel_size = world_size.
  int64_t sequence_parallel_size = 1;

  std::string optimizer_type = "AdamW";  // "AdamW" or "Adam" (DeepSpeed's names)
  AdamWHyperparams optimizer;            // lr is the base rate; the schedule sets each step's
  LrScheduleConfig schedule;             // type kConstant when there is no scheduler section

  // fp16 / bf16 as configured. The CPU path computes in fp32 either way; with fp16 the loss
  // scaler, overflow check and skipped steps still run exactly as configured.
  Precision precision = Precision::kFp32;
  bool ds_enhanced = false;  // fp16.type == "ds_enhanced"
  LossScalerConfig loss_scaler;

  GradClipConfig clip;

  // activation_checkpointing: the section's presence asks for per-layer checkpointing.
  bool activation_checkpointing = false;
  bool cpu_checkpointing = false;
  bool partition_activations = false;
  std::optional<int64_t> number_checkpoints;

  // zero_optimization (DeepSpeed's ZeRO; zero.h implements stages 1 and 2 over a Communicator).
  ZeroConfig zero;
  bool offload_optimizer = false;  // zero_optimization.offload_optimizer.device == "cpu"
  bool offload_pin_memory = false;

  std::optional<SparsityConfig> sparse_attention;  // built for the model's n_heads

  int64_t steps_per_print = 1;  // DeepSpeed's default is 10; the trainer prints every step
  bool wall_clock_breakdown = false;
};

// Parses a DeepSpeed config. num_heads (the model's) is needed for sparse_attention; `autos`
// fills "auto" values; warnings gets one line per key that exists in DeepSpeed but has no effect
// here (and for fp16/bf16 on the CPU path). `source` names the file in messages. Every error
// names the key ("fp16.hysteresis must be >= 1; got 0") and, for batch sizes, shows the
// arithmetic.
Status parse_train_config(std::string_view json_text, const std::string& source, int64_t num_heads,
                          const AutoValues& autos, TrainConfig* out,
                          std::vector<std::string>* warnings);
Status load_train_config(const std::string& path, int64_t num_heads, const AutoValues& autos,
                         TrainConfig* out, std::vector<std::string>* warnings);

// DeepSpeed's batch-size rule: any two of train_batch_size, micro and accumulation determine the
// third (a lone train_batch_size means accumulation 1; a lone micro means accumulation 1), all
// three must agree, and each must be >= 1. Absent values are 0. The error shows the arithmetic:
// "train_batch_size 16 != train_micro_batch_size_per_gpu 3 x gradient_accumulation_steps 5 x
// data-parallel ranks 1 = 15".
Status resolve_batch_sizes(int64_t train, int64_t micro, int64_t accumulation, int ranks,
                           TrainConfig* out);

}  // namespace sciattn::train

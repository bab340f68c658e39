// The training loop of `sciattn train`: micro-batches with gradient accumulation, the gradient
// path (reduction, fp16 overflow check and loss scaling, clipping), the learning-rate schedule and
// AdamW, on any Backend (the CPU in fp32, or a GPU computing in bf16 / fp16 with fp32 master
// weights), the optimizer state optionally offloaded to host memory; checkpoints that resume bit
// for bit; per-step reports. Public API of the trainer (plain C++17).
//
// Checkpoint file (also the format of --dump-gradients):
//   8 bytes  magic "SCIACKPT"
//   u64      H, the length of the JSON header in bytes (little-endian)
//   H bytes  JSON header (UTF-8, padded with spaces so that the data starts on 64 bytes)
//   data     raw little-endian tensors; header["tensors"] lists each as
//            {"name", "dtype" ("f32" | "i32"), "shape", "offset" (bytes from the data's start)}
// The header also holds the model file ("model"), the step counters, the loss scaler's and the
// clipper's state, the data position, and the optimizer's hyperparameters. Tensors:
// "params/<slot>", "exp_avg/<slot>", "exp_avg_sq/<slot>" for every slot of the parameter layout
// (gpt.h); a gradient dump has "params/<slot>", "grads/<slot>", "batch/inputs", "batch/targets"
// and the step's mean loss in header["loss"]. This is format version 1, what one rank writes.
//
// Several ranks write a checkpoint folder (format version 2), every rank contributing:
//   manifest.json                  written last, by rank 0: {"format":
//                                  "sciattn-sharded-checkpoint", "version": 2, "world_size" N,
//                                  "zero_stage", "flat_size" (the padded flat space), "parameters"
//                                  (the unpadded flat space), "global_step", "replicated" (file
//                                  name), "shards": [{"file", "rank", "begin", "end"}, ...]}
//   replicated.ckpt                by rank 0, the file format above with "format"
//                                  "sciattn-checkpoint-replicated": the header's replicated state
//                                  and the gathered fp32 weights as "params/<slot>"
//   shard-RRRRR-of-NNNNN.ckpt      by rank R, the file format with "format"
//                                  "sciattn-checkpoint-shard" and its rank, bounds and global
//                                  step: flat f32 tensors "master", "exp_avg", "exp_avg_sq" over
//                                  elements [begin, end) of the flat space (ZeRO's shard; at
//                                  stage 0 the rank's 1/N of the replicated state)
// Either form loads on any number of ranks: each rank re-slices the range it keeps out of the
// saved shards (or the single file), and its padding stays zero.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/train/backend.h"
#include "sciattn/train/communicator.h"
#include "sciattn/train/config.h"
#include "sciattn/train/data.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/grad_clip.h"
#include "sciattn/train/loss_scaler.h"
#include "sciattn/train/zero.h"

namespace sciattn::train {

inline constexpr char kCheckpointMagic[8] = {'S', 'C', 'I', 'A', 'C', 'K', 'P', 'T'};

struct TrainerOptions {
  // checkpoint_layers is also switched on by the config's activation_checkpointing section, and
  // offload_checkpoints by its cpu_checkpointing.
  MemoryOptions memory;
  // Keep the fp32 master weights and AdamW's m and v in host memory (Backend::allocate_host) and
  // run the CPU AdamW there: the gradients go to host memory group by group as the last
  // micro-batch's backward finishes them, and the updated weights come back group by group
  // before the next forward reads them, the AdamW of later groups overlapping that forward.
  // Also switched on by the config's zero_optimization.offload_optimizer.device "cpu". Gives the
  // same bits as the optimizer on the back end.
  bool offload_optimizer = false;
  int threads = 0;            // CPU threads; 0 = all
  int64_t token_chunk = 256;  // rows per BLAS call (CpuBackendOptions)
  bool shuffle = true;
  uint64_t data_seed = 1234;
  // The device's peak FLOP/s for MFU; 0 when unknown (the CPU's is: only FLOP/s is reported).
  double peak_flops = 0.0;
  // Writes the first step's parameters (before the update), its unscaled, unclipped gradients
  // and its token batch to this file (checkpoint format), for comparisons with other
  // implementations. Empty: off.
  std::string dump_gradients_path;
  // A test hook: these global steps (1-based) get an Inf added to one gradient after the backward,
  // as an fp16 overflow would, so the skip and loss-scale logic can be exercised on fp32.
  std::vector<int64_t> inject_overflow_steps;
  // The ranks this trainer is one of (not owned; it must outlive the trainer); null: one rank.
  // Each rank runs its own Trainer with the same model file, config and data file. With
  // sequence_parallel_size S (1: none), consecutive ranks form the sequence-parallel groups
  // (rank r is rank r % S of group r / S, split off this communicator) and the N / S groups are
  // the data-parallel ranks: group g takes micro-batches g * gas .. (g + 1) * gas - 1 of every
  // global batch of (N / S) * gas micro-batches (gas = gradient_accumulation_steps), each of
  // its ranks 1/S of every sequence (gpt.h). The gradients are averaged across all N ranks:
  // replicated (zero_optimization.stage 0) or sharded over all N (ZeRO stages 1 and 2,
  // zero.h). The config must have been parsed for the same number of ranks
  // (AutoValues::world_size). Not built yet with several ranks: the optimizer offload and
  // gradient dumps (they are refused with a message).
  Communicator* communicator = nullptr;
  // ZeRO stage 2 with several ranks keeps the model's whole fp32 gradient buffer (stage 1's
  // layout: 4P bytes more per rank) instead of the per-group buffers reused after their buckets
  // are reduced. The same bits; a reference for the tests that compare the two.
  bool zero2_whole_gradient_buffer = false;
};

// The optimizer's share of the memory ledger, what Trainer::create allocates beside the model's
// buffers: the fp32 master weights (unless the weights are fp32 themselves), m and v on
// `device`, or, offloaded, those and the gradients' and weights' host copies in host memory.
void add_optimizer_memory(int64_t layout_total, bool offload_optimizer, DType compute_dtype,
                          Device device, MemoryLedger* ledger);

// One optimizer step, as the progress line and the JSON log show it.
struct StepReport {
  int64_t step = 0;        // global step, 1-based (skipped steps count, as in DeepSpeed)
  double loss = 0.0;       // mean loss per token over the step's micro-batches (all ranks')
  double lr = 0.0;         // the rate this step used
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients (before clipping)
  double clip_coefficient = 1.0;
  double clip_threshold = 0.0;  // the threshold this step used (0 without clipping)
  double loss_scale = 1.0;      // the scale this step's backward used
  bool skipped = false;         // the gradients overflowed: no update
  int64_t skipped_total = 0;
  int64_t tokens = 0;  // tokens in the step (all ranks')
  double seconds = 0.0;
  double forward_backward_seconds = 0.0;
  double optimizer_seconds = 0.0;
  double flops = 0.0;  // model FLOPs of this rank's share of the step (no recomputation)
  uint64_t peak_rss_bytes = 0;
  uint64_t peak_device_bytes = 0;  // the back end's (0 on the CPU)
};

struct CheckpointIo;

class Trainer {
 public:
  // Builds the model on `backend` (kept by the trainer) and the loader on `data` (which must
  // outlive the trainer).
  static Status create(const GptConfig& model, const TrainConfig& config,
                       const TrainerOptions& options, std::unique_ptr<Backend> backend,
                       const TokenFile* data, std::unique_ptr<Trainer>* out);
  ~Trainer();

  Status step(StepReport* report);

  int64_t global_step() const { return global_step_; }
  int64_t applied_steps() const { return applied_steps_; }
  GptModel& model() { return *model_; }
  const TrainConfig& config() const { return config_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  const GradClipper& clipper() const { return clipper_; }
  const DataLoader& data() const { return *loader_; }
  // The memory ledger: the model's buffers plus the optimizer state.
  const MemoryLedger& ledger() const { return ledger_; }
  bool optimizer_offloaded() const { return offload_; }
  Backend& backend() { return *backend_; }

  // The fp32 master parameters (layout total floats), as host values. With ZeRO a collective:
  // every rank calls it (the shards are all-gathered).
  Status master_parameters(std::vector<float>* out);
  Communicator& communicator() { return *comm_; }
  // This rank's sequence-parallel group (split from communicator()), or null when
  // sequence_parallel_size is 1.
  Communicator* sequence_group() { return sequence_group_.get(); }
  // The ZeRO optimizer (stage 1 or 2 with several ranks), or null.
  ZeroOptimizer* zero() { return zero_.get(); }
  // Waits for an offloaded optimizer update still running on host threads (a step returns while
  // the CPU AdamW of its later parameter groups runs on; the next forward waits for each group as
  // it reaches it). Saving and loading checkpoints call it.
  Status finish_update();

  // Writes everything a resumed run needs (atomically: a temporary file renamed into place).
  // With several ranks a collective that writes the folder `path` (see the top of this file;
  // made when missing, an older checkpoint in it replaced), every rank returning the same
  // outcome.
  Status save_checkpoint(const std::string& path);
  // Restores a checkpoint written for the same model file; the message names what differs.
  // `path` is a checkpoint file or folder, written on any number of ranks: ZeRO stages 0, 1 and
  // 2 hold the same state, so each loads into any other. With several ranks a collective: every
  // rank reads what it needs, and if any rank fails every rank fails and none has changed.
  Status load_checkpoint(const std::string& path);

 private:
  friend struct CheckpointIo;
  Trainer() = default;
  class Offload;
  Status allocate_optimizer_state(const std::vector<float>& init);
  Status optimizer_step(float grad_scale, double lr);
  Status dump_gradients(float pending_scale, double mean_loss, const std::vector<int32_t>& inputs,
                        const std::vector<int32_t>& targets) const;
  // Copies between a trainer buffer of n floats (in the back end's memory, or host memory when
  // offloaded) and the host.
  Status state_to_host(const float* src, std::vector<float>* dst) const;
  Status state_from_host(const std::vector<float>& src, float* dst);

  GptConfig model_config_;
  TrainConfig config_;
  TrainerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<DataLoader> loader_;
  SingleRankCommunicator single_rank_;
  Communicator* comm_ = &single_rank_;
  std::unique_ptr<Communicator> sequence_group_;
  std::unique_ptr<ZeroOptimizer> zero_;
  LossScaler scaler_;
  GradClipper clipper_;
  MemoryLedger ledger_;
  // The fp32 master weights and AdamW's state: in the back end's memory (master_ is the model's
  // weights themselves when they are fp32), or in host memory with offload_.
  bool offload_ = false;
  bool master_is_weights_ = false;
  float* master_ = nullptr;
  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
  std::unique_ptr<Offload> offload_state_;
  int64_t global_step_ = 0;
  int64_t applied_steps_ = 0;
  int64_t skipped_steps_ = 0;
};

// Reads a checkpoint's JSON header and tensors (for tools and tests): the header text, and for
// each tensor its name, dtype, shape and bytes.
struct CheckpointTensor {
  std::string name;
  std::string dtype;  // "f32" or "i32"
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};
Status read_checkpoint(const std::string& path, std::string* header_json,
                       std::vector<CheckpointTensor>* tensors);

}  // namespace sciattn::train

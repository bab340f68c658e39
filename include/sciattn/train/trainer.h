// The training loop of `sciattn train`: micro-batches with gradient accumulation, the gradient
// path (reduction, fp16 overflow check and loss scaling, clipping), the learning-rate schedule and
// AdamW; checkpoints that resume bit for bit; per-step reports. Public API of the trainer (plain
// C++17).
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
// and the step's mean loss in header["loss"].
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

namespace sciattn::train {

inline constexpr char kCheckpointMagic[8] = {'S', 'C', 'I', 'A', 'C', 'K', 'P', 'T'};

struct TrainerOptions {
  MemoryOptions memory;       // checkpoint_layers is also switched on by the config's section
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
};

// One optimizer step, as the progress line and the JSON log show it.
struct StepReport {
  int64_t step = 0;        // global step, 1-based (skipped steps count, as in DeepSpeed)
  double loss = 0.0;       // mean loss per token over the step's micro-batches
  double lr = 0.0;         // the rate this step used
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients (before clipping)
  double clip_coefficient = 1.0;
  double clip_threshold = 0.0;  // the threshold this step used (0 without clipping)
  double loss_scale = 1.0;      // the scale this step's backward used
  bool skipped = false;         // the gradients overflowed: no update
  int64_t skipped_total = 0;
  int64_t tokens = 0;  // tokens in the step
  double seconds = 0.0;
  double forward_backward_seconds = 0.0;
  double optimizer_seconds = 0.0;
  double flops = 0.0;  // model FLOPs of the step (no recomputation counted)
  uint64_t peak_rss_bytes = 0;
};

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

  // Writes everything a resumed run needs (atomically: a temporary file renamed into place).
  Status save_checkpoint(const std::string& path) const;
  // Restores a checkpoint written for the same model file; the message names what differs.
  Status load_checkpoint(const std::string& path);

 private:
  Trainer() = default;
  Status optimizer_step(float grad_scale, double lr);
  Status dump_gradients(float pending_scale, double mean_loss, const std::vector<int32_t>& inputs,
                        const std::vector<int32_t>& targets) const;

  GptConfig model_config_;
  TrainConfig config_;
  TrainerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<DataLoader> loader_;
  SingleRankCommunicator comm_;
  LossScaler scaler_;
  GradClipper clipper_;
  MemoryLedger ledger_;
  std::vector<float> exp_avg_, exp_avg_sq_;
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

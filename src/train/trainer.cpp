// The training loop (trainer.h): the step, the optimizer and its offload, gradient dumps; the
// checkpoints are checkpoint_io.cpp's. Trainer layer (host code): the model's tensors stay behind
// the Backend; the optimizer state lives in the back end's memory, or in host memory with the
// CPU AdamW on a host thread (the optimizer offload).
#include "sciattn/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "common/status_try.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/gradients.h"
#include "sciattn/train/lr_schedule.h"
#include "train/checkpoint_io.h"
#include "train/json_util.h"

namespace sciattn::train {
namespace {

using detail::add_slot_tensors;
using detail::Json;
using detail::OutTensor;
using detail::write_checkpoint_file;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Calls fn(begin, end, decays) for the runs of consecutive slots in [begin, end) (group
// boundaries) with the same weight-decay flag; a run ends where the next slot starts (the
// padding between slots holds zeros, which AdamW keeps at zero).
template <class Fn>
Status for_each_decay_run(const ParameterLayout& layout, int64_t begin, int64_t end, Fn fn) {
  size_t i = 0;
  while (i < layout.slots.size() && layout.slots[i].offset < begin) ++i;
  while (i < layout.slots.size() && layout.slots[i].offset < end) {
    const bool decays = layout.slots[i].weight_decay;
    size_t j = i;
    while (j + 1 < layout.slots.size() && layout.slots[j + 1].offset < end &&
           layout.slots[j + 1].weight_decay == decays) {
      ++j;
    }
    const int64_t run_begin = layout.slots[i].offset;
    const int64_t run_end =
        j + 1 < layout.slots.size() ? std::min(end, layout.slots[j + 1].offset) : end;
    SCIATTN_TRY(fn(run_begin, run_end, decays));
    i = j + 1;
  }
  return Status::ok_status();
}

}  // namespace

// The optimizer offload: the gradients' and the 16-bit weights' host copies, the copies'
// tickets, and the CPU AdamW's worker thread. It is the model's ParameterHooks: after the last
// micro-batch's backward finishes a group's gradients it copies them to host memory (beside the
// rest of the backward); before the forward reads a group's weights it waits for that group's
// update and upload.
//
// The order of one step: the backward queues the gradient copies group by group; the gradient
// path (overflow, unscaling, the norm) runs on the back end's fp32 gradients exactly as without
// offload, so the skip decision and the clipping coefficient are the same numbers; then, for an
// applied step, the host waits for the gradient copies and starts the worker, which runs the
// CPU AdamW group by group in forward order (after applying to the host copy the unscaling that
// ds_enhanced applied on the back end, the same single rounding), writing the master weights,
// m, v and the weights' compute-dtype copy; the next forward uploads each group when it reaches
// it, so the AdamW of the later groups overlaps the forward of the earlier ones. The update
// cannot start during the backward: the overflow flag and the global norm (clipping) need every
// gradient, and an update that might have to be undone would need another 12 bytes per parameter
// of host memory.
class Trainer::Offload final : public ParameterHooks {
 public:
  explicit Offload(Trainer* trainer) : t_(trainer) {}
  ~Offload() override {
    join();
    Backend& be = *t_->backend_;
    for (const CopyTicket& c : grad_copies_) be.finish_copy(c);
    for (const CopyTicket& c : uploads_) be.finish_copy(c);
    be.release_host(host_grads_);
    be.release_host(host_copy_);
  }

  Status allocate() {
    Backend& be = *t_->backend_;
    GptModel& m = *t_->model_;
    const size_t n = static_cast<size_t>(m.layout().total);
    SCIATTN_TRY(be.allocate_host(n * sizeof(float), reinterpret_cast<void**>(&host_grads_)));
    if (m.weight_dtype() != DType::kF32) {
      SCIATTN_TRY(be.allocate_host(n * dtype_size(m.weight_dtype()), &host_copy_));
    }
    grad_copies_.assign(m.layout().groups.size(), CopyTicket{});
    uploads_.assign(m.layout().groups.size(), CopyTicket{});
    return Status::ok_status();
  }

  // Whether the backward's gradients are the step's (its last micro-batch).
  void set_capture(bool capture) { capture_ = capture; }

  Status after_backward(int64_t group) override {
    if (!capture_) return Status::ok_status();
    const ParameterGroup& g = t_->model_->layout().groups[static_cast<size_t>(group)];
    return t_->backend_->copy_async(host_grads_ + g.begin, t_->model_->grads() + g.begin,
                                    static_cast<size_t>(g.end - g.begin) * sizeof(float),
                                    CopyDirection::kToHost,
                                    &grad_copies_[static_cast<size_t>(group)]);
  }

  Status before_forward(int64_t group) override {
    if (!running_) return Status::ok_status();
    SCIATTN_TRY(wait_for_group(group));
    SCIATTN_TRY(t_->backend_->wait_for_copy(uploads_[static_cast<size_t>(group)]));
    if (group + 1 == static_cast<int64_t>(uploads_.size())) join();
    return Status::ok_status();
  }

  // Makes the back end's later work wait for the gradient copies, so that nothing it writes into
  // the gradients (ds_enhanced's unscaling, the next step's zeroing) races with them.
  Status gradients_copied() {
    for (const CopyTicket& c : grad_copies_) SCIATTN_TRY(t_->backend_->wait_for_copy(c));
    return Status::ok_status();
  }

  // Starts the update of an applied step: AdamW with `h` at `step` and `grad_scale`, after
  // multiplying the host gradients by `host_unscale` (1: nothing to do).
  Status start(const AdamWHyperparams& h, int64_t step, float grad_scale, float host_unscale) {
    SCIATTN_TRY(finish());
    for (const CopyTicket& c : grad_copies_) SCIATTN_TRY(t_->backend_->finish_copy(c));
    done_ = 0;
    uploaded_ = 0;
    error_ = Status::ok_status();
    running_ = true;
    worker_ = std::thread(
        [this, h, step, grad_scale, host_unscale] { run(h, step, grad_scale, host_unscale); });
    return Status::ok_status();
  }

  // Waits for the whole update and queues every upload (the back end's later work waits for
  // them).
  Status finish() {
    if (!running_) return Status::ok_status();
    const int64_t groups = static_cast<int64_t>(uploads_.size());
    Status s = wait_for_group(groups - 1);
    for (int64_t g = 0; s.ok() && g < groups; ++g) {
      s = t_->backend_->wait_for_copy(uploads_[static_cast<size_t>(g)]);
    }
    join();
    return s;
  }

 private:
  // The worker: AdamW group by group, publishing its progress.
  void run(AdamWHyperparams h, int64_t step, float grad_scale, float host_unscale) {
    const ParameterLayout& layout = t_->model_->layout();
    const DType copy_dtype = t_->model_->weight_dtype();
    const float decay = t_->config_.optimizer.weight_decay;
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      const ParameterGroup& group = layout.groups[g];
      if (host_unscale != 1.0f) {
        scale_in_place(host_grads_ + group.begin, group.end - group.begin, host_unscale);
      }
      Status s = for_each_decay_run(
          layout, group.begin, group.end, [&](int64_t b, int64_t e, bool decays) {
            h.weight_decay = decays ? decay : 0.0f;
            if (host_copy_ == nullptr) {
              return cpu_adamw_step(h, step, grad_scale, t_->master_ + b, host_grads_ + b,
                                    t_->exp_avg_ + b, t_->exp_avg_sq_ + b, e - b);
            }
            void* copy = static_cast<std::byte*>(host_copy_) +
                         b * static_cast<int64_t>(dtype_size(copy_dtype));
            return cpu_adamw_step_copy(h, step, grad_scale, t_->master_ + b, host_grads_ + b,
                                       t_->exp_avg_ + b, t_->exp_avg_sq_ + b, e - b, copy,
                                       copy_dtype);
          });
      std::lock_guard<std::mutex> lock(mutex_);
      if (!s.ok()) {
        error_ = s;
        done_ = static_cast<int64_t>(layout.groups.size());
        cv_.notify_all();
        return;
      }
      done_ = static_cast<int64_t>(g) + 1;
      cv_.notify_all();
    }
  }

  // Waits until the worker has updated `group`, then queues the uploads of every updated group
  // not yet uploaded (so they run ahead of the forward).
  Status wait_for_group(int64_t group) {
    int64_t done = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return done_ > group; });
      if (!error_.ok()) return error_;
      done = done_;
    }
    GptModel& m = *t_->model_;
    const ParameterLayout& layout = m.layout();
    const size_t es = dtype_size(m.weight_dtype());
    const void* source = host_copy_ != nullptr ? host_copy_ : static_cast<const void*>(t_->master_);
    for (; uploaded_ < done; ++uploaded_) {
      const ParameterGroup& g = layout.groups[static_cast<size_t>(uploaded_)];
      SCIATTN_TRY(t_->backend_->copy_async(
          static_cast<std::byte*>(m.weights()) + static_cast<size_t>(g.begin) * es,
          static_cast<const std::byte*>(source) + static_cast<size_t>(g.begin) * es,
          static_cast<size_t>(g.end - g.begin) * es, CopyDirection::kToDevice,
          &uploads_[static_cast<size_t>(uploaded_)]));
    }
    return Status::ok_status();
  }

  void join() {
    if (worker_.joinable()) worker_.join();
    running_ = false;
  }

  Trainer* t_;
  float* host_grads_ = nullptr;  // [total] f32, host memory
  void* host_copy_ = nullptr;    // [total] compute dtype, host memory (null when that is f32)
  std::vector<CopyTicket> grad_copies_, uploads_;  // per group
  bool capture_ = false;
  bool running_ = false;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t done_ = 0;      // groups the worker has updated (under mutex_)
  Status error_;          // the worker's failure (under mutex_)
  int64_t uploaded_ = 0;  // groups whose upload is queued (main thread)
};

void add_optimizer_memory(int64_t layout_total, bool offload_optimizer, DType compute_dtype,
                          Device device, MemoryLedger* ledger) {
  const uint64_t f32 = static_cast<uint64_t>(layout_total) * sizeof(float);
  if (offload_optimizer) {
    ledger->add("master weights (f32), offloaded", "model states", Device::kCpu, f32,
                kPhaseOptimizer);
    ledger->add("optimizer state: AdamW exp_avg, exp_avg_sq (f32), offloaded", "model states",
                Device::kCpu, 2 * f32, kPhaseOptimizer);
    ledger->add("gradients, host copy (f32)", "model states", Device::kCpu, f32,
                kPhaseBackward | kPhaseOptimizer);
    if (compute_dtype != DType::kF32) {
      ledger->add(std::string("weights, host copy (") + dtype_name(compute_dtype) + ")",
                  "model states", Device::kCpu,
                  static_cast<uint64_t>(layout_total) * dtype_size(compute_dtype),
                  kPhaseOptimizer | kPhaseForward);
    }
    return;
  }
  if (compute_dtype != DType::kF32) {
    ledger->add("master weights (f32)", "model states", device, f32, kPhaseOptimizer);
  }
  ledger->add("optimizer state: AdamW exp_avg, exp_avg_sq (f32)", "model states", device, 2 * f32,
              kPhaseOptimizer);
}

Trainer::~Trainer() {
  // The worker reads the buffers below; the model's hooks point at it.
  offload_state_.reset();
  // With ZeRO the optimizer's state is the ZeroOptimizer's.
  const bool own_state = zero_ == nullptr;
  zero_.reset();
  if (backend_ != nullptr && own_state) {
    if (offload_) {
      backend_->release_host(master_);
      backend_->release_host(exp_avg_);
      backend_->release_host(exp_avg_sq_);
    } else {
      if (!master_is_weights_) backend_->release(master_);
      backend_->release(exp_avg_);
      backend_->release(exp_avg_sq_);
    }
  }
}

Status Trainer::create(const GptConfig& model, const TrainConfig& config,
                       const TrainerOptions& options, std::unique_ptr<Backend> backend,
                       const TokenFile* data, std::unique_ptr<Trainer>* out) {
  if (backend == nullptr) return Status::invalid_argument("Trainer::create: no back end");
  if (config.micro_batch_size < 1 || config.gradient_accumulation_steps < 1) {
    return Status::invalid_argument("the train config has no batch sizes (parse it first)");
  }
  std::unique_ptr<Trainer> t(new Trainer());
  t->model_config_ = model;
  t->config_ = config;
  t->options_ = options;
  t->backend_ = std::move(backend);
  if (options.communicator != nullptr) t->comm_ = options.communicator;
  const int world = t->comm_->world_size();
  const int64_t sp = config.sequence_parallel_size;
  if (config.data_parallel_size * sp != world) {
    return Status::invalid_argument(
        "the train config was resolved for " + std::to_string(config.data_parallel_size) +
        " data-parallel rank(s) x sequence_parallel_size " + std::to_string(sp) +
        " (train_batch_size = micro x accumulation x data-parallel ranks), but the "
        "communicator has " +
        std::to_string(world) +
        " ranks; parse it with AutoValues::world_size = " + std::to_string(world));
  }
  t->offload_ = options.offload_optimizer || config.offload_optimizer;
  if (world > 1 && t->offload_) {
    return Status::not_supported(
        "zero_optimization.offload_optimizer with several data-parallel ranks is not built yet; "
        "set its device to \"none\" or run one rank");
  }
  if (world > 1 && !options.dump_gradients_path.empty()) {
    return Status::not_supported(
        "gradient dumps with several data-parallel ranks are not built "
        "yet; run one rank");
  }
  const bool zero = config.zero.stage > 0 && world > 1;
  MemoryOptions memory = options.memory;
  memory.checkpoint_layers = memory.checkpoint_layers || config.activation_checkpointing;
  memory.offload_checkpoints = memory.offload_checkpoints || config.cpu_checkpointing;
  // ZeRO splits the flat parameter space into equal shards: the layout is padded for them.
  if (zero) memory.parameter_multiple = zero_parameter_multiple(world);
  const SparsityConfig* sparse = config.sparse_attention ? &*config.sparse_attention : nullptr;
  SCIATTN_TRY(validate_gpt_config(model));
  SCIATTN_TRY(check_sequence_parallel(model, sp));
  if (sp > 1) {
    // Consecutive ranks share a sequence. Every rank gets here (the checks above depend only on
    // what every rank shares), so every rank takes part in the split.
    const int rank = t->comm_->rank(), size = static_cast<int>(sp);
    SCIATTN_TRY(t->comm_->split(rank / size, rank, &t->sequence_group_));
  }
  // The initial parameters, drawn once for the model's weights and the master weights (1.3B
  // normal draws take tens of seconds). Every rank draws the same values from the model's seed.
  const ParameterLayout layout = gpt_parameter_layout(model, memory.parameter_multiple);
  // Stage 2 reduces each group's gradients as the backward finishes it: the layers need only
  // as many gradient buffers as the buckets keep unreduced (one more with overlap_comm, so that
  // a reduction in flight has a layer's backward to run beside before its buffer is reused).
  // Every other case keeps one whole buffer (the trainer's own setting, whatever the options say).
  memory.layer_gradient_buffers =
      zero && config.zero.stage == 2 && !options.zero2_whole_gradient_buffer
          ? zero_layer_gradient_buffers(layout, config.zero.reduce_bucket_size,
                                        config.zero.overlap_comm)
          : 0;
  std::vector<float> init(static_cast<size_t>(layout.total));
  init_gpt_parameters(model, layout, init.data());
  SCIATTN_TRY(GptModel::create(model, sparse, config.micro_batch_size, memory, t->backend_.get(),
                               &t->model_, init.data(), t->sequence_group_.get()));
  SCIATTN_TRY(DataLoader::create(data, model.sequence_length, config.micro_batch_size,
                                 model.vocab_size, options.shuffle, options.data_seed,
                                 &t->loader_));
  t->scaler_ = LossScaler(config.precision == Precision::kFp16 ? config.loss_scaler
                                                               : LossScalerConfig{false, 1.0});
  SCIATTN_TRY(validate_grad_clip(config.clip));
  t->clipper_ = GradClipper(config.clip);
  t->ledger_ = t->model_->ledger();
  if (zero) {
    SCIATTN_TRY(
        ZeroOptimizer::create(config.zero, t->comm_, t->model_.get(), init.data(), &t->zero_));
    // Stage 2 reduces gradient buckets as the backward finishes parameter groups.
    if (config.zero.stage == 2) t->model_->set_parameter_hooks(t->zero_.get());
    t->zero_->add_memory(&t->ledger_);
  } else {
    SCIATTN_TRY(t->allocate_optimizer_state(init));
    add_optimizer_memory(t->model_->layout().total, t->offload_, t->model_->weight_dtype(),
                         t->backend_->device(), &t->ledger_);
  }
  *out = std::move(t);
  return Status::ok_status();
}

Status Trainer::allocate_optimizer_state(const std::vector<float>& init) {
  Backend& be = *backend_;
  GptModel& m = *model_;
  const size_t n = static_cast<size_t>(m.layout().total);
  const size_t bytes = n * sizeof(float);
  if (offload_) {
    // Host memory: the CPU AdamW's. (The model's weights were set from the same initialisation.)
    SCIATTN_TRY(be.allocate_host(bytes, reinterpret_cast<void**>(&master_)));
    SCIATTN_TRY(be.allocate_host(bytes, reinterpret_cast<void**>(&exp_avg_)));
    SCIATTN_TRY(be.allocate_host(bytes, reinterpret_cast<void**>(&exp_avg_sq_)));
    std::memcpy(master_, init.data(), bytes);
    offload_state_ = std::make_unique<Offload>(this);
    SCIATTN_TRY(offload_state_->allocate());
    m.set_parameter_hooks(offload_state_.get());
    return Status::ok_status();
  }
  SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&exp_avg_)));
  SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&exp_avg_sq_)));
  if (m.weight_dtype() == DType::kF32) {
    // The fp32 weights are the master weights.
    master_is_weights_ = true;
    master_ = static_cast<float*>(m.weights());
    return Status::ok_status();
  }
  SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&master_)));
  return be.copy_to_device(master_, init.data(), bytes);
}

Status Trainer::optimizer_step(float grad_scale, double lr) {
  // AdamW over runs of consecutive slots with the same weight-decay flag, in the back end's
  // memory, writing the weights' compute-dtype copy unless the weights are the master weights.
  const ParameterLayout& layout = model_->layout();
  AdamWHyperparams h = config_.optimizer;
  h.lr = static_cast<float>(lr);
  const float decay = config_.optimizer.weight_decay;
  const float* grads = model_->grads();
  const int64_t step = applied_steps_ + 1;
  const DType copy_dtype = model_->weight_dtype();
  const size_t es = dtype_size(copy_dtype);
  return for_each_decay_run(layout, 0, layout.total, [&](int64_t b, int64_t e, bool decays) {
    h.weight_decay = decays ? decay : 0.0f;
    void* copy = master_is_weights_
                     ? nullptr
                     : static_cast<std::byte*>(model_->weights()) + static_cast<size_t>(b) * es;
    return backend_->adamw_step(h, step, grad_scale, master_ + b, grads + b, exp_avg_ + b,
                                exp_avg_sq_ + b, e - b, copy, copy_dtype);
  });
}

Status Trainer::finish_update() {
  return offload_state_ != nullptr ? offload_state_->finish() : Status::ok_status();
}

Status Trainer::state_to_host(const float* src, std::vector<float>* dst) const {
  const size_t n = static_cast<size_t>(model_->layout().total);
  dst->resize(n);
  if (offload_) {
    std::memcpy(dst->data(), src, n * sizeof(float));
    return Status::ok_status();
  }
  return backend_->copy_to_host(dst->data(), src, n * sizeof(float));
}

Status Trainer::state_from_host(const std::vector<float>& src, float* dst) {
  if (offload_) {
    std::memcpy(dst, src.data(), src.size() * sizeof(float));
    return Status::ok_status();
  }
  return backend_->copy_to_device(dst, src.data(), src.size() * sizeof(float));
}

Status Trainer::master_parameters(std::vector<float>* out) {
  if (zero_ != nullptr) return zero_->gather_master(out);
  SCIATTN_TRY(finish_update());
  return state_to_host(master_, out);
}

Status Trainer::step(StepReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  *report = StepReport{};
  const int64_t B = config_.micro_batch_size, L = model_config_.sequence_length;
  const int64_t gas = config_.gradient_accumulation_steps;
  const int64_t tokens_per_micro = B * L;
  // Each rank scales the loss of its own tokens (1/S of each sequence with sequence parallelism
  // over S ranks); the mean over all ranks then sums each sequence's S shares and averages over
  // the data-parallel ranks: the gradient of the global batch's mean loss.
  const double loss_scale = scaler_.scale();
  const float grad_scale =
      static_cast<float>(loss_scale / static_cast<double>(model_->local_tokens() * gas));

  const int world = comm_->world_size();
  // The data-parallel rank (the sequence-parallel group) and their number.
  const int64_t sp = config_.sequence_parallel_size;
  const int dp_world = world / static_cast<int>(sp), dp_rank = comm_->rank() / static_cast<int>(sp);
  const int64_t n = model_->layout().total;
  const int64_t step_number = global_step_ + 1;
  const bool inject =
      std::find(options_.inject_overflow_steps.begin(), options_.inject_overflow_steps.end(),
                step_number) != options_.inject_overflow_steps.end();
  const Fp16Scaling scaling = config_.precision == Precision::kFp16 && config_.ds_enhanced
                                  ? Fp16Scaling::kDsEnhanced
                                  : Fp16Scaling::kStandard;
  SCIATTN_TRY(model_->zero_grads());
  if (zero_ != nullptr) {
    SCIATTN_TRY(zero_->begin_step(scaling, loss_scale));
    // Stage 2 has reduced the gradients by the time the backward returns: the Inf goes in
    // before its bucket is reduced.
    if (inject && zero_->stage() == 2) zero_->inject_overflow(n / 2);
  }
  // Data-parallel rank r's micro-batches are r * gas .. (r + 1) * gas - 1 of the global batch.
  if (dp_world > 1) loader_->skip(dp_rank * gas);
  std::vector<int32_t> inputs(static_cast<size_t>(tokens_per_micro));
  std::vector<int32_t> targets(inputs.size());
  std::vector<int32_t> all_inputs, all_targets;  // kept for a gradient dump
  const bool dumping = !options_.dump_gradients_path.empty() && global_step_ == 0;
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < gas; ++micro) {
    // With the optimizer offloaded, the last micro-batch's backward copies the finished
    // gradients to host memory as it goes.
    if (offload_state_ != nullptr) offload_state_->set_capture(micro == gas - 1);
    if (zero_ != nullptr) zero_->begin_micro_batch(micro, gas);
    loader_->next(inputs.data(), targets.data());
    if (dumping) {
      all_inputs.insert(all_inputs.end(), inputs.begin(), inputs.end());
      all_targets.insert(all_targets.end(), targets.begin(), targets.end());
    }
    MicroBatchResult r;
    SCIATTN_TRY(model_->forward_backward(inputs.data(), targets.data(), grad_scale, &r));
    loss_sum += r.loss_sum;
  }
  if (dp_world > 1) loader_->skip(static_cast<int64_t>(dp_world - 1 - dp_rank) * gas);
  if (offload_state_ != nullptr) SCIATTN_TRY(offload_state_->gradients_copied());
  if (inject && !(zero_ != nullptr && zero_->stage() == 2)) {
    const float inf = std::numeric_limits<float>::infinity();
    SCIATTN_TRY(backend_->copy_to_device(model_->grads() + n / 2, &inf, sizeof inf));
  }
  report->forward_backward_seconds = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();

  // The gradient path: reduction across ranks (replicated or sharded), overflow, unscaling, norm.
  ReducedGradients reduced;
  if (zero_ != nullptr) {
    SCIATTN_TRY(zero_->reduce(&reduced));
  } else {
    SCIATTN_TRY(
        reduce_gradients(*comm_, *backend_, scaling, loss_scale, model_->grads(), n, &reduced));
  }
  // The step's loss and tokens are the global batch's (every rank reports the same): the sum over
  // all ranks adds every token's loss once.
  const int64_t step_tokens = tokens_per_micro * gas * dp_world;
  if (world > 1) SCIATTN_TRY(comm_->all_reduce_sum(&loss_sum));
  if (dumping) {
    SCIATTN_TRY(dump_gradients(reduced.pending_scale,
                               loss_sum / static_cast<double>(tokens_per_micro * gas), all_inputs,
                               all_targets));
  }
  // The loss scaler sees every step (DeepSpeed updates it whether or not the step overflowed).
  if (config_.precision == Precision::kFp16) SCIATTN_TRY(scaler_.update(reduced.overflow));

  report->step = step_number;
  report->loss = loss_sum / static_cast<double>(step_tokens);
  report->loss_scale = loss_scale;
  report->tokens = step_tokens;
  report->flops = model_->flops_per_micro_batch() * static_cast<double>(gas);
  // The k-th applied step runs with DeepSpeed's get_lr() at last_batch_iteration k - 2.
  report->lr = learning_rate(config_.schedule, applied_steps_ - 1);
  if (reduced.overflow) {
    // Skipped: no update, no scheduler step, nothing enters the clipping history.
    ++skipped_steps_;
    report->skipped = true;
    report->grad_norm = std::numeric_limits<double>::quiet_NaN();
  } else {
    const ClipStep clip = clipper_.step(reduced.norm);
    report->grad_norm = reduced.norm;
    report->clip_coefficient = clip.coefficient;
    report->clip_threshold = config_.clip.mode == ClipMode::kNone ? 0.0 : clip.threshold;
    const float update_scale = reduced.pending_scale * static_cast<float>(clip.coefficient);
    if (offload_) {
      // The back end unscaled its gradients in place with ds_enhanced (scale_in_place, one
      // rounding); the host copy, taken during the backward, gets the same multiplication.
      const bool unscaled = scaling == Fp16Scaling::kDsEnhanced && loss_scale != 1.0;
      AdamWHyperparams h = config_.optimizer;
      h.lr = static_cast<float>(report->lr);
      SCIATTN_TRY(offload_state_->start(h, applied_steps_ + 1, update_scale,
                                        unscaled ? static_cast<float>(1.0 / loss_scale) : 1.0f));
    } else if (zero_ != nullptr) {
      AdamWHyperparams h = config_.optimizer;
      h.lr = static_cast<float>(report->lr);
      SCIATTN_TRY(zero_->update(h, applied_steps_ + 1, update_scale));
      SCIATTN_TRY(backend_->synchronize());
    } else {
      SCIATTN_TRY(optimizer_step(update_scale, report->lr));
      // The step's time includes its update (queued on a GPU).
      SCIATTN_TRY(backend_->synchronize());
    }
    ++applied_steps_;
  }
  ++global_step_;
  report->skipped_total = skipped_steps_;
  report->optimizer_seconds = seconds_since(t1);
  report->seconds = seconds_since(t0);
  report->peak_rss_bytes = peak_resident_bytes();
  report->peak_device_bytes = backend_->peak_device_bytes();
  return Status::ok_status();
}

Status Trainer::dump_gradients(float pending_scale, double mean_loss,
                               const std::vector<int32_t>& inputs,
                               const std::vector<int32_t>& targets) const {
  const ParameterLayout& layout = model_->layout();
  const size_t n = static_cast<size_t>(layout.total);
  std::vector<float> grads(n), params;
  SCIATTN_TRY(backend_->copy_to_host(grads.data(), model_->grads(), n * sizeof(float)));
  for (float& g : grads) g *= pending_scale;
  SCIATTN_TRY(state_to_host(master_, &params));
  const int64_t rows = config_.micro_batch_size * config_.gradient_accumulation_steps;
  Json header = {{"format", "sciattn-gradients"},
                 {"version", 1},
                 {"model", Json::parse(gpt_config_json(model_config_))},
                 {"loss", mean_loss},
                 {"note",
                  "grads are d(mean loss over the batch's tokens)/d(params), unscaled and "
                  "unclipped, at params (before the step's update)"}};
  std::vector<OutTensor> tensors;
  add_slot_tensors(layout, "params", params.data(), &tensors);
  add_slot_tensors(layout, "grads", grads.data(), &tensors);
  tensors.push_back({"batch/inputs",
                     "i32",
                     {rows, model_config_.sequence_length},
                     inputs.data(),
                     inputs.size() * sizeof(int32_t)});
  tensors.push_back({"batch/targets",
                     "i32",
                     {rows, model_config_.sequence_length},
                     targets.data(),
                     targets.size() * sizeof(int32_t)});
  return write_checkpoint_file(options_.dump_gradients_path, header, tensors);
}

}  // namespace sciattn::train

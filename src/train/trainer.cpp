// The training loop and its checkpoints (trainer.h). Trainer layer (host code): the model's
// tensors stay behind the Backend; the optimizer state lives in the back end's memory, or in host
// memory with the CPU AdamW on a host thread (the optimizer offload).
#include "sciattn/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "sciattn/train/adamw.h"
#include "sciattn/train/gradients.h"
#include "sciattn/train/lr_schedule.h"
#include "train/json_util.h"
#include "train/status_try.h"

namespace sciattn::train {
namespace {

using detail::Json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A tensor to write: a name, dtype, shape and where its bytes are.
struct OutTensor {
  std::string name;
  const char* dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t bytes;
};

constexpr size_t kDataAlign = 64;

// Writes magic, header length, the header (padded so the data starts on 64 bytes) and the
// tensors, through a temporary file renamed into place.
Status write_checkpoint_file(const std::string& path, Json header,
                             const std::vector<OutTensor>& tensors) {
  Json list = Json::array();
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    list.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", offset}});
    offset += t.bytes;
  }
  header["tensors"] = list;
  std::string text = header.dump();
  const size_t fixed = 16;  // magic + length
  const size_t padded = (fixed + text.size() + kDataAlign - 1) / kDataAlign * kDataAlign - fixed;
  text.append(padded - text.size(), ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return Status::invalid_argument("cannot write \"" + tmp + "\": " + std::strerror(errno));
    out.write(kCheckpointMagic, 8);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
      len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const OutTensor& t : tensors) {
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
    }
    out.flush();
    if (!out)
      return Status::invalid_argument("cannot write \"" + tmp + "\": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::invalid_argument("cannot rename \"" + tmp + "\" to \"" + path +
                                    "\": " + std::strerror(errno));
  }
  return Status::ok_status();
}

// The per-slot tensors of a flat buffer, named prefix/slot.
void add_slot_tensors(const ParameterLayout& layout, const std::string& prefix, const float* base,
                      std::vector<OutTensor>* out) {
  for (const TensorSlot& s : layout.slots) {
    out->push_back({prefix + "/" + s.name, "f32", s.shape, base + s.offset,
                    static_cast<size_t>(s.numel) * sizeof(float)});
  }
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

Json scaler_json(const LossScalerState& s) {
  return {{"cur_scale", s.cur_scale},
          {"cur_iter", s.cur_iter},
          {"last_overflow_iter", s.last_overflow_iter},
          {"cur_hysteresis", s.cur_hysteresis}};
}

constexpr int64_t kFileCheckpointVersion = 1;
constexpr int64_t kFolderCheckpointVersion = 2;
constexpr char kManifestName[] = "manifest.json";
constexpr char kReplicatedName[] = "replicated.ckpt";

// "shard-00001-of-00004.ckpt"
std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.ckpt", rank, world);
  return name;
}

// Rank r's part [begin, end) of a flat space of `total` elements split over `world` ranks: equal
// parts of a multiple of kSlotAlign elements (the last ones shorter or empty when total is not a
// multiple of world x kSlotAlign). With ZeRO the total is such a multiple, and these are its
// shards.
std::pair<int64_t, int64_t> shard_bounds(int64_t total, int world, int r) {
  const int64_t unit = zero_parameter_multiple(world);
  const int64_t part = (total + unit - 1) / unit * kSlotAlign;
  return {std::min(total, part * r), std::min(total, part * (r + 1))};
}

// Text through a temporary file renamed into place.
Status write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return Status::invalid_argument("cannot write \"" + tmp + "\": " + std::strerror(errno));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out)
      return Status::invalid_argument("cannot write \"" + tmp + "\": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::invalid_argument("cannot rename \"" + tmp + "\" to \"" + path +
                                    "\": " + std::strerror(errno));
  }
  return Status::ok_status();
}

// Every rank learns whether any rank failed: this rank's own error, or one naming the (highest)
// rank that failed, so that no rank goes on alone.
Status agree(Communicator& comm, const Status& mine, const std::string& when) {
  double failed = mine.ok() ? 0.0 : comm.rank() + 1.0;
  SCIATTN_TRY(comm.all_reduce_max(&failed));
  if (!mine.ok()) return mine;
  if (failed != 0.0) {
    return Status::invalid_argument("rank " + std::to_string(static_cast<int>(failed) - 1) +
                                    " failed " + when);
  }
  return Status::ok_status();
}

// Per-slot tensors "<kind>/<slot>" into flat buffers of the layout's total (zeros between and
// after the slots); each kind must hold every slot once and nothing else may appear.
Status slots_to_flat(const std::vector<CheckpointTensor>& tensors, const ParameterLayout& layout,
                     const std::string& what,
                     const std::vector<std::pair<std::string, std::vector<float>*>>& kinds) {
  for (const auto& k : kinds) k.second->assign(static_cast<size_t>(layout.total), 0.0f);
  size_t found = 0;
  for (const CheckpointTensor& t : tensors) {
    const size_t slash = t.name.find('/');
    const std::string kind = t.name.substr(0, slash);
    const std::string slot = slash == std::string::npos ? "" : t.name.substr(slash + 1);
    const TensorSlot* s = layout.find(slot);
    std::vector<float>* dst = nullptr;
    for (const auto& k : kinds) {
      if (k.first == kind) dst = k.second;
    }
    if (s == nullptr || dst == nullptr || t.shape != s->shape || t.dtype != "f32") {
      return Status::invalid_argument(what + ": unexpected tensor \"" + t.name + "\"");
    }
    std::memcpy(dst->data() + s->offset, t.bytes.data(), t.bytes.size());
    ++found;
  }
  if (found != kinds.size() * layout.slots.size()) {
    return Status::invalid_argument(what + " holds " + std::to_string(found) +
                                    " tensors; a checkpoint of this model has " +
                                    std::to_string(kinds.size() * layout.slots.size()));
  }
  return Status::ok_status();
}

}  // namespace

// What a rank reads from a checkpoint: the weights over this run's layout, and the optimizer
// state over the rank's range of the flat space.
struct FlatState {
  std::vector<float> params;
  std::vector<float> master, exp_avg, exp_avg_sq;
};

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
  // as many gradient buffers as the buckets keep unreduced.
  // Every other case keeps one whole buffer (the trainer's own setting, whatever the options say).
  memory.layer_gradient_buffers =
      zero && config.zero.stage == 2 && !options.zero2_whole_gradient_buffer
          ? zero_layer_gradient_buffers(layout, config.zero.reduce_bucket_size)
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

// The checkpoint code that needs the trainer's private state (a friend of Trainer).
struct CheckpointIo {
  // The header's replicated state: everything but "format", "version" and the tensor list.
  static Json state_header(const Trainer& t) {
    const LossScalerState& ls = t.scaler_.state();
    const DataPosition& dp = t.loader_->position();
    const TrainConfig& c = t.config_;
    return {
        {"model", Json::parse(gpt_config_json(t.model_config_))},
        {"trainer",
         {{"global_step", t.global_step_},
          {"applied_steps", t.applied_steps_},
          {"skipped_steps", t.skipped_steps_}}},
        {"optimizer",
         {{"type", c.optimizer_type},
          {"lr", c.optimizer.lr},
          {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
          {"eps", c.optimizer.eps},
          {"weight_decay", c.optimizer.weight_decay},
          {"step", t.applied_steps_}}},
        {"scheduler",
         {{"type", lr_schedule_name(c.schedule.type)},
          {"last_batch_iteration", t.applied_steps_ - 1}}},
        {"loss_scaler", scaler_json(ls)},
        {"clipper",
         {{"mode", clip_mode_name(c.clip.mode)},
          {"threshold", t.clipper_.threshold()},
          {"history",
           std::vector<double>(t.clipper_.history().begin(), t.clipper_.history().end())}}},
        {"data",
         {{"seed", dp.seed},
          {"epoch", dp.epoch},
          {"cursor", dp.cursor},
          {"shuffle", t.options_.shuffle},
          {"micro_batch", c.micro_batch_size},
          {"samples", t.loader_->num_samples()}}},
        // All randomness of a run derives from the model's seed (initialisation) and the data
        // seed and epoch (the shuffle), so the data position restores it exactly.
        {"rng", "derived: model.seed, data.seed and data.epoch"},
    };
  }

  // Whether a header's state fits this run: the model, the data settings, the clipping mode.
  static Status check_state(const Trainer& t, const Json& h, const std::string& what) {
    GptConfig saved;
    SCIATTN_TRY(parse_gpt_config(h.at("model").dump(), what, &saved));
    if (gpt_config_json(saved) != gpt_config_json(t.model_config_)) {
      return Status::invalid_argument(
          what + " was written for another model: " + h.at("model").dump() +
          "; this run's model file is " + gpt_config_json(t.model_config_));
    }
    const Json& d = h.at("data");
    const TrainConfig& c = t.config_;
    if (d.at("micro_batch").get<int64_t>() != c.micro_batch_size ||
        d.at("samples").get<uint64_t>() != t.loader_->num_samples() ||
        d.at("shuffle").get<bool>() != t.options_.shuffle) {
      return Status::invalid_argument(
          what +
          " was written with another micro-batch, data file or shuffle setting (micro "
          "batch " +
          d.at("micro_batch").dump() + ", " + d.at("samples").dump() + " samples, shuffle " +
          d.at("shuffle").dump() + "); this run has " + std::to_string(c.micro_batch_size) + ", " +
          std::to_string(t.loader_->num_samples()) + ", " +
          (t.options_.shuffle ? "true" : "false"));
    }
    const Json& jc = h.at("clipper");
    if (jc.at("mode").get<std::string>() != clip_mode_name(c.clip.mode)) {
      return Status::invalid_argument(what + " was written with gradient clipping \"" +
                                      jc.at("mode").get<std::string>() + "\"; this run has \"" +
                                      clip_mode_name(c.clip.mode) + "\"");
    }
    return Status::ok_status();
  }

  // Restores the header's replicated state (check_state passed).
  static Status apply_state(Trainer& t, const Json& h) {
    const Json& js = h.at("loss_scaler");
    LossScalerState ls;
    ls.cur_scale = js.at("cur_scale").get<double>();
    ls.cur_iter = js.at("cur_iter").get<int64_t>();
    ls.last_overflow_iter = js.at("last_overflow_iter").get<int64_t>();
    ls.cur_hysteresis = js.at("cur_hysteresis").get<int>();
    const Json& jc = h.at("clipper");
    // Without clipping the threshold is +infinity, which JSON writes as null.
    const double threshold = jc.at("threshold").is_null() ? std::numeric_limits<double>::infinity()
                                                          : jc.at("threshold").get<double>();
    SCIATTN_TRY(t.clipper_.set_state(threshold, jc.at("history").get<std::vector<double>>()));
    const Json& d = h.at("data");
    DataPosition pos;
    pos.seed = d.at("seed").get<uint64_t>();
    pos.epoch = d.at("epoch").get<uint64_t>();
    pos.cursor = d.at("cursor").get<uint64_t>();
    SCIATTN_TRY(t.loader_->set_position(pos));
    if (t.config_.precision == Precision::kFp16) t.scaler_.set_state(ls);
    const Json& tr = h.at("trainer");
    t.global_step_ = tr.at("global_step").get<int64_t>();
    t.applied_steps_ = tr.at("applied_steps").get<int64_t>();
    t.skipped_steps_ = tr.at("skipped_steps").get<int64_t>();
    return Status::ok_status();
  }

  // Every rank writes its shard file, rank 0 also the replicated file, and rank 0 writes the
  // manifest last (the folder layout is in trainer.h).
  static Status save_sharded(Trainer& t, const std::string& dir);
  // Reads what this rank needs of a checkpoint (a file or a folder): the header with the
  // replicated state, the weights (this run's layout) and the optimizer state over this rank's
  // range of the flat space.
  static Status read(const Trainer& t, const std::string& path, Json* header, FlatState* out);
  static Status read_file_format(const Trainer& t, const std::string& path, Json* header,
                                 FlatState* out);
  static Status read_folder_format(const Trainer& t, const std::string& dir, Json* header,
                                   FlatState* out);

  // The range of the flat space whose optimizer state this rank keeps.
  static void state_range(const Trainer& t, int64_t* lo, int64_t* hi) {
    if (t.zero_ != nullptr) {
      *lo = t.zero_->shard_begin();
      *hi = *lo + t.zero_->shard_size();
    } else {
      *lo = 0;
      *hi = t.model_->layout().total;
    }
  }
};

Status Trainer::save_checkpoint(const std::string& path) {
  if (comm_->world_size() > 1) return CheckpointIo::save_sharded(*this, path);
  SCIATTN_TRY(finish_update());
  std::vector<float> params, m, v;
  SCIATTN_TRY(state_to_host(master_, &params));
  SCIATTN_TRY(state_to_host(exp_avg_, &m));
  SCIATTN_TRY(state_to_host(exp_avg_sq_, &v));
  Json header = {{"format", "sciattn-checkpoint"}, {"version", kFileCheckpointVersion}};
  header.update(CheckpointIo::state_header(*this));
  std::vector<OutTensor> tensors;
  const ParameterLayout& layout = model_->layout();
  add_slot_tensors(layout, "params", params.data(), &tensors);
  add_slot_tensors(layout, "exp_avg", m.data(), &tensors);
  add_slot_tensors(layout, "exp_avg_sq", v.data(), &tensors);
  return write_checkpoint_file(path, header, tensors);
}

Status CheckpointIo::save_sharded(Trainer& t, const std::string& dir) {
  SCIATTN_TRY(t.finish_update());
  Communicator& comm = *t.comm_;
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t total = t.model_->layout().total;
  const std::string what = "checkpoint folder \"" + dir + "\"";
  // The gathered fp32 master weights (a collective with ZeRO) and this rank's shard.
  std::vector<float> params, master, m, v;
  SCIATTN_TRY(t.master_parameters(&params));
  const int stage = t.zero_ != nullptr ? t.zero_->stage() : 0;
  std::vector<std::pair<int64_t, int64_t>> bounds(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) bounds[static_cast<size_t>(r)] = shard_bounds(total, world, r);
  const auto [begin, end] = bounds[static_cast<size_t>(rank)];
  if (t.zero_ != nullptr) {
    // ZeRO's shards are these bounds (the layout is padded to N equal shards).
    SCIATTN_TRY(t.zero_->shard_to_host(ZeroOptimizer::State::kMaster, &master));
    SCIATTN_TRY(t.zero_->shard_to_host(ZeroOptimizer::State::kExpAvg, &m));
    SCIATTN_TRY(t.zero_->shard_to_host(ZeroOptimizer::State::kExpAvgSq, &v));
  } else {
    // Stage 0: every rank holds all of it and writes its 1/N.
    SCIATTN_TRY(t.state_to_host(t.master_, &master));
    SCIATTN_TRY(t.state_to_host(t.exp_avg_, &m));
    SCIATTN_TRY(t.state_to_host(t.exp_avg_sq_, &v));
    for (std::vector<float>* x : {&master, &m, &v}) {
      *x = std::vector<float>(x->begin() + begin, x->begin() + end);
    }
  }
  if (static_cast<int64_t>(master.size()) != end - begin) {
    return Status(StatusCode::kInternal, "the ZeRO shard does not match the checkpoint's bounds");
  }

  // 1. Rank 0 makes the folder and removes an older manifest, so that a save that stops half way
  //    leaves a folder that is refused rather than one that mixes two saves.
  Status s = Status::ok_status();
  if (rank == 0) {
    std::error_code ec;
    if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
      s = Status::invalid_argument(what +
                                   ": the path exists and is not a folder (with several "
                                   "data-parallel ranks a checkpoint is a folder)");
    } else {
      std::filesystem::create_directories(dir, ec);
      if (ec) s = Status::invalid_argument("cannot create " + what + ": " + ec.message());
      std::filesystem::remove(dir + "/" + kManifestName, ec);
      if (s.ok() && ec) {
        s = Status::invalid_argument("cannot remove the old manifest of " + what + ": " +
                                     ec.message());
      }
    }
  }
  SCIATTN_TRY(agree(comm, s, "while preparing " + what));

  // 2. The shards, and the replicated state from rank 0.
  const int64_t step = t.global_step_;
  Json sh = {{"format", "sciattn-checkpoint-shard"},
             {"version", kFolderCheckpointVersion},
             {"rank", rank},
             {"world_size", world},
             {"begin", begin},
             {"end", end},
             {"global_step", step}};
  const int64_t n = end - begin;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  s = write_checkpoint_file(dir + "/" + shard_file_name(rank, world), sh,
                            {{"master", "f32", {n}, master.data(), bytes},
                             {"exp_avg", "f32", {n}, m.data(), bytes},
                             {"exp_avg_sq", "f32", {n}, v.data(), bytes}});
  if (s.ok() && rank == 0) {
    Json header = {{"format", "sciattn-checkpoint-replicated"},
                   {"version", kFolderCheckpointVersion}};
    header.update(state_header(t));
    std::vector<OutTensor> tensors;
    add_slot_tensors(t.model_->layout(), "params", params.data(), &tensors);
    s = write_checkpoint_file(dir + "/" + kReplicatedName, header, tensors);
  }
  SCIATTN_TRY(agree(comm, s, "while writing " + what));

  // 3. The manifest, last.
  if (rank == 0) {
    Json shards = Json::array();
    for (int r = 0; r < world; ++r) {
      shards.push_back({{"file", shard_file_name(r, world)},
                        {"rank", r},
                        {"begin", bounds[static_cast<size_t>(r)].first},
                        {"end", bounds[static_cast<size_t>(r)].second}});
    }
    const Json manifest = {{"format", "sciattn-sharded-checkpoint"},
                           {"version", kFolderCheckpointVersion},
                           {"world_size", world},
                           {"zero_stage", stage},
                           {"flat_size", total},
                           {"parameters", gpt_parameter_layout(t.model_config_).total},
                           {"global_step", step},
                           {"replicated", kReplicatedName},
                           {"shards", shards}};
    s = write_text_file(dir + "/" + kManifestName, manifest.dump(2) + "\n");
  }
  return agree(comm, s, "while writing the manifest of " + what);
}

Status read_checkpoint(const std::string& path, std::string* header_json,
                       std::vector<CheckpointTensor>* tensors) {
  std::string bytes;
  SCIATTN_TRY(detail::read_file(path, &bytes));
  const std::string what = "checkpoint \"" + path + "\"";
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kCheckpointMagic, 8) != 0) {
    return Status::invalid_argument(what + " does not start with the magic \"SCIACKPT\"");
  }
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) {
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  }
  if (length > bytes.size() - 16) {
    return Status::invalid_argument(what + " is truncated: its header says " +
                                    std::to_string(length) + " bytes");
  }
  *header_json = bytes.substr(16, length);
  Json header;
  SCIATTN_TRY(detail::parse_json(*header_json, what, &header));
  const size_t data = 16 + length;
  tensors->clear();
  try {
    for (const Json& t : header.at("tensors")) {
      CheckpointTensor ct;
      ct.name = t.at("name").get<std::string>();
      ct.dtype = t.at("dtype").get<std::string>();
      ct.shape = t.at("shape").get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : ct.shape) numel *= d;
      const uint64_t offset = t.at("offset").get<uint64_t>();
      const uint64_t nbytes = static_cast<uint64_t>(numel) * 4;
      if (data + offset + nbytes > bytes.size()) {
        return Status::invalid_argument(what + " is truncated: tensor \"" + ct.name +
                                        "\" ends past the file");
      }
      ct.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data + offset),
                      bytes.begin() + static_cast<std::ptrdiff_t>(data + offset + nbytes));
      tensors->push_back(std::move(ct));
    }
  } catch (const Json::exception& e) {
    return Status::invalid_argument(what + ": malformed tensor list: " + e.what());
  }
  return Status::ok_status();
}

Status CheckpointIo::read(const Trainer& t, const std::string& path, Json* header, FlatState* out) {
  std::error_code ec;
  try {
    if (std::filesystem::is_directory(path, ec)) {
      return read_folder_format(t, path, header, out);
    }
    return read_file_format(t, path, header, out);
  } catch (const Json::exception& e) {
    return Status::invalid_argument("checkpoint \"" + path + "\": malformed header: " + e.what());
  }
}

Status CheckpointIo::read_file_format(const Trainer& t, const std::string& path, Json* header,
                                      FlatState* out) {
  std::string text;
  std::vector<CheckpointTensor> tensors;
  SCIATTN_TRY(read_checkpoint(path, &text, &tensors));
  const std::string what = "checkpoint \"" + path + "\"";
  Json& h = *header;
  SCIATTN_TRY(detail::parse_json(text, what, &h));
  const std::string format = h.at("format").get<std::string>();
  if (format == "sciattn-checkpoint-replicated" || format == "sciattn-checkpoint-shard") {
    return Status::invalid_argument(what + " is one file of a checkpoint folder (\"" + format +
                                    "\"); load the folder that holds its " + kManifestName);
  }
  if (format != "sciattn-checkpoint") {
    return Status::invalid_argument(what + " is a \"" + format +
                                    "\" file, not a training checkpoint");
  }
  if (h.at("version").get<int64_t>() != kFileCheckpointVersion) {
    return Status::invalid_argument(what + " has version " + h.at("version").dump() +
                                    "; a checkpoint file of this build has version " +
                                    std::to_string(kFileCheckpointVersion));
  }
  SCIATTN_TRY(check_state(t, h, what));
  std::vector<float> master, m, v;
  SCIATTN_TRY(slots_to_flat(tensors, t.model_->layout(), what,
                            {{"params", &master}, {"exp_avg", &m}, {"exp_avg_sq", &v}}));
  int64_t lo = 0, hi = 0;
  state_range(t, &lo, &hi);
  out->params = master;
  out->master.assign(master.begin() + lo, master.begin() + hi);
  out->exp_avg.assign(m.begin() + lo, m.begin() + hi);
  out->exp_avg_sq.assign(v.begin() + lo, v.begin() + hi);
  return Status::ok_status();
}

Status CheckpointIo::read_folder_format(const Trainer& t, const std::string& dir, Json* header,
                                        FlatState* out) {
  const std::string manifest_path = dir + "/" + kManifestName;
  const std::string mwhat = "checkpoint manifest \"" + manifest_path + "\"";
  std::string text;
  Status s = detail::read_file(manifest_path, &text);
  if (!s.ok()) {
    return Status::invalid_argument("checkpoint folder \"" + dir + "\" has no readable " +
                                    kManifestName + " (an unfinished save?): " + s.message());
  }
  Json mf;
  SCIATTN_TRY(detail::parse_json(text, mwhat, &mf));
  if (mf.at("format").get<std::string>() != "sciattn-sharded-checkpoint") {
    return Status::invalid_argument(mwhat + " has format " + mf.at("format").dump() +
                                    "; expected \"sciattn-sharded-checkpoint\"");
  }
  if (mf.at("version").get<int64_t>() != kFolderCheckpointVersion) {
    return Status::invalid_argument(mwhat + " has version " + mf.at("version").dump() +
                                    "; this build reads checkpoint folders of version " +
                                    std::to_string(kFolderCheckpointVersion));
  }
  // Stages 0, 1 and 2 keep the same AdamW state over the same flat space, so each converts to any
  // other; a stage that partitions something else (the parameters, at stage 3) does not.
  const int64_t stage = mf.at("zero_stage").get<int64_t>();
  if (stage < 0 || stage > 2) {
    return Status::invalid_argument(mwhat + " was written at ZeRO stage " + std::to_string(stage) +
                                    ", which cannot be converted: this trainer loads the "
                                    "optimizer state of stages 0, 1 and 2");
  }
  const int64_t parameters = mf.at("parameters").get<int64_t>();
  const int64_t expected = gpt_parameter_layout(t.model_config_).total;
  if (parameters != expected) {
    return Status::invalid_argument(mwhat + " holds a flat space of " + std::to_string(parameters) +
                                    " elements (unpadded); this run's model has " +
                                    std::to_string(expected));
  }
  const int64_t world = mf.at("world_size").get<int64_t>();
  const int64_t flat = mf.at("flat_size").get<int64_t>();
  const Json& shards = mf.at("shards");
  if (world < 1 || static_cast<int64_t>(shards.size()) != world || flat < parameters) {
    return Status::invalid_argument(mwhat + " is inconsistent: world_size " +
                                    std::to_string(world) + ", " + std::to_string(shards.size()) +
                                    " shards, flat_size " + std::to_string(flat) + " for " +
                                    std::to_string(parameters) + " parameters");
  }
  const int64_t step = mf.at("global_step").get<int64_t>();
  // Every shard is checked here on every rank, so that every rank reports the same missing file.
  int64_t next = 0;
  for (int64_t r = 0; r < world; ++r) {
    const Json& e = shards[static_cast<size_t>(r)];
    const std::string file = e.at("file").get<std::string>();
    const int64_t b = e.at("begin").get<int64_t>(), en = e.at("end").get<int64_t>();
    if (e.at("rank").get<int64_t>() != r || b != next || en < b || en > flat ||
        file.find('/') != std::string::npos) {
      return Status::invalid_argument(mwhat + ": shard " + std::to_string(r) + " (" + e.dump() +
                                      ") does not continue the shards before it at element " +
                                      std::to_string(next));
    }
    next = en;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(dir + "/" + file, ec)) {
      return Status::invalid_argument("checkpoint folder \"" + dir + "\" is missing shard file \"" +
                                      dir + "/" + file + "\" (rank " + std::to_string(r) + " of " +
                                      std::to_string(world) + ", elements [" + std::to_string(b) +
                                      ", " + std::to_string(en) + "))");
    }
  }
  if (next != flat) {
    return Status::invalid_argument(mwhat + ": the shards end at element " + std::to_string(next) +
                                    "; flat_size is " + std::to_string(flat));
  }

  // The replicated state and the weights.
  const std::string rpath = dir + "/" + mf.at("replicated").get<std::string>();
  const std::string rwhat = "checkpoint file \"" + rpath + "\"";
  std::vector<CheckpointTensor> tensors;
  SCIATTN_TRY(read_checkpoint(rpath, &text, &tensors));
  Json& h = *header;
  SCIATTN_TRY(detail::parse_json(text, rwhat, &h));
  if (h.at("format").get<std::string>() != "sciattn-checkpoint-replicated" ||
      h.at("version").get<int64_t>() != kFolderCheckpointVersion) {
    return Status::invalid_argument(rwhat + " is a \"" + h.at("format").get<std::string>() +
                                    "\" file of version " + h.at("version").dump() +
                                    "; expected \"sciattn-checkpoint-replicated\" version " +
                                    std::to_string(kFolderCheckpointVersion));
  }
  SCIATTN_TRY(check_state(t, h, rwhat));
  if (h.at("trainer").at("global_step").get<int64_t>() != step) {
    return Status::invalid_argument(rwhat + " is of global step " +
                                    h.at("trainer").at("global_step").dump() + "; " + mwhat +
                                    " says " + std::to_string(step));
  }
  SCIATTN_TRY(slots_to_flat(tensors, t.model_->layout(), rwhat, {{"params", &out->params}}));

  // This rank's range, re-sliced from the saved shards. Elements past the model's parameters
  // (this run's padding) stay zero.
  int64_t lo = 0, hi = 0;
  state_range(t, &lo, &hi);
  const size_t n = static_cast<size_t>(hi - lo);
  out->master.assign(n, 0.0f);
  out->exp_avg.assign(n, 0.0f);
  out->exp_avg_sq.assign(n, 0.0f);
  for (int64_t r = 0; r < world; ++r) {
    const Json& e = shards[static_cast<size_t>(r)];
    const int64_t b = e.at("begin").get<int64_t>(), en = e.at("end").get<int64_t>();
    const int64_t a = std::max(lo, b), z = std::min({hi, en, parameters});
    if (a >= z) continue;
    const std::string spath = dir + "/" + e.at("file").get<std::string>();
    const std::string swhat = "shard file \"" + spath + "\"";
    SCIATTN_TRY(read_checkpoint(spath, &text, &tensors));
    Json sh;
    SCIATTN_TRY(detail::parse_json(text, swhat, &sh));
    if (sh.at("format").get<std::string>() != "sciattn-checkpoint-shard" ||
        sh.at("version").get<int64_t>() != kFolderCheckpointVersion ||
        sh.at("rank").get<int64_t>() != r || sh.at("world_size").get<int64_t>() != world ||
        sh.at("begin").get<int64_t>() != b || sh.at("end").get<int64_t>() != en) {
      return Status::invalid_argument(
          swhat + " does not match " + mwhat + ": it is " + sh.at("format").dump() + " version " +
          sh.at("version").dump() + ", rank " + sh.at("rank").dump() + " of " +
          sh.at("world_size").dump() + ", elements [" + sh.at("begin").dump() + ", " +
          sh.at("end").dump() + "); the manifest lists rank " + std::to_string(r) + " of " +
          std::to_string(world) + ", [" + std::to_string(b) + ", " + std::to_string(en) + ")");
    }
    if (sh.at("global_step").get<int64_t>() != step) {
      return Status::invalid_argument(swhat + " was saved at global step " +
                                      sh.at("global_step").dump() + "; " + mwhat + " is of step " +
                                      std::to_string(step) + " (files of two saves mixed?)");
    }
    std::vector<float>* dsts[3] = {&out->master, &out->exp_avg, &out->exp_avg_sq};
    const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
    if (tensors.size() != 3) {
      return Status::invalid_argument(swhat + " holds " + std::to_string(tensors.size()) +
                                      " tensors; a shard has master, exp_avg and exp_avg_sq");
    }
    for (int k = 0; k < 3; ++k) {
      const CheckpointTensor& ct = tensors[static_cast<size_t>(k)];
      if (ct.name != names[k] || ct.dtype != "f32" || ct.shape != std::vector<int64_t>{en - b}) {
        return Status::invalid_argument(
            swhat + ": tensor " + std::to_string(k) + " is \"" + ct.name + "\" (" + ct.dtype +
            ", " + std::to_string(ct.bytes.size() / 4) + " elements); expected \"" + names[k] +
            "\" (f32, " + std::to_string(en - b) + ")");
      }
      std::memcpy(dsts[k]->data() + (a - lo), ct.bytes.data() + (a - b) * 4,
                  static_cast<size_t>(z - a) * sizeof(float));
    }
    // The replicated weights are the gathered master weights of the same save.
    if (std::memcmp(out->master.data() + (a - lo), out->params.data() + a,
                    static_cast<size_t>(z - a) * sizeof(float)) != 0) {
      return Status::invalid_argument(swhat + "'s master weights differ from the weights in " +
                                      rwhat + " (files of two saves mixed?)");
    }
  }
  return Status::ok_status();
}

Status Trainer::load_checkpoint(const std::string& path) {
  SCIATTN_TRY(finish_update());
  // Everything is read and checked before anything changes, and the ranks agree on the outcome,
  // so that a failure leaves every rank's trainer as it was.
  Json h;
  FlatState st;
  SCIATTN_TRY(agree(*comm_, CheckpointIo::read(*this, path, &h, &st),
                    "while reading checkpoint \"" + path + "\""));
  try {
    SCIATTN_TRY(CheckpointIo::apply_state(*this, h));
  } catch (const Json::exception& e) {
    return Status::invalid_argument("checkpoint \"" + path + "\": malformed header: " + e.what());
  }
  // The weights as the optimizer's copy-out would write them, then the master weights, m and v.
  SCIATTN_TRY(model_->set_weights(st.params.data()));
  if (zero_ != nullptr) {
    SCIATTN_TRY(zero_->shard_from_host(ZeroOptimizer::State::kMaster, st.master));
    SCIATTN_TRY(zero_->shard_from_host(ZeroOptimizer::State::kExpAvg, st.exp_avg));
    return zero_->shard_from_host(ZeroOptimizer::State::kExpAvgSq, st.exp_avg_sq);
  }
  if (!master_is_weights_) SCIATTN_TRY(state_from_host(st.master, master_));
  SCIATTN_TRY(state_from_host(st.exp_avg, exp_avg_));
  return state_from_host(st.exp_avg_sq, exp_avg_sq_);
}

}  // namespace sciattn::train

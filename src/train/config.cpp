// The DeepSpeed configuration file of `sciattn train` (config.h). Trainer layer (host code).
#include "sciattn/train/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>

#include "common/status_try.h"
#include "train/json_util.h"

namespace sciattn::train {
namespace {

using detail::Json;
using detail::ObjectReader;

// Keys of DeepSpeed's config that have no effect on one rank of this trainer, with the reason
// the warning gives.
const std::map<std::string, const char*>& top_level_not_applicable() {
  static const std::map<std::string, const char*> keys = {
      {"prescale_gradients", "changes the cross-rank gradient reduction; one rank reduces nothing"},
      {"gradient_predivide_factor",
       "changes the cross-rank gradient reduction; one rank reduces nothing"},
      {"communication_data_type", "sets the dtype of cross-rank communication; one rank has none"},
      {"seq_parallel_communication_data_type",
       "sets the dtype of sequence-parallel communication; one rank has none"},
      {"disable_allgather", "changes ZeRO's all-gather; one rank has none"},
      {"sparse_gradients", "reduces embedding gradients sparsely across ranks; one rank has none"},
      {"amp", "NVIDIA Apex mixed precision; the trainer's mixed precision is fp16 / bf16"},
      {"zero_allow_untested_optimizer",
       "chooses among DeepSpeed's optimizers; the trainer runs "
       "its own AdamW"},
      {"zero_force_ds_cpu_optimizer",
       "chooses among DeepSpeed's optimizers; the trainer runs its "
       "own AdamW"},
      {"flops_profiler", "DeepSpeed's profiler; the progress line reports FLOP/s"},
      {"tensorboard", "a DeepSpeed monitor; the trainer writes a JSON-lines log (--log)"},
      {"wandb", "a DeepSpeed monitor; the trainer writes a JSON-lines log (--log)"},
      {"csv_monitor", "a DeepSpeed monitor; the trainer writes a JSON-lines log (--log)"},
      {"comet", "a DeepSpeed monitor; the trainer writes a JSON-lines log (--log)"},
      {"memory_breakdown",
       "DeepSpeed's memory printout; the trainer prints a ledger with --memory"},
      {"dump_state", "DeepSpeed's state dump"},
      {"elasticity", "DeepSpeed elastic training"},
      {"autotuning", "DeepSpeed's autotuner"},
      {"data_efficiency", "DeepSpeed's data-efficiency library"},
      {"curriculum_learning", "DeepSpeed's curriculum learning"},
      {"compression_training", "DeepSpeed's compression library"},
      {"eigenvalue", "DeepSpeed's eigenvalue computation"},
      {"progressive_layer_drop", "DeepSpeed's progressive layer drop"},
      {"quantize_training", "DeepSpeed's quantized training"},
      {"pipeline", "DeepSpeed's pipeline parallelism"},
      {"aio", "DeepSpeed's NVMe I/O settings"},
      {"checkpoint", "DeepSpeed's checkpoint engine (the trainer has --save / --resume)"},
      {"data_types", "DeepSpeed's gradient-accumulation dtype (the CPU path accumulates in fp32)"},
      {"timers", "DeepSpeed's timers (see wall_clock_breakdown)"},
      {"nebula", "DeepSpeed's Nebula checkpointing"},
      {"weight_quantization", "DeepSpeed's weight quantization"},
      {"hybrid_engine", "DeepSpeed's hybrid engine"},
      {"compile", "torch.compile settings"},
      {"tensor_parallel", "DeepSpeed's tensor parallelism"},
      {"torch_autocast", "torch.autocast settings"},
      {"dataloader_drop_last", "DeepSpeed's data loader"},
      {"use_data_before_expert_parallelism", "DeepSpeed's mixture of experts"},
      {"graph_harvesting", "DeepSpeed's graph harvesting"},
  };
  return keys;
}

// zero_optimization keys beyond those ZeroConfig honours and offload_optimizer: they tune
// DeepSpeed's own implementation of ZeRO, or belong to stage 3.
const std::vector<std::string>& zero_not_applicable() {
  static const std::vector<std::string> keys = {"round_robin_gradients",
                                                "load_from_fp32_weights",
                                                "elastic_checkpoint",
                                                "sub_group_size",
                                                "cpu_offload",
                                                "cpu_offload_params",
                                                "cpu_offload_use_pin_memory",
                                                "offload_param",
                                                "stage3_max_live_parameters",
                                                "stage3_max_reuse_distance",
                                                "stage3_prefetch_bucket_size",
                                                "stage3_param_persistence_threshold",
                                                "stage3_model_persistence_threshold",
                                                "stage3_gather_16bit_weights_on_model_save",
                                                "stage3_gather_fp16_weights_on_model_save",
                                                "stage3_module_granularity_threshold",
                                                "ignore_unused_parameters",
                                                "legacy_stage1",
                                                "zero_hpz_partition_size",
                                                "zero_quantized_weights",
                                                "zero_quantized_nontrainable_weights",
                                                "zero_quantized_gradients",
                                                "memory_efficient_linear",
                                                "mics_shard_size",
                                                "mics_hierarchical_params_gather",
                                                "use_multi_rank_bucket_allreduce",
                                                "pipeline_loading_checkpoint",
                                                "override_module_apply",
                                                "log_trace_cache_warnings",
                                                "use_all_reduce_for_fetch_params",
                                                "max_live_parameters",
                                                "max_reuse_distance",
                                                "prefetch_bucket_size",
                                                "param_persistence_threshold",
                                                "model_persistence_threshold",
                                                "gather_16bit_weights_on_model_save",
                                                "module_granularity_threshold"};
  return keys;
}

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

class Parser {
 public:
  Parser(const std::string& source, const AutoValues& autos, std::vector<std::string>* warnings)
      : prefix_("DeepSpeed config " + source + ": "), autos_(autos), warnings_(warnings) {}

  Status parse(const Json& doc, int64_t num_heads, TrainConfig* out);

 private:
  // One warning: the prefix, the key's path, then `message` (a sentence about the key).
  void warn(const std::string& key, const std::string& message) {
    if (warnings_ != nullptr) warnings_->push_back(prefix_ + key + " " + message);
  }
  // An "auto" value: filled from `fill` when given, else refused by name.
  template <class T>
  Status fill_auto(ObjectReader& r, const std::string& key, const std::optional<T>& fill,
                   const char* filled_by, T* out) {
    r.mark_read(key);
    if (!fill) {
      return r.error(key, std::string("is \"auto\", which the trainer fills from ") + filled_by +
                              "; give " + filled_by + " or write a value");
    }
    *out = *fill;
    return Status::ok_status();
  }
  Status refuse_auto(ObjectReader& r, const std::string& key) {
    return r.error(key,
                   "is \"auto\", which the trainer cannot fill (no command-line flag or "
                   "model-file key gives it); write a value");
  }
  // Errors for the keys of `r` not read, or warnings for those in `ignorable`.
  Status finish(ObjectReader& r, const std::vector<std::string>& ignorable, const char* reason,
                const std::string& honoured) {
    for (const std::string& key : r.unread()) {
      if (contains(ignorable, key)) {
        warn(r.path(key), std::string(reason) + "; ignored");
        continue;
      }
      return r.error(key, "is not a key DeepSpeed knows here; the trainer reads " + honoured);
    }
    return Status::ok_status();
  }

  Status batch(ObjectReader& top, TrainConfig* c);
  Status optimizer(ObjectReader& top, TrainConfig* c);
  Status scheduler(ObjectReader& top, TrainConfig* c);
  Status precision(ObjectReader& top, TrainConfig* c);
  Status clipping(ObjectReader& top, TrainConfig* c);
  Status checkpointing(ObjectReader& top, TrainConfig* c);
  Status zero(ObjectReader& top, TrainConfig* c);
  Status sequence_parallel(ObjectReader& top, int64_t num_heads, TrainConfig* c);

  std::string prefix_;
  const AutoValues& autos_;
  std::vector<std::string>* warnings_;
};

Status Parser::batch(ObjectReader& top, TrainConfig* c) {
  int64_t values[3] = {0, 0, 0};
  const char* keys[3] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                         "gradient_accumulation_steps"};
  const std::optional<int64_t> fills[3] = {autos_.train_batch_size, autos_.micro_batch_size,
                                           autos_.gradient_accumulation_steps};
  for (int i = 0; i < 3; ++i) {
    if (top.is_auto(keys[i])) {
      top.mark_read(keys[i]);
      values[i] = fills[i].value_or(0);  // absent: derived from the others if they can
    } else {
      SCIATTN_TRY(top.get_int(keys[i], &values[i], 1));
      if (!top.has(keys[i]) && fills[i]) values[i] = *fills[i];
    }
  }
  // sequence_parallel_size was read and checked against the world size before.
  const int ranks = autos_.world_size / static_cast<int>(c->sequence_parallel_size);
  Status s = resolve_batch_sizes(values[0], values[1], values[2], ranks, c);
  if (!s.ok()) return Status::invalid_argument(prefix_ + s.message());
  return Status::ok_status();
}

Status Parser::sequence_parallel(ObjectReader& top, int64_t num_heads, TrainConfig* c) {
  if (autos_.world_size < 1) {
    return Status::invalid_argument(prefix_ + "the world size must be >= 1; got " +
                                    std::to_string(autos_.world_size));
  }
  int64_t& sp = c->sequence_parallel_size;
  SCIATTN_TRY(top.get_int("sequence_parallel_size", &sp, 1));
  if (autos_.world_size % sp != 0) {
    return top.error("sequence_parallel_size",
                     std::to_string(sp) + " does not divide the world size " +
                         std::to_string(autos_.world_size) +
                         " (ranks = data-parallel ranks x sequence_parallel_size, consecutive "
                         "ranks sharing a sequence); use a divisor of " +
                         std::to_string(autos_.world_size));
  }
  if (num_heads > 0 && num_heads % sp != 0) {
    return top.error("sequence_parallel_size",
                     std::to_string(sp) + " does not divide the model's n_heads " +
                         std::to_string(num_heads) +
                         " (each rank of a sequence-parallel group attends over n_heads / "
                         "sequence_parallel_size heads); use a divisor of n_heads");
  }
  return Status::ok_status();
}

Status Parser::optimizer(ObjectReader& top, TrainConfig* c) {
  c->optimizer = AdamWHyperparams{};
  c->optimizer_type = "AdamW";
  if (autos_.lr) c->optimizer.lr = static_cast<float>(*autos_.lr);
  if (autos_.weight_decay) c->optimizer.weight_decay = static_cast<float>(*autos_.weight_decay);
  if (!top.has("optimizer")) return Status::ok_status();
  ObjectReader opt;
  SCIATTN_TRY(top.get_object("optimizer", &opt));
  std::string type = "AdamW";
  SCIATTN_TRY(opt.get_string("type", &type));
  const std::string t = lower(type);
  if (t != "adamw" && t != "adam") {
    return opt.error("type", "\"" + type +
                                 "\" is not supported; the trainer runs AdamW (type \"AdamW\", "
                                 "or \"Adam\" with DeepSpeed's adam_w_mode)");
  }
  c->optimizer_type = t == "adamw" ? "AdamW" : "Adam";
  if (opt.has("params")) {
    ObjectReader p;
    SCIATTN_TRY(opt.get_object("params", &p));
    double value = 0;
    if (p.is_auto("lr")) {
      SCIATTN_TRY(fill_auto(p, "lr", autos_.lr, "--lr", &value));
      c->optimizer.lr = static_cast<float>(value);
    } else if (p.has("lr")) {
      SCIATTN_TRY(p.get_number("lr", &value));
      c->optimizer.lr = static_cast<float>(value);
    }
    if (p.is_auto("weight_decay")) {
      SCIATTN_TRY(fill_auto(p, "weight_decay", autos_.weight_decay, "--weight-decay", &value));
      c->optimizer.weight_decay = static_cast<float>(value);
    } else if (p.has("weight_decay")) {
      SCIATTN_TRY(p.get_number("weight_decay", &value));
      c->optimizer.weight_decay = static_cast<float>(value);
    }
    for (const char* key : {"betas", "eps", "bias_correction", "adam_w_mode", "amsgrad"}) {
      if (p.is_auto(key)) return refuse_auto(p, key);
    }
    if (p.has("betas")) {
      p.mark_read("betas");
      const Json& b = p.raw("betas");
      if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number()) {
        return p.error("betas", "must be a list of two numbers; got " + detail::describe(b));
      }
      c->optimizer.beta1 = b[0].get<float>();
      c->optimizer.beta2 = b[1].get<float>();
    }
    if (p.has("eps")) {
      SCIATTN_TRY(p.get_number("eps", &value));
      c->optimizer.eps = static_cast<float>(value);
    }
    SCIATTN_TRY(p.get_bool("bias_correction", &c->optimizer.bias_correction));
    if (c->optimizer_type == "Adam") {
      SCIATTN_TRY(p.get_bool("adam_w_mode", &c->optimizer.adamw_mode));
    } else if (p.has("adam_w_mode")) {
      bool mode = true;
      SCIATTN_TRY(p.get_bool("adam_w_mode", &mode));
      if (!mode) {
        return p.error("adam_w_mode",
                       "is false, which contradicts type \"AdamW\"; use type "
                       "\"Adam\" for L2 weight decay");
      }
    }
    bool amsgrad = false;
    SCIATTN_TRY(p.get_bool("amsgrad", &amsgrad));
    if (amsgrad) return p.error("amsgrad", "is not supported (DeepSpeed's Adam refuses it too)");
    SCIATTN_TRY(finish(p, {"torch_adam", "fused", "foreach", "capturable", "differentiable"},
                       "chooses a PyTorch implementation; the trainer runs its own AdamW",
                       "lr, betas, eps, weight_decay, bias_correction, adam_w_mode (Adam)"));
  }
  SCIATTN_TRY(finish(opt, {}, "", "type, params"));
  Status v = validate_adamw(c->optimizer);
  if (!v.ok()) return Status::invalid_argument(prefix_ + v.message());
  return Status::ok_status();
}

Status Parser::scheduler(ObjectReader& top, TrainConfig* c) {
  LrScheduleConfig& s = c->schedule;
  s = LrScheduleConfig{};
  s.base_lr = c->optimizer.lr;
  if (!top.has("scheduler")) return Status::ok_status();
  ObjectReader sch;
  SCIATTN_TRY(top.get_object("scheduler", &sch));
  if (!sch.has("type"))
    return sch.error("type",
                     "is missing (WarmupLR, WarmupDecayLR or "
                     "WarmupCosineLR)");
  std::string type;
  SCIATTN_TRY(sch.get_string("type", &type));
  if (type == "WarmupLR") {
    s.type = LrScheduleType::kWarmupLR;
  } else if (type == "WarmupDecayLR") {
    s.type = LrScheduleType::kWarmupDecayLR;
  } else if (type == "WarmupCosineLR") {
    s.type = LrScheduleType::kWarmupCosineLR;
  } else {
    return sch.error("type", "\"" + type +
                                 "\" is not supported; the trainer runs WarmupLR, WarmupDecayLR "
                                 "and WarmupCosineLR");
  }
  // DeepSpeed's defaults: WarmupLR's warmup_max_lr is the optimizer's lr; WarmupDecayLR's is
  // 0.001.
  s.warmup_max_lr = s.type == LrScheduleType::kWarmupLR ? c->optimizer.lr : 1e-3;
  ObjectReader p;
  const Json empty = Json::object();
  if (sch.has("params")) {
    SCIATTN_TRY(sch.get_object("params", &p));
  } else {
    p = ObjectReader(empty, sch.path("params"), prefix_);
  }
  const bool warmup_lr = s.type != LrScheduleType::kWarmupCosineLR;
  std::vector<std::string> keys = {"warmup_num_steps", "warmup_type", "last_batch_iteration"};
  if (warmup_lr) {
    keys.insert(keys.end(), {"warmup_min_lr", "warmup_max_lr"});
  } else {
    keys.insert(keys.end(), {"warmup_min_ratio", "cos_min_ratio"});
  }
  if (s.type != LrScheduleType::kWarmupLR) keys.push_back("total_num_steps");
  for (const std::string& key : p.unread()) {
    if (!contains(keys, key)) {
      std::string list;
      for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
      return p.error(key, "is not a parameter of " + type + " (its parameters: " + list + ")");
    }
  }
  if (p.is_auto("warmup_max_lr")) {
    p.mark_read("warmup_max_lr");
    s.warmup_max_lr = c->optimizer.lr;
  } else {
    SCIATTN_TRY(p.get_number("warmup_max_lr", &s.warmup_max_lr));
  }
  if (p.is_auto("warmup_min_lr")) {
    p.mark_read("warmup_min_lr");
    s.warmup_min_lr = 0.0;
  } else {
    SCIATTN_TRY(p.get_number("warmup_min_lr", &s.warmup_min_lr));
  }
  if (p.is_auto("warmup_num_steps")) {
    SCIATTN_TRY(fill_auto(p, "warmup_num_steps", autos_.warmup_num_steps, "--warmup-steps",
                          &s.warmup_num_steps));
  } else {
    SCIATTN_TRY(p.get_int("warmup_num_steps", &s.warmup_num_steps, 0));
  }
  if (p.is_auto("total_num_steps")) {
    SCIATTN_TRY(
        fill_auto(p, "total_num_steps", autos_.total_num_steps, "--steps", &s.total_num_steps));
  } else if (s.type != LrScheduleType::kWarmupLR) {
    if (!p.has("total_num_steps")) {
      if (!autos_.total_num_steps) {
        return p.error("total_num_steps", "is required by " + type + " (or give --steps)");
      }
      s.total_num_steps = *autos_.total_num_steps;
    }
    SCIATTN_TRY(p.get_int("total_num_steps", &s.total_num_steps, 1));
  }
  for (const char* key :
       {"warmup_min_ratio", "cos_min_ratio", "warmup_type", "last_batch_iteration"}) {
    if (p.is_auto(key)) return refuse_auto(p, key);
  }
  SCIATTN_TRY(p.get_number("warmup_min_ratio", &s.warmup_min_ratio));
  SCIATTN_TRY(p.get_number("cos_min_ratio", &s.cos_min_ratio));
  std::string warmup_type = "log";
  SCIATTN_TRY(p.get_string("warmup_type", &warmup_type));
  if (warmup_type == "log") {
    s.warmup_type = WarmupType::kLog;
  } else if (warmup_type == "linear") {
    s.warmup_type = WarmupType::kLinear;
  } else {
    return p.error("warmup_type", "must be \"log\" or \"linear\"; got \"" + warmup_type + "\"");
  }
  int64_t last = -1;
  SCIATTN_TRY(p.get_int("last_batch_iteration", &last, INT64_MIN));
  if (last != -1) {
    return p.error("last_batch_iteration",
                   "must be -1 (a fresh schedule); resume a run with "
                   "--resume, which restores the schedule's position");
  }
  if (s.type == LrScheduleType::kWarmupDecayLR && s.total_num_steps < s.warmup_num_steps) {
    warn(p.path("total_num_steps"), "(" + std::to_string(s.total_num_steps) +
                                        ") is less than warmup_num_steps (" +
                                        std::to_string(s.warmup_num_steps) +
                                        "), as DeepSpeed warns too: the rate decays to 0 right "
                                        "after the warmup");
  }
  SCIATTN_TRY(finish(sch, {}, "", "type, params"));
  Status v = validate_lr_schedule(s);
  if (!v.ok()) return Status::invalid_argument(prefix_ + v.message());
  return Status::ok_status();
}

Status Parser::precision(ObjectReader& top, TrainConfig* c) {
  bool fp16 = false, bf16 = false;
  auto enabled = [&](const char* section, const std::optional<bool>& fill, bool* out,
                     ObjectReader* reader) -> Status {
    SCIATTN_TRY(top.get_object(section, reader));
    if (reader->is_auto("enabled")) {
      reader->mark_read("enabled");
      *out = fill.value_or(false);  // the CPU path: fp32
      return Status::ok_status();
    }
    return reader->get_bool("enabled", out);
  };
  ObjectReader f;
  ObjectReader b;
  // DeepSpeed accepts "bfloat16" as another name of "bf16".
  const char* bf16_key = top.has("bf16") ? "bf16" : top.has("bfloat16") ? "bfloat16" : nullptr;
  if (top.has("bf16") && top.has("bfloat16")) {
    return top.error("bfloat16", "and bf16 are the same section; keep one");
  }
  if (bf16_key != nullptr) {
    SCIATTN_TRY(enabled(bf16_key, autos_.bf16, &bf16, &b));
    SCIATTN_TRY(finish(b,
                       {"immediate_grad_update", "check_grad_overflow",
                        "bf16_master_weights_and_grads", "bf16_optimizer_states"},
                       "tunes DeepSpeed's bf16 optimizer; the trainer keeps fp32 master weights",
                       "enabled"));
  }
  c->loss_scaler = LossScalerConfig{};
  if (top.has("fp16")) {
    SCIATTN_TRY(enabled("fp16", autos_.fp16, &fp16, &f));
    double loss_scale = 0.0;
    for (const char* key : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                            "min_loss_scale", "consecutive_hysteresis", "type"}) {
      if (f.is_auto(key)) return refuse_auto(f, key);
    }
    SCIATTN_TRY(f.get_number("loss_scale", &loss_scale));
    if (loss_scale < 0) return f.error("loss_scale", "must be 0 (dynamic) or > 0 (static)");
    LossScalerConfig& ls = c->loss_scaler;
    ls.dynamic = loss_scale == 0.0;
    ls.static_scale = ls.dynamic ? 1.0 : loss_scale;
    int64_t power = ls.initial_scale_power, window = ls.scale_window, hysteresis = ls.hysteresis;
    SCIATTN_TRY(f.get_int("initial_scale_power", &power, 0));
    if (power > 127) return f.error("initial_scale_power", "must be <= 127 (an fp32 exponent)");
    SCIATTN_TRY(f.get_int("loss_scale_window", &window, 1));
    SCIATTN_TRY(f.get_int("hysteresis", &hysteresis, 1));
    if (hysteresis > 1000000) return f.error("hysteresis", "must be <= 1000000");
    ls.initial_scale_power = static_cast<int>(power);
    ls.scale_window = window;
    ls.hysteresis = static_cast<int>(hysteresis);
    SCIATTN_TRY(f.get_number("min_loss_scale", &ls.min_scale));
    if (!(ls.min_scale > 0)) return f.error("min_loss_scale", "must be > 0");
    SCIATTN_TRY(f.get_bool("consecutive_hysteresis", &ls.consecutive_hysteresis));
    std::string type = "standard";
    SCIATTN_TRY(f.get_string("type", &type));
    if (type != "standard" && type != "ds_enhanced") {
      return f.error("type", "must be \"standard\" or \"ds_enhanced\"; got \"" + type + "\"");
    }
    c->ds_enhanced = type == "ds_enhanced";
    bool auto_cast = false;
    SCIATTN_TRY(f.get_bool("auto_cast", &auto_cast));
    if (auto_cast) warn(f.path("auto_cast"), "casts a PyTorch model's inputs; ignored");
    SCIATTN_TRY(finish(f, {"fp16_master_weights_and_grads", "fp16_optimizer_states"},
                       "tunes DeepSpeed's fp16 optimizer; the trainer keeps fp32 master weights",
                       "enabled, loss_scale, initial_scale_power, loss_scale_window, hysteresis, "
                       "consecutive_hysteresis, min_loss_scale, type"));
    SCIATTN_TRY(validate_loss_scaler(ls));
  }
  if (fp16 && bf16) {
    return top.error("fp16",
                     "and bf16 are both enabled; enable at most one (DeepSpeed refuses "
                     "this too)");
  }
  c->precision = fp16 ? Precision::kFp16 : bf16 ? Precision::kBf16 : Precision::kFp32;
  if (fp16 && autos_.device == Device::kCpu) {
    warn("fp16.enabled",
         "is true, but the CPU path computes in fp32: the loss scaler, overflow check and step "
         "skipping run as configured, on fp32 gradients");
  }
  if (bf16 && autos_.device == Device::kCpu) {
    warn(std::string(bf16_key) + ".enabled",
         "is true, but the CPU path computes in fp32 (and bf16 uses no loss scale)");
  }
  return Status::ok_status();
}

Status Parser::clipping(ObjectReader& top, TrainConfig* c) {
  c->clip = GradClipConfig{};
  if (!top.has("gradient_clipping")) return Status::ok_status();
  const Json& v = top.raw("gradient_clipping");
  if (top.is_auto("gradient_clipping")) {
    double value = 0;
    SCIATTN_TRY(fill_auto(top, "gradient_clipping", autos_.gradient_clipping, "--gradient-clipping",
                          &value));
    c->clip.mode = value > 0 ? ClipMode::kFixed : ClipMode::kNone;
    c->clip.threshold = value;
  } else if (v.is_number()) {
    double value = 0;
    SCIATTN_TRY(top.get_number("gradient_clipping", &value));
    if (value < 0) return top.error("gradient_clipping", "must be >= 0 (0 = off)");
    c->clip.mode = value > 0 ? ClipMode::kFixed : ClipMode::kNone;
    c->clip.threshold = value > 0 ? value : 1.0;
  } else if (v.is_object()) {
    ObjectReader g;
    SCIATTN_TRY(top.get_object("gradient_clipping", &g));
    bool on = true;
    SCIATTN_TRY(g.get_bool("enabled", &on));
    std::string type = "fixed";
    SCIATTN_TRY(g.get_string("type", &type));
    if (type != "fixed" && type != "adaptive") {
      return g.error("type", "must be \"fixed\" or \"adaptive\"; got \"" + type + "\"");
    }
    SCIATTN_TRY(g.get_number("threshold", &c->clip.threshold));
    SCIATTN_TRY(g.get_int("history_window", &c->clip.history_window, 1));
    SCIATTN_TRY(g.get_number("adjustment_factor", &c->clip.adjustment_factor));
    SCIATTN_TRY(finish(g, {}, "", "enabled, type, threshold, history_window, adjustment_factor"));
    c->clip.mode = !on ? ClipMode::kNone : type == "fixed" ? ClipMode::kFixed : ClipMode::kAdaptive;
    if (on) {
      Status s = validate_grad_clip(c->clip);
      if (!s.ok()) return Status::invalid_argument(prefix_ + s.message());
    }
  } else {
    return top.error("gradient_clipping",
                     "must be a number or an object {enabled, type, "
                     "threshold, history_window, adjustment_factor}; got " +
                         detail::describe(v));
  }
  return Status::ok_status();
}

Status Parser::checkpointing(ObjectReader& top, TrainConfig* c) {
  if (!top.has("activation_checkpointing")) return Status::ok_status();
  ObjectReader a;
  SCIATTN_TRY(top.get_object("activation_checkpointing", &a));
  c->activation_checkpointing = true;
  SCIATTN_TRY(a.get_bool("partition_activations", &c->partition_activations));
  SCIATTN_TRY(a.get_bool("cpu_checkpointing", &c->cpu_checkpointing));
  if (a.has("number_checkpoints")) {
    if (a.raw("number_checkpoints").is_null()) {
      a.mark_read("number_checkpoints");
    } else {
      int64_t n = 0;
      SCIATTN_TRY(a.get_int("number_checkpoints", &n, 1));
      c->number_checkpoints = n;
    }
  }
  if (c->partition_activations) {
    warn(a.path("partition_activations"),
         "splits checkpoints across model-parallel ranks and needs several; one rank keeps them "
         "whole; ignored");
  }
  if (c->cpu_checkpointing && autos_.device == Device::kCpu) {
    warn(a.path("cpu_checkpointing"),
         "moves checkpoints to host memory; on the CPU path they are there already (the copies "
         "still run, into a second host buffer)");
  }
  return finish(a, {"contiguous_memory_optimization", "synchronize_checkpoint_boundary", "profile"},
                "tunes DeepSpeed's checkpointing; the trainer keeps each layer's input",
                "partition_activations, cpu_checkpointing, number_checkpoints");
}

Status Parser::zero(ObjectReader& top, TrainConfig* c) {
  if (!top.has("zero_optimization")) return Status::ok_status();
  ObjectReader z;
  SCIATTN_TRY(top.get_object("zero_optimization", &z));
  int64_t stage = 0;
  SCIATTN_TRY(z.get_int("stage", &stage, 0));
  if (stage > 2) {
    return z.error("stage", std::to_string(stage) +
                                (stage == 3 ? " (parameter partitioning)" : "") +
                                " is not supported; the supported stages are 0, 1 and 2");
  }
  ZeroConfig& zc = c->zero;
  zc.stage = static_cast<int>(stage);
  SCIATTN_TRY(z.get_int("reduce_bucket_size", &zc.reduce_bucket_size, 1));
  SCIATTN_TRY(z.get_int("allgather_bucket_size", &zc.allgather_bucket_size, 1));
  SCIATTN_TRY(z.get_bool("reduce_scatter", &zc.reduce_scatter));
  SCIATTN_TRY(z.get_bool("allgather_partitions", &zc.allgather_partitions));
  SCIATTN_TRY(z.get_bool("overlap_comm", &zc.overlap_comm));
  SCIATTN_TRY(z.get_bool("contiguous_gradients", &zc.contiguous_gradients));
  if (autos_.world_size > 1 && stage < 2 && zc.overlap_comm) {
    // Stages 0 and 1 reduce the gradients in one call after the backward (training.md, "Several
    // ranks"): there is nothing for the reduction to overlap.
    warn(z.path("overlap_comm"),
         "overlaps stage 2's bucket reductions with the backward; at stage " +
             std::to_string(stage) +
             " the gradients are reduced in one call after the backward, so it has no effect");
  }
  if (autos_.world_size == 1) {
    // One rank: nothing to partition or communicate; the keys are read (and checked) but act
    // only with several ranks.
    if (stage > 0) {
      warn(z.path("stage"), std::to_string(stage) + " partitions optimizer states" +
                                (stage == 2 ? " and gradients" : "") +
                                " across data-parallel ranks; one rank has nothing to "
                                "partition; ignored");
    }
    for (const char* key : {"overlap_comm", "contiguous_gradients", "reduce_bucket_size",
                            "allgather_bucket_size", "allgather_partitions", "reduce_scatter"}) {
      if (z.has(key))
        warn(z.path(key), "shapes ZeRO's cross-rank communication; one rank has none; ignored");
    }
  }
  if (z.has("offload_optimizer")) {
    ObjectReader o;
    SCIATTN_TRY(z.get_object("offload_optimizer", &o));
    std::string device = "none";
    SCIATTN_TRY(o.get_string("device", &device));
    if (device != "cpu" && device != "none" && device != "nvme") {
      return o.error("device", "must be \"cpu\", \"nvme\" or \"none\"; got \"" + device + "\"");
    }
    if (device == "nvme") {
      warn(o.path("device"),
           "\"nvme\" is not implemented: the optimizer state stays in host "
           "memory");
    }
    c->offload_optimizer = device == "cpu";
    SCIATTN_TRY(o.get_bool("pin_memory", &c->offload_pin_memory));
    if (c->offload_optimizer && autos_.device == Device::kCpu) {
      warn(o.path("device"),
           "\"cpu\": on the CPU path the optimizer state is in host memory already (the "
           "offloaded update still runs, on a second copy of the weights)");
    }
    SCIATTN_TRY(finish(o,
                       {"nvme_path", "buffer_count", "fast_init", "ratio", "pipeline_read",
                        "pipeline_write", "pipeline"},
                       "tunes DeepSpeed's NVMe offload", "device, pin_memory"));
  }
  return finish(z, zero_not_applicable(), "tunes DeepSpeed's own ZeRO or belongs to stage 3",
                "stage, reduce_bucket_size, allgather_bucket_size, reduce_scatter, "
                "allgather_partitions, overlap_comm, contiguous_gradients, offload_optimizer");
}

Status Parser::parse(const Json& doc, int64_t num_heads, TrainConfig* out) {
  ObjectReader top(doc, "", prefix_);
  TrainConfig c;
  SCIATTN_TRY(sequence_parallel(top, num_heads, &c));
  SCIATTN_TRY(batch(top, &c));
  SCIATTN_TRY(optimizer(top, &c));
  SCIATTN_TRY(scheduler(top, &c));
  SCIATTN_TRY(precision(top, &c));
  SCIATTN_TRY(clipping(top, &c));
  SCIATTN_TRY(checkpointing(top, &c));
  SCIATTN_TRY(zero(top, &c));
  SCIATTN_TRY(top.get_int("steps_per_print", &c.steps_per_print, 1));
  SCIATTN_TRY(top.get_bool("wall_clock_breakdown", &c.wall_clock_breakdown));
  if (top.has("sparse_attention")) {
    top.mark_read("sparse_attention");
    SparsityConfig sparse;
    Json section;
    section["sparse_attention"] = top.raw("sparse_attention");
    Status s = parse_deepspeed_sparsity_config(section.dump(), num_heads, &sparse);
    if (!s.ok()) return Status::invalid_argument(prefix_ + s.message());
    c.sparse_attention = std::move(sparse);
  }
  for (const std::string& key : top.unread()) {
    auto it = top_level_not_applicable().find(key);
    if (it != top_level_not_applicable().end()) {
      warn(key, std::string("exists in DeepSpeed but does not apply here (") + it->second +
                    "); ignored");
      continue;
    }
    return top.error(key,
                     "is not a DeepSpeed config key; the trainer reads train_batch_size, "
                     "train_micro_batch_size_per_gpu, gradient_accumulation_steps, optimizer, "
                     "scheduler, fp16, bf16, gradient_clipping, activation_checkpointing, "
                     "zero_optimization, sparse_attention, steps_per_print, "
                     "wall_clock_breakdown, sequence_parallel_size");
  }
  *out = std::move(c);
  return Status::ok_status();
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

Status resolve_batch_sizes(int64_t train, int64_t micro, int64_t accumulation, int ranks,
                           TrainConfig* out) {
  const std::string names = "train_batch_size, train_micro_batch_size_per_gpu";
  if (train > 0 && micro > 0 && accumulation > 0) {
    // All three given: they must agree.
  } else if (train > 0 && micro > 0) {
    accumulation = train / ranks / micro;
  } else if (train > 0 && accumulation > 0) {
    micro = train / ranks / accumulation;
  } else if (micro > 0 && accumulation > 0) {
    train = micro * accumulation * ranks;
  } else if (train > 0) {
    accumulation = 1;
    micro = train / ranks;
  } else if (micro > 0) {
    accumulation = 1;
    train = micro * ranks;
  } else {
    return Status::invalid_argument(
        "either train_batch_size or train_micro_batch_size_per_gpu must be given (as DeepSpeed "
        "requires); with \"auto\", give --micro-batch-size");
  }
  if (train < 1 || micro < 1 || accumulation < 1 ||
      train != micro * accumulation * static_cast<int64_t>(ranks)) {
    return Status::invalid_argument(
        "batch sizes do not agree: train_batch_size " + std::to_string(train) +
        " != train_micro_batch_size_per_gpu " + std::to_string(micro) +
        " x gradient_accumulation_steps " + std::to_string(accumulation) +
        " x data-parallel ranks " + std::to_string(ranks) + " = " +
        std::to_string(micro * accumulation * ranks) +
        " (each must be >= 1, and train_batch_size = micro x accumulation x ranks)");
  }
  out->train_batch_size = train;
  out->micro_batch_size = micro;
  out->gradient_accumulation_steps = accumulation;
  out->data_parallel_size = ranks;
  return Status::ok_status();
}

Status parse_train_config(std::string_view json_text, const std::string& source, int64_t num_heads,
                          const AutoValues& autos, TrainConfig* out,
                          std::vector<std::string>* warnings) {
  Json doc;
  SCIATTN_TRY(detail::parse_json(json_text, "DeepSpeed config " + source, &doc));
  std::vector<std::string> collected;
  Parser parser(source, autos, &collected);
  try {
    SCIATTN_TRY(parser.parse(doc, num_heads, out));
  } catch (const Json::exception& e) {
    // Every value is type-checked before use, so this is a bug; still, nothing may escape.
    return Status(StatusCode::kInternal, "DeepSpeed config " + source + ": " + e.what());
  }
  if (warnings != nullptr) warnings->insert(warnings->end(), collected.begin(), collected.end());
  return Status::ok_status();
}

Status load_train_config(const std::string& path, int64_t num_heads, const AutoValues& autos,
                         TrainConfig* out, std::vector<std::string>* warnings) {
  std::string text;
  Status s = detail::read_file(path, &text);
  if (!s.ok()) return Status::invalid_argument("DeepSpeed config: " + s.message());
  return parse_train_config(text, "\"" + path + "\"", num_heads, autos, out, warnings);
}

}  // namespace sciattn::train

// `sciattn train`: trains a GPT from a DeepSpeed config, a model file and a token file on the GPU
// (bf16 / fp16 with fp32 master weights) or the CPU path, printing a progress line per step,
// writing a JSON-lines log, checkpoints and a PNG of the loss; `--demo` does it all on generated
// data; `--plan` prints the memory arithmetic of the techniques and the longest sequence that
// fits. Tools layer: the trainer's public API only.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "device_mirror.h"
#include "launch_ranks.h"
#include "sciattn/device.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/config.h"
#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/data.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/plan.h"
#include "sciattn/train/plot.h"
#include "sciattn/train/process_group.h"
#include "sciattn/train/random.h"
#include "sciattn/train/trainer.h"

namespace sciattn::tools {
namespace {

constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;
// The exit status of --test-fail-rank, which the launcher's test expects back.
constexpr int kExitTestFailure = 3;

// The back ends' token chunks (rows per matrix product over tokens) unless --token-chunk says.
constexpr int64_t kCpuTokenChunk = 256;
constexpr int64_t kCudaTokenChunk = 4096;
// MFU's default peak on a GPU computing in 16 bits: the H100 / H200 SXM's dense bf16 and fp16
// tensor-core rate (the measured ceiling is about 790 TFLOP/s, ../PERFORMANCE.md).
constexpr double kHopperPeakTflops = 989.4;
// The budgets --plan assumes when there is nothing to measure: an H200 (143,771 MiB, less what
// the CUDA context and allocator keep) and the GPU machine's host memory less the system's share.
constexpr double kDefaultDeviceGib = 138.0;
constexpr double kHostReserveGib = 8.0;
// --keep-attention-layers auto leaves this much of the device budget unplanned.
constexpr double kAutoKeepMarginGib = 2.0;

struct TrainArgs {
  std::string config, model, data, resume, save, log, plot, dump_gradients;
  std::string device;
  int64_t steps = 0;
  int64_t save_every = 0;
  bool memory = false;
  bool demo = false;
  bool plan = false;
  bool checkpoint_layers = false;
  bool offload_checkpoints = false;
  bool keep_attention_outputs = false;
  bool offload_attention_outputs = false;
  std::string keep_attention_layers;  // a count or "auto"; empty: none
  bool offload_optimizer = false;
  bool no_shuffle = false;
  int threads = 0;
  int nproc_per_node = 1;
  int fail_rank = -1;  // testing: this rank fails before it joins the group
  int64_t token_chunk = 0;
  double device_memory_gib = 0.0, host_memory_gib = 0.0;
  int64_t plan_max_tokens = int64_t{4} << 20;
  int64_t plan_granularity = 1024;
  int64_t mlp_tile_tokens = 0;
  int64_t lm_head_tile_tokens = 0;
  uint64_t data_seed = 1234;
  double peak_tflops = 0.0;
  std::vector<int64_t> inject_overflow;
  // "auto" fillers.
  std::optional<int64_t> micro_batch_size, gradient_accumulation_steps, warmup_steps;
  std::optional<double> lr, weight_decay, gradient_clipping;
};

// This process's rank when it is one of several (its messages then say which), else -1.
int message_rank = -1;

[[noreturn]] void fail(int code, const std::string& message) {
  // One write, so that the lines of several ranks on one terminal do not interleave.
  std::cerr << std::string("sciattn train") +
                   (message_rank >= 0 ? " (rank " + std::to_string(message_rank) + ")" : "") +
                   ": " + message + "\n"
            << std::flush;
  throw CLI::RuntimeError(code);
}

void check(const Status& s, int code = kExitBadInput) {
  if (!s.ok()) fail(code, s.message());
}

// The demo's data: documents from a fixed random first-order chain over 64 tokens in which each
// token has two likely successors, so the loss can fall from ln 64 = 4.16 towards ln 2 = 0.69.
std::string write_demo_data() {
  train::Rng rng(2026);
  constexpr int kVocab = 64;
  std::vector<int32_t> first(kVocab), second(kVocab);
  for (int t = 0; t < kVocab; ++t) {
    first[t] = static_cast<int32_t>(rng.below(kVocab - 1));
    second[t] = static_cast<int32_t>(rng.below(kVocab - 1));
  }
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 400; ++d) {
    std::vector<int32_t> doc = {static_cast<int32_t>(rng.below(kVocab - 1))};
    for (int i = 0; i < 120; ++i) {
      const int32_t t = doc.back();
      doc.push_back(rng.uniform() < 0.5 ? first[t] : second[t]);
    }
    docs.push_back(std::move(doc));
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sciattn_demo_" + std::to_string(getpid()) + ".tok"))
                               .string();
  check(train::write_token_file(path, docs, kVocab, kVocab - 1, train::Tokenizer::kUnspecified),
        kExitFailed);
  return path;
}

constexpr const char* kDemoModel = R"({"vocab_size": 64, "d_model": 64, "n_layers": 2,
  "n_heads": 4, "sequence_length": 64, "positions": "learned", "seed": 1})";
constexpr const char* kDemoConfig = R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_num_steps": 10,
                "warmup_type": "linear"}},
  "gradient_clipping": 1.0, "steps_per_print": 5})";
constexpr int64_t kDemoSteps = 60;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
std::string sci(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

std::string progress_line(const train::StepReport& r, int64_t steps, double peak_flops,
                          bool breakdown) {
  std::string line = "step " + std::to_string(r.step) + "/" + std::to_string(steps);
  if (r.skipped) {
    line += "  SKIPPED (gradients overflowed at loss scale " + fixed(r.loss_scale, 0) + ")";
  }
  line += "  loss " + fixed(r.loss, 4) + "  lr " + sci(r.lr);
  if (!r.skipped) line += "  norm " + fixed(r.grad_norm, 4);
  if (!r.skipped && r.clip_threshold > 0) {
    line += "  clip " + fixed(r.clip_coefficient, 3) + " (threshold " + fixed(r.clip_threshold, 3) +
            ")";
  }
  line += "  scale " + fixed(r.loss_scale, 0);
  const double tps = r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0;
  const double flops = r.seconds > 0 ? r.flops / r.seconds : 0.0;
  line += "  " + fixed(tps, 0) + " tok/s  " + fixed(flops / 1e9, 2) + " GFLOP/s";
  if (peak_flops > 0) line += "  MFU " + fixed(100.0 * flops / peak_flops, 1) + "%";
  line += "  mem " + train::format_bytes(r.peak_rss_bytes);
  if (r.peak_device_bytes > 0) line += " (gpu " + train::format_bytes(r.peak_device_bytes) + ")";
  line += "  skipped " + std::to_string(r.skipped_total) + "  " + fixed(r.seconds, 3) + " s";
  if (breakdown) {
    line += " (fwd+bwd " + fixed(r.forward_backward_seconds, 3) + " s, optimizer " +
            fixed(r.optimizer_seconds, 3) + " s)";
  }
  return line;
}

nlohmann::json log_record(const train::StepReport& r, double peak_flops) {
  const double flops = r.seconds > 0 ? r.flops / r.seconds : 0.0;
  auto number_or_null = [](double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
  };
  return {{"step", r.step},
          {"loss", number_or_null(r.loss)},
          {"lr", r.lr},
          {"grad_norm", number_or_null(r.grad_norm)},
          {"clip_coefficient", r.clip_coefficient},
          {"clip_threshold", r.clip_threshold},
          {"loss_scale", r.loss_scale},
          {"skipped", r.skipped},
          {"skipped_total", r.skipped_total},
          {"tokens", r.tokens},
          {"seconds", r.seconds},
          {"forward_backward_seconds", r.forward_backward_seconds},
          {"optimizer_seconds", r.optimizer_seconds},
          {"tokens_per_second", r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0},
          {"flops", r.flops},
          {"flops_per_second", flops},
          {"mfu", peak_flops > 0 ? nlohmann::json(flops / peak_flops) : nlohmann::json()},
          {"peak_rss_bytes", r.peak_rss_bytes},
          {"peak_device_bytes", r.peak_device_bytes}};
}

// Host memory of this machine (MemTotal of /proc/meminfo), 0 where unknown.
uint64_t host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

uint64_t gib(double g) {
  return static_cast<uint64_t>(g * static_cast<double>(uint64_t{1} << 30));
}

DType compute_dtype_for(Device device, train::Precision precision) {
  if (device == Device::kCpu) return DType::kF32;
  return precision == train::Precision::kBf16   ? DType::kBF16
         : precision == train::Precision::kFp16 ? DType::kF16
                                                : DType::kF32;
}

// The memory budgets a plan is held to: the flags, else what this machine has (a GPU's total
// less 1.5 GiB for the CUDA context; the host's less kHostReserveGib), else an H200's.
struct Budgets {
  uint64_t device = 0, host = 0;
  std::string device_source = "--device-memory-gib", host_source = "--host-memory-gib";
};
Budgets memory_budgets(const TrainArgs& a, Device device, int local_gpu) {
  Budgets b;
  b.device = gib(a.device_memory_gib);
  b.host = gib(a.host_memory_gib);
  if (b.device == 0) {
    uint64_t free = 0, total = 0;
    if (device == Device::kCuda && train::cuda_device_memory(local_gpu, &free, &total).ok()) {
      b.device = total - std::min(total, gib(1.5));
      b.device_source = "this GPU's memory less 1.5 GiB";
    } else {
      b.device = gib(kDefaultDeviceGib);
      b.device_source = "an H200's usable memory";
    }
  }
  if (b.host == 0) {
    const uint64_t total = host_memory_bytes();
    b.host = total - std::min(total, gib(kHostReserveGib));
    b.host_source = "this machine's memory less " + fixed(kHostReserveGib, 0) + " GiB";
  }
  if (device == Device::kCpu) b.device = 0;  // everything is host memory
  return b;
}

// The plan input of these settings, keeping the attention outputs of `kept_layers` layers.
train::PlanInput plan_input(const TrainArgs& a, const train::GptConfig& model,
                            const train::TrainConfig& config, Device device, int world,
                            int64_t kept_layers) {
  train::PlanInput in;
  in.model = model;
  in.world_size = world;
  in.zero = config.zero;
  in.sequence_parallel_size = config.sequence_parallel_size;
  in.sparse = config.sparse_attention;
  in.micro_batch = config.micro_batch_size;
  in.memory.checkpoint_layers = a.checkpoint_layers || config.activation_checkpointing;
  in.memory.offload_checkpoints = a.offload_checkpoints || config.cpu_checkpointing;
  in.memory.keep_attention_layers = kept_layers;
  in.memory.offload_attention_outputs = a.offload_attention_outputs;
  in.memory.mlp_tile_tokens = a.mlp_tile_tokens;
  in.memory.lm_head_tile_tokens = a.lm_head_tile_tokens;
  in.offload_optimizer = a.offload_optimizer || config.offload_optimizer;
  in.compute_dtype = compute_dtype_for(device, config.precision);
  in.device = device;
  in.token_chunk = a.token_chunk > 0         ? a.token_chunk
                   : device == Device::kCuda ? kCudaTokenChunk
                                             : kCpuTokenChunk;
  return in;
}

// --keep-attention-outputs (every layer) or --keep-attention-layers N | auto: the layers whose
// attention outputs are kept. auto: the most whose plan fits the budgets less kAutoKeepMarginGib
// of the device's (what the plan does not count: the allocator's rounding, libraries' own
// buffers); `why` says how the count was chosen.
int64_t kept_attention_layers(const TrainArgs& a, const train::GptConfig& model,
                              const train::TrainConfig& config, Device device, int world,
                              int local_gpu, std::string* why) {
  if (a.keep_attention_outputs && !a.keep_attention_layers.empty()) {
    fail(kExitBadInput,
         "give one of --keep-attention-outputs (every layer) and --keep-attention-layers");
  }
  if (a.keep_attention_outputs) return train::kAllLayers;
  if (a.keep_attention_layers.empty()) return 0;
  if (a.keep_attention_layers != "auto") {
    int64_t k = -1;
    try {
      size_t used = 0;
      k = std::stoll(a.keep_attention_layers, &used);
      if (used != a.keep_attention_layers.size()) k = -1;
    } catch (const std::exception&) {
      k = -1;
    }
    if (k < 0) {
      fail(kExitBadInput, "--keep-attention-layers " + a.keep_attention_layers +
                              ": give a number of layers >= 0 or auto");
    }
    return k;
  }
  Budgets b = memory_budgets(a, device, local_gpu);
  b.device -= std::min(b.device, gib(kAutoKeepMarginGib));
  int64_t k = 0;
  const train::PlanInput in = plan_input(a, model, config, device, world, 0);
  check(train::most_kept_attention_layers(in, b.device, b.host, &k));
  const std::string host = train::format_bytes(b.host) + " (" + b.host_source + ")";
  // Offloaded outputs grow host memory, not the device's: name both budgets then.
  const bool host_too = in.memory.offload_attention_outputs && in.memory.offload_checkpoints;
  *why = device == Device::kCuda
             ? "auto: the most the plan fits in " + train::format_bytes(b.device) + " (" +
                   b.device_source + ", less " + fixed(kAutoKeepMarginGib, 0) + " GiB)" +
                   (host_too ? " and " + host + " of host memory" : "")
             : "auto: the most the plan fits in " + host;
  return k;
}

// --plan: the memory arithmetic of this run's settings, then the longest sequence per technique.
void print_plan(const TrainArgs& a, const train::GptConfig& model, const train::TrainConfig& config,
                Device device, int world) {
  if (a.plan_granularity % config.sequence_parallel_size != 0) {
    fail(kExitBadInput, "--plan-granularity " + std::to_string(a.plan_granularity) +
                            " must be a multiple of sequence_parallel_size " +
                            std::to_string(config.sequence_parallel_size) +
                            " (each rank holds sequence_length / sequence_parallel_size tokens)");
  }
  std::string why;
  const train::PlanInput in =
      plan_input(a, model, config, device, world,
                 kept_attention_layers(a, model, config, device, world, 0, &why));
  const Budgets budgets = memory_budgets(a, device, 0);
  const uint64_t device_budget = budgets.device, host_budget = budgets.host;
  const std::string &device_source = budgets.device_source, &host_source = budgets.host_source;
  train::MemoryPlan plan;
  check(train::plan_training_memory(in, &plan));
  std::cout << "memory plan: GPT " << gpt_parameter_layout(model).parameter_count()
            << " parameters (d_model " << model.d_model << ", " << model.n_layers << " layers, "
            << model.n_heads << " heads, vocabulary " << model.vocab_size << "), "
            << model.sequence_length << " tokens x micro-batch " << in.micro_batch << ", "
            << dtype_name(in.compute_dtype) << " on " << device_name(device)
            << (world > 1 ? "; one of " + std::to_string(world) + " ranks, ZeRO stage " +
                                std::to_string(config.zero.stage)
                          : std::string())
            << (in.sequence_parallel_size > 1
                    ? ", sequence-parallel groups of " + std::to_string(in.sequence_parallel_size) +
                          " (" + std::to_string(model.sequence_length / in.sequence_parallel_size) +
                          " tokens of each sequence per rank)"
                    : std::string())
            << "\n"
            << (why.empty()
                    ? std::string()
                    : "attention outputs kept for " +
                          std::to_string(
                              std::min(in.memory.keep_attention_layers, model.n_layers)) +
                          " of " + std::to_string(model.n_layers) + " layers (" + why + ")\n")
            << "\n"
            << plan.ledger.report() << "\ntotal: " << device_name(device) << " "
            << train::format_bytes(plan.device_bytes) << " of "
            << train::format_bytes(device_budget) << " (" << device_source << "), host "
            << train::format_bytes(plan.host_bytes) << " of " << train::format_bytes(host_budget)
            << " (" << host_source << "): "
            << (train::plan_fits(plan, device == Device::kCpu ? 0 : device_budget, host_budget)
                    ? "fits"
                    : "does NOT fit")
            << "\n\nthe longest sequence per technique (multiples of " << a.plan_granularity
            << " tokens up to " << a.plan_max_tokens << "; micro-batch " << in.micro_batch
            << "; tiles of " << (a.mlp_tile_tokens > 0 ? a.mlp_tile_tokens : 16384) << " / "
            << (a.lm_head_tile_tokens > 0 ? a.lm_head_tile_tokens : 16384) << " tokens):\n";
  std::vector<train::PlanRow> rows;
  check(train::plan_techniques(in, device_budget, host_budget, a.plan_granularity,
                               a.plan_max_tokens, &rows));
  char line[256];
  std::snprintf(line, sizeof line, "  %-48s %12s %12s %12s\n", "techniques", "tokens",
                device == Device::kCpu ? "-" : "device", "host");
  std::cout << line;
  for (const train::PlanRow& r : rows) {
    std::snprintf(line, sizeof line, "  %-48s %12lld %12s %12s\n", r.techniques.c_str(),
                  static_cast<long long>(r.longest),
                  r.longest > 0 && device != Device::kCpu
                      ? train::format_bytes(r.plan.device_bytes).c_str()
                      : "-",
                  r.longest > 0 ? train::format_bytes(r.plan.host_bytes).c_str() : "-");
    std::cout << line;
  }
  if (const int64_t limit = train::sparse_layout_max_length(in);
      limit > 0 && limit < a.plan_max_tokens) {
    std::cout << "(sparse_attention: layouts of " << model.n_heads << " heads and block "
              << sparsity_common(*in.sparse).block << " are built up to " << limit
              << " tokens, kMaxLayoutEntries; a larger block goes further)\n";
  }
}

void run_train(const TrainArgs& a) {
  const Device device = a.device == "cuda" ? Device::kCuda : Device::kCpu;
  // Several ranks: this process is one of them when a launcher set RANK / WORLD_SIZE (torchrun,
  // srun, mpirun, or --nproc-per-node below); with --nproc-per-node and no such launcher it
  // starts the ranks and only waits for them.
  train::ProcessEnv ranks;
  check(train::read_process_env(&ranks));
  const bool launched_here = std::getenv(kLocalLaunchVariable) != nullptr;
  if (a.nproc_per_node > 1 && !a.plan && !launched_here) {
    if (ranks.world_size > 1) {
      fail(kExitBadInput,
           "--nproc-per-node starts ranks itself, but this process already is rank " +
               std::to_string(ranks.rank) + " of " + std::to_string(ranks.world_size) + " (" +
               ranks.source + " is set, by torchrun, srun or mpirun?): leave out --nproc-per-node");
    }
    const int code = launch_local_ranks(a.nproc_per_node);
    if (code != 0) throw CLI::RuntimeError(code);
    return;
  }
  // --plan plans one of --nproc-per-node ranks (ZeRO's shards and buffers, the sequence split of
  // sequence_parallel_size) and starts none.
  const int world = a.plan ? std::max(1, a.nproc_per_node) : ranks.world_size;
  if (world > 1 && !a.plan) {
    message_rank = ranks.rank;
    // One log: the other ranks' progress lines would repeat rank 0's (the loss, the norm and the
    // step are the group's). Their errors still go to stderr.
    if (ranks.rank != 0) std::cout.setstate(std::ios::badbit);
  }
  // One clear message at once when the GPU cannot be used (planning needs none).
  if (!a.plan) check(check_device_usable(device));
  // Inputs: the files, or the demo's built-in ones.
  std::string demo_data;
  train::GptConfig model;
  if (a.demo) {
    check(train::parse_gpt_config(kDemoModel, "(demo)", &model), kExitFailed);
    demo_data = write_demo_data();
  } else {
    std::string missing;
    if (a.config.empty()) missing += " --config";
    if (a.model.empty()) missing += " --model";
    if (a.data.empty() && !a.plan) missing += " --data";
    if (!missing.empty()) fail(kExitBadInput, "missing" + missing + " (or run --demo)");
    check(train::load_gpt_config(a.model, &model));
  }
  train::AutoValues autos;
  autos.device = device;
  autos.world_size = world;
  autos.micro_batch_size = a.micro_batch_size;
  autos.gradient_accumulation_steps = a.gradient_accumulation_steps;
  autos.lr = a.lr;
  autos.weight_decay = a.weight_decay;
  autos.gradient_clipping = a.gradient_clipping;
  autos.warmup_num_steps = a.warmup_steps;
  if (device == Device::kCuda) {
    // "auto" precision on a GPU: bf16 (no loss scale), as a bf16-capable GPU's trainer would.
    autos.bf16 = true;
    autos.fp16 = false;
  }
  if (a.steps > 0) autos.total_num_steps = a.steps;
  train::TrainConfig config;
  std::vector<std::string> warnings;
  if (a.demo) {
    check(
        train::parse_train_config(kDemoConfig, "(demo)", model.n_heads, autos, &config, &warnings),
        kExitFailed);
  } else {
    check(train::load_train_config(a.config, model.n_heads, autos, &config, &warnings));
  }
  if (ranks.rank == 0 || world == 1) {
    for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
  }
  if (a.plan) {
    print_plan(a, model, config, device, world);
    return;
  }
  int64_t steps = a.steps > 0 ? a.steps : a.demo ? kDemoSteps : 0;
  if (steps == 0) {
    if (config.schedule.total_num_steps > 0) {
      steps = config.schedule.total_num_steps;
    } else {
      fail(kExitBadInput, "give --steps (the scheduler has no total_num_steps to take it from)");
    }
  }
  if (a.save_every > 0 && a.save.empty()) fail(kExitBadInput, "--save-every needs --save PATH");

  std::unique_ptr<train::TokenFile> data;
  check(train::TokenFile::open(a.demo ? demo_data : a.data, &data));
  if (a.demo) std::filesystem::remove(demo_data);  // mapped: the file stays readable

  const DType compute = compute_dtype_for(device, config.precision);
  const int64_t token_chunk = a.token_chunk > 0         ? a.token_chunk
                              : device == Device::kCuda ? kCudaTokenChunk
                                                        : kCpuTokenChunk;
  train::TrainerOptions options;
  options.memory.checkpoint_layers = a.checkpoint_layers;
  options.memory.offload_checkpoints = a.offload_checkpoints;
  std::string keep_why;
  options.memory.keep_attention_layers = kept_attention_layers(
      a, model, config, device, world, world > 1 ? ranks.local_rank : 0, &keep_why);
  if (options.memory.keep_attention_layers > 0 && !a.checkpoint_layers && !a.offload_checkpoints &&
      !config.activation_checkpointing && (ranks.rank == 0 || world == 1)) {
    std::cerr << "warning: --keep-attention-outputs / --keep-attention-layers keep what "
                 "checkpointing would recompute; without checkpointing (--checkpoint-layers, or "
                 "the config's activation_checkpointing) every activation is kept already\n";
  }
  options.memory.offload_attention_outputs = a.offload_attention_outputs;
  if (a.offload_attention_outputs && (ranks.rank == 0 || world == 1) &&
      (options.memory.keep_attention_layers == 0 ||
       !(a.offload_checkpoints || config.cpu_checkpointing))) {
    std::cerr << "warning: --offload-attention-outputs moves kept attention outputs to host "
                 "memory with the checkpoints; it needs --offload-checkpoints (or the config's "
                 "cpu_checkpointing) and kept outputs (--keep-attention-outputs or "
                 "--keep-attention-layers), and does nothing here\n";
  }
  options.memory.mlp_tile_tokens = a.mlp_tile_tokens;
  options.memory.lm_head_tile_tokens = a.lm_head_tile_tokens;
  options.offload_optimizer = a.offload_optimizer;
  options.threads = a.threads;
  options.token_chunk = token_chunk;
  options.shuffle = !a.no_shuffle;
  options.data_seed = a.data_seed;
  double peak_tflops = a.peak_tflops;
  if (peak_tflops == 0 && device == Device::kCuda && compute != DType::kF32) {
    peak_tflops = kHopperPeakTflops;
  }
  options.peak_flops = peak_tflops * 1e12;
  options.dump_gradients_path = a.dump_gradients;
  options.inject_overflow_steps = a.inject_overflow;
  if (world > 1 && ranks.rank == a.fail_rank) {
    fail(kExitTestFailure, "--test-fail-rank " + std::to_string(a.fail_rank) + ": failing");
  }
  // The group's communicator (several ranks): NCCL on the GPU of this rank's LOCAL_RANK, on the
  // back end's stream; on the CPU the TCP test back end. It outlives the trainer.
  std::unique_ptr<train::Communicator> communicator;
  train::RendezvousOptions rendezvous;
  std::unique_ptr<train::Backend> backend;
  if (device == Device::kCuda) {
    train::CudaBackendOptions bo;
    bo.compute_dtype = compute;
    bo.token_chunk = token_chunk;
    bo.device = world > 1 ? ranks.local_rank : 0;
    std::unique_ptr<train::CudaBackend> cuda_backend;
    check(train::make_cuda_backend(bo, &cuda_backend));
    if (world > 1) {
      check(train::make_nccl_communicator(ranks, ranks.local_rank, cuda_backend->stream(),
                                          rendezvous, &communicator),
            kExitFailed);
    }
    backend = std::move(cuda_backend);
  } else {
    train::CpuBackendOptions bo;
    bo.threads = a.threads;
    bo.token_chunk = token_chunk;
    check(train::make_cpu_backend(bo, &backend));
    if (world > 1) {
      check(train::make_tcp_communicator(ranks, rendezvous, &communicator), kExitFailed);
    }
  }
  options.communicator = communicator.get();
  const std::string backend_text = backend->description();
  std::unique_ptr<train::Trainer> trainer;
  check(train::Trainer::create(model, config, options, std::move(backend), data.get(), &trainer));
  if (!a.resume.empty()) check(trainer->load_checkpoint(a.resume));

  train::GptModel& m = trainer->model();
  const train::MemoryOptions& mem = m.memory_options();
  const std::string precision =
      device == Device::kCpu
          ? "precision fp32 on the CPU (config: " +
                std::string(train::precision_name(config.precision)) + ")"
          : std::string("precision ") + train::precision_name(config.precision) + ": " +
                dtype_name(compute) + " weights and activations, fp32 master weights and gradients";
  std::cout << "sciattn train" << (a.demo ? " --demo (generated data)" : "") << ": GPT "
            << m.layout().parameter_count() << " parameters (d_model " << model.d_model << ", "
            << model.n_layers << " layers, " << model.n_heads << " heads, vocabulary "
            << model.vocab_size << ", " << train::position_encoding_name(model.positions)
            << " positions, " << (model.tie_embeddings ? "tied" : "untied") << " LM head)\n"
            << "  sequence " << model.sequence_length << " tokens; batch "
            << config.train_batch_size << " = micro " << config.micro_batch_size << " x "
            << config.gradient_accumulation_steps << " accumulation; "
            << config.train_batch_size * model.sequence_length << " tokens per step; "
            << data->header().num_tokens << " tokens in the data (" << trainer->data().num_samples()
            << " samples)\n"
            << "  attention: causal, block " << m.attention().block << ", "
            << fixed(100.0 * m.attention().density, 1) << "% of the causal blocks"
            << (config.sparse_attention
                    ? std::string(" (sparse_attention ") +
                          sparsity_mode_name(sparsity_mode(*config.sparse_attention)) + ")"
                    : std::string(" (dense)"))
            << "\n  memory: checkpointing "
            << (mem.offload_checkpoints ? "on, offloaded to host memory"
                : mem.checkpoint_layers ? "on"
                                        : "off")
            << (m.kept_attention_layers() > 0
                    ? ", attention outputs kept (" + std::to_string(m.kept_attention_layers()) +
                          " of " + std::to_string(model.n_layers) + " layers" +
                          (mem.offload_checkpoints && mem.offload_attention_outputs ? ", offloaded"
                                                                                    : "") +
                          (keep_why.empty() ? "" : "; " + keep_why) + ")"
                    : std::string())
            << ", MLP tiles "
            << (mem.mlp_tile_tokens > 0 ? std::to_string(mem.mlp_tile_tokens) : "off")
            << ", LM-head tiles "
            << (mem.lm_head_tile_tokens > 0 ? std::to_string(mem.lm_head_tile_tokens) : "off")
            << ", optimizer "
            << (trainer->optimizer_offloaded()
                    ? "offloaded (CPU AdamW, kernel " + train::cpu_adamw_isa() + ")"
                    : "on the " + std::string(device_name(device)))
            << "\n  " << backend_text << ", AdamW kernel " << train::cpu_adamw_isa() << "; "
            << precision << "\n"
            << "  FLOPs counted as 6 x " << m.layout().matmul_parameter_count()
            << " matrix parameters x tokens + attention on the layout's blocks; "
            << (peak_tflops > 0 ? "MFU against " + fixed(peak_tflops, 1) + " TFLOP/s" +
                                      (a.peak_tflops > 0 ? std::string()
                                                         : " (H100/H200 dense bf16; "
                                                           "--peak-tflops to change)")
                : device == Device::kCpu
                    ? std::string("the CPU's peak is unknown, so GFLOP/s, not MFU")
                    : std::string("no peak for fp32 on this GPU: --peak-tflops for MFU"))
            << "\n";
  if (a.memory) std::cout << "\nmemory ledger:\n" << trainer->ledger().report() << "\n";

  if (world > 1) {
    std::cout << "  " << world << " ranks (" << ranks.source << "), one process each, "
              << (device == Device::kCuda ? "NCCL" : "the TCP test communicator") << "; ZeRO stage "
              << config.zero.stage << "; rank 0 prints and writes the log\n";
  }
  std::ofstream log;
  if (!a.log.empty() && ranks.rank == 0) {
    log.open(a.log, std::ios::trunc);
    if (!log) fail(kExitBadInput, "cannot write the log \"" + a.log + "\"");
  }
  std::vector<double> plot_steps, plot_losses, losses;
  while (trainer->global_step() < steps) {
    train::StepReport r;
    check(trainer->step(&r), kExitFailed);
    losses.push_back(r.loss);
    if (!r.skipped) {
      plot_steps.push_back(static_cast<double>(r.step));
      plot_losses.push_back(r.loss);
    }
    if (r.step % config.steps_per_print == 0 || r.step == steps || r.skipped || r.step == 1) {
      std::cout << progress_line(r, steps, options.peak_flops, config.wall_clock_breakdown)
                << std::endl;
    }
    if (log.is_open()) log << log_record(r, options.peak_flops).dump() << "\n" << std::flush;
    if (a.save_every > 0 && r.step % a.save_every == 0) check(trainer->save_checkpoint(a.save));
  }
  check(trainer->finish_update(), kExitFailed);
  if (!a.save.empty()) {
    check(trainer->save_checkpoint(a.save));
    std::cout << "saved " << a.save << " at step " << trainer->global_step() << "\n";
  }
  if (!a.plot.empty() && !plot_losses.empty() && ranks.rank == 0) {
    check(train::write_loss_plot(a.plot, plot_steps, plot_losses));
    std::cout << "wrote " << a.plot << "\n";
  }
  if (a.memory) {
    std::cout << "peak resident memory: " << train::format_bytes(train::peak_resident_bytes());
    const uint64_t peak_device = trainer->backend().peak_device_bytes();
    if (peak_device > 0) {
      std::cout << "; peak device memory (the back end's allocations and scratch): "
                << train::format_bytes(peak_device) << " (the ledger's " << device_name(device)
                << " total: " << train::format_bytes(trainer->ledger().total(device)) << ")";
    }
    std::cout << "\n";
  }
  if (a.demo && losses.size() >= 10) {
    double first = 0, last = 0;
    for (size_t i = 0; i < 5; ++i) first += losses[i] / 5;
    for (size_t i = losses.size() - 5; i < losses.size(); ++i) last += losses[i] / 5;
    std::cout << "loss fell from " << fixed(first, 3) << " (first 5 steps) to " << fixed(last, 3)
              << " (last 5 steps); ln 64 = 4.159, the data's entropy is about ln 2 = 0.693\n";
    if (!(last < first - 0.5)) fail(kExitFailed, "the demo's loss did not fall");
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a GPT on the GPU (bf16 / fp16, fp32 master weights) or the CPU path from a\n"
      "DeepSpeed config, a model file and a token file (docs/training.md). `sciattn train\n"
      "--demo` trains a tiny model on generated data; `--plan` prints the memory arithmetic.");
  cmd->add_option("--config", a->config, "DeepSpeed config (JSON)")->check(CLI::ExistingFile);
  cmd->add_option("--model", a->model, "model file (JSON)")->check(CLI::ExistingFile);
  cmd->add_option("--data", a->data, "token file (from `sciattn data`)")->check(CLI::ExistingFile);
  cmd->add_flag("--demo", a->demo, "train a tiny model on generated data (seconds on 2 cores)");
  cmd->add_option("--steps", a->steps,
                  "train until this global step (default: the scheduler's total_num_steps); "
                  "also fills total_num_steps \"auto\"")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--resume", a->resume,
                  "continue from this checkpoint (a file, or the folder of a run on several ranks)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--save", a->save, "write a checkpoint here at the end (and with --save-every)");
  cmd->add_option("--save-every", a->save_every, "also save every N steps")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--log", a->log, "write one JSON record per step to this file");
  cmd->add_option("--plot", a->plot, "write a PNG of the loss curve at the end");
  cmd->add_flag("--memory", a->memory,
                "print the memory ledger (device and host, per phase) and the peaks");
  a->device = default_device_name();
  cmd->add_option("--device", a->device,
                  "where to train (default: cuda when a GPU and the CUDA build are present)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--plan", a->plan,
                "print the memory plan of these settings and the longest sequence each "
                "technique reaches, then exit (needs --config and --model, not --data)");
  cmd->add_option("--device-memory-gib", a->device_memory_gib,
                  "--plan: the device's budget (default: the GPU's memory less 1.5 GiB, or an "
                  "H200's 138 GiB without a GPU)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--host-memory-gib", a->host_memory_gib,
                  "--plan: the host's budget (default: this machine's memory less 8 GiB)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--plan-max-tokens", a->plan_max_tokens,
                  "--plan: the longest sequence searched (default 4M)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--plan-granularity", a->plan_granularity,
                  "--plan: sequence lengths searched are multiples of this (default 1024)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--nproc-per-node", a->nproc_per_node,
                  "start this many ranks on this machine (data parallel, one process each: NCCL "
                  "on GPUs LOCAL_RANK 0..N-1, the TCP test communicator on the CPU); under "
                  "torchrun / srun / mpirun leave it out, each process joins as the rank its "
                  "RANK / WORLD_SIZE say; with --plan: plan one of N ranks (ZeRO shards, the "
                  "sequence split of sequence_parallel_size)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--token-chunk", a->token_chunk,
                  "rows per matrix product over tokens (default 256 on the CPU, 4096 on a GPU, "
                  "where it must be a multiple of 8)")
      ->check(CLI::Range(1, 1 << 22));
  cmd->add_flag("--checkpoint-layers", a->checkpoint_layers,
                "per-layer activation checkpointing (also on when the config has an "
                "activation_checkpointing section)");
  cmd->add_flag("--offload-checkpoints", a->offload_checkpoints,
                "checkpointing with each layer's input in host memory, prefetched in reverse "
                "layer order (also activation_checkpointing.cpu_checkpointing)");
  cmd->add_flag("--keep-attention-outputs", a->keep_attention_outputs,
                "with checkpointing, keep each layer's attention output and log-sum-exp (on "
                "the device, [T, C] + [B, H, T] f32 a layer) so that the backward's "
                "recomputation skips the attention's forward");
  cmd->add_option("--keep-attention-layers", a->keep_attention_layers,
                  "the same for the last N layers only, or auto: as many as the memory plan "
                  "fits in the device budget (--device-memory-gib, default the GPU's memory "
                  "less 1.5 GiB) less 2 GiB");
  cmd->add_flag("--offload-attention-outputs", a->offload_attention_outputs,
                "with --offload-checkpoints, the kept attention outputs go to host memory too "
                "(copied out in the forward, back one kept layer ahead of the backward): two "
                "layers' of them on the device, the rest in host memory, which then bounds auto");
  cmd->add_flag("--offload-optimizer", a->offload_optimizer,
                "fp32 master weights and AdamW state in host memory, the CPU AdamW overlapping "
                "the next forward (also zero_optimization.offload_optimizer.device \"cpu\")");
  cmd->add_option("--mlp-tile-tokens", a->mlp_tile_tokens,
                  "run the MLP in tiles of this many tokens (0 = whole)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--lm-head-tile-tokens", a->lm_head_tile_tokens,
                  "run the LM head and cross-entropy in tiles of this many tokens (0 = whole)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--data-seed", a->data_seed, "seed of the per-epoch shuffle (default 1234)");
  cmd->add_flag("--no-shuffle", a->no_shuffle, "read the samples in file order");
  cmd->add_option("--peak-tflops", a->peak_tflops,
                  "the device's peak TFLOP/s, to report MFU (default on a GPU in bf16 / fp16: "
                  "989.4, the H100 / H200's; unknown on the CPU)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dump-gradients", a->dump_gradients,
                  "write the first step's parameters, gradients and tokens to this file");
  cmd->add_option("--test-fail-rank", a->fail_rank,
                  "testing: with several ranks, this rank exits (status 3) before it joins the "
                  "group, so that the others wait in the rendezvous")
      ->group("");  // hidden from --help
  cmd->add_option("--inject-overflow", a->inject_overflow,
                  "testing: make these steps' gradients overflow (adds an Inf)")
      ->group("");  // hidden from --help
  cmd->add_option(
         "--micro-batch-size", a->micro_batch_size,
         "train_micro_batch_size_per_gpu where the config writes \"auto\" or leaves it out")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gradient-accumulation-steps", a->gradient_accumulation_steps,
                  "gradient_accumulation_steps where the config writes \"auto\" or leaves it out")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--lr", a->lr,
                  "optimizer.params.lr where the config writes \"auto\" or leaves it out");
  cmd->add_option(
      "--weight-decay", a->weight_decay,
      "optimizer.params.weight_decay where the config writes \"auto\" or leaves it out");
  cmd->add_option("--warmup-steps", a->warmup_steps,
                  "scheduler.params.warmup_num_steps where the config writes \"auto\"");
  cmd->add_option("--gradient-clipping", a->gradient_clipping,
                  "gradient_clipping where the config writes \"auto\"");
  cmd->callback([a] { run_train(*a); });
}

}  // namespace sciattn::tools

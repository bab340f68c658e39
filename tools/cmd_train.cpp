// `sciattn train`: trains a GPT from a DeepSpeed config, a model file and a token file on the CPU
// path, printing a progress line per step, writing a JSON-lines log, checkpoints and a PNG of the
// loss; `--demo` does it all on generated data. Tools layer: the trainer's public API only.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/config.h"
#include "sciattn/train/data.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/plot.h"
#include "sciattn/train/random.h"
#include "sciattn/train/trainer.h"

namespace sciattn::tools {
namespace {

constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

struct TrainArgs {
  std::string config, model, data, resume, save, log, plot, dump_gradients;
  int64_t steps = 0;
  int64_t save_every = 0;
  bool memory = false;
  bool demo = false;
  bool checkpoint_layers = false;
  bool no_shuffle = false;
  int threads = 0;
  int64_t token_chunk = 256;
  int64_t mlp_tile_tokens = 0;
  int64_t lm_head_tile_tokens = 0;
  uint64_t data_seed = 1234;
  double peak_tflops = 0.0;
  std::vector<int64_t> inject_overflow;
  // "auto" fillers.
  std::optional<int64_t> micro_batch_size, gradient_accumulation_steps, warmup_steps;
  std::optional<double> lr, weight_decay, gradient_clipping;
};

[[noreturn]] void fail(int code, const std::string& message) {
  std::cerr << "sciattn train: " << message << "\n";
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
          {"peak_rss_bytes", r.peak_rss_bytes}};
}

void run_train(const TrainArgs& a) {
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
    if (a.data.empty()) missing += " --data";
    if (!missing.empty()) fail(kExitBadInput, "missing" + missing + " (or run --demo)");
    check(train::load_gpt_config(a.model, &model));
  }
  train::AutoValues autos;
  autos.micro_batch_size = a.micro_batch_size;
  autos.gradient_accumulation_steps = a.gradient_accumulation_steps;
  autos.lr = a.lr;
  autos.weight_decay = a.weight_decay;
  autos.gradient_clipping = a.gradient_clipping;
  autos.warmup_num_steps = a.warmup_steps;
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
  for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
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

  train::TrainerOptions options;
  options.memory.checkpoint_layers = a.checkpoint_layers;
  options.memory.mlp_tile_tokens = a.mlp_tile_tokens;
  options.memory.lm_head_tile_tokens = a.lm_head_tile_tokens;
  options.threads = a.threads;
  options.token_chunk = a.token_chunk;
  options.shuffle = !a.no_shuffle;
  options.data_seed = a.data_seed;
  options.peak_flops = a.peak_tflops * 1e12;
  options.dump_gradients_path = a.dump_gradients;
  options.inject_overflow_steps = a.inject_overflow;
  std::unique_ptr<train::Backend> backend;
  train::CpuBackendOptions bo;
  bo.threads = a.threads;
  bo.token_chunk = a.token_chunk;
  check(train::make_cpu_backend(bo, &backend));
  const std::string backend_text = backend->description();
  std::unique_ptr<train::Trainer> trainer;
  check(train::Trainer::create(model, config, options, std::move(backend), data.get(), &trainer));
  if (!a.resume.empty()) check(trainer->load_checkpoint(a.resume));

  train::GptModel& m = trainer->model();
  const train::MemoryOptions& mem = m.memory_options();
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
            << "\n  memory: checkpointing " << (mem.checkpoint_layers ? "on" : "off")
            << ", MLP tiles "
            << (mem.mlp_tile_tokens > 0 ? std::to_string(mem.mlp_tile_tokens) : "off")
            << ", LM-head tiles "
            << (mem.lm_head_tile_tokens > 0 ? std::to_string(mem.lm_head_tile_tokens) : "off")
            << "\n  " << backend_text << ", AdamW kernel " << train::cpu_adamw_isa()
            << "; precision fp32 on the CPU (config: " << train::precision_name(config.precision)
            << ")\n"
            << "  FLOPs counted as 6 x " << m.layout().matmul_parameter_count()
            << " matrix parameters x tokens + attention on the layout's blocks; "
            << (a.peak_tflops > 0 ? "MFU against " + fixed(a.peak_tflops, 2) + " TFLOP/s"
                                  : std::string("the CPU's peak is unknown, so GFLOP/s, not MFU"))
            << "\n";
  if (a.memory) std::cout << "\nmemory ledger:\n" << trainer->ledger().report() << "\n";

  std::ofstream log;
  if (!a.log.empty()) {
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
  if (!a.save.empty()) {
    check(trainer->save_checkpoint(a.save));
    std::cout << "saved " << a.save << " at step " << trainer->global_step() << "\n";
  }
  if (!a.plot.empty() && !plot_losses.empty()) {
    check(train::write_loss_plot(a.plot, plot_steps, plot_losses));
    std::cout << "wrote " << a.plot << "\n";
  }
  if (a.memory) {
    std::cout << "peak resident memory: " << train::format_bytes(train::peak_resident_bytes())
              << "\n";
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
      "Train a GPT on the CPU path from a DeepSpeed config, a model file and a token file\n"
      "(docs/training.md). `sciattn train --demo` trains a tiny model on generated data.");
  cmd->add_option("--config", a->config, "DeepSpeed config (JSON)")->check(CLI::ExistingFile);
  cmd->add_option("--model", a->model, "model file (JSON)")->check(CLI::ExistingFile);
  cmd->add_option("--data", a->data, "token file (from `sciattn data`)")->check(CLI::ExistingFile);
  cmd->add_flag("--demo", a->demo, "train a tiny model on generated data (seconds on 2 cores)");
  cmd->add_option("--steps", a->steps,
                  "train until this global step (default: the scheduler's total_num_steps); "
                  "also fills total_num_steps \"auto\"")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--resume", a->resume, "continue from this checkpoint")->check(CLI::ExistingFile);
  cmd->add_option("--save", a->save, "write a checkpoint here at the end (and with --save-every)");
  cmd->add_option("--save-every", a->save_every, "also save every N steps")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--log", a->log, "write one JSON record per step to this file");
  cmd->add_option("--plot", a->plot, "write a PNG of the loss curve at the end");
  cmd->add_flag("--memory", a->memory, "print the memory ledger and the peak resident memory");
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--token-chunk", a->token_chunk, "rows per BLAS call over tokens (default 256)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--checkpoint-layers", a->checkpoint_layers,
                "per-layer activation checkpointing (also on when the config has an "
                "activation_checkpointing section)");
  cmd->add_option("--mlp-tile-tokens", a->mlp_tile_tokens,
                  "run the MLP in tiles of this many tokens (0 = whole)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--lm-head-tile-tokens", a->lm_head_tile_tokens,
                  "run the LM head and cross-entropy in tiles of this many tokens (0 = whole)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--data-seed", a->data_seed, "seed of the per-epoch shuffle (default 1234)");
  cmd->add_flag("--no-shuffle", a->no_shuffle, "read the samples in file order");
  cmd->add_option("--peak-tflops", a->peak_tflops,
                  "the device's peak TFLOP/s, to report MFU (unknown by default on the CPU)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dump-gradients", a->dump_gradients,
                  "write the first step's parameters, gradients and tokens to this file");
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

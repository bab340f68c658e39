// `sciattn evoformer`: runs one Evoformer attention configuration and reports time, memory and
// error against the naive reference. Tools layer.
#include <iostream>
#include <string>

#include "commands.h"
#include "evoformer_runner.h"
#include "report.h"

namespace sciattn::tools {

void add_evoformer_command(CLI::App& app, const CommandOptions& options) {
  auto* cmd = app.add_subcommand(
      "evoformer",
      "Run Evoformer attention (DS4Sci_EvoformerAttention math) once on random inputs:\n"
      "Q, K, V [B, N, L, H, D], mask bias1 [B, N, 1, 1, L], pair bias2 [B, 1, H, L, L].\n"
      "Every size has a default (shown below): `sciattn evoformer` alone runs " +
          shape_of(EvoformerRunConfig{}) + ".");
  cmd->option_defaults()->always_capture_default();
  auto config = std::make_shared<EvoformerRunConfig>();
  auto dtype = std::make_shared<std::string>("f32");
  auto device = std::make_shared<std::string>(default_device_name());
  auto flags = std::make_shared<EvoformerFlags>();
  cmd->add_option("--batch,-b", config->batch, "B: batch size")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--n,-n", config->n, "N: the dimension that is not attended over")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--len,-l", config->len, "L: attended length")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--heads", config->heads, "H: heads")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--dim,-d", config->dim, "D: head dim")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--dtype", *dtype, "storage dtype")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_flag("--no-bias1", flags->no_bias1, "no mask bias");
  cmd->add_flag("--bool-mask", config->bool_mask, "pass bias1 as a boolean mask (true = attend)");
  cmd->add_flag("--no-bias2", flags->no_bias2, "no pair bias");
  cmd->add_flag("--transposed", config->transposed,
                "Q, K, V as strided views of a [B, L, N, H, D] tensor (triangle ending node)");
  cmd->add_flag("--backward", config->backward, "also run and time the backward");
  cmd->add_option("--device", *device,
                  "where to run (default: cuda when a GPU and the CUDA build are present)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--repeat", config->repeat, "timed calls (median reported)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--threads", config->threads,
                  "most CPU threads (0 = all; calls with little work use fewer)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--seed", config->seed, "random seed of the inputs")->check(unsigned_integer());
  cmd->add_option("--scale", flags->scale, "softmax scale (default 1/sqrt(D))")
      ->always_capture_default(false);
  cmd->add_flag("--no-check", flags->no_check, "skip the naive reference and the error check");
  cmd->add_flag("--json", flags->json, "print JSON instead of a table");
  cmd->callback([=] {
    config->dtype = *parse_dtype(*dtype);
    config->device = *device == "cuda" ? Device::kCuda : Device::kCpu;
    config->bias1 = !flags->no_bias1;
    config->bias2 = !flags->no_bias2;
    if (flags->scale) config->scale = *flags->scale;
    config->check = !flags->no_check;
    config->name = "evoformer";
    if (config->bool_mask && !config->bias1) {
      std::cerr << "error: --bool-mask needs bias1 (drop --no-bias1)\n";
      throw CLI::RuntimeError(2);
    }
    require_usable_device(config->device);
    if (config->check && reference_too_large(*config)) {
      std::cerr << "note: the naive reference would need " << reference_bytes(*config).to_string()
                << " for its score matrices; skipping the error check (use a smaller shape to "
                   "compare)\n";
      config->check = false;
    }
    const Status fits = check_evoformer_memory(*config);
    if (!fits.ok()) {
      std::cerr << "error: evoformer: " << fits.message() << "\n";
      throw CLI::RuntimeError(2);
    }
    if (options.check_only) return;
    const int code = report_runs({*config}, flags->json, std::cout, std::cerr);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace sciattn::tools

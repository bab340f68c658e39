// `sciattn demo`: the four Evoformer attention forms of OpenFold at a small size, forward and
// backward, against the naive reference, then a few block-sparse self-attention runs (BigBird,
// Fixed causal, BSLongformer) against the dense masked reference; on the GPU when present. Tools
// layer.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "evoformer_runner.h"
#include "report.h"
#include "sciattn/device.h"

namespace sciattn::tools {
namespace {

// OpenFold's uses of Evoformer attention (spec/evoformer.md), scaled down so that the naive
// reference's forward and backward finish in seconds on two cores.
std::vector<EvoformerRunConfig> demo_configs(DType dtype, int threads, Device device) {
  auto make = [&](const char* name, int64_t n, int64_t len, int64_t heads, bool bias2,
                  bool transposed) {
    EvoformerRunConfig c;
    c.name = name;
    c.batch = 1;
    c.n = n;
    c.len = len;
    c.heads = heads;
    c.dim = 32;
    c.dtype = dtype;
    c.bias1 = true;
    c.bias2 = bias2;
    c.transposed = transposed;
    c.backward = true;
    c.threads = threads;
    c.device = device;
    c.repeat = 3;
    c.seed = 2026;
    return c;
  };
  return {
      make("MSA row (pair bias)", 64, 128, 8, true, false),
      make("MSA column", 128, 64, 8, false, false),
      make("triangle start", 128, 128, 4, true, false),
      make("triangle end", 128, 128, 4, true, true),
  };
}

}  // namespace

void add_demo_command(CLI::App& app, const CommandOptions& options) {
  auto* cmd = app.add_subcommand(
      "demo",
      "Run the four Evoformer attention forms of OpenFold (MSA row with pair bias, MSA column,\n"
      "triangle start and end) at a small size, forward and backward, and compare each with the\n"
      "naive reference; then block-sparse self-attention (BigBird fused and composite, Fixed\n"
      "causal, BSLongformer with padding) at 512 tokens against the dense masked reference.");
  cmd->option_defaults()->always_capture_default();
  auto dtype = std::make_shared<std::string>("auto");
  auto device = std::make_shared<std::string>(default_device_name());
  auto threads = std::make_shared<int>(0);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--dtype", *dtype,
                  "storage dtype (auto: f32 on the CPU, bf16 on the GPU, whose tensor cores take "
                  "f16 and bf16)")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16"}));
  cmd->add_option("--device", *device,
                  "where to run (default: cuda when a GPU and the CUDA build are present)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", *threads,
                  "most CPU threads (0 = all; calls with little work use fewer)")
      ->check(CLI::Range(0, 4096));
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([=] {
    const Device where = *device == "cuda" ? Device::kCuda : Device::kCpu;
    require_usable_device(where);
    if (options.check_only) return;
    const std::string dtype_used = *dtype != "auto"         ? *dtype
                                   : where == Device::kCuda ? "bf16"
                                                            : "f32";
    if (!*json) {
      const std::string engine =
          where == Device::kCuda
              ? "on the GPU (" + cuda_device_description() + ")"
              : "on the CPU (" + (*threads > 0 ? std::to_string(*threads) : std::string("all")) +
                    " threads)";
      std::cout
          << "sciattn demo: Evoformer attention " << engine << ", " << dtype_used
          << " storage, fp32 math.\n"
          << "Each form runs forward and backward (dQ, dK, dV and the bias gradients) through "
          << (where == Device::kCuda ? "the CUDA kernels" : "the tiled path")
          << ", then through the naive reference on the CPU, which materialises every score "
             "matrix.\n'extra mem' is the whole workspace a call takes; 'max err' is the "
             "largest difference from the naive reference over every output, relative to its "
             "largest value.\n\n";
    }
    int code = report_runs(demo_configs(*parse_dtype(dtype_used), *threads, where), *json,
                           std::cout, std::cerr);
    // The block-sparse section is a second table; `demo --json` stays one JSON array (the
    // Evoformer runs) so that scripts reading it keep working.
    if (!*json)
      code = std::max(code, run_sparse_demo(false, where, *threads, std::cout, std::cerr));
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace sciattn::tools

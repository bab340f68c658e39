// Runs one Evoformer attention configuration on random inputs: the library's path, timed, and the
// naive reference for comparison. Tools layer (uses the public API only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "run_memory.h"
#include "run_support.h"
#include "sciattn/evoformer.h"

namespace sciattn::tools {

struct EvoformerRunConfig {
  std::string name = "evoformer";
  int64_t batch = 1, n = 32, len = 64, heads = 4, dim = 32;  // [B, N, L, H, D]
  DType dtype = DType::kF32;
  bool bias1 = true;        // the mask bias [B, N, 1, 1, L]
  bool bool_mask = false;   // pass bias1 as a boolean mask instead of 1e9 * (mask - 1)
  bool bias2 = true;        // the pair / triangle bias [B, 1, H, L, L]
  bool transposed = false;  // Q, K, V as views of a [B, L, N, H, D] tensor (triangle ending node)
  bool backward = false;
  Device device = Device::kCpu;
  int repeat = 3;   // timed calls; the median is reported
  int threads = 0;  // 0 = all hardware threads
  uint64_t seed = 0;
  std::optional<float> scale;
  bool check = true;  // also run the naive reference and compare
};

// Times, extra memory and errors (see run_support.h).
struct EvoformerRunResult : RunMeasurements {};

// What a run allocates, added up before it allocates anything: on the host its inputs, outputs,
// the reference's outputs and workspace (when it checks) and, on the CPU, the library's workspace;
// on the GPU the device copies of the tensors and the library's workspace there.
struct EvoformerRunMemory {
  ByteCount host, device;
};

// The score matrices the naive reference materialises ([B, N, H, L, L] in fp32, twice for the
// backward): what decides whether a run is checked against it.
ByteCount reference_bytes(const EvoformerRunConfig& config);
// True when those are more than a comparison is worth (2 GiB).
bool reference_too_large(const EvoformerRunConfig& config);

// The run's memory, with the library's workspace_size() asked on views that are never touched
// (run_memory.h's ViewPlanner). Fails with the library's message when it rejects the run's
// Params (nothing is allocated then either).
Status estimate_evoformer_memory(const EvoformerRunConfig& config, EvoformerRunMemory* memory);

// OK when the run fits in the host memory (and on the GPU, the device memory) that is available;
// otherwise a message saying how much the run needs and how much there is.
Status check_evoformer_memory(const EvoformerRunConfig& config);

// Runs the configuration; on failure returns the library's Status unchanged.
Status run_evoformer_config(const EvoformerRunConfig& config, EvoformerRunResult* result);

// "[1, 32, 64, 4, 32]".
std::string shape_of(const EvoformerRunConfig& config);

nlohmann::json to_json(const EvoformerRunConfig& config, const EvoformerRunResult& result);

}  // namespace sciattn::tools

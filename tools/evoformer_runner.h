// Runs one Evoformer attention configuration on random inputs: the library's path, timed, and the
// naive reference for comparison. Tools layer (uses the public API only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

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

// Runs the configuration; on failure returns the library's Status unchanged.
Status run_evoformer_config(const EvoformerRunConfig& config, EvoformerRunResult* result);

// "[1, 32, 64, 4, 32]".
std::string shape_of(const EvoformerRunConfig& config);

nlohmann::json to_json(const EvoformerRunConfig& config, const EvoformerRunResult& result);

}  // namespace sciattn::tools

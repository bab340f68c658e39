// Which kernels the CUDA dispatch may choose, from the environment variable SCIATTN_CUDA_KERNELS:
// "auto" (or unset, or empty) lets it take the fastest kernels the GPU and the build have (the
// warpgroup kernels on sm_90a), "portable" keeps it to the mma.sync kernels every supported
// architecture runs (sm_80 and newer), so that the Ampere/Ada path can be tested on a Hopper GPU,
// and "portable-99k" also keeps each launch within 99 KiB of shared memory per block, as on
// sm_86 and sm_89 (the one-stage kernels where two stages do not fit). Host-only C++ of the CUDA
// layer (tested on the CPU).
#pragma once

#include <string>

#include "sciattn/status.h"

namespace sciattn::cuda {

enum class KernelPath { kAuto, kPortable, kPortable99k };

inline constexpr const char* kKernelPathVariable = "SCIATTN_CUDA_KERNELS";
// The shared memory per block of sm_86 and sm_89 (99 KiB), which portable-99k keeps to.
inline constexpr int kSmem99k = 101376;

// The path `value` (the variable's value, nullptr when unset) asks for, or an error naming the
// variable, the value and the accepted ones.
inline Status kernel_path_of(const char* value, KernelPath* out) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") {
    *out = KernelPath::kAuto;
  } else if (v == "portable") {
    *out = KernelPath::kPortable;
  } else if (v == "portable-99k") {
    *out = KernelPath::kPortable99k;
  } else {
    return Status::invalid_argument(
        std::string(kKernelPathVariable) + " is '" + v +
        "'; accepted: auto (the fastest kernels this GPU and build have), portable (the "
        "mma.sync kernels of every architecture from sm_80) or portable-99k (those within 99 KiB "
        "of shared memory per block, as on sm_86 and sm_89)");
  }
  return Status::ok_status();
}

}  // namespace sciattn::cuda

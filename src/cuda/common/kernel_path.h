// Which kernels the CUDA dispatch may choose, from the environment variable SCIATTN_CUDA_KERNELS:
// "auto" (or unset, or empty) lets it take the fastest kernels the GPU and the build have (the
// warpgroup kernels on sm_90a), "portable" keeps it to the mma.sync kernels every supported
// architecture runs (sm_80 and newer), so that the Ampere/Ada path can be tested on a Hopper GPU.
// Host-only C++ of the CUDA layer (tested on the CPU).
#pragma once

#include <string>

#include "sciattn/status.h"

namespace sciattn::cuda {

enum class KernelPath { kAuto, kPortable };

inline constexpr const char* kKernelPathVariable = "SCIATTN_CUDA_KERNELS";

// The path `value` (the variable's value, nullptr when unset) asks for, or an error naming the
// variable, the value and the accepted ones.
inline Status kernel_path_of(const char* value, KernelPath* out) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") {
    *out = KernelPath::kAuto;
  } else if (v == "portable") {
    *out = KernelPath::kPortable;
  } else {
    return Status::invalid_argument(
        std::string(kKernelPathVariable) + " is '" + v +
        "'; accepted: auto (the fastest kernels this GPU and build have) or portable (the "
        "mma.sync kernels of every architecture from sm_80)");
  }
  return Status::ok_status();
}

}  // namespace sciattn::cuda

// The kernels this build can run on the current device: the device's compute capability against
// the architectures the build compiled (SCIATTN_CUDA_ARCHS), and whether the warpgroup kernels
// (sm_90a only) may run there. Every CUDA dispatch asks before it launches (on_device_of), so an
// unsupported GPU gets one clear error instead of a failed launch. CUDA layer (host code).
#pragma once

#include <string>

#include "sciattn/status.h"

namespace sciattn::cuda {

struct DeviceKernels {
  int major = 0, minor = 0;  // the device's compute capability
  // The architecture of the code the runtime runs on this device (cudaFuncAttributes'
  // binaryVersion and ptxVersion, e.g. 90 and 90 for sm_90a code, 90 and 80 for compute_80 PTX
  // compiled for a Hopper GPU by the driver).
  int binary_arch = 0, ptx_arch = 0;
  // The sm_90a kernels are in that code and SCIATTN_CUDA_KERNELS does not ask for the portable
  // ones (kernel_path.h).
  bool warpgroup_mma = false;
  // Bytes of shared memory a block may use: the device's opt-in limit (227 KiB on sm_90, 163 on
  // sm_80, 99 on sm_86 and sm_89), at most 99 KiB under SCIATTN_CUDA_KERNELS=portable-99k.
  int smem_limit = 0;
  std::string name;  // the device's name, for messages
};

// The kernels for the current device (the device part decided once per device, the environment
// variable read at each call). Errors: not_supported naming the device and its capability when it
// is older than sm_80 or when the build has no code that runs on it (with the architectures the
// build has and how to rebuild); invalid_argument for a bad SCIATTN_CUDA_KERNELS.
Status current_device_kernels(DeviceKernels* out);

}  // namespace sciattn::cuda

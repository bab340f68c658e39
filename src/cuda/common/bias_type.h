// The storage type of an optional bias or mask tensor as the kernels of both families read it (a
// code per launch, uniform across threads, so a switch on it never diverges). CUDA layer; plain
// C++ so that host code fills the kernels' arguments without device headers.
#pragma once

namespace sciattn::cuda {

enum class BiasType : int { kNone = 0, kF32 = 1, kF16 = 2, kBF16 = 3, kBool = 4 };

}  // namespace sciattn::cuda

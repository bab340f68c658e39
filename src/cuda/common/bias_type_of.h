// The kernels' storage-type code (BiasType) of an optional bias or mask tensor, shared by the
// Evoformer and block-sparse dispatch (and the kernel emulator). Host-only C++ of the CUDA layer.
#pragma once

#include "cuda/common/bias_type.h"
#include "sciattn/tensor_view.h"

namespace sciattn::cuda {

inline BiasType bias_type_of(const TensorView& t) {
  if (!t.present()) return BiasType::kNone;
  switch (t.dtype) {
    case DType::kF32:
      return BiasType::kF32;
    case DType::kF16:
      return BiasType::kF16;
    case DType::kBF16:
      return BiasType::kBF16;
    case DType::kBool:
      return BiasType::kBool;
  }
  return BiasType::kNone;
}

}  // namespace sciattn::cuda

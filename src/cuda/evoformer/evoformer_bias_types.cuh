// The bias types an Evoformer kernel instantiation is compiled for. FixedBiasTypes names them at
// compile time, for the pairs users pass most (a mask and a pair bias in the inputs' dtype, or the
// mask alone): the loop then carries no branch on a bias type and its code is the one path taken
// (with every type's path the forward's loop was 2,882 instructions, and its warps stalled on
// instruction fetch in 22% of the profiler's samples). ParamBiasTypes reads them from the
// parameters, for every other pair. Both are read the same way (types.bias1, types.bias2), so a
// kernel body serves both. CUDA layer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

template <BiasType kBias1, BiasType kBias2>
struct FixedBiasTypes {
  static constexpr BiasType bias1 = kBias1, bias2 = kBias2;
  static constexpr bool kAnyDim = false;
  __host__ __device__ __forceinline__ explicit FixedBiasTypes(const EvoformerDeviceParams&) {}
};

struct ParamBiasTypes {
  BiasType bias1, bias2;
  static constexpr bool kAnyDim = false;
  __host__ __device__ __forceinline__ explicit ParamBiasTypes(const EvoformerDeviceParams& p)
      : bias1(p.bias1_type), bias2(p.bias2_type) {}
};

// The warpgroup kernels for any head dim D below the instantiated one, or rows that are not
// 16-byte aligned in whole chunks (p.any_dim_tiles): every tile through the generic copies that
// zero-fill the columns past D and copy in pieces of p.granule bytes, bias types from the
// parameters. Its own instantiation, so that the usual tiles' code is untouched by it (run-time
// tests of D in the shared code made the backward 4-13% slower on the aligned shapes).
struct AnyDimTypes : ParamBiasTypes {
  static constexpr bool kAnyDim = true;
  __host__ __device__ __forceinline__ explicit AnyDimTypes(const EvoformerDeviceParams& p)
      : ParamBiasTypes(p) {}
};

// The 16-bit bias type of the inputs' element type T.
template <typename T>
constexpr BiasType kBiasTypeOf = std::is_same_v<T, __half> ? BiasType::kF16 : BiasType::kBF16;

// Calls launch(types) with AnyDimTypes for tiles that need them (p.any_dim_tiles), else with the
// FixedBiasTypes of the call's pair where one is compiled (bias1 in T's type or absent, bias2 in
// T's type or absent), else with ParamBiasTypes: the one place a launcher maps the run-time bias
// types and tile shape to an instantiation.
template <typename T, typename Launch>
auto with_bias_types(const EvoformerDeviceParams& p, const Launch& launch) {
  if (p.any_dim_tiles) return launch(AnyDimTypes{p});
  constexpr BiasType kT = kBiasTypeOf<T>, kNone = BiasType::kNone;
  const bool bias1_t = p.bias1_type == kT, bias1_none = p.bias1_type == kNone;
  if (bias1_t && p.bias2_type == kT) return launch(FixedBiasTypes<kT, kT>{p});
  if (bias1_t && p.bias2_type == kNone) return launch(FixedBiasTypes<kT, kNone>{p});
  if (bias1_none && p.bias2_type == kT) return launch(FixedBiasTypes<kNone, kT>{p});
  if (bias1_none && p.bias2_type == kNone) return launch(FixedBiasTypes<kNone, kNone>{p});
  return launch(ParamBiasTypes{p});
}

}  // namespace sciattn::cuda

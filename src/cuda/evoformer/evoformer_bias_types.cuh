// The bias types an Evoformer kernel instantiation is compiled for. FixedBiasTypes names them at
// compile time, for the pairs users pass most (a mask and a pair bias in the inputs' dtype, or the
// mask alone): the loop then carries no branch on a bias type and its code is the one path taken
// (with every type's path the forward's loop was 2,882 instructions, and its warps stalled on
// instruction fetch in 22% of the profiler's samples). ParamBiasTypes reads them from the
// parameters, for every other pair. Both are read the same way (types.bias1, types.bias2), so a
// kernel body serves both. Each also names how its tiles hold a row of D elements (kCols,
// TileCols of cuda/common/wgmma_tiles.cuh): the head dim itself, or a D padded to it in whole
// chunks. CUDA layer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/common/wgmma_tiles.cuh"
#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

template <BiasType kBias1, BiasType kBias2, TileCols kTileCols = TileCols::kExact>
struct FixedBiasTypes {
  static constexpr BiasType bias1 = kBias1, bias2 = kBias2;
  static constexpr TileCols kCols = kTileCols;
  // D may be below the head dim: columns past D are zero in the tiles and never stored.
  static constexpr bool kAnyDim = kTileCols != TileCols::kExact;
  __host__ __device__ __forceinline__ explicit FixedBiasTypes(const EvoformerDeviceParams&) {}
};

// The D a warpgroup kernel writes its output rows at: the head dim on the exact tiles (a
// constant, so that store_rows' column test folds away), p.dim on the padded ones.
template <int kHeadDim, typename BiasTypes>
__device__ __forceinline__ int64_t written_dim(const EvoformerDeviceParams& p) {
  if constexpr (BiasTypes::kCols == TileCols::kExact) {
    return kHeadDim;
  } else {
    return p.dim;
  }
}

struct ParamBiasTypes {
  BiasType bias1, bias2;
  static constexpr TileCols kCols = TileCols::kExact;
  static constexpr bool kAnyDim = false;
  __host__ __device__ __forceinline__ explicit ParamBiasTypes(const EvoformerDeviceParams& p)
      : bias1(p.bias1_type), bias2(p.bias2_type) {}
};

// The warpgroup kernels for a D below the instantiated head dim, read in whole 16-byte chunks
// from rows 16-byte aligned (p.load_dim columns: 24, 40, 48, 56, 72-120, or any other D's staged
// copy; p.padded_tiles), for the bias pairs FixedBiasTypes compiles: the exact head dim's copies
// and per-thread streams, each thread's chunk past load_dim zero-filled (a source size of 0,
// fixed per thread), so a whole tile costs what it costs at the head dim; the stores and delta
// stop at D in any alignment. Other bias pairs with such a D run the mma.sync kernels
// (set_warpgroup_tiles).
template <BiasType kBias1, BiasType kBias2>
using PaddedDimTypes = FixedBiasTypes<kBias1, kBias2, TileCols::kPadded>;

// The warpgroup forward for a D near the head dim whose Q, K and V rows are read where they are,
// in 4-byte pieces (p.in_place_tiles: rows on 4-byte boundaries, or an odd D in shifted slices;
// TileCols::kPieces), for the bias pairs FixedBiasTypes compiles. The forward only: its copies are
// four instructions per chunk, which the backward kernels, copying each tile many times, do not
// repay (they read the staged copies).
template <BiasType kBias1, BiasType kBias2>
using InPlaceDimTypes = FixedBiasTypes<kBias1, kBias2, TileCols::kPieces>;

// The 16-bit bias type of the inputs' element type T.
template <typename T>
constexpr BiasType kBiasTypeOf = std::is_same_v<T, __half> ? BiasType::kF16 : BiasType::kBF16;

// Calls launch(types) with the FixedBiasTypes of the call's pair where one is compiled (bias1 in
// T's type or absent, bias2 in T's type or absent; as PaddedDimTypes for p.padded_tiles and, in
// the forward (kForward), as InPlaceDimTypes for p.in_place_tiles), else with ParamBiasTypes: the
// one place a launcher maps the run-time bias types and tile shape to an instantiation.
template <typename T, bool kForward = false, typename Launch>
auto with_bias_types(const EvoformerDeviceParams& p, const Launch& launch) {
  constexpr BiasType kT = kBiasTypeOf<T>, kNone = BiasType::kNone;
  const bool bias1_t = p.bias1_type == kT, bias1_none = p.bias1_type == kNone;
  const auto fixed = [&](auto exact) {
    using Exact = decltype(exact);
    if constexpr (kForward) {
      if (p.in_place_tiles) return launch(InPlaceDimTypes<Exact::bias1, Exact::bias2>{p});
    }
    if (p.padded_tiles) return launch(PaddedDimTypes<Exact::bias1, Exact::bias2>{p});
    return launch(exact);
  };
  if (bias1_t && p.bias2_type == kT) return fixed(FixedBiasTypes<kT, kT>{p});
  if (bias1_t && p.bias2_type == kNone) return fixed(FixedBiasTypes<kT, kNone>{p});
  if (bias1_none && p.bias2_type == kT) return fixed(FixedBiasTypes<kNone, kT>{p});
  if (bias1_none && p.bias2_type == kNone) return fixed(FixedBiasTypes<kNone, kNone>{p});
  return launch(ParamBiasTypes{p});
}

}  // namespace sciattn::cuda

// The 1-D grid of the Evoformer kernels that own one (64-row tile, h, b*n), decoded into those
// coordinates. CUDA layer (Evoformer kernels).
#pragma once

#include <cstdint>

#include "cuda/common/fast_divisor.h"
#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

// The 1-D grid of the per-(64-row tile, h, b*n) kernels (forward, dK/dV, dQ), decoded (so that
// B*N is not bounded by a grid dimension's 65535): tile fastest, then h, then b*n. Multiply-high
// divisions of the block index by launch constants: the coordinates and the addresses derived
// from them stay in the uniform datapath.
struct TileHeadSlice {
  int64_t tile, h, b, n, bn;
};

// The same with the 32-bit divide sequence instead of multiply-high, for a kernel where ptxas
// allocates registers better that way (the dK/dV kernel at head dim 32).
__device__ __forceinline__ TileHeadSlice
decode_tile_head_slice_by_division(uint32_t block, const EvoformerDeviceParams& p) {
  const uint32_t tiles = p.tiles64_div.divisor, heads = p.heads_div.divisor, n = p.n_div.divisor;
  const uint32_t rest = block / tiles, bn = rest / heads;
  return {block % tiles, rest % heads, bn / n, bn % n, bn};
}

__device__ __forceinline__ TileHeadSlice decode_tile_head_slice(uint32_t block,
                                                                const EvoformerDeviceParams& p) {
  const QuotientRemainder by_tile = fast_divmod(block, p.tiles64_div);
  const QuotientRemainder by_head = fast_divmod(by_tile.quotient, p.heads_div);
  const QuotientRemainder by_n = fast_divmod(by_head.quotient, p.n_div);
  return {by_tile.remainder, by_head.remainder, by_n.quotient, by_n.remainder, by_head.quotient};
}

}  // namespace sciattn::cuda

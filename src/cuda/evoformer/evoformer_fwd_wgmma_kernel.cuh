// The Evoformer attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), for head dims 32, 64
// and 128 with aligned Q/K/V/O (the host's wgmma_tiles). The grid, the bias stages, the online
// softmax and the epilogue are evoformer_fwd_kernel's (shared helpers); what differs is how the
// two products run: the four warps issue them together as one warpgroup, S = Q K^T as
// head dim / 16 m64n64k16 steps reading Q and K straight from swizzled shared tiles,
// and O += P V as four m64nDk16 steps with P from registers, instead of per-warp mma.sync m16n8k16
// with ldmatrix fragment loads. Any L: the tiles' rows past L are zero-filled, and the last key
// tile's keys past L are masked as in the mma.sync kernel. CUDA layer.
#pragma once

#include "cuda/evoformer/evoformer_fwd_kernel.cuh"
#include "cuda/evoformer/evoformer_wgmma_tiles.cuh"

namespace sciattn::cuda {

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kWgmmaThreads, kEvoformerWgmmaFwdCtas<kHeadDim>)
    evoformer_fwd_wgmma_kernel(const EvoformerDeviceParams p) {
  using Smem = EvoformerWgmmaSmem<kHeadDim>;
  constexpr int kOutTiles = kHeadDim / 8;
  static_assert(EvoformerFwdTile::kBlockM == kWgmmaRows &&
                    EvoformerFwdTile::kBlockN == kWgmmaRows &&
                    EvoformerFwdTile::kThreads == kWgmmaThreads,
                "the mma.sync kernel's grid and bias stages");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const uint32_t q_tile = smem.address + Smem::kQ;

  const TileHeadSlice at = decode_tile_head_slice(blockIdx.x, p);
  const int64_t h = at.h, b = at.b, n = at.n, bn = at.bn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const int64_t row0 = at.tile * kWgmmaRows;
  const int64_t my_rows[2] = {row0 + warp * 16 + lane / 4, row0 + warp * 16 + lane / 4 + 8};
  const int64_t tiles = (p.len + kWgmmaRows - 1) / kWgmmaRows;

  const EvoformerKeyTileLoader<T, kHeadDim> keys(p, b, n, h, row0, smem.address + Smem::kK,
                                                 smem.address + Smem::kV,
                                                 smem.pointer + Smem::kFwdBytes);
  auto load_key_tile = [&](int64_t tile, int buf) { keys.load(p, tile, buf); };

  copy_slice_swizzled<T, kHeadDim>(q_tile, slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h),
                                   row0, p.len);
  load_key_tile(0, 0);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;

  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int buf = static_cast<int>(tile & 1);
    next_stage(tile, tiles, buf, load_key_tile);
    // S = Q K^T runs while the tile's biases are read from their stages.
    float dot[8][4];
    wgmma_tile_nt_issue<T, kHeadDim>(dot, q_tile, keys.k_tile(buf));
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    add_staged_biases(s, keys.bias1_stage(buf), p.bias1_type, keys.bias2_stage(buf), p.bias2_type,
                      warp * 16, lane);
    wgmma_tile_done<0>(dot);
    evoformer_softmax_tile<kOutTiles>(s, dot, scale_log2, tile * kWgmmaRows, p.len, t, row_max,
                                      row_sum, o_acc);
    wgmma_acc_tile<T, kHeadDim>(o_acc, s, keys.v_tile(buf));  // O += P V
  }

  evoformer_finish_forward<T, kHeadDim>(p, o_acc, row_max, row_sum, b, n, h, bn, my_rows, t);
}

}  // namespace sciattn::cuda

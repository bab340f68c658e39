// The Evoformer attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), for head dims 32, 64
// and 128 (and every D padded to them: PaddedDimTypes, or read in place near the head dim:
// InPlaceDimTypes, whose shifted slices' column 0 this kernel zeroes) (the host's wgmma_tiles). The
// grid, the bias stages, the online softmax and the epilogue are evoformer_fwd_kernel's (shared
// helpers); what differs is how the two products run: the four warps issue them together as one
// warpgroup, S = Q K^T as head dim / 16 m64n64k16 steps reading Q and K straight from swizzled
// shared tiles, and O
// += P V as four m64nDk16 steps with P from registers, instead of per-warp mma.sync m16n8k16 with
// ldmatrix fragment loads. Any L: the tiles' rows past L are zero-filled, and the last key tile's
// keys past L are masked by -inf in bias1's row where there is a bias1, else as in the mma.sync
// kernel. Biases: bias2 through its stages; bias1, one
// value per key, into registers with the tile's copies and, converted to log2 units, into a
// 64-float row per buffer, so that a step reads its keys' bias1 with no conversion. Each BiasTypes
// (evoformer_bias_types.cuh) is an instantiation. CUDA layer.
#pragma once

#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/evoformer/evoformer_bias_types.cuh"
#include "cuda/evoformer/evoformer_fwd_kernel.cuh"
#include "cuda/evoformer/evoformer_wgmma_tiles.cuh"

namespace sciattn::cuda {

// Shared memory of the forward for the call's biases: the tiles, bias2's two stages, bias1's two
// rows of 64 floats, and 1024 bytes for the base's rounding.
template <int kHeadDim>
inline size_t evoformer_fwd_wgmma_smem(const EvoformerDeviceParams& p) {
  return EvoformerWgmmaSmem<kHeadDim>::kFwdBytes + 1024 +
         2 * static_cast<size_t>(bias_stage_bytes(p.bias2_type, kWgmmaRows)) +
         (p.bias1_type != BiasType::kNone ? 2 * kWgmmaRows * sizeof(float) : 0);
}

template <typename T, int kHeadDim, typename BiasTypes>
__global__ void __launch_bounds__(kWgmmaThreads, kEvoformerWgmmaFwdCtas<kHeadDim>)
    evoformer_fwd_wgmma_kernel(const EvoformerDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  enter_overlapped_grid();
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

  const BiasTypes types(p);
  EvoformerKeyTileLoader<T, kHeadDim, false, BiasTypes::kCols> keys(
      p, b, n, h, row0, smem.address + Smem::kK, smem.address + Smem::kV,
      smem.pointer + Smem::kFwdBytes, types.bias1, types.bias2);
  // bias1 of the key tile's 64 keys in log2 units (buffer buf at bias1_log2 + 64 buf, after
  // bias2's stages): thread x < 64 loads key x's bits with the tile's copies, a step ahead, and
  // stores the converted value between that step's wait and its barrier (next_stage's `arrived`).
  // Keys past L get -inf there, which masks them in the last tile with no test per score.
  const bool has_bias1 = types.bias1 != BiasType::kNone;
  const bool loads_bias1 = has_bias1 && threadIdx.x < kWgmmaRows;
  float* const bias1_log2 = reinterpret_cast<float*>(keys.bias1_stages);
  int64_t bias1_at = b * p.bias1_stride[0] + n * p.bias1_stride[1] +
                     static_cast<int64_t>(threadIdx.x) * p.bias1_stride[2];
  const int64_t bias1_advance = kWgmmaRows * p.bias1_stride[2];
  uint32_t bias1_bits = 0;
  auto load_key_tile = [&](int64_t tile, int buf) {  // tiles 0, 1, 2, ... in order
    keys.load_next(p, tile, buf);
    if (loads_bias1) {
      bias1_bits = tile * kWgmmaRows + threadIdx.x < p.len
                       ? load_bias_bits(p.bias1, types.bias1, bias1_at)
                       : masking_bias_bits(types.bias1);
      bias1_at += bias1_advance;
    }
  };
  auto store_bias1 = [&](int buf) {
    if (loads_bias1) {
      bias1_log2[buf * kWgmmaRows + threadIdx.x] = kLog2e * bias_from_bits(bias1_bits, types.bias1);
    }
  };

  constexpr bool kInPlace = BiasTypes::kCols == TileCols::kPieces;
  const SliceSource q_src =
      evoformer_slice_of<BiasTypes::kCols>(p.q, p.q_stride, p.vec_q, p, b, n, h);
  copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(q_tile, q_src, row0, p);
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
    next_stage(tile, tiles, buf, load_key_tile, [&](int arrived) {
      store_bias1(arrived);
      if constexpr (kInPlace) {
        // Shifted slices: column 0 of Q and K holds the element before each row (another head's,
        // perhaps not finite), zeroed before S = Q K^T reads it. V's column 0 reaches only O's
        // column 0, which is not stored.
        if (q_src.shift != 0) {
          zero_first_column_swizzled<kHeadDim>(smem.pointer + Smem::kK +
                                               arrived * Smem::kTileBytes);
          if (tile == 0) zero_first_column_swizzled<kHeadDim>(smem.pointer + Smem::kQ);
        }
      }
    });
    // S = Q K^T runs while the tile's biases are read.
    float dot[8][4];
    wgmma_tile_nt_issue<T, kHeadDim>(dot, q_tile, keys.k_tile(buf));
    float s[8][4];
    set_biases_log2(s, has_bias1, bias1_log2 + buf * kWgmmaRows, keys.bias2_stage(buf), types.bias2,
                    warp * 16, lane);
    wgmma_tile_done<0>(dot);
    evoformer_softmax_tile<kOutTiles>(s, dot, scale_log2, p.prob_shift_log2, tile * kWgmmaRows,
                                      p.len, has_bias1, t, row_max, row_sum, o_acc);
    wgmma_acc_tile<T, kHeadDim>(o_acc, s, keys.v_tile(buf));  // O += P V
  }

  evoformer_finish_forward<T, kHeadDim>(p, o_acc, row_max, row_sum, b, n, h, bn, my_rows, t,
                                        written_dim<kHeadDim, BiasTypes>(p),
                                        kInPlace ? q_src.shift : 0);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda

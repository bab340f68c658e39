// The per-iteration copies of the Evoformer kernels' loops: the K/V (or Q/dO) rows of a tile with
// the bias tiles and row statistics that go with it, built on the shared tile copies
// (common/tile_copies.cuh): the lean copy for whole, aligned tiles, the generic ones else. CUDA
// layer (Evoformer kernels).
#pragma once

#include <cstdint>

#include "cuda/common/device_utils.cuh"
#include "cuda/common/tile_copies.cuh"
#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

// The lse and delta of query rows [q0, q0 + kRows), all inside L, into shared memory: threads
// 0 .. kRows - 1 copy one of each, in the caller's cp.async group. A null `delta`: lse alone (the
// caller computes delta itself).
template <int kRows, int kThreads>
__device__ __forceinline__ void copy_row_stats_whole(float* lse, float* delta,
                                                     const EvoformerDeviceParams& p, int64_t bn,
                                                     int64_t h, int64_t q0) {
  static_assert(kThreads >= kRows, "one thread per query row's statistics");
  const int r = static_cast<int>(threadIdx.x);
  if (r < kRows) {
    cp_async_4(lse + r,
               p.lse + bn * p.lse_stride[0] + h * p.lse_stride[1] + (q0 + r) * p.lse_stride[2], 4);
    if (delta != nullptr) cp_async_4(delta + r, p.delta + (bn * p.heads + h) * p.len + q0 + r, 4);
  }
}

// Starts copying the lse and delta of query rows [q0, q0 + kRows) into shared memory, in the
// caller's cp.async group (plain loads here would stall every thread at the next barrier).
// Rows past L get lse = +inf and delta = 0, so that their P = exp2(x - inf) is exactly 0 whatever
// the biases are, and a padded row adds nothing anywhere without a per-element check. A null
// `delta`: lse alone.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_row_stats(float* lse, float* delta,
                                               const EvoformerDeviceParams& p, int64_t bn,
                                               int64_t h, int64_t q0) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int64_t q = q0 + r;
    if (q < p.len) {
      cp_async_4(lse + r, p.lse + bn * p.lse_stride[0] + h * p.lse_stride[1] + q * p.lse_stride[2],
                 4);
      if (delta != nullptr) cp_async_4(delta + r, p.delta + (bn * p.heads + h) * p.len + q, 4);
    } else {
      lse[r] = __builtin_huge_valf();
      if (delta != nullptr) delta[r] = 0.0f;
    }
  }
}

// Rows [row0, row0 + 64) of two slices of one head (K and V, or Q and dO) into their stages:
// the lean copy when the tile is whole and both are aligned, load_tile otherwise.
template <typename T, int kTileDim, int kPitch, int kThreads>
__device__ __forceinline__ void copy_slice_pair_tile(const EvoformerDeviceParams& p, bool whole,
                                                     const SliceSource& a_src, T* a_dst,
                                                     const SliceSource& b_src, T* b_dst,
                                                     int64_t row0) {
  constexpr int kRows = 64;
  if (whole && p.lean_tiles) {
    copy_slice_tile_lean<T, kRows, kTileDim, kPitch, kThreads>(a_dst, a_src, row0);
    copy_slice_tile_lean<T, kRows, kTileDim, kPitch, kThreads>(b_dst, b_src, row0);
  } else if (whole && a_src.vec && b_src.vec) {
    copy_whole_slice_tile<T, kRows, kTileDim, kPitch, kThreads>(a_dst, a_src, row0, p.load_dim);
    copy_whole_slice_tile<T, kRows, kTileDim, kPitch, kThreads>(b_dst, b_src, row0, p.load_dim);
  } else {
    load_tile<T, kRows, kTileDim, kPitch, kThreads>(a_dst, a_src, row0, p.len, p.load_dim);
    load_tile<T, kRows, kTileDim, kPitch, kThreads>(b_dst, b_src, row0, p.len, p.load_dim);
  }
}

// The bias copies of one key tile for the kernels whose CTA holds a block of kRows query rows from
// row0 and loops over 64-key tiles (the forward and dQ): its bias2 tile [query rows][keys] and its
// bias1 entries (kBias1: the forward on the warpgroup MMA reads bias1 itself), each into the
// stage the caller names, in the caller's cp.async group. `whole`: the key tile lies inside L
// (lean copies where the bias allows them; the generic ones else, which read each bias's columns
// up to its bias*_cols: for a padded copy its whole row, so that the last key tile's rows still
// end on a 16-byte chunk and take 16-byte copies).
template <int kRows, int kThreads, BiasCopyWidths kWidths, bool kBias1 = true>
__device__ __forceinline__ void copy_key_tile_biases(const EvoformerDeviceParams& p, int64_t b,
                                                     int64_t n, int64_t h, int64_t row0,
                                                     int64_t col0, bool whole,
                                                     unsigned char* bias2_stage,
                                                     unsigned char* bias1_stage) {
  constexpr int kKeys = 64;
  const int64_t rows_inside = p.len - row0;
  if (p.bias2_type != BiasType::kNone) {
    const int64_t offset =
        b * p.bias2_stride[0] + h * p.bias2_stride[1] + row0 * p.bias2_stride[2] + col0;
    if (whole && p.bias2_staged && bias_width_copied<kWidths>(p.bias2_type)) {
      copy_bias_tile<kRows, kThreads, kWidths>(
          bias2_stage, p.bias2, p.bias2_type, offset, p.bias2_stride[2],
          static_cast<int>(rows_inside < kRows ? rows_inside : kRows), kKeys, p.bias2_lean);
    } else {
      stage_bias_tile<kRows, kThreads>(bias2_stage, p.bias2, p.bias2_type, offset,
                                       p.bias2_stride[2], rows_inside, p.bias2_cols - col0,
                                       p.bias2_staged);
    }
  }
  if (kBias1 && p.bias1_type != BiasType::kNone) {
    const int64_t offset = b * p.bias1_stride[0] + n * p.bias1_stride[1] + col0;
    if (whole && p.bias1_staged && bias_width_copied<kWidths>(p.bias1_type)) {
      copy_bias_tile<1, kThreads, kWidths>(bias1_stage, p.bias1, p.bias1_type, offset, 0, 1, kKeys,
                                           true);
    } else {
      stage_bias_tile<1, kThreads>(bias1_stage, p.bias1, p.bias1_type, offset, 0, 1,
                                   p.bias1_cols - col0, p.bias1_staged);
    }
  }
}

// The copies of one key tile for the forward and dQ kernels: the tile's K and V rows and its
// biases (copy_key_tile_biases), in the caller's cp.async group. Whole key tiles take the lean
// copies above; a partial last tile and unaligned tensors the generic ones.
template <typename T, int kRows, int kTileDim, int kPitch, int kThreads, BiasCopyWidths kWidths>
__device__ __forceinline__ void copy_key_tile(const EvoformerDeviceParams& p,
                                              const SliceSource& k_src, const SliceSource& v_src,
                                              int64_t b, int64_t n, int64_t h, int64_t row0,
                                              T* k_dst, T* v_dst, unsigned char* bias2_stage,
                                              unsigned char* bias1_stage, int64_t col0) {
  const bool whole = col0 + 64 <= p.len;
  copy_slice_pair_tile<T, kTileDim, kPitch, kThreads>(p, whole, k_src, k_dst, v_src, v_dst, col0);
  copy_key_tile_biases<kRows, kThreads, kWidths>(p, b, n, h, row0, col0, whole, bias2_stage,
                                                 bias1_stage);
}

// The row statistics and bias copies of one query tile for the dK/dV kernel (one CTA = one
// block of 64 keys from key0, looping over 64-query tiles): its rows' lse and delta and its bias2
// tile [queries][keys], in the caller's cp.async group (no delta where delta_dst is null).
// `whole`: the query tile lies inside L
// (then the bias2 tile takes the lean copy when its rows end on a 16-byte chunk; a last key
// block of a length that is not a multiple of 8 may not); the generic copies else.
template <int kThreads>
__device__ __forceinline__ void copy_query_tile_stats_and_bias(const EvoformerDeviceParams& p,
                                                               int64_t b, int64_t bn, int64_t h,
                                                               int64_t key0, int64_t q0, bool whole,
                                                               float* lse_dst, float* delta_dst,
                                                               unsigned char* bias2_stage) {
  constexpr int kQueries = 64;
  if (whole) {
    copy_row_stats_whole<kQueries, kThreads>(lse_dst, delta_dst, p, bn, h, q0);
  } else {
    load_row_stats<kQueries, kThreads>(lse_dst, delta_dst, p, bn, h, q0);
  }
  if (p.bias2_type != BiasType::kNone) {
    const int64_t offset =
        b * p.bias2_stride[0] + h * p.bias2_stride[1] + q0 * p.bias2_stride[2] + key0;
    // Columns up to bias2_cols (as copy_key_tile_biases), so that a padded copy's last key block
    // still ends on a 16-byte chunk.
    const int64_t cols_inside = p.bias2_cols - key0 < kQueries ? p.bias2_cols - key0 : kQueries;
    if (whole && p.bias2_staged && bias_width_copied<BiasCopyWidths::kTwoBytes>(p.bias2_type) &&
        bias_rows_end_on_chunk(p.bias2_type, cols_inside)) {
      copy_bias_tile<kQueries, kThreads, BiasCopyWidths::kTwoBytes>(
          bias2_stage, p.bias2, p.bias2_type, offset, p.bias2_stride[2], kQueries,
          static_cast<int>(cols_inside), p.bias2_lean);
    } else {
      stage_bias_tile<kQueries, kThreads>(bias2_stage, p.bias2, p.bias2_type, offset,
                                          p.bias2_stride[2], p.len - q0, cols_inside,
                                          p.bias2_staged);
    }
  }
}

// The copies of one query tile for the dK/dV kernel: the tile's Q and dO rows (lean copies for
// whole tiles, as copy_key_tile), then copy_query_tile_stats_and_bias.
template <typename T, int kTileDim, int kPitch, int kThreads>
__device__ __forceinline__ void copy_query_tile(const EvoformerDeviceParams& p,
                                                const SliceSource& q_src, const SliceSource& do_src,
                                                int64_t b, int64_t bn, int64_t h, int64_t key0,
                                                T* q_dst, T* do_dst, float* lse_dst,
                                                float* delta_dst, unsigned char* bias2_stage,
                                                int64_t q0) {
  const bool whole = q0 + 64 <= p.len;
  copy_slice_pair_tile<T, kTileDim, kPitch, kThreads>(p, whole, q_src, q_dst, do_src, do_dst, q0);
  copy_query_tile_stats_and_bias<kThreads>(p, b, bn, h, key0, q0, whole, lse_dst, delta_dst,
                                           bias2_stage);
}

}  // namespace sciattn::cuda

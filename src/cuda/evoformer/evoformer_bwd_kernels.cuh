// The Evoformer attention backward kernels (CUDA layer), deterministic by construction: no
// floating-point atomics; every output element is owned by one thread of one CTA, and sums that
// cross CTAs go through fp32 partials in the workspace that a second kernel adds in a fixed order.
//   1. evoformer_bwd_delta_kernel:  delta_i = <dO_i, O_i> (on the warpgroup-MMA path of head dims
//                                   64 and 128 the dQ kernel computes it and runs first,
//                                   evoformer_bwd_wgmma_kernels.cuh)
//   2. evoformer_bwd_dkdv_kernel:   per (64 keys, h, b*n): dK, dV and the per-head dbias1 partial
//   3. evoformer_bwd_dq_kernel:     per (64 queries, h, b*n): dQ
//   4. evoformer_bwd_dbias2_kernel: per (128 or 64 queries x 64 keys tile of dbias2[b, h], chunk
//                                   of N): the sum over the chunk's n of dS, in order
//                                   (recomputes S and dP)
//   5. evoformer_bwd_dbias_reduce_kernel: dbias1 = sum over heads, dbias2 = sum over chunks
// dS is formed in fp32 from fp32 P (never from P rounded to the storage type).
//
// Why dbias2 has its own kernel: it is a sum over N of [L, L] tiles. Accumulating it inside the
// dK/dV kernel (one CTA walking the n of a chunk) needs an L x 64 fp32 partial per CTA, which in
// shared memory allowed one 4-warp CTA per SM and in global memory cost a read-modify-write per
// tile; both made the dK/dV kernel 3-10x slower than its MMA work. A separate kernel owning a
// tile keeps the sum in registers, reads bias2 once, and costs two GEMMs (S and dP) per tile and
// n; its tile is 128 queries tall up to head dim 64, so that each K/V tile staged serves twice
// the rows and eight warps hide each other's latencies.
#pragma once

#include <type_traits>

#include "common/evoformer_cuda_plan.h"
#include "cuda/common/accumulator_row_store.cuh"
#include "cuda/common/attention_delta.cuh"
#include "cuda/common/device_utils.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/mma_tiles.cuh"
#include "cuda/evoformer/evoformer_grid.cuh"
#include "cuda/evoformer/evoformer_tile_copies.cuh"

namespace sciattn::cuda {

struct EvoformerBwdTile {
  // Keys per dK/dV CTA, queries per dQ CTA, and the tile of the other side.
  static constexpr int kBlock = 64;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
};

// CTAs per SM the dK/dV and dQ kernels are compiled for. Up to head dim 32 their shared memory
// (~50 KB with staged bf16 biases) allows four when the SM's carveout is the largest, and 128
// registers then hold their operands (unbounded they took 140, so three per SM); 1 leaves the
// register count to the compiler.
template <int kHeadDim>
constexpr int kEvoformerBwdMinCtas = kHeadDim <= 32 ? 4 : 1;

// kStages buffers of the streamed tiles (stream_tile, common/device_utils.cuh): two, or one where
// the device's shared memory per block cannot hold two (kEvoformerOneStage).
template <typename T, int kHeadDim, int kStages = 2>
struct EvoformerBwdSmem {
  static constexpr int kPitch = kTileDimFor<kHeadDim> + 8;
  static constexpr int kTile = EvoformerBwdTile::kBlock * kPitch;
  T a[kTile];                                    // dK/dV kernel: K of this n; dQ kernel: Q
  T b[kTile];                                    // dK/dV kernel: V of this n; dQ kernel: dO
  T c[kStages][kTile];                           // the streamed tile: Q (dK/dV) or K (dQ)
  T d[kStages][kTile];                           // the streamed tile: dO (dK/dV) or V (dQ)
  float lse[kStages][EvoformerBwdTile::kBlock];  // lse of the streamed query rows (dK/dV kernel)
  float delta[kStages][EvoformerBwdTile::kBlock];
};

// The dbias2 kernel's CTA: kWarps warps of 16 query rows over one 64-key block (the shape is
// the host plan's, common/evoformer_cuda_plan.h, so that grid and workspace agree with it).
template <int kHeadDim>
struct EvoformerDbias2Tile {
  static constexpr int kRows = static_cast<int>(detail::cuda_dbias2_rows(kHeadDim));
  static constexpr int kWarps = kRows / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCtasPerSm = static_cast<int>(detail::cuda_dbias2_ctas_per_sm(kHeadDim));
};

// Its tiles: Q, dO (query rows) and K, V (key block) of one n, double-buffered over n, with the
// query rows' lse and delta and bias1's row of keys.
template <typename T, int kHeadDim, int kStages = 2>
struct EvoformerDbias2Smem {
  using Tile = EvoformerDbias2Tile<kHeadDim>;
  static constexpr int kPitch = kTileDimFor<kHeadDim> + 8;
  T q[kStages][Tile::kRows * kPitch];
  T dout[kStages][Tile::kRows * kPitch];
  T k[kStages][EvoformerBwdTile::kBlock * kPitch];
  T v[kStages][EvoformerBwdTile::kBlock * kPitch];
  float lse[kStages][Tile::kRows];
  float delta[kStages][Tile::kRows];
  // bias1 of n in log2 units, 0 past L; two buffers whatever kStages (written one n ahead).
  float bias1_log2[2][EvoformerBwdTile::kBlock];
  // Each thread's 32 cells of bias2 in log2 units, [warp][j][e][lane]: written and read by the
  // same thread only (no barrier needed), lane-contiguous so that a warp's reads are
  // conflict-free. Kept here rather than in registers, which the sum and the operands need.
  float bias2_log2[Tile::kWarps][8][4][32];
};

// delta = rowsum(dO * O) per (b*n, query row, h), kLanes lanes per row
// (common/attention_delta.cuh); rows in the tensors' memory order, so a warp's rows are adjacent.
template <typename T>
__host__ __device__ inline bool evoformer_delta_vec(const EvoformerDeviceParams& p) {
  return sizeof(T) == 2 && p.vec_out && p.vec_dout;
}

template <typename T, int kLanes>
__global__ void evoformer_bwd_delta_kernel(const EvoformerDeviceParams p) {
  enter_overlapped_grid();
  delta_rows<T, kLanes>(
      p.batch * p.n * p.len * p.heads, p.dim, evoformer_delta_vec<T>(p), 1, 1,
      [&](auto row) {
        using Index = decltype(row);
        const Index heads = static_cast<Index>(p.heads), len = static_cast<Index>(p.len);
        const Index h = row % heads, i = (row / heads) % len, bn = row / (heads * len);
        const Index b = bn / static_cast<Index>(p.n), n = bn % static_cast<Index>(p.n);
        return DeltaRow<T>{static_cast<const T*>(p.out) + b * p.out_stride[0] +
                               n * p.out_stride[1] + i * p.out_stride[2] + h * p.out_stride[3],
                           static_cast<const T*>(p.dout) + b * p.dout_stride[0] +
                               n * p.dout_stride[1] + i * p.dout_stride[2] + h * p.dout_stride[3],
                           (static_cast<int64_t>(bn) * p.heads + h) * p.len + i};
      },
      p.delta);
}

// Writes 16 rows (this warp's) x dim of an accumulator times `factor` into a [B,N,L,H,D] tensor
// (store_accumulator_row: 32-bit stores of pairs, with `pairs_aligned` = p.grads_paired no test per
// row). Warp-collective: every lane calls it.
template <typename T, int kOutTiles>
__device__ __forceinline__ void store_rows(const float acc[kOutTiles][4], float factor, void* base,
                                           const int64_t stride[4], int64_t b, int64_t n, int64_t h,
                                           const int64_t rows[2], int64_t len, int64_t dim, int t,
                                           bool pairs_aligned) {
  T* out = static_cast<T*>(base) + b * stride[0] + n * stride[1] + h * stride[3];
  const bool may_start_odd = rows_may_start_odd(out, stride[2]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool write = rows[r] < len;
    store_accumulator_row<T, kOutTiles>(out + (write ? rows[r] : 0) * stride[2], acc, r, factor,
                                        dim, t, pairs_aligned, may_start_odd, write);
  }
}

// The per-tile math of the dK/dV and dQ kernels, shared by their mma.sync and wgmma forms. The
// tiles are 64 x 64 in fp32 accumulators; this thread holds two rows (r = e >> 1) of the m16n8
// layout (lane = 4 g + t, columns 8 j + 2 t + (e & 1)).

// dK/dV kernel: bias1 of this thread's two keys in log2 units (0 past L or without bias1), in two
// halves: the loads, issued before the CTA's first tiles so that their latency passes during the
// tiles' wait, and the conversion, at the first step.
__device__ __forceinline__ void load_key_bias1_bits(uint32_t (&bits)[2],
                                                    const EvoformerDeviceParams& p, int64_t b,
                                                    int64_t n, const int64_t (&my_keys)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bits[r] = neutral_bias_bits(p.bias1_type);
    if (p.bias1_type != BiasType::kNone && my_keys[r] < p.len) {
      bits[r] = load_bias_bits(
          p.bias1, p.bias1_type,
          b * p.bias1_stride[0] + n * p.bias1_stride[1] + my_keys[r] * p.bias1_stride[2]);
    }
  }
}
__device__ __forceinline__ void key_bias1_from_bits(float (&key_bias1)[2],
                                                    const uint32_t (&bits)[2], BiasType type) {
#pragma unroll
  for (int r = 0; r < 2; ++r) key_bias1[r] = kLog2e * bias_from_bits(bits[r], type);
}
__device__ __forceinline__ void evoformer_key_bias1(float (&key_bias1)[2],
                                                    const EvoformerDeviceParams& p, int64_t b,
                                                    int64_t n, const int64_t (&my_keys)[2]) {
  uint32_t bits[2];
  load_key_bias1_bits(bits, p, b, n, my_keys);
  key_bias1_from_bits(key_bias1, bits, p.bias1_type);
}

// dK/dV kernel: P^T (keys x queries) in place from S^T = K Q^T: the scale, bias1 (per key, a
// per-row constant here), bias2 read transposed from its stage (this thread's "rows" are key
// columns of the stage, its columns the stage's query rows), and the query rows' lse, in log2
// units in its stage (stage_lse_to_log2). No bounds checks: a padded query column has lse = +inf
// (P = 0), and a padded key row only feeds dK, dV and dbias1 of that key, which are never stored.
__device__ __forceinline__ void evoformer_transposed_probabilities(
    float (&pt)[8][4], float scale_log2, const float (&key_bias1)[2],
    const unsigned char* bias2_stage, BiasType bias2_type, const float* lse, int warp, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) pt[j][e] = fmaf(pt[j][e], scale_log2, key_bias1[e >> 1]);
  add_staged_bias_transposed(pt, bias2_stage, bias2_type, warp * 16, lane);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 lse2 = *reinterpret_cast<const float2*>(&lse[j * 8 + 2 * t]);
#pragma unroll
    for (int e = 0; e < 4; ++e) pt[j][e] = fast_exp2(pt[j][e] - ((e & 1) ? lse2.y : lse2.x));
  }
}

// dK/dV kernel: dS^T = P^T (dP^T - delta) in place of P^T, delta per query column; adds each
// key's share of the sum over queries (dbias1) to key_dbias1.
__device__ __forceinline__ void evoformer_transposed_ds(float (&pt)[8][4], const float (&dpt)[8][4],
                                                        const float* delta, float (&key_dbias1)[2],
                                                        int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = j * 8 + 2 * t + (e & 1);
      pt[j][e] *= dpt[j][e] - delta[qc];
      key_dbias1[e >> 1] += pt[j][e];
    }
}

// dK/dV kernel's epilogue: dK (times the scale), dV and the per-head dbias1 partial of its keys.
// dim: the D of the rows written (p.dim, or written_dim's constant).
template <typename T, int kHeadDim>
__device__ __forceinline__ void evoformer_finish_dkdv(
    const EvoformerDeviceParams& p, const float (&dk)[kHeadDim / 8][4],
    const float (&dv)[kHeadDim / 8][4], const float (&key_dbias1)[2], int64_t b, int64_t n,
    int64_t h, int64_t bn, const int64_t (&my_keys)[2], int t, int64_t dim) {
  constexpr int kOutTiles = kHeadDim / 8;
  store_rows<T, kOutTiles>(dk, p.scale, p.dk, p.dk_stride, b, n, h, my_keys, p.len, dim, t,
                           p.grads_paired);
  store_rows<T, kOutTiles>(dv, 1.0f, p.dv, p.dv_stride, b, n, h, my_keys, p.len, dim, t,
                           p.grads_paired);
  if (p.dbias1_partial != nullptr) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = key_dbias1[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t == 0 && my_keys[r] < p.len) {
        p.dbias1_partial[(bn * p.heads + h) * p.len + my_keys[r]] = sum;
      }
    }
  }
}

// dQ kernel: this thread's two rows' lse in log2 units and delta. The shift of P = exp2(x -
// shift): +inf for a padded or fully masked row gives P = 0 with no per-element check.
__device__ __forceinline__ void evoformer_row_lse_delta(float (&lse_log2)[2], float (&delta)[2],
                                                        const EvoformerDeviceParams& p, int64_t bn,
                                                        int64_t h, const int64_t (&my_rows)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = my_rows[r] < p.len;
    const float lse =
        valid ? p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]]
              : kNegInf;
    lse_log2[r] = lse_log2_of(lse);
    delta[r] = valid ? p.delta[(bn * p.heads + h) * p.len + my_rows[r]] : 0.0f;
  }
}

// dQ kernel: P in place of the tile's biases (log2 units) from dots = Q K^T of the key tile at
// k0. Keys past L exist only in the last tile: their P must be 0 (a row whose lse is very
// negative would otherwise give inf there).
__device__ __forceinline__ void evoformer_row_probabilities(float (&pr)[8][4],
                                                            const float (&dots)[8][4],
                                                            float scale_log2,
                                                            const float (&lse_log2)[2], int64_t k0,
                                                            int64_t len, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[j][e] = fast_exp2(fmaf(dots[j][e], scale_log2, pr[j][e]) - lse_log2[e >> 1]);
    }
  if (k0 + 64 > len) {
    const int cols_left = static_cast<int>(len - k0);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (j * 8 + 2 * t + (e & 1) >= cols_left) pr[j][e] = 0.0f;
      }
  }
}

// dQ kernel: dS = P (dP - delta) in place of dP, delta per row.
__device__ __forceinline__ void evoformer_row_ds(float (&ds)[8][4], const float (&pr)[8][4],
                                                 const float (&delta)[2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[j][e] = pr[j][e] * (ds[j][e] - delta[e >> 1]);
}

template <typename T, int kHeadDim, int kStages = 2>
__global__ void __launch_bounds__(EvoformerBwdTile::kThreads, kEvoformerBwdMinCtas<kHeadDim>)
    evoformer_bwd_dkdv_kernel(const EvoformerDeviceParams p) {
  enter_overlapped_grid();
  using Tile = EvoformerBwdTile;
  using Smem = EvoformerBwdSmem<T, kHeadDim, kStages>;
  constexpr int kTileDim = kTileDimFor<kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kTileDim / 16;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  static_assert(Tile::kBlock == 64, "the grid's tiles are p.tiles64_div's");
  // ptxas's allocation at the 128-register cap turns on the decoding: at head dim 32 the
  // multiply-high form left 44 bytes of spill and the divide sequence 4; at 16 the reverse (0
  // against 84).
  const TileHeadSlice at = kHeadDim == 32 ? decode_tile_head_slice_by_division(blockIdx.x, p)
                                          : decode_tile_head_slice(blockIdx.x, p);
  const int64_t h = at.h, b = at.b, n = at.n, bn = at.bn;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t key0 = at.tile * Tile::kBlock;
  const int64_t my_keys[2] = {key0 + warp * 16 + g, key0 + warp * 16 + g + 8};
  const int64_t q_tiles = (p.len + Tile::kBlock - 1) / Tile::kBlock;

  const SliceSource q_src = slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h);
  const SliceSource do_src = slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h);
  load_tile<T, Tile::kBlock, kTileDim, kPitch, Tile::kThreads>(
      smem.a, slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h), key0, p.len, p.load_dim);
  load_tile<T, Tile::kBlock, kTileDim, kPitch, Tile::kThreads>(
      smem.b, slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h), key0, p.len, p.load_dim);
  // The bias2 tile of each query tile ([64 queries][64 keys], in kStages buffers) is staged in
  // shared memory after the fixed part, copied with the Q/dO tile it belongs to.
  unsigned char* const bias2_stage = smem_raw + sizeof(Smem);
  const int bias2_stage_bytes = bias_stage_bytes(p.bias2_type, Tile::kBlock);
  auto copy_query_tile_to = [&](int buf, int64_t q0) {
    copy_query_tile<T, kTileDim, kPitch, Tile::kThreads>(
        p, q_src, do_src, b, bn, h, key0, smem.c[buf], smem.d[buf], smem.lse[buf], smem.delta[buf],
        bias2_stage + buf * bias2_stage_bytes, q0);
  };
  copy_query_tile_to(0, 0);
  cp_async_commit();

  // The thread's rows are keys. bias1 depends on the key alone, so in this transposed tile it is
  // a per-row constant, read once. bias2 is read transposed from its stage: this thread's "rows"
  // are key columns of the stage, and its columns (queries) are the stage's rows.
  float key_bias1[2];
  evoformer_key_bias1(key_bias1, p, b, n, my_keys);

  uint32_t k_frag[kSteps][4], v_frag[kSteps][4];
  float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  float key_dbias1[2] = {0.0f, 0.0f};  // this thread's share of the sum over queries of dS
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t qt = 0; qt < q_tiles; ++qt) {
    const int buf = stream_tile<kStages>(
        qt, q_tiles, [&](int to, int64_t next) { copy_query_tile_to(to, next * Tile::kBlock); });
    stage_lse_to_log2<Tile::kBlock>(smem.lse[buf]);
    __syncthreads();
    if (qt == 0) {
      load_a_frags<T, kSteps, kPitch>(k_frag, smem.a + warp * 16 * kPitch, g, t);
      load_a_frags<T, kSteps, kPitch>(v_frag, smem.b + warp * 16 * kPitch, g, t);
    }
    const T* q_tile = smem.c[buf];
    const T* do_tile = smem.d[buf];
    const float* lse = smem.lse[buf];
    const float* delta = smem.delta[buf];

    // P^T (16 keys x 64 queries) from S^T = K Q^T plus the biases, in log2 units, built in place
    // in the MMA's accumulators (no second 8 x 4 array live beside them: at the 128-register cap
    // of D <= 32 that array was spilled).
    float pt[8][4];
    mma_rows_t<T, kSteps, kPitch>(pt, k_frag, q_tile, g, t);
    evoformer_transposed_probabilities(pt, scale_log2, key_bias1,
                                       bias2_stage + buf * bias2_stage_bytes, p.bias2_type, lse,
                                       warp, lane);
    // dV += P^T dO.
    mma_acc_tile<T, kOutTiles, kPitch>(dv, pt, do_tile, g, t);
    // dP^T = V dO^T, then dS^T = P^T (dP^T - delta), in place.
    {
      float ds[8][4];
      mma_rows_t<T, kSteps, kPitch>(ds, v_frag, do_tile, g, t);
      evoformer_transposed_ds(pt, ds, delta, key_dbias1, t);
    }
    // dK += dS^T Q (times scale when written).
    mma_acc_tile<T, kOutTiles, kPitch>(dk, pt, q_tile, g, t);
    __syncthreads();  // the buffers of this tile are refilled next iteration
  }

  evoformer_finish_dkdv<T, kHeadDim>(p, dk, dv, key_dbias1, b, n, h, bn, my_keys, t, p.dim);
}

template <typename T, int kHeadDim, int kStages = 2>
__global__ void __launch_bounds__(EvoformerBwdTile::kThreads, kEvoformerBwdMinCtas<kHeadDim>)
    evoformer_bwd_dq_kernel(const EvoformerDeviceParams p) {
  enter_overlapped_grid();
  using Tile = EvoformerBwdTile;
  using Smem = EvoformerBwdSmem<T, kHeadDim, kStages>;
  constexpr int kTileDim = kTileDimFor<kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kTileDim / 16;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  const TileHeadSlice at = decode_tile_head_slice(blockIdx.x, p);
  const int64_t h = at.h, b = at.b, n = at.n, bn = at.bn;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t q0 = at.tile * Tile::kBlock;
  const int64_t my_rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int64_t k_tiles = (p.len + Tile::kBlock - 1) / Tile::kBlock;

  const SliceSource k_src = slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h);
  const SliceSource v_src = slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h);
  load_tile<T, Tile::kBlock, kTileDim, kPitch, Tile::kThreads>(
      smem.a, slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h), q0, p.len, p.load_dim);
  load_tile<T, Tile::kBlock, kTileDim, kPitch, Tile::kThreads>(
      smem.b, slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h), q0, p.len,
      p.load_dim);
  // The biases of each key tile are staged in shared memory (in kStages buffers like K and V,
  // after the fixed part), copied with the K/V tile they belong to.
  unsigned char* const bias2_stage = smem_raw + sizeof(Smem);
  const int bias2_stage_bytes = bias_stage_bytes(p.bias2_type, Tile::kBlock);
  unsigned char* const bias1_stage = bias2_stage + kStages * bias2_stage_bytes;
  const int bias1_stage_bytes = bias_stage_bytes(p.bias1_type, 1);
  auto copy_key_tile_to = [&](int buf, int64_t k0) {
    copy_key_tile<T, Tile::kBlock, kTileDim, kPitch, Tile::kThreads, BiasCopyWidths::kTwoBytes>(
        p, k_src, v_src, b, n, h, q0, smem.c[buf], smem.d[buf],
        bias2_stage + buf * bias2_stage_bytes, bias1_stage + buf * bias1_stage_bytes, k0);
  };
  copy_key_tile_to(0, 0);
  cp_async_commit();

  float lse_log2[2], delta[2];
  evoformer_row_lse_delta(lse_log2, delta, p, bn, h, my_rows);

  uint32_t q_frag[kSteps][4], do_frag[kSteps][4];
  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const int64_t k0 = kt * Tile::kBlock;
    const int buf = stream_tile<kStages>(
        kt, k_tiles, [&](int to, int64_t next) { copy_key_tile_to(to, next * Tile::kBlock); });
    __syncthreads();
    if (kt == 0) {
      load_a_frags<T, kSteps, kPitch>(q_frag, smem.a + warp * 16 * kPitch, g, t);
      load_a_frags<T, kSteps, kPitch>(do_frag, smem.b + warp * 16 * kPitch, g, t);
    }
    float pr[8][4], dots[8][4], ds[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) pr[j][0] = pr[j][1] = pr[j][2] = pr[j][3] = 0.0f;
    add_staged_biases(pr, bias1_stage + buf * bias1_stage_bytes, p.bias1_type,
                      bias2_stage + buf * bias2_stage_bytes, p.bias2_type, warp * 16, lane);
    mma_rows_t<T, kSteps, kPitch>(dots, q_frag, smem.c[buf], g, t);
    evoformer_row_probabilities(pr, dots, scale_log2, lse_log2, k0, p.len, t);
    mma_rows_t<T, kSteps, kPitch>(ds, do_frag, smem.d[buf], g, t);  // dP = dO V^T
    evoformer_row_ds(ds, pr, delta);
    mma_acc_tile<T, kOutTiles, kPitch>(dq, ds, smem.c[buf], g, t);  // dQ += dS K
    __syncthreads();
  }
  store_rows<T, kOutTiles>(dq, p.scale, p.dq, p.dq_stride, b, n, h, my_rows, p.len, p.dim, t,
                           p.grads_paired);
}

// ---- The dbias2 kernel's parts, shared by its mma.sync and wgmma forms ----

// The CTA's place in the dbias2 grid (1-D: key block fastest, then query block, head, batch,
// chunk of N) and its chunk's range of n.
struct Dbias2Cta {
  int64_t key_block, query_block, h, b, chunk, n_begin, n_end;
};
__device__ __forceinline__ Dbias2Cta decode_dbias2_cta(const EvoformerDeviceParams& p) {
  const QuotientRemainder by_key = fast_divmod(blockIdx.x, p.tiles64_div);
  const QuotientRemainder by_query = fast_divmod(by_key.quotient, p.dbias2_rows_div);
  const QuotientRemainder by_head = fast_divmod(by_query.quotient, p.heads_div);
  const QuotientRemainder by_batch = fast_divmod(by_head.quotient, p.batch_div);
  const int64_t chunk = by_batch.quotient;
  return {by_key.remainder,
          by_query.remainder,
          by_head.remainder,
          by_batch.remainder,
          chunk,
          chunk * p.n / p.dbias2_chunks,
          (chunk + 1) * p.n / p.dbias2_chunks};
}

// bias1 of n at key k0 + threadIdx.x (threads below 64), in log2 units; 0 past L, where bias2's
// -inf already removes the cell.
__device__ __forceinline__ uint32_t dbias2_bias1_bits(const EvoformerDeviceParams& p, int64_t b,
                                                      int64_t n, int64_t k0) {
  const int64_t key = k0 + threadIdx.x;
  if (p.bias1_type == BiasType::kNone || threadIdx.x >= 64 || key >= p.len) {
    return neutral_bias_bits(p.bias1_type);
  }
  return load_bias_bits(p.bias1, p.bias1_type,
                        b * p.bias1_stride[0] + n * p.bias1_stride[1] + key * p.bias1_stride[2]);
}
__device__ __forceinline__ float dbias2_bias1_log2(const EvoformerDeviceParams& p, int64_t b,
                                                   int64_t n, int64_t k0) {
  return kLog2e * bias_from_bits(dbias2_bias1_bits(p, b, n, k0), p.bias1_type);
}

// bias2 does not depend on n: this thread's 32 cells of it (rows q0 + my_row[r], 64 keys from
// k0), in log2 units, read once. Cells outside the L x L matrix get -inf, so that their P is 0
// and they add nothing.
__device__ __forceinline__ void dbias2_bias2_cells(float (&cells)[8][4],
                                                   const EvoformerDeviceParams& p, int64_t b,
                                                   int64_t h, int64_t q0, int64_t k0,
                                                   const int (&my_row)[2], int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool inside = q0 + my_row[e >> 1] < p.len && k0 + j * 8 + 2 * t + (e & 1) < p.len;
      cells[j][e] = inside ? 0.0f : kNegInf;
    }
  const void* rows[2] = {nullptr, nullptr};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (p.bias2_type != BiasType::kNone && q0 + my_row[r] < p.len) {
      rows[r] = bias_ptr(
          p.bias2, p.bias2_type,
          b * p.bias2_stride[0] + h * p.bias2_stride[1] + (q0 + my_row[r]) * p.bias2_stride[2]);
    }
  }
  add_bias_tile(p.bias2_type, cells, rows, p.bias2_stride[3], k0, p.len, t, p.bias2_pairs);
}

// Adds dS = P (dP - delta) of n8 column tile j (dot = its Q K^T, dp = its dO V^T) to the running
// sum acc; bias2 = the tile's four cells of this thread (dbias2_bias2_cells), bias1 of the 64 keys
// in log2 units.
__device__ __forceinline__ void dbias2_add_cells(float (&acc)[4], const float (&dot)[4],
                                                 const float (&dp)[4], const float (&bias2)[4],
                                                 const float* bias1_log2, int j, int lane,
                                                 float scale_log2, const float (&lse_log2)[2],
                                                 const float (&row_delta)[2]) {
  const int t = lane % 4;
  // bias1 of the thread's two key columns (the same for both of its rows).
  const float2 b1 = *reinterpret_cast<const float2*>(&bias1_log2[j * 8 + 2 * t]);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float bias = bias2[e] + ((e & 1) ? b1.y : b1.x);
    const float prob = fast_exp2(fmaf(dot[e], scale_log2, bias) - lse_log2[e >> 1]);
    acc[e] = fmaf(prob, dp[e] - row_delta[e >> 1], acc[e]);
  }
}

// The CTA's sum: with one chunk dbias2 itself (in bias2's type), with several this chunk's fp32
// partial.
__device__ __forceinline__ void store_dbias2_tile(const EvoformerDeviceParams& p,
                                                  const float (&acc)[8][4], int64_t b, int64_t h,
                                                  int64_t chunk, int64_t q0, int64_t k0,
                                                  const int (&my_row)[2], int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t i = q0 + my_row[e >> 1], k = k0 + j * 8 + 2 * t + (e & 1);
      if (i >= p.len || k >= p.len) continue;
      if (p.dbias2_chunks > 1) {
        p.dbias2_partial[(((chunk * p.batch + b) * p.heads + h) * p.len + i) * p.len + k] =
            acc[j][e];
      } else {
        store_bias(p.dbias2, p.bias2_type,
                   b * p.dbias2_stride[0] + h * p.dbias2_stride[1] + i * p.dbias2_stride[2] +
                       k * p.dbias2_stride[3],
                   acc[j][e]);
      }
    }
}

// One CTA per (kRows x 64 tile of dbias2[b, h], chunk of N): the sum over the chunk's n of dS, in
// order, recomputing S and dP. Rows and columns past L get bias -inf and padded rows lse +inf, so
// their P is exactly 0 with no per-element check; a fully masked row (lse -inf) gets +inf too.
template <typename T, int kHeadDim, int kStages = 2>
__global__ void __launch_bounds__(EvoformerDbias2Tile<kHeadDim>::kThreads,
                                  EvoformerDbias2Tile<kHeadDim>::kCtasPerSm)
    evoformer_bwd_dbias2_kernel(const EvoformerDeviceParams p) {
  enter_overlapped_grid();
  using Tile = EvoformerDbias2Tile<kHeadDim>;
  using Smem = EvoformerDbias2Smem<T, kHeadDim, kStages>;
  constexpr int kKeys = EvoformerBwdTile::kBlock;
  constexpr int kTileDim = kTileDimFor<kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kTileDim / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  static_assert(kKeys == 64, "the grid's key blocks are p.tiles64_div's");
  const Dbias2Cta at = decode_dbias2_cta(p);
  const int64_t h = at.h, b = at.b, chunk = at.chunk, n_begin = at.n_begin, n_end = at.n_end;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t q0 = at.query_block * Tile::kRows, k0 = at.key_block * kKeys;
  const int my_row[2] = {warp * 16 + g, warp * 16 + g + 8};  // within the query rows

  // Starts the copies of n's tiles and row statistics into buffer `buf` (the lean copies when
  // both tiles lie inside L).
  const bool lean = p.lean_tiles && q0 + Tile::kRows <= p.len && k0 + kKeys <= p.len;
  auto load_n = [&](int64_t n, int buf) {
    if (lean) {
      // copy_slice_tile_lean's work, written out: with a SliceSource from slice_of (the same
      // arithmetic) ptxas spilled 216 bytes at this kernel's 128-register cap, against 12 here.
      const auto lean_copy = [&](auto rows, T* dst, const void* base, const int64_t stride[4],
                                 int64_t row0) {
        const int32_t row_bytes = static_cast<int32_t>(stride[2] * sizeof(T));
        copy_tile_lean<decltype(rows)::value, kTileDim / 8, kPitch* static_cast<int>(sizeof(T)),
                       Tile::kThreads>(
            shared_address(dst),
            static_cast<const char*>(base) +
                (b * stride[0] + n * stride[1] + h * stride[3]) * sizeof(T) + row0 * row_bytes,
            row_bytes);
      };
      lean_copy(std::integral_constant<int, Tile::kRows>{}, smem.q[buf], p.q, p.q_stride, q0);
      lean_copy(std::integral_constant<int, Tile::kRows>{}, smem.dout[buf], p.dout, p.dout_stride,
                q0);
      lean_copy(std::integral_constant<int, kKeys>{}, smem.k[buf], p.k, p.k_stride, k0);
      lean_copy(std::integral_constant<int, kKeys>{}, smem.v[buf], p.v, p.v_stride, k0);
      copy_row_stats_whole<Tile::kRows, Tile::kThreads>(smem.lse[buf], smem.delta[buf], p,
                                                        b * p.n + n, h, q0);
      return;
    }
    load_tile<T, Tile::kRows, kTileDim, kPitch, Tile::kThreads>(
        smem.q[buf], slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h), q0, p.len, p.load_dim);
    load_tile<T, Tile::kRows, kTileDim, kPitch, Tile::kThreads>(
        smem.dout[buf], slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h), q0, p.len,
        p.load_dim);
    load_tile<T, kKeys, kTileDim, kPitch, Tile::kThreads>(
        smem.k[buf], slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h), k0, p.len, p.load_dim);
    load_tile<T, kKeys, kTileDim, kPitch, Tile::kThreads>(
        smem.v[buf], slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h), k0, p.len, p.load_dim);
    load_row_stats<Tile::kRows, Tile::kThreads>(smem.lse[buf], smem.delta[buf], p, b * p.n + n, h,
                                                q0);
  };
  // bias1 of n is read into a register one n ahead and stored in shared memory at the end of the
  // iteration, so its latency hides behind the MMAs and it takes no registers in the cell loop.
  auto bias1_of = [&](int64_t n) { return dbias2_bias1_log2(p, b, n, k0); };
  load_n(n_begin, 0);
  cp_async_commit();
  if (threadIdx.x < kKeys) smem.bias1_log2[0][threadIdx.x] = bias1_of(n_begin);

  // Kept in shared memory ([warp][j][e][lane]: written and read by the same thread only, a warp's
  // reads conflict-free), since the registers hold the sum and the operands.
  {
    float cells[8][4];
    dbias2_bias2_cells(cells, p, b, h, q0, k0, my_row, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) smem.bias2_log2[warp][j][e][lane] = cells[j][e];
  }

  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t n = n_begin; n < n_end; ++n) {
    // bias1 alternates between its two buffers whatever kStages is.
    const int bias1_buf = static_cast<int>((n - n_begin) & 1);
    const float bias1_next = n + 1 < n_end ? bias1_of(n + 1) : 0.0f;
    const int buf = stream_tile<kStages>(n - n_begin, n_end - n_begin,
                                         [&](int to, int64_t next) { load_n(n_begin + next, to); });
    __syncthreads();
    uint32_t q_frag[kSteps][4], do_frag[kSteps][4];
    load_a_frags<T, kSteps, kPitch>(q_frag, smem.q[buf] + warp * 16 * kPitch, g, t);
    load_a_frags<T, kSteps, kPitch>(do_frag, smem.dout[buf] + warp * 16 * kPitch, g, t);
    float lse_log2[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lse = smem.lse[buf][my_row[r]];
      lse_log2[r] = lse_log2_of(lse);
      row_delta[r] = smem.delta[buf][my_row[r]];
    }
    // One pair of n8 column tiles at a time: S = Q K^T and dP = dO V^T, then dS = P (dP - delta)
    // added to the running sum; only the sum and bias2 stay live across tiles.
#pragma unroll
    for (int j0 = 0; j0 < 8; j0 += 2) {
      float dot[2][4] = {}, dp[2][4] = {};
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        uint32_t kf[2][2], vf[2][2];
        load_b_frags_of_rows<T, kPitch>(kf, smem.k[buf], j0, st, g, t);
        load_b_frags_of_rows<T, kPitch>(vf, smem.v[buf], j0, st, g, t);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          mma_16816<T>(dot[x], q_frag[st], kf[x]);
          mma_16816<T>(dp[x], do_frag[st], vf[x]);
        }
      }
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = j0 + x;
        const float bias2[4] = {
            smem.bias2_log2[warp][j][0][lane], smem.bias2_log2[warp][j][1][lane],
            smem.bias2_log2[warp][j][2][lane], smem.bias2_log2[warp][j][3][lane]};
        dbias2_add_cells(acc[j], dot[x], dp[x], bias2, smem.bias1_log2[bias1_buf], j, lane,
                         scale_log2, lse_log2, row_delta);
      }
    }
    if (threadIdx.x < kKeys && n + 1 < n_end) {
      smem.bias1_log2[bias1_buf ^ 1][threadIdx.x] = bias1_next;
    }
    __syncthreads();  // the tile buffers are refilled for the next n (two stages: n + 2)
  }

  store_dbias2_tile(p, acc, b, h, chunk, q0, k0, my_row, t);
}

}  // namespace sciattn::cuda

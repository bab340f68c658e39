// The Evoformer attention backward's fused dK/dV/dQ kernel on Hopper's warpgroup MMA (wgmma,
// sm_90a), head dim 32: each step forms the tile's dS once and feeds dV, dK and dQ from it, where
// the separate kernels (evoformer_bwd_wgmma_kernels.cuh) recompute S, P, dP and dS in a dQ kernel
// of their own. No atomics: one CTA owns a whole (b, n, h) slice and walks its key tiles in order,
// each with the dK/dV kernel's loop over query tiles, so every sum runs in a fixed order:
//   S^T = K Q^T, dP^T = V dO^T (shared x shared), dV += P^T dO, dK += dS^T Q (registers x shared)
//   as in the dK/dV kernel; then dS^T goes to shared memory, and dQ_i += dS K_j (both operands
//   MN-major in shared memory) adds key tile j's share of query tile i's dQ to the slice's fp32
//   dQ in shared memory (each thread its own fragment, so the read-add-write needs no barrier),
//   the first key tile writing it and the last writing dQ itself.
// Shared memory grows with L (L x 32 x 4 bytes of dQ). Where two such CTAs do not fit an SM
// (triangle 768), a cluster of two CTAs owns the slice instead, CTA r the query tiles qt % 2 == r
// with their half of the dQ; both walk every key tile and add their partial dK, dV and dbias1
// through distributed shared memory at its end (evoformer_fused_exchange_key_tile). The launcher
// takes this kernel where the host plan (cuda_fused_backward_ranks) models it faster. delta comes
// from the dO and O tiles at the first key tile where O's rows are whole chunks
// (delta_from_out_tiles), else from the delta kernel, run first; dbias2 from the dbias2 kernel,
// run after. CUDA layer.
#pragma once

#include "common/evoformer_cuda_plan.h"
#include "cuda/common/cluster.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/evoformer/evoformer_bwd_wgmma_kernels.cuh"

namespace sciattn::cuda {

static_assert(detail::kCudaDkdvCtasPerSm == kEvoformerWgmmaDkdvCtas<32> &&
                  detail::kCudaDqCtasPerSm == kEvoformerWgmmaDqCtas<32>,
              "the host plan's model of the separate kernels");

// The query tiles whose dQ a CTA of the fused kernel keeps, of a slice of `tiles` split over a
// cluster of `ranks` (1 or 2) CTAs: rank 0's, the larger share.
__host__ __device__ constexpr int64_t evoformer_fused_dq_tiles(int64_t tiles, int64_t ranks) {
  return (tiles + ranks - 1) / ranks;
}

// The fused kernel's shared memory with kStages buffers of query tiles, each part on a 1024-byte
// boundary from the aligned base: the key tile's K and V, Q[kStages], dO[kStages], the rows'
// lse[kStages][64] and delta[kStages][64], dS^T of the step (64 keys x 64 queries, 16-bit, rows
// of 128 bytes in the 128-byte swizzle); the CTA's dQ sums follow at kBytes, then bias2's
// kStages stages. With two stages this is EvoformerWgmmaSmem<32>'s dK/dV layout (kA .. kFusedDs).
template <int kStages>
struct EvoformerFusedSmem {
  static constexpr uint32_t kTile = EvoformerWgmmaSmem<32>::kTileBytes;
  static constexpr uint32_t kK = 0, kV = kTile, kQ = 2 * kTile, kDo = (2 + kStages) * kTile;
  static constexpr uint32_t kStats = (2 + 2 * kStages) * kTile;
  static constexpr uint32_t kDs =
      (kStats + 2 * kStages * kWgmmaRows * sizeof(float) + 1023) / 1024 * 1024;
  static constexpr uint32_t kBytes = kDs + kWgmmaRows * kWgmmaRows * 2;
};
static_assert(EvoformerFusedSmem<2>::kBytes == EvoformerWgmmaSmem<32>::kFusedBytes &&
                  EvoformerFusedSmem<2>::kStats == EvoformerWgmmaSmem<32>::kStats,
              "two stages: the dK/dV kernel's layout");
static_assert(EvoformerFusedSmem<2>::kBytes == detail::kCudaFusedTileSmem[0] &&
                  EvoformerFusedSmem<3>::kBytes == detail::kCudaFusedTileSmem[1],
              "the host plan's shared memory (cuda_fused_backward_smem)");

// Stores this thread's dS^T fragments (pack_a_fragments of the 64 keys x 64 queries tile) into the
// tile at `tile` (rows = keys, 128 bytes of queries each, 128-byte swizzle), which a warpgroup
// MMA then reads MN-major as dS. A warp's 32 lanes hit 32 different banks per store.
__device__ __forceinline__ void store_transposed_ds(unsigned char* tile, const uint32_t (&a)[4][4],
                                                    int warp, int lane) {
  const int row = warp * 16 + lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // chunk 2 kk + half: queries 16 kk + 8 half ..
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // rows g and g + 8
        const uint32_t at = swizzled_chunk_offset<kWgmmaRows, 128>(row + 8 * r, 2 * kk + half);
        *reinterpret_cast<uint32_t*>(tile + at + 4 * t) = a[kk][2 * half + r];
      }
    }
  }
}

// dq (64 x 32, fp32) += dS K: A = dS^T's tile read MN-major, B = the K tile read MN-major (its
// rows are the reduction's keys, as V's in O = P V), waited for.
template <typename T, int kHeadDim>
__device__ __forceinline__ void wgmma_ds_k(float (&dq)[kHeadDim / 8][4], uint32_t ds_tile,
                                           uint32_t k_tile) {
  wgmma_pin(dq);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64nNk16_ss_tt<T, kHeadDim>(
        dq, mn_major_step<kWgmmaRows, 128>(ds_tile, kk),
        mn_major_step<kWgmmaRows, kSwizzleBytes<kHeadDim>>(k_tile, kk), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(dq);
}

// The end of a key tile in a cluster of two: the two CTAs' partial dK, dV and dbias1 (sums over
// their own query tiles) become the tile's sums, rank 0 storing dK and dbias1 and rank 1 dV. Each
// sends the other the partial it does not store, into the other's dS^T tile (8 KB: 16 floats a
// thread, thread-major as the dQ sums) and, for dbias1, the other's lse stage 0 (a float per key):
// both are free once every thread of both CTAs is past its last step (the first cluster barrier),
// and the second barrier makes the stores visible. The next writes into either area come after
// the next key tile's first barrier (this CTA's) or its first cluster barrier (the partner's),
// both after the reads here. Two terms, so the sum's bits do not depend on which CTA adds them.
// dim: the D of the rows stored (written_dim).
template <typename T, int kHeadDim>
__device__ __forceinline__ void evoformer_fused_exchange_key_tile(
    const EvoformerDeviceParams& p, float (&dk)[kHeadDim / 8][4], float (&dv)[kHeadDim / 8][4],
    const float (&key_dbias1)[2], uint32_t rank, float4* received, float* received_dbias1,
    int64_t b, int64_t n, int64_t h, int64_t bn, const int64_t (&my_keys)[2], int warp, int lane,
    int64_t dim) {
  constexpr int kOutTiles = kHeadDim / 8;
  const int t = lane % 4;
  const bool dbias1 = p.dbias1_partial != nullptr;
  float dbias1_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    dbias1_sum[r] = key_dbias1[r];
    dbias1_sum[r] += __shfl_xor_sync(0xffffffffu, dbias1_sum[r], 1);
    dbias1_sum[r] += __shfl_xor_sync(0xffffffffu, dbias1_sum[r], 2);
  }
  cluster_sync();  // both CTAs are past their last step of the key tile
  const uint32_t partner = rank ^ 1u;
  const uint32_t remote = cluster_shared_address(shared_address(received + threadIdx.x), partner);
  if (rank == 0) {
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      store_cluster_shared(remote + i * kWgmmaThreads * sizeof(float4),
                           make_float4(dv[i][0], dv[i][1], dv[i][2], dv[i][3]));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      store_cluster_shared(remote + i * kWgmmaThreads * sizeof(float4),
                           make_float4(dk[i][0], dk[i][1], dk[i][2], dk[i][3]));
    }
    if (dbias1 && t == 0) {
      const uint32_t remote_dbias1 = cluster_shared_address(shared_address(received_dbias1), 0);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        store_cluster_shared(remote_dbias1 + (warp * 16 + lane / 4 + 8 * r) * sizeof(float),
                             dbias1_sum[r]);
      }
    }
  }
  cluster_sync();  // the partner's partial is here
  auto add_received = [&](float(&kept)[kOutTiles][4]) {
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      const float4 other = received[i * kWgmmaThreads + threadIdx.x];
      kept[i][0] += other.x;
      kept[i][1] += other.y;
      kept[i][2] += other.z;
      kept[i][3] += other.w;
    }
  };
  if (rank == 0) {
    add_received(dk);
    store_rows<T, kOutTiles>(dk, p.scale, p.dk, p.dk_stride, b, n, h, my_keys, p.len, dim, t,
                             p.grads_paired);
    if (dbias1 && t == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (my_keys[r] < p.len) {
          p.dbias1_partial[(bn * p.heads + h) * p.len + my_keys[r]] =
              dbias1_sum[r] + received_dbias1[warp * 16 + lane / 4 + 8 * r];
        }
      }
    }
  } else {
    add_received(dv);
    store_rows<T, kOutTiles>(dv, 1.0f, p.dv, p.dv_stride, b, n, h, my_keys, p.len, dim, t,
                             p.grads_paired);
  }
}

// kRanks CTAs per slice: 1 (a plain launch), or 2 (launched as clusters of two, CTA r the query
// tiles qt % 2 == r, the key tiles' sums meeting at the end of each). BiasTypes: the bias types
// it is compiled for (evoformer_bias_types.cuh). kStages: query-tile buffers, 3 where two such
// CTAs still fit an SM (copies two steps ahead), else 2.
template <typename T, int kHeadDim, int kRanks, typename BiasTypes, int kStages>
__global__ void __launch_bounds__(kWgmmaThreads, detail::kCudaFusedBackwardCtasPerSm)
    evoformer_bwd_fused_wgmma_kernel(const EvoformerDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  enter_overlapped_grid();
  static_assert(kHeadDim == 32, "the fused backward runs head dim 32 (the host plan)");
  static_assert(kRanks == 1 || kRanks == 2, "clusters of one or two CTAs per slice");
  static_assert(kStages == 2 || (kStages == 3 && kRanks == 1), "the host plan's stages");
  using Smem = EvoformerFusedSmem<kStages>;
  constexpr int kOutTiles = kHeadDim / 8;
  const BiasTypes types(p);
  static_assert(kOutTiles * kWgmmaThreads * sizeof(float4) <= kWgmmaRows * kWgmmaRows * 2,
                "a partial dK or dV fits the dS^T tile");
  static_assert(EvoformerWgmmaSmem<kHeadDim>::kTileBytes <= kOutTiles * kWgmmaThreads * 16,
                "a query tile's O rows fit its dQ sums' shared memory");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AlignedSmem smem = aligned_smem(smem_raw);
  const uint32_t k_tile = smem.address + Smem::kK, v_tile = smem.address + Smem::kV;
  unsigned char* const ds_stored = smem.pointer + Smem::kDs;
  const uint32_t ds_tile = smem.address + Smem::kDs;
  float* const stats = reinterpret_cast<float*>(smem.pointer + Smem::kStats);
  const int64_t tiles = (p.len + kWgmmaRows - 1) / kWgmmaRows;
  // This CTA's query tiles: qt = kRanks i + rank, i < my_tiles.
  const uint32_t rank = kRanks > 1 ? cluster_cta_rank() : 0;
  const int64_t my_tiles = (tiles - rank + kRanks - 1) / kRanks;
  // This CTA's dQ: its query tile i's fragment j of this thread at [(i kOutTiles + j) 128 +
  // thread].
  float4* const dq_sum = reinterpret_cast<float4*>(smem.pointer + Smem::kBytes) + threadIdx.x;
  unsigned char* const bias2_stages =
      smem.pointer + Smem::kBytes + evoformer_fused_dq_tiles(tiles, kRanks) * 8192;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const float scale_log2 = p.scale * kLog2e;
  // blockIdx.x / kRanks = bn * heads + h, the order of the per-tile kernels' grids.
  const QuotientRemainder by_head = fast_divmod(blockIdx.x / kRanks, p.heads_div);
  const QuotientRemainder by_n = fast_divmod(by_head.quotient, p.n_div);
  const int64_t h = by_head.remainder, bn = by_head.quotient, b = by_n.quotient, n = by_n.remainder;
  const SliceSource q_src = slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h);
  const SliceSource do_src = slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h);
  const SliceSource k_src = slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h);
  const SliceSource v_src = slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h);

  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int64_t key0 = kt * kWgmmaRows;
    const int64_t my_keys[2] = {key0 + warp * 16 + lane / 4, key0 + warp * 16 + lane / 4 + 8};
    const bool first_keys = kt == 0, last_keys = kt + 1 == tiles;
    const EvoformerQueryTileLoader<T, kHeadDim, kStages, BiasTypes::kCols> queries(
        p, q_src, do_src, b, bn, h, key0, smem.address + Smem::kQ, smem.address + Smem::kDo, stats,
        bias2_stages, types.bias2);
    // At the first key tile, where delta_from_out_tiles, each query tile's O rows come with its Q
    // and dO, into the shared memory of that tile's dQ sums (which the step writes only after its
    // barrier), and delta is summed from the dO and O chunks each thread copied, before the
    // barrier (delta_of_copied_rows): into the tile's delta stage, and the workspace, from which
    // the later key tiles (and the dbias2 kernel) copy it. Else the delta kernel wrote it.
    const bool delta_from_out = first_keys && p.delta_from_out_tiles != 0;
    const auto o_tile = [&](int64_t i) {
      return smem.address + Smem::kBytes +
             static_cast<uint32_t>(i) * kOutTiles * kWgmmaThreads * 16;
    };
    auto load_query_tile = [&](int64_t i, int buf) {
      queries.load(p, kRanks * i + rank, buf, delta_from_out ? o_tile(i) : 0u);
    };
    int64_t step = 0;  // the loop's i, for the hook below
    auto convert_lse = [&](int buf) {
      stage_lse_to_log2<kWgmmaRows>(queries.lse(buf));
      if (delta_from_out) {
        const int64_t q0 = (kRanks * step + rank) * kWgmmaRows;
        delta_of_copied_rows<T, kHeadDim>(smem.pointer + (queries.do_tile(buf) - smem.address),
                                          smem.pointer + (o_tile(step) - smem.address),
                                          queries.delta(buf),
                                          p.delta + (bn * p.heads + h) * p.len + q0, p.len - q0);
      }
    };
    uint32_t key_bias1_bits[2];  // converted at the first step, after the tiles' wait
    load_key_bias1_bits(key_bias1_bits, p, b, n, my_keys);
    // Every thread is done with the previous key tile's K, V, query tiles and dS^T (and, in a
    // cluster, the partial sums received there).
    if (!first_keys) __syncthreads();
    if (kRanks == 1 || my_tiles > 0) {
      copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(k_tile, k_src, key0, p);
      copy_slice_swizzled<T, kHeadDim, BiasTypes::kCols>(v_tile, v_src, key0, p);
      load_query_tile(0, 0);
      cp_async_commit();
    }
    if constexpr (kStages == 3) {  // next_stage_of's second iteration in flight (maybe empty)
      if (my_tiles > 1) load_query_tile(1, 1);
      cp_async_commit();
    }

    float key_bias1[2] = {0.0f, 0.0f};
    float dk[kOutTiles][4], dv[kOutTiles][4], key_dbias1[2];
    zero_key_tile_sums(dk, dv, key_dbias1);
    // A partial last key tile: its keys past L must add nothing to dQ (their K rows are zero, but
    // their P, from zero-filled biases, is not).
    const bool keys_past_len = key0 + kWgmmaRows > p.len;

    int buf = 0;  // i % kStages
    for (int64_t i = 0; i < my_tiles; ++i, buf = buf + 1 == kStages ? 0 : buf + 1) {
      const int64_t qt = kRanks * i + rank;
      step = i;
      if constexpr (kStages == 2) {
        next_stage(i, my_tiles, buf, load_query_tile, convert_lse);
      } else {
        next_stage_of<kStages>(i, my_tiles, buf, load_query_tile, convert_lse);
      }
      if (i == 0) key_bias1_from_bits(key_bias1, key_bias1_bits, types.bias1);
      float pt[8][4];
      evoformer_dkdv_wgmma_ds(pt, dv, key_dbias1, k_tile, v_tile, queries, buf, types.bias2,
                              scale_log2, key_bias1, warp, lane);
      if (keys_past_len) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (my_keys[r] >= p.len) {
#pragma unroll
            for (int j = 0; j < 8; ++j) pt[j][2 * r] = pt[j][2 * r + 1] = 0.0f;
          }
        }
      }
      uint32_t ds[4][4];
      pack_a_fragments<T>(ds, pt);
      store_transposed_ds(ds_stored, ds, warp, lane);
      // The query tile's dQ so far (read here, so that the reads pass while the products below
      // run), into the accumulators of the product that adds this key tile's share to it.
      float4* const sum = dq_sum + i * kOutTiles * kWgmmaThreads;
      float dq[kOutTiles][4];
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        const float4 earlier =
            first_keys ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : sum[j * kWgmmaThreads];
        dq[j][0] = earlier.x;
        dq[j][1] = earlier.y;
        dq[j][2] = earlier.z;
        dq[j][3] = earlier.w;
      }
      fence_proxy_async_shared();
      wgmma_acc_packed<T, kHeadDim>(dk, ds, queries.q_tile(buf));  // dK += dS^T Q
      __syncthreads();                               // every warp's keys of dS^T are in the tile
      wgmma_ds_k<T, kHeadDim>(dq, ds_tile, k_tile);  // dQ += dS K_j: this key tile's share
      if (last_keys) {
        const int64_t q0 = qt * kWgmmaRows;
        const int64_t my_rows[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
        store_rows<T, kOutTiles>(dq, p.scale, p.dq, p.dq_stride, b, n, h, my_rows, p.len,
                                 written_dim<kHeadDim, BiasTypes>(p), t, p.grads_paired);
      } else {
#pragma unroll
        for (int j = 0; j < kOutTiles; ++j)
          sum[j * kWgmmaThreads] = make_float4(dq[j][0], dq[j][1], dq[j][2], dq[j][3]);
      }
    }

    if constexpr (kRanks > 1) {
      evoformer_fused_exchange_key_tile<T, kHeadDim>(
          p, dk, dv, key_dbias1, rank, reinterpret_cast<float4*>(ds_stored), queries.lse(0), b, n,
          h, bn, my_keys, warp, lane, written_dim<kHeadDim, BiasTypes>(p));
    } else {
      evoformer_finish_dkdv<T, kHeadDim>(p, dk, dv, key_dbias1, b, n, h, bn, my_keys, t,
                                         written_dim<kHeadDim, BiasTypes>(p));
    }
  }
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda

// The Evoformer attention backward kernels (CUDA layer), deterministic by construction: no
// floating-point atomics; every output element is owned by one thread of one CTA, and sums that
// cross CTAs go through fp32 partials in the workspace that a second kernel adds in a fixed order.
//   1. evoformer_bwd_delta_kernel:  delta_i = <dO_i, O_i>
//   2. evoformer_bwd_dkdv_kernel:   per (64 keys, h, b, chunk of N): dK, dV, and the partials of
//                                   dbias1 (per head) and dbias2 (per chunk)
//   3. evoformer_bwd_dq_kernel:     per (64 queries, h, b*n): dQ
//   4. evoformer_bwd_dbias_reduce_kernel: dbias1 = sum over heads, dbias2 = sum over chunks
// dS is formed in fp32 from fp32 P (never from P rounded to the storage type).
#pragma once

#include "cuda/evoformer/evoformer_device_utils.cuh"

namespace sciattn::cuda {

struct EvoformerBwdTile {
  // Keys per dK/dV CTA, queries per dQ CTA, and the tile of the other side.
  static constexpr int kBlock = 64;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
};

template <typename T, int kHeadDim>
struct EvoformerBwdSmem {
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kTile = EvoformerBwdTile::kBlock * kPitch;
  T a[kTile];     // dK/dV kernel: K of this n; dQ kernel: Q
  T b[kTile];     // dK/dV kernel: V of this n; dQ kernel: dO
  T c[2][kTile];  // the streamed tile, double-buffered: Q (dK/dV) or K (dQ)
  T d[2][kTile];  // the streamed tile, double-buffered: dO (dK/dV) or V (dQ)
  float lse[2][EvoformerBwdTile::kBlock];  // lse of the streamed query rows (dK/dV kernel)
  float delta[2][EvoformerBwdTile::kBlock];
  // Followed, in the dK/dV kernel with dbias2_in_smem, by the chunk's dbias2 partial
  // [ceil64(L)][64] floats (see dbias2_index).
};

// Index of (query q, key column k < 64) in the shared dbias2 partial. Rows are unpadded so that
// L = 768 still fits next to the tiles; instead the key is XOR-swizzled with bits 1..2 of q,
// which for one warp's access (q = 2t + const, k = 8 * const + g) puts the 32 lanes in 32
// distinct banks.
__device__ __forceinline__ int64_t dbias2_index(int64_t q, int k) {
  return q * 64 + (k ^ static_cast<int>(((q >> 1) & 3) << 3));
}

template <typename T>
__global__ void evoformer_bwd_delta_kernel(const EvoformerDeviceParams p) {
  const int64_t rows = p.batch * p.n * p.len * p.heads;
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = row % p.heads, i = (row / p.heads) % p.len, bn = row / (p.heads * p.len);
    const int64_t b = bn / p.n, n = bn % p.n;
    const T* o = static_cast<const T*>(p.out) + b * p.out_stride[0] + n * p.out_stride[1] +
                 i * p.out_stride[2] + h * p.out_stride[3];
    const T* go = static_cast<const T*>(p.dout) + b * p.dout_stride[0] + n * p.dout_stride[1] +
                  i * p.dout_stride[2] + h * p.dout_stride[3];
    float acc = 0.0f;
    for (int64_t d = 0; d < p.dim; ++d) {
      acc += ElementTraits<T>::to_float(o[d]) * ElementTraits<T>::to_float(go[d]);
    }
    p.delta[(bn * p.heads + h) * p.len + i] = acc;
  }
}

// A fragment (16 rows x kHeadDim) of a shared tile, for use as the MMA's A operand.
template <typename T, int kSteps, int kPitch>
__device__ __forceinline__ void load_a_frags(uint32_t frag[kSteps][4], const T* tile, int g,
                                             int t) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    frag[s][0] = load_pair(tile + g * kPitch + s * 16 + 2 * t);
    frag[s][1] = load_pair(tile + (g + 8) * kPitch + s * 16 + 2 * t);
    frag[s][2] = load_pair(tile + g * kPitch + s * 16 + 2 * t + 8);
    frag[s][3] = load_pair(tile + (g + 8) * kPitch + s * 16 + 2 * t + 8);
  }
}

// acc[j] (16 x 8, j = 0..7) = A (16 x kHeadDim, fragments) * rows^T, rows = 64 rows of `tile`.
template <typename T, int kSteps, int kPitch>
__device__ __forceinline__ void mma_rows_t(float acc[8][4], const uint32_t a[kSteps][4],
                                           const T* tile, int g, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const T* r = tile + (j * 8 + g) * kPitch + s * 16 + 2 * t;
      const uint32_t bf[2] = {load_pair(r), load_pair(r + 8)};
      mma_16816<T>(acc[j], a[s], bf);
    }
  }
}

// out[i] (16 x kHeadDim) += X (16 x 64, given as fp32 accumulators of eight n8 tiles) * tile,
// tile = 64 rows x kHeadDim in shared memory. X is rounded to T for the tensor cores.
template <typename T, int kOutTiles, int kPitch>
__device__ __forceinline__ void mma_acc_tile(float out[kOutTiles][4], const float x[8][4],
                                             const T* tile, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {ElementTraits<T>::pack(x[2 * kk][0], x[2 * kk][1]),
                           ElementTraits<T>::pack(x[2 * kk][2], x[2 * kk][3]),
                           ElementTraits<T>::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                           ElementTraits<T>::pack(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      const T* r = tile + (kk * 16 + 2 * t) * kPitch + i * 8 + g;
      const uint32_t bf[2] = {load_column_pair(r, kPitch),
                              load_column_pair(r + 8 * kPitch, kPitch)};
      mma_16816<T>(out[i], a, bf);
    }
  }
}

// Writes 16 rows (this warp's) x dim of an accumulator times `factor` into a [B,N,L,H,D] tensor.
template <typename T, int kOutTiles>
__device__ __forceinline__ void store_rows(const float acc[kOutTiles][4], float factor, void* base,
                                           const int64_t stride[4], int64_t b, int64_t n, int64_t h,
                                           const int64_t rows[2], int64_t len, int64_t dim, int t) {
  T* out = static_cast<T*>(base) + b * stride[0] + n * stride[1] + h * stride[3];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= len) continue;
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      const int d = i * 8 + 2 * t;
      if (d < dim)
        out[rows[r] * stride[2] + d] = ElementTraits<T>::from_float(acc[i][2 * r] * factor);
      if (d + 1 < dim)
        out[rows[r] * stride[2] + d + 1] = ElementTraits<T>::from_float(acc[i][2 * r + 1] * factor);
    }
  }
}

// P from the log2 score and the row's lse * log2(e); a fully masked row (lse -inf) gives 0.
__device__ __forceinline__ float prob_from_log2(float x, float lse_log2) {
  return lse_log2 == kNegInf ? 0.0f : exp2f(x - lse_log2);
}

// Starts copying the lse and delta of query rows [q0, q0 + 64) into shared memory, in the
// caller's cp.async group (plain loads here would stall every thread at the next barrier).
// Rows past L get 0: their probabilities are masked by the caller.
__device__ __forceinline__ void load_row_stats(float* lse, float* delta,
                                               const EvoformerDeviceParams& p, int64_t bn,
                                               int64_t h, int64_t q0) {
  for (int r = threadIdx.x; r < EvoformerBwdTile::kBlock; r += EvoformerBwdTile::kThreads) {
    const int64_t q = q0 + r;
    const bool valid = q < p.len;
    const float* lse_src =
        valid ? p.lse + bn * p.lse_stride[0] + h * p.lse_stride[1] + q * p.lse_stride[2] : p.lse;
    const float* delta_src = valid ? p.delta + (bn * p.heads + h) * p.len + q : p.delta;
    cp_async_4(lse + r, lse_src, valid ? 4 : 0);
    cp_async_4(delta + r, delta_src, valid ? 4 : 0);
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(EvoformerBwdTile::kThreads)
    evoformer_bwd_dkdv_kernel(const EvoformerDeviceParams p) {
  using Tile = EvoformerBwdTile;
  using Smem = EvoformerBwdSmem<T, kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kHeadDim / 16;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  float* dbias2_smem =
      p.dbias2_in_smem ? reinterpret_cast<float*>(smem_raw + sizeof(Smem)) : nullptr;

  const int64_t key_blocks = (p.len + Tile::kBlock - 1) / Tile::kBlock;
  int64_t block = blockIdx.x;
  const int64_t key_block = block % key_blocks;
  block /= key_blocks;
  const int64_t h = block % p.heads;
  block /= p.heads;
  const int64_t chunk = block % p.dbias2_chunks;
  const int64_t b = block / p.dbias2_chunks;
  const int64_t n_begin = chunk * p.n / p.dbias2_chunks,
                n_end = (chunk + 1) * p.n / p.dbias2_chunks;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t key0 = key_block * Tile::kBlock;
  const int64_t my_keys[2] = {key0 + warp * 16 + g, key0 + warp * 16 + g + 8};
  const int64_t q_tiles = (p.len + Tile::kBlock - 1) / Tile::kBlock;
  float* dbias2_global =
      p.dbias2_partial == nullptr
          ? nullptr
          : p.dbias2_partial + ((chunk * p.batch + b) * p.heads + h) * p.len * p.len;
  if (dbias2_smem != nullptr) {
    for (int64_t e = threadIdx.x; e < q_tiles * Tile::kBlock * 64; e += Tile::kThreads)
      dbias2_smem[e] = 0.0f;
  }

  // bias2 read transposed: the thread's rows are keys, so its "row pointers" are the key columns
  // and the stride along the tile's columns (queries) is the query stride.
  const void* bias2_cols[2] = {nullptr, nullptr};
  if (p.bias2_type != BiasType::kNone) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (my_keys[r] < p.len) {
        bias2_cols[r] = bias_ptr(
            p.bias2, p.bias2_type,
            b * p.bias2_stride[0] + h * p.bias2_stride[1] + my_keys[r] * p.bias2_stride[3]);
      }
    }
  }

  for (int64_t n = n_begin; n < n_end; ++n) {
    const int64_t bn = b * p.n + n;
    const SliceSource q_src = slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h);
    const SliceSource do_src = slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h);
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(
        smem.a, slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h), key0, p.len, p.dim);
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(
        smem.b, slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h), key0, p.len, p.dim);
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.c[0], q_src, 0, p.len, p.dim);
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.d[0], do_src, 0, p.len,
                                                                 p.dim);
    load_row_stats(smem.lse[0], smem.delta[0], p, bn, h, 0);
    cp_async_commit();
    // bias1 depends on the key alone: in the transposed tile it is a per-row constant.
    const void* bias1_keys[2] = {nullptr, nullptr};
    if (p.bias1_type != BiasType::kNone) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (my_keys[r] < p.len) {
          bias1_keys[r] = bias_ptr(
              p.bias1, p.bias1_type,
              b * p.bias1_stride[0] + n * p.bias1_stride[1] + my_keys[r] * p.bias1_stride[2]);
        }
      }
    }

    uint32_t k_frag[kSteps][4], v_frag[kSteps][4];
    float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
    float key_dbias1[2] = {0.0f, 0.0f};  // this thread's share of sum over queries of dS

    for (int64_t qt = 0; qt < q_tiles; ++qt) {
      const int buf = static_cast<int>(qt & 1);
      const int64_t q0 = qt * Tile::kBlock;
      if (qt + 1 < q_tiles) {
        load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(
            smem.c[buf ^ 1], q_src, q0 + Tile::kBlock, p.len, p.dim);
        load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(
            smem.d[buf ^ 1], do_src, q0 + Tile::kBlock, p.len, p.dim);
        load_row_stats(smem.lse[buf ^ 1], smem.delta[buf ^ 1], p, bn, h, q0 + Tile::kBlock);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      if (qt == 0) {
        load_a_frags<T, kSteps, kPitch>(k_frag, smem.a + warp * 16 * kPitch, g, t);
        load_a_frags<T, kSteps, kPitch>(v_frag, smem.b + warp * 16 * kPitch, g, t);
      }
      const T* q_tile = smem.c[buf];
      const T* do_tile = smem.d[buf];
      const float* lse = smem.lse[buf];
      const float* delta = smem.delta[buf];

      // P^T (16 keys x 64 queries) from S^T = K Q^T plus the biases, in log2 units.
      float pt[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) pt[j][0] = pt[j][1] = pt[j][2] = pt[j][3] = 0.0f;
      add_bias_tile(p.bias1_type, pt, bias1_keys, 0, q0, p.len, t);
      add_bias_tile(p.bias2_type, pt, bias2_cols, p.bias2_stride[2], q0, p.len, t);
      float st[8][4];
      mma_rows_t<T, kSteps, kPitch>(st, k_frag, q_tile, g, t);
      const float scale_log2 = p.scale * kLog2e;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = j * 8 + 2 * t + (e & 1);
          const bool valid = my_keys[e >> 1] < p.len && q0 + qc < p.len;
          const float x = fmaf(st[j][e], scale_log2, pt[j][e]);
          pt[j][e] = valid ? prob_from_log2(x, lse[qc] * kLog2e) : 0.0f;
        }
      // dV += P^T dO.
      mma_acc_tile<T, kOutTiles, kPitch>(dv, pt, do_tile, g, t);
      // dP^T = V dO^T, then dS^T = P^T (dP^T - delta).
      float ds[8][4];
      mma_rows_t<T, kSteps, kPitch>(ds, v_frag, do_tile, g, t);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = j * 8 + 2 * t + (e & 1);
          ds[j][e] = pt[j][e] * (ds[j][e] - delta[qc]);
          key_dbias1[e >> 1] += ds[j][e];
        }
      // dK += dS^T Q (times scale when written).
      mma_acc_tile<T, kOutTiles, kPitch>(dk, ds, q_tile, g, t);
      // This chunk's dbias2 partial: each element belongs to this thread alone and the n's of
      // the chunk are added in order.
      if (dbias2_smem != nullptr) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t q = q0 + j * 8 + 2 * t + (e & 1);
            dbias2_smem[dbias2_index(q, warp * 16 + g + 8 * (e >> 1))] += ds[j][e];
          }
      } else if (dbias2_global != nullptr) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t q = q0 + j * 8 + 2 * t + (e & 1), key = my_keys[e >> 1];
            if (q < p.len && key < p.len) {
              float* cell = dbias2_global + q * p.len + key;
              *cell = (n == n_begin ? 0.0f : *cell) + ds[j][e];
            }
          }
      }
      __syncthreads();  // the buffers of this tile are refilled next iteration
    }

    store_rows<T, kOutTiles>(dk, p.scale, p.dk, p.dk_stride, b, n, h, my_keys, p.len, p.dim, t);
    store_rows<T, kOutTiles>(dv, 1.0f, p.dv, p.dv_stride, b, n, h, my_keys, p.len, p.dim, t);
    if (p.dbias1_partial != nullptr) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = key_dbias1[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0 && my_keys[r] < p.len) {
          p.dbias1_partial[((b * p.n + n) * p.heads + h) * p.len + my_keys[r]] = sum;
        }
      }
    }
  }

  // The chunk's dbias2 partial, from shared memory to the workspace (coalesced along keys).
  if (dbias2_smem != nullptr) {
    __syncthreads();
    const int64_t keys = min(static_cast<int64_t>(Tile::kBlock), p.len - key0);
    for (int64_t e = threadIdx.x; e < p.len * Tile::kBlock; e += Tile::kThreads) {
      const int64_t q = e / Tile::kBlock, k = e % Tile::kBlock;
      if (k < keys)
        dbias2_global[q * p.len + key0 + k] = dbias2_smem[dbias2_index(q, static_cast<int>(k))];
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(EvoformerBwdTile::kThreads)
    evoformer_bwd_dq_kernel(const EvoformerDeviceParams p) {
  using Tile = EvoformerBwdTile;
  using Smem = EvoformerBwdSmem<T, kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kHeadDim / 16;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  const int64_t query_blocks = (p.len + Tile::kBlock - 1) / Tile::kBlock;
  int64_t block = blockIdx.x;
  const int64_t query_block = block % query_blocks;
  block /= query_blocks;
  const int64_t h = block % p.heads;
  const int64_t bn = block / p.heads;
  const int64_t b = bn / p.n, n = bn % p.n;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t q0 = query_block * Tile::kBlock;
  const int64_t my_rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int64_t k_tiles = (p.len + Tile::kBlock - 1) / Tile::kBlock;

  const SliceSource k_src = slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h);
  const SliceSource v_src = slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h);
  load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(
      smem.a, slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h), q0, p.len, p.dim);
  load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(
      smem.b, slice_of(p.dout, p.dout_stride, p.vec_dout, sizeof(T), b, n, h), q0, p.len, p.dim);
  load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.c[0], k_src, 0, p.len, p.dim);
  load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.d[0], v_src, 0, p.len, p.dim);
  cp_async_commit();

  float lse_log2[2], delta[2];
  const void* bias1_rows[2] = {nullptr, nullptr};
  const void* bias2_rows[2] = {nullptr, nullptr};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = my_rows[r] < p.len;
    lse_log2[r] =
        valid ? p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]] *
                    kLog2e
              : kNegInf;
    delta[r] = valid ? p.delta[(bn * p.heads + h) * p.len + my_rows[r]] : 0.0f;
    if (p.bias1_type != BiasType::kNone) {
      bias1_rows[r] =
          bias_ptr(p.bias1, p.bias1_type, b * p.bias1_stride[0] + n * p.bias1_stride[1]);
    }
    if (p.bias2_type != BiasType::kNone && valid) {
      bias2_rows[r] =
          bias_ptr(p.bias2, p.bias2_type,
                   b * p.bias2_stride[0] + h * p.bias2_stride[1] + my_rows[r] * p.bias2_stride[2]);
    }
  }

  uint32_t q_frag[kSteps][4], do_frag[kSteps][4];
  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const int buf = static_cast<int>(kt & 1);
    const int64_t k0 = kt * Tile::kBlock;
    if (kt + 1 < k_tiles) {
      load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.c[buf ^ 1], k_src,
                                                                   k0 + Tile::kBlock, p.len, p.dim);
      load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.d[buf ^ 1], v_src,
                                                                   k0 + Tile::kBlock, p.len, p.dim);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == 0) {
      load_a_frags<T, kSteps, kPitch>(q_frag, smem.a + warp * 16 * kPitch, g, t);
      load_a_frags<T, kSteps, kPitch>(do_frag, smem.b + warp * 16 * kPitch, g, t);
    }
    float pr[8][4], dots[8][4], ds[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) pr[j][0] = pr[j][1] = pr[j][2] = pr[j][3] = 0.0f;
    add_bias_tile(p.bias1_type, pr, bias1_rows, p.bias1_stride[2], k0, p.len, t);
    add_bias_tile(p.bias2_type, pr, bias2_rows, p.bias2_stride[3], k0, p.len, t);
    mma_rows_t<T, kSteps, kPitch>(dots, q_frag, smem.c[buf], g, t);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = my_rows[e >> 1] < p.len && k0 + j * 8 + 2 * t + (e & 1) < p.len;
        pr[j][e] =
            valid ? prob_from_log2(fmaf(dots[j][e], scale_log2, pr[j][e]), lse_log2[e >> 1]) : 0.0f;
      }
    mma_rows_t<T, kSteps, kPitch>(ds, do_frag, smem.d[buf], g, t);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[j][e] = pr[j][e] * (ds[j][e] - delta[e >> 1]);
    mma_acc_tile<T, kOutTiles, kPitch>(dq, ds, smem.c[buf], g, t);  // dQ += dS K
    __syncthreads();
  }
  store_rows<T, kOutTiles>(dq, p.scale, p.dq, p.dq_stride, b, n, h, my_rows, p.len, p.dim, t);
}

}  // namespace sciattn::cuda

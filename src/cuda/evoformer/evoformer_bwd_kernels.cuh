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
  static constexpr int kBlock = 64;  // keys per dK/dV CTA, queries per dQ CTA, and the tile of the other side
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
};

template <typename T, int kHeadDim>
struct EvoformerBwdSmem {
  static constexpr int kPitch = kHeadDim + 8;
  T a[EvoformerBwdTile::kBlock * kPitch];   // dK/dV kernel: K; dQ kernel: Q
  T b[EvoformerBwdTile::kBlock * kPitch];   // dK/dV kernel: V; dQ kernel: dO
  T c[EvoformerBwdTile::kBlock * kPitch];   // the streamed tile: Q or K
  T d[EvoformerBwdTile::kBlock * kPitch];   // the streamed tile: dO or V
  float lse_log2[EvoformerBwdTile::kBlock];  // lse * log2(e) of the streamed query rows
  float delta[EvoformerBwdTile::kBlock];
};

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
__device__ __forceinline__ void load_a_frags(uint32_t frag[kSteps][4], const T* tile, int g, int t) {
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
__device__ __forceinline__ void mma_rows_t(float acc[8][4], const uint32_t a[kSteps][4], const T* tile,
                                           int g, int t) {
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
__device__ __forceinline__ void mma_acc_tile(float out[kOutTiles][4], const float x[8][4], const T* tile,
                                             int g, int t) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {ElementTraits<T>::pack(x[2 * kk][0], x[2 * kk][1]),
                           ElementTraits<T>::pack(x[2 * kk][2], x[2 * kk][3]),
                           ElementTraits<T>::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                           ElementTraits<T>::pack(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      const T* r = tile + (kk * 16 + 2 * t) * kPitch + i * 8 + g;
      const uint32_t bf[2] = {load_column_pair(r, kPitch), load_column_pair(r + 8 * kPitch, kPitch)};
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
      if (d < dim) out[rows[r] * stride[2] + d] = ElementTraits<T>::from_float(acc[i][2 * r] * factor);
      if (d + 1 < dim) out[rows[r] * stride[2] + d + 1] = ElementTraits<T>::from_float(acc[i][2 * r + 1] * factor);
    }
  }
}

// The scaled log2-domain score of (query, key) given the raw dot product, or -inf outside [0, L).
__device__ __forceinline__ float score_log2(const EvoformerDeviceParams& p, float dot, int64_t query,
                                            int64_t key, int64_t bias1_base, int64_t bias2_base) {
  if (query >= p.len || key >= p.len) return kNegInf;
  float x = dot * (p.scale * kLog2e);
  if (p.bias1_type != BiasType::kNone) {
    x += load_bias(p.bias1, p.bias1_type, bias1_base + key * p.bias1_stride[2]) * kLog2e;
  }
  if (p.bias2_type != BiasType::kNone) {
    x += load_bias(p.bias2, p.bias2_type, bias2_base + query * p.bias2_stride[2] + key * p.bias2_stride[3]) *
         kLog2e;
  }
  return x;
}

// P from the log2 score and the row's lse * log2(e); a fully masked row (lse -inf) gives 0.
__device__ __forceinline__ float prob_from_log2(float x, float lse_log2) {
  return lse_log2 == kNegInf ? 0.0f : exp2f(x - lse_log2);
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

  const int64_t key_blocks = (p.len + Tile::kBlock - 1) / Tile::kBlock;
  int64_t block = blockIdx.x;
  const int64_t key_block = block % key_blocks;
  block /= key_blocks;
  const int64_t h = block % p.heads;
  block /= p.heads;
  const int64_t chunk = block % p.dbias2_chunks;
  const int64_t b = block / p.dbias2_chunks;
  const int64_t n_begin = chunk * p.n / p.dbias2_chunks, n_end = (chunk + 1) * p.n / p.dbias2_chunks;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t key0 = key_block * Tile::kBlock;
  const int64_t my_keys[2] = {key0 + warp * 16 + g, key0 + warp * 16 + g + 8};
  const int64_t bias2_base = b * p.bias2_stride[0] + h * p.bias2_stride[1];
  float* dbias2_acc = p.dbias2_partial == nullptr
                          ? nullptr
                          : p.dbias2_partial + ((chunk * p.batch + b) * p.heads + h) * p.len * p.len;

  for (int64_t n = n_begin; n < n_end; ++n) {
    const int64_t bn = b * p.n + n;
    const int64_t bias1_base = b * p.bias1_stride[0] + n * p.bias1_stride[1];
    __syncthreads();
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.a, p.k, p.k_stride, b, n, h, key0,
                                                                 p.len, p.dim);
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.b, p.v, p.v_stride, b, n, h, key0,
                                                                 p.len, p.dim);
    __syncthreads();
    uint32_t k_frag[kSteps][4], v_frag[kSteps][4];
    load_a_frags<T, kSteps, kPitch>(k_frag, smem.a + warp * 16 * kPitch, g, t);
    load_a_frags<T, kSteps, kPitch>(v_frag, smem.b + warp * 16 * kPitch, g, t);

    float dk[kOutTiles][4], dv[kOutTiles][4];
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
    float key_dbias1[2] = {0.0f, 0.0f};  // this thread's share of sum over queries of dS

    for (int64_t q0 = 0; q0 < p.len; q0 += Tile::kBlock) {
      __syncthreads();
      load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.c, p.q, p.q_stride, b, n, h, q0,
                                                                   p.len, p.dim);
      load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.d, p.dout, p.dout_stride, b, n,
                                                                   h, q0, p.len, p.dim);
      for (int r = threadIdx.x; r < Tile::kBlock; r += Tile::kThreads) {
        const int64_t q = q0 + r;
        smem.lse_log2[r] =
            q < p.len ? p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + q * p.lse_stride[2]] * kLog2e
                      : kNegInf;
        smem.delta[r] = q < p.len ? p.delta[(bn * p.heads + h) * p.len + q] : 0.0f;
      }
      __syncthreads();

      // P^T (16 keys x 64 queries) from S^T = K Q^T.
      float pt[8][4];
      mma_rows_t<T, kSteps, kPitch>(pt, k_frag, smem.c, g, t);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = j * 8 + 2 * t + (e % 2);
          const float x = score_log2(p, pt[j][e], q0 + qc, my_keys[e / 2], bias1_base, bias2_base);
          pt[j][e] = x == kNegInf ? 0.0f : prob_from_log2(x, smem.lse_log2[qc]);
        }
      // dV += P^T dO.
      mma_acc_tile<T, kOutTiles, kPitch>(dv, pt, smem.d, g, t);
      // dP^T = V dO^T, then dS^T = P^T (dP^T - delta).
      float ds[8][4];
      mma_rows_t<T, kSteps, kPitch>(ds, v_frag, smem.d, g, t);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = j * 8 + 2 * t + (e % 2);
          ds[j][e] = pt[j][e] * (ds[j][e] - smem.delta[qc]);
          key_dbias1[e / 2] += ds[j][e];
        }
      // dK += dS^T Q (times scale when written).
      mma_acc_tile<T, kOutTiles, kPitch>(dk, ds, smem.c, g, t);
      // dbias2 partial of this chunk: each element belongs to this thread alone; the first n of
      // the chunk writes, the others add, in order.
      if (dbias2_acc != nullptr) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t q = q0 + j * 8 + 2 * t + (e % 2), key = my_keys[e / 2];
            if (q < p.len && key < p.len) {
              float* cell = dbias2_acc + q * p.len + key;
              *cell = (n == n_begin ? 0.0f : *cell) + ds[j][e];
            }
          }
      }
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
  const int64_t bias1_base = b * p.bias1_stride[0] + n * p.bias1_stride[1];
  const int64_t bias2_base = b * p.bias2_stride[0] + h * p.bias2_stride[1];

  load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.a, p.q, p.q_stride, b, n, h, q0,
                                                               p.len, p.dim);
  load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.b, p.dout, p.dout_stride, b, n, h,
                                                               q0, p.len, p.dim);
  __syncthreads();
  uint32_t q_frag[kSteps][4], do_frag[kSteps][4];
  load_a_frags<T, kSteps, kPitch>(q_frag, smem.a + warp * 16 * kPitch, g, t);
  load_a_frags<T, kSteps, kPitch>(do_frag, smem.b + warp * 16 * kPitch, g, t);
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = my_rows[r] < p.len;
    lse_log2[r] = valid ? p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]] *
                              kLog2e
                        : kNegInf;
    delta[r] = valid ? p.delta[(bn * p.heads + h) * p.len + my_rows[r]] : 0.0f;
  }

  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (int64_t k0 = 0; k0 < p.len; k0 += Tile::kBlock) {
    __syncthreads();
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.c, p.k, p.k_stride, b, n, h, k0,
                                                                 p.len, p.dim);
    load_tile<T, Tile::kBlock, kHeadDim, kPitch, Tile::kThreads>(smem.d, p.v, p.v_stride, b, n, h, k0,
                                                                 p.len, p.dim);
    __syncthreads();
    float pr[8][4], ds[8][4];
    mma_rows_t<T, kSteps, kPitch>(pr, q_frag, smem.c, g, t);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = k0 + j * 8 + 2 * t + (e % 2);
        const float x = score_log2(p, pr[j][e], my_rows[e / 2], key, bias1_base, bias2_base);
        pr[j][e] = x == kNegInf ? 0.0f : prob_from_log2(x, lse_log2[e / 2]);
      }
    mma_rows_t<T, kSteps, kPitch>(ds, do_frag, smem.d, g, t);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[j][e] = pr[j][e] * (ds[j][e] - delta[e / 2]);
    mma_acc_tile<T, kOutTiles, kPitch>(dq, ds, smem.c, g, t);  // dQ += dS K
  }
  store_rows<T, kOutTiles>(dq, p.scale, p.dq, p.dq_stride, b, n, h, my_rows, p.len, p.dim, t);
}

}  // namespace sciattn::cuda

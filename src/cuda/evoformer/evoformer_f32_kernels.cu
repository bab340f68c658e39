// Evoformer attention for fp32 inputs on the GPU: exact fp32 arithmetic on the CUDA cores (no
// TF32), so fp32 callers get fp32 accuracy. CUDA layer. One warp per query row (forward, dQ) or
// key row (dK/dV) with the head dim spread over the lanes, keys or queries taken 32 at a time;
// dbias2 by one thread per cell summing over N in order. Deterministic like the tensor-core path:
// no atomics, every output owned by one thread. These kernels favour simplicity over speed: the
// fast path is bf16/f16.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/device_utils.cuh"
#include "cuda/evoformer/evoformer_launch.h"

namespace sciattn::cuda {
namespace {

constexpr int kF32PerLane = 4;  // D <= 128 = 32 lanes x 4
constexpr int kF32WarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Row i of head h of slice (b, n) of a [B, N, L, H, D] tensor.
__device__ __forceinline__ const float* f32_row(const void* base, const int64_t stride[4],
                                                int64_t b, int64_t n, int64_t i, int64_t h) {
  return static_cast<const float*>(base) + b * stride[0] + n * stride[1] + i * stride[2] +
         h * stride[3];
}

// bias1[b, n, j] + bias2[b, h, i, j], natural units (a boolean mask adds 0 or -inf).
__device__ __forceinline__ float f32_bias(const EvoformerDeviceParams& p, int64_t b, int64_t n,
                                          int64_t h, int64_t i, int64_t j) {
  float x = 0.0f;
  if (p.bias1_type != BiasType::kNone) {
    x += load_bias(p.bias1, p.bias1_type,
                   b * p.bias1_stride[0] + n * p.bias1_stride[1] + j * p.bias1_stride[2]);
  }
  if (p.bias2_type != BiasType::kNone) {
    x += load_bias(p.bias2, p.bias2_type,
                   b * p.bias2_stride[0] + h * p.bias2_stride[1] + i * p.bias2_stride[2] +
                       j * p.bias2_stride[3]);
  }
  return x;
}

// The lane's share of a row: elements d = lane + 32 c.
__device__ __forceinline__ void load_lane_row(float out[kF32PerLane], const float* row, int64_t dim,
                                              int lane) {
#pragma unroll
  for (int c = 0; c < kF32PerLane; ++c) {
    const int64_t d = lane + 32 * c;
    out[c] = d < dim ? row[d] : 0.0f;
  }
}

// <x, y> where x is spread over the warp's lanes (x[c] = element lane + 32c) and y is a row this
// lane reads whole. Every lane of the warp must call it (it broadcasts x with shuffles).
__device__ __forceinline__ float dot_spread(const float x[kF32PerLane], const float* y,
                                            int64_t dim) {
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kF32PerLane; ++c) {
    if (32 * c >= dim) break;
    for (int l = 0; l < 32; ++l) {
      const float xd = __shfl_sync(kFullMask, x[c], l);
      const int64_t d = 32 * c + l;
      if (d < dim) acc = fmaf(xd, y[d], acc);
    }
  }
  return acc;
}

// acc[c] += w_r * row_r[lane + 32c] for the `count` rows r of a group, w_r held by lane r.
template <typename RowOf>
__device__ __forceinline__ void add_weighted_rows(float acc[kF32PerLane], float w, int count,
                                                  const RowOf& row_of, int64_t dim, int lane) {
  for (int r = 0; r < 32; ++r) {
    const float wr = __shfl_sync(kFullMask, w, r);
    if (r >= count) continue;
    const float* row = row_of(r);
#pragma unroll
    for (int c = 0; c < kF32PerLane; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < dim) acc[c] = fmaf(wr, row[d], acc[c]);
    }
  }
}

// The (b, n, h, i) of warp-row `row` of the B*N*H*L rows, i fastest.
struct RowIndex {
  int64_t b, n, h, i, bn;
};
__device__ __forceinline__ RowIndex decode_row(int64_t row, const EvoformerDeviceParams& p) {
  RowIndex r;
  r.i = row % p.len;
  r.h = (row / p.len) % p.heads;
  r.bn = row / (p.len * p.heads);
  r.b = r.bn / p.n;
  r.n = r.bn % p.n;
  return r;
}

__device__ __forceinline__ void store_lane_row(float* row, const float x[kF32PerLane], float factor,
                                               int64_t dim, int lane) {
#pragma unroll
  for (int c = 0; c < kF32PerLane; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < dim) row[d] = x[c] * factor;
  }
}

__global__ void __launch_bounds__(kF32WarpsPerBlock * 32)
    evoformer_fwd_f32_kernel(const EvoformerDeviceParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = p.batch * p.n * p.heads * p.len;
  for (int64_t row = blockIdx.x * int64_t{kF32WarpsPerBlock} + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kF32WarpsPerBlock) {
    const RowIndex r = decode_row(row, p);
    float q[kF32PerLane], o[kF32PerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
    load_lane_row(q, f32_row(p.q, p.q_stride, r.b, r.n, r.i, r.h), p.dim, lane);
    // o holds the probability-weighted mean of the V rows seen so far (every step divides by the
    // running sum), so |o| never exceeds max |v|: summing unnormalised rows would overflow fp32 at
    // L * max |v| although the output itself is finite.
    float row_max = kNegInf, total = 0.0f;
    for (int64_t j0 = 0; j0 < p.len; j0 += 32) {
      const int64_t j = j0 + lane;
      const bool valid = j < p.len;
      const float dot =
          dot_spread(q, f32_row(p.k, p.k_stride, r.b, r.n, valid ? j : 0, r.h), p.dim);
      const float s = valid ? fmaf(dot, p.scale, f32_bias(p, r.b, r.n, r.h, r.i, j)) : kNegInf;
      const float new_max = fmaxf(row_max, warp_max(s));
      // While every key so far is masked the max is -inf; shift by 0 then (exp(-inf) = 0).
      const float shift = new_max == kNegInf ? 0.0f : new_max;
      const float prob = expf(s - shift);
      const float kept = total * expf(row_max - shift);  // the old keys' sum in the new shift
      const float new_total = kept + warp_sum(prob);
      // A sum of 0 (every key so far masked) keeps o at 0; a NaN sum (a NaN score) makes o NaN.
      const float inv = new_total != 0.0f ? 1.0f / new_total : 0.0f;
      const float keep = kept * inv;
#pragma unroll
      for (int c = 0; c < kF32PerLane; ++c) o[c] *= keep;
      const int count = static_cast<int>(p.len - j0 < 32 ? p.len - j0 : 32);
      add_weighted_rows(
          o, prob * inv, count,
          [&](int k) { return f32_row(p.v, p.v_stride, r.b, r.n, j0 + k, r.h); }, p.dim, lane);
      row_max = new_max;
      total = new_total;
    }
    // A fully masked row: output 0, lse -inf.
    float* out = const_cast<float*>(f32_row(p.out, p.out_stride, r.b, r.n, r.i, r.h));
    store_lane_row(out, o, 1.0f, p.dim, lane);
    if (p.lse != nullptr && lane == 0) {
      p.lse[r.bn * p.lse_stride[0] + r.h * p.lse_stride[1] + r.i * p.lse_stride[2]] =
          total != 0.0f ? row_max + logf(total) : kNegInf;
    }
  }
}

__device__ __forceinline__ float row_lse(const EvoformerDeviceParams& p, int64_t bn, int64_t h,
                                         int64_t i) {
  return p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
}

__device__ __forceinline__ float row_delta(const EvoformerDeviceParams& p, int64_t bn, int64_t h,
                                           int64_t i) {
  return p.delta[(bn * p.heads + h) * p.len + i];
}

// dS of cell (i, j) of (b, n, h) given the two dot products; 0 outside the matrix or for a fully
// masked row.
__device__ __forceinline__ float f32_ds(const EvoformerDeviceParams& p, const RowIndex& r,
                                        int64_t i, int64_t j, float qk, float dov, bool valid,
                                        float* prob_out) {
  float prob = 0.0f;
  if (valid) {
    const float lse = row_lse(p, r.bn, r.h, i);
    if (lse != kNegInf) prob = expf(fmaf(qk, p.scale, f32_bias(p, r.b, r.n, r.h, i, j)) - lse);
  }
  *prob_out = prob;
  return valid ? prob * (dov - row_delta(p, r.bn, r.h, i)) : 0.0f;
}

// One warp per key row j: dK_j, dV_j and the dbias1 partial sum over queries.
__global__ void __launch_bounds__(kF32WarpsPerBlock * 32)
    evoformer_bwd_dkdv_f32_kernel(const EvoformerDeviceParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = p.batch * p.n * p.heads * p.len;
  for (int64_t row = blockIdx.x * int64_t{kF32WarpsPerBlock} + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kF32WarpsPerBlock) {
    const RowIndex r = decode_row(row, p);
    const int64_t j = r.i;
    float k[kF32PerLane], v[kF32PerLane];
    float dk[kF32PerLane] = {0.0f, 0.0f, 0.0f, 0.0f}, dv[kF32PerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
    load_lane_row(k, f32_row(p.k, p.k_stride, r.b, r.n, j, r.h), p.dim, lane);
    load_lane_row(v, f32_row(p.v, p.v_stride, r.b, r.n, j, r.h), p.dim, lane);
    float dbias1 = 0.0f;
    for (int64_t i0 = 0; i0 < p.len; i0 += 32) {
      const int64_t i = i0 + lane;
      const bool valid = i < p.len;
      const int64_t ic = valid ? i : 0;
      const float qk = dot_spread(k, f32_row(p.q, p.q_stride, r.b, r.n, ic, r.h), p.dim);
      const float dov = dot_spread(v, f32_row(p.dout, p.dout_stride, r.b, r.n, ic, r.h), p.dim);
      float prob;
      const float ds = f32_ds(p, r, ic, j, qk, dov, valid, &prob);
      dbias1 += ds;
      const int count = static_cast<int>(p.len - i0 < 32 ? p.len - i0 : 32);
      add_weighted_rows(
          dv, prob, count,
          [&](int x) { return f32_row(p.dout, p.dout_stride, r.b, r.n, i0 + x, r.h); }, p.dim,
          lane);
      add_weighted_rows(
          dk, ds, count, [&](int x) { return f32_row(p.q, p.q_stride, r.b, r.n, i0 + x, r.h); },
          p.dim, lane);
    }
    store_lane_row(const_cast<float*>(f32_row(p.dk, p.dk_stride, r.b, r.n, j, r.h)), dk, p.scale,
                   p.dim, lane);
    store_lane_row(const_cast<float*>(f32_row(p.dv, p.dv_stride, r.b, r.n, j, r.h)), dv, 1.0f,
                   p.dim, lane);
    dbias1 = warp_sum(dbias1);
    if (p.dbias1_partial != nullptr && lane == 0) {
      p.dbias1_partial[(r.bn * p.heads + r.h) * p.len + j] = dbias1;
    }
  }
}

// One warp per query row i: dQ_i.
__global__ void __launch_bounds__(kF32WarpsPerBlock * 32)
    evoformer_bwd_dq_f32_kernel(const EvoformerDeviceParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = p.batch * p.n * p.heads * p.len;
  for (int64_t row = blockIdx.x * int64_t{kF32WarpsPerBlock} + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kF32WarpsPerBlock) {
    const RowIndex r = decode_row(row, p);
    float q[kF32PerLane], dout[kF32PerLane], dq[kF32PerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
    load_lane_row(q, f32_row(p.q, p.q_stride, r.b, r.n, r.i, r.h), p.dim, lane);
    load_lane_row(dout, f32_row(p.dout, p.dout_stride, r.b, r.n, r.i, r.h), p.dim, lane);
    for (int64_t j0 = 0; j0 < p.len; j0 += 32) {
      const int64_t j = j0 + lane;
      const bool valid = j < p.len;
      const int64_t jc = valid ? j : 0;
      const float qk = dot_spread(q, f32_row(p.k, p.k_stride, r.b, r.n, jc, r.h), p.dim);
      const float dov = dot_spread(dout, f32_row(p.v, p.v_stride, r.b, r.n, jc, r.h), p.dim);
      float prob;
      const float ds = f32_ds(p, r, r.i, jc, qk, dov, valid, &prob);
      const int count = static_cast<int>(p.len - j0 < 32 ? p.len - j0 : 32);
      add_weighted_rows(
          dq, ds, count, [&](int x) { return f32_row(p.k, p.k_stride, r.b, r.n, j0 + x, r.h); },
          p.dim, lane);
    }
    store_lane_row(const_cast<float*>(f32_row(p.dq, p.dq_stride, r.b, r.n, r.i, r.h)), dq, p.scale,
                   p.dim, lane);
  }
}

// One thread per cell (b, h, i, j) of dbias2, summing dS over n = 0..N-1 in order.
__global__ void evoformer_bwd_dbias2_f32_kernel(const EvoformerDeviceParams p) {
  const int64_t cells = p.batch * p.heads * p.len * p.len;
  for (int64_t cell = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; cell < cells;
       cell += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = cell % p.len, i = (cell / p.len) % p.len;
    const int64_t h = (cell / (p.len * p.len)) % p.heads, b = cell / (p.len * p.len * p.heads);
    float sum = 0.0f;
    for (int64_t n = 0; n < p.n; ++n) {
      const float* q = f32_row(p.q, p.q_stride, b, n, i, h);
      const float* k = f32_row(p.k, p.k_stride, b, n, j, h);
      const float* dout = f32_row(p.dout, p.dout_stride, b, n, i, h);
      const float* v = f32_row(p.v, p.v_stride, b, n, j, h);
      float qk = 0.0f, dov = 0.0f;
      for (int64_t d = 0; d < p.dim; ++d) {
        qk = fmaf(q[d], k[d], qk);
        dov = fmaf(dout[d], v[d], dov);
      }
      RowIndex r;
      r.b = b;
      r.n = n;
      r.h = h;
      r.i = i;
      r.bn = b * p.n + n;
      float prob;
      sum += f32_ds(p, r, i, j, qk, dov, true, &prob);
    }
    store_bias(p.dbias2, p.bias2_type,
               b * p.dbias2_stride[0] + h * p.dbias2_stride[1] + i * p.dbias2_stride[2] +
                   j * p.dbias2_stride[3],
               sum);
  }
}

// Enough blocks to fill the GPU several times over; the kernels loop over the rest.
constexpr int64_t kF32MaxBlocks = 132 * 32;

unsigned row_blocks(const EvoformerDeviceParams& p) {
  const int64_t rows = p.batch * p.n * p.heads * p.len;
  return static_cast<unsigned>(
      std::min<int64_t>((rows + kF32WarpsPerBlock - 1) / kF32WarpsPerBlock, kF32MaxBlocks));
}

}  // namespace

cudaError_t launch_evoformer_forward_f32(const EvoformerDeviceParams& p, cudaStream_t stream) {
  if (p.batch * p.n * p.heads * p.len == 0) return cudaSuccess;
  evoformer_fwd_f32_kernel<<<row_blocks(p), kF32WarpsPerBlock * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_evoformer_backward_f32(const EvoformerDeviceParams& p, cudaStream_t stream) {
  if (p.batch * p.n * p.heads * p.len == 0) return cudaSuccess;
  evoformer_bwd_dkdv_f32_kernel<<<row_blocks(p), kF32WarpsPerBlock * 32, 0, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  evoformer_bwd_dq_f32_kernel<<<row_blocks(p), kF32WarpsPerBlock * 32, 0, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess || p.dbias2 == nullptr) return e;
  const int64_t cells = p.batch * p.heads * p.len * p.len;
  const int threads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((cells + threads - 1) / threads, kF32MaxBlocks));
  evoformer_bwd_dbias2_f32_kernel<<<blocks, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sciattn::cuda

// The dtype-generic pieces of the fused block-sparse attention (delta = rowsum(dO * O)) and its
// exact-fp32 path on the CUDA cores: one thread per output row (a query row for O and dQ, a key
// row for dK and dV) walking its whole line of the tile index, with the same score terms and
// element masks as the tensor-core kernels. Meant for correctness, not speed; every output
// element is summed by one thread in a fixed order, so it is deterministic too. CUDA layer.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/block_sparse/sparse_attention_device.cuh"
#include "cuda/block_sparse/sparse_attention_launch.h"
#include "cuda/common/attention_delta.cuh"

namespace sciattn::cuda {
namespace {

constexpr int kF32Threads = 128;
constexpr int kF32MaxDim = 128;  // the head dims the checks accept

// A 1-D grid of at most this many CTAs, with a grid-stride loop over the rows.
unsigned f32_grid(int64_t rows) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((rows + kF32Threads - 1) / kF32Threads, 132 * 32)));
}

// delta = rowsum(dO * O) per (b, h, query row), kLanes lanes per row (common/attention_delta.cuh).
template <typename T>
__host__ __device__ inline bool sparse_delta_vec(const SparseAttentionDeviceParams& p) {
  return sizeof(T) == 2 && p.vec_out && p.vec_dout;
}

template <typename T, int kLanes>
__global__ void sparse_attention_delta_kernel(const SparseAttentionDeviceParams p) {
  const bool vec = sparse_delta_vec<T>(p);
  delta_rows<T, kLanes>(
      p.batch * p.heads * p.len, p.dim, vec, p.out_stride[3], p.dout_stride[3],
      [&](auto row) {
        using Index = decltype(row);
        const Index len = static_cast<Index>(p.len), heads = static_cast<Index>(p.heads);
        const Index i = row % len, bh = row / len, h = bh % heads, b = bh / heads;
        return DeltaRow<T>{static_cast<const T*>(p.out) + b * p.out_stride[0] +
                               h * p.out_stride[1] + i * p.out_stride[2],
                           static_cast<const T*>(p.dout) + b * p.dout_stride[0] +
                               h * p.dout_stride[1] + i * p.dout_stride[2],
                           static_cast<int64_t>(row)};
      },
      p.delta);
}

// Row `i` of the (b, h) slice of a [B, H, L, D] fp32 tensor, into registers-or-local `dst`.
__device__ __forceinline__ void load_row_f32(float* dst, const void* data, const int64_t stride[4],
                                             int64_t b, int64_t h, int64_t i, int64_t dim) {
  const float* src =
      static_cast<const float*>(data) + b * stride[0] + h * stride[1] + i * stride[2];
  for (int64_t d = 0; d < dim; ++d) dst[d] = src[d * stride[3]];
}

__device__ __forceinline__ float dot_f32(const float* x, const void* data, const int64_t stride[4],
                                         int64_t b, int64_t h, int64_t j, int64_t dim) {
  const float* y = static_cast<const float*>(data) + b * stride[0] + h * stride[1] + j * stride[2];
  float acc = 0.0f;
  for (int64_t d = 0; d < dim; ++d) acc += x[d] * y[d * stride[3]];
  return acc;
}

__device__ __forceinline__ void store_row_f32(void* data, const int64_t stride[4], int64_t b,
                                              int64_t h, int64_t i, int64_t dim, const float* src,
                                              float factor) {
  float* dst = static_cast<float*>(data) + b * stride[0] + h * stride[1] + i * stride[2];
  for (int64_t d = 0; d < dim; ++d) dst[d] = src[d] * factor;
}

// A token's tile line (stored head g's lines are g * num_tiles ..) and its position in it, along
// one side: query rows in tile rows (`unit_place` = row_unit_place), keys in tile columns
// (col_unit_place). For a packed layout through its block line's place (lines with long lists
// are grouped, common/sparse_attention_tiles.h); else the token's own tile.
struct TilePlace {
  int64_t line;
  int position;
};
__device__ __forceinline__ TilePlace tile_place_of(const SparseAttentionDeviceParams& p,
                                                   const int32_t* unit_place, int64_t h,
                                                   int64_t token) {
  const auto& tl = p.tiles;
  const int64_t head = h % tl.layout_heads;
  if (tl.sub == 1) {
    return {head * tl.num_tiles + token / SparseTile::kSize,
            static_cast<int>(token % SparseTile::kSize)};
  }
  const int64_t blocks = p.len >> tl.shift;
  const int32_t place = unit_place[head * blocks + (token >> tl.shift)];
  return {
      place / tl.sub,  // the place's line counts the stored heads' lines before it
      ((place % tl.sub) << tl.shift) + static_cast<int>(token & ((int64_t{1} << tl.shift) - 1))};
}

// Calls fn(j, s) for every key j of query row i of (b, h) that is kept, in ascending order of j,
// with s its score.
template <typename Fn>
__device__ __forceinline__ void for_each_key(const SparseAttentionDeviceParams& p, int64_t b,
                                             int64_t h, int64_t i, const float* q, const Fn& fn) {
  const auto& tl = p.tiles;
  const TilePlace at = tile_place_of(p, tl.row_unit_place, h, i);
  const int64_t line = at.line;
  const int r = at.position;
  const EntrySlots<true> slots(tl.row_slots, tl);  // the general form, for any block
  for (int e = tl.row_offsets[line]; e < tl.row_offsets[line + 1]; ++e) {
    const int32_t* entry = slots.of(e);
    const int mask = tl.row_masks[e];
    for (int c = 0; c < SparseTile::kSize; ++c) {
      const int64_t j = slots.token(entry, c);
      if (j < 0 || !element_kept(p, mask, r, c, i, j)) continue;
      fn(j, score_of(p, dot_f32(q, p.k, p.k_stride, b, h, j, p.dim), b, h, i, j));
    }
  }
}

__global__ void __launch_bounds__(kF32Threads)
    sparse_attention_fwd_f32_kernel(const SparseAttentionDeviceParams p) {
  const int64_t rows = p.batch * p.heads * p.len;
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = row % p.len, bh = row / p.len, h = bh % p.heads, b = bh / p.heads;
    float q[kF32MaxDim], o[kF32MaxDim];
    load_row_f32(q, p.q, p.q_stride, b, h, i, p.dim);
    for (int64_t d = 0; d < p.dim; ++d) o[d] = 0.0f;
    // o holds the probability-weighted mean of the V rows seen so far (each key divides by the
    // running sum), so |o| never exceeds max |v|: summing unnormalised rows would overflow fp32 at
    // (keys) * max |v| although the output itself is finite.
    float m = kNegInf, l = 0.0f;
    for_each_key(p, b, h, i, q, [&](int64_t j, float s) {
      if (s == kNegInf) return;  // contributes exp(-inf) = 0
      const float new_m = fmaxf(m, s);
      const float kept = l * expf(m - new_m);  // 0 for the first key (m = -inf)
      const float pj = expf(s - new_m);
      const float new_l = kept + pj;
      // new_l > 0 here (pj = 1 at the maximum) unless a NaN score made it NaN: o becomes NaN.
      const float inv = 1.0f / new_l;
      const float keep = kept * inv, w = pj * inv;
      const float* vj = static_cast<const float*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1] +
                        j * p.v_stride[2];
      for (int64_t d = 0; d < p.dim; ++d) o[d] = o[d] * keep + w * vj[d * p.v_stride[3]];
      m = new_m;
      l = new_l;
    });
    // A row without any unmasked key: output 0, lse -inf; a NaN score made l NaN (fmaxf dropped
    // it from m, not from the sum), which gives NaN.
    store_row_f32(p.out, p.out_stride, b, h, i, p.dim, o, 1.0f);
    if (p.lse != nullptr) {
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
          l != 0.0f ? m + logf(l) : kNegInf;
    }
  }
}

__global__ void __launch_bounds__(kF32Threads)
    sparse_attention_dq_f32_kernel(const SparseAttentionDeviceParams p) {
  const int64_t rows = p.batch * p.heads * p.len;
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = row % p.len, bh = row / p.len, h = bh % p.heads, b = bh / p.heads;
    float q[kF32MaxDim], go[kF32MaxDim], dq[kF32MaxDim];
    load_row_f32(q, p.q, p.q_stride, b, h, i, p.dim);
    load_row_f32(go, p.dout, p.dout_stride, b, h, i, p.dim);
    for (int64_t d = 0; d < p.dim; ++d) dq[d] = 0.0f;
    const float lse = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
    const float delta = p.delta[row];
    for_each_key(p, b, h, i, q, [&](int64_t j, float s) {
      const float pj = s == kNegInf ? 0.0f : prob_of(s, lse);
      if (pj == 0.0f) return;
      const float ds = pj * (dot_f32(go, p.v, p.v_stride, b, h, j, p.dim) - delta);
      const float* kj = static_cast<const float*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1] +
                        j * p.k_stride[2];
      for (int64_t d = 0; d < p.dim; ++d) dq[d] += ds * kj[d * p.k_stride[3]];
    });
    store_row_f32(p.dq, p.dq_stride, b, h, i, p.dim, dq, p.scale);
  }
}

__global__ void __launch_bounds__(kF32Threads)
    sparse_attention_dkdv_f32_kernel(const SparseAttentionDeviceParams p) {
  const int64_t rows = p.batch * p.heads * p.len;
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = row % p.len, bh = row / p.len, h = bh % p.heads, b = bh / p.heads;
    float k[kF32MaxDim], v[kF32MaxDim], dk[kF32MaxDim], dv[kF32MaxDim];
    load_row_f32(k, p.k, p.k_stride, b, h, j, p.dim);
    load_row_f32(v, p.v, p.v_stride, b, h, j, p.dim);
    for (int64_t d = 0; d < p.dim; ++d) dk[d] = dv[d] = 0.0f;
    const auto& tl = p.tiles;
    const TilePlace at = tile_place_of(p, tl.col_unit_place, h, j);
    const int64_t line = at.line;
    const int c = at.position;
    const EntrySlots<true> slots(tl.col_slots, tl);  // the general form, for any block
    for (int e = tl.col_offsets[line]; e < tl.col_offsets[line + 1]; ++e) {
      const int32_t* entry = slots.of(e);
      const int mask = tl.col_masks[e];
      for (int r = 0; r < SparseTile::kSize; ++r) {
        const int64_t i = slots.token(entry, r);
        if (i < 0 || !element_kept(p, mask, r, c, i, j)) continue;
        const float s = score_of(p, dot_f32(k, p.q, p.q_stride, b, h, i, p.dim), b, h, i, j);
        const float lse = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
        const float pij = s == kNegInf ? 0.0f : prob_of(s, lse);
        if (pij == 0.0f) continue;
        const float ds = pij * (dot_f32(v, p.dout, p.dout_stride, b, h, i, p.dim) -
                                p.delta[(b * p.heads + h) * p.len + i]);
        const float* qi = static_cast<const float*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] +
                          i * p.q_stride[2];
        const float* goi = static_cast<const float*>(p.dout) + b * p.dout_stride[0] +
                           h * p.dout_stride[1] + i * p.dout_stride[2];
        for (int64_t d = 0; d < p.dim; ++d) {
          dv[d] += pij * goi[d * p.dout_stride[3]];
          dk[d] += ds * qi[d * p.q_stride[3]];
        }
      }
    }
    store_row_f32(p.dk, p.dk_stride, b, h, j, p.dim, dk, p.scale);
    store_row_f32(p.dv, p.dv_stride, b, h, j, p.dim, dv, 1.0f);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_sparse_attention_delta(const SparseAttentionDeviceParams& p,
                                          cudaStream_t stream) {
  const unsigned grid = delta_grid(p.batch * p.heads * p.len, kF32Threads, 132 * 32);
  return launch_with_delta_lanes(p.dim, sparse_delta_vec<T>(p), [&](auto lanes) {
    sparse_attention_delta_kernel<T, decltype(lanes)::value><<<grid, kF32Threads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}
template cudaError_t launch_sparse_attention_delta<float>(const SparseAttentionDeviceParams&,
                                                          cudaStream_t);
template cudaError_t launch_sparse_attention_delta<__half>(const SparseAttentionDeviceParams&,
                                                           cudaStream_t);
template cudaError_t launch_sparse_attention_delta<__nv_bfloat16>(
    const SparseAttentionDeviceParams&, cudaStream_t);

cudaError_t launch_sparse_attention_forward_f32(const SparseAttentionDeviceParams& p,
                                                cudaStream_t stream) {
  sparse_attention_fwd_f32_kernel<<<f32_grid(p.batch * p.heads * p.len), kF32Threads, 0, stream>>>(
      p);
  return cudaGetLastError();
}

cudaError_t launch_sparse_attention_backward_f32(const SparseAttentionDeviceParams& p,
                                                 cudaStream_t stream) {
  const unsigned grid = f32_grid(p.batch * p.heads * p.len);
  sparse_attention_dkdv_f32_kernel<<<grid, kF32Threads, 0, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  sparse_attention_dq_f32_kernel<<<grid, kF32Threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sciattn::cuda

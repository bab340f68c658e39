// The GPU block-sparse Softmax kernels, forward (scale, rpe, both masks in both modes, causal,
// optional log-sum-exp) and backward. CUDA layer (kernels and their launchers).
//
// One warp per (z, head, query row): the row's entries are the b columns of each block of its
// block row (CSR range row_offsets[g*R + I] .. [g*R + I + 1] of its stored head g = h % G,
// shifted to head h's blocks), flattened so that lane l takes
// entries l, l + 32, ... whatever the block size. The forward makes two passes over the row:
// an online max / sum (each lane its own, then a butterfly merge that leaves every lane with the
// same bits), then y = exp(v - max) / sum, recomputing v from x. Each entry is read and then
// written by the same lane in the second pass, after the whole row was read in the first, which
// makes y = x (in place) safe; the backward (dot = sum y * dy, then dx) is in place for dx = dy
// for the same reason. The score terms are added in the CPU's order (scale, rpe, key padding
// mask, attention mask, causal), in fp32, so v matches the CPU path bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/block_sparse/block_sparse_launch.h"
#include "cuda/common/device_utils.cuh"

namespace sciattn::cuda::bs {
namespace {

constexpr int kWarps = 8;  // rows per CTA
constexpr int kThreads = kWarps * 32;
constexpr int64_t kMaxGrid = int64_t{1} << 24;  // beyond this, CTAs loop over rows
constexpr float kMinusInf = -__builtin_huge_valf();

// An optional term as the kernel reads it: element offsets from strides, dtype at run time.
struct TermTensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
};

TermTensor term_of(const TensorView& t) {
  TermTensor r;
  if (!t.present()) return r;
  r.data = t.data;
  r.dtype = t.dtype;
  r.s0 = t.strides[0];
  r.s1 = t.strides[1];
  if (t.rank > 2) r.s2 = t.strides[2];
  if (t.rank > 3) r.s3 = t.strides[3];
  return r;
}

struct RowWalk {
  int64_t batch = 0;
  int32_t block = 0, log2_block = 0, heads = 0, row_blocks = 0;
  int32_t layout_heads = 1, stored_nnz = 0;  // the index's stored heads and their blocks
  const int32_t* row_offsets = nullptr;
  const int32_t* col = nullptr;
};

struct ForwardArgs {
  RowWalk w;
  const void* x = nullptr;
  void* y = nullptr;
  int64_t xs0 = 0, xs1 = 0, xs2 = 0, ys0 = 0, ys1 = 0, ys2 = 0;
  float scale = 1.0f;
  TermTensor rpe, kpm, attn;  // rpe [Z, H, rows, cols], kpm [Z, cols], attn [rows, cols]
  bool kpm_mul = false, attn_mul = false, causal = false;
  float* lse = nullptr;  // [Z, H, rows] or null
  int64_t ls0 = 0, ls1 = 0, ls2 = 0;
};

struct BackwardArgs {
  RowWalk w;
  const void* y = nullptr;
  const void* dy = nullptr;
  void* dx = nullptr;
  int64_t ys0 = 0, ys1 = 0, ys2 = 0, gs0 = 0, gs1 = 0, gs2 = 0, ds0 = 0, ds1 = 0, ds2 = 0;
  float scale = 1.0f;
};

__device__ __forceinline__ float load_value(const void* base, DType type, int64_t offset) {
  switch (type) {
    case DType::kF32:
      return static_cast<const float*>(base)[offset];
    case DType::kF16:
      return __half2float(static_cast<const __half*>(base)[offset]);
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[offset] != 0 ? 0.0f : kMinusInf;
  }
  return 0.0f;
}

// A mask value as an additive term: a bool mask already reads as 0 / -inf in both modes; kMul
// turns 0 into -inf and anything else into 0 (DeepSpeed's "mul").
__device__ __forceinline__ float mask_term(const TermTensor& m, bool mul, int64_t offset) {
  const float v = load_value(m.data, m.dtype, offset);
  if (mul && m.dtype != DType::kBool) return v == 0.0f ? kMinusInf : 0.0f;
  return v;
}

// The position of one row: batch z, head h, block row, row i of the logical matrix, and the
// blocks p = begin .. end - 1 of its block row (stored positions plus `shift`).
struct RowPos {
  int64_t z, h, hr, r, i, begin, end, shift;
};

__device__ __forceinline__ RowPos row_pos(const RowWalk& w, int64_t row) {
  RowPos p;
  const int64_t b = w.block;
  const int64_t per_z = int64_t{w.heads} * w.row_blocks * b;
  p.z = row / per_z;
  const int64_t rest = row % per_z;
  p.hr = rest / b;  // h * R + I
  p.r = rest % b;
  p.h = p.hr / w.row_blocks;
  p.i = (p.hr % w.row_blocks) * b + p.r;
  const int64_t stored_line = (p.h % w.layout_heads) * w.row_blocks + p.hr % w.row_blocks;
  p.shift = (p.h / w.layout_heads) * int64_t{w.stored_nnz};
  p.begin = w.row_offsets[stored_line] + p.shift;
  p.end = w.row_offsets[stored_line + 1] + p.shift;
  return p;
}

template <typename T>
__device__ __forceinline__ float score(const ForwardArgs& a, const RowPos& rp, int64_t p,
                                       int64_t j) {
  float v = ElementTraits<T>::to_float(
      static_cast<const T*>(a.x)[rp.z * a.xs0 + p * a.xs1 + rp.r * a.xs2 + (j & (a.w.block - 1))]);
  // DeepSpeed skips the multiplication when scale is 1; x * 1 == x, so this only saves time.
  if (a.scale != 1.0f) v *= a.scale;
  if (a.rpe.data != nullptr) {
    v += load_value(a.rpe.data, a.rpe.dtype,
                    rp.z * a.rpe.s0 + rp.h * a.rpe.s1 + rp.i * a.rpe.s2 + j * a.rpe.s3);
  }
  if (a.kpm.data != nullptr) v += mask_term(a.kpm, a.kpm_mul, rp.z * a.kpm.s0 + j * a.kpm.s1);
  if (a.attn.data != nullptr) v += mask_term(a.attn, a.attn_mul, rp.i * a.attn.s0 + j * a.attn.s1);
  if (a.causal && j > rp.i) v = kMinusInf;
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_forward_kernel(const ForwardArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = a.w.batch * a.w.heads * a.w.row_blocks * a.w.block;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += stride) {
    const RowPos rp = row_pos(a.w, row);
    const int64_t width = (rp.end - rp.begin) * a.w.block;
    float m = kMinusInf, s = 0.0f;
    // Pass 1: this lane's running max and sum of exp(v - max).
    for (int64_t e = lane; e < width; e += 32) {
      const int64_t p = rp.begin + (e >> a.w.log2_block);
      const int64_t j = int64_t{a.w.col[p - rp.shift]} * a.w.block + (e & (a.w.block - 1));
      const float v = score<T>(a, rp, p, j);
      if (v == kMinusInf) continue;
      if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
      } else {
        s += expf(v - m);
      }
    }
    // Merge the lanes' (max, sum) pairs; both partners of a pair compute the same expression
    // with the operands swapped, and fp32 + and max are commutative, so every lane ends with
    // identical bits.
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
      const float mm = fmaxf(m, m2);
      if (mm == kMinusInf) {
        // Both lanes saw only masked keys (sum 0) or NaN scores (sum NaN; fmaxf drops NaN from
        // the max): keep the NaN.
        s = s + s2;
      } else {
        s = s * expf(m - mm) + s2 * expf(m2 - mm);
      }
      m = mm;
    }
    // Pass 2: write y. A fully masked row (max = -inf, sum 0) gets 0, not DeepSpeed's NaN; a row
    // of NaN scores (max -inf, sum NaN) gets NaN.
    const bool masked = m == kMinusInf && s == 0.0f;
    for (int64_t e = lane; e < width; e += 32) {
      const int64_t p = rp.begin + (e >> a.w.log2_block);
      const int64_t c = e & (a.w.block - 1);
      const int64_t j = int64_t{a.w.col[p - rp.shift]} * a.w.block + c;
      const float y = masked ? 0.0f : expf(score<T>(a, rp, p, j) - m) / s;
      static_cast<T*>(a.y)[rp.z * a.ys0 + p * a.ys1 + rp.r * a.ys2 + c] =
          ElementTraits<T>::from_float(y);
    }
    // An empty block row has no key at all: its log-sum-exp is that of a fully masked row.
    if (a.lse != nullptr && lane == 0) {
      a.lse[rp.z * a.ls0 + rp.h * a.ls1 + rp.i * a.ls2] = masked ? kMinusInf : m + logf(s);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_backward_kernel(const BackwardArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = a.w.batch * a.w.heads * a.w.row_blocks * a.w.block;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  const T* y = static_cast<const T*>(a.y);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += stride) {
    const RowPos rp = row_pos(a.w, row);
    const int64_t width = (rp.end - rp.begin) * a.w.block;
    float dot = 0.0f;
    for (int64_t e = lane; e < width; e += 32) {
      const int64_t p = rp.begin + (e >> a.w.log2_block);
      const int64_t c = e & (a.w.block - 1);
      dot += ElementTraits<T>::to_float(y[rp.z * a.ys0 + p * a.ys1 + rp.r * a.ys2 + c]) *
             ElementTraits<T>::to_float(dy[rp.z * a.gs0 + p * a.gs1 + rp.r * a.gs2 + c]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    // dx = scale * y * (dy - dot), DeepSpeed's formula with the scale applied always.
    for (int64_t e = lane; e < width; e += 32) {
      const int64_t p = rp.begin + (e >> a.w.log2_block);
      const int64_t c = e & (a.w.block - 1);
      const float yv = ElementTraits<T>::to_float(y[rp.z * a.ys0 + p * a.ys1 + rp.r * a.ys2 + c]);
      const float gv = ElementTraits<T>::to_float(dy[rp.z * a.gs0 + p * a.gs1 + rp.r * a.gs2 + c]);
      dx[rp.z * a.ds0 + p * a.ds1 + rp.r * a.ds2 + c] =
          ElementTraits<T>::from_float(a.scale * (yv * (gv - dot)));
    }
  }
}

RowWalk row_walk(const BlockSparseDeviceIndex& ix, int64_t batch) {
  RowWalk w;
  w.batch = batch;
  w.block = ix.block;
  w.log2_block = 0;
  while ((1 << w.log2_block) < ix.block) ++w.log2_block;
  w.heads = ix.num_heads;
  w.row_blocks = ix.num_row_blocks;
  w.layout_heads = ix.layout_heads;
  w.stored_nnz = ix.stored_nnz;
  w.row_offsets = ix.row_offsets;
  w.col = ix.col;
  return w;
}

unsigned grid_for(const RowWalk& w) {
  const int64_t rows = w.batch * w.heads * w.row_blocks * w.block;
  return static_cast<unsigned>(std::min((rows + kWarps - 1) / kWarps, kMaxGrid));
}

template <typename Args, typename Kernel>
Status launch_rows(const Args& args, Kernel f32, Kernel f16, Kernel bf16, DType dtype,
                   cudaStream_t stream, const char* what) {
  Kernel k = dtype == DType::kF32 ? f32 : dtype == DType::kF16 ? f16 : bf16;
  const unsigned grid = grid_for(args.w);
  if (grid == 0) return Status::ok_status();
  k<<<grid, kThreads, 0, stream>>>(args);
  return device_status(cudaGetLastError(), what);
}

}  // namespace

Status launch_softmax_forward(const BlockSparseDeviceIndex& ix, int64_t batch, const TensorView& x,
                              const TensorView& y, const SoftmaxTerms& terms, const TensorView& lse,
                              cudaStream_t stream) {
  ForwardArgs a;
  a.w = row_walk(ix, batch);
  a.x = x.data;
  a.y = y.data;
  a.xs0 = x.strides[0];
  a.xs1 = x.strides[1];
  a.xs2 = x.strides[2];
  a.ys0 = y.strides[0];
  a.ys1 = y.strides[1];
  a.ys2 = y.strides[2];
  a.scale = terms.scale;
  a.rpe = term_of(terms.rpe);
  a.kpm = term_of(terms.key_padding_mask);
  a.attn = term_of(terms.attn_mask);
  a.kpm_mul = terms.key_padding_mask_mode == MaskMode::kMul;
  a.attn_mul = terms.attn_mask_mode == MaskMode::kMul;
  a.causal = terms.causal;
  if (lse.present()) {
    a.lse = static_cast<float*>(lse.data);
    a.ls0 = lse.strides[0];
    a.ls1 = lse.strides[1];
    a.ls2 = lse.strides[2];
  }
  if (x.dtype != y.dtype) {
    return Status::not_supported("the block-sparse Softmax kernel: y must have x's dtype");
  }
  return launch_rows(a, softmax_forward_kernel<float>, softmax_forward_kernel<__half>,
                     softmax_forward_kernel<__nv_bfloat16>, x.dtype, stream,
                     "the block-sparse Softmax forward kernel");
}

Status launch_softmax_backward(const BlockSparseDeviceIndex& ix, int64_t batch, const TensorView& y,
                               const TensorView& dy, const TensorView& dx, float scale,
                               cudaStream_t stream) {
  BackwardArgs a;
  a.w = row_walk(ix, batch);
  a.y = y.data;
  a.dy = dy.data;
  a.dx = dx.data;
  a.ys0 = y.strides[0];
  a.ys1 = y.strides[1];
  a.ys2 = y.strides[2];
  a.gs0 = dy.strides[0];
  a.gs1 = dy.strides[1];
  a.gs2 = dy.strides[2];
  a.ds0 = dx.strides[0];
  a.ds1 = dx.strides[1];
  a.ds2 = dx.strides[2];
  a.scale = scale;
  if (y.dtype != dy.dtype || y.dtype != dx.dtype) {
    return Status::not_supported(
        "the block-sparse Softmax backward kernel: y, dy and dx must "
        "share one dtype");
  }
  return launch_rows(a, softmax_backward_kernel<float>, softmax_backward_kernel<__half>,
                     softmax_backward_kernel<__nv_bfloat16>, y.dtype, stream,
                     "the block-sparse Softmax backward kernel");
}

}  // namespace sciattn::cuda::bs

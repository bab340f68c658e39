// Device helpers of the Evoformer kernels: tensor-core MMA (m16n8k16, fp32 accumulate), element
// conversions, bias reads and tile loads into shared memory. CUDA layer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "cuda/evoformer/evoformer_device_params.h"

namespace sciattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

// Per storage type: conversions and the MMA instruction's type name.
template <typename T>
struct ElementTraits;

template <>
struct ElementTraits<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  // Two floats as a packed pair (low half = first).
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct ElementTraits<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// D[16x8] += A[16x16] * B[16x8], A row-major, B column-major, fp32 accumulators.
// Fragment ownership (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4):
//   a[0]: A[g][2t..2t+1]   a[1]: A[g+8][2t..]   a[2]: A[g][2t+8..]   a[3]: A[g+8][2t+8..]
//   b[0]: B[2t..2t+1][g]   b[1]: B[2t+8..][g]
//   c[0..1]: C[g][2t..2t+1]   c[2..3]: C[g+8][2t..2t+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4],
                                                  const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                         const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two consecutive 16-bit elements of a shared-memory row as one register.
template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Elements p[0] and p[stride] (two rows, one column) packed into one register.
template <typename T>
__device__ __forceinline__ uint32_t load_column_pair(const T* p, int stride) {
  const uint16_t lo = *reinterpret_cast<const uint16_t*>(p);
  const uint16_t hi = *reinterpret_cast<const uint16_t*>(p + stride);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// A bias element as it enters the score: a boolean mask adds 0 (attend) or -inf (masked).
__device__ __forceinline__ float load_bias(const void* base, BiasType type, int64_t offset) {
  switch (type) {
    case BiasType::kF32:
      return static_cast<const float*>(base)[offset];
    case BiasType::kF16:
      return __half2float(static_cast<const __half*>(base)[offset]);
    case BiasType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
    case BiasType::kBool:
      return static_cast<const uint8_t*>(base)[offset] ? 0.0f : kNegInf;
    default:
      return 0.0f;
  }
}

// Stores a float into a bias-gradient buffer of the bias's float type.
__device__ __forceinline__ void store_bias(void* base, BiasType type, int64_t offset, float v) {
  switch (type) {
    case BiasType::kF32:
      static_cast<float*>(base)[offset] = v;
      break;
    case BiasType::kF16:
      static_cast<__half*>(base)[offset] = __float2half_rn(v);
      break;
    case BiasType::kBF16:
      static_cast<__nv_bfloat16*>(base)[offset] = __float2bfloat16_rn(v);
      break;
    default:
      break;
  }
}

// ---- Tiles of [B, N, L, H, D] tensors into shared memory ----

// One (b, n, :, h, :) slice: the address of its element (row 0, d 0) and the row (L) stride.
struct SliceSource {
  const void* base;
  int64_t row_stride;
  int vec;  // 16-byte copies allowed
};

__host__ __device__ inline size_t bias_bytes(BiasType type) {
  return type == BiasType::kF32 ? 4 : type == BiasType::kBool ? 1 : 2;
}

// Address of element `offset` of a bias of this type.
__device__ __forceinline__ const void* bias_ptr(const void* base, BiasType type, int64_t offset) {
  return static_cast<const char*>(base) + offset * static_cast<int64_t>(bias_bytes(type));
}

__device__ __forceinline__ SliceSource slice_of(const void* data, const int64_t stride[4], int vec,
                                                size_t elem_bytes, int64_t b, int64_t n,
                                                int64_t h) {
  const int64_t offset = b * stride[0] + n * stride[1] + h * stride[3];
  return {static_cast<const char*>(data) + offset * static_cast<int64_t>(elem_bytes), stride[2],
          vec};
}

// cp.async of 16 bytes, zero-filling when `bytes` is 0 (then nothing is read from `src`).
__device__ __forceinline__ void cp_async_16(void* smem, const void* src, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// cp.async of 4 bytes (zero-filled when `bytes` is 0).
__device__ __forceinline__ void cp_async_4(void* smem, const void* src, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts loading rows [row0, row0 + kRows) x [0, kHeadDim) of a slice into shared memory (row
// pitch kPitch). Rows >= L and columns >= D are zero-filled, so padding adds nothing to the
// products. With 16-byte copies the load is asynchronous (cp.async; the caller commits and
// waits); otherwise it is done element by element before returning.
template <typename T, int kRows, int kHeadDim, int kPitch, int kThreads>
__device__ __forceinline__ void load_tile(T* smem, const SliceSource& src, int64_t row0,
                                          int64_t len, int64_t dim) {
  const T* base = static_cast<const T*>(src.base);
  if (src.vec) {
    constexpr int kChunks = kHeadDim / 8;
#pragma unroll
    for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
      const int r = e / kChunks, c = e % kChunks;
      const int64_t row = row0 + r;
      const bool valid = row < len && c * 8 < dim;
      const T* g = valid ? base + row * src.row_stride + c * 8 : base;
      cp_async_16(smem + r * kPitch + c * 8, g, valid ? 16 : 0);
    }
  } else {
    const T zero = ElementTraits<T>::from_float(0.0f);
    for (int e = threadIdx.x; e < kRows * kHeadDim; e += kThreads) {
      const int r = e / kHeadDim, d = e % kHeadDim;
      const int64_t row = row0 + r;
      smem[r * kPitch + d] = (row < len && d < dim) ? base[row * src.row_stride + d] : zero;
    }
  }
}

// ---- Biases of one score tile ----

template <BiasType kType>
__device__ __forceinline__ float bias_at(const void* base, int64_t offset) {
  if constexpr (kType == BiasType::kF32) return static_cast<const float*>(base)[offset];
  if constexpr (kType == BiasType::kF16)
    return __half2float(static_cast<const __half*>(base)[offset]);
  if constexpr (kType == BiasType::kBF16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
  if constexpr (kType == BiasType::kBool)
    return static_cast<const uint8_t*>(base)[offset] ? 0.0f : kNegInf;
  return 0.0f;
}

// acc[j][e] += log2(e) * bias(row(e), col0 + col(j, e)) over the MMA accumulator layout of an
// m16 x n64 tile: row(e) = e >> 1 picks one of the thread's two rows, whose bias starts at
// rows[row] (null: the row does not exist, add nothing), and col(j, e) = j * 8 + 2t + (e & 1) is
// read at offset col * col_stride. Columns >= `cols` are skipped (the caller masks them).
// A bias that depends on the row alone (bias1 in a transposed tile) uses col_stride 0.
template <BiasType kType>
__device__ __forceinline__ void add_bias_tile(float acc[8][4], const void* const rows[2],
                                              int64_t col_stride, int64_t col0, int64_t cols,
                                              int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t col = col0 + j * 8 + 2 * t + (e & 1);
      const void* row = rows[e >> 1];
      if (row != nullptr && col < cols) acc[j][e] += bias_at<kType>(row, col * col_stride) * kLog2e;
    }
}

// The same with the bias type chosen at run time (one switch per tile, not per element).
__device__ __forceinline__ void add_bias_tile(BiasType type, float acc[8][4],
                                              const void* const rows[2], int64_t col_stride,
                                              int64_t col0, int64_t cols, int t) {
  switch (type) {
    case BiasType::kF32:
      add_bias_tile<BiasType::kF32>(acc, rows, col_stride, col0, cols, t);
      break;
    case BiasType::kF16:
      add_bias_tile<BiasType::kF16>(acc, rows, col_stride, col0, cols, t);
      break;
    case BiasType::kBF16:
      add_bias_tile<BiasType::kBF16>(acc, rows, col_stride, col0, cols, t);
      break;
    case BiasType::kBool:
      add_bias_tile<BiasType::kBool>(acc, rows, col_stride, col0, cols, t);
      break;
    default:
      break;
  }
}

}  // namespace sciattn::cuda

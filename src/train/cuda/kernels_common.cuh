// Device helpers every kernel of the trainer's CUDA back end shares: conversions between the
// storage types and fp32, 16-byte vector loads and stores, warp and block sums in a fixed order,
// and the one place where a runtime DType becomes a template argument. CUDA layer of the trainer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sciattn/dtype.h"

namespace sciattn::train::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// kVec consecutive elements as floats: one 16-byte load when kVec spans 16 bytes (p must then be
// 16-byte aligned), element loads when kVec is 1.
template <typename T, int kVec>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kVec]) {
  if constexpr (kVec == 1) {
    out[0] = to_float(p[0]);
  } else {
    static_assert(sizeof(T) * kVec == 16, "a vector access spans 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = to_float(e[i]);
  }
}

template <typename T, int kVec>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[kVec]) {
  if constexpr (kVec == 1) {
    p[0] = from_float<T>(in[0]);
  } else {
    static_assert(sizeof(T) * kVec == 16, "a vector access spans 16 bytes");
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) e[i] = from_float<T>(in[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// Sum over the warp by butterfly exchange. Every lane ends with the same bits: at each level lane
// i adds x_i + x_j and lane j adds x_j + x_i, and floating-point addition is commutative.
template <typename F>
__device__ __forceinline__ F warp_sum(F x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Sum (or max) over the block, the same value in every thread: warp results in shared memory,
// then every thread adds them in warp order. `shared` holds one F per warp; the block size is a
// multiple of 32. Ends with a barrier, so `shared` may be reused right after.
template <typename F>
__device__ __forceinline__ F block_sum(F x, F* shared) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  x = warp_sum(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  F total = shared[0];
  for (int w = 1; w < warps; ++w) total += shared[w];
  __syncthreads();
  return total;
}
__device__ __forceinline__ float block_max(float x, float* shared) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  x = warp_max(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < warps; ++w) total = fmaxf(total, shared[w]);
  __syncthreads();
  return total;
}

// Records a bad token id: the slot keeps the smallest (position, id) pair seen, packed as
// position << 32 | id, so the report names the first bad position whatever the thread order
// (an integer atomic: deterministic).
__device__ __forceinline__ void report_bad_token(unsigned long long* slot, int64_t position,
                                                 int32_t id) {
  if (slot == nullptr) return;
  const unsigned long long packed = (static_cast<unsigned long long>(position) << 32) |
                                    static_cast<unsigned long long>(static_cast<uint32_t>(id));
  atomicMin(slot, packed);
}

// The one place a runtime DType becomes the kernels' element type: calls fn(T{}) with T = float,
// __half or __nv_bfloat16.
template <typename Fn>
cudaError_t with_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kF16:
      return fn(__half{});
    case DType::kBF16:
      return fn(__nv_bfloat16{});
    default:
      return cudaErrorInvalidValue;
  }
}

// True when p is aligned to `bytes`.
inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Blocks for a grid-stride loop over `work` items of `threads` each, capped at a few waves of
// the H200 (a larger grid only adds blocks that find no work).
inline unsigned grid_for(int64_t work, int threads) {
  constexpr int64_t kMaxBlocks = 132 * 32;
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

}  // namespace sciattn::train::cuda

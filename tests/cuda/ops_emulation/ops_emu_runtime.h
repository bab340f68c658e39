// Host emulation of the CUDA features the block-sparse MatMul / Softmax kernels use (the threads of
// one CTA as fibers with their barriers (../emulation/emu_fibers.h), warp shuffles, mma.sync
// m16n8k16 and m16n8k8 TF32 with the PTX fragment layouts, 16-bit float types, the runtime calls of
// the GPU test suite on host memory). Developer tool of the GPU ops (tests/cuda/ops_emulation), not
// part of CTest: run_ops_emulation.sh includes it in place of the CUDA headers.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu_fibers.h"
struct dim3 {
  unsigned x = 0, y = 0, z = 0;
};
namespace emu {
inline dim3 tidx, bidx;  // the running fiber's (set at each switch)
inline dim3 gdim;
inline Barrier* cta_bar = nullptr;
inline Barrier* warp_bar[32] = {};
inline float shfl_buf[32][32];
}  // namespace emu
#define threadIdx (::emu::tidx)
#define blockIdx (::emu::bidx)
#define gridDim (::emu::gdim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
inline void __syncthreads() {
  emu::cta_bar->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int w = emu::tidx.x / 32, l = emu::tidx.x % 32;
  emu::shfl_buf[w][l] = v;
  emu::warp_bar[w]->arrive_and_wait();
  const float r = emu::shfl_buf[w][l ^ off];
  emu::warp_bar[w]->arrive_and_wait();
  return r;
}
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotSupported = 2 };
typedef struct CUstream_st* cudaStream_t;
inline cudaError_t cudaGetLastError() {
  return 0;
}
inline const char* cudaGetErrorString(cudaError_t) {
  return "emu";
}
struct cudaPointerAttributes {
  int device = -1;
  int type = 0;
};
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes*, const void*) {
  return 1;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return 0;
}
inline cudaError_t cudaSetDevice(int) {
  return 0;
}
#include "sciattn/dtype.h"
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half h) {
  return sciattn::f16_bits_to_float(h.bits);
}
inline float __bfloat162float(__nv_bfloat16 h) {
  return sciattn::bf16_bits_to_float(h.bits);
}
namespace emu {
inline uint32_t mma_a[32][32][4], mma_b[32][32][2];
}
// One block at a time, its threads as fibers (emu::run_fibers) with fresh barriers.
template <class Kernel, class Args>
void emu_launch(Kernel k, unsigned grid, int threads, const Args& args) {
  emu::gdim.x = grid;
  for (unsigned b = 0; b < grid; ++b) {
    emu::Barrier bar(threads);
    emu::cta_bar = &bar;
    std::vector<emu::Barrier> warps(static_cast<size_t>(threads / 32), emu::Barrier(32));
    for (int w = 0; w < threads / 32; ++w) emu::warp_bar[w] = &warps[static_cast<size_t>(w)];
    emu::bidx.x = b;
    char what[32];
    std::snprintf(what, sizeof what, "block %u", b);
    emu::run_fibers(
        threads, [](int i) { emu::tidx.x = static_cast<unsigned>(i); }, [&](int) { k(args); },
        what);
  }
}
// Runtime calls of the tests: device memory is host memory.
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n);
  return 0;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return 0;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memcpy(d, s, n);
  return 0;
}
inline cudaError_t cudaMemset(void* d, int value, size_t n) {
  std::memset(d, value, n);
  return 0;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return 0;
}
inline cudaError_t cudaDeviceSynchronize() {
  return 0;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(0x10);
  return 0;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) {
  return 0;
}
struct uint4 {
  uint32_t x, y, z, w;
};

// ---- The device helpers the kernels take from common/device_utils.cuh ----
#include <type_traits>
namespace sciattn::cuda {
template <typename T>
struct ElementTraits;
template <>
struct ElementTraits<float> {
  static float to_float(float x) { return x; }
  static float from_float(float x) { return x; }
};
template <>
struct ElementTraits<__half> {
  static float to_float(__half x) { return f16_bits_to_float(x.bits); }
  static __half from_float(float x) { return {float_to_f16_bits(x)}; }
};
template <>
struct ElementTraits<__nv_bfloat16> {
  static float to_float(__nv_bfloat16 x) { return bf16_bits_to_float(x.bits); }
  static __nv_bfloat16 from_float(float x) { return {float_to_bf16_bits(x)}; }
};
template <typename T>
inline uint32_t load_pair(const T* p) {
  uint32_t r;
  std::memcpy(&r, p, 4);
  return r;
}
// m16n8k16 emulation with the documented fragment layout (lane = 4 g + t):
// a[0]: A[g][2t..], a[1]: A[g+8][2t..], a[2]: A[g][2t+8..], a[3]: A[g+8][2t+8..];
// b[0]: B[2t..][g], b[1]: B[2t+8..][g]; c[0..1]: C[g][2t..], c[2..3]: C[g+8][2t..].
template <typename T>
inline void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  const int w = emu::tidx.x / 32, l = emu::tidx.x % 32;
  for (int i = 0; i < 4; ++i) emu::mma_a[w][l][i] = a[i];
  for (int i = 0; i < 2; ++i) emu::mma_b[w][l][i] = b[i];
  emu::warp_bar[w]->arrive_and_wait();
  float A[16][16], B[16][8];
  auto lo = [](uint32_t r) {
    T x;
    uint16_t v = r & 0xffff;
    std::memcpy(&x, &v, 2);
    return ElementTraits<T>::to_float(x);
  };
  auto hi = [](uint32_t r) {
    T x;
    uint16_t v = r >> 16;
    std::memcpy(&x, &v, 2);
    return ElementTraits<T>::to_float(x);
  };
  for (int ln = 0; ln < 32; ++ln) {
    const int g = ln / 4, t = ln % 4;
    const uint32_t* ar = emu::mma_a[w][ln];
    const uint32_t* br = emu::mma_b[w][ln];
    A[g][2 * t] = lo(ar[0]);
    A[g][2 * t + 1] = hi(ar[0]);
    A[g + 8][2 * t] = lo(ar[1]);
    A[g + 8][2 * t + 1] = hi(ar[1]);
    A[g][2 * t + 8] = lo(ar[2]);
    A[g][2 * t + 9] = hi(ar[2]);
    A[g + 8][2 * t + 8] = lo(ar[3]);
    A[g + 8][2 * t + 9] = hi(ar[3]);
    B[2 * t][g] = lo(br[0]);
    B[2 * t + 1][g] = hi(br[0]);
    B[2 * t + 8][g] = lo(br[1]);
    B[2 * t + 9][g] = hi(br[1]);
  }
  emu::warp_bar[w]->arrive_and_wait();
  const int g = l / 4, t = l % 4;
  for (int k = 0; k < 16; ++k) {
    c[0] += A[g][k] * B[k][2 * t];
    c[1] += A[g][k] * B[k][2 * t + 1];
    c[2] += A[g + 8][k] * B[k][2 * t];
    c[3] += A[g + 8][k] * B[k][2 * t + 1];
  }
}
inline uint32_t __float_as_uint(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// cvt.rna.tf32.f32: to nearest with ties away from zero on the magnitude's bits (infinities and
// NaNs keep their exponent; the dropped 13 bits are zero).
inline uint32_t tf32_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u & 0xffffe000u;
  return (u + 0x1000u) & 0xffffe000u;
}
// m16n8k8 TF32 emulation with the documented fragment layout (lane = 4 g + t): a[0]: A[g][t],
// a[1]: A[g+8][t], a[2]: A[g][t+4], a[3]: A[g+8][t+4]; b[0]: B[t][g], b[1]: B[t+4][g]; c as
// m16n8k16's. The operands' values as given (the hardware reads their TF32 bits).
inline void mma_1688_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  const int w = emu::tidx.x / 32, l = emu::tidx.x % 32;
  for (int i = 0; i < 4; ++i) emu::mma_a[w][l][i] = a[i];
  for (int i = 0; i < 2; ++i) emu::mma_b[w][l][i] = b[i];
  emu::warp_bar[w]->arrive_and_wait();
  float A[16][8], B[8][8];
  const auto value = [](uint32_t r) { return __uint_as_float(r & 0xffffe000u); };
  for (int ln = 0; ln < 32; ++ln) {
    const int g = ln / 4, t = ln % 4;
    const uint32_t* ar = emu::mma_a[w][ln];
    const uint32_t* br = emu::mma_b[w][ln];
    A[g][t] = value(ar[0]);
    A[g + 8][t] = value(ar[1]);
    A[g][t + 4] = value(ar[2]);
    A[g + 8][t + 4] = value(ar[3]);
    B[t][g] = value(br[0]);
    B[t + 4][g] = value(br[1]);
  }
  emu::warp_bar[w]->arrive_and_wait();
  const int g = l / 4, t = l % 4;
  for (int k = 0; k < 8; ++k) {
    c[0] += A[g][k] * B[k][2 * t];
    c[1] += A[g][k] * B[k][2 * t + 1];
    c[2] += A[g + 8][k] * B[k][2 * t];
    c[3] += A[g + 8][k] * B[k][2 * t + 1];
  }
}
}  // namespace sciattn::cuda

// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the attention kernels' 64-row tiles: the
// shared-memory tile layouts it reads, their matrix descriptors, and the two products the kernels
// need. CUDA layer.
//
// Tile layouts (PTX ISA: asynchronous warpgroup-level matrix shared memory layout), chosen by the
// head dim D of the 16-bit tile: rows of W = kSwizzleBytes<D> bytes, 128 for D = 64 and 128
// ("128-byte swizzle") and 64 for D = 32 ("64-byte swizzle"). A tile of kRows rows x D columns
// is stored as 2D / W column parts of kRows x W bytes each; inside a part, row r's 16-byte chunk
// c (columns 8c..8c+7) is at byte r * W + ((c ^ g(r)) * 16), g(r) = r % 8 at W = 128 and
// (r % 8) / 2 at W = 64 (the hardware XORs the chunk bits of the address, 4 and up, with bits 7
// and up), a pattern that repeats every eight rows (8 W bytes). Every part starts on a 1024-byte
// boundary. The same stored tile serves both ways the kernels read it:
//  - K-major (the reduction runs along the row, e.g. Q or K in S = Q K^T): eight-row groups 8 W
//    bytes apart (the descriptor's stride byte offset); k-step s (columns 16s..16s+15, 32 bytes)
//    starts at part 32s / W, byte 32s % W;
//  - MN-major (the reduction runs down the rows, e.g. V in O = P V, with the transpose flag):
//    k-step s covers rows 16s..16s+15, two eight-row groups 8 W bytes apart (stride byte
//    offset), and the column parts are the leading-dimension steps (leading byte offset = the
//    size of a part).
// Fragments: the fp32 accumulator of an m64nNk16 product gives warp w of the warpgroup rows
// 16w..16w+15 in the layout of mma.sync m16n8's accumulator, one [4] per n8 column tile, and an
// A operand in registers is mma.sync m16n8k16's A fragment: the attention kernels' score and
// output code works on them unchanged.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

// 1 in the compilation passes that may hold the warpgroup kernels' code: sm_90a's device pass
// (wgmma, clusters and the async-proxy fences exist only there) and the host pass, which only
// parses kernel bodies. A build for several architectures (SCIATTN_CUDA_ARCHS) compiles those
// kernels' bodies for sm_90a alone; in the other passes each body is a trap, and the dispatch
// never launches them there (cuda/common/device_arch.h).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SCIATTN_WGMMA_DEVICE_CODE 1
#else
#define SCIATTN_WGMMA_DEVICE_CODE 0
#endif

namespace sciattn::cuda {

// Bytes per row of the swizzled layout of a tile with kHeadDim 16-bit columns (see above).
template <int kHeadDim>
constexpr int kSwizzleBytes = kHeadDim >= 64 ? 128 : 64;

// The byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` inside a swizzled tile of
// kRows rows with kWidth-byte rows (kSwizzleBytes).
template <int kRows, int kWidth = 128>
__host__ __device__ constexpr uint32_t swizzled_chunk_offset(int row, int chunk) {
  static_assert(kWidth == 128 || kWidth == 64, "128- or 64-byte swizzle");
  constexpr int kChunks = kWidth / 16;  // chunks per row of a part
  return static_cast<uint32_t>((chunk / kChunks) * (kRows * kWidth) + row * kWidth +
                               (((chunk % kChunks) ^ ((row % 8) / (8 / kChunks))) << 4));
}

// A matrix descriptor for a tile in the layout above with kWidth-byte rows starting at
// shared-window address `start` (bits 0-13: start >> 4; 16-29: leading byte offset >> 4; 32-45:
// stride byte offset >> 4; 62-63: 1 = 128-byte swizzle, 2 = 64-byte; base offset 0, since the
// parts are 1024-byte aligned). Shared-window addresses are below 2^18 (228 KB), so start >> 4
// fits its 14 bits without a mask, and the descriptor of start + bytes is this one plus
// bytes >> 4: a k-step's descriptor is an add to its tile's, which the compiler computes once.
template <int kWidth>
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t start, uint32_t leading_bytes,
                                                     uint32_t stride_bytes) {
  constexpr uint64_t kLayout = kWidth == 128 ? 1 : 2;
  return (static_cast<uint64_t>(start >> 4)) |
         (static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32) | (kLayout << 62);
}

// Descriptor of k-step s of a K-major tile of kRows rows with kWidth-byte rows at `tile`.
template <int kRows, int kWidth>
__device__ __forceinline__ uint64_t k_major_step(uint32_t tile, int s) {
  constexpr int kStepsPerPart = kWidth / 32;
  const uint32_t offset =
      static_cast<uint32_t>((s / kStepsPerPart) * (kRows * kWidth) + (s % kStepsPerPart) * 32);
  return wgmma_descriptor<kWidth>(tile, 16, 8 * kWidth) + (offset >> 4);
}

// Descriptor of k-step s (rows 16s..16s+15) of an MN-major tile of kRows rows with kWidth-byte
// rows at `tile`.
template <int kRows, int kWidth>
__device__ __forceinline__ uint64_t mn_major_step(uint32_t tile, int s) {
  const uint32_t offset = static_cast<uint32_t>(s * 16 * kWidth);
  return wgmma_descriptor<kWidth>(tile, kRows * kWidth, 8 * kWidth) + (offset >> 4);
}

// Orders this thread's earlier generic-proxy writes to shared memory (st.shared, cp.async once
// waited for) before later async-proxy reads (wgmma); a barrier must follow before other threads'
// wgmma read them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Before the first wgmma that reads or writes registers this thread has written since its last
// wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

#define SCIATTN_WGMMA_ACC4(a, i) "+f"(a[i][0]), "+f"(a[i][1]), "+f"(a[i][2]), "+f"(a[i][3])

// d (64 x 64, fp32; + d when accumulate != 0) = A (64 x 16, K-major tile step) * B^T, B = 64 rows
// x 16 (K-major tile step): S = Q K^T and its relatives. T: __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a,
                                                   uint64_t desc_b, int accumulate);

// d (64 x N, fp32; + d when accumulate != 0) = A (64 x 16, registers: mma.sync A fragments) * B,
// B = 16 rows x N of an MN-major tile step: O += P V and its relatives. N = 32, 64 or 128.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb(float (&d)[kN / 8][4], const uint32_t (&a)[4],
                                                     uint64_t desc_b, int accumulate);

// d (64 x N, fp32; + d when accumulate != 0) = A * B with both operands MN-major tile steps in
// shared memory (the transpose flags): A = 64 (M) x 16 (K) of a tile whose rows run along K (the
// fused backward's dS^T tile, read as dS), B = 16 rows x N (K in dQ += dS K). N = 32.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_m64nNk16_ss_tt(float (&d)[kN / 8][4], uint64_t desc_a,
                                                     uint64_t desc_b, int accumulate);

template <>
__device__ __forceinline__ void wgmma_m64n64k16_ss<__nv_bfloat16>(float (&d)[8][4], uint64_t desc_a,
                                                                  uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3), SCIATTN_WGMMA_ACC4(d, 4), SCIATTN_WGMMA_ACC4(d, 5),
        SCIATTN_WGMMA_ACC4(d, 6), SCIATTN_WGMMA_ACC4(d, 7)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb<__nv_bfloat16, 64>(float (&d)[8][4],
                                                                        const uint32_t (&a)[4],
                                                                        uint64_t desc_b,
                                                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3), SCIATTN_WGMMA_ACC4(d, 4), SCIATTN_WGMMA_ACC4(d, 5),
        SCIATTN_WGMMA_ACC4(d, 6), SCIATTN_WGMMA_ACC4(d, 7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb<__nv_bfloat16, 128>(float (&d)[16][4],
                                                                         const uint32_t (&a)[4],
                                                                         uint64_t desc_b,
                                                                         int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3), SCIATTN_WGMMA_ACC4(d, 4), SCIATTN_WGMMA_ACC4(d, 5),
        SCIATTN_WGMMA_ACC4(d, 6), SCIATTN_WGMMA_ACC4(d, 7), SCIATTN_WGMMA_ACC4(d, 8),
        SCIATTN_WGMMA_ACC4(d, 9), SCIATTN_WGMMA_ACC4(d, 10), SCIATTN_WGMMA_ACC4(d, 11),
        SCIATTN_WGMMA_ACC4(d, 12), SCIATTN_WGMMA_ACC4(d, 13), SCIATTN_WGMMA_ACC4(d, 14),
        SCIATTN_WGMMA_ACC4(d, 15)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64n64k16_ss<__half>(float (&d)[8][4], uint64_t desc_a,
                                                           uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3), SCIATTN_WGMMA_ACC4(d, 4), SCIATTN_WGMMA_ACC4(d, 5),
        SCIATTN_WGMMA_ACC4(d, 6), SCIATTN_WGMMA_ACC4(d, 7)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb<__half, 64>(float (&d)[8][4],
                                                                 const uint32_t (&a)[4],
                                                                 uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3), SCIATTN_WGMMA_ACC4(d, 4), SCIATTN_WGMMA_ACC4(d, 5),
        SCIATTN_WGMMA_ACC4(d, 6), SCIATTN_WGMMA_ACC4(d, 7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb<__half, 128>(float (&d)[16][4],
                                                                  const uint32_t (&a)[4],
                                                                  uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3), SCIATTN_WGMMA_ACC4(d, 4), SCIATTN_WGMMA_ACC4(d, 5),
        SCIATTN_WGMMA_ACC4(d, 6), SCIATTN_WGMMA_ACC4(d, 7), SCIATTN_WGMMA_ACC4(d, 8),
        SCIATTN_WGMMA_ACC4(d, 9), SCIATTN_WGMMA_ACC4(d, 10), SCIATTN_WGMMA_ACC4(d, 11),
        SCIATTN_WGMMA_ACC4(d, 12), SCIATTN_WGMMA_ACC4(d, 13), SCIATTN_WGMMA_ACC4(d, 14),
        SCIATTN_WGMMA_ACC4(d, 15)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb<__nv_bfloat16, 32>(float (&d)[4][4],
                                                                        const uint32_t (&a)[4],
                                                                        uint64_t desc_b,
                                                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb<__half, 32>(float (&d)[4][4],
                                                                 const uint32_t (&a)[4],
                                                                 uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_ss_tt<__nv_bfloat16, 32>(float (&d)[4][4],
                                                                        uint64_t desc_a,
                                                                        uint64_t desc_b,
                                                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16_ss_tt<__half, 32>(float (&d)[4][4], uint64_t desc_a,
                                                                 uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 1, 1;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d (64 x 32, fp32; + d when accumulate != 0) = A (64 x 16, K-major tile step) * B^T, B = 32 rows
// x 16 (K-major tile step): half of an S = Q K^T (the dbias2 kernel's halves of the keys).
template <typename T>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t desc_a,
                                                   uint64_t desc_b, int accumulate);

template <>
__device__ __forceinline__ void wgmma_m64n32k16_ss<__nv_bfloat16>(float (&d)[4][4], uint64_t desc_a,
                                                                  uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64n32k16_ss<__half>(float (&d)[4][4], uint64_t desc_a,
                                                           uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : SCIATTN_WGMMA_ACC4(d, 0), SCIATTN_WGMMA_ACC4(d, 1), SCIATTN_WGMMA_ACC4(d, 2),
        SCIATTN_WGMMA_ACC4(d, 3)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

#undef SCIATTN_WGMMA_ACC4

}  // namespace sciattn::cuda

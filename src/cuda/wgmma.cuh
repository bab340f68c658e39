// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the attention kernels' 64-row tiles: the
// shared-memory tile layout it reads, its matrix descriptors, and the two products the kernels
// need. CUDA layer.
//
// Tile layout ("128-byte swizzle", PTX ISA: asynchronous warpgroup-level matrix shared memory
// layout): a tile of kRows rows x D 16-bit columns (D = 64 or 128) is stored as D / 64 column
// halves of kRows x 128 bytes each; inside a half, row r's 16-byte chunk c (columns 8c..8c+7) is
// at byte r * 128 + ((c ^ (r % 8)) * 16). Every half starts on a 1024-byte boundary. The same
// stored tile serves both ways the kernels read it:
//  - K-major (the reduction runs along the row, e.g. Q or K in S = Q K^T): eight-row groups
//    1024 bytes apart (the descriptor's stride byte offset); k-step s (columns 16s..16s+15) starts
//    at half s / 4, byte (s % 4) * 32;
//  - MN-major (the reduction runs down the rows, e.g. V in O = P V, with the transpose flag):
//    k-step s covers rows 16s..16s+15, two eight-row groups 1024 bytes apart (stride byte
//    offset), and the column halves are the leading-dimension steps (leading byte offset = the
//    size of a half).
// Fragments: the fp32 accumulator of an m64nNk16 product gives warp w of the warpgroup rows
// 16w..16w+15 in the layout of mma.sync m16n8's accumulator, one [4] per n8 column tile, and an
// A operand in registers is mma.sync m16n8k16's A fragment: the attention kernels' score and
// output code works on them unchanged.
#pragma once

#include <cstdint>

namespace sciattn::cuda {

// The byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` inside a swizzled tile of
// kRows rows.
template <int kRows>
__host__ __device__ constexpr uint32_t swizzled_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * (kRows * 128) + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

// A matrix descriptor for a tile in the layout above starting at shared-window address `start`
// (bits 0-13: start >> 4; 16-29: leading byte offset >> 4; 32-45: stride byte offset >> 4;
// 62-63: 1 = 128-byte swizzle; base offset 0, since the halves are 1024-byte aligned).
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t start, uint32_t leading_bytes,
                                                     uint32_t stride_bytes) {
  return (static_cast<uint64_t>((start & 0x3FFFF) >> 4)) |
         (static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

// Descriptor of k-step s of a K-major tile of kRows rows at shared address `tile`.
template <int kRows>
__device__ __forceinline__ uint64_t k_major_step(uint32_t tile, int s) {
  return wgmma_descriptor(tile + static_cast<uint32_t>((s >> 2) * (kRows * 128) + (s & 3) * 32), 16,
                          1024);
}

// Descriptor of k-step s (rows 16s..16s+15) of an MN-major tile of kRows rows at `tile`.
template <int kRows>
__device__ __forceinline__ uint64_t mn_major_step(uint32_t tile, int s) {
  return wgmma_descriptor(tile + static_cast<uint32_t>(s * 2048), kRows * 128, 1024);
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
// B = 16 rows x N of an MN-major tile step: O += P V and its relatives. N = 64 or 128.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_m64nNk16_rs_tb(float (&d)[kN / 8][4], const uint32_t (&a)[4],
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

#undef SCIATTN_WGMMA_ACC4

}  // namespace sciattn::cuda

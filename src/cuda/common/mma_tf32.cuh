// TF32 tensor-core helpers (sm_80+): fp32 to TF32 rounding and mma.sync m16n8k8 with TF32
// operands and fp32 accumulators. CUDA layer (device code).
#pragma once

#include <cstdint>

namespace sciattn::cuda {

// x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero), as fp32 bits whose low
// 13 bits are zero.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// c += A B for a 16 x 8 A (row-major) and an 8 x 8 B (column-major) of TF32 values; lane
// l = 4 g + t holds a[0]: A[g][t], a[1]: A[g+8][t], a[2]: A[g][t+4], a[3]: A[g+8][t+4];
// b[0]: B[t][g], b[1]: B[t+4][g]; c[0..1]: C[g][2t..2t+1], c[2..3]: C[g+8][2t..2t+1].
__device__ __forceinline__ void mma_1688_tf32(float c[4], const uint32_t a[4],
                                              const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace sciattn::cuda

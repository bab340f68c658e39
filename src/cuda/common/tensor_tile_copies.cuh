// Tensor copies (TMA: cp.async.bulk.tensor, sm_90) of tiles described by a tensor map
// (common/tensor_map.h), and the shared-memory barriers (mbarrier) that say when they have
// landed: one thread starts a tile's copies after telling the tile's barrier how many bytes to
// expect; every thread that reads the tile waits for the barrier's phase to complete. A barrier
// in shared memory is 8 bytes, 8-byte aligned, addressed by its shared-window address. Only in
// code that runs on sm_90 and later (the warpgroup kernels). CUDA layer, shared by the kernel
// families.
#pragma once

#include <cstdint>

#include "cuda/common/tensor_map.h"

namespace sciattn::cuda {

// Sets up the barrier at `bar` for `arrivals` arrivals per phase (phase 0 pending), visible to the
// tensor copies once the CTA has passed a barrier after it.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], %1;\n"
      "fence.mbarrier_init.release.cluster;\n" ::"r"(bar),
      "r"(arrivals)
      : "memory");
}

// One arrival on the barrier at `bar` that also makes its current phase wait for `bytes` more of
// tensor copies.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Makes the current phase of the barrier at `bar` wait for `bytes` more of tensor copies, without
// an arrival (for copies counted beside those of an arrive_expect_bytes in the same phase).
__device__ __forceinline__ void mbarrier_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Waits until the phase of parity `parity` of the barrier at `bar` has completed (its arrivals
// made and its expected bytes landed); what the copies wrote is then visible to this thread.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Starts the tensor copy of the box of `map` (a 5-dimensional map, in a __grid_constant__
// parameter) at coordinates (x, y, z, w, v), innermost first, to the shared-window address `dst`
// (1024-byte aligned for the 128-byte swizzle, 512 for the 64-byte one), its bytes counted on the
// barrier at `bar`. The box's first element in the innermost dimension must lie on a 16-byte
// boundary (x x the element size a multiple of 16): the GPU faults on any other start
// (illegal instruction), which the encoder's rules do not say.
__device__ __forceinline__ void tensor_copy_5d(uint32_t dst, const TensorMap* map, int x, int y,
                                               int z, int w, int v, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(v), "r"(bar)
      : "memory");
}

}  // namespace sciattn::cuda

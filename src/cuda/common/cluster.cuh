// Thread-block clusters (sm_90): a CTA's rank in its cluster, the cluster-wide barrier, and
// stores into another CTA's shared memory (distributed shared memory), for kernels whose CTAs of
// one cluster share partial sums. CUDA layer.
#pragma once

#include <cstdint>

namespace sciattn::cuda {

// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster waits here for all the others. Release / acquire:
// shared-memory stores (local or remote) made before it are visible to every thread of the
// cluster after it. Also a barrier of this CTA's threads.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// The cluster-window address of shared-window address `address` in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t cluster_shared_address(uint32_t address, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(address), "r"(rank));
  return mapped;
}

// Stores to a cluster-window address (cluster_shared_address).
__device__ __forceinline__ void store_cluster_shared(uint32_t address, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void store_cluster_shared(uint32_t address, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(address), "f"(v) : "memory");
}

}  // namespace sciattn::cuda

// Programmatic dependent launch, the device side (sm_90 and later; nothing on older devices and in
// host compiles). A kernel launched with overlapped_launch.h's attribute may be scheduled while
// the kernel before it in the stream still runs, so that its launch and its CTAs' start overlap
// that kernel's tail instead of following it. Such a kernel calls wait_for_prior_grids() before
// it reads or writes anything: it returns once the kernels before it have completed and their
// writes are visible. allow_dependent_grids() lets the next kernel in the stream be scheduled
// (once every CTA of this grid has called it or exited); it orders nothing, the next kernel's
// own wait does. CUDA layer (device code).
#pragma once

namespace sciattn::cuda {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, at a kernel's start: wait for the kernels before, then let the next one be scheduled.
__device__ __forceinline__ void enter_overlapped_grid() {
  wait_for_prior_grids();
  allow_dependent_grids();
}

}  // namespace sciattn::cuda

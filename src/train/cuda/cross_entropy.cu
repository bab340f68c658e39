// Softmax cross-entropy over rows of LM-head logits on CUDA, the loss and the logits' gradient in
// one kernel, in place. CUDA layer of the trainer. One block per row: the row's maximum, then the
// sum of exp(logit - max) in fp32, both reduced in a fixed order (per-thread strided sums, then
// warps in order), lse = max + log(sum); the loss and, when asked, grad_scale * (softmax -
// onehot) written over the logits in their dtype. The loss reads the same bits with or without
// the gradient, so a forward-only call and a call with gradients give the same losses.
#include <cmath>

#include "train/cuda/kernels_common.cuh"
#include "train/cuda/layers_cuda.h"

namespace sciattn::train::cuda {
namespace {

constexpr int kThreads = 512;

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int64_t rows, int64_t V,
                         float grad_scale, bool grad, unsigned long long* bad_token) {
  __shared__ float shared[kThreads / kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* l = logits + r * V;
    const int32_t target = targets[r];
    const bool valid = target >= 0 && target < V;
    // Read before any thread can overwrite the row (the reductions' barriers come first).
    const float target_logit = valid ? to_float(l[target]) : 0.0f;
    if (!valid && threadIdx.x == 0) report_bad_token(bad_token, r, target);

    float mx = -INFINITY;
    for (int64_t v = static_cast<int64_t>(threadIdx.x) * kVec; v < V;
         v += static_cast<int64_t>(blockDim.x) * kVec) {
      float x[kVec];
      load_floats<T, kVec>(l + v, x);
#pragma unroll
      for (int i = 0; i < kVec; ++i) mx = fmaxf(mx, x[i]);
    }
    mx = block_max(mx, shared);
    float sum = 0.0f;
    for (int64_t v = static_cast<int64_t>(threadIdx.x) * kVec; v < V;
         v += static_cast<int64_t>(blockDim.x) * kVec) {
      float x[kVec];
      load_floats<T, kVec>(l + v, x);
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum += expf(x[i] - mx);
    }
    sum = block_sum(sum, shared);
    if (losses != nullptr && threadIdx.x == 0) {
      const float lse = mx + logf(sum);
      losses[r] = valid ? lse - target_logit : __int_as_float(0x7fc00000);
    }
    if (grad) {
      const float inv = 1.0f / sum;
      for (int64_t v = static_cast<int64_t>(threadIdx.x) * kVec; v < V;
           v += static_cast<int64_t>(blockDim.x) * kVec) {
        float x[kVec];
        load_floats<T, kVec>(l + v, x);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float p = expf(x[i] - mx) * inv;
          x[i] = grad_scale * (v + i == target ? p - 1.0f : p);
        }
        store_floats<T, kVec>(l + v, x);
      }
    }
  }
}

}  // namespace

cudaError_t cross_entropy(DType dtype, void* logits, float* losses, const int32_t* targets,
                          int64_t rows, int64_t V, float grad_scale, bool grad,
                          unsigned long long* bad_token, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kVec16<T>;
    if (rows == 0) return cudaSuccess;
    const unsigned grid = grid_for(rows * kThreads, kThreads);
    if (V % kVec == 0 && aligned_to(logits, 16)) {
      cross_entropy_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(
          static_cast<T*>(logits), losses, targets, rows, V, grad_scale, grad, bad_token);
    } else {
      cross_entropy_kernel<T, 1><<<grid, kThreads, 0, stream>>>(
          static_cast<T*>(logits), losses, targets, rows, V, grad_scale, grad, bad_token);
    }
    return cudaGetLastError();
  });
}

}  // namespace sciattn::train::cuda

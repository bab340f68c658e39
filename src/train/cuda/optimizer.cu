// The optimizer step's kernels on CUDA (cuda_optimizer.h): AdamW with the CPU AdamW's arithmetic,
// the global gradient norm's sum of squares in fp64, unscaling with the overflow check, and
// casts. CUDA layer of the trainer; these functions are public (they have no TensorViews to check,
// only pointers and counts).
#include <cmath>
#include <string>
#include <type_traits>

#include "common/status_try.h"
#include "sciattn/train/cuda_optimizer.h"
#include "train/adamw_coefficients.h"
#include "train/cuda/kernels_common.cuh"

namespace sciattn::train {
namespace {

using cuda::from_float;
using cuda::grid_for;
using cuda::to_float;

constexpr int kThreads = 256;

Status device_error(cudaError_t e, const std::string& what) {
  return Status(StatusCode::kDeviceError, what + ": " + cudaGetErrorString(e));
}

// Device (or managed) memory; the message names the argument.
Status check_device_pointer(const char* call, const void* p, const char* name) {
  if (p == nullptr) return Status::invalid_argument(std::string(call) + ": " + name + " is null");
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return Status::invalid_argument(std::string(call) + ": " + name +
                                    " is not memory the CUDA runtime knows");
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
    return Status::invalid_argument(std::string(call) + ": " + name +
                                    " must be CUDA device memory; got host memory");
  }
  return Status::ok_status();
}

cudaStream_t stream_of(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

// ---- AdamW ----

// The step's constants, formed on the host as the CPU AdamW forms them (adamw_coefficients.h).
using Coefficients = AdamWCoefficients;

// One rounding per operation (the _rn intrinsics are never contracted into multiply-adds), in
// the CPU AdamW's order, so every element equals the CPU's.
template <bool kDecoupled, bool kL2, typename Copy>
__global__ void adamw_kernel(Coefficients c, float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, Copy* __restrict__ copy,
                             int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float grad = __fmul_rn(g[i], c.grad_scale);
    float param = p[i];
    if constexpr (kL2) grad = __fadd_rn(__fmul_rn(param, c.grad_decay), grad);
    float momentum = __fmul_rn(m[i], c.beta1);
    momentum = __fadd_rn(__fmul_rn(grad, c.one_minus_beta1), momentum);
    float variance = __fmul_rn(v[i], c.beta2);
    variance = __fadd_rn(__fmul_rn(__fmul_rn(grad, grad), c.one_minus_beta2), variance);
    float update = __fsqrt_rn(variance);
    update = __fadd_rn(__fmul_rn(update, c.bias_correction2), c.eps);
    update = __fdiv_rn(momentum, update);
    if constexpr (kDecoupled) param = __fadd_rn(__fmul_rn(param, c.param_decay), param);
    param = __fadd_rn(__fmul_rn(update, c.step_size), param);
    m[i] = momentum;
    v[i] = variance;
    p[i] = param;
    if constexpr (!std::is_same_v<Copy, float>) copy[i] = from_float<Copy>(param);
  }
}

// Picks the variant: no decay, decoupled decay (AdamW) or L2 decay (Adam), and the copy's type
// (float means no copy).
template <typename Copy>
cudaError_t launch_adamw(const AdamWHyperparams& h, const Coefficients& c, float* p, const float* g,
                         float* m, float* v, Copy* copy, int64_t n, cudaStream_t stream) {
  const unsigned grid = grid_for(n, kThreads);
  if (!(h.weight_decay > 0.0f)) {
    adamw_kernel<false, false, Copy><<<grid, kThreads, 0, stream>>>(c, p, g, m, v, copy, n);
  } else if (h.adamw_mode) {
    adamw_kernel<true, false, Copy><<<grid, kThreads, 0, stream>>>(c, p, g, m, v, copy, n);
  } else {
    adamw_kernel<false, true, Copy><<<grid, kThreads, 0, stream>>>(c, p, g, m, v, copy, n);
  }
  return cudaGetLastError();
}

// ---- sums of squares ----

constexpr int kNormThreads = 256;
constexpr int kTotalThreads = 1024;

size_t align_up(size_t x) {
  constexpr size_t kAlign = 256;
  return (x + kAlign - 1) / kAlign * kAlign;
}

int64_t norm_chunks(int64_t n) {
  return (n + kNormChunk - 1) / kNormChunk;
}

// Block k: the fp64 sum of squares of chunk k (each thread its strided elements in order, then
// the block's fixed-order sum) and whether all its elements are finite.
__global__ void __launch_bounds__(kNormThreads)
    chunk_squares_kernel(const float* data, int64_t n, double* partial, int* finite) {
  __shared__ double shared[kNormThreads / cuda::kWarp];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kNormChunk;
  const int64_t end = begin + kNormChunk < n ? begin + kNormChunk : n;
  double sum = 0.0;
  bool ok = true;
  for (int64_t i = begin + threadIdx.x; i < end; i += kNormThreads) {
    const float x = data[i];
    ok = ok && isfinite(x);
    const double d = x;
    sum = __dadd_rn(sum, __dmul_rn(d, d));
  }
  const int all_ok = __syncthreads_and(ok ? 1 : 0);
  const double total = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = total;
    finite[blockIdx.x] = all_ok;
  }
}

// One block: the chunks' partial sums (each thread its strided chunks in order, then the block's
// fixed-order sum) and the AND of their finite flags.
__global__ void __launch_bounds__(kTotalThreads)
    total_squares_kernel(const double* partial, const int* finite, int64_t chunks, double* sum_out,
                         int* finite_out) {
  __shared__ double shared[kTotalThreads / cuda::kWarp];
  double sum = 0.0;
  bool ok = true;
  for (int64_t k = threadIdx.x; k < chunks; k += kTotalThreads) {
    sum = __dadd_rn(sum, partial[k]);
    ok = ok && finite[k] != 0;
  }
  const int all_ok = __syncthreads_and(ok ? 1 : 0);
  const double total = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) {
    *sum_out = total;
    *finite_out = all_ok;
  }
}

// x *= factor; with `overflow`, a thread that meets an Inf or NaN (before scaling) sets it to 1
// (an integer flag: the outcome does not depend on the order).
__global__ void scale_kernel(float* data, int64_t n, float factor, int* overflow) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float x = data[i];
    bad = bad || !isfinite(x);
    data[i] = x * factor;
  }
  if (overflow != nullptr && bad) atomicOr(overflow, 1);
}

// ---- casts ----

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = from_float<D>(to_float(src[i]));
  }
}

bool is_compute_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

}  // namespace

Status cuda_adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                       const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                       void* param_copy, DType copy_dtype, Stream stream) {
  constexpr const char* kCall = "cuda_adamw_step";
  SCIATTN_TRY(validate_adamw(h));
  if (step < 1) {
    return Status::invalid_argument(
        "cuda_adamw_step: step must be >= 1 (the 1-based count of applied steps); got " +
        std::to_string(step));
  }
  if (n < 0) {
    return Status::invalid_argument("cuda_adamw_step: n must be >= 0; got " + std::to_string(n));
  }
  if (!std::isfinite(grad_scale)) {
    return Status::invalid_argument("cuda_adamw_step: grad_scale must be finite; got " +
                                    std::to_string(grad_scale));
  }
  if (param_copy != nullptr && copy_dtype != DType::kF16 && copy_dtype != DType::kBF16) {
    return Status::invalid_argument(
        std::string("cuda_adamw_step: copy_dtype must be f16 or bf16; ") + "got " +
        dtype_name(copy_dtype));
  }
  if (n == 0) return Status::ok_status();
  SCIATTN_TRY(check_device_pointer(kCall, params, "params"));
  SCIATTN_TRY(check_device_pointer(kCall, grads, "grads"));
  SCIATTN_TRY(check_device_pointer(kCall, exp_avg, "exp_avg"));
  SCIATTN_TRY(check_device_pointer(kCall, exp_avg_sq, "exp_avg_sq"));
  if (param_copy != nullptr) SCIATTN_TRY(check_device_pointer(kCall, param_copy, "param_copy"));
  const Coefficients c = adamw_coefficients(h, step, grad_scale);
  cudaError_t e;
  if (param_copy == nullptr) {
    e = launch_adamw<float>(h, c, params, grads, exp_avg, exp_avg_sq, nullptr, n,
                            stream_of(stream));
  } else if (copy_dtype == DType::kF16) {
    e = launch_adamw(h, c, params, grads, exp_avg, exp_avg_sq, static_cast<__half*>(param_copy), n,
                     stream_of(stream));
  } else {
    e = launch_adamw(h, c, params, grads, exp_avg, exp_avg_sq,
                     static_cast<__nv_bfloat16*>(param_copy), n, stream_of(stream));
  }
  if (e != cudaSuccess) return device_error(e, "cuda_adamw_step: launch");
  return Status::ok_status();
}

size_t cuda_sum_squares_workspace(int64_t n) {
  const size_t chunks = static_cast<size_t>(norm_chunks(n < 0 ? 0 : n));
  return align_up(chunks * sizeof(double)) + align_up(chunks * sizeof(int)) + 256;
}

Status cuda_sum_squares(const float* data, int64_t n, void* workspace, size_t workspace_bytes,
                        Stream stream, SumSquares* out) {
  constexpr const char* kCall = "cuda_sum_squares";
  if (out == nullptr) return Status::invalid_argument("cuda_sum_squares: out is null");
  if (n < 0) {
    return Status::invalid_argument("cuda_sum_squares: n must be >= 0; got " + std::to_string(n));
  }
  *out = SumSquares{};
  if (n == 0) return Status::ok_status();
  SCIATTN_TRY(check_device_pointer(kCall, data, "data"));
  if (workspace_bytes < cuda_sum_squares_workspace(n)) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  "cuda_sum_squares: workspace has " + std::to_string(workspace_bytes) +
                      " bytes; cuda_sum_squares_workspace(" + std::to_string(n) +
                      ") = " + std::to_string(cuda_sum_squares_workspace(n)));
  }
  SCIATTN_TRY(check_device_pointer(kCall, workspace, "workspace"));
  const int64_t chunks = norm_chunks(n);
  char* ws = static_cast<char*>(workspace);
  auto* partial = reinterpret_cast<double*>(ws);
  auto* finite = reinterpret_cast<int*>(ws + align_up(chunks * sizeof(double)));
  char* result = ws + align_up(chunks * sizeof(double)) + align_up(chunks * sizeof(int));
  auto* sum_out = reinterpret_cast<double*>(result);
  auto* finite_out = reinterpret_cast<int*>(result + sizeof(double));
  const cudaStream_t s = stream_of(stream);
  if (chunks > 0x7fffffff) {
    return Status::not_supported("cuda_sum_squares: n is too large for one grid of chunks");
  }
  chunk_squares_kernel<<<static_cast<unsigned>(chunks), kNormThreads, 0, s>>>(data, n, partial,
                                                                              finite);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return device_error(e, "cuda_sum_squares: launch");
  total_squares_kernel<<<1, kTotalThreads, 0, s>>>(partial, finite, chunks, sum_out, finite_out);
  e = cudaGetLastError();
  if (e != cudaSuccess) return device_error(e, "cuda_sum_squares: launch");
  double sum = 0.0;
  int all_finite = 0;
  e = cudaMemcpyAsync(&sum, sum_out, sizeof sum, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(&all_finite, finite_out, sizeof all_finite, cudaMemcpyDeviceToHost, s);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return device_error(e, "cuda_sum_squares");
  out->sum = sum;
  out->finite = all_finite != 0;
  return Status::ok_status();
}

Status cuda_scale_in_place(float* data, int64_t n, float factor, Stream stream) {
  if (n < 0) {
    return Status::invalid_argument("cuda_scale_in_place: n must be >= 0; got " +
                                    std::to_string(n));
  }
  if (n == 0) return Status::ok_status();
  SCIATTN_TRY(check_device_pointer("cuda_scale_in_place", data, "data"));
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(stream)>>>(data, n, factor, nullptr);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return device_error(e, "cuda_scale_in_place: launch");
  return Status::ok_status();
}

Status cuda_unscale_and_check(float* data, int64_t n, float factor, void* workspace,
                              size_t workspace_bytes, Stream stream, bool* overflow) {
  constexpr const char* kCall = "cuda_unscale_and_check";
  if (overflow == nullptr)
    return Status::invalid_argument("cuda_unscale_and_check: overflow is null");
  if (n < 0) {
    return Status::invalid_argument("cuda_unscale_and_check: n must be >= 0; got " +
                                    std::to_string(n));
  }
  *overflow = false;
  if (n == 0) return Status::ok_status();
  SCIATTN_TRY(check_device_pointer(kCall, data, "data"));
  if (workspace_bytes < sizeof(int)) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  "cuda_unscale_and_check: workspace must hold at least 4 bytes "
                  "(cuda_sum_squares_workspace(n) is enough)");
  }
  SCIATTN_TRY(check_device_pointer(kCall, workspace, "workspace"));
  const cudaStream_t s = stream_of(stream);
  int* flag = static_cast<int*>(workspace);
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), s);
  if (e == cudaSuccess) {
    scale_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(data, n, factor, flag);
    e = cudaGetLastError();
  }
  int host_flag = 0;
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(&host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost, s);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return device_error(e, "cuda_unscale_and_check");
  *overflow = host_flag != 0;
  return Status::ok_status();
}

Status cuda_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                 Stream stream) {
  constexpr const char* kCall = "cuda_cast";
  if (!is_compute_dtype(src_dtype)) {
    return Status::invalid_argument(
        std::string("cuda_cast: src_dtype must be f32, f16 or bf16; got ") + dtype_name(src_dtype));
  }
  if (!is_compute_dtype(dst_dtype)) {
    return Status::invalid_argument(
        std::string("cuda_cast: dst_dtype must be f32, f16 or bf16; got ") + dtype_name(dst_dtype));
  }
  if (n < 0) return Status::invalid_argument("cuda_cast: n must be >= 0; got " + std::to_string(n));
  if (n == 0) return Status::ok_status();
  SCIATTN_TRY(check_device_pointer(kCall, src, "src"));
  SCIATTN_TRY(check_device_pointer(kCall, dst, "dst"));
  const cudaStream_t s = stream_of(stream);
  cudaError_t e;
  if (src_dtype == dst_dtype) {
    e = cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(src_dtype),
                        cudaMemcpyDeviceToDevice, s);
  } else {
    e = cuda::with_dtype(src_dtype, [&](auto src_tag) {
      using S = decltype(src_tag);
      return cuda::with_dtype(dst_dtype, [&](auto dst_tag) {
        using D = decltype(dst_tag);
        cast_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const S*>(src),
                                                                     static_cast<D*>(dst), n);
        return cudaGetLastError();
      });
    });
  }
  if (e != cudaSuccess) return device_error(e, "cuda_cast");
  return Status::ok_status();
}

}  // namespace sciattn::train

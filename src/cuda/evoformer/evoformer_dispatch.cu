// The one place where Evoformer's runtime values (dtype, head dim) become template arguments of
// the CUDA kernels, plus the CUDA-specific checks and the backward's workspace use. CUDA layer.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/evoformer_cuda_plan.h"
#include "cuda/common/device_arch.h"
#include "cuda/common/device_guard.h"
#include "cuda/common/instance_switch.h"
#include "cuda/common/overlapped_launch.h"
#include "cuda/evoformer/evoformer_bwd_kernels.cuh"
#include "cuda/evoformer/evoformer_cuda.h"
#include "cuda/evoformer/evoformer_device_params_of.h"
#include "cuda/evoformer/evoformer_instances.h"
#include "cuda/evoformer/evoformer_launch.h"

namespace sciattn::cuda {
namespace {

Status check_cuda(DType dtype, const detail::EvoformerShape& s, int64_t max_ctas) {
  const int64_t head_dim = detail::cuda_evoformer_head_dim(s.dim);
  if (head_dim == 0) {
    return Status::not_supported("q has head dim D = " + std::to_string(s.dim) +
                                 "; the CUDA kernels take D from 1 to 128");
  }
  if (max_ctas > 0x7fffffff) {
    return Status::not_supported("the problem needs " + std::to_string(max_ctas) +
                                 " thread blocks, more than one CUDA grid holds (2^31 - 1)");
  }
  if (dtype == DType::kF32) return Status::ok_status();  // fp32 kernels are always built
  if (!has_instance<EvoformerInstances>(dtype, head_dim)) {
    return Status::not_supported("this build has no CUDA kernel for head dim " +
                                 std::to_string(head_dim) + " and dtype " + dtype_name(dtype) +
                                 " (it has " + describe_instances<EvoformerInstances>() +
                                 ": SCIATTN_HEAD_DIMS / SCIATTN_DTYPES); build with the `gpu` "
                                 "preset");
  }
  return Status::ok_status();
}

// Launches launch_evoformer_forward or _backward<T, kHeadDim> (kForward) of the instantiation that
// runs this dtype and head dim (the checks have refused the pairs this build did not
// instantiate).
template <bool kForward, typename DeviceParams>
cudaError_t launch(DType dtype, int64_t dim, const DeviceParams& p, cudaStream_t stream) {
  return with_instance<EvoformerInstances>(
      dtype, detail::cuda_evoformer_head_dim(dim), cudaErrorInvalidValue,
      [&](auto type, auto head_dim) {
        using T = typename decltype(type)::type;
        constexpr int kHeadDim = decltype(head_dim)::value;
        if constexpr (kForward) {
          return launch_evoformer_forward<T, kHeadDim>(p, stream);
        } else {
          return launch_evoformer_backward<T, kHeadDim>(p, stream);
        }
      });
}

}  // namespace

int64_t evoformer_forward_ctas(const EvoformerDeviceParams& p) {
  return (p.len + detail::kCudaEvoformerBlock - 1) / detail::kCudaEvoformerBlock * p.heads *
         p.batch * p.n;
}
int64_t evoformer_dkdv_ctas(const EvoformerDeviceParams& p) {
  return evoformer_forward_ctas(p);
}
int64_t evoformer_dq_ctas(const EvoformerDeviceParams& p) {
  return evoformer_forward_ctas(p);
}
int64_t evoformer_dbias2_ctas(const EvoformerDeviceParams& p) {
  return detail::cuda_dbias2_tiles({p.batch, p.n, p.len, p.heads, p.dim}) * p.dbias2_chunks;
}

Status check_evoformer_cuda(const EvoformerForwardParams& p, const detail::EvoformerShape& s) {
  const int64_t blocks = (s.len + detail::kCudaEvoformerBlock - 1) / detail::kCudaEvoformerBlock;
  return check_cuda(p.q.dtype, s, blocks * s.heads * s.batch * s.n);
}

Status check_evoformer_cuda(const EvoformerBackwardParams& p, const detail::EvoformerShape& s) {
  const int64_t blocks = (s.len + detail::kCudaEvoformerBlock - 1) / detail::kCudaEvoformerBlock;
  const int64_t dbias2_ctas =
      p.dbias2.present() ? detail::cuda_dbias2_tiles(s) * detail::cuda_dbias2_chunks(s) : 0;
  return check_cuda(p.q.dtype, s, std::max(blocks * s.heads * s.batch * s.n, dbias2_ctas));
}

namespace {
// Whether the device of `tensor` runs the warpgroup kernels (the forward's plan depends on it:
// forward_reads_in_place). False where the device cannot be asked, which plans the staged
// copies: the larger workspace, enough for either form.
bool runs_warpgroup_kernels(const void* tensor) {
  bool warpgroup = false;
  const Status asked = on_device_of(tensor, [&] {
    DeviceKernels kernels;
    const Status usable = current_device_kernels(&kernels);
    warpgroup = usable.ok() && kernels.warpgroup_mma;
    return usable;
  });
  return asked.ok() && warpgroup;
}
}  // namespace

size_t evoformer_workspace_size_cuda(const EvoformerForwardParams& p,
                                     const detail::EvoformerShape& s) {
  // Unaligned biases' and inputs' copies.
  return forward_workspace(p, s, runs_warpgroup_kernels(p.q.data)).layout.total_bytes();
}

size_t evoformer_workspace_size_cuda(const EvoformerBackwardParams& p,
                                     const detail::EvoformerShape& s) {
  return backward_workspace(p, s).layout.total_bytes();
}

namespace {
Status run_forward_here(const EvoformerForwardParams& params, const detail::EvoformerShape& s,
                        void* workspace, Stream stream);
Status run_backward_here(const EvoformerBackwardParams& params, const detail::EvoformerShape& s,
                         void* workspace, Stream stream);
}  // namespace

Status run_evoformer_cuda(const EvoformerForwardParams& params, const detail::EvoformerShape& s,
                          void* workspace, Stream stream) {
  return on_device_of(params.q.data,
                      [&] { return run_forward_here(params, s, workspace, stream); });
}

Status run_evoformer_cuda(const EvoformerBackwardParams& params, const detail::EvoformerShape& s,
                          void* workspace, Stream stream) {
  return on_device_of(params.q.data,
                      [&] { return run_backward_here(params, s, workspace, stream); });
}

namespace {

// Makes the padded copies of the unaligned biases and inputs (forward_copy_jobs /
// backward_copy_jobs) that the kernels then read.
Status make_copies(const EvoformerCopyJobs& jobs, const EvoformerDeviceParams& p,
                   cudaStream_t stream) {
  if (jobs.count == 0) return Status();
  return device_status(launch_evoformer_row_copies(jobs, p.overlap_launches != 0, stream),
                       "Evoformer padded copy kernel launch");
}

// The mma.sync kernels (which take every shape) where the device or build has no warpgroup
// kernels or SCIATTN_CUDA_KERNELS asks for the portable ones (cuda/common/device_arch.h), within
// the shared memory the device (or that variable) allows. `kernels`: current_device_kernels'.
void keep_to_device_kernels(EvoformerDeviceParams& p, const DeviceKernels& kernels) {
  if (!kernels.warpgroup_mma) evoformer_params::use_mma_sync_kernels(p);
  p.smem_limit = kernels.smem_limit;
  p.overlap_launches = kernels.major >= 9 ? 1 : 0;
}

Status run_forward_here(const EvoformerForwardParams& params, const detail::EvoformerShape& s,
                        void* workspace, Stream stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  DeviceKernels kernels;
  const Status usable = current_device_kernels(&kernels);
  if (!usable.ok()) return usable;
  const bool warpgroup = kernels.warpgroup_mma;  // the forward's plan depends on it
  EvoformerDeviceParams p = forward_device_params(params, s, workspace, warpgroup);
  keep_to_device_kernels(p, kernels);
  const Status copied =
      make_copies(forward_copy_jobs(params, s, workspace, warpgroup), p, cuda_stream);
  if (!copied.ok()) return copied;
  if (params.q.dtype == DType::kF32) {
    return device_status(launch_evoformer_forward_f32(p, cuda_stream),
                         "Evoformer forward (fp32) kernel launch");
  }
  return device_status(launch<true>(params.q.dtype, s.dim, p, cuda_stream),
                       "Evoformer forward kernel launch");
}

Status run_backward_here(const EvoformerBackwardParams& params, const detail::EvoformerShape& s,
                         void* workspace, Stream stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  DeviceKernels kernels;
  const Status usable = current_device_kernels(&kernels);
  if (!usable.ok()) return usable;
  EvoformerDeviceParams p = backward_device_params(params, s, workspace);
  keep_to_device_kernels(p, kernels);
  const Status copied = make_copies(backward_copy_jobs(params, s, workspace), p, cuda_stream);
  if (!copied.ok()) return copied;
  const bool f32 = params.q.dtype == DType::kF32;
  cudaError_t e = cudaSuccess;
  if (f32) {
    e = launch_evoformer_backward_delta<float>(p, cuda_stream);
    if (e != cudaSuccess) return device_status(e, "Evoformer backward (delta) kernel launch");
    e = launch_evoformer_backward_f32(p, cuda_stream);
  } else {
    // The launcher computes delta itself (a kernel of its own, or inside dQ on the warpgroup
    // path).
    e = launch<false>(params.q.dtype, s.dim, p, cuda_stream);
  }
  if (e != cudaSuccess) return device_status(e, "Evoformer backward kernel launch");
  if (p.dbias1 != nullptr || p.dbias2_partial != nullptr) {
    e = launch_evoformer_backward_dbias_reduce(p, cuda_stream);
  }
  return device_status(e, "Evoformer backward (bias reduction) kernel launch");
}

}  // namespace

// ---- dtype-generic kernels and launchers ----

// dbias1[b, n, j] = sum over heads of dbias1_partial; dbias2[b, h, i, j] = sum over chunks of
// dbias2_partial (when N was split into chunks); both in a fixed order.
__global__ void evoformer_bwd_dbias_reduce_kernel(const EvoformerDeviceParams p) {
  enter_overlapped_grid();
  const int64_t d1 = p.dbias1 != nullptr ? p.batch * p.n * p.len : 0;
  const int64_t d2 = p.dbias2_partial != nullptr ? p.batch * p.heads * p.len * p.len : 0;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < d1 + d2;
       e += int64_t{gridDim.x} * blockDim.x) {
    if (e < d1) {
      const int64_t j = e % p.len, bn = e / p.len, b = bn / p.n, n = bn % p.n;
      float sum = 0.0f;
      for (int64_t h = 0; h < p.heads; ++h) sum += p.dbias1_partial[(bn * p.heads + h) * p.len + j];
      store_bias(p.dbias1, p.bias1_type,
                 b * p.dbias1_stride[0] + n * p.dbias1_stride[1] + j * p.dbias1_stride[2], sum);
    } else {
      const int64_t x = e - d1;
      const int64_t j = x % p.len, i = (x / p.len) % p.len, bh = x / (p.len * p.len);
      const int64_t b = bh / p.heads, h = bh % p.heads;
      float sum = 0.0f;
      const int64_t chunk_stride = p.batch * p.heads * p.len * p.len;
      for (int64_t c = 0; c < p.dbias2_chunks; ++c) sum += p.dbias2_partial[c * chunk_stride + x];
      store_bias(p.dbias2, p.bias2_type,
                 b * p.dbias2_stride[0] + h * p.dbias2_stride[1] + i * p.dbias2_stride[2] +
                     j * p.dbias2_stride[3],
                 sum);
    }
  }
}

template <typename T>
cudaError_t launch_evoformer_backward_delta(const EvoformerDeviceParams& p, cudaStream_t stream) {
  const int threads = 256;
  const unsigned grid = delta_grid(p.batch * p.n * p.len * p.heads, threads, 132 * 16);
  return launch_with_delta_lanes(p.dim, evoformer_delta_vec<T>(p), [&](auto lanes) {
    return launch_overlapped(evoformer_bwd_delta_kernel<T, decltype(lanes)::value>, dim3(grid),
                             threads, 0, stream, p.overlap_launches != 0, 1, p);
  });
}
template cudaError_t launch_evoformer_backward_delta<float>(const EvoformerDeviceParams&,
                                                            cudaStream_t);
template cudaError_t launch_evoformer_backward_delta<__half>(const EvoformerDeviceParams&,
                                                             cudaStream_t);
template cudaError_t launch_evoformer_backward_delta<__nv_bfloat16>(const EvoformerDeviceParams&,
                                                                    cudaStream_t);

cudaError_t launch_evoformer_backward_dbias_reduce(const EvoformerDeviceParams& p,
                                                   cudaStream_t stream) {
  const int threads = 256;
  const int64_t elements = (p.dbias1 ? p.batch * p.n * p.len : 0) +
                           (p.dbias2_partial ? p.batch * p.heads * p.len * p.len : 0);
  const int64_t blocks = std::min<int64_t>((elements + threads - 1) / threads, int64_t{132} * 16);
  if (blocks == 0) return cudaSuccess;
  return launch_overlapped(evoformer_bwd_dbias_reduce_kernel, dim3(static_cast<unsigned>(blocks)),
                           threads, 0, stream, p.overlap_launches != 0, 1, p);
}

}  // namespace sciattn::cuda

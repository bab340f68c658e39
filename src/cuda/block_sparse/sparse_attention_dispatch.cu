// The one place where the fused block-sparse attention's runtime values (dtype, head dim) become
// template arguments of its CUDA kernels, plus its CUDA-specific checks and the workspace plan
// shared by workspace_size and the launch. CUDA layer (host code).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "common/block_sparse_device_index.h"
#include "common/workspace_layout.h"
#include "cuda/block_sparse/sparse_attention_cuda.h"
#include "cuda/block_sparse/sparse_attention_device_params_of.h"
#include "cuda/block_sparse/sparse_attention_instances.h"
#include "cuda/block_sparse/sparse_attention_launch.h"
#include "cuda/common/device_arch.h"
#include "cuda/common/device_guard.h"
#include "cuda/common/instance_switch.h"

namespace sciattn::cuda {
namespace {

constexpr int64_t kTile = 64;  // SparseTile::kSize (the tile index's kTile)
constexpr int64_t kMaxHeadDim = 128;

// The instantiated head dim that runs head dim `dim`: the smallest of 32, 64, 128 built into
// this binary that is >= dim (columns past dim are zero-filled); 0 when there is none.
int64_t kernel_head_dim(int64_t dim) {
  return smallest_holding(SparseAttentionInstances::HeadDimList{}, dim);
}

bool dtype_built(DType dtype) {
  // The fp32 kernels are always built.
  return dtype == DType::kF32 || contains(SparseAttentionInstances::DTypeList{}, dtype);
}

const BlockSparseDeviceIndex::Tiles& tiles_of(const BlockSparseIndex* index) {
  return index->device->tiles;
}

// The workspace of a call: delta (backward) and the fp32 partials of split lines (tensor-core
// path only; the fp32 path walks whole lines). Both workspace_size and the launch use it.
struct FusedPlan {
  detail::WorkspaceLayout layout;
  size_t delta = 0, fwd_partial = 0, dq_partial = 0, dk_partial = 0, dv_partial = 0;
  int64_t part_dim = 0;
  bool has_fwd = false, has_dq = false, has_dkdv = false;
};

FusedPlan plan_forward(const SparseAttentionForwardParams& p, const detail::AttentionShape& s) {
  FusedPlan plan;
  if (p.q.dtype == DType::kF32) return plan;
  const auto& t = tiles_of(p.index);
  plan.part_dim = kernel_head_dim(s.dim);
  if (t.rows.slots > 0) {
    plan.has_fwd = true;
    plan.fwd_partial = plan.layout.add<float>(s.batch * t.head_repeat * t.rows.slots *
                                              (kTile * plan.part_dim + 2 * kTile));
  }
  return plan;
}

FusedPlan plan_backward(const SparseAttentionBackwardParams& p, const detail::AttentionShape& s) {
  FusedPlan plan;
  plan.delta = plan.layout.add<float>(s.batch * s.heads * s.len);
  if (p.q.dtype == DType::kF32) return plan;
  const auto& t = tiles_of(p.index);
  plan.part_dim = kernel_head_dim(s.dim);
  if (t.rows.slots > 0) {
    plan.has_dq = true;
    plan.dq_partial =
        plan.layout.add<float>(s.batch * t.head_repeat * t.rows.slots * kTile * plan.part_dim);
  }
  if (t.cols.slots > 0) {
    plan.has_dkdv = true;
    plan.dk_partial =
        plan.layout.add<float>(s.batch * t.head_repeat * t.cols.slots * kTile * plan.part_dim);
    plan.dv_partial =
        plan.layout.add<float>(s.batch * t.head_repeat * t.cols.slots * kTile * plan.part_dim);
  }
  return plan;
}

Status check_common(const BlockSparseIndex* index, DType dtype, const detail::AttentionShape& s) {
  if (s.dim < 1 || s.dim > kMaxHeadDim) {
    return Status::not_supported("q has head dim D = " + std::to_string(s.dim) +
                                 "; the fused CUDA kernels take D from 1 to " +
                                 std::to_string(kMaxHeadDim) +
                                 " (run padded to 32, 64 or 128); use the composite algorithm "
                                 "or CPU tensors for larger head dims");
  }
  if (!dtype_built(dtype) || (dtype != DType::kF32 && kernel_head_dim(s.dim) == 0)) {
    return Status::not_supported(
        "this build has no fused sparse attention CUDA kernel for head dim D = " +
        std::to_string(s.dim) + " and dtype " + dtype_name(dtype) + " (it has " +
        describe_instances<SparseAttentionInstances>() +
        ": SCIATTN_HEAD_DIMS / SCIATTN_DTYPES choose among 32, 64, 128 and f16, bf16); build "
        "with the `gpu` preset");
  }
  const BlockSparseDeviceIndex* d = index->device.get();
  if (d == nullptr || d->tiles.num_tiles == 0) {
    return Status::invalid_argument(
        "index: its device copy has no tile index for the fused kernels (the layout is not "
        "square); upload a square index with upload_block_sparse_index");
  }
  // Pieces of the stored heads' lists, each worked for head_repeat heads.
  const int64_t pieces =
      int64_t{d->tiles.head_repeat} * std::max<int64_t>(d->tiles.rows.pieces, d->tiles.cols.pieces);
  if (s.batch * pieces > 0x7fffffff) {
    return Status::not_supported("the problem needs " + std::to_string(s.batch * pieces) +
                                 " thread blocks (B * pieces over all heads), more than one CUDA "
                                 "grid holds (2^31 - 1)");
  }
  return Status::ok_status();
}

// Launches launch_sparse_attention_forward or _backward<T, kHeadDim> (kForward) of the
// instantiation that runs this dtype and head dim (the checks have refused the pairs this build did
// not instantiate).
template <bool kForward, typename DeviceParams>
cudaError_t launch(DType dtype, int64_t dim, const DeviceParams& p, cudaStream_t stream) {
  return with_instance<SparseAttentionInstances>(
      dtype, kernel_head_dim(dim), cudaErrorInvalidValue, [&](auto type, auto head_dim) {
        using T = typename decltype(type)::type;
        constexpr int kHeadDim = decltype(head_dim)::value;
        if constexpr (kForward) {
          return launch_sparse_attention_forward<T, kHeadDim>(p, stream);
        } else {
          return launch_sparse_attention_backward<T, kHeadDim>(p, stream);
        }
      });
}

// The mma.sync kernels (which take every shape) where the device or build has no warpgroup
// kernels or SCIATTN_CUDA_KERNELS asks for the portable ones (cuda/common/device_arch.h), within
// the shared memory the device (or that variable) allows.
Status keep_to_device_kernels(SparseAttentionDeviceParams& p) {
  DeviceKernels kernels;
  const Status usable = current_device_kernels(&kernels);
  if (usable.ok() && !kernels.warpgroup_mma) p.wgmma_tiles = 0;
  p.smem_limit = kernels.smem_limit;
  return usable;
}

Status run_forward_here(const SparseAttentionForwardParams& params, const detail::AttentionShape& s,
                        void* workspace, Stream stream) {
  SparseAttentionDeviceParams p = sparse_forward_device_params(params, s, kernel_head_dim(s.dim));
  const Status usable = keep_to_device_kernels(p);
  if (!usable.ok()) return usable;
  p.tiles = tiles_of(params.index);
  const FusedPlan plan = plan_forward(params, s);
  p.part_dim = static_cast<int>(plan.part_dim);
  p.fwd_partial = plan.has_fwd ? plan.layout.at<float>(workspace, plan.fwd_partial) : nullptr;
  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  if (params.q.dtype == DType::kF32) {
    return device_status(launch_sparse_attention_forward_f32(p, cuda_stream),
                         "fused sparse attention forward (fp32) kernel launch");
  }
  return device_status(launch<true>(params.q.dtype, s.dim, p, cuda_stream),
                       "fused sparse attention forward kernel launch");
}

Status run_backward_here(const SparseAttentionBackwardParams& params,
                         const detail::AttentionShape& s, void* workspace, Stream stream) {
  SparseAttentionDeviceParams p = sparse_backward_device_params(params, s, kernel_head_dim(s.dim));
  const Status usable = keep_to_device_kernels(p);
  if (!usable.ok()) return usable;
  p.tiles = tiles_of(params.index);
  const FusedPlan plan = plan_backward(params, s);
  p.part_dim = static_cast<int>(plan.part_dim);
  p.delta = plan.layout.at<float>(workspace, plan.delta);
  p.dq_partial = plan.has_dq ? plan.layout.at<float>(workspace, plan.dq_partial) : nullptr;
  p.dk_partial = plan.has_dkdv ? plan.layout.at<float>(workspace, plan.dk_partial) : nullptr;
  p.dv_partial = plan.has_dkdv ? plan.layout.at<float>(workspace, plan.dv_partial) : nullptr;

  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  const DType dtype = params.q.dtype;
  cudaError_t e = dtype == DType::kF32 ? launch_sparse_attention_delta<float>(p, cuda_stream)
                  : dtype == DType::kF16
                      ? launch_sparse_attention_delta<__half>(p, cuda_stream)
                      : launch_sparse_attention_delta<__nv_bfloat16>(p, cuda_stream);
  if (e != cudaSuccess) return device_status(e, "fused sparse attention backward (delta) launch");
  e = dtype == DType::kF32 ? launch_sparse_attention_backward_f32(p, cuda_stream)
                           : launch<false>(dtype, s.dim, p, cuda_stream);
  return device_status(e, "fused sparse attention backward kernel launch");
}

}  // namespace

Status check_sparse_attention_fused_cuda(const SparseAttentionForwardParams& p,
                                         const detail::AttentionShape& s) {
  return check_common(p.index, p.q.dtype, s);
}

Status check_sparse_attention_fused_cuda(const SparseAttentionBackwardParams& p,
                                         const detail::AttentionShape& s) {
  return check_common(p.index, p.q.dtype, s);
}

size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionForwardParams& p,
                                                  const detail::AttentionShape& s) {
  return plan_forward(p, s).layout.total_bytes();
}

size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionBackwardParams& p,
                                                  const detail::AttentionShape& s) {
  return plan_backward(p, s).layout.total_bytes();
}

Status run_sparse_attention_fused_cuda(const SparseAttentionForwardParams& p,
                                       const detail::AttentionShape& s, void* workspace,
                                       Stream stream) {
  return on_device_of(p.q.data, [&] { return run_forward_here(p, s, workspace, stream); });
}

Status run_sparse_attention_fused_cuda(const SparseAttentionBackwardParams& p,
                                       const detail::AttentionShape& s, void* workspace,
                                       Stream stream) {
  return on_device_of(p.q.data, [&] { return run_backward_here(p, s, workspace, stream); });
}

}  // namespace sciattn::cuda

// The public Evoformer attention functions: validate, then hand the call to the back end that owns
// the tensors. The one dispatch point of the op.
#include "sciattn/evoformer.h"

#include <string>
#include <type_traits>

#include "common/evoformer_checks.h"
#include "common/tensor_checks.h"
#include "cpu/evoformer_reference.h"
#include "cpu/evoformer_tiled.h"
#ifdef SCIATTN_WITH_CUDA
#include "cuda/evoformer/evoformer_cuda.h"
#endif

namespace sciattn {
namespace {

// The reference materialises B*N*H*L*L scores twice in fp32; refuse sizes whose byte count
// would not fit in size_t rather than wrap around.
constexpr int64_t kMaxReferenceScores = int64_t{1} << 58;

Status report(Status status, std::string* why) {
  if (why != nullptr) *why = status.ok() ? std::string() : status.message();
  return status;
}

// CUDA tensors: what this build's kernels accept, or a clear "not in this build".
template <typename Params>
Status check_cuda(const Params& p, const detail::EvoformerShape& s) {
#ifdef SCIATTN_WITH_CUDA
  if constexpr (std::is_same_v<Params, EvoformerForwardParams>) {
    return cuda::check_evoformer_forward_cuda(p, s);
  } else {
    return cuda::check_evoformer_backward_cuda(p, s);
  }
#else
  (void)p;
  (void)s;
  return Status::not_supported(
      "the tensors are on a CUDA device but this build of sciattn has no CUDA support; "
      "configure with the `cuda` or `gpu` preset (SCIATTN_WITH_CUDA=ON), or pass CPU tensors");
#endif
}

Status check_reference_size(const EvoformerOptions& o, const detail::EvoformerShape& s) {
  if (o.cpu_algorithm == EvoformerCpuAlgorithm::kReference &&
      s.batch * s.n * s.heads * s.len * s.len > kMaxReferenceScores) {
    return Status::invalid_argument(
        "cpu_algorithm kReference materialises B*N*H*L*L scores, too many for this shape; use "
        "kTiled");
  }
  return Status::ok_status();
}

}  // namespace

Status can_implement(const EvoformerForwardParams& p, std::string* why) {
  detail::EvoformerShape s;
  Status status = detail::check_evoformer_forward(p, &s);
  if (status.ok()) status = check_reference_size(p.options, s);
  if (status.ok() && p.q.device == Device::kCuda) status = check_cuda(p, s);
  return report(status, why);
}

Status can_implement(const EvoformerBackwardParams& p, std::string* why) {
  detail::EvoformerShape s;
  Status status = detail::check_evoformer_backward(p, &s);
  if (status.ok()) status = check_reference_size(p.options, s);
  if (status.ok() && p.q.device == Device::kCuda) status = check_cuda(p, s);
  return report(status, why);
}

size_t workspace_size(const EvoformerForwardParams& p) {
  detail::EvoformerShape s;
  if (!can_implement(p).ok() || !detail::check_evoformer_forward(p, &s).ok()) return 0;
  if (p.q.device == Device::kCuda) return 0;  // the forward kernel needs no scratch
  return p.options.cpu_algorithm == EvoformerCpuAlgorithm::kReference
             ? cpu::reference_forward_workspace_size(s)
             : cpu::tiled_forward_workspace_size(p, s);
}

size_t workspace_size(const EvoformerBackwardParams& p) {
  detail::EvoformerShape s;
  if (!can_implement(p).ok() || !detail::check_evoformer_backward(p, &s).ok()) return 0;
#ifdef SCIATTN_WITH_CUDA
  if (p.q.device == Device::kCuda) return cuda::evoformer_backward_workspace_size_cuda(p, s);
#endif
  return p.options.cpu_algorithm == EvoformerCpuAlgorithm::kReference
             ? cpu::reference_backward_workspace_size(s)
             : cpu::tiled_backward_workspace_size(p, s);
}

Status run(const EvoformerForwardParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  detail::EvoformerShape s;
  detail::check_evoformer_forward(p, &s);
#ifdef SCIATTN_WITH_CUDA
  if (p.q.device == Device::kCuda) return cuda::run_evoformer_forward_cuda(p, s, stream);
#endif
  if (p.options.cpu_algorithm == EvoformerCpuAlgorithm::kReference) {
    cpu::run_reference_forward(p, s, workspace);
  } else {
    cpu::run_tiled_forward(p, s, workspace);
  }
  return Status::ok_status();
}

Status run(const EvoformerBackwardParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  detail::EvoformerShape s;
  detail::check_evoformer_backward(p, &s);
#ifdef SCIATTN_WITH_CUDA
  if (p.q.device == Device::kCuda)
    return cuda::run_evoformer_backward_cuda(p, s, workspace, stream);
#endif
  if (p.options.cpu_algorithm == EvoformerCpuAlgorithm::kReference) {
    cpu::run_reference_backward(p, s, workspace);
  } else {
    cpu::run_tiled_backward(p, s, workspace);
  }
  return Status::ok_status();
}

double evoformer_forward_flops(const EvoformerForwardParams& p) {
  detail::EvoformerShape s;
  if (!detail::check_evoformer_forward(p, &s).ok()) return 0.0;
  return 4.0 * static_cast<double>(s.batch * s.n * s.heads) * static_cast<double>(s.len) *
         static_cast<double>(s.len) * static_cast<double>(s.dim);
}

double evoformer_backward_flops(const EvoformerBackwardParams& p) {
  detail::EvoformerShape s;
  if (!detail::check_evoformer_backward(p, &s).ok()) return 0.0;
  return 10.0 * static_cast<double>(s.batch * s.n * s.heads) * static_cast<double>(s.len) *
         static_cast<double>(s.len) * static_cast<double>(s.dim);
}

}  // namespace sciattn

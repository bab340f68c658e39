// The public Evoformer attention functions: the op's traits (its checks and back ends) and the
// protocol through detail::OpDriver, which validates once and hands the call to the back end
// that owns the tensors. The one dispatch point of the op.
#include "sciattn/evoformer.h"

#include <string>

#include "common/evoformer_checks.h"
#include "common/op_driver.h"
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

Status check_reference_size(const EvoformerOptions& o, const detail::EvoformerShape& s) {
  if (o.cpu_algorithm == EvoformerCpuAlgorithm::kReference &&
      s.batch * s.n * s.heads * s.len * s.len > kMaxReferenceScores) {
    return Status::invalid_argument(
        "cpu_algorithm kReference materialises B*N*H*L*L scores, too many for this shape; use "
        "kTiled");
  }
  return Status::ok_status();
}

// The op's traits for detail::OpDriver (common/op_driver.h). Forward and backward share the
// placement and the CUDA back end (whose functions are overloads for both Params); the checks and
// the CPU algorithms differ.
template <typename P>
struct EvoformerOp {
  using Params = P;
  using Shape = detail::EvoformerShape;
  static constexpr const char* kName = "Evoformer attention";

  static const TensorView& placement(const P& p) { return p.q; }
  static bool reference(const P& p) {
    return p.options.cpu_algorithm == EvoformerCpuAlgorithm::kReference;
  }
#ifdef SCIATTN_WITH_CUDA
  static Status check_cuda(const P& p, const Shape& s) {
    return cuda::check_evoformer_cuda(p, s);
  }
  static size_t cuda_workspace(const P& p, const Shape& s) {
    return cuda::evoformer_workspace_size_cuda(p, s);
  }
  static Status run_cuda(const P& p, const Shape& s, void* workspace, Stream stream) {
    return cuda::run_evoformer_cuda(p, s, workspace, stream);
  }
#endif
};

struct EvoformerForward : EvoformerOp<EvoformerForwardParams> {
  static Status check(const Params& p, Shape* s) {
    Status status = detail::check_evoformer_forward(p, s);
    return status.ok() ? check_reference_size(p.options, *s) : status;
  }
  static size_t cpu_workspace(const Params& p, const Shape& s) {
    return reference(p) ? cpu::reference_forward_workspace_size(s)
                        : cpu::tiled_forward_workspace_size(p, s);
  }
  static void run_cpu(const Params& p, const Shape& s, void* workspace) {
    if (reference(p)) {
      cpu::run_reference_forward(p, s, workspace);
    } else {
      cpu::run_tiled_forward(p, s, workspace);
    }
  }
};

struct EvoformerBackward : EvoformerOp<EvoformerBackwardParams> {
  static Status check(const Params& p, Shape* s) {
    Status status = detail::check_evoformer_backward(p, s);
    return status.ok() ? check_reference_size(p.options, *s) : status;
  }
  static size_t cpu_workspace(const Params& p, const Shape& s) {
    return reference(p) ? cpu::reference_backward_workspace_size(s)
                        : cpu::tiled_backward_workspace_size(p, s);
  }
  static void run_cpu(const Params& p, const Shape& s, void* workspace) {
    if (reference(p)) {
      cpu::run_reference_backward(p, s, workspace);
    } else {
      cpu::run_tiled_backward(p, s, workspace);
    }
  }
};

}  // namespace

SCIATTN_DEFINE_OP_PROTOCOL(EvoformerForward)
SCIATTN_DEFINE_OP_PROTOCOL(EvoformerBackward)

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

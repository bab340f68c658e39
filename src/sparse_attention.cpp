// The public sparse self-attention (forward and backward; fused, composite and reference
// algorithms): the op's traits (its checks and back ends) and the protocol through
// detail::OpDriver, which validates once and hands the call to the back end that owns the
// tensors. The one dispatch point of the op.
#include <string>

#include "common/block_sparse_checks.h"
#include "common/op_driver.h"
#include "cpu/block_sparse_cpu.h"
#include "cpu/block_sparse_reference.h"
#include "sciattn/block_sparse_ops.h"
#ifdef SCIATTN_WITH_CUDA
#include "common/block_sparse_device_index.h"
#include "cuda/block_sparse/block_sparse_ops_cuda.h"
#include "cuda/block_sparse/sparse_attention_cuda.h"
#endif

namespace sciattn {
namespace {

// The op's traits for detail::OpDriver (common/op_driver.h). Forward and backward share the
// placement and the CUDA back end: the fused kernels or the composite of the GPU ops, whose
// functions are overloads for both Params; the reference algorithm is the CPU's specification
// only. The checks and the CPU path differ.
template <typename P>
struct SparseAttentionOp {
  using Params = P;
  using Shape = detail::AttentionShape;
  static constexpr const char* kName = "sparse attention";

  static const TensorView& placement(const P& p) { return p.q; }
  static int threads(const P& p) { return cpu::block_sparse_threads(p.options.num_threads); }
#ifdef SCIATTN_WITH_CUDA
  static Status check_cuda(const P& p, const Shape& s) {
    const Status index = detail::check_device_index(*p.index, p.q.data);
    if (!index.ok()) return index;
    switch (p.options.algorithm) {
      case SparseAttentionAlgorithm::kFused:
        return cuda::check_sparse_attention_fused_cuda(p, s);
      case SparseAttentionAlgorithm::kComposite:
        return cuda::check_sparse_attention_composite_cuda(p, s);
      case SparseAttentionAlgorithm::kReference:
        break;
    }
    return Status::not_supported(
        "options.algorithm: the reference algorithm runs on CPU tensors only; on CUDA tensors use "
        "fused (the default) or composite");
  }
  static size_t cuda_workspace(const P& p, const Shape& s) {
    return p.options.algorithm == SparseAttentionAlgorithm::kFused
               ? cuda::sparse_attention_fused_workspace_size_cuda(p, s)
               : cuda::sparse_attention_composite_workspace_size_cuda(p, s);
  }
  static Status run_cuda(const P& p, const Shape& s, void* workspace, Stream stream) {
    return p.options.algorithm == SparseAttentionAlgorithm::kFused
               ? cuda::run_sparse_attention_fused_cuda(p, s, workspace, stream)
               : cuda::run_sparse_attention_composite_cuda(p, s, workspace, stream);
  }
#endif
};

struct SparseAttentionForward : SparseAttentionOp<SparseAttentionForwardParams> {
  static Status check(const Params& p, Shape* s) { return detail::check_attention_forward(p, s); }
  static size_t cpu_workspace(const Params& p, const Shape& s) {
    switch (p.options.algorithm) {
      case SparseAttentionAlgorithm::kFused:
        return cpu::fused_forward_workspace_size(p, s, threads(p));
      case SparseAttentionAlgorithm::kComposite:
        return cpu::composite_forward_workspace_size(p, s, threads(p));
      case SparseAttentionAlgorithm::kReference:
        return cpu::reference_forward_workspace_size(s);
    }
    return 0;
  }
  static void run_cpu(const Params& p, const Shape& s, void* workspace) {
    switch (p.options.algorithm) {
      case SparseAttentionAlgorithm::kFused:
        cpu::fused_forward(p, s, threads(p), workspace);
        break;
      case SparseAttentionAlgorithm::kComposite:
        cpu::composite_forward(p, s, threads(p), workspace);
        break;
      case SparseAttentionAlgorithm::kReference:
        cpu::run_reference_forward(p, s, workspace);
        break;
    }
  }
};

struct SparseAttentionBackward : SparseAttentionOp<SparseAttentionBackwardParams> {
  static Status check(const Params& p, Shape* s) { return detail::check_attention_backward(p, s); }
  static size_t cpu_workspace(const Params& p, const Shape& s) {
    switch (p.options.algorithm) {
      case SparseAttentionAlgorithm::kFused:
        return cpu::fused_backward_workspace_size(p, s, threads(p));
      case SparseAttentionAlgorithm::kComposite:
        return cpu::composite_backward_workspace_size(p, s, threads(p));
      case SparseAttentionAlgorithm::kReference:
        return cpu::reference_backward_workspace_size(s);
    }
    return 0;
  }
  static void run_cpu(const Params& p, const Shape& s, void* workspace) {
    switch (p.options.algorithm) {
      case SparseAttentionAlgorithm::kFused:
        cpu::fused_backward(p, s, threads(p), workspace);
        break;
      case SparseAttentionAlgorithm::kComposite:
        cpu::composite_backward(p, s, threads(p), workspace);
        break;
      case SparseAttentionAlgorithm::kReference:
        cpu::run_reference_backward(p, s, workspace);
        break;
    }
  }
};

double attention_block_flops(const BlockSparseIndex* index, const detail::AttentionShape& s) {
  return static_cast<double>(s.batch) * static_cast<double>(index->nnz) *
         static_cast<double>(index->block * index->block) * static_cast<double>(s.dim);
}

}  // namespace

const char* sparse_attention_algorithm_name(SparseAttentionAlgorithm a) {
  switch (a) {
    case SparseAttentionAlgorithm::kFused:
      return "fused";
    case SparseAttentionAlgorithm::kComposite:
      return "composite";
    case SparseAttentionAlgorithm::kReference:
      return "reference";
  }
  return "?";
}

SCIATTN_DEFINE_OP_PROTOCOL(SparseAttentionForward)
SCIATTN_DEFINE_OP_PROTOCOL(SparseAttentionBackward)

double sparse_attention_forward_flops(const SparseAttentionForwardParams& p) {
  detail::AttentionShape s;
  if (!detail::check_attention_forward(p, &s).ok()) return 0.0;
  return 4.0 * attention_block_flops(p.index, s);
}

double sparse_attention_backward_flops(const SparseAttentionBackwardParams& p) {
  detail::AttentionShape s;
  if (!detail::check_attention_backward(p, &s).ok()) return 0.0;
  return 10.0 * attention_block_flops(p.index, s);
}

}  // namespace sciattn

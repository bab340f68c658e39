// The public block-sparse MatMul (sdd / dsd / dds, forward and backward): the op's traits (its
// checks and back ends) and the protocol through detail::OpDriver, which validates once and hands
// the call to the back end that owns the tensors. The one dispatch point of the op.
#include <string>
#include <string_view>

#include "common/block_sparse_checks.h"
#include "common/op_driver.h"
#include "cpu/block_sparse_cpu.h"
#include "sciattn/block_sparse_ops.h"
#ifdef SCIATTN_WITH_CUDA
#include "common/block_sparse_device_index.h"
#include "cuda/block_sparse/block_sparse_ops_cuda.h"
#endif

namespace sciattn {
namespace {

// The op's traits for detail::OpDriver (common/op_driver.h). Forward and backward share the
// placement and the CUDA back end (whose functions are overloads for both Params); the checks and
// the CPU path differ.
template <typename P>
struct MatMulOp {
  using Params = P;
  using Shape = detail::MatMulShape;
  static constexpr const char* kName = "the block-sparse MatMul";

  static const TensorView& placement(const P& p) { return p.a; }
#ifdef SCIATTN_WITH_CUDA
  static Status check_cuda(const P& p, const Shape&) {
    const Status index = detail::check_device_index(*p.index, p.a.data);
    return index.ok() ? cuda::check_block_sparse_matmul_cuda(p) : index;
  }
  static size_t cuda_workspace(const P& p, const Shape&) {
    return cuda::block_sparse_matmul_workspace_size_cuda(p);
  }
  static Status run_cuda(const P& p, const Shape&, void* workspace, Stream stream) {
    return cuda::run_block_sparse_matmul_cuda(p, workspace, stream);
  }
#endif
};

struct MatMulForward : MatMulOp<BlockSparseMatMulParams> {
  static Status check(const Params& p, Shape* s) { return detail::check_matmul(p, s); }
  static size_t cpu_workspace(const Params& p, const Shape& s) {
    return cpu::matmul_workspace_size(p, s, cpu::block_sparse_threads(p.num_threads));
  }
  static void run_cpu(const Params& p, const Shape&, void* workspace) {
    cpu::run_matmul(p, cpu::block_sparse_threads(p.num_threads), workspace);
  }
};

struct MatMulBackward : MatMulOp<BlockSparseMatMulBackwardParams> {
  static Status check(const Params& p, Shape* s) { return detail::check_matmul_backward(p, s); }
  static size_t cpu_workspace(const Params& p, const Shape& s) {
    return cpu::matmul_backward_workspace_size(p, s, cpu::block_sparse_threads(p.num_threads));
  }
  static void run_cpu(const Params& p, const Shape&, void* workspace) {
    cpu::run_matmul_backward(p, cpu::block_sparse_threads(p.num_threads), workspace);
  }
};

}  // namespace

const char* matmul_mode_name(BlockSparseMatMulMode mode) {
  switch (mode) {
    case BlockSparseMatMulMode::kSdd:
      return "sdd";
    case BlockSparseMatMulMode::kDsd:
      return "dsd";
    case BlockSparseMatMulMode::kDds:
      return "dds";
  }
  return "?";
}

std::optional<BlockSparseMatMulMode> parse_matmul_mode(std::string_view name) {
  if (name == "sdd") return BlockSparseMatMulMode::kSdd;
  if (name == "dsd") return BlockSparseMatMulMode::kDsd;
  if (name == "dds") return BlockSparseMatMulMode::kDds;
  return std::nullopt;
}

SCIATTN_DEFINE_OP_PROTOCOL(MatMulForward)
SCIATTN_DEFINE_OP_PROTOCOL(MatMulBackward)

double block_sparse_matmul_flops(const BlockSparseMatMulParams& p) {
  detail::MatMulShape s;
  if (!detail::check_matmul(p, &s).ok()) return 0.0;
  const BlockSparseIndex& ix = *p.index;
  // sdd computes every element of nnz blocks over K; dsd and dds multiply each stored block with
  // the N (or M) columns (rows) of the dense operand.
  const double inner = p.mode == BlockSparseMatMulMode::kSdd   ? static_cast<double>(s.k)
                       : p.mode == BlockSparseMatMulMode::kDsd ? static_cast<double>(s.n)
                                                               : static_cast<double>(s.m);
  return 2.0 * static_cast<double>(s.batch) * static_cast<double>(ix.nnz) *
         static_cast<double>(ix.block * ix.block) * inner;
}

}  // namespace sciattn

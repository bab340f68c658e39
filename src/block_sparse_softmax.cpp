// The public block-sparse Softmax (forward and backward) and the mask modes it shares with the
// sparse attention: the op's traits (its checks and back ends) and the protocol through
// detail::OpDriver, which validates once and hands the call to the back end that owns the
// tensors. The one dispatch point of the op.
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

cpu::ScoreTerms softmax_terms(const BlockSparseSoftmaxParams& p) {
  cpu::ScoreTerms t;
  t.scale = p.scale;
  t.rpe = &p.rpe;
  t.key_padding_mask = &p.key_padding_mask;
  t.attn_mask = &p.attn_mask;
  t.key_padding_mask_mode = p.key_padding_mask_mode;
  t.attn_mask_mode = p.attn_mask_mode;
  t.causal = p.causal;
  return t;
}

// The tensor whose device chooses the back end: the forward's input x, the backward's y.
const TensorView& softmax_input(const BlockSparseSoftmaxParams& p) {
  return p.x;
}
const TensorView& softmax_input(const BlockSparseSoftmaxBackwardParams& p) {
  return p.y;
}

// The op's traits for detail::OpDriver (common/op_driver.h); the shape is the batch Z. Forward
// and backward share the placement and the CUDA back end (whose functions are overloads for both
// Params); the checks and the CPU path differ.
template <typename P>
struct SoftmaxOp {
  using Params = P;
  using Shape = int64_t;
  static constexpr const char* kName = "the block-sparse Softmax";

  static const TensorView& placement(const P& p) { return softmax_input(p); }
#ifdef SCIATTN_WITH_CUDA
  static Status check_cuda(const P& p, const Shape&) {
    const Status index = detail::check_device_index(*p.index, softmax_input(p).data);
    return index.ok() ? cuda::check_block_sparse_softmax_cuda(p) : index;
  }
  static size_t cuda_workspace(const P& p, const Shape&) {
    return cuda::block_sparse_softmax_workspace_size_cuda(p);
  }
  static Status run_cuda(const P& p, const Shape&, void* workspace, Stream stream) {
    return cuda::run_block_sparse_softmax_cuda(p, workspace, stream);
  }
#endif
};

struct SoftmaxForward : SoftmaxOp<BlockSparseSoftmaxParams> {
  static Status check(const Params& p, Shape* batch) { return detail::check_softmax(p, batch); }
  static size_t cpu_workspace(const Params& p, const Shape&) {
    return cpu::softmax_workspace_size(*p.index, cpu::block_sparse_threads(p.num_threads));
  }
  static void run_cpu(const Params& p, const Shape&, void* workspace) {
    cpu::softmax_forward(*p.index, p.x.sizes[0], p.x, p.y, softmax_terms(p), nullptr,
                         cpu::block_sparse_threads(p.num_threads), workspace);
  }
};

struct SoftmaxBackward : SoftmaxOp<BlockSparseSoftmaxBackwardParams> {
  static Status check(const Params& p, Shape* batch) {
    return detail::check_softmax_backward(p, batch);
  }
  static size_t cpu_workspace(const Params& p, const Shape&) {
    return cpu::softmax_backward_workspace_size(*p.index, cpu::block_sparse_threads(p.num_threads));
  }
  static void run_cpu(const Params& p, const Shape&, void* workspace) {
    cpu::softmax_backward(*p.index, p.y.sizes[0], p.y, p.dy, p.dx, p.scale,
                          cpu::block_sparse_threads(p.num_threads), workspace);
  }
};

}  // namespace

const char* mask_mode_name(MaskMode mode) {
  switch (mode) {
    case MaskMode::kAdd:
      return "add";
    case MaskMode::kMul:
      return "mul";
  }
  return "?";
}

std::optional<MaskMode> parse_mask_mode(std::string_view name) {
  if (name == "add") return MaskMode::kAdd;
  if (name == "mul") return MaskMode::kMul;
  return std::nullopt;
}

SCIATTN_DEFINE_OP_PROTOCOL(SoftmaxForward)
SCIATTN_DEFINE_OP_PROTOCOL(SoftmaxBackward)

}  // namespace sciattn

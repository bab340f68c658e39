// The composite sparse attention on the GPU (SparseAttentionAlgorithm::kComposite): DeepSpeed's
// sdd -> softmax -> dsd on the GPU MatMul and Softmax kernels, forward and backward, exactly as
// the CPU composite (cpu/sparse_attention_composite.cpp). CUDA layer (host code).
//
// The scores W and probabilities P ([B, nnz, b, b]) live in fp32 in the workspace, so the sdd
// writes fp32 from Q and K in their dtype and the dsd multiplies fp32 P with V in its dtype (the
// mixed-dtype instantiations of the MatMul kernels). The backward recomputes P rather than reading
// a saved one, as on the CPU, so its Params are the fused path's.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/workspace_layout.h"
#include "cuda/block_sparse/block_sparse_launch.h"
#include "cuda/block_sparse/block_sparse_ops_cuda.h"

namespace sciattn::cuda {
namespace {

using detail::AttentionShape;
using detail::WorkspaceLayout;

// [B, nnz, b, b] fp32 scores, for the backward a second region for their gradient, and the
// dsd products' partial sums of split lines (the largest of them; the products run one after
// another on the stream).
struct CompositePlan {
  WorkspaceLayout layout;
  size_t scores = 0, grads = 0, partial = 0;
  bool with_partial = false;
};

CompositePlan plan(const BlockSparseIndex& ix, const AttentionShape& s, bool backward) {
  CompositePlan r;
  const int64_t elems = s.batch * ix.nnz * ix.block * ix.block;
  r.scores = r.layout.add<float>(elems);
  if (backward) r.grads = r.layout.add<float>(elems);
  // O = P V and dQ = dW K walk block rows; dV = P^T dO and dK = dW^T Q block columns (D wide).
  const int64_t rows = bs::dsd_partial_elems(ix, false, s.batch, s.dim);
  const int64_t partial =
      backward ? std::max(rows, bs::dsd_partial_elems(ix, true, s.batch, s.dim)) : rows;
  r.with_partial = partial > 0;
  if (r.with_partial) r.partial = r.layout.add<float>(partial);
  return r;
}

float* partial_of(const CompositePlan& r, void* workspace) {
  return r.with_partial ? r.layout.at<float>(workspace, r.partial) : nullptr;
}

TensorView sparse_view(float* data, const BlockSparseIndex& ix, const AttentionShape& s) {
  return TensorView::contiguous(data, DType::kF32, {s.batch, ix.nnz, ix.block, ix.block},
                                Device::kCuda);
}

template <typename Params>
bs::SoftmaxTerms terms_of(const Params& p, float scale) {
  bs::SoftmaxTerms t;
  t.scale = scale;
  t.rpe = p.rpe;
  t.key_padding_mask = p.key_padding_mask;
  t.attn_mask = p.attn_mask;
  t.key_padding_mask_mode = p.options.key_padding_mask_mode;
  t.attn_mask_mode = p.options.attn_mask_mode;
  t.causal = p.options.causal;
  return t;
}

cudaStream_t stream_of(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

#define SCIATTN_BS_TRY(expr)           \
  do {                                 \
    Status status_ = (expr);           \
    if (!status_.ok()) return status_; \
  } while (0)

Status forward_here(const SparseAttentionForwardParams& p, const AttentionShape& s, void* workspace,
                    cudaStream_t stream) {
  const BlockSparseIndex& ix = *p.index;
  const BlockSparseDeviceIndex& dix = *ix.device;
  const CompositePlan r = plan(ix, s, false);
  const TensorView w = sparse_view(r.layout.at<float>(workspace, r.scores), ix, s);
  const bs::SoftmaxTerms terms = terms_of(p, detail::attention_scale(p.options, s.dim));
  SCIATTN_BS_TRY(bs::launch_sdd(dix, p.q, bs::transposed(p.k), w, stream));  // W = Q K^T
  // P = softmax(W), in place, with the log-sum-exp when asked for.
  SCIATTN_BS_TRY(bs::launch_softmax_forward(dix, s.batch, w, w, terms, p.lse, stream));
  return bs::launch_dsd(dix, w, false, p.v, p.out, partial_of(r, workspace), stream);  // O = P V
}

Status backward_here(const SparseAttentionBackwardParams& p, const AttentionShape& s,
                     void* workspace, cudaStream_t stream) {
  const BlockSparseIndex& ix = *p.index;
  const BlockSparseDeviceIndex& dix = *ix.device;
  const CompositePlan r = plan(ix, s, true);
  const TensorView prob = sparse_view(r.layout.at<float>(workspace, r.scores), ix, s);
  const TensorView grad = sparse_view(r.layout.at<float>(workspace, r.grads), ix, s);
  const float scale = detail::attention_scale(p.options, s.dim);
  const bs::SoftmaxTerms terms = terms_of(p, scale);
  SCIATTN_BS_TRY(bs::launch_sdd(dix, p.q, bs::transposed(p.k), prob, stream));
  SCIATTN_BS_TRY(bs::launch_softmax_forward(dix, s.batch, prob, prob, terms, TensorView{}, stream));
  float* partial = partial_of(r, workspace);
  SCIATTN_BS_TRY(bs::launch_dsd(dix, prob, true, p.dout, p.dv, partial, stream));  // dV = P^T dO
  SCIATTN_BS_TRY(bs::launch_sdd(dix, p.dout, bs::transposed(p.v), grad, stream));  // dP = dO V^T
  SCIATTN_BS_TRY(bs::launch_softmax_backward(dix, s.batch, prob, grad, grad, scale, stream));
  SCIATTN_BS_TRY(bs::launch_dsd(dix, grad, false, p.k, p.dq, partial, stream));  // dQ = dW K
  return bs::launch_dsd(dix, grad, true, p.q, p.dk, partial, stream);            // dK = dW^T Q
}

#undef SCIATTN_BS_TRY

}  // namespace

// Everything the common checks accept runs: the kernels take any strides, every dtype pair of
// the call (inputs in q's dtype, fp32 scores) and any size (grid-stride loops, int64 offsets).
Status check_sparse_attention_composite_cuda(const SparseAttentionForwardParams&,
                                             const AttentionShape&) {
  return Status::ok_status();
}
Status check_sparse_attention_composite_cuda(const SparseAttentionBackwardParams&,
                                             const AttentionShape&) {
  return Status::ok_status();
}

size_t sparse_attention_composite_workspace_size_cuda(const SparseAttentionForwardParams& p,
                                                      const AttentionShape& s) {
  return plan(*p.index, s, false).layout.total_bytes();
}
size_t sparse_attention_composite_workspace_size_cuda(const SparseAttentionBackwardParams& p,
                                                      const AttentionShape& s) {
  return plan(*p.index, s, true).layout.total_bytes();
}

Status run_sparse_attention_composite_cuda(const SparseAttentionForwardParams& p,
                                           const AttentionShape& s, void* workspace,
                                           Stream stream) {
  return on_device_of(p.q.data, [&] { return forward_here(p, s, workspace, stream_of(stream)); });
}
Status run_sparse_attention_composite_cuda(const SparseAttentionBackwardParams& p,
                                           const AttentionShape& s, void* workspace,
                                           Stream stream) {
  return on_device_of(p.q.data, [&] { return backward_here(p, s, workspace, stream_of(stream)); });
}

}  // namespace sciattn::cuda

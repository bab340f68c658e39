// The composite CPU sparse attention: DeepSpeed's SparseSelfAttention as sdd -> softmax -> dsd
// (spec 2.4), forward and backward, on the CPU MatMul and Softmax kernels. CPU layer.
//
// The block scores W and probabilities P ([B, nnz, b, b]) live in the workspace in fp32, where
// DeepSpeed kept them in the input's dtype: the composite path is the compatibility path, and
// rounding P to fp16 only adds error. The backward recomputes P instead of reading a saved one,
// so its Params are the fused path's.
#include <algorithm>

#include "common/workspace_layout.h"
#include "cpu/block_sparse_cpu.h"

namespace sciattn::cpu {
namespace {

using detail::AttentionShape;
using detail::WorkspaceLayout;

// [B, nnz, b, b] fp32 regions, then the scratch every kernel of the sequence shares (they run
// one after another, so the largest one is enough).
struct CompositePlan {
  WorkspaceLayout layout;
  size_t scores = 0, grads = 0, scratch = 0;
};

int64_t sparse_elems(const BlockSparseIndex& ix, const AttentionShape& s) {
  return s.batch * ix.nnz * ix.block * ix.block;
}

CompositePlan plan(const BlockSparseIndex& ix, const AttentionShape& s, int threads,
                   bool backward) {
  CompositePlan r;
  r.scores = r.layout.add<float>(sparse_elems(ix, s));
  if (backward) r.grads = r.layout.add<float>(sparse_elems(ix, s));
  size_t scratch =
      std::max({sdd_workspace_size(ix, s.dim, threads), softmax_workspace_size(ix, threads),
                dsd_workspace_size(ix, s.dim, threads)});
  if (backward) scratch = std::max(scratch, softmax_backward_workspace_size(ix, threads));
  r.scratch = r.layout.add<std::byte>(static_cast<int64_t>(scratch));
  return r;
}

TensorView sparse_view(float* data, const BlockSparseIndex& ix, const AttentionShape& s) {
  return TensorView::contiguous(data, DType::kF32, {s.batch, ix.nnz, ix.block, ix.block});
}

}  // namespace

size_t composite_forward_workspace_size(const SparseAttentionForwardParams& p,
                                        const AttentionShape& s, int threads) {
  return plan(*p.index, s, threads, false).layout.total_bytes();
}

size_t composite_backward_workspace_size(const SparseAttentionBackwardParams& p,
                                         const AttentionShape& s, int threads) {
  return plan(*p.index, s, threads, true).layout.total_bytes();
}

void composite_forward(const SparseAttentionForwardParams& p, const AttentionShape& s, int threads,
                       void* workspace) {
  const BlockSparseIndex& ix = *p.index;
  const CompositePlan r = plan(ix, s, threads, false);
  const TensorView w = sparse_view(r.layout.at<float>(workspace, r.scores), ix, s);
  void* scratch = r.layout.at<std::byte>(workspace, r.scratch);
  const ScoreTerms terms = attention_score_terms(
      p.options, detail::attention_scale(p.options, s.dim), p.rpe, p.key_padding_mask, p.attn_mask);
  sdd(ix, p.q, transposed(p.k), w, threads, scratch);                   // W = Q K^T
  softmax_forward(ix, s.batch, w, w, terms, &p.lse, threads, scratch);  // P = softmax(W), in place
  dsd(ix, w, false, p.v, p.out, threads, scratch);                      // O = P V
}

void composite_backward(const SparseAttentionBackwardParams& p, const AttentionShape& s,
                        int threads, void* workspace) {
  const BlockSparseIndex& ix = *p.index;
  const CompositePlan r = plan(ix, s, threads, true);
  const TensorView prob = sparse_view(r.layout.at<float>(workspace, r.scores), ix, s);
  const TensorView grad = sparse_view(r.layout.at<float>(workspace, r.grads), ix, s);
  void* scratch = r.layout.at<std::byte>(workspace, r.scratch);
  const float scale = detail::attention_scale(p.options, s.dim);
  const ScoreTerms terms =
      attention_score_terms(p.options, scale, p.rpe, p.key_padding_mask, p.attn_mask);
  sdd(ix, p.q, transposed(p.k), prob, threads, scratch);
  softmax_forward(ix, s.batch, prob, prob, terms, nullptr, threads, scratch);
  dsd(ix, prob, true, p.dout, p.dv, threads, scratch);                       // dV = P^T dO
  sdd(ix, p.dout, transposed(p.v), grad, threads, scratch);                  // dP = dO V^T
  softmax_backward(ix, s.batch, prob, grad, grad, scale, threads, scratch);  // dW, in place
  dsd(ix, grad, false, p.k, p.dq, threads, scratch);                         // dQ = dW K
  dsd(ix, grad, true, p.q, p.dk, threads, scratch);                          // dK = dW^T Q
}

}  // namespace sciattn::cpu

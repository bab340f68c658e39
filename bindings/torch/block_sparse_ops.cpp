// The block-sparse ops of the torch binding: MatMul (bsmm), Softmax (bs_softmax) and the fused or
// composite sparse self-attention, forward and backward, with their schemas and their CPU and
// CUDA kernels, which turn tensors into the library's Params on the cached index of the layout
// tensor (index_cache.h); float64 goes to the ATen path of fp64.cpp. The attention's autograd is
// in autograd.cpp, the composite ops' in sciattn/_ops.py. Binding layer.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "fp64.h"
#include "index_cache.h"
#include "kernel_registry.h"
#include "sciattn/block_sparse_ops.h"
#include "tensor_args.h"

namespace sciattn::torch_ext {
namespace {

// The output shape of a MatMul (docs/block_sparse_ops.md); the Python fake kernel mirrors it.
std::vector<int64_t> matmul_out_shape(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& layout, int64_t block, int64_t nnz,
                                      BlockSparseMatMulMode mode, bool trans_a, bool trans_b) {
  const int64_t H = layout.size(0), R = layout.size(1), C = layout.size(2);
  if (mode == BlockSparseMatMulMode::kSdd) {
    check_dim(a, 4, "a", "[Z, H, M, K]");
    return {a.size(0), nnz, block, block};
  }
  if (mode == BlockSparseMatMulMode::kDsd) {
    check_dim(b, 4, "b", "[Z, H, K, N]");
    return {b.size(0), H, (trans_a ? C : R) * block, trans_b ? b.size(2) : b.size(3)};
  }
  check_dim(a, 4, "a", "[Z, H, M, K]");
  return {a.size(0), H, trans_a ? a.size(3) : a.size(2), (trans_b ? R : C) * block};
}

at::Tensor bsmm(at::Tensor a, at::Tensor b, const at::Tensor& layout, int64_t block, int64_t nnz,
                c10::string_view mode_name, bool trans_a, bool trans_b) {
  check_same_device(a, "a", {{&b, "b"}});
  const BlockSparseMatMulMode mode = matmul_mode(mode_name);
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "b has dtype ", b.scalar_type(),
                   " but a has dtype ", a.scalar_type(), "; they must be equal");
  const auto shape = matmul_out_shape(a, b, layout, block, nnz, mode, trans_a, trans_b);
  if (a.scalar_type() == at::kDouble) {
    return fp64::bsmm(a, b, layout, block, mode, trans_a, trans_b);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, a);
  at::Tensor c = at::empty(shape, a.options());
  BlockSparseMatMulParams p;
  p.index = index.get();
  p.mode = mode;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  // Dense operands may have any strides (a transposed view needs no copy); sparse ones need
  // stride 1 on the last dimension, and are empty for a layout without blocks.
  const bool sparse_a = mode == BlockSparseMatMulMode::kDsd;
  const bool sparse_b = mode == BlockSparseMatMulMode::kDds;
  const bool sparse_c = mode == BlockSparseMatMulMode::kSdd;
  p.a = view_of(a, "a", /*any_strides=*/!sparse_a, /*allow_empty=*/sparse_a);
  p.b = view_of(b, "b", /*any_strides=*/!sparse_b, /*allow_empty=*/sparse_b);
  p.c = view_of(c, "c", /*any_strides=*/false, /*allow_empty=*/sparse_c);
  p.num_threads = num_threads();
  run_op(p, a, "MatMul");
  return c;
}

std::tuple<at::Tensor, at::Tensor> bsmm_bwd(at::Tensor dc, at::Tensor a, at::Tensor b,
                                            const at::Tensor& layout, int64_t block, int64_t nnz,
                                            c10::string_view mode_name, bool trans_a, bool trans_b,
                                            bool need_da, bool need_db) {
  check_same_device(a, "a", {{&b, "b"}, {&dc, "dc"}});
  const BlockSparseMatMulMode mode = matmul_mode(mode_name);
  TORCH_CHECK_VALUE(need_da || need_db, "need_da or need_db must be true");
  if (a.scalar_type() == at::kDouble) {
    return fp64::bsmm_bwd(dc, a, b, layout, block, mode, trans_a, trans_b, need_da, need_db);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, a);
  at::Tensor da = need_da ? at::empty(a.sizes(), a.options()) : at::empty({0}, a.options());
  at::Tensor db = need_db ? at::empty(b.sizes(), b.options()) : at::empty({0}, b.options());
  BlockSparseMatMulBackwardParams p;
  p.index = index.get();
  p.mode = mode;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  const bool sparse_a = mode == BlockSparseMatMulMode::kDsd;
  const bool sparse_b = mode == BlockSparseMatMulMode::kDds;
  const bool sparse_c = mode == BlockSparseMatMulMode::kSdd;
  p.a = view_of(a, "a", /*any_strides=*/!sparse_a, /*allow_empty=*/sparse_a);
  p.b = view_of(b, "b", /*any_strides=*/!sparse_b, /*allow_empty=*/sparse_b);
  p.dc = view_of(dc, "dc", /*any_strides=*/!sparse_c, /*allow_empty=*/sparse_c);
  if (need_da) p.da = view_of(da, "da", false, /*allow_empty=*/sparse_a);
  if (need_db) p.db = view_of(db, "db", false, /*allow_empty=*/sparse_b);
  p.num_threads = num_threads();
  run_op(p, a, "MatMul (backward)");
  return {da, db};
}

at::Tensor bs_softmax(at::Tensor x, const at::Tensor& layout, int64_t block, int64_t nnz,
                      double scale, OptTensor rpe, OptTensor key_padding_mask, OptTensor attn_mask,
                      c10::string_view key_padding_mask_mode, c10::string_view attn_mask_mode) {
  check_dim(x, 4, "x", "[Z, nnz, block, block]");
  check_same_device(x, "x",
                    {{opt_ptr(rpe), "rpe"},
                     {opt_ptr(key_padding_mask), "key_padding_mask"},
                     {opt_ptr(attn_mask), "attn_mask"}});
  const MaskMode kpm_mode = mask_mode(key_padding_mask_mode, "key_padding_mask_mode");
  const MaskMode am_mode = mask_mode(attn_mask_mode, "attn_mask_mode");
  if (x.scalar_type() == at::kDouble) {
    return fp64::bs_softmax(x, layout, block, scale, rpe, key_padding_mask, attn_mask, kpm_mode,
                            am_mode);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, x);
  at::Tensor y = at::empty(x.sizes(), x.options());
  BlockSparseSoftmaxParams p;
  p.index = index.get();
  p.x = view_of(x, "x", false, /*allow_empty=*/true);  // empty for a layout without blocks
  p.y = view_of(y, "y", false, /*allow_empty=*/true);
  p.scale = *scale_of(scale);
  p.rpe = optional_view(rpe, "rpe", true);
  p.key_padding_mask = optional_view(key_padding_mask, "key_padding_mask", true);
  p.attn_mask = optional_view(attn_mask, "attn_mask", true);
  p.key_padding_mask_mode = kpm_mode;
  p.attn_mask_mode = am_mode;
  p.num_threads = num_threads();
  run_op(p, x, "Softmax");
  return y;
}

at::Tensor bs_softmax_bwd(at::Tensor dy, at::Tensor y, const at::Tensor& layout, int64_t block,
                          int64_t nnz, double scale) {
  check_same_device(y, "y", {{&dy, "dy"}});
  if (y.scalar_type() == at::kDouble) {
    return fp64::bs_softmax_bwd(dy, y, layout, block, scale);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, y);
  at::Tensor dx = at::empty(y.sizes(), y.options());
  BlockSparseSoftmaxBackwardParams p;
  p.index = index.get();
  p.y = view_of(y, "y", false, /*allow_empty=*/true);
  p.dy = view_of(dy, "dy", false, /*allow_empty=*/true);
  p.dx = view_of(dx, "dx", false, /*allow_empty=*/true);
  p.scale = *scale_of(scale);
  p.num_threads = num_threads();
  run_op(p, y, "Softmax (backward)");
  return dx;
}

SparseAttentionOptions attention_options(std::optional<double> scale, bool causal,
                                         MaskMode kpm_mode, MaskMode attn_mode,
                                         SparseAttentionAlgorithm algorithm) {
  SparseAttentionOptions o;
  o.scale = scale_of(scale);
  o.causal = causal;
  o.key_padding_mask_mode = kpm_mode;
  o.attn_mask_mode = attn_mode;
  o.num_threads = num_threads();
  o.algorithm = algorithm;
  return o;
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_fwd(
    at::Tensor q, at::Tensor k, at::Tensor v, const at::Tensor& layout, int64_t block, int64_t nnz,
    OptTensor rpe, OptTensor key_padding_mask, OptTensor attn_mask, std::optional<double> scale,
    bool causal, c10::string_view key_padding_mask_mode, c10::string_view attn_mask_mode,
    c10::string_view algorithm) {
  check_dim(q, 4, "query", "[B, H, L, D]");
  check_same_device(q, "query",
                    {{&k, "key"},
                     {&v, "value"},
                     {opt_ptr(rpe), "rpe"},
                     {opt_ptr(key_padding_mask), "key_padding_mask"},
                     {opt_ptr(attn_mask), "attn_mask"}});
  const MaskMode kpm_mode = mask_mode(key_padding_mask_mode, "key_padding_mask_mode");
  const MaskMode am_mode = mask_mode(attn_mask_mode, "attn_mask_mode");
  const SparseAttentionAlgorithm alg = attention_algorithm(algorithm);
  if (q.scalar_type() == at::kDouble) {
    return fp64::sparse_attention_fwd(q, k, v, layout, block, rpe, key_padding_mask, attn_mask,
                                      scale, causal, kpm_mode, am_mode);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, q);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  SparseAttentionForwardParams p;
  p.index = index.get();
  p.q = view_of(q, "query", true);
  p.k = view_of(k, "key", true);
  p.v = view_of(v, "value", true);
  p.rpe = optional_view(rpe, "rpe", true);
  p.key_padding_mask = optional_view(key_padding_mask, "key_padding_mask", true);
  p.attn_mask = optional_view(attn_mask, "attn_mask", true);
  p.out = view_of(out, "out");
  p.lse = view_of(lse, "lse");
  p.options = attention_options(scale, causal, kpm_mode, am_mode, alg);
  run_op(p, q, "SparseSelfAttention");
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention_bwd(
    at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse,
    const at::Tensor& layout, int64_t block, int64_t nnz, OptTensor rpe, OptTensor key_padding_mask,
    OptTensor attn_mask, std::optional<double> scale, bool causal,
    c10::string_view key_padding_mask_mode, c10::string_view attn_mask_mode,
    c10::string_view algorithm) {
  check_dim(q, 4, "query", "[B, H, L, D]");
  check_same_device(q, "query",
                    {{&dout, "dout"},
                     {&k, "key"},
                     {&v, "value"},
                     {&out, "out"},
                     {&lse, "lse"},
                     {opt_ptr(rpe), "rpe"},
                     {opt_ptr(key_padding_mask), "key_padding_mask"},
                     {opt_ptr(attn_mask), "attn_mask"}});
  const MaskMode kpm_mode = mask_mode(key_padding_mask_mode, "key_padding_mask_mode");
  const MaskMode am_mode = mask_mode(attn_mask_mode, "attn_mask_mode");
  const SparseAttentionAlgorithm alg = attention_algorithm(algorithm);
  if (q.scalar_type() == at::kDouble) {
    return fp64::sparse_attention_bwd(dout, q, k, v, layout, block, rpe, key_padding_mask,
                                      attn_mask, scale, causal, kpm_mode, am_mode);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, q);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(q.sizes(), q.options());
  at::Tensor dv = at::empty(q.sizes(), q.options());
  SparseAttentionBackwardParams p;
  p.index = index.get();
  p.q = view_of(q, "query", true);
  p.k = view_of(k, "key", true);
  p.v = view_of(v, "value", true);
  p.rpe = optional_view(rpe, "rpe", true);
  p.key_padding_mask = optional_view(key_padding_mask, "key_padding_mask", true);
  p.attn_mask = optional_view(attn_mask, "attn_mask", true);
  p.out = view_of(out, "out", true);
  p.lse = view_of(lse, "lse", true);
  p.dout = view_of(dout, "dout", true);
  p.dq = view_of(dq, "dq");
  p.dk = view_of(dk, "dk");
  p.dv = view_of(dv, "dv");
  p.options = attention_options(scale, causal, kpm_mode, am_mode, alg);
  run_op(p, q, "SparseSelfAttention (backward)");
  return {dq, dk, dv};
}

}  // namespace

void register_block_sparse_kernels(torch::Library& m) {
  m.impl("bsmm", &bsmm);
  m.impl("bsmm_bwd", &bsmm_bwd);
  m.impl("bs_softmax", &bs_softmax);
  m.impl("bs_softmax_bwd", &bs_softmax_bwd);
  m.impl("sparse_attention_fwd", &sparse_attention_fwd);
  m.impl("sparse_attention_bwd", &sparse_attention_bwd);
}

}  // namespace sciattn::torch_ext

// The layout is [H, R, C] of 0s and 1s; nnz is its count of nonzero blocks, which sizes the
// sparse tensors [Z, nnz, block, block]. Outputs a call does not need are empty tensors of shape
// [0]; the Python side turns them into None.
TORCH_LIBRARY_FRAGMENT(sciattn, m) {
  m.def(
      "bsmm(Tensor a, Tensor b, Tensor layout, int block, int nnz, str mode, bool trans_a, "
      "bool trans_b) -> Tensor");
  m.def(
      "bsmm_bwd(Tensor dc, Tensor a, Tensor b, Tensor layout, int block, int nnz, str mode, "
      "bool trans_a, bool trans_b, bool need_da, bool need_db) -> (Tensor, Tensor)");
  m.def(
      "bs_softmax(Tensor x, Tensor layout, int block, int nnz, float scale, Tensor? rpe, "
      "Tensor? key_padding_mask, Tensor? attn_mask, str key_padding_mask_mode=\"add\", "
      "str attn_mask_mode=\"mul\") -> Tensor");
  m.def(
      "bs_softmax_bwd(Tensor dy, Tensor y, Tensor layout, int block, int nnz, float scale) "
      "-> Tensor");
  m.def(
      "sparse_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor layout, int block, int nnz, "
      "Tensor? rpe, Tensor? key_padding_mask, Tensor? attn_mask, float? scale, bool causal, "
      "str key_padding_mask_mode=\"add\", str attn_mask_mode=\"mul\", "
      "str algorithm=\"fused\") -> (Tensor, Tensor)");
  m.def(
      "sparse_attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor layout, int block, int nnz, Tensor? rpe, Tensor? key_padding_mask, "
      "Tensor? attn_mask, float? scale, bool causal, str key_padding_mask_mode=\"add\", "
      "str attn_mask_mode=\"mul\", str algorithm=\"fused\") -> (Tensor, Tensor, Tensor)");
}

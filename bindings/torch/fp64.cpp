// float64 implementations of the sciattn torch ops in plain ATen (see fp64.h). Binding layer.
// Dense and obviously correct rather than fast: each op materialises its logical dense matrices.
#include "fp64.h"

#include <cmath>
#include <limits>

namespace sciattn::torch_ext::fp64 {
namespace {

using at::indexing::Slice;
constexpr double kInf = std::numeric_limits<double>::infinity();

void check_f64(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kDouble, name, " has dtype ", t.scalar_type(),
                   "; with float64 inputs every floating tensor must be float64");
}
void check_f64_or_bool(const OptTensor& t, const char* name) {
  if (!t.has_value()) return;
  TORCH_CHECK_TYPE(t->scalar_type() == at::kDouble || t->scalar_type() == at::kBool, name,
                   " has dtype ", t->scalar_type(),
                   "; with float64 inputs it must be float64 or bool");
}
void check_shape(const at::Tensor& t, at::IntArrayRef shape, const char* name) {
  TORCH_CHECK_VALUE(t.sizes() == shape, name, " must have shape ", shape, "; got ", t.sizes());
}

// Softmax over the last dimension; a row of all -inf gives zeros and log-sum-exp -inf.
std::tuple<at::Tensor, at::Tensor> safe_softmax(const at::Tensor& s) {
  at::Tensor m = s.amax(-1, /*keepdim=*/true);
  m = at::where(at::isneginf(m), at::zeros_like(m), m);
  at::Tensor e = at::exp(s - m);
  at::Tensor sum = e.sum(-1, /*keepdim=*/true);
  at::Tensor p = e / at::where(sum == 0, at::ones_like(sum), sum);
  at::Tensor lse = (m + at::log(sum)).squeeze(-1);
  return {p, lse};
}

// The additive term of a mask (docs/block_sparse_ops.md): bool true keeps; 'add' adds the value;
// 'mul' removes a 0 and keeps anything else.
at::Tensor mask_term(const at::Tensor& m, MaskMode mode, const at::TensorOptions& f64) {
  if (m.scalar_type() == at::kBool) {
    return at::where(m, at::zeros({}, f64), at::full({}, -kInf, f64));
  }
  if (mode == MaskMode::kMul)
    return at::where(m == 0, at::full({}, -kInf, f64), at::zeros({}, f64));
  return m.to(at::kDouble);
}

double evo_scale(std::optional<double> scale, int64_t dim) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

void check_evoformer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const OptTensor& bias1, const OptTensor& bias2) {
  check_f64(q, "q");
  check_f64(k, "k");
  check_f64(v, "v");
  check_shape(k, q.sizes(), "k");
  check_shape(v, q.sizes(), "v");
  const int64_t B = q.size(0), N = q.size(1), L = q.size(2), H = q.size(3);
  check_f64_or_bool(bias1, "bias1");
  if (bias1) check_shape(*bias1, {B, N, 1, 1, L}, "bias1");
  if (bias2) {
    check_f64(*bias2, "bias2");
    check_shape(*bias2, {B, 1, H, L, L}, "bias2");
  }
}

// [B, N, H, L, L] probabilities and [B, N, H, L] log-sum-exp.
std::tuple<at::Tensor, at::Tensor> evoformer_probs(const at::Tensor& q, const at::Tensor& k,
                                                   const OptTensor& bias1, const OptTensor& bias2,
                                                   double scale) {
  at::Tensor s = at::einsum("bnihd,bnjhd->bnhij", {q, k}) * scale;
  if (bias1) s = s + mask_term(*bias1, MaskMode::kAdd, q.options());  // [B, N, 1, 1, L] broadcasts
  if (bias2) s = s + *bias2;                                          // [B, 1, H, L, L] broadcasts
  return safe_softmax(s);
}

// The incoming gradient as a packed tensor. ATen picks its product and reduction kernels by
// strides, and the stride-0 gradient that out.sum().backward() hands over took kernels whose bits
// changed with the thread count; a packed copy takes the kernels of every other gradient, whose
// bits do not (docs/python.md promises that for every dtype; test_nan_and_edges.py checks it).
at::Tensor packed_gradient(const at::Tensor& g) {
  return g.contiguous();
}

// ---- block-sparse helpers ----

struct Blocks {
  at::Tensor h, r, c;  // [nnz] each, layout.nonzero() order, on the data's device
  int64_t H, R, C;
};

Blocks blocks_of(const at::Tensor& layout, const at::Device& device) {
  TORCH_CHECK_VALUE(layout.dim() == 3, "layout must have shape [H, R, C]; got ", layout.sizes());
  at::Tensor nz = layout.to(at::kCPU).ne(0).nonzero().to(device);
  return {nz.select(1, 0), nz.select(1, 1), nz.select(1, 2),
          layout.size(0),  layout.size(1),  layout.size(2)};
}

// Sparse [Z, nnz, b, b] -> its logical dense [Z, H, R*b, C*b], `fill` outside the layout.
at::Tensor to_dense(const at::Tensor& s, const Blocks& bl, int64_t b, double fill) {
  TORCH_CHECK_VALUE(s.dim() == 4 && s.size(1) == bl.h.size(0) && s.size(2) == b && s.size(3) == b,
                    "a sparse tensor must have shape [Z, nnz, block, block] = [Z, ", bl.h.size(0),
                    ", ", b, ", ", b, "]; got ", s.sizes());
  const int64_t Z = s.size(0);
  at::Tensor d = at::full({Z, bl.H, bl.R, bl.C, b, b}, fill, s.options());
  d.index_put_({Slice(), bl.h, bl.r, bl.c}, s);
  return d.permute({0, 1, 2, 4, 3, 5}).reshape({Z, bl.H, bl.R * b, bl.C * b});
}

// Dense [Z, H, R*b, C*b] -> the sparse [Z, nnz, b, b] of its layout blocks.
at::Tensor to_sparse(const at::Tensor& d, const Blocks& bl, int64_t b) {
  const int64_t Z = d.size(0);
  at::Tensor blocks = d.reshape({Z, bl.H, bl.R, b, bl.C, b}).permute({0, 1, 2, 4, 3, 5});
  return blocks.index({Slice(), bl.h, bl.r, bl.c}).contiguous();
}

at::Tensor maybe_t(const at::Tensor& x, bool trans) {
  return trans ? x.transpose(-1, -2) : x;
}

void check_dense(const at::Tensor& x, const Blocks& bl, const char* name) {
  TORCH_CHECK_VALUE(x.dim() == 4 && x.size(1) == bl.H, name,
                    " must have shape [Z, H, rows, cols] with H = ", bl.H, "; got ", x.sizes());
}

// op(a), op(b) as dense matrices; sparse operands expanded with zeros.
std::tuple<at::Tensor, at::Tensor> matmul_operands(const at::Tensor& a, const at::Tensor& b,
                                                   const Blocks& bl, int64_t block,
                                                   BlockSparseMatMulMode mode, bool trans_a,
                                                   bool trans_b) {
  check_f64(a, "a");
  check_f64(b, "b");
  if (mode != BlockSparseMatMulMode::kDsd) check_dense(a, bl, "a");
  if (mode != BlockSparseMatMulMode::kDds) check_dense(b, bl, "b");
  at::Tensor A = mode == BlockSparseMatMulMode::kDsd ? to_dense(a, bl, block, 0.0) : a;
  at::Tensor B = mode == BlockSparseMatMulMode::kDds ? to_dense(b, bl, block, 0.0) : b;
  A = maybe_t(A, trans_a);
  B = maybe_t(B, trans_b);
  TORCH_CHECK_VALUE(A.size(-1) == B.size(-2), "the inner sizes of op(a) ", A.sizes(), " and op(b) ",
                    B.sizes(), " must be equal");
  return {A, B};
}

at::Tensor attention_scores(const at::Tensor& q, const at::Tensor& k, const Blocks& bl,
                            const at::Tensor& layout, int64_t block, const OptTensor& rpe,
                            const OptTensor& kpm, const OptTensor& am, std::optional<double> scale,
                            bool causal, MaskMode kpm_mode, MaskMode am_mode) {
  check_f64(q, "query");
  check_f64(k, "key");
  TORCH_CHECK_VALUE(q.dim() == 4 && k.sizes() == q.sizes(),
                    "query and key must have the same shape [B, H, L, D]; got ", q.sizes(), " and ",
                    k.sizes());
  const int64_t L = q.size(2);
  TORCH_CHECK_VALUE(bl.H == q.size(1) && bl.R * block == L && bl.C * block == L,
                    "layout [H, L/block, L/block] must be [", q.size(1), ", ", L / block, ", ",
                    L / block, "] for query ", q.sizes(), " and block ", block, "; got ",
                    layout.sizes());
  const double sc = evo_scale(scale, q.size(3));
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * sc;
  if (rpe) s = s + rpe->to(at::kDouble);
  if (kpm) s = s + mask_term(*kpm, kpm_mode, q.options()).view({q.size(0), 1, 1, L});
  if (am) s = s + mask_term(*am, am_mode, q.options());
  at::Tensor keep = layout.to(q.device())
                        .ne(0)
                        .repeat_interleave(block, 1)
                        .repeat_interleave(block, 2);  // [H, L, L]
  if (causal) keep = keep & at::ones({L, L}, keep.options()).tril();
  return s.masked_fill(keep.logical_not(), -kInf);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> evoformer_fwd(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const OptTensor& bias1,
                                                 const OptTensor& bias2,
                                                 std::optional<double> scale) {
  check_evoformer(q, k, v, bias1, bias2);
  auto [p, lse] = evoformer_probs(q, k, bias1, bias2, evo_scale(scale, q.size(4)));
  at::Tensor out = at::einsum("bnhij,bnjhd->bnihd", {p, v}).contiguous();
  return {out, lse.reshape({q.size(0) * q.size(1), q.size(3), q.size(2)}).contiguous()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> evoformer_bwd(
    const at::Tensor& dout_in, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const OptTensor& bias1, const OptTensor& bias2, const at::Tensor&, const at::Tensor&,
    std::optional<double> scale, bool need_dbias1, bool need_dbias2) {
  const at::Tensor dout = packed_gradient(dout_in);
  check_evoformer(q, k, v, bias1, bias2);
  check_f64(dout, "dout");
  check_shape(dout, q.sizes(), "dout");
  const double sc = evo_scale(scale, q.size(4));
  at::Tensor p = std::get<0>(evoformer_probs(q, k, bias1, bias2, sc));
  at::Tensor dp = at::einsum("bnihd,bnjhd->bnhij", {dout, v});
  at::Tensor ds = p * (dp - (p * dp).sum(-1, /*keepdim=*/true));
  at::Tensor dq = (at::einsum("bnhij,bnjhd->bnihd", {ds, k}) * sc).contiguous();
  at::Tensor dk = (at::einsum("bnhij,bnihd->bnjhd", {ds, q}) * sc).contiguous();
  at::Tensor dv = at::einsum("bnhij,bnihd->bnjhd", {p, dout}).contiguous();
  at::Tensor dbias1 = need_dbias1 ? ds.sum({2, 3}).reshape(bias1->sizes()).contiguous()
                                  : at::empty({0}, q.options());
  at::Tensor dbias2 =
      need_dbias2 ? ds.sum(1, /*keepdim=*/true).contiguous() : at::empty({0}, q.options());
  return {dq, dk, dv, dbias1, dbias2};
}

at::Tensor bsmm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, int64_t block,
                BlockSparseMatMulMode mode, bool trans_a, bool trans_b) {
  const Blocks bl = blocks_of(layout, a.device());
  auto [A, B] = matmul_operands(a, b, bl, block, mode, trans_a, trans_b);
  at::Tensor c = at::matmul(A, B);
  return mode == BlockSparseMatMulMode::kSdd ? to_sparse(c, bl, block) : c.contiguous();
}

std::tuple<at::Tensor, at::Tensor> bsmm_bwd(const at::Tensor& dc_in, const at::Tensor& a,
                                            const at::Tensor& b, const at::Tensor& layout,
                                            int64_t block, BlockSparseMatMulMode mode, bool trans_a,
                                            bool trans_b, bool need_da, bool need_db) {
  const at::Tensor dc = packed_gradient(dc_in);
  const Blocks bl = blocks_of(layout, a.device());
  auto [A, B] = matmul_operands(a, b, bl, block, mode, trans_a, trans_b);
  check_f64(dc, "dc");
  at::Tensor dC = mode == BlockSparseMatMulMode::kSdd ? to_dense(dc, bl, block, 0.0) : dc;
  at::Tensor da = at::empty({0}, a.options()), db = at::empty({0}, b.options());
  if (need_da) {
    da = maybe_t(at::matmul(dC, B.transpose(-1, -2)), trans_a);
    da = mode == BlockSparseMatMulMode::kDsd ? to_sparse(da, bl, block) : da.contiguous();
  }
  if (need_db) {
    db = maybe_t(at::matmul(A.transpose(-1, -2), dC), trans_b);
    db = mode == BlockSparseMatMulMode::kDds ? to_sparse(db, bl, block) : db.contiguous();
  }
  return {da, db};
}

at::Tensor bs_softmax(const at::Tensor& x, const at::Tensor& layout, int64_t block, double scale,
                      const OptTensor& rpe, const OptTensor& key_padding_mask,
                      const OptTensor& attn_mask, MaskMode key_padding_mask_mode,
                      MaskMode attn_mask_mode) {
  check_f64(x, "x");
  const Blocks bl = blocks_of(layout, x.device());
  at::Tensor present = to_dense(at::ones_like(x), bl, block, 0.0).ne(0);
  at::Tensor v = to_dense(x, bl, block, 0.0) * scale;
  const int64_t Z = x.size(0);
  if (rpe) v = v + rpe->to(at::kDouble);
  if (key_padding_mask) {
    v = v + mask_term(*key_padding_mask, key_padding_mask_mode, x.options())
                .view({Z, 1, 1, bl.C * block});
  }
  if (attn_mask) v = v + mask_term(*attn_mask, attn_mask_mode, x.options());
  v = v.masked_fill(present.logical_not(), -kInf);
  return to_sparse(std::get<0>(safe_softmax(v)), bl, block);
}

at::Tensor bs_softmax_bwd(const at::Tensor& dy_in, const at::Tensor& y, const at::Tensor& layout,
                          int64_t block, double scale) {
  const at::Tensor dy = packed_gradient(dy_in);
  check_f64(y, "y");
  check_f64(dy, "dy");
  const Blocks bl = blocks_of(layout, y.device());
  at::Tensor Y = to_dense(y, bl, block, 0.0), dY = to_dense(dy, bl, block, 0.0);
  at::Tensor dx = Y * (dY - (Y * dY).sum(-1, /*keepdim=*/true)) * scale;
  return to_sparse(dx, bl, block);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& layout,
    int64_t block, const OptTensor& rpe, const OptTensor& key_padding_mask,
    const OptTensor& attn_mask, std::optional<double> scale, bool causal,
    MaskMode key_padding_mask_mode, MaskMode attn_mask_mode) {
  const Blocks bl = blocks_of(layout, q.device());
  check_f64(v, "value");
  check_shape(v, q.sizes(), "value");
  at::Tensor s = attention_scores(q, k, bl, layout, block, rpe, key_padding_mask, attn_mask, scale,
                                  causal, key_padding_mask_mode, attn_mask_mode);
  auto [p, lse] = safe_softmax(s);
  return {at::matmul(p, v).contiguous(), lse.contiguous()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention_bwd(
    const at::Tensor& dout_in, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& layout, int64_t block, const OptTensor& rpe,
    const OptTensor& key_padding_mask, const OptTensor& attn_mask, std::optional<double> scale,
    bool causal, MaskMode key_padding_mask_mode, MaskMode attn_mask_mode) {
  const at::Tensor dout = packed_gradient(dout_in);
  const Blocks bl = blocks_of(layout, q.device());
  check_f64(v, "value");
  check_f64(dout, "dout");
  check_shape(v, q.sizes(), "value");
  check_shape(dout, q.sizes(), "dout");
  const double sc = evo_scale(scale, q.size(3));
  at::Tensor s = attention_scores(q, k, bl, layout, block, rpe, key_padding_mask, attn_mask, scale,
                                  causal, key_padding_mask_mode, attn_mask_mode);
  at::Tensor p = std::get<0>(safe_softmax(s));
  at::Tensor dp = at::matmul(dout, v.transpose(-1, -2));
  at::Tensor ds = p * (dp - (p * dp).sum(-1, /*keepdim=*/true));
  return {(at::matmul(ds, k) * sc).contiguous(),
          (at::matmul(ds.transpose(-1, -2), q) * sc).contiguous(),
          at::matmul(p.transpose(-1, -2), dout).contiguous()};
}

}  // namespace sciattn::torch_ext::fp64

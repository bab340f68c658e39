// The block-sparse reference (see block_sparse_reference.h). CPU layer.
// Written for clarity, not speed: every element is computed from its formula, a sparse operand
// is read through its logical matrix, and attention materialises each score row over all keys.
#include "cpu/block_sparse_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/workspace_layout.h"
#include "cpu/softmax_row.h"
#include "cpu/strided_access.h"

namespace sciattn::cpu {
namespace {

template <typename Acc>
constexpr Acc kInf = std::numeric_limits<Acc>::infinity();

int64_t off4(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

template <typename Acc>
Acc load(const TensorView& t, int64_t offset) {
  return static_cast<Acc>(load_as_float(t.data, t.dtype, offset));
}

// The position p of block (h, I, J), or -1 when the layout does not have it.
int64_t find_block(const BlockSparseIndex& ix, int64_t h, int64_t i_blk, int64_t j_blk) {
  const auto first = ix.col.begin() + ix.row_begin(h, i_blk);
  const auto last = ix.col.begin() + ix.row_end(h, i_blk);
  const auto it = std::lower_bound(first, last, j_blk);
  return it != last && *it == j_blk
             ? static_cast<int64_t>(it - ix.col.begin()) + ix.position_shift(h)
             : -1;
}

// op(t)[z, h, i, j] of a dense operand.
template <typename Acc>
Acc dense_at(const TensorView& t, bool trans, int64_t z, int64_t h, int64_t i, int64_t j) {
  return trans ? load<Acc>(t, off4(t, z, h, j, i)) : load<Acc>(t, off4(t, z, h, i, j));
}

// op(S)[z, h, i, j] of a sparse operand: its logical matrix, zero outside the layout.
template <typename Acc>
Acc sparse_at(const BlockSparseIndex& ix, const TensorView& s, bool trans, int64_t z, int64_t h,
              int64_t i, int64_t j) {
  if (trans) std::swap(i, j);
  const int64_t b = ix.block;
  const int64_t p = find_block(ix, h, i / b, j / b);
  return p < 0 ? Acc(0) : load<Acc>(s, off4(s, z, p, i % b, j % b));
}

// A mask value as the additive term it contributes (spec 2.3).
template <typename Acc>
Acc mask_term(const TensorView& m, MaskMode mode, int64_t offset) {
  const Acc v = load<Acc>(m, offset);
  if (m.dtype == DType::kBool) return v != 0 ? Acc(0) : -kInf<Acc>;
  if (mode == MaskMode::kMul) return v == 0 ? -kInf<Acc> : Acc(0);
  return v;
}

// v = x * scale + rpe + kpm + attn (and -inf where causal and j > i), for logical element
// (z, h, i, j).
template <typename Acc>
Acc add_terms(Acc x, Acc scale, const TensorView& rpe, const TensorView& kpm, MaskMode kpm_mode,
              const TensorView& attn, MaskMode attn_mode, bool causal, int64_t z, int64_t h,
              int64_t i, int64_t j) {
  Acc v = x * scale;
  if (rpe.present()) v += load<Acc>(rpe, off4(rpe, z, h, i, j));
  if (kpm.present()) v += mask_term<Acc>(kpm, kpm_mode, z * kpm.strides[0] + j * kpm.strides[1]);
  if (attn.present()) {
    v += mask_term<Acc>(attn, attn_mode, i * attn.strides[0] + j * attn.strides[1]);
  }
  if (causal && j > i) v = -kInf<Acc>;
  return v;
}

// In place: row becomes its softmax; returns the log-sum-exp. A row of all -inf becomes zeros
// with lse -inf: a fully masked row gives 0, not NaN; a row with a NaN score becomes NaN
// (softmax_row.h).
template <typename Acc>
Acc softmax_in_place(Acc* row, int64_t n) {
  const Acc max = softmax_row_max(row, n);
  if (max == -kInf<Acc>) {
    std::fill(row, row + n, Acc(0));
    return -kInf<Acc>;
  }
  Acc sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - max);
  for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - max) / sum;
  return max + std::log(sum);
}

}  // namespace

template <typename Acc>
void reference_matmul(const BlockSparseMatMulParams& p, Acc* c) {
  detail::MatMulShape s;
  detail::check_matmul(p, &s);
  const BlockSparseIndex& ix = *p.index;
  const int64_t b = ix.block;
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      for (int64_t z = 0; z < s.batch; ++z)
        for (int64_t q = 0; q < ix.nnz; ++q)
          for (int64_t r = 0; r < b; ++r)
            for (int64_t cc = 0; cc < b; ++cc) {
              const int64_t h = ix.block_head(q), i = ix.block_row(q) * b + r,
                            j = ix.block_col(q) * b + cc;
              Acc acc = 0;
              for (int64_t k = 0; k < s.k; ++k) {
                acc += dense_at<Acc>(p.a, p.trans_a, z, h, i, k) *
                       dense_at<Acc>(p.b, p.trans_b, z, h, k, j);
              }
              c[((z * ix.nnz + q) * b + r) * b + cc] = acc;
            }
      break;
    case BlockSparseMatMulMode::kDsd:
    case BlockSparseMatMulMode::kDds:
      for (int64_t z = 0; z < s.batch; ++z)
        for (int64_t h = 0; h < s.heads; ++h)
          for (int64_t i = 0; i < s.m; ++i)
            for (int64_t j = 0; j < s.n; ++j) {
              Acc acc = 0;
              for (int64_t k = 0; k < s.k; ++k) {
                if (p.mode == BlockSparseMatMulMode::kDsd) {
                  acc += sparse_at<Acc>(ix, p.a, p.trans_a, z, h, i, k) *
                         dense_at<Acc>(p.b, p.trans_b, z, h, k, j);
                } else {
                  acc += dense_at<Acc>(p.a, p.trans_a, z, h, i, k) *
                         sparse_at<Acc>(ix, p.b, p.trans_b, z, h, k, j);
                }
              }
              c[((z * s.heads + h) * s.m + i) * s.n + j] = acc;
            }
      break;
  }
}

namespace {

// The logical result gradient dC[z, h, i, j]: dense, or a sparse tensor read through its layout.
template <typename Acc>
Acc dc_at(const BlockSparseMatMulBackwardParams& p, int64_t z, int64_t h, int64_t i, int64_t j) {
  return p.mode == BlockSparseMatMulMode::kSdd ? sparse_at<Acc>(*p.index, p.dc, false, z, h, i, j)
                                               : dense_at<Acc>(p.dc, false, z, h, i, j);
}

template <typename Acc>
Acc op_a_at(const BlockSparseMatMulBackwardParams& p, int64_t z, int64_t h, int64_t i, int64_t k) {
  return p.mode == BlockSparseMatMulMode::kDsd
             ? sparse_at<Acc>(*p.index, p.a, p.trans_a, z, h, i, k)
             : dense_at<Acc>(p.a, p.trans_a, z, h, i, k);
}

template <typename Acc>
Acc op_b_at(const BlockSparseMatMulBackwardParams& p, int64_t z, int64_t h, int64_t k, int64_t j) {
  return p.mode == BlockSparseMatMulMode::kDds
             ? sparse_at<Acc>(*p.index, p.b, p.trans_b, z, h, k, j)
             : dense_at<Acc>(p.b, p.trans_b, z, h, k, j);
}

// Calls f(packed index, z, h, i, k) for every element of an operand stored as `t`, where (i, k)
// is the element's position in op(t)'s logical matrix.
template <typename F>
void for_each_operand_element(const BlockSparseIndex& ix, const TensorView& t, bool sparse,
                              bool trans, F&& f) {
  const int64_t b = ix.block;
  int64_t e = 0;
  if (sparse) {
    for (int64_t z = 0; z < t.sizes[0]; ++z)
      for (int64_t q = 0; q < ix.nnz; ++q)
        for (int64_t r = 0; r < b; ++r)
          for (int64_t c = 0; c < b; ++c) {
            int64_t i = ix.block_row(q) * b + r, k = ix.block_col(q) * b + c;
            if (trans) std::swap(i, k);
            f(e++, z, ix.block_head(q), i, k);
          }
    return;
  }
  for (int64_t z = 0; z < t.sizes[0]; ++z)
    for (int64_t h = 0; h < t.sizes[1]; ++h)
      for (int64_t u = 0; u < t.sizes[2]; ++u)
        for (int64_t v = 0; v < t.sizes[3]; ++v) f(e++, z, h, trans ? v : u, trans ? u : v);
}

}  // namespace

template <typename Acc>
void reference_matmul_backward(const BlockSparseMatMulBackwardParams& p, Acc* da, Acc* db) {
  detail::MatMulShape s;
  detail::check_matmul_backward(p, &s);
  const BlockSparseIndex& ix = *p.index;
  if (da != nullptr) {
    for_each_operand_element(ix, p.a, p.mode == BlockSparseMatMulMode::kDsd, p.trans_a,
                             [&](int64_t e, int64_t z, int64_t h, int64_t i, int64_t k) {
                               Acc acc = 0;
                               for (int64_t j = 0; j < s.n; ++j) {
                                 acc += dc_at<Acc>(p, z, h, i, j) * op_b_at<Acc>(p, z, h, k, j);
                               }
                               da[e] = acc;
                             });
  }
  if (db != nullptr) {
    for_each_operand_element(ix, p.b, p.mode == BlockSparseMatMulMode::kDds, p.trans_b,
                             [&](int64_t e, int64_t z, int64_t h, int64_t k, int64_t j) {
                               Acc acc = 0;
                               for (int64_t i = 0; i < s.m; ++i) {
                                 acc += op_a_at<Acc>(p, z, h, i, k) * dc_at<Acc>(p, z, h, i, j);
                               }
                               db[e] = acc;
                             });
  }
}

template <typename Acc>
void reference_softmax(const BlockSparseSoftmaxParams& p, Acc* y) {
  int64_t batch = 0;
  detail::check_softmax(p, &batch);
  const BlockSparseIndex& ix = *p.index;
  const int64_t b = ix.block;
  // One logical row (z, h, i) at a time: its entries are row r of every block of block row I.
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t h = 0; h < ix.num_heads; ++h)
      for (int64_t i = 0; i < ix.num_row_blocks * b; ++i) {
        // The row's blocks p: its stored range shifted to head h's blocks.
        const int64_t shift = ix.position_shift(h);
        const int64_t begin = ix.row_begin(h, i / b) + shift, end = ix.row_end(h, i / b) + shift;
        const int64_t r = i % b, n = (end - begin) * b;
        if (n == 0) continue;
        // The row's entries live in the output itself: row r of block q is at
        // row + (q - begin) * b * b. They hold the scores first, then the probabilities.
        Acc* row = y + ((z * ix.nnz + begin) * b + r) * b;
        Acc max = -kInf<Acc>;
        for (int64_t q = begin; q < end; ++q) {
          for (int64_t cc = 0; cc < b; ++cc) {
            const int64_t j = ix.block_col(q) * b + cc;
            const Acc x = load<Acc>(p.x, off4(p.x, z, q, r, cc));
            const Acc v = add_terms<Acc>(x, static_cast<Acc>(p.scale), p.rpe, p.key_padding_mask,
                                         p.key_padding_mask_mode, p.attn_mask, p.attn_mask_mode,
                                         p.causal, z, h, i, j);
            row[(q - begin) * b * b + cc] = v;
          }
          // The row's entries in this block are b apart from the next block's: one block at a
          // time, NaN kept (softmax_row.h).
          max = running_softmax_max(max, softmax_row_max(row + (q - begin) * b * b, b));
        }
        if (max == -kInf<Acc>) {
          for (int64_t q = begin; q < end; ++q)
            for (int64_t cc = 0; cc < b; ++cc) row[(q - begin) * b * b + cc] = 0;
          continue;
        }
        Acc sum = 0;
        for (int64_t q = begin; q < end; ++q)
          for (int64_t cc = 0; cc < b; ++cc) sum += std::exp(row[(q - begin) * b * b + cc] - max);
        for (int64_t q = begin; q < end; ++q)
          for (int64_t cc = 0; cc < b; ++cc) {
            Acc& e = row[(q - begin) * b * b + cc];
            e = std::exp(e - max) / sum;
          }
      }
}

template <typename Acc>
void reference_softmax_backward(const BlockSparseSoftmaxBackwardParams& p, Acc* dx) {
  int64_t batch = 0;
  detail::check_softmax_backward(p, &batch);
  const BlockSparseIndex& ix = *p.index;
  const int64_t b = ix.block;
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t h = 0; h < ix.num_heads; ++h)
      for (int64_t i = 0; i < ix.num_row_blocks * b; ++i) {
        const int64_t shift = ix.position_shift(h);
        const int64_t begin = ix.row_begin(h, i / b) + shift, end = ix.row_end(h, i / b) + shift;
        const int64_t r = i % b;
        Acc dot = 0;
        for (int64_t q = begin; q < end; ++q)
          for (int64_t cc = 0; cc < b; ++cc) {
            dot +=
                load<Acc>(p.y, off4(p.y, z, q, r, cc)) * load<Acc>(p.dy, off4(p.dy, z, q, r, cc));
          }
        for (int64_t q = begin; q < end; ++q)
          for (int64_t cc = 0; cc < b; ++cc) {
            const Acc yv = load<Acc>(p.y, off4(p.y, z, q, r, cc));
            const Acc gv = load<Acc>(p.dy, off4(p.dy, z, q, r, cc));
            dx[((z * ix.nnz + q) * b + r) * b + cc] = static_cast<Acc>(p.scale) * yv * (gv - dot);
          }
      }
}

namespace {

// The scores of query row i of (z, h) over every key j: excluded keys (outside the layout, or
// masked) are -inf. Shared by the reference forward and backward.
template <typename Acc>
void score_row(const BlockSparseIndex& ix, const TensorView& q, const TensorView& k,
               const TensorView& rpe, const TensorView& kpm, const TensorView& attn,
               const SparseAttentionOptions& o, Acc scale, const detail::AttentionShape& s,
               int64_t z, int64_t h, int64_t i, Acc* row) {
  for (int64_t j = 0; j < s.len; ++j) {
    if (find_block(ix, h, i / ix.block, j / ix.block) < 0) {
      row[j] = -kInf<Acc>;
      continue;
    }
    Acc dot = 0;
    for (int64_t d = 0; d < s.dim; ++d) {
      dot += load<Acc>(q, off4(q, z, h, i, d)) * load<Acc>(k, off4(k, z, h, j, d));
    }
    row[j] = add_terms<Acc>(dot, scale, rpe, kpm, o.key_padding_mask_mode, attn, o.attn_mask_mode,
                            o.causal, z, h, i, j);
  }
}

size_t packed(const detail::AttentionShape& s, int64_t z, int64_t h, int64_t i, int64_t d) {
  return static_cast<size_t>(((z * s.heads + h) * s.len + i) * s.dim + d);
}

}  // namespace

template <typename Acc>
void reference_attention_forward(const SparseAttentionForwardParams& p,
                                 const detail::AttentionShape& s, Acc* out, Acc* lse, Acc* row) {
  const Acc scale = static_cast<Acc>(detail::attention_scale(p.options, s.dim));
  for (int64_t z = 0; z < s.batch; ++z)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        score_row<Acc>(*p.index, p.q, p.k, p.rpe, p.key_padding_mask, p.attn_mask, p.options, scale,
                       s, z, h, i, row);
        lse[(z * s.heads + h) * s.len + i] = softmax_in_place(row, s.len);
        for (int64_t d = 0; d < s.dim; ++d) {
          Acc acc = 0;
          for (int64_t j = 0; j < s.len; ++j) {
            if (row[j] != 0) acc += row[j] * load<Acc>(p.v, off4(p.v, z, h, j, d));
          }
          out[packed(s, z, h, i, d)] = acc;
        }
      }
}

template <typename Acc>
void reference_attention_backward(const SparseAttentionBackwardParams& p,
                                  const detail::AttentionShape& s, Acc* dq, Acc* dk, Acc* dv,
                                  Acc* row, Acc* drow) {
  const Acc scale = static_cast<Acc>(detail::attention_scale(p.options, s.dim));
  const size_t n = static_cast<size_t>(s.batch * s.heads * s.len * s.dim);
  std::fill(dq, dq + n, Acc(0));
  std::fill(dk, dk + n, Acc(0));
  std::fill(dv, dv + n, Acc(0));
  for (int64_t z = 0; z < s.batch; ++z)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        score_row<Acc>(*p.index, p.q, p.k, p.rpe, p.key_padding_mask, p.attn_mask, p.options, scale,
                       s, z, h, i, row);
        softmax_in_place(row, s.len);  // row = P_i
        // dP_ij = <dO_i, V_j>;  D_i = sum_j P_ij dP_ij;  dS_ij = P_ij (dP_ij - D_i).
        Acc delta = 0;
        for (int64_t j = 0; j < s.len; ++j) {
          Acc acc = 0;
          if (row[j] != 0) {
            for (int64_t d = 0; d < s.dim; ++d) {
              acc += load<Acc>(p.dout, off4(p.dout, z, h, i, d)) *
                     load<Acc>(p.v, off4(p.v, z, h, j, d));
            }
          }
          drow[j] = acc;
          delta += row[j] * acc;
        }
        for (int64_t j = 0; j < s.len; ++j) {
          if (row[j] == 0) continue;
          const Acc ds = row[j] * (drow[j] - delta);
          for (int64_t d = 0; d < s.dim; ++d) {
            const Acc go = load<Acc>(p.dout, off4(p.dout, z, h, i, d));
            dq[packed(s, z, h, i, d)] += scale * ds * load<Acc>(p.k, off4(p.k, z, h, j, d));
            dk[packed(s, z, h, j, d)] += scale * ds * load<Acc>(p.q, off4(p.q, z, h, i, d));
            dv[packed(s, z, h, j, d)] += row[j] * go;
          }
        }
      }
}

// ---- the public kReference path ---------------------------------------------------------------

namespace {

struct ReferencePlan {
  detail::WorkspaceLayout layout;
  size_t a = 0, b = 0, c = 0, lse = 0, row = 0, drow = 0;
};

ReferencePlan plan_reference(const detail::AttentionShape& s, bool backward) {
  ReferencePlan r;
  const int64_t n = s.batch * s.heads * s.len * s.dim;
  r.a = r.layout.add<float>(n);
  if (backward) {
    r.b = r.layout.add<float>(n);
    r.c = r.layout.add<float>(n);
    r.drow = r.layout.add<float>(s.len);
  } else {
    r.lse = r.layout.add<float>(s.batch * s.heads * s.len);
  }
  r.row = r.layout.add<float>(s.len);
  return r;
}

// Rounds a packed [B, H, L, D] fp32 buffer into a [B, H, L, D] view.
void store_packed(const float* src, const detail::AttentionShape& s, const TensorView& dst) {
  for (int64_t z = 0; z < s.batch; ++z)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        store_row(dst, off4(dst, z, h, i, 0), dst.strides[3], s.dim, src + packed(s, z, h, i, 0));
      }
}

}  // namespace

size_t reference_forward_workspace_size(const detail::AttentionShape& s) {
  return plan_reference(s, false).layout.total_bytes();
}

size_t reference_backward_workspace_size(const detail::AttentionShape& s) {
  return plan_reference(s, true).layout.total_bytes();
}

void run_reference_forward(const SparseAttentionForwardParams& p, const detail::AttentionShape& s,
                           void* workspace) {
  const ReferencePlan r = plan_reference(s, false);
  float* out = r.layout.at<float>(workspace, r.a);
  float* lse = r.layout.at<float>(workspace, r.lse);
  reference_attention_forward<float>(p, s, out, lse, r.layout.at<float>(workspace, r.row));
  store_packed(out, s, p.out);
  if (p.lse.present()) {
    for (int64_t z = 0; z < s.batch; ++z)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.len; ++i) {
          static_cast<float*>(
              p.lse.data)[z * p.lse.strides[0] + h * p.lse.strides[1] + i * p.lse.strides[2]] =
              lse[(z * s.heads + h) * s.len + i];
        }
  }
}

void run_reference_backward(const SparseAttentionBackwardParams& p, const detail::AttentionShape& s,
                            void* workspace) {
  const ReferencePlan r = plan_reference(s, true);
  float* dq = r.layout.at<float>(workspace, r.a);
  float* dk = r.layout.at<float>(workspace, r.b);
  float* dv = r.layout.at<float>(workspace, r.c);
  reference_attention_backward<float>(p, s, dq, dk, dv, r.layout.at<float>(workspace, r.row),
                                      r.layout.at<float>(workspace, r.drow));
  store_packed(dq, s, p.dq);
  store_packed(dk, s, p.dk);
  store_packed(dv, s, p.dv);
}

template void reference_matmul<float>(const BlockSparseMatMulParams&, float*);
template void reference_matmul<double>(const BlockSparseMatMulParams&, double*);
template void reference_matmul_backward<float>(const BlockSparseMatMulBackwardParams&, float*,
                                               float*);
template void reference_matmul_backward<double>(const BlockSparseMatMulBackwardParams&, double*,
                                                double*);
template void reference_softmax<float>(const BlockSparseSoftmaxParams&, float*);
template void reference_softmax<double>(const BlockSparseSoftmaxParams&, double*);
template void reference_softmax_backward<float>(const BlockSparseSoftmaxBackwardParams&, float*);
template void reference_softmax_backward<double>(const BlockSparseSoftmaxBackwardParams&, double*);
template void reference_attention_forward<float>(const SparseAttentionForwardParams&,
                                                 const detail::AttentionShape&, float*, float*,
                                                 float*);
template void reference_attention_forward<double>(const SparseAttentionForwardParams&,
                                                  const detail::AttentionShape&, double*, double*,
                                                  double*);
template void reference_attention_backward<float>(const SparseAttentionBackwardParams&,
                                                  const detail::AttentionShape&, float*, float*,
                                                  float*, float*, float*);
template void reference_attention_backward<double>(const SparseAttentionBackwardParams&,
                                                   const detail::AttentionShape&, double*, double*,
                                                   double*, double*, double*);

}  // namespace sciattn::cpu

// Shared helpers of the block-sparse op suites, CPU (tests/cpu) and GPU (tests/cuda) alike: random
// layouts and masks, an independent fp64 oracle (dense math with the layout applied as a mask,
// written from spec section 2 and sharing no code with the library) for MatMul, Softmax and
// sparse attention, conversions between stored and logical values, and library runners.
// Test layer. Tensors, seeds and the tolerance rule come from evoformer_test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "evoformer_test_util.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::bstest {

using test::error_stats;
using test::HostTensor;
using test::kBaseSeed;
using test::kInf;
using test::seed_note;
using test::within_tolerance;

using Vec = std::vector<double>;

// ---- layouts ------------------------------------------------------------------------------------

// A random [H, R, C] layout, each block set with probability `density`. With `empty_row` block
// row 0 of head 0 is cleared (the "empty block row" of spec 2.3) and with `empty_col` block
// column C-1 of the last head is cleared (a key block no query sees).
inline Layout random_layout(int64_t H, int64_t R, int64_t C, double density, std::mt19937_64& rng,
                            bool empty_row = false, bool empty_col = false) {
  Layout layout = Layout::zeros(H, R, C);
  std::bernoulli_distribution set(density);
  for (auto& v : layout.blocks) v = set(rng) ? 1 : 0;
  if (empty_row) {
    for (int64_t c = 0; c < C; ++c) layout.at(0, 0, c) = 0;
  }
  if (empty_col) {
    for (int64_t r = 0; r < R; ++r) layout.at(H - 1, r, C - 1) = 0;
  }
  // Keep at least one block so that the sparse tensors are not empty.
  if (layout_nnz(layout) == 0) layout.at(0, R - 1, 0) = 1;
  return layout;
}

// The op suites' layout of a case: `layout` itself, or, for every third seed, head 0's blocks
// copied to every head, so that the index stores one head (BlockSparseIndex::layout_heads = 1)
// and the ops map head h's stored positions to its own blocks (the configs' default,
// different_layout_per_head = false).
inline Layout maybe_shared_heads(Layout layout, uint64_t seed) {
  if (seed % 3 != 1) return layout;
  for (int64_t h = 1; h < layout.num_heads; ++h)
    for (int64_t r = 0; r < layout.num_row_blocks; ++r)
      for (int64_t c = 0; c < layout.num_col_blocks; ++c) layout.at(h, r, c) = layout.at(0, r, c);
  if (layout_nnz(layout) == 0) layout.at(0, layout.num_row_blocks - 1, 0) = 1;
  return layout;
}

inline BlockSparseIndex make_index(const Layout& layout, int64_t block) {
  BlockSparseIndex ix;
  const Status s = build_block_sparse_index(layout, block, &ix);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return ix;
}

// The nonzero blocks (h, I, J) in layout.nonzero() order, enumerated here independently.
struct Block {
  int64_t h, r, c;
};
inline std::vector<Block> nonzero_blocks(const Layout& layout) {
  std::vector<Block> out;
  for (int64_t h = 0; h < layout.num_heads; ++h)
    for (int64_t r = 0; r < layout.num_row_blocks; ++r)
      for (int64_t c = 0; c < layout.num_col_blocks; ++c)
        if (layout.at(h, r, c)) out.push_back({h, r, c});
  return out;
}

// ---- logical <-> stored values ------------------------------------------------------------------

// A dense logical array [Z, H, R, C] with accessors.
struct Dense4 {
  int64_t Z = 0, H = 0, R = 0, C = 0;
  Vec v;
  Dense4() = default;
  Dense4(int64_t z, int64_t h, int64_t r, int64_t c)
      : Z(z), H(h), R(r), C(c), v(static_cast<size_t>(z * h * r * c), 0.0) {}
  double& at(int64_t z, int64_t h, int64_t r, int64_t c) {
    return v[static_cast<size_t>(((z * H + h) * R + r) * C + c)];
  }
  double at(int64_t z, int64_t h, int64_t r, int64_t c) const {
    return v[static_cast<size_t>(((z * H + h) * R + r) * C + c)];
  }
  Dense4 transposed() const {
    Dense4 t(Z, H, C, R);
    for (int64_t z = 0; z < Z; ++z)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c) t.at(z, h, c, r) = at(z, h, r, c);
    return t;
  }
};

// op(t) of a stored dense [Z, H, ., .] tensor.
inline Dense4 dense_op(const HostTensor& t, bool trans) {
  const auto& s = t.sizes();
  Dense4 d(s[0], s[1], s[2], s[3]);
  d.v = t.values();
  return trans ? d.transposed() : d;
}

// The logical [Z, H, R*b, C*b] matrix of a stored sparse [Z, nnz, b, b] tensor (zero outside).
inline Dense4 sparse_logical(const HostTensor& t, const Layout& layout, int64_t b) {
  const std::vector<Block> blocks = nonzero_blocks(layout);
  const int64_t Z = t.sizes()[0];
  Dense4 d(Z, layout.num_heads, layout.num_row_blocks * b, layout.num_col_blocks * b);
  const Vec vals = t.values();
  for (int64_t z = 0; z < Z; ++z)
    for (size_t p = 0; p < blocks.size(); ++p)
      for (int64_t r = 0; r < b; ++r)
        for (int64_t c = 0; c < b; ++c) {
          d.at(z, blocks[p].h, blocks[p].r * b + r, blocks[p].c * b + c) =
              vals[((z * static_cast<int64_t>(blocks.size()) + static_cast<int64_t>(p)) * b + r) *
                       b +
                   c];
        }
  return d;
}

// The stored [Z, nnz, b, b] values of a logical matrix on the layout's blocks.
inline Vec sparse_blocks(const Dense4& d, const Layout& layout, int64_t b) {
  const std::vector<Block> blocks = nonzero_blocks(layout);
  Vec out;
  for (int64_t z = 0; z < d.Z; ++z)
    for (const Block& blk : blocks)
      for (int64_t r = 0; r < b; ++r)
        for (int64_t c = 0; c < b; ++c) out.push_back(d.at(z, blk.h, blk.r * b + r, blk.c * b + c));
  return out;
}

inline Dense4 matmul(const Dense4& a, const Dense4& b) {
  Dense4 c(a.Z, a.H, a.R, b.C);
  for (int64_t z = 0; z < a.Z; ++z)
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t i = 0; i < a.R; ++i)
        for (int64_t k = 0; k < a.C; ++k) {
          const double x = a.at(z, h, i, k);
          if (x == 0.0) continue;
          for (int64_t j = 0; j < b.C; ++j) c.at(z, h, i, j) += x * b.at(z, h, k, j);
        }
  return c;
}

inline Vec rounded(const Vec& x, DType t) {
  Vec r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = round_to(t, static_cast<float>(x[i]));
  return r;
}

// ---- masks --------------------------------------------------------------------------------------

// The additive term of a mask value (spec 2.3): a bool is 0 (true) or -inf (false); in kAdd
// mode a float is added; in kMul mode 0 removes (-inf) and anything else keeps (0).
inline double mask_term(double v, DType dtype, MaskMode mode) {
  if (dtype == DType::kBool) return v != 0.0 ? 0.0 : -kInf;
  if (mode == MaskMode::kMul) return v == 0.0 ? -kInf : 0.0;
  return v;
}

inline Vec mask_terms(const HostTensor& m, MaskMode mode) {
  Vec v = m.values();
  for (double& x : v) x = mask_term(x, m.dtype(), mode);
  return v;
}

// Random mask values: a fraction `removed` of the entries remove their key, the rest keep it, in
// the mask's own terms (bool: false / true; kAdd: -inf / a small random bias; kMul: 0 / a
// random non-zero value).
inline void fill_mask(HostTensor& m, MaskMode mode, double removed, std::mt19937_64& rng) {
  std::bernoulli_distribution drop(removed);
  std::uniform_real_distribution<double> small(-0.5, 0.5), nonzero(0.5, 2.0);
  for (int64_t i = 0; i < m.numel(); ++i) {
    const bool d = drop(rng);
    if (m.dtype() == DType::kBool) {
      m.set(i, d ? 0.0 : 1.0);
    } else if (mode == MaskMode::kAdd) {
      m.set(i, d ? -kInf : small(rng));
    } else {
      m.set(i, d ? 0.0 : nonzero(rng));
    }
  }
}

// The mask kinds the suites draw: none, a float mask in each mode, a boolean mask.
enum class MaskKind { kNone, kAdd, kMul, kBool };

inline const char* mask_name(MaskKind k) {
  static const char* names[] = {"none", "add", "mul", "bool"};
  return names[static_cast<int>(k)];
}

// The mode a mask of kind k is passed with (a boolean mask reads the same in either).
inline MaskMode mode_of(MaskKind k) {
  return k == MaskKind::kMul ? MaskMode::kMul : MaskMode::kAdd;
}

// A random mask of kind k (absent for kNone): bool, or `dtype` for the float kinds, packed or as
// a padded (strided) view, a fraction `removed` of its entries removing their key (fill_mask).
inline HostTensor make_mask(MaskKind k, DType dtype, const std::vector<int64_t>& sizes,
                            double removed, std::mt19937_64& rng, bool strided = false) {
  if (k == MaskKind::kNone) return HostTensor();
  const DType dt = k == MaskKind::kBool ? DType::kBool : dtype;
  HostTensor m =
      strided ? test::make_tensor(dt, sizes, test::Layout::kPadded) : HostTensor::packed(dt, sizes);
  fill_mask(m, mode_of(k), removed, rng);
  return m;
}

// ---- the fp64 MatMul oracle ---------------------------------------------------------------------

// op(X) of an operand as a logical dense matrix: a dense operand as stored (transposed with
// `trans`), a sparse one [Z, nnz, b, b] as the logical matrix of its layout blocks.
inline Dense4 logical_operand(const HostTensor& t, bool sparse, bool trans, const Layout& layout,
                              int64_t block) {
  if (!sparse) return dense_op(t, trans);
  const Dense4 d = sparse_logical(t, layout, block);
  return trans ? d.transposed() : d;
}

// A logical gradient of op(X), back in X's stored shape.
inline Vec stored_gradient(const Dense4& d_op, bool sparse, bool trans, const Layout& layout,
                           int64_t block) {
  const Dense4 d = trans ? d_op.transposed() : d_op;
  return sparse ? sparse_blocks(d, layout, block) : d.v;
}

struct MatMulOracle {
  Vec c, da, db;  // in the stored shapes of c, a and b
};

// C = op(A) op(B), and from dC the gradients of A and B, of a suite's MatMul problem `p`: its
// layout and tensors (p.layout, p.a, p.b, p.dc), which of them are sparse (p.a_sparse,
// p.b_sparse, p.c_sparse), and its case's block and transposes (p.c.block, p.c.ta, p.c.tb).
template <class Problem>
MatMulOracle matmul_oracle(const Problem& p) {
  const Layout& layout = p.layout;
  const int64_t b = p.c.block;
  MatMulOracle o;
  const Dense4 op_a = logical_operand(p.a, p.a_sparse, p.c.ta, layout, b);
  const Dense4 op_b = logical_operand(p.b, p.b_sparse, p.c.tb, layout, b);
  const Dense4 c = matmul(op_a, op_b);
  o.c = p.c_sparse ? sparse_blocks(c, layout, b) : c.v;
  const Dense4 dc = p.c_sparse ? sparse_logical(p.dc, layout, b) : dense_op(p.dc, false);
  o.da = stored_gradient(matmul(dc, op_b.transposed()), p.a_sparse, p.c.ta, layout, b);
  o.db = stored_gradient(matmul(op_a.transposed(), dc), p.b_sparse, p.c.tb, layout, b);
  return o;
}

// ---- the fp64 softmax oracle --------------------------------------------------------------------

struct SoftmaxProblem {
  const Layout* layout = nullptr;
  int64_t b = 16, Z = 1;
  double scale = 1.0;
  Dense4 x;    // logical [Z, H, R*b, C*b] (values outside the layout unused)
  Dense4 rpe;  // empty (Z == 0) or [Z, H, R*b, C*b]
  Vec kpm;     // empty or additive [Z, C*b]
  Vec attn;    // empty or additive [R*b, C*b]
  bool causal = false;
};

// y on the layout (logical, zero elsewhere): per row, v = x*scale + rpe + kpm + attn over the
// row's layout entries (-inf where causal and j > i), softmax, fully masked rows 0.
inline Dense4 softmax_oracle(const SoftmaxProblem& p) {
  const Layout& L = *p.layout;
  const int64_t rows = L.num_row_blocks * p.b, cols = L.num_col_blocks * p.b;
  Dense4 y(p.Z, L.num_heads, rows, cols);
  Vec v(static_cast<size_t>(cols));
  for (int64_t z = 0; z < p.Z; ++z)
    for (int64_t h = 0; h < L.num_heads; ++h)
      for (int64_t i = 0; i < rows; ++i) {
        double m = -kInf;
        bool any = false;
        for (int64_t j = 0; j < cols; ++j) {
          double& e = v[static_cast<size_t>(j)];
          if (!L.at(h, i / p.b, j / p.b)) {
            e = -kInf;
            continue;
          }
          any = true;
          e = p.x.at(z, h, i, j) * p.scale;
          if (p.rpe.Z) e += p.rpe.at(z, h, i, j);
          if (!p.kpm.empty()) e += p.kpm[static_cast<size_t>(z * cols + j)];
          if (!p.attn.empty()) e += p.attn[static_cast<size_t>(i * cols + j)];
          if (p.causal && j > i) e = -kInf;
          m = std::max(m, e);
        }
        if (!any || m == -kInf) continue;  // zeros
        double sum = 0.0;
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(v[static_cast<size_t>(j)] - m);
        for (int64_t j = 0; j < cols; ++j)
          y.at(z, h, i, j) = std::exp(v[static_cast<size_t>(j)] - m) / sum;
      }
  return y;
}

// dx = scale * y * (dy - sum_row y * dy) on the layout.
inline Dense4 softmax_backward_oracle(const Layout& L, int64_t b, double scale, const Dense4& y,
                                      const Dense4& dy) {
  Dense4 dx(y.Z, y.H, y.R, y.C);
  for (int64_t z = 0; z < y.Z; ++z)
    for (int64_t h = 0; h < y.H; ++h)
      for (int64_t i = 0; i < y.R; ++i) {
        double dot = 0.0;
        for (int64_t j = 0; j < y.C; ++j) {
          if (L.at(h, i / b, j / b)) dot += y.at(z, h, i, j) * dy.at(z, h, i, j);
        }
        for (int64_t j = 0; j < y.C; ++j) {
          if (L.at(h, i / b, j / b)) {
            dx.at(z, h, i, j) = scale * y.at(z, h, i, j) * (dy.at(z, h, i, j) - dot);
          }
        }
      }
  return dx;
}

// The oracle problem of a suite's Softmax problem `p`: its layout and tensors (p.layout, p.x,
// p.rpe, p.kpm, p.attn; absent ones not present()) and its case (p.c.block, p.c.Z, p.c.scale,
// p.c.kpm and p.c.attn as MaskKinds, p.c.causal).
template <class Problem>
SoftmaxProblem softmax_oracle_problem(const Problem& p) {
  SoftmaxProblem o;
  o.layout = &p.layout;
  o.b = p.c.block;
  o.Z = p.c.Z;
  o.scale = p.c.scale;
  o.x = sparse_logical(p.x, p.layout, p.c.block);
  if (p.rpe.present()) o.rpe = dense_op(p.rpe, false);
  if (p.kpm.present()) o.kpm = mask_terms(p.kpm, mode_of(p.c.kpm));
  if (p.attn.present()) o.attn = mask_terms(p.attn, mode_of(p.c.attn));
  o.causal = p.c.causal;
  return o;
}

// ---- the fp64 attention oracle ------------------------------------------------------------------

struct AttnProblem {
  const Layout* layout = nullptr;
  int64_t b = 16, B = 1, H = 1, L = 16, D = 8;
  double scale = 1.0;
  Dense4 q, k, v;  // [B, H, L, D]
  Dense4 rpe;      // empty or [B, H, L, L]
  Vec kpm;         // empty or additive [B, L]
  Vec attn;        // empty or additive [L, L]
  bool causal = false;

  // The score s_ij, -inf when (i, j) is outside the layout or masked.
  double score(int64_t z, int64_t h, int64_t i, int64_t j) const {
    if (!layout->at(h, i / b, j / b)) return -kInf;
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += q.at(z, h, i, d) * k.at(z, h, j, d);
    double s = scale * dot;
    if (rpe.Z) s += rpe.at(z, h, i, j);
    if (!kpm.empty()) s += kpm[static_cast<size_t>(z * L + j)];
    if (!attn.empty()) s += attn[static_cast<size_t>(i * L + j)];
    if (causal && j > i) s = -kInf;
    return s;
  }
  // Calls fn(j) for the key columns of row i of head h that its layout blocks hold, ascending;
  // every other column has score -inf (probability 0), so the rows below skip them: the sums are
  // the same (adding exact zeros), and a 65,536-token layout costs its nonzeros, not L^2.
  template <class Fn>
  void for_each_layout_column(int64_t h, int64_t i, Fn fn) const {
    for (int64_t c = 0; c < layout->num_col_blocks; ++c) {
      if (!layout->at(h, i / b, c)) continue;
      for (int64_t j = c * b; j < std::min(L, c * b + b); ++j) fn(j);
    }
  }
  // Softmax row i over its layout columns (cols, ascending, and p); returns the lse (-inf and
  // all-zero probabilities for a fully masked row).
  double probs(int64_t z, int64_t h, int64_t i, std::vector<int64_t>& cols, Vec& p) const {
    cols.clear();
    p.clear();
    double m = -kInf;
    for_each_layout_column(h, i, [&](int64_t j) {
      cols.push_back(j);
      p.push_back(score(z, h, i, j));
      m = std::max(m, p.back());
    });
    if (m == -kInf) {
      std::fill(p.begin(), p.end(), 0.0);
      return -kInf;
    }
    double sum = 0.0;
    for (double x : p) sum += std::exp(x - m);
    const double lse = m + std::log(sum);
    for (double& x : p) x = std::exp(x - lse);
    return lse;
  }
};

// The oracle problem of one sparse attention call on host tensors: q, k, v [B, H, L, D] (any
// views), rpe, key padding mask and attention mask left out when not present(); the scale as the
// library holds it, a float: `scale` when given, else 1/sqrt(D) rounded to fp32.
inline AttnProblem attention_problem(const Layout& layout, int64_t block, const HostTensor& q,
                                     const HostTensor& k, const HostTensor& v,
                                     const HostTensor& rpe, const HostTensor& kpm,
                                     MaskMode kpm_mode, const HostTensor& attn, MaskMode attn_mode,
                                     bool causal, std::optional<float> scale = std::nullopt) {
  AttnProblem a;
  a.layout = &layout;
  a.b = block;
  const TensorView qv = q.view();
  a.B = qv.sizes[0];
  a.H = qv.sizes[1];
  a.L = qv.sizes[2];
  a.D = qv.sizes[3];
  a.scale = static_cast<double>(
      scale ? *scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.D))));
  a.q = dense_op(q, false);
  a.k = dense_op(k, false);
  a.v = dense_op(v, false);
  if (rpe.present()) a.rpe = dense_op(rpe, false);
  if (kpm.present()) a.kpm = mask_terms(kpm, kpm_mode);
  if (attn.present()) a.attn = mask_terms(attn, attn_mode);
  a.causal = causal;
  return a;
}

// The oracle problem of a suite's sparse attention problem `p`: its layout and tensors (p.layout,
// p.q, p.k, p.v, p.rpe, p.kpm, p.attn) and its case (p.c.block, p.c.kpm and p.c.attn as
// MaskKinds, p.c.causal, p.c.scale).
template <class Problem>
AttnProblem attention_oracle_problem(const Problem& p) {
  return attention_problem(p.layout, p.c.block, p.q, p.k, p.v, p.rpe, p.kpm, mode_of(p.c.kpm),
                           p.attn, mode_of(p.c.attn), p.c.causal, p.c.scale);
}

// The layouts of the attention suites' small cases: random (with an empty block row and column),
// DeepSpeed's BigBird with a layout per head, and unidirectional Fixed (block-causal).
enum class AttnLayoutKind { kRandom, kBigBird, kFixedUni };

inline Layout attention_case_layout(AttnLayoutKind kind, int64_t H, int64_t N, int64_t block,
                                    uint64_t seed, std::mt19937_64& rng) {
  Layout layout;
  switch (kind) {
    case AttnLayoutKind::kRandom:
      return random_layout(H, N, N, 0.5, rng, /*empty_row=*/true, /*empty_col=*/true);
    case AttnLayoutKind::kBigBird: {
      BigBirdSparsityConfig cfg;
      cfg.num_heads = H;
      cfg.block = block;
      cfg.different_layout_per_head = true;
      cfg.seed = seed;
      EXPECT_TRUE(make_layout(cfg, N * block, &layout).ok());
      return layout;
    }
    case AttnLayoutKind::kFixedUni: {
      FixedSparsityConfig cfg;
      cfg.num_heads = H;
      cfg.block = block;
      cfg.num_local_blocks = 2;
      cfg.attention = AttentionDirection::kUnidirectional;
      EXPECT_TRUE(make_layout(cfg, N * block, &layout).ok());
      return layout;
    }
  }
  return layout;
}

struct AttnForward {
  Dense4 out;  // [B, H, L, D]
  Vec lse;     // [B, H, L]
};

inline AttnForward attention_oracle(const AttnProblem& a) {
  AttnForward f{Dense4(a.B, a.H, a.L, a.D), Vec(static_cast<size_t>(a.B * a.H * a.L))};
  std::vector<int64_t> cols;
  Vec p;
  for (int64_t z = 0; z < a.B; ++z)
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t i = 0; i < a.L; ++i) {
        f.lse[static_cast<size_t>((z * a.H + h) * a.L + i)] = a.probs(z, h, i, cols, p);
        for (size_t e = 0; e < cols.size(); ++e) {
          const double pj = p[e];
          if (pj == 0.0) continue;
          for (int64_t d = 0; d < a.D; ++d) f.out.at(z, h, i, d) += pj * a.v.at(z, h, cols[e], d);
        }
      }
  return f;
}

struct AttnGrads {
  Dense4 dq, dk, dv;
};

// Gradients of sum(dout * out): dP_ij = <dO_i, V_j>, dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik),
// dQ_i = scale sum_j dS_ij K_j, dK_j = scale sum_i dS_ij Q_i, dV_j = sum_i P_ij dO_i.
inline AttnGrads attention_backward_oracle(const AttnProblem& a, const Dense4& dout) {
  AttnGrads g{Dense4(a.B, a.H, a.L, a.D), Dense4(a.B, a.H, a.L, a.D), Dense4(a.B, a.H, a.L, a.D)};
  std::vector<int64_t> cols;
  Vec p, dp;
  for (int64_t z = 0; z < a.B; ++z)
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t i = 0; i < a.L; ++i) {
        a.probs(z, h, i, cols, p);
        dp.assign(cols.size(), 0.0);
        double delta = 0.0;
        for (size_t e = 0; e < cols.size(); ++e) {
          double acc = 0.0;
          for (int64_t d = 0; d < a.D; ++d) acc += dout.at(z, h, i, d) * a.v.at(z, h, cols[e], d);
          dp[e] = acc;
          delta += p[e] * acc;
        }
        for (size_t e = 0; e < cols.size(); ++e) {
          const double pj = p[e];
          if (pj == 0.0) continue;
          const int64_t j = cols[e];
          const double ds = pj * (dp[e] - delta);
          for (int64_t d = 0; d < a.D; ++d) {
            g.dq.at(z, h, i, d) += a.scale * ds * a.k.at(z, h, j, d);
            g.dk.at(z, h, j, d) += a.scale * ds * a.q.at(z, h, i, d);
            g.dv.at(z, h, j, d) += pj * dout.at(z, h, i, d);
          }
        }
      }
  return g;
}

// ---- library runs -------------------------------------------------------------------------------

// Runs any op with a workspace of exactly workspace_size(p) bytes, starting one byte past an
// aligned address when `misalign` is set (the library accepts any alignment).
template <class Params>
inline Status run_op(const Params& p, bool misalign = false, size_t* bytes_out = nullptr) {
  const size_t bytes = workspace_size(p);
  if (bytes_out) *bytes_out = bytes;
  std::vector<std::byte> ws(bytes + (misalign ? 1 : 0));
  void* ptr = ws.empty() ? nullptr : ws.data() + (misalign ? 1 : 0);
  return run(p, ptr, bytes);
}

// True when `name` occurs in `message` as a whole word.
inline bool mentions(const std::string& message, const std::string& name) {
  auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t pos = message.find(name); pos != std::string::npos;
       pos = message.find(name, pos + 1)) {
    const bool left_ok = pos == 0 || !is_word(message[pos - 1]);
    const size_t end = pos + name.size();
    const bool right_ok = end >= message.size() || !is_word(message[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

inline std::vector<int64_t> dims(std::initializer_list<int64_t> d) {
  return d;
}

}  // namespace sciattn::bstest

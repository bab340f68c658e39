// The Evoformer attention reference (see evoformer_reference.h). CPU layer.
// Written for clarity, not speed: every score matrix is materialised, loops follow the formula.
#include "cpu/evoformer_reference.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/workspace_layout.h"
#include "cpu/softmax_row.h"
#include "cpu/strided_access.h"

namespace sciattn::cpu {
namespace {

// Index helpers for the packed Acc buffers.
struct Packed {
  int64_t B, N, L, H, D;
  int64_t qkv(int64_t b, int64_t n, int64_t i, int64_t h, int64_t d) const {
    return (((b * N + n) * L + i) * H + h) * D + d;
  }
  int64_t score(int64_t b, int64_t n, int64_t h, int64_t i, int64_t j) const {
    return (((b * N + n) * H + h) * L + i) * L + j;
  }
  int64_t row(int64_t b, int64_t n, int64_t h, int64_t i) const {
    return ((b * N + n) * H + h) * L + i;
  }
};

Packed packed(const detail::EvoformerShape& s) {
  return {s.batch, s.n, s.len, s.heads, s.dim};
}

// scale * <q_i, k_j> + bias1 + bias2 for every (b, n, h, i, j), in Acc.
template <typename Acc>
void compute_scores(const TensorView& q, const TensorView& k, const TensorView& bias1,
                    const TensorView& bias2, const EvoformerOptions& options,
                    const detail::EvoformerShape& s, Acc* scores) {
  const Packed x = packed(s);
  const Acc scale = static_cast<Acc>(detail::evoformer_scale(options, s.dim));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.len; ++i)
          for (int64_t j = 0; j < s.len; ++j) {
            Acc dot = 0;
            for (int64_t d = 0; d < s.dim; ++d) {
              dot += static_cast<Acc>(load_as_float(q.data, q.dtype, offset5(q, b, n, i, h, d))) *
                     static_cast<Acc>(load_as_float(k.data, k.dtype, offset5(k, b, n, j, h, d)));
            }
            Acc value = scale * dot;
            if (bias1.present()) value += bias_value(bias1, offset5(bias1, b, n, 0, 0, j));
            if (bias2.present()) value += bias_value(bias2, offset5(bias2, b, 0, h, i, j));
            scores[x.score(b, n, h, i, j)] = value;
          }
}

// In place: each score row becomes its softmax; lse (if given) gets log(sum exp). A row of all
// -inf becomes zeros with lse -inf, which is what makes fully masked rows give 0, not NaN; a row
// with a NaN score becomes NaN (softmax_row.h).
template <typename Acc>
void softmax_rows(const detail::EvoformerShape& s, Acc* scores, Acc* lse) {
  const int64_t rows = s.batch * s.n * s.heads * s.len;
  for (int64_t r = 0; r < rows; ++r) {
    Acc* row = scores + r * s.len;
    const Acc max = softmax_row_max(row, s.len);
    if (max == -std::numeric_limits<Acc>::infinity()) {
      for (int64_t j = 0; j < s.len; ++j) row[j] = 0;
      if (lse) lse[r] = -std::numeric_limits<Acc>::infinity();
      continue;
    }
    Acc sum = 0;
    for (int64_t j = 0; j < s.len; ++j) sum += std::exp(row[j] - max);
    for (int64_t j = 0; j < s.len; ++j) row[j] = std::exp(row[j] - max) / sum;
    if (lse) lse[r] = max + std::log(sum);
  }
}

}  // namespace

template <typename Acc>
void reference_forward(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                       Acc* scores, Acc* out, Acc* lse) {
  const Packed x = packed(s);
  compute_scores(p.q, p.k, p.bias1, p.bias2, p.options, s, scores);
  softmax_rows(s, scores, lse);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.len; ++i)
        for (int64_t h = 0; h < s.heads; ++h)
          for (int64_t d = 0; d < s.dim; ++d) {
            Acc acc = 0;
            for (int64_t j = 0; j < s.len; ++j) {
              acc +=
                  scores[x.score(b, n, h, i, j)] *
                  static_cast<Acc>(load_as_float(p.v.data, p.v.dtype, offset5(p.v, b, n, j, h, d)));
            }
            out[x.qkv(b, n, i, h, d)] = acc;
          }
}

template <typename Acc>
void reference_backward(const EvoformerBackwardParams& p, const detail::EvoformerShape& s,
                        Acc* probs, Acc* dscores, Acc* dq, Acc* dk, Acc* dv, Acc* dbias1,
                        Acc* dbias2) {
  const Packed x = packed(s);
  const Acc scale = static_cast<Acc>(detail::evoformer_scale(p.options, s.dim));
  auto in = [](const TensorView& t, int64_t b, int64_t n, int64_t i, int64_t h, int64_t d) {
    return static_cast<Acc>(load_as_float(t.data, t.dtype, offset5(t, b, n, i, h, d)));
  };
  compute_scores(p.q, p.k, p.bias1, p.bias2, p.options, s, probs);
  softmax_rows<Acc>(s, probs, nullptr);

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.len; ++i) {
          // dP_ij = <dO_i, V_j> is stored in the dS row first, then turned in place into
          // dS_ij = P_ij * (dP_ij - sum_k P_ik dP_ik).
          Acc* ds = dscores + x.score(b, n, h, i, 0);
          const Acc* prob = probs + x.score(b, n, h, i, 0);
          Acc row_dot = 0;
          for (int64_t j = 0; j < s.len; ++j) {
            Acc acc = 0;
            for (int64_t d = 0; d < s.dim; ++d)
              acc += in(p.dout, b, n, i, h, d) * in(p.v, b, n, j, h, d);
            ds[j] = acc;
            row_dot += prob[j] * acc;
          }
          for (int64_t j = 0; j < s.len; ++j) ds[j] = prob[j] * (ds[j] - row_dot);
        }

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.len; ++i)
          for (int64_t d = 0; d < s.dim; ++d) {
            Acc gq = 0, gk = 0, gv = 0;
            for (int64_t j = 0; j < s.len; ++j) {
              gq += dscores[x.score(b, n, h, i, j)] * in(p.k, b, n, j, h, d);
              gk += dscores[x.score(b, n, h, j, i)] * in(p.q, b, n, j, h, d);
              gv += probs[x.score(b, n, h, j, i)] * in(p.dout, b, n, j, h, d);
            }
            dq[x.qkv(b, n, i, h, d)] = scale * gq;
            dk[x.qkv(b, n, i, h, d)] = scale * gk;
            dv[x.qkv(b, n, i, h, d)] = gv;
          }

  // dbias1[b, n, j] = sum over h, i of dS; dbias2[b, h, i, j] = sum over n of dS.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t j = 0; j < s.len; ++j) {
        Acc acc = 0;
        for (int64_t h = 0; h < s.heads; ++h)
          for (int64_t i = 0; i < s.len; ++i) acc += dscores[x.score(b, n, h, i, j)];
        dbias1[(b * s.n + n) * s.len + j] = acc;
      }
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i)
        for (int64_t j = 0; j < s.len; ++j) {
          Acc acc = 0;
          for (int64_t n = 0; n < s.n; ++n) acc += dscores[x.score(b, n, h, i, j)];
          dbias2[((b * s.heads + h) * s.len + i) * s.len + j] = acc;
        }
}

template void reference_forward<float>(const EvoformerForwardParams&, const detail::EvoformerShape&,
                                       float*, float*, float*);
template void reference_forward<double>(const EvoformerForwardParams&,
                                        const detail::EvoformerShape&, double*, double*, double*);
template void reference_backward<float>(const EvoformerBackwardParams&,
                                        const detail::EvoformerShape&, float*, float*, float*,
                                        float*, float*, float*, float*);
template void reference_backward<double>(const EvoformerBackwardParams&,
                                         const detail::EvoformerShape&, double*, double*, double*,
                                         double*, double*, double*, double*);

// ---- The public kReference path ----

namespace {

// The fp32 buffers of the reference, laid out in the workspace.
struct ReferenceBuffers {
  detail::WorkspaceLayout layout;
  size_t scores, scores2, qkv[3], lse, dbias1, dbias2;
};

ReferenceBuffers reference_buffers(const detail::EvoformerShape& s, bool backward) {
  ReferenceBuffers r{};
  const int64_t score_count = s.batch * s.n * s.heads * s.len * s.len;
  const int64_t qkv_count = s.batch * s.n * s.len * s.heads * s.dim;
  r.scores = r.layout.add<float>(score_count);
  r.qkv[0] = r.layout.add<float>(qkv_count);
  if (!backward) {
    r.lse = r.layout.add<float>(s.batch * s.n * s.heads * s.len);
    return r;
  }
  r.scores2 = r.layout.add<float>(score_count);
  r.qkv[1] = r.layout.add<float>(qkv_count);
  r.qkv[2] = r.layout.add<float>(qkv_count);
  r.dbias1 = r.layout.add<float>(s.batch * s.n * s.len);
  r.dbias2 = r.layout.add<float>(s.batch * s.heads * s.len * s.len);
  return r;
}

// Rounds a packed [B, N, L, H, D] fp32 buffer into a strided output view.
void store_qkv(const float* src, const TensorView& dst, const detail::EvoformerShape& s) {
  const Packed x = packed(s);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.len; ++i)
        for (int64_t h = 0; h < s.heads; ++h)
          store_row(dst, offset5(dst, b, n, i, h, 0), 1, s.dim, src + x.qkv(b, n, i, h, 0));
}

}  // namespace

size_t reference_forward_workspace_size(const detail::EvoformerShape& s) {
  return reference_buffers(s, false).layout.total_bytes();
}

size_t reference_backward_workspace_size(const detail::EvoformerShape& s) {
  return reference_buffers(s, true).layout.total_bytes();
}

void run_reference_forward(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                           void* workspace) {
  const ReferenceBuffers r = reference_buffers(s, false);
  float* out = r.layout.at<float>(workspace, r.qkv[0]);
  float* lse = r.layout.at<float>(workspace, r.lse);
  reference_forward<float>(p, s, r.layout.at<float>(workspace, r.scores), out, lse);
  store_qkv(out, p.out, s);
  if (p.lse.present()) {
    for (int64_t bn = 0; bn < s.batch * s.n; ++bn)
      for (int64_t h = 0; h < s.heads; ++h)
        store_row(p.lse, bn * p.lse.strides[0] + h * p.lse.strides[1], p.lse.strides[2], s.len,
                  lse + (bn * s.heads + h) * s.len);
  }
}

void run_reference_backward(const EvoformerBackwardParams& p, const detail::EvoformerShape& s,
                            void* workspace) {
  const ReferenceBuffers r = reference_buffers(s, true);
  float* grads[3];
  for (int t = 0; t < 3; ++t) grads[t] = r.layout.at<float>(workspace, r.qkv[t]);
  float* dbias1 = r.layout.at<float>(workspace, r.dbias1);
  float* dbias2 = r.layout.at<float>(workspace, r.dbias2);
  reference_backward<float>(p, s, r.layout.at<float>(workspace, r.scores),
                            r.layout.at<float>(workspace, r.scores2), grads[0], grads[1], grads[2],
                            dbias1, dbias2);
  store_qkv(grads[0], p.dq, s);
  store_qkv(grads[1], p.dk, s);
  store_qkv(grads[2], p.dv, s);
  if (p.dbias1.present()) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t n = 0; n < s.n; ++n)
        store_row(p.dbias1, offset5(p.dbias1, b, n, 0, 0, 0), 1, s.len,
                  dbias1 + (b * s.n + n) * s.len);
  }
  if (p.dbias2.present()) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.len; ++i)
          store_row(p.dbias2, offset5(p.dbias2, b, 0, h, i, 0), 1, s.len,
                    dbias2 + ((b * s.heads + h) * s.len + i) * s.len);
  }
}

}  // namespace sciattn::cpu

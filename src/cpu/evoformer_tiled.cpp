// The tiled, multithreaded CPU path of Evoformer attention (see evoformer_tiled.h). CPU layer.
//
// Work is split into tasks that own disjoint outputs and run sequentially inside, so the result
// does not depend on the number of threads or on scheduling:
//   forward:  one task per (b, n, h);
//   backward: one task per (b, h, chunk of N); the task owns dQ, dK, dV of its (b, n, h) slices,
//             a per-(b, n, h) partial of dbias1 and a per-chunk fp32 partial of dbias2, which are
//             then reduced over heads and chunks in a fixed order.
// Inside a task, queries are processed in tiles of kCpuQueryTile rows against key tiles of
// kCpuKeyTile columns; no more than one score tile exists at a time. Inner loops run along a
// contiguous dimension (keys, or the head dim) so the compiler can vectorise them; the score tile
// and the backward's four products are register-blocked (gemm_acc.h).
#include "cpu/evoformer_tiled.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/evoformer_cpu_tiling.h"
#include "cpu/cpu_clones.h"
#include "cpu/gemm_acc.h"
#include "cpu/softmax_row.h"
#include "cpu/strided_access.h"
#include "cpu/vector_exp.h"

namespace sciattn::cpu {
namespace {

using detail::CpuBackwardScratch;
using detail::CpuForwardScratch;
using detail::EvoformerShape;
using detail::kCpuKeyTile;
using detail::kCpuQueryTile;
using detail::WorkspaceLayout;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Loads the [L, D] slice (b, n, :, h, :) of a [B, N, L, H, D] tensor into packed rows, times
// `factor`.
void load_slice(const TensorView& t, int64_t b, int64_t n, int64_t h, const EvoformerShape& s,
                float factor, float* dst) {
  for (int64_t i = 0; i < s.len; ++i) {
    float* row = dst + i * s.dim;
    load_row(t, offset5(t, b, n, i, h, 0), 1, s.dim, row);
    if (factor != 1.0f) {
      for (int64_t d = 0; d < s.dim; ++d) row[d] *= factor;
    }
  }
}

// dst [cols, rows] (rows ld_dst apart) = transpose of the [rows, cols] block of src (rows ld_src
// apart): a slice's [L, D] rows into [D, L], or a tile's P or dS into keys x queries.
SCIATTN_CPU_INLINE void transpose_block(const float* src, int64_t rows, int64_t cols,
                                        int64_t ld_src, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

// The inputs of one score tile.
struct ScoreTileArgs {
  const float* q_rows;  // [tq, D] rows of scale * Q
  const float* k_t;     // [D, L]
  const float* bias1;   // [L] or nullptr
  const TensorView* bias2;
  float* bias2_row;  // [kCpuKeyTile] scratch
  int64_t b, h, i0, j0, tq, tk;
};

// scores[r][c] = <scale*q_{i0+r}, k_{j0+c}> + bias1[j0+c] + bias2[b, 0, h, i0+r, j0+c] for the
// tile; rows of `scores` are kCpuKeyTile apart. The forward and the backward both call this, so
// the backward's recomputed scores are bitwise those of the forward (one function, cloned per
// instruction set: cpu_clones.h).
SCIATTN_CPU_CLONES void score_tile(const ScoreTileArgs& a, const EvoformerShape& s, float* scores) {
  for (int64_t r = 0; r < a.tq; ++r) {
    std::fill(scores + r * kCpuKeyTile, scores + r * kCpuKeyTile + a.tk, 0.0f);
  }
  gemm_acc(a.tq, a.tk, s.dim, a.q_rows, s.dim, a.k_t + a.j0, s.len, scores, kCpuKeyTile);
  for (int64_t r = 0; r < a.tq; ++r) {
    float* srow = scores + r * kCpuKeyTile;
    if (a.bias1 != nullptr) {
      for (int64_t c = 0; c < a.tk; ++c) srow[c] += a.bias1[a.j0 + c];
    }
    if (a.bias2->present()) {
      const TensorView& b2 = *a.bias2;
      load_row(b2, offset5(b2, a.b, 0, a.h, a.i0 + r, a.j0), 1, a.tk, a.bias2_row);
      for (int64_t c = 0; c < a.tk; ++c) srow[c] += a.bias2_row[c];
    }
  }
}

// out[d] += w[c] * rows[c * dim + d] for every c in [0, n) whose weight is not 0 (a masked key
// adds nothing, not 0 * v), the terms added in c order for each d as a plain loop over c would
// add them, but with 16 (then 8) columns of `out` held in registers across all n rows instead of
// stored and reloaded for each: that store-to-load chain per key was most of the forward's P V
// cost at head dims 8 to 64.
template <int64_t kChunk>
SCIATTN_CPU_INLINE void add_weighted_chunk(float* out, const float* w, const float* rows, int64_t n,
                                           int64_t dim) {
  float acc[kChunk];
  for (int64_t e = 0; e < kChunk; ++e) acc[e] = out[e];
  for (int64_t c = 0; c < n; ++c) {
    const float wc = w[c];
    if (wc == 0.0f) continue;
    const float* row = rows + c * dim;
    for (int64_t e = 0; e < kChunk; ++e) acc[e] += wc * row[e];
  }
  for (int64_t e = 0; e < kChunk; ++e) out[e] = acc[e];
}
SCIATTN_CPU_INLINE void add_weighted_rows(float* out, const float* w, const float* rows, int64_t n,
                                          int64_t dim) {
  int64_t d0 = 0;
  for (; d0 + 16 <= dim; d0 += 16) add_weighted_chunk<16>(out + d0, w, rows + d0, n, dim);
  if (d0 + 8 <= dim) {
    add_weighted_chunk<8>(out + d0, w, rows + d0, n, dim);
    d0 += 8;
  }
  if (d0 == dim) return;
  for (int64_t c = 0; c < n; ++c) {
    const float wc = w[c];
    if (wc == 0.0f) continue;
    for (int64_t d = d0; d < dim; ++d) out[d] += wc * rows[c * dim + d];
  }
}

// bias1 of (b, n) as the additive row it contributes ([L]); nullptr when absent.
const float* load_bias1(const TensorView& bias1, int64_t b, int64_t n, const EvoformerShape& s,
                        float* dst) {
  if (!bias1.present()) return nullptr;
  load_row(bias1, offset5(bias1, b, n, 0, 0, 0), bias1.strides[4], s.len, dst);
  return dst;
}

SCIATTN_CPU_CLONES void forward_task(const EvoformerForwardParams& p, const EvoformerShape& s,
                                     float scale, int64_t b, int64_t n, int64_t h,
                                     const CpuForwardScratch& plan, void* scratch) {
  const WorkspaceLayout w;  // `scratch` is already aligned; offsets come from `plan`
  float* k_t = w.at<float>(scratch, plan.k_t);
  float* v = w.at<float>(scratch, plan.v);
  float* q_tile = w.at<float>(scratch, plan.q_tile);
  float* scores = w.at<float>(scratch, plan.scores);
  float* out_acc = w.at<float>(scratch, plan.out_acc);
  float* row_max = w.at<float>(scratch, plan.row_max);
  float* row_sum = w.at<float>(scratch, plan.row_sum);

  // K^T through V's buffer, then V itself.
  load_slice(p.k, b, n, h, s, 1.0f, v);
  transpose_block(v, s.len, s.dim, s.dim, k_t, s.len);
  load_slice(p.v, b, n, h, s, 1.0f, v);
  const float* bias1 = load_bias1(p.bias1, b, n, s, w.at<float>(scratch, plan.bias1));

  ScoreTileArgs tile{q_tile, k_t, bias1, &p.bias2, w.at<float>(scratch, plan.bias2_row), b, h,
                     0,      0,   0,     0};
  for (int64_t i0 = 0; i0 < s.len; i0 += kCpuQueryTile) {
    const int64_t tq = std::min(kCpuQueryTile, s.len - i0);
    for (int64_t r = 0; r < tq; ++r) {
      load_row(p.q, offset5(p.q, b, n, i0 + r, h, 0), 1, s.dim, q_tile + r * s.dim);
      for (int64_t d = 0; d < s.dim; ++d) q_tile[r * s.dim + d] *= scale;
    }
    std::fill(row_max, row_max + tq, kNegInf);
    std::fill(row_sum, row_sum + tq, 0.0f);
    std::fill(out_acc, out_acc + tq * s.dim, 0.0f);

    for (int64_t j0 = 0; j0 < s.len; j0 += kCpuKeyTile) {
      const int64_t tk = std::min(kCpuKeyTile, s.len - j0);
      tile.i0 = i0;
      tile.j0 = j0;
      tile.tq = tq;
      tile.tk = tk;
      score_tile(tile, s, scores);
      for (int64_t r = 0; r < tq; ++r) {
        float* srow = scores + r * kCpuKeyTile;
        // NaN once a score is NaN, -inf while every key so far is masked (softmax_row.h).
        const float new_max = running_softmax_max(row_max[r], softmax_row_max(srow, tk));
        // Every key so far is masked: nothing to add, and no -inf - -inf = NaN to compute.
        if (new_max == kNegInf) continue;
        const float rescale = vector_exp(row_max[r] - new_max);  // 0 on the first unmasked tile
        const float tile_sum = exp_shifted_row(srow, tk, new_max);
        // The accumulator holds the output so far divided by the running sum: a weighted mean of
        // V's rows, whose weights add up to at most 1, so it stays finite wherever the result is.
        // Accumulating exp(s - max) v unnormalised reaches L * max|v|, which overflows fp32 for
        // |v| above FLT_MAX / L although the output itself is at most max|v|.
        const float kept = row_sum[r] * rescale;
        const float new_sum = kept + tile_sum;  // >= 1: the maximum's own term is exp(0)
        const float inv = 1.0f / new_sum;
        for (int64_t c = 0; c < tk; ++c) srow[c] *= inv;
        row_sum[r] = new_sum;
        row_max[r] = new_max;
        float* o = out_acc + r * s.dim;
        const float keep = kept * inv;
        for (int64_t d = 0; d < s.dim; ++d) o[d] *= keep;
        add_weighted_rows(o, srow, v + j0 * s.dim, tk, s.dim);
      }
    }

    for (int64_t r = 0; r < tq; ++r) {
      // out_acc is normalised already. A fully masked row has row_sum 0: its output stayed 0 and
      // its lse is -inf; a row with a NaN score has a NaN sum, output and lse.
      const float* o = out_acc + r * s.dim;
      store_row(p.out, offset5(p.out, b, n, i0 + r, h, 0), 1, s.dim, o);
      if (p.lse.present()) {
        const float lse = row_sum[r] == 0.0f ? kNegInf : row_max[r] + std::log(row_sum[r]);
        static_cast<float*>(p.lse.data)[(b * s.n + n) * p.lse.strides[0] + h * p.lse.strides[1] +
                                        (i0 + r) * p.lse.strides[2]] = lse;
      }
    }
  }
}

// One step of the backward: a tile of tq query rows against tk keys, P already in `probs`.
// Everything is fp32, rows packed: probs and dscores [tq, kCpuKeyTile], tile_t [kCpuKeyTile,
// kCpuQueryTile] scratch, q (scale * Q), dout and dq the tile's rows [tq, dim], k the keys' rows
// [tk, dim], v_t their columns of V^T (rows `len` apart), dk and dv [tk, dim]; dbias1 [tk] and
// dbias2 (the tile's rows, `len` apart) or nullptr.
struct BackwardTile {
  const float* probs;
  float* dscores;
  float* tile_t;
  const float* q;
  const float* k;
  const float* v_t;
  const float* dout;
  const float* row_delta;
  float* dq;
  float* dk;
  float* dv;
  float* dbias1;
  float* dbias2;
  int64_t tq, tk, dim, len;
};

// Row r's dS_ij = P_ij (dP_ij - D_i) in place of its dP, and its terms of the bias gradients.
SCIATTN_CPU_INLINE void finish_ds_row(const BackwardTile& t, int64_t r) {
  const float* prow = t.probs + r * kCpuKeyTile;
  float* dsrow = t.dscores + r * kCpuKeyTile;
  const float delta = t.row_delta[r];
  for (int64_t c = 0; c < t.tk; ++c) dsrow[c] = prow[c] * (dsrow[c] - delta);
  if (t.dbias1 != nullptr) {
    for (int64_t c = 0; c < t.tk; ++c) t.dbias1[c] += dsrow[c];
  }
  if (t.dbias2 != nullptr) {
    float* acc = t.dbias2 + r * t.len;
    for (int64_t c = 0; c < t.tk; ++c) acc[c] += dsrow[c];
  }
}

// The backward's tile step: dV += P^T dO, dP = dO V^T, dQ += dS K and dK += dS^T Q as
// register-blocked products (gemm_acc; P and dS transposed into tile_t for the two whose rows are
// keys). Every sum runs over its index in increasing order, so the result does not depend on the
// blocking. At every D: since gemm_acc holds an 8-column remainder in vectors and the last
// columns in registers, the products beat a row-by-row step at D not a multiple of 16 too (2.3x
// to 7.0x against the one they replaced, docs/perf/evoformer.md "Backward products at every
// head dim").
SCIATTN_CPU_INLINE void backward_tile_products(const BackwardTile& t) {
  transpose_block(t.probs, t.tq, t.tk, kCpuKeyTile, t.tile_t, kCpuQueryTile);
  gemm_acc(t.tk, t.dim, t.tq, t.tile_t, kCpuQueryTile, t.dout, t.dim, t.dv, t.dim);
  for (int64_t r = 0; r < t.tq; ++r) {
    std::fill(t.dscores + r * kCpuKeyTile, t.dscores + r * kCpuKeyTile + t.tk, 0.0f);
  }
  gemm_acc(t.tq, t.tk, t.dim, t.dout, t.dim, t.v_t, t.len, t.dscores, kCpuKeyTile);
  for (int64_t r = 0; r < t.tq; ++r) finish_ds_row(t, r);
  gemm_acc(t.tq, t.dim, t.tk, t.dscores, kCpuKeyTile, t.k, t.dim, t.dq, t.dim);
  transpose_block(t.dscores, t.tq, t.tk, kCpuKeyTile, t.tile_t, kCpuQueryTile);
  gemm_acc(t.tk, t.dim, t.tq, t.tile_t, kCpuQueryTile, t.q, t.dim, t.dk, t.dim);
}

// The backward of one (b, n, h) slice. Adds dS into dbias1_partial ([L], this slice's own) and
// dbias2_acc ([L, L], the task's chunk accumulator) when they are not null.
SCIATTN_CPU_CLONES void backward_slice(const EvoformerBackwardParams& p, const EvoformerShape& s,
                                       float scale, int64_t b, int64_t n, int64_t h,
                                       const CpuBackwardScratch& plan, void* scratch,
                                       float* dbias1_partial, float* dbias2_acc) {
  const WorkspaceLayout w;
  float* q = w.at<float>(scratch, plan.q);
  float* k = w.at<float>(scratch, plan.k);
  float* dout = w.at<float>(scratch, plan.dout);
  float* k_t = w.at<float>(scratch, plan.k_t);
  float* v_t = w.at<float>(scratch, plan.v_t);
  float* dq_acc = w.at<float>(scratch, plan.dq_acc);
  float* row_delta = w.at<float>(scratch, plan.row_delta);
  float* lse = w.at<float>(scratch, plan.lse);
  float* probs = w.at<float>(scratch, plan.probs);
  float* dscores = w.at<float>(scratch, plan.dscores);
  float* tile_t = w.at<float>(scratch, plan.tile_t);
  float* dk_acc = w.at<float>(scratch, plan.dk_acc);
  float* dv_acc = w.at<float>(scratch, plan.dv_acc);
  float* out_row = w.at<float>(scratch, plan.out_row);

  load_slice(p.q, b, n, h, s, scale, q);
  load_slice(p.k, b, n, h, s, 1.0f, k);
  transpose_block(k, s.len, s.dim, s.dim, k_t, s.len);
  load_slice(p.v, b, n, h, s, 1.0f, dq_acc);  // V rows pass through dq_acc on their way to V^T
  transpose_block(dq_acc, s.len, s.dim, s.dim, v_t, s.len);
  std::fill(dq_acc, dq_acc + s.len * s.dim, 0.0f);
  load_slice(p.dout, b, n, h, s, 1.0f, dout);
  const float* bias1 = load_bias1(p.bias1, b, n, s, w.at<float>(scratch, plan.bias1));
  const float* lse_src = static_cast<const float*>(p.lse.data) + (b * s.n + n) * p.lse.strides[0] +
                         h * p.lse.strides[1];
  for (int64_t i = 0; i < s.len; ++i) {
    lse[i] = lse_src[i * p.lse.strides[2]];
    // D_i = <dO_i, O_i> = sum_j P_ij dP_ij, from the forward's output as stored.
    load_row(p.out, offset5(p.out, b, n, i, h, 0), 1, s.dim, out_row);
    float delta = 0.0f;
    for (int64_t d = 0; d < s.dim; ++d) delta += dout[i * s.dim + d] * out_row[d];
    row_delta[i] = delta;
  }

  ScoreTileArgs tile{q, k_t, bias1, &p.bias2, w.at<float>(scratch, plan.bias2_row), b, h,
                     0, 0,   0,     0};
  for (int64_t j0 = 0; j0 < s.len; j0 += kCpuKeyTile) {
    const int64_t tk = std::min(kCpuKeyTile, s.len - j0);
    std::fill(dk_acc, dk_acc + tk * s.dim, 0.0f);
    std::fill(dv_acc, dv_acc + tk * s.dim, 0.0f);
    for (int64_t i0 = 0; i0 < s.len; i0 += kCpuQueryTile) {
      const int64_t tq = std::min(kCpuQueryTile, s.len - i0);
      tile.q_rows = q + i0 * s.dim;
      tile.i0 = i0;
      tile.j0 = j0;
      tile.tq = tq;
      tile.tk = tk;
      score_tile(tile, s, probs);
      for (int64_t r = 0; r < tq; ++r) {
        float* prow = probs + r * kCpuKeyTile;
        const float row_lse = lse[i0 + r];
        // P in fp32 from the forward's lse; a fully masked row (lse -inf) has P = 0.
        if (row_lse == kNegInf) {
          std::fill(prow, prow + tk, 0.0f);
        } else {
          for (int64_t c = 0; c < tk; ++c) prow[c] = vector_exp(prow[c] - row_lse);
        }
      }
      const BackwardTile t{probs,
                           dscores,
                           tile_t,
                           q + i0 * s.dim,
                           k + j0 * s.dim,
                           v_t + j0,
                           dout + i0 * s.dim,
                           row_delta + i0,
                           dq_acc + i0 * s.dim,
                           dk_acc,
                           dv_acc,
                           dbias1_partial != nullptr ? dbias1_partial + j0 : nullptr,
                           dbias2_acc != nullptr ? dbias2_acc + i0 * s.len + j0 : nullptr,
                           tq,
                           tk,
                           s.dim,
                           s.len};
      backward_tile_products(t);
    }
    for (int64_t c = 0; c < tk; ++c) {
      store_row(p.dk, offset5(p.dk, b, n, j0 + c, h, 0), 1, s.dim, dk_acc + c * s.dim);
      store_row(p.dv, offset5(p.dv, b, n, j0 + c, h, 0), 1, s.dim, dv_acc + c * s.dim);
    }
  }
  for (int64_t i = 0; i < s.len; ++i) {
    float* dq = dq_acc + i * s.dim;
    for (int64_t d = 0; d < s.dim; ++d) dq[d] *= scale;
    store_row(p.dq, offset5(p.dq, b, n, i, h, 0), 1, s.dim, dq);
  }
}

// The whole-call plan of the tiled backward: thread scratch plus the bias-gradient partials.
struct BackwardPlan {
  WorkspaceLayout layout;
  CpuBackwardScratch scratch_plan;
  size_t scratch_bytes = 0;  // per thread
  size_t scratch = 0, dbias1_partial = 0, dbias2_partial = 0;
  int64_t chunks = 0;  // N is split into this many chunks per (b, h) task
  int threads = 1;
};

BackwardPlan plan_backward(const EvoformerBackwardParams& p, const EvoformerShape& s) {
  BackwardPlan r;
  WorkspaceLayout per_thread;
  r.scratch_plan = detail::plan_cpu_backward_scratch(s, &per_thread);
  r.scratch_bytes = per_thread.used_bytes();
  r.chunks = detail::cpu_backward_chunks(s, p.dbias2.present());
  r.threads = detail::cpu_backward_threads(tiled_thread_count(p.options), s, p.dbias2.present());
  r.scratch = r.layout.add<std::byte>(static_cast<int64_t>(r.scratch_bytes) * r.threads);
  if (p.dbias1.present()) r.dbias1_partial = r.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (p.dbias2.present()) {
    r.dbias2_partial = r.layout.add<float>(r.chunks * s.batch * s.heads * s.len * s.len);
  }
  return r;
}

struct ForwardPlan {
  WorkspaceLayout layout;
  CpuForwardScratch scratch_plan;
  size_t scratch_bytes = 0;
  size_t scratch = 0;
  int threads = 1;
};

ForwardPlan plan_forward(const EvoformerForwardParams& p, const EvoformerShape& s) {
  ForwardPlan r;
  WorkspaceLayout per_thread;
  r.scratch_plan = detail::plan_cpu_forward_scratch(s, &per_thread);
  r.scratch_bytes = per_thread.used_bytes();
  r.threads = detail::cpu_forward_threads(tiled_thread_count(p.options), s);
  r.scratch = r.layout.add<std::byte>(static_cast<int64_t>(r.scratch_bytes) * r.threads);
  return r;
}

}  // namespace

int tiled_thread_count(const EvoformerOptions& options) {
  return options.num_threads > 0 ? options.num_threads : std::max(1, omp_get_max_threads());
}

size_t tiled_forward_workspace_size(const EvoformerForwardParams& p, const EvoformerShape& s) {
  return plan_forward(p, s).layout.total_bytes();
}

size_t tiled_backward_workspace_size(const EvoformerBackwardParams& p, const EvoformerShape& s) {
  return plan_backward(p, s).layout.total_bytes();
}

void run_tiled_forward(const EvoformerForwardParams& p, const EvoformerShape& s, void* workspace) {
  const ForwardPlan plan = plan_forward(p, s);
  const float scale = detail::evoformer_scale(p.options, s.dim);
  std::byte* scratch = plan.layout.at<std::byte>(workspace, plan.scratch);
  const int64_t tasks = s.batch * s.n * s.heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan.threads)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t h = t % s.heads, n = (t / s.heads) % s.n, b = t / (s.heads * s.n);
    void* mine = scratch + static_cast<size_t>(omp_get_thread_num()) * plan.scratch_bytes;
    forward_task(p, s, scale, b, n, h, plan.scratch_plan, mine);
  }
}

void run_tiled_backward(const EvoformerBackwardParams& p, const EvoformerShape& s,
                        void* workspace) {
  const BackwardPlan plan = plan_backward(p, s);
  const float scale = detail::evoformer_scale(p.options, s.dim);
  std::byte* scratch = plan.layout.at<std::byte>(workspace, plan.scratch);
  float* dbias1_partial =
      p.dbias1.present() ? plan.layout.at<float>(workspace, plan.dbias1_partial) : nullptr;
  float* dbias2_partial =
      p.dbias2.present() ? plan.layout.at<float>(workspace, plan.dbias2_partial) : nullptr;
  const int64_t tasks = s.batch * s.heads * plan.chunks;
  const int64_t ll = s.len * s.len;

#pragma omp parallel for schedule(dynamic, 1) num_threads(plan.threads)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t h = t % s.heads, c = (t / s.heads) % plan.chunks, b = t / (s.heads * plan.chunks);
    void* mine = scratch + static_cast<size_t>(omp_get_thread_num()) * plan.scratch_bytes;
    float* chunk_acc = nullptr;
    if (dbias2_partial != nullptr) {
      chunk_acc = dbias2_partial + ((c * s.batch + b) * s.heads + h) * ll;
      std::fill(chunk_acc, chunk_acc + ll, 0.0f);
    }
    const int64_t n_begin = c * s.n / plan.chunks, n_end = (c + 1) * s.n / plan.chunks;
    for (int64_t n = n_begin; n < n_end; ++n) {
      float* slice_dbias1 = nullptr;
      if (dbias1_partial != nullptr) {
        slice_dbias1 = dbias1_partial + ((b * s.n + n) * s.heads + h) * s.len;
        std::fill(slice_dbias1, slice_dbias1 + s.len, 0.0f);
      }
      backward_slice(p, s, scale, b, n, h, plan.scratch_plan, mine, slice_dbias1, chunk_acc);
    }
  }

  // dbias1[b, n, j] = sum over heads of the per-head partials, heads in order.
  if (dbias1_partial != nullptr) {
    const int64_t bns = s.batch * s.n;
    // Each element reads one partial and adds it.
    const int threads = detail::cpu_loop_threads(
        plan.threads, bns,
        static_cast<double>(bns * s.heads * s.len) * (detail::kCpuFloatMoveFlops + 1.0),
        detail::kCpuTiledFlopsPerNs);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t bn = 0; bn < bns; ++bn) {
      float* sum = dbias1_partial + bn * s.heads * s.len;  // head 0's partial becomes the sum
      for (int64_t h = 1; h < s.heads; ++h) {
        const float* part = sum + h * s.len;
        for (int64_t j = 0; j < s.len; ++j) sum[j] += part[j];
      }
      const int64_t b = bn / s.n, n = bn % s.n;
      store_row(p.dbias1, offset5(p.dbias1, b, n, 0, 0, 0), p.dbias1.strides[4], s.len, sum);
    }
  }
  // dbias2[b, 0, h, i, :] = sum over chunks of the chunk partials, chunks in order.
  if (dbias2_partial != nullptr) {
    const int64_t rows = s.batch * s.heads * s.len;
    const int64_t chunk_stride = s.batch * s.heads * ll;
    const int threads = detail::cpu_loop_threads(
        plan.threads, rows,
        static_cast<double>(rows * plan.chunks * s.len) * (detail::kCpuFloatMoveFlops + 1.0),
        detail::kCpuTiledFlopsPerNs);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t row = 0; row < rows; ++row) {
      float* sum = dbias2_partial + row * s.len;  // chunk 0's row becomes the sum
      for (int64_t c = 1; c < plan.chunks; ++c) {
        const float* part = sum + c * chunk_stride;
        for (int64_t j = 0; j < s.len; ++j) sum[j] += part[j];
      }
      const int64_t i = row % s.len, h = (row / s.len) % s.heads, b = row / (s.len * s.heads);
      store_row(p.dbias2, offset5(p.dbias2, b, 0, h, i, 0), 1, s.len, sum);
    }
  }
}

}  // namespace sciattn::cpu

// The fused CPU sparse attention: streams over each query block's nonzero key blocks with an
// online softmax, never materialising the block scores, forward and backward. CPU layer.
//
// Forward: one task per (z, h, query block I) walks the row index; it holds one b x b score block,
// the running max and sum of its b rows and their fp32 output accumulators.
// Backward, without any cross-thread reduction: a first pass computes D_i = <dO_i, O_i>; then one
// task per (z, h, key block J) walks the column index and owns dK_J and dV_J, and one task per
// (z, h, query block I) walks the row index and owns dQ_I. Both recompute the probabilities of
// their blocks from the forward's log-sum-exp through score_block(), the forward's own function,
// so P = exp(S - lse) sees bitwise the forward's scores. Each output is summed by one thread in
// index order: the bits do not depend on the thread count. Recomputing the scores in both passes
// costs more FLOPs than atomics would, and buys determinism without any reduction buffer.
#include <algorithm>
#include <cmath>

#include "common/workspace_layout.h"
#include "cpu/block_sparse_cpu.h"
#include "cpu/softmax_row.h"
#include "cpu/vector_exp.h"

namespace sciattn::cpu {
namespace {

using detail::AttentionShape;
using detail::WorkspaceLayout;

// dst [cols, rows] = transpose of src [rows, cols] (both packed).
SCIATTN_CPU_INLINE void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// S = Q_I K_J^T plus the score terms, for the b x b block (I, J) of (z, h). q_blk is [b, D],
// k_t is K_J transposed [D, b]; scores [b, b] and tmp [b] are scratch. The sum over D runs in the
// same order as the sdd kernel's, so the composite and fused paths see the same raw scores.
SCIATTN_CPU_INLINE void score_block(const ScoreTerms& terms, int64_t z, int64_t h, int64_t i_blk,
                                    int64_t j_blk, int64_t b, int64_t dim, const float* q_blk,
                                    const float* k_t, float* scores, float* tmp) {
  std::fill(scores, scores + b * b, 0.0f);
  gemm_acc(b, b, dim, q_blk, dim, k_t, b, scores, b);
  for (int64_t r = 0; r < b; ++r) {
    terms.apply(z, h, i_blk * b + r, j_blk * b, b, scores + r * b, tmp);
  }
}

// ---- forward -----------------------------------------------------------------------------------

struct ForwardScratch {
  WorkspaceLayout layout;
  size_t q, k, k_t, v, scores, acc, row_max, row_sum, tmp;
};

ForwardScratch plan_forward(int64_t b, int64_t d) {
  ForwardScratch s;
  s.q = s.layout.add<float>(b * d);
  s.k = s.layout.add<float>(b * d);
  s.k_t = s.layout.add<float>(d * b);
  s.v = s.layout.add<float>(b * d);
  s.scores = s.layout.add<float>(b * b);
  s.acc = s.layout.add<float>(b * d);
  s.row_max = s.layout.add<float>(b);
  s.row_sum = s.layout.add<float>(b);
  s.tmp = s.layout.add<float>(b);
  return s;
}

// Query block (z, h, I): the online softmax over the blocks of its row of the layout.
SCIATTN_CPU_CLONES void forward_task(const SparseAttentionForwardParams& p, const ScoreTerms& terms,
                                     const ForwardScratch& plan, std::byte* mine, int64_t dim,
                                     int64_t z, int64_t h, int64_t i_blk) {
  const BlockSparseIndex& ix = *p.index;
  const int64_t b = ix.block;
  const WorkspaceLayout at;  // `mine` is aligned already; offsets come from the plan
  float* q_blk = at.at<float>(mine, plan.q);
  float* k_blk = at.at<float>(mine, plan.k);
  float* k_t = at.at<float>(mine, plan.k_t);
  float* v_blk = at.at<float>(mine, plan.v);
  float* scores = at.at<float>(mine, plan.scores);
  float* acc = at.at<float>(mine, plan.acc);
  float* row_max = at.at<float>(mine, plan.row_max);
  float* row_sum = at.at<float>(mine, plan.row_sum);
  float* tmp = at.at<float>(mine, plan.tmp);

  load_tile(p.q, z, h, i_blk * b, b, 0, dim, q_blk, dim);
  std::fill(row_max, row_max + b, kNegInf);
  std::fill(row_sum, row_sum + b, 0.0f);
  std::fill(acc, acc + b * dim, 0.0f);
  for (int64_t pos = ix.row_begin(h, i_blk); pos < ix.row_end(h, i_blk); ++pos) {
    const int64_t j_blk = ix.col[static_cast<size_t>(pos)];
    load_tile(p.k, z, h, j_blk * b, b, 0, dim, k_blk, dim);
    transpose(k_blk, b, dim, k_t);
    load_tile(p.v, z, h, j_blk * b, b, 0, dim, v_blk, dim);
    score_block(terms, z, h, i_blk, j_blk, b, dim, q_blk, k_t, scores, tmp);
    // Online softmax: scores become exp(s - running max), earlier sums and outputs are rescaled.
    for (int64_t r = 0; r < b; ++r) {
      float* srow = scores + r * b;
      // NaN once a score is NaN, -inf while every key so far is masked (softmax_row.h).
      const float new_max = running_softmax_max(row_max[r], softmax_row_max(srow, b));
      if (new_max == kNegInf) {
        // Every key so far is masked: no probability, and no exp(-inf - (-inf)) = NaN.
        std::fill(srow, srow + b, 0.0f);
        continue;
      }
      const float rescale = vector_exp(row_max[r] - new_max);  // 0 on the first unmasked block
      const float block_sum = exp_shifted_row(srow, b, new_max);
      // acc holds the output so far divided by the running sum, a weighted mean of V's rows with
      // weights adding up to at most 1: it stays finite wherever the result is, where the
      // unnormalised sum of exp(s - max) v overflows fp32 for |v| above FLT_MAX / L.
      const float kept = row_sum[r] * rescale;
      const float new_sum = kept + block_sum;  // >= 1: the maximum's own term is exp(0)
      const float inv = 1.0f / new_sum;
      for (int64_t c = 0; c < b; ++c) srow[c] *= inv;
      row_sum[r] = new_sum;
      row_max[r] = new_max;
      float* o = acc + r * dim;
      const float keep = kept * inv;
      for (int64_t d = 0; d < dim; ++d) o[d] *= keep;
    }
    gemm_acc(b, dim, b, scores, b, v_blk, dim, acc, dim);  // O_I += (P / sum) V_J
  }
  // acc is normalised already. A row without any unmasked key (or an empty block row) has sum 0:
  // output 0, lse -inf; a row with a NaN score has a NaN sum, output and lse.
  if (p.lse.present()) {
    for (int64_t r = 0; r < b; ++r) {
      static_cast<float*>(p.lse.data)[z * p.lse.strides[0] + h * p.lse.strides[1] +
                                      (i_blk * b + r) * p.lse.strides[2]] =
          row_sum[r] == 0.0f ? kNegInf : row_max[r] + std::log(row_sum[r]);
    }
  }
  store_tile(p.out, z, h, i_blk * b, b, 0, dim, acc, dim);
}

// ---- backward ----------------------------------------------------------------------------------

// Scratch of either backward pass (the larger needs of the two; they run one after the other).
struct BackwardScratch {
  WorkspaceLayout layout;
  size_t q, k, k_t, v_t, dout, scores, dscores, trans, acc_a, acc_b, lse, delta, tmp;
};

BackwardScratch plan_backward(int64_t b, int64_t d) {
  BackwardScratch s;
  s.q = s.layout.add<float>(b * d);
  s.k = s.layout.add<float>(b * d);
  s.k_t = s.layout.add<float>(d * b);
  s.v_t = s.layout.add<float>(d * b);
  s.dout = s.layout.add<float>(b * d);
  s.scores = s.layout.add<float>(b * b);
  s.dscores = s.layout.add<float>(b * b);
  s.trans = s.layout.add<float>(b * b);
  s.acc_a = s.layout.add<float>(b * d);
  s.acc_b = s.layout.add<float>(b * d);
  s.lse = s.layout.add<float>(b);
  s.delta = s.layout.add<float>(b);
  s.tmp = s.layout.add<float>(b);
  return s;
}

// One thread's backward scratch, as pointers into its region `mine` (BackwardBuffers::of).
struct BackwardBuffers {
  float *q, *k, *k_t, *v_t, *dout, *scores, *dscores, *trans, *acc_a, *acc_b, *lse, *delta, *tmp;
  static BackwardBuffers of(const BackwardScratch& p, std::byte* mine) {
    const WorkspaceLayout at;
    auto f = [&](size_t offset) { return at.at<float>(mine, offset); };
    return {f(p.q),     f(p.k),     f(p.k_t),   f(p.v_t), f(p.dout),  f(p.scores), f(p.dscores),
            f(p.trans), f(p.acc_a), f(p.acc_b), f(p.lse), f(p.delta), f(p.tmp)};
  }
};

// The whole backward workspace: D_i for every row, then the per-thread scratch.
struct BackwardPlan {
  WorkspaceLayout layout;
  BackwardScratch scratch_plan;
  ThreadScratch scratch;
  size_t delta = 0, threads_region = 0;
};

BackwardPlan plan_backward_call(const BlockSparseIndex& ix, const AttentionShape& s, int threads) {
  BackwardPlan r;
  r.scratch_plan = plan_backward(ix.block, s.dim);
  r.scratch = {r.scratch_plan.layout.used_bytes(), threads};
  r.delta = r.layout.add<float>(s.batch * s.heads * s.len);
  r.threads_region = r.layout.add<std::byte>(static_cast<int64_t>(r.scratch.total_bytes()));
  return r;
}

// What both backward passes share: the call, its terms, the D_i of every row and the sizes.
struct BackwardCall {
  const SparseAttentionBackwardParams* p;
  const ScoreTerms* terms;
  const float* delta_all;  // [B, H, L]
  const AttentionShape* s;
  float scale;
};

// The lse and D_i of query block I, into [b] buffers.
SCIATTN_CPU_INLINE void load_row_stats(const BackwardCall& call, int64_t z, int64_t h,
                                       int64_t i_blk, int64_t b, float* lse_blk, float* delta_blk) {
  const TensorView& lse = call.p->lse;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = i_blk * b + r;
    lse_blk[r] = static_cast<const float*>(
        lse.data)[z * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]];
    delta_blk[r] = call.delta_all[(z * call.s->heads + h) * call.s->len + i];
  }
}

// The probabilities and score gradients of block (I, J):
//   P = exp(S - lse_i) (0 for a fully masked row, lse = -inf), dP = dO_I V_J^T,
//   dS = P * (dP - D_i), written into `scores` (P) and `dscores` (dS).
SCIATTN_CPU_INLINE void block_gradients(const ScoreTerms& terms, int64_t z, int64_t h,
                                        int64_t i_blk, int64_t j_blk, int64_t b, int64_t dim,
                                        const float* q_blk, const float* k_t, const float* dout_blk,
                                        const float* v_t, const float* lse, const float* delta,
                                        float* scores, float* dscores, float* tmp) {
  score_block(terms, z, h, i_blk, j_blk, b, dim, q_blk, k_t, scores, tmp);
  for (int64_t r = 0; r < b; ++r) {
    float* prow = scores + r * b;
    const float row_lse = lse[r];  // a local, so that the loop below vectorises
    if (row_lse == kNegInf) {
      std::fill(prow, prow + b, 0.0f);
    } else {
      for (int64_t c = 0; c < b; ++c) prow[c] = vector_exp(prow[c] - row_lse);
    }
  }
  std::fill(dscores, dscores + b * b, 0.0f);
  gemm_acc(b, b, dim, dout_blk, dim, v_t, b, dscores, b);
  for (int64_t r = 0; r < b; ++r) {
    const float* prow = scores + r * b;
    float* drow = dscores + r * b;
    for (int64_t c = 0; c < b; ++c) drow[c] = prow[c] * (drow[c] - delta[r]);
  }
}

// Key block (z, h, J): dK_J and dV_J over the query blocks of its column of the layout.
SCIATTN_CPU_CLONES void key_block_task(const BackwardCall& call, const BackwardScratch& plan,
                                       std::byte* mine, int64_t z, int64_t h, int64_t j_blk) {
  const SparseAttentionBackwardParams& p = *call.p;
  const BlockSparseIndex& ix = *p.index;
  const int64_t b = ix.block, dim = call.s->dim;
  const BackwardBuffers buf = BackwardBuffers::of(plan, mine);
  float *q_blk = buf.q, *k_blk = buf.k, *k_t = buf.k_t, *v_t = buf.v_t, *dout_blk = buf.dout;
  float *scores = buf.scores, *dscores = buf.dscores, *trans = buf.trans, *tmp = buf.tmp;
  float *lse_blk = buf.lse, *delta_blk = buf.delta;
  float *dk_acc = buf.acc_a, *dv_acc = buf.acc_b;

  // K_J^T and V_J^T, through k_blk (V's rows pass through it too).
  load_tile(p.k, z, h, j_blk * b, b, 0, dim, k_blk, dim);
  transpose(k_blk, b, dim, k_t);
  load_tile(p.v, z, h, j_blk * b, b, 0, dim, k_blk, dim);
  transpose(k_blk, b, dim, v_t);
  std::fill(dk_acc, dk_acc + b * dim, 0.0f);
  std::fill(dv_acc, dv_acc + b * dim, 0.0f);
  for (int64_t e = ix.col_begin(h, j_blk); e < ix.col_end(h, j_blk); ++e) {
    const int64_t i_blk = ix.col_rows[static_cast<size_t>(e)];
    load_tile(p.q, z, h, i_blk * b, b, 0, dim, q_blk, dim);
    load_tile(p.dout, z, h, i_blk * b, b, 0, dim, dout_blk, dim);
    load_row_stats(call, z, h, i_blk, b, lse_blk, delta_blk);
    block_gradients(*call.terms, z, h, i_blk, j_blk, b, dim, q_blk, k_t, dout_blk, v_t, lse_blk,
                    delta_blk, scores, dscores, tmp);
    transpose(scores, b, b, trans);
    gemm_acc(b, dim, b, trans, b, dout_blk, dim, dv_acc, dim);  // dV_J += P^T dO_I
    transpose(dscores, b, b, trans);
    gemm_acc(b, dim, b, trans, b, q_blk, dim, dk_acc, dim);  // dK_J += dS^T Q_I (x scale below)
  }
  for (int64_t e = 0; e < b * dim; ++e) dk_acc[e] *= call.scale;
  store_tile(p.dk, z, h, j_blk * b, b, 0, dim, dk_acc, dim);
  store_tile(p.dv, z, h, j_blk * b, b, 0, dim, dv_acc, dim);
}

// Query block (z, h, I): dQ_I over the key blocks of its row of the layout.
SCIATTN_CPU_CLONES void query_block_task(const BackwardCall& call, const BackwardScratch& plan,
                                         std::byte* mine, int64_t z, int64_t h, int64_t i_blk) {
  const SparseAttentionBackwardParams& p = *call.p;
  const BlockSparseIndex& ix = *p.index;
  const int64_t b = ix.block, dim = call.s->dim;
  const BackwardBuffers buf = BackwardBuffers::of(plan, mine);
  float *q_blk = buf.q, *k_blk = buf.k, *k_t = buf.k_t, *v_t = buf.v_t, *dout_blk = buf.dout;
  float *scores = buf.scores, *dscores = buf.dscores, *tmp = buf.tmp;
  float *lse_blk = buf.lse, *delta_blk = buf.delta;
  float *dq_acc = buf.acc_a, *v_blk = buf.acc_b;

  load_tile(p.q, z, h, i_blk * b, b, 0, dim, q_blk, dim);
  load_tile(p.dout, z, h, i_blk * b, b, 0, dim, dout_blk, dim);
  load_row_stats(call, z, h, i_blk, b, lse_blk, delta_blk);
  std::fill(dq_acc, dq_acc + b * dim, 0.0f);
  for (int64_t pos = ix.row_begin(h, i_blk); pos < ix.row_end(h, i_blk); ++pos) {
    const int64_t j_blk = ix.col[static_cast<size_t>(pos)];
    load_tile(p.k, z, h, j_blk * b, b, 0, dim, k_blk, dim);
    transpose(k_blk, b, dim, k_t);
    load_tile(p.v, z, h, j_blk * b, b, 0, dim, v_blk, dim);
    transpose(v_blk, b, dim, v_t);
    block_gradients(*call.terms, z, h, i_blk, j_blk, b, dim, q_blk, k_t, dout_blk, v_t, lse_blk,
                    delta_blk, scores, dscores, tmp);
    gemm_acc(b, dim, b, dscores, b, k_blk, dim, dq_acc, dim);  // dQ_I += dS K_J
  }
  for (int64_t e = 0; e < b * dim; ++e) dq_acc[e] *= call.scale;
  store_tile(p.dq, z, h, i_blk * b, b, 0, dim, dq_acc, dim);
}

// D_i = <dO_i, O_i> = sum_j P_ij dP_ij for the rows of query block (z, h, I), from the forward's
// output as stored.
void delta_task(const BackwardCall& call, const BackwardScratch& plan, std::byte* mine, int64_t z,
                int64_t h, int64_t i_blk, float* delta_all) {
  const SparseAttentionBackwardParams& p = *call.p;
  const int64_t b = p.index->block, dim = call.s->dim;
  const BackwardBuffers buf = BackwardBuffers::of(plan, mine);
  float *o_blk = buf.acc_a, *g_blk = buf.dout;
  load_tile(p.out, z, h, i_blk * b, b, 0, dim, o_blk, dim);
  load_tile(p.dout, z, h, i_blk * b, b, 0, dim, g_blk, dim);
  for (int64_t r = 0; r < b; ++r) {
    float dot = 0.0f;
    for (int64_t d = 0; d < dim; ++d) dot += o_blk[r * dim + d] * g_blk[r * dim + d];
    delta_all[(z * call.s->heads + h) * call.s->len + i_blk * b + r] = dot;
  }
}

}  // namespace

ScoreTerms attention_score_terms(const SparseAttentionOptions& o, float scale,
                                 const TensorView& rpe, const TensorView& key_padding_mask,
                                 const TensorView& attn_mask) {
  ScoreTerms t;
  t.scale = scale;
  t.rpe = &rpe;
  t.key_padding_mask = &key_padding_mask;
  t.attn_mask = &attn_mask;
  t.key_padding_mask_mode = o.key_padding_mask_mode;
  t.attn_mask_mode = o.attn_mask_mode;
  t.causal = o.causal;
  return t;
}

size_t fused_forward_workspace_size(const SparseAttentionForwardParams& p, const AttentionShape& s,
                                    int threads) {
  const ThreadScratch scratch{plan_forward(p.index->block, s.dim).layout.used_bytes(), threads};
  return scratch.total_bytes();
}

void fused_forward(const SparseAttentionForwardParams& p, const AttentionShape& s, int threads,
                   void* workspace) {
  const BlockSparseIndex& ix = *p.index;
  const ForwardScratch plan = plan_forward(ix.block, s.dim);
  const ThreadScratch scratch{plan.layout.used_bytes(), threads};
  const ScoreTerms terms = attention_score_terms(
      p.options, detail::attention_scale(p.options, s.dim), p.rpe, p.key_padding_mask, p.attn_mask);
  const int64_t rows = ix.num_heads * ix.num_row_blocks;
  const int64_t tasks = s.batch * rows;
  // Per score: 4*D FLOP (Q K^T and P V) and an exponential.
  const int used = block_loop_threads(threads, tasks, s.batch * ix.nnz, ix.block,
                                      4.0 * static_cast<double>(s.dim) + detail::kCpuExpFlops);
#pragma omp parallel for schedule(dynamic, 1) num_threads(used)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t z = t / rows, hr = t % rows;
    forward_task(p, terms, plan, scratch.mine(workspace), s.dim, z, hr / ix.num_row_blocks,
                 hr % ix.num_row_blocks);
  }
}

size_t fused_backward_workspace_size(const SparseAttentionBackwardParams& p,
                                     const AttentionShape& s, int threads) {
  return plan_backward_call(*p.index, s, threads).layout.total_bytes();
}

void fused_backward(const SparseAttentionBackwardParams& p, const AttentionShape& s, int threads,
                    void* workspace) {
  const BlockSparseIndex& ix = *p.index;
  const BackwardPlan plan = plan_backward_call(ix, s, threads);
  float* delta_all = plan.layout.at<float>(workspace, plan.delta);
  void* thread_region = plan.layout.at<std::byte>(workspace, plan.threads_region);
  const float scale = detail::attention_scale(p.options, s.dim);
  const ScoreTerms terms =
      attention_score_terms(p.options, scale, p.rpe, p.key_padding_mask, p.attn_mask);
  const BackwardCall call{&p, &terms, delta_all, &s, scale};
  const int64_t R = ix.num_row_blocks, C = ix.num_col_blocks;
  const int64_t row_tasks = s.batch * s.heads * R, col_tasks = s.batch * s.heads * C;
  const int64_t blocks = s.batch * ix.nnz;
  const double dim = static_cast<double>(s.dim);
  // D_i = <dO_i, O_i>: 2*D FLOP per row.
  const int delta_threads = detail::cpu_loop_threads(
      threads, row_tasks, 2.0 * dim * static_cast<double>(row_tasks * ix.block),
      kBlockSparseFlopsPerNs);
  // Per score, both passes recompute S (2*D FLOP) and P (an exponential); the key-block pass adds
  // dV, dP and dK (6*D), the query-block pass dP and dQ (4*D).
  const int key_threads =
      block_loop_threads(threads, col_tasks, blocks, ix.block, 8.0 * dim + detail::kCpuExpFlops);
  const int query_threads =
      block_loop_threads(threads, row_tasks, blocks, ix.block, 6.0 * dim + detail::kCpuExpFlops);

#pragma omp parallel for schedule(static) num_threads(delta_threads)
  for (int64_t t = 0; t < row_tasks; ++t) {
    const int64_t zh = t / R;
    delta_task(call, plan.scratch_plan, plan.scratch.mine(thread_region), zh / s.heads,
               zh % s.heads, t % R, delta_all);
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(key_threads)
  for (int64_t t = 0; t < col_tasks; ++t) {
    const int64_t zh = t / C;
    key_block_task(call, plan.scratch_plan, plan.scratch.mine(thread_region), zh / s.heads,
                   zh % s.heads, t % C);
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(query_threads)
  for (int64_t t = 0; t < row_tasks; ++t) {
    const int64_t zh = t / R;
    query_block_task(call, plan.scratch_plan, plan.scratch.mine(thread_region), zh / s.heads,
                     zh % s.heads, t % R);
  }
}

}  // namespace sciattn::cpu

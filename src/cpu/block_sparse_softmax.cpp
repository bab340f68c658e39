// The CPU block-sparse Softmax, forward and backward (spec 2.3). CPU layer.
//
// One task per (z, head, block row): it gathers each of the block row's b token rows from all of
// the row's blocks into fp32 scratch, so every row is finished by one thread in a fixed order
// (deterministic for any thread count), and it reads the whole row before writing any of it
// (which is what makes y = x and dx = dy in place safe). Scratch is sized by the longest block
// row of the layout, but each row only does the work of its own blocks.
#include <algorithm>
#include <cmath>

#include "common/workspace_layout.h"
#include "cpu/block_sparse_cpu.h"
#include "cpu/softmax_row.h"
#include "cpu/vector_exp.h"

namespace sciattn::cpu {
namespace {

using detail::WorkspaceLayout;

struct RowScratch {
  size_t a, b, tmp;
  WorkspaceLayout layout;
};

RowScratch plan_rows(const BlockSparseIndex& ix) {
  RowScratch s;
  const int64_t width = std::max<int64_t>(1, ix.max_row_nnz) * ix.block;
  s.a = s.layout.add<float>(width);
  s.b = s.layout.add<float>(width);
  s.tmp = s.layout.add<float>(ix.block);
  return s;
}

ThreadScratch scratch_of(const RowScratch& plan, int threads) {
  return {plan.layout.used_bytes(), threads};
}

}  // namespace

size_t softmax_workspace_size(const BlockSparseIndex& ix, int threads) {
  return scratch_of(plan_rows(ix), threads).total_bytes();
}

size_t softmax_backward_workspace_size(const BlockSparseIndex& ix, int threads) {
  return scratch_of(plan_rows(ix), threads).total_bytes();
}

namespace {

// Block row (z, h, I): the softmax of its b token rows over all of the row's blocks.
SCIATTN_CPU_CLONES void softmax_task(const BlockSparseIndex& ix, const TensorView& x,
                                     const TensorView& y, const ScoreTerms& terms,
                                     const TensorView* lse, const RowScratch& plan, std::byte* mine,
                                     int64_t z, int64_t hr) {
  const int64_t b = ix.block;
  const bool want_lse = lse != nullptr && lse->present();
  const int64_t h = hr / ix.num_row_blocks, i_blk = hr % ix.num_row_blocks;
  // The row's blocks p (stored positions plus the head's shift).
  const int64_t shift = ix.position_shift(h);
  const int64_t begin = ix.row_begin(h, i_blk) + shift, end = ix.row_end(h, i_blk) + shift;
  if (begin == end) {
    // An empty block row has no entries to write; its rows have no key at all, so their
    // log-sum-exp is that of a fully masked row.
    if (want_lse) {
      for (int64_t r = 0; r < b; ++r) {
        static_cast<float*>(lse->data)[z * lse->strides[0] + h * lse->strides[1] +
                                       (i_blk * b + r) * lse->strides[2]] = kNegInf;
      }
    }
    return;
  }
  const WorkspaceLayout at;
  float* vals = at.at<float>(mine, plan.a);
  float* tmp = at.at<float>(mine, plan.tmp);
  const int64_t width = (end - begin) * b;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = i_blk * b + r;
    for (int64_t p = begin; p < end; ++p) {
      float* v = vals + (p - begin) * b;
      load_row(x, off4(x, z, p, r, 0), x.strides[3], b, v);
      terms.apply(z, h, i, ix.col[static_cast<size_t>(p - shift)] * b, b, v, tmp);
    }
    const float max = softmax_row_max(vals, width);  // NaN for a row with NaN scores
    float row_lse = kNegInf;
    if (max == kNegInf) {
      // Fully masked: 0 rather than DeepSpeed's NaN from exp(-inf - (-inf)) (Decision 4).
      std::fill(vals, vals + width, 0.0f);
    } else {
      const float sum = exp_shifted_row(vals, width, max);
      for (int64_t c = 0; c < width; ++c) vals[c] /= sum;
      row_lse = max + std::log(sum);
    }
    for (int64_t p = begin; p < end; ++p) {
      store_row(y, off4(y, z, p, r, 0), y.strides[3], b, vals + (p - begin) * b);
    }
    if (want_lse) {
      static_cast<float*>(
          lse->data)[z * lse->strides[0] + h * lse->strides[1] + i * lse->strides[2]] = row_lse;
    }
  }
}

// Block row (z, h, I) of the backward.
SCIATTN_CPU_CLONES void softmax_backward_task(const BlockSparseIndex& ix, const TensorView& y,
                                              const TensorView& dy, const TensorView& dx,
                                              float scale, const RowScratch& plan, std::byte* mine,
                                              int64_t z, int64_t hr) {
  const int64_t b = ix.block;
  const int64_t h = hr / ix.num_row_blocks, i_blk = hr % ix.num_row_blocks;
  const int64_t shift = ix.position_shift(h);  // the row's blocks p, as in the forward
  const int64_t begin = ix.row_begin(h, i_blk) + shift, end = ix.row_end(h, i_blk) + shift;
  if (begin == end) return;
  const WorkspaceLayout at;
  float* yv = at.at<float>(mine, plan.a);
  float* gv = at.at<float>(mine, plan.b);
  const int64_t width = (end - begin) * b;
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t p = begin; p < end; ++p) {
      load_row(y, off4(y, z, p, r, 0), y.strides[3], b, yv + (p - begin) * b);
      load_row(dy, off4(dy, z, p, r, 0), dy.strides[3], b, gv + (p - begin) * b);
    }
    // dx = scale * y * (dy - sum_row(y * dy)), DeepSpeed's formula, scale applied always.
    float dot = 0.0f;
    for (int64_t c = 0; c < width; ++c) dot += yv[c] * gv[c];
    for (int64_t c = 0; c < width; ++c) gv[c] = scale * (yv[c] * (gv[c] - dot));
    for (int64_t p = begin; p < end; ++p) {
      store_row(dx, off4(dx, z, p, r, 0), dx.strides[3], b, gv + (p - begin) * b);
    }
  }
}

}  // namespace

void softmax_forward(const BlockSparseIndex& ix, int64_t batch, const TensorView& x,
                     const TensorView& y, const ScoreTerms& terms, const TensorView* lse,
                     int threads, void* workspace) {
  const RowScratch plan = plan_rows(ix);
  const ThreadScratch scratch = scratch_of(plan, threads);
  const int64_t rows = ix.num_heads * ix.num_row_blocks;
  const int64_t tasks = batch * rows;
  const int used =
      block_loop_threads(threads, tasks, batch * ix.nnz, ix.block, detail::kCpuExpFlops);
#pragma omp parallel for schedule(dynamic, 1) num_threads(used)
  for (int64_t t = 0; t < tasks; ++t) {
    softmax_task(ix, x, y, terms, lse, plan, scratch.mine(workspace), t / rows, t % rows);
  }
}

void softmax_backward(const BlockSparseIndex& ix, int64_t batch, const TensorView& y,
                      const TensorView& dy, const TensorView& dx, float scale, int threads,
                      void* workspace) {
  const RowScratch plan = plan_rows(ix);
  const ThreadScratch scratch = scratch_of(plan, threads);
  const int64_t rows = ix.num_heads * ix.num_row_blocks;
  const int64_t tasks = batch * rows;
  // dx = y * (dy - sum(y * dy)) * scale: no exponential; three floats moved and about four FLOP
  // per element.
  const int used = block_loop_threads(threads, tasks, batch * ix.nnz, ix.block,
                                      3.0 * detail::kCpuFloatMoveFlops + 4.0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(used)
  for (int64_t t = 0; t < tasks; ++t) {
    softmax_backward_task(ix, y, dy, dx, scale, plan, scratch.mine(workspace), t / rows, t % rows);
  }
}

}  // namespace sciattn::cpu

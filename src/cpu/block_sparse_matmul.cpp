// The CPU block-sparse MatMul: the sdd, dsd and dds kernels, and the public forward and backward
// expressed through them. CPU layer.
//
// Tasks own disjoint output tiles: sdd one block row of the result (all its blocks), dsd one
// block row of the dense output times a tile of its columns, dds a tile of rows of the dense
// output times one block column. Inside a task every output element accumulates over the inner
// dimension in increasing order, in fp32, so results do not depend on the thread count. Operands
// are converted to fp32 tiles in per-thread scratch; the multiply runs in gemm_acc.
#include <algorithm>
#include <cstring>

#include "common/workspace_layout.h"
#include "cpu/block_sparse_cpu.h"

namespace sciattn::cpu {
namespace {

using detail::WorkspaceLayout;

// The inner dimension of sdd is consumed in slices of this many elements, so scratch stays
// bounded for any K (an sdd inside a backward can have K = the sequence length).
constexpr int64_t kInnerTile = 256;
// dsd computes this many output columns per task, dds this many output rows: enough to amortise
// loading a b x b block, small enough that the accumulator stays in L2 (b = 128: 128 KiB).
constexpr int64_t kDenseTile = 256;

struct SddScratch {
  size_t x, y, acc;
  WorkspaceLayout layout;
};
SddScratch plan_sdd(const BlockSparseIndex& ix, int64_t k) {
  SddScratch s;
  const int64_t kt = std::min(k, kInnerTile);
  s.x = s.layout.add<float>(ix.block * kt);
  s.y = s.layout.add<float>(kt * ix.block);
  s.acc = s.layout.add<float>(ix.block * ix.block);
  return s;
}

struct DsdScratch {
  size_t s, y, acc;
  WorkspaceLayout layout;
};
DsdScratch plan_dsd(const BlockSparseIndex& ix, int64_t n) {
  DsdScratch s;
  const int64_t nt = std::min(n, kDenseTile);
  s.s = s.layout.add<float>(ix.block * ix.block);
  s.y = s.layout.add<float>(ix.block * nt);
  s.acc = s.layout.add<float>(ix.block * nt);
  return s;
}

struct DdsScratch {
  size_t x, s, acc;
  WorkspaceLayout layout;
};
DdsScratch plan_dds(const BlockSparseIndex& ix) {
  DdsScratch s;
  s.x = s.layout.add<float>(kDenseTile * ix.block);
  s.s = s.layout.add<float>(ix.block * ix.block);
  s.acc = s.layout.add<float>(kDenseTile * ix.block);
  return s;
}

ThreadScratch scratch_of(const WorkspaceLayout& layout, int threads) {
  return {layout.used_bytes(), threads};
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

// ---- sdd ---------------------------------------------------------------------------------------

size_t sdd_workspace_size(const BlockSparseIndex& ix, int64_t k, int threads) {
  return scratch_of(plan_sdd(ix, k).layout, threads).total_bytes();
}

namespace {

// One block row (z, h, I) of an sdd result: all its blocks.
SCIATTN_CPU_CLONES void sdd_task(const BlockSparseIndex& ix, const TensorView& x,
                                 const TensorView& y, const TensorView& c, const SddScratch& plan,
                                 std::byte* mine, int64_t z, int64_t hr) {
  const int64_t b = ix.block, k = x.sizes[3];
  const int64_t h = hr / ix.num_row_blocks, i_blk = hr % ix.num_row_blocks;
  const int64_t begin = ix.row_begin(h, i_blk), end = ix.row_end(h, i_blk);
  if (begin == end) return;
  const int64_t shift = ix.position_shift(h);
  const WorkspaceLayout at;  // `mine` is aligned already; offsets come from the plan
  float* xt = at.at<float>(mine, plan.x);
  float* yt = at.at<float>(mine, plan.y);
  float* acc = at.at<float>(mine, plan.acc);
  // With a single inner slice the rows of x for this block row are loaded once for all blocks.
  const bool one_slice = k <= kInnerTile;
  if (one_slice) load_tile(x, z, h, i_blk * b, b, 0, k, xt, k);
  for (int64_t s = begin; s < end; ++s) {
    const int64_t j_blk = ix.col[static_cast<size_t>(s)];
    std::fill(acc, acc + b * b, 0.0f);
    for (int64_t k0 = 0; k0 < k; k0 += kInnerTile) {
      const int64_t kt = std::min(kInnerTile, k - k0);
      if (!one_slice) load_tile(x, z, h, i_blk * b, b, k0, kt, xt, kt);
      load_tile(y, z, h, k0, kt, j_blk * b, b, yt, b);
      gemm_acc(b, b, kt, xt, kt, yt, b, acc, b);
    }
    // The sparse result as a 4-D view [Z, nnz, b, b]: block p is "head" p.
    store_tile(c, z, s + shift, 0, b, 0, b, acc, b);
  }
}

}  // namespace

void sdd(const BlockSparseIndex& ix, const TensorView& x, const TensorView& y, const TensorView& c,
         int threads, void* workspace) {
  const SddScratch plan = plan_sdd(ix, x.sizes[3]);
  const ThreadScratch scratch = scratch_of(plan.layout, threads);
  const int64_t rows = ix.num_heads * ix.num_row_blocks;  // (h, I) pairs
  const int64_t tasks = x.sizes[0] * rows;
  const int used = block_loop_threads(threads, tasks, x.sizes[0] * ix.nnz, ix.block,
                                      2.0 * static_cast<double>(x.sizes[3]));
#pragma omp parallel for schedule(dynamic, 1) num_threads(used)
  for (int64_t t = 0; t < tasks; ++t) {
    sdd_task(ix, x, y, c, plan, scratch.mine(workspace), t / rows, t % rows);
  }
}

// ---- dsd ---------------------------------------------------------------------------------------

size_t dsd_workspace_size(const BlockSparseIndex& ix, int64_t n, int threads) {
  return scratch_of(plan_dsd(ix, n).layout, threads).total_bytes();
}

namespace {

// Block row o_blk of op(s) times columns [n0, n0 + nt) of y, for (z, h).
SCIATTN_CPU_CLONES void dsd_task(const BlockSparseIndex& ix, const TensorView& s, bool trans_s,
                                 const TensorView& y, const TensorView& out, const DsdScratch& plan,
                                 std::byte* mine, int64_t z, int64_t h, int64_t o_blk, int64_t n0,
                                 int64_t nt) {
  const int64_t b = ix.block;
  const WorkspaceLayout at;
  float* sb = at.at<float>(mine, plan.s);
  float* yt = at.at<float>(mine, plan.y);
  float* acc = at.at<float>(mine, plan.acc);
  std::fill(acc, acc + b * nt, 0.0f);
  const int64_t shift = ix.position_shift(h);  // stored position -> block p
  if (!trans_s) {
    // out[I*b + r, :] += S_p[r, c] * y[J_p*b + c, :] over the blocks p of block row I.
    for (int64_t q = ix.row_begin(h, o_blk); q < ix.row_end(h, o_blk); ++q) {
      load_tile(s, z, q + shift, 0, b, 0, b, sb, b);
      load_tile(y, z, h, ix.col[static_cast<size_t>(q)] * b, b, n0, nt, yt, nt);
      gemm_acc(b, nt, b, sb, b, yt, nt, acc, nt);
    }
  } else {
    // out[J*b + c, :] += S_p[r, c] * y[I_p*b + r, :] over the blocks p of block column J.
    for (int64_t e = ix.col_begin(h, o_blk); e < ix.col_end(h, o_blk); ++e) {
      const int64_t p = ix.col_blocks[static_cast<size_t>(e)] + shift;
      load_tile_transposed(s, z, p, 0, b, 0, b, sb, b);
      load_tile(y, z, h, ix.col_rows[static_cast<size_t>(e)] * b, b, n0, nt, yt, nt);
      gemm_acc(b, nt, b, sb, b, yt, nt, acc, nt);
    }
  }
  // An empty block row stores zeros: its reduction has no terms (spec 2.3, "Empty block-row").
  store_tile(out, z, h, o_blk * b, b, n0, nt, acc, nt);
}

}  // namespace

void dsd(const BlockSparseIndex& ix, const TensorView& s, bool trans_s, const TensorView& y,
         const TensorView& out, int threads, void* workspace) {
  const int64_t n = y.sizes[3];
  const DsdScratch plan = plan_dsd(ix, n);
  const ThreadScratch scratch = scratch_of(plan.layout, threads);
  // Output block rows: the layout's block rows, or its block columns when s is transposed.
  const int64_t out_blocks = trans_s ? ix.num_col_blocks : ix.num_row_blocks;
  const int64_t n_tiles = ceil_div(n, kDenseTile);
  const int64_t per_z = ix.num_heads * out_blocks * n_tiles;
  const int64_t tasks = s.sizes[0] * per_z;
  const int used = block_loop_threads(threads, tasks, s.sizes[0] * ix.nnz, ix.block,
                                      2.0 * static_cast<double>(n));
#pragma omp parallel for schedule(dynamic, 1) num_threads(used)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t z = t / per_z, rest = t % per_z;
    const int64_t h = rest / (out_blocks * n_tiles);
    const int64_t o_blk = (rest / n_tiles) % out_blocks, n0 = (rest % n_tiles) * kDenseTile;
    dsd_task(ix, s, trans_s, y, out, plan, scratch.mine(workspace), z, h, o_blk, n0,
             std::min(kDenseTile, n - n0));
  }
}

// ---- dds ---------------------------------------------------------------------------------------

size_t dds_workspace_size(const BlockSparseIndex& ix, int threads) {
  return scratch_of(plan_dds(ix).layout, threads).total_bytes();
}

namespace {

// Rows [m0, m0 + mt) of x times block column o_blk of op(s), for (z, h).
SCIATTN_CPU_CLONES void dds_task(const BlockSparseIndex& ix, const TensorView& x,
                                 const TensorView& s, bool trans_s, const TensorView& out,
                                 const DdsScratch& plan, std::byte* mine, int64_t z, int64_t h,
                                 int64_t o_blk, int64_t m0, int64_t mt) {
  const int64_t b = ix.block;
  const WorkspaceLayout at;
  float* xt = at.at<float>(mine, plan.x);
  float* sb = at.at<float>(mine, plan.s);
  float* acc = at.at<float>(mine, plan.acc);
  std::fill(acc, acc + mt * b, 0.0f);
  const int64_t shift = ix.position_shift(h);  // stored position -> block p
  if (!trans_s) {
    // out[:, J*b + c] += x[:, I_p*b + r] * S_p[r, c] over the blocks p of block column J.
    for (int64_t e = ix.col_begin(h, o_blk); e < ix.col_end(h, o_blk); ++e) {
      const int64_t p = ix.col_blocks[static_cast<size_t>(e)] + shift;
      load_tile(x, z, h, m0, mt, ix.col_rows[static_cast<size_t>(e)] * b, b, xt, b);
      load_tile(s, z, p, 0, b, 0, b, sb, b);
      gemm_acc(mt, b, b, xt, b, sb, b, acc, b);
    }
  } else {
    // out[:, I*b + r] += x[:, J_p*b + c] * S_p[r, c] over the blocks p of block row I.
    for (int64_t q = ix.row_begin(h, o_blk); q < ix.row_end(h, o_blk); ++q) {
      load_tile(x, z, h, m0, mt, ix.col[static_cast<size_t>(q)] * b, b, xt, b);
      load_tile_transposed(s, z, q + shift, 0, b, 0, b, sb, b);
      gemm_acc(mt, b, b, xt, b, sb, b, acc, b);
    }
  }
  store_tile(out, z, h, m0, mt, o_blk * b, b, acc, b);
}

}  // namespace

void dds(const BlockSparseIndex& ix, const TensorView& x, const TensorView& s, bool trans_s,
         const TensorView& out, int threads, void* workspace) {
  const int64_t m = x.sizes[2];
  const DdsScratch plan = plan_dds(ix);
  const ThreadScratch scratch = scratch_of(plan.layout, threads);
  // Output block columns: the layout's block columns, or its block rows when s is transposed.
  const int64_t out_blocks = trans_s ? ix.num_row_blocks : ix.num_col_blocks;
  const int64_t m_tiles = ceil_div(m, kDenseTile);
  const int64_t per_z = ix.num_heads * out_blocks * m_tiles;
  const int64_t tasks = x.sizes[0] * per_z;
  const int used = block_loop_threads(threads, tasks, x.sizes[0] * ix.nnz, ix.block,
                                      2.0 * static_cast<double>(m));
#pragma omp parallel for schedule(dynamic, 1) num_threads(used)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t z = t / per_z, rest = t % per_z;
    const int64_t h = rest / (out_blocks * m_tiles);
    const int64_t o_blk = (rest / m_tiles) % out_blocks, m0 = (rest % m_tiles) * kDenseTile;
    dds_task(ix, x, s, trans_s, out, plan, scratch.mine(workspace), z, h, o_blk, m0,
             std::min(kDenseTile, m - m0));
  }
}

// ---- The public MatMul -------------------------------------------------------------------------

namespace {

TensorView op(const TensorView& t, bool trans) {
  return trans ? transposed(t) : t;
}

}  // namespace

size_t matmul_workspace_size(const BlockSparseMatMulParams& p, const detail::MatMulShape& s,
                             int threads) {
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      return sdd_workspace_size(*p.index, s.k, threads);
    case BlockSparseMatMulMode::kDsd:
      return dsd_workspace_size(*p.index, s.n, threads);
    case BlockSparseMatMulMode::kDds:
      return dds_workspace_size(*p.index, threads);
  }
  return 0;
}

void run_matmul(const BlockSparseMatMulParams& p, int threads, void* workspace) {
  const BlockSparseIndex& ix = *p.index;
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      sdd(ix, op(p.a, p.trans_a), op(p.b, p.trans_b), p.c, threads, workspace);
      break;
    case BlockSparseMatMulMode::kDsd:
      dsd(ix, p.a, p.trans_a, op(p.b, p.trans_b), p.c, threads, workspace);
      break;
    case BlockSparseMatMulMode::kDds:
      dds(ix, op(p.a, p.trans_a), p.b, p.trans_b, p.c, threads, workspace);
      break;
  }
}

// The backward of C = op(A) op(B) (spec 2.2). A dense gradient is written through the view of
// its operand's op() (transposed back for free, DeepSpeed's internal trans_c); a sparse gradient
// is the gradient of the sparse operand's logical matrix restricted to the layout:
//   sdd: d op(A) = dC op(B)^T (dsd), d op(B) = op(A)^T dC (dds);
//   dsd: dS = dC op(B)^T, or op(B) dC^T when A is transposed (sdd); d op(B) = op(S)^T dC (dsd);
//   dds: d op(A) = dC op(S)^T (dds); dS = op(A)^T dC, or dC^T op(A) when B is transposed (sdd).
size_t matmul_backward_workspace_size(const BlockSparseMatMulBackwardParams& p,
                                      const detail::MatMulShape& s, int threads) {
  const BlockSparseIndex& ix = *p.index;
  size_t da = 0, db = 0;
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      if (p.da.present()) da = dsd_workspace_size(ix, s.k, threads);
      if (p.db.present()) db = dds_workspace_size(ix, threads);
      break;
    case BlockSparseMatMulMode::kDsd:
      if (p.da.present()) da = sdd_workspace_size(ix, s.n, threads);
      if (p.db.present()) db = dsd_workspace_size(ix, s.n, threads);
      break;
    case BlockSparseMatMulMode::kDds:
      if (p.da.present()) da = dds_workspace_size(ix, threads);
      if (p.db.present()) db = sdd_workspace_size(ix, s.m, threads);
      break;
  }
  return std::max(da, db);  // the two gradients run one after the other
}

void run_matmul_backward(const BlockSparseMatMulBackwardParams& p, int threads, void* workspace) {
  const BlockSparseIndex& ix = *p.index;
  const TensorView op_a = op(p.a, p.trans_a), op_b = op(p.b, p.trans_b);
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      if (p.da.present())
        dsd(ix, p.dc, false, transposed(op_b), op(p.da, p.trans_a), threads, workspace);
      if (p.db.present())
        dds(ix, transposed(op_a), p.dc, false, op(p.db, p.trans_b), threads, workspace);
      break;
    case BlockSparseMatMulMode::kDsd:
      if (p.da.present()) {
        if (!p.trans_a) {
          sdd(ix, p.dc, transposed(op_b), p.da, threads, workspace);
        } else {
          sdd(ix, op_b, transposed(p.dc), p.da, threads, workspace);
        }
      }
      if (p.db.present()) dsd(ix, p.a, !p.trans_a, p.dc, op(p.db, p.trans_b), threads, workspace);
      break;
    case BlockSparseMatMulMode::kDds:
      if (p.da.present()) dds(ix, p.dc, p.b, !p.trans_b, op(p.da, p.trans_a), threads, workspace);
      if (p.db.present()) {
        if (!p.trans_b) {
          sdd(ix, transposed(op_a), p.dc, p.db, threads, workspace);
        } else {
          sdd(ix, transposed(p.dc), op_a, p.db, threads, workspace);
        }
      }
      break;
  }
}

}  // namespace sciattn::cpu

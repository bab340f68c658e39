// Tile sizes and workspace plan of the tiled CPU Evoformer path. Host-only common layer: the
// same plan gives workspace_size() and the regions run() uses.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/cpu_threads.h"
#include "common/evoformer_checks.h"
#include "common/workspace_layout.h"

namespace sciattn::detail {

// Queries per tile: the rows whose online-softmax state (max, sum, output) is kept together.
constexpr int64_t kCpuQueryTile = 32;
// Keys per tile: one score tile is kCpuQueryTile x kCpuKeyTile floats (16 KiB), small enough to
// stay in L1/L2 next to the key slice it is computed from.
constexpr int64_t kCpuKeyTile = 128;
// The backward sums dbias2 over N. Tasks own a contiguous chunk of N and accumulate into their own
// fp32 partial [L, L]; the chunks are then added in a fixed order. The chunk count depends only on
// the shape, so results are the same for any thread count; more chunks mean more parallelism and
// more memory (kMaxDbias2Chunks times the size of dbias2 in fp32 at most).
constexpr int64_t kMaxDbias2Chunks = 8;

// Per-thread scratch of the forward: K^T [D, L], V [L, D], bias1 row [L], query tile [Tq, D],
// score tile [Tq, Tk], output accumulator [Tq, D], row max and sum [Tq], a bias2 row [Tk].
struct CpuForwardScratch {
  size_t k_t, v, bias1, q_tile, scores, out_acc, row_max, row_sum, bias2_row;
};

inline CpuForwardScratch plan_cpu_forward_scratch(const EvoformerShape& s, WorkspaceLayout* w) {
  CpuForwardScratch r;
  r.k_t = w->add<float>(s.dim * s.len);
  r.v = w->add<float>(s.len * s.dim);
  r.bias1 = w->add<float>(s.len);
  r.q_tile = w->add<float>(kCpuQueryTile * s.dim);
  r.scores = w->add<float>(kCpuQueryTile * kCpuKeyTile);
  r.out_acc = w->add<float>(kCpuQueryTile * s.dim);
  r.row_max = w->add<float>(kCpuQueryTile);
  r.row_sum = w->add<float>(kCpuQueryTile);
  r.bias2_row = w->add<float>(kCpuKeyTile);
  return r;
}

// Per-thread scratch of the backward: scaled Q, K, dO [L, D]; K^T, V^T [D, L]; the dQ accumulator
// [L, D]; rows D_i = <dO_i, O_i>, lse and bias1 [L]; probabilities and dS tiles [Tq, Tk] and one
// of them transposed [Tk, Tq]; dK and dV accumulators [Tk, D]; one row of O [D] and of bias2 [Tk].
struct CpuBackwardScratch {
  size_t q, k, dout, k_t, v_t, dq_acc, row_delta, lse, bias1, probs, dscores, tile_t, dk_acc,
      dv_acc, out_row, bias2_row;
};

inline CpuBackwardScratch plan_cpu_backward_scratch(const EvoformerShape& s, WorkspaceLayout* w) {
  CpuBackwardScratch r;
  const int64_t ld = s.len * s.dim;
  r.q = w->add<float>(ld);
  r.k = w->add<float>(ld);
  r.dout = w->add<float>(ld);
  r.k_t = w->add<float>(ld);
  r.v_t = w->add<float>(ld);
  r.dq_acc = w->add<float>(ld);
  r.row_delta = w->add<float>(s.len);
  r.lse = w->add<float>(s.len);
  r.bias1 = w->add<float>(s.len);
  r.probs = w->add<float>(kCpuQueryTile * kCpuKeyTile);
  r.dscores = w->add<float>(kCpuQueryTile * kCpuKeyTile);
  r.tile_t = w->add<float>(kCpuKeyTile * kCpuQueryTile);
  r.dk_acc = w->add<float>(kCpuKeyTile * s.dim);
  r.dv_acc = w->add<float>(kCpuKeyTile * s.dim);
  r.out_row = w->add<float>(s.dim);
  r.bias2_row = w->add<float>(kCpuKeyTile);
  return r;
}

inline int64_t cpu_dbias2_chunks(const EvoformerShape& s) {
  return std::min<int64_t>(s.n, kMaxDbias2Chunks);
}

// The work of the tiled path in cpu_threads.h's units, S = B*N*H*L*L scores: the forward's
// 4*S*D FLOP and one exponential per score; the backward's 10*S*D FLOP and one exponential per
// score (it recomputes P from the lse).
inline double cpu_scores(const EvoformerShape& s) {
  return static_cast<double>(s.batch * s.n * s.heads) * static_cast<double>(s.len) *
         static_cast<double>(s.len);
}
inline double cpu_forward_work(const EvoformerShape& s) {
  return cpu_scores(s) * (4.0 * static_cast<double>(s.dim) + kCpuExpFlops);
}
inline double cpu_backward_work(const EvoformerShape& s) {
  return cpu_scores(s) * (10.0 * static_cast<double>(s.dim) + kCpuExpFlops);
}
// The rate of the tiled path on one core in those units (its x86-64-v4 clones, both biases, the
// 2-core CPU machines), fitted at 2eb7207 on an AMD EPYC: forward 7.05 ns per score at D 32 and
// 9.31 at D 64 (36 and 41 per ns), backward 10.5 and 19.1 ns (43 and 40 per ns). The project's
// 2-core machines differ by more than the code has moved since: one thread of the AMD machine
// takes 3.5 and 5.4 ns forward, 8.2 and 15.6 backward (docs/perf/evoformer.md, 2026-12-05; the
// rate says 6.4, 9.6, 11.2 and 19.2), one of an Intel Xeon machine 5.8 and 10.0 forward, 11.1 and
// 27.4 backward (38f63d2). The rate sits between the two, so a second thread comes at 3.5 to 8.5
// ms of one core's work rather than at 6. The
// exponential is vectorised (cpu/vector_exp.h), so kCpuExpFlops now stands for the per-score work
// other than the head-dim products as much as for the exponential itself.
constexpr double kCpuTiledFlopsPerNs = 40.0;

// Threads of the tiled forward, one task per (b, n, h), given at most `limit`.
inline int cpu_forward_threads(int limit, const EvoformerShape& s) {
  return cpu_loop_threads(limit, s.batch * s.n * s.heads, cpu_forward_work(s), kCpuTiledFlopsPerNs);
}

// The tiled backward has one task per (b, h, chunk of N). With dbias2, N is cut into
// cpu_dbias2_chunks(s) chunks, each summing its own dbias2 partial; without it nothing is summed
// over N, so every n is its own chunk.
inline int64_t cpu_backward_chunks(const EvoformerShape& s, bool dbias2) {
  return dbias2 ? cpu_dbias2_chunks(s) : s.n;
}
// Threads of the tiled backward's main loop, given at most `limit`. The bias-gradient sums that
// follow it stream their partials (kCpuFloatMoveFlops + 1 per element) and choose their own
// count, no more than this.
inline int cpu_backward_threads(int limit, const EvoformerShape& s, bool dbias2) {
  return cpu_loop_threads(limit, s.batch * s.heads * cpu_backward_chunks(s, dbias2),
                          cpu_backward_work(s), kCpuTiledFlopsPerNs);
}

}  // namespace sciattn::detail

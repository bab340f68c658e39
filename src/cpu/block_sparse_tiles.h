// Building blocks of the CPU block-sparse kernels: strided 4-D tile loads and stores that convert
// to and from fp32, a small row-major multiply-accumulate, the score terms (scale, rpe, masks,
// causal) shared by the Softmax and the fused attention, and per-thread scratch. CPU layer.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "common/cpu_threads.h"
#include "common/workspace_layout.h"
#include "cpu/cpu_clones.h"
#include "cpu/strided_access.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Threads a call may use: the request, or all hardware threads for 0. Its workspace holds scratch
// for that many; each loop runs on block_loop_threads() of them. Results never depend on either.
inline int block_sparse_threads(int requested) {
  return requested > 0 ? requested : std::max(1, omp_get_max_threads());
}

// The block-sparse kernels' rate on one core in cpu_threads.h's units (their x86-64-v4 clones on
// the 2-core CPU machine, 2026-12-04): the fused forward took 6.2 ns per score at D 64 (62 per
// ns), the composite forward 7.9 ns (49 per ns), the fused backward 12.8 ns (90 per ns). The
// vectorised exponential (cpu/vector_exp.h) has since made them 1.2-1.4x faster (BigBird at
// L 4096: fused forward 1.4x, backward 1.2x, composite forward 1.4x), so this rate undercounts
// by that much: a loop takes its second thread at 2.1-2.5 ms of one core rather than 3. The
// baseline clone is 2-3x slower, so there a loop needs 2-3x the time before it takes a second
// thread.
constexpr double kBlockSparseFlopsPerNs = 60.0;

// Threads of one loop of a call that may use `threads`: the loop has `tasks` tasks, which together
// handle `blocks` b x b blocks at `flops_per_element` FLOP per block element (an exponential
// counted as detail::kCpuExpFlops). No more than the work keeps busy (common/cpu_threads.h).
inline int block_loop_threads(int threads, int64_t tasks, int64_t blocks, int64_t b,
                              double flops_per_element) {
  return detail::cpu_loop_threads(
      threads, tasks, static_cast<double>(blocks) * static_cast<double>(b * b) * flops_per_element,
      kBlockSparseFlopsPerNs);
}

// Element offset of (i0, i1, i2, i3) in a rank-4 view.
inline int64_t off4(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

// A view with its last two dimensions swapped: op(X) = X^T without a copy. Every kernel reads
// and writes dense operands through their strides, so a transposed operand is just a view.
inline TensorView transposed(const TensorView& t) {
  TensorView r = t;
  std::swap(r.sizes[2], r.sizes[3]);
  std::swap(r.strides[2], r.strides[3]);
  return r;
}

// Whether a tile of t is read faster column by column: its rows are further apart in memory than
// its columns (a transposed view, e.g. K^T of a [.., L, D] tensor). Reading along the unit stride
// keeps the loads contiguous; the scatter into the small fp32 tile stays in L1.
inline bool column_major(const TensorView& t) {
  return t.strides[3] != 1 && std::abs(t.strides[2]) < std::abs(t.strides[3]);
}

// Elements moved per step when a tile is read or written column by column.
constexpr int64_t kColumnChunk = 64;

// dst[r * ld + c] = t[i0, i1, row0 + r, col0 + c] for r < rows, c < cols, as float.
SCIATTN_CPU_INLINE void load_tile(const TensorView& t, int64_t i0, int64_t i1, int64_t row0,
                                  int64_t rows, int64_t col0, int64_t cols, float* dst,
                                  int64_t ld) {
  if (!column_major(t)) {
    for (int64_t r = 0; r < rows; ++r) {
      load_row(t, off4(t, i0, i1, row0 + r, col0), t.strides[3], cols, dst + r * ld);
    }
    return;
  }
  float chunk[kColumnChunk];
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r0 = 0; r0 < rows; r0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, rows - r0);
      load_row(t, off4(t, i0, i1, row0 + r0, col0 + c), t.strides[2], n, chunk);
      for (int64_t r = 0; r < n; ++r) dst[(r0 + r) * ld + c] = chunk[r];
    }
  }
}

// The transpose of that tile: dst[c * ld + r] = t[i0, i1, row0 + r, col0 + c].
SCIATTN_CPU_INLINE void load_tile_transposed(const TensorView& t, int64_t i0, int64_t i1,
                                             int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                             float* dst, int64_t ld) {
  if (column_major(t) || t.strides[3] != 1) {
    for (int64_t c = 0; c < cols; ++c) {
      load_row(t, off4(t, i0, i1, row0, col0 + c), t.strides[2], rows, dst + c * ld);
    }
    return;
  }
  float chunk[kColumnChunk];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, cols - c0);
      load_row(t, off4(t, i0, i1, row0 + r, col0 + c0), 1, n, chunk);
      for (int64_t c = 0; c < n; ++c) dst[(c0 + c) * ld + r] = chunk[c];
    }
  }
}

// t[i0, i1, row0 + r, col0 + c] = src[r * ld + c], rounded to t's dtype.
SCIATTN_CPU_INLINE void store_tile(const TensorView& t, int64_t i0, int64_t i1, int64_t row0,
                                   int64_t rows, int64_t col0, int64_t cols, const float* src,
                                   int64_t ld) {
  if (!column_major(t)) {
    for (int64_t r = 0; r < rows; ++r) {
      store_row(t, off4(t, i0, i1, row0 + r, col0), t.strides[3], cols, src + r * ld);
    }
    return;
  }
  float chunk[kColumnChunk];
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r0 = 0; r0 < rows; r0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, rows - r0);
      for (int64_t r = 0; r < n; ++r) chunk[r] = src[(r0 + r) * ld + c];
      store_row(t, off4(t, i0, i1, row0 + r0, col0 + c), t.strides[2], n, chunk);
    }
  }
}

// Sixteen floats as one GCC/Clang vector: a zmm register in the x86-64-v4 clone, two ymm in v3,
// four xmm in the baseline. aligned(4) and may_alias let it load from and store to any float
// array; values only ever move through memcpy-free dereferences inside one function, never through
// a function's parameters or result (whose ABI would differ between the clones).
typedef float Vec16 __attribute__((vector_size(64), aligned(4), may_alias));
constexpr int64_t kVecWidth = 16;
constexpr int64_t kMaxPanelVecs = 4;  // a 64-column panel: 8 accumulators for 2 rows

// C[m, 16W] += A[m, k] * B[k, 16W]: R rows of C at a time stay in R * W vector accumulators for
// the whole k loop (R independent FMA chains hide the FMA latency), and each row of B is loaded
// once for all R rows. Every C element accumulates over k in increasing order, as in the plain
// loop of gemm_acc, so splitting the columns into panels or the rows into groups never changes
// the order of a sum.
template <int64_t W, int64_t R>
SCIATTN_CPU_INLINE void gemm_acc_rows(int64_t k, const float* a, int64_t lda, const float* b,
                                      int64_t ldb, float* c, int64_t ldc) {
  Vec16 acc[R][W];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) {
      acc[r][w] = *reinterpret_cast<const Vec16*>(c + r * ldc + kVecWidth * w);
    }
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* brow = b + kk * ldb;
    Vec16 bw[W];
    for (int64_t w = 0; w < W; ++w) bw[w] = *reinterpret_cast<const Vec16*>(brow + kVecWidth * w);
    for (int64_t r = 0; r < R; ++r) {
      const float v = a[r * lda + kk];
      for (int64_t w = 0; w < W; ++w) acc[r][w] += v * bw[w];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) {
      *reinterpret_cast<Vec16*>(c + r * ldc + kVecWidth * w) = acc[r][w];
    }
}

// All m rows of a 16W-column panel: groups of 8 / W rows (8 accumulators), then single rows.
template <int64_t W>
SCIATTN_CPU_INLINE void gemm_acc_panel(int64_t m, int64_t k, const float* a, int64_t lda,
                                       const float* b, int64_t ldb, float* c, int64_t ldc) {
  constexpr int64_t kRows = W >= 4 ? 2 : W >= 2 ? 4 : 8;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) {
    gemm_acc_rows<W, kRows>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
  }
  for (; i < m; ++i) gemm_acc_rows<W, 1>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
}

// C[m, n] += A[m, k] * B[k, n], all row-major fp32 with leading dimensions lda, ldb, ldc. Widths
// that are multiples of 16 (every block size, and the usual head dims) run in register-blocked
// panels of up to 64 columns; any other width runs the plain loop, whose innermost loop along a
// row of B and C the compiler vectorises without reassociating any sum.
SCIATTN_CPU_INLINE void gemm_acc(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                 const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (n % kVecWidth == 0) {
    constexpr int64_t kPanel = kVecWidth * kMaxPanelVecs;
    int64_t j0 = 0;
    for (; j0 + kPanel <= n; j0 += kPanel)
      gemm_acc_panel<4>(m, k, a, lda, b + j0, ldb, c + j0, ldc);
    switch ((n - j0) / kVecWidth) {
      case 3:
        gemm_acc_panel<3>(m, k, a, lda, b + j0, ldb, c + j0, ldc);
        break;
      case 2:
        gemm_acc_panel<2>(m, k, a, lda, b + j0, ldb, c + j0, ldc);
        break;
      case 1:
        gemm_acc_panel<1>(m, k, a, lda, b + j0, ldb, c + j0, ldc);
        break;
      default:
        break;
    }
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    float* crow = c + i * ldc;
    const float* arow = a + i * lda;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = arow[kk];
      const float* brow = b + kk * ldb;
      for (int64_t j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
}

// What is added to a raw score x = <q_i, k_j> before the softmax (spec 2.3):
//   v = x * scale + rpe[z, h, i, j] + kpm(key_padding_mask[z, j]) + am(attn_mask[i, j]),
//   v = -inf where causal and j > i.
// The Softmax op and the fused attention both go through apply(), so a score gets the same
// terms in the same order on either path.
struct ScoreTerms {
  float scale = 1.0f;
  const TensorView* rpe = nullptr;               // [Z, H, rows, cols] or absent
  const TensorView* key_padding_mask = nullptr;  // [Z, cols] or absent
  const TensorView* attn_mask = nullptr;         // [rows, cols] or absent
  MaskMode key_padding_mask_mode = MaskMode::kAdd;
  MaskMode attn_mask_mode = MaskMode::kAdd;
  bool causal = false;

  // Loads `count` mask values starting at `offset`, `stride` apart, as additive terms.
  static SCIATTN_CPU_INLINE void mask_row(const TensorView& m, MaskMode mode, int64_t offset,
                                          int64_t stride, int64_t count, float* dst) {
    load_row(m, offset, stride, count, dst);  // a kBool mask already reads as 0 / -inf
    if (mode == MaskMode::kMul && m.dtype != DType::kBool) {
      for (int64_t c = 0; c < count; ++c) dst[c] = dst[c] == 0.0f ? kNegInf : 0.0f;
    }
  }

  // v[c] holds the raw score of (row i, column j0 + c) of batch z, head h; `tmp` is scratch of
  // `count` floats.
  SCIATTN_CPU_INLINE void apply(int64_t z, int64_t h, int64_t i, int64_t j0, int64_t count,
                                float* v, float* tmp) const {
    // DeepSpeed skips the multiplication when scale is 1; x * 1 == x, so this only saves time.
    if (scale != 1.0f) {
      for (int64_t c = 0; c < count; ++c) v[c] *= scale;
    }
    if (rpe != nullptr && rpe->present()) {
      load_row(*rpe, off4(*rpe, z, h, i, j0), rpe->strides[3], count, tmp);
      for (int64_t c = 0; c < count; ++c) v[c] += tmp[c];
    }
    if (key_padding_mask != nullptr && key_padding_mask->present()) {
      const TensorView& m = *key_padding_mask;
      mask_row(m, key_padding_mask_mode, z * m.strides[0] + j0 * m.strides[1], m.strides[1], count,
               tmp);
      for (int64_t c = 0; c < count; ++c) v[c] += tmp[c];
    }
    if (attn_mask != nullptr && attn_mask->present()) {
      const TensorView& m = *attn_mask;
      mask_row(m, attn_mask_mode, i * m.strides[0] + j0 * m.strides[1], m.strides[1], count, tmp);
      for (int64_t c = 0; c < count; ++c) v[c] += tmp[c];
    }
    if (causal) {
      for (int64_t c = std::max<int64_t>(0, i + 1 - j0); c < count; ++c) v[c] = kNegInf;
    }
  }
};

// Per-thread scratch: `threads` regions of `per_thread` bytes each, carved from one workspace.
// The plan functions of each kernel report per_thread; the total is what workspace_size() adds.
struct ThreadScratch {
  size_t per_thread = 0;  // a multiple of WorkspaceLayout::kAlignment
  int threads = 1;

  size_t total_bytes() const {
    return per_thread == 0
               ? 0
               : per_thread * static_cast<size_t>(threads) + detail::WorkspaceLayout::kAlignment;
  }
  // The calling OpenMP thread's region (aligned) of a workspace of total_bytes().
  std::byte* mine(void* workspace) const {
    const detail::WorkspaceLayout aligner;
    return aligner.at<std::byte>(workspace, 0) +
           static_cast<size_t>(omp_get_thread_num()) * per_thread;
  }
};

}  // namespace sciattn::cpu

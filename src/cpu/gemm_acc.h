// C += A B for small row-major fp32 tiles (gemm_acc), register-blocked with GCC/Clang vectors:
// the multiply-accumulate of the CPU block-sparse kernels and of the tiled Evoformer's score and
// dP tiles. Every element of C accumulates over k in increasing order, as the plain triple loop
// does, so the blocking never changes a result's bits. Inlined into each caller's instruction-set
// clones (cpu_clones.h). CPU layer.
#pragma once

#include <cstdint>

#include "cpu/cpu_clones.h"

namespace sciattn::cpu {

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

// C[m, n] += A[m, k] * B[k, n], all row-major fp32 with leading dimensions lda, ldb, ldc. The
// columns up to the last multiple of 16 (every block size, the usual head dims, a whole key tile)
// run in register-blocked panels of up to 64 columns; the rest run the plain loop, whose innermost
// loop along a row of B and C the compiler vectorises without reassociating any sum.
SCIATTN_CPU_INLINE void gemm_acc(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                 const float* b, int64_t ldb, float* c, int64_t ldc) {
  constexpr int64_t kPanel = kVecWidth * kMaxPanelVecs;
  const int64_t n16 = n / kVecWidth * kVecWidth;
  int64_t j0 = 0;
  for (; j0 + kPanel <= n16; j0 += kPanel) {
    gemm_acc_panel<4>(m, k, a, lda, b + j0, ldb, c + j0, ldc);
  }
  switch ((n16 - j0) / kVecWidth) {
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
  if (n16 == n) return;
  for (int64_t i = 0; i < m; ++i) {
    float* crow = c + i * ldc;
    const float* arow = a + i * lda;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = arow[kk];
      const float* brow = b + kk * ldb;
      for (int64_t j = n16; j < n; ++j) crow[j] += av * brow[j];
    }
  }
}

}  // namespace sciattn::cpu

// C += A B for small row-major fp32 tiles (gemm_acc), register-blocked with GCC/Clang vectors:
// the multiply-accumulate of the CPU block-sparse kernels and of the tiled Evoformer's score tile
// and backward products. Every element of C accumulates over k in increasing order, as the plain
// triple loop does, so the blocking never changes a result's bits. Inlined into each caller's
// instruction-set clones (cpu_clones.h), except the last 1 to 7 columns of a row
// (gemm_acc_last_columns, cloned in gemm_acc.cpp). CPU layer.
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
// Eight floats (a ymm register in the wide clones): the 8-column remainder of a row whose width
// is 8 more than a multiple of 16 (head dims 24, 40, 56, ...).
typedef float Vec8 __attribute__((vector_size(32), aligned(4), may_alias));
// The vector of kLanes floats, looked up by lane count: a vector type passed as a template
// argument would lose its aligned(4) (GCC drops a typedef's attributes there), and the loads
// below would then assume 32- or 64-byte alignment.
template <int64_t kLanes>
struct VecOf;
template <>
struct VecOf<16> {
  typedef Vec16 type;
};
template <>
struct VecOf<8> {
  typedef Vec8 type;
};
constexpr int64_t kMaxPanelVecs = 4;  // a 64-column panel: 8 accumulators for 2 rows

// C[m, 16W] += A[m, k] * B[k, 16W] (kLanes 16; with 8, 8W columns): R rows of C at a time
// stay in R * W vector accumulators for the whole k loop (R independent FMA chains hide the FMA
// latency), and each row of B is loaded once for all R rows. Every C element accumulates over k
// in increasing order, as in the plain loop of gemm_acc, so splitting the columns into panels or
// the rows into groups never changes the order of a sum.
template <int64_t W, int64_t R, int64_t kLanes = kVecWidth>
SCIATTN_CPU_INLINE void gemm_acc_rows(int64_t k, const float* a, int64_t lda, const float* b,
                                      int64_t ldb, float* c, int64_t ldc) {
  typedef typename VecOf<kLanes>::type V;
  V acc[R][W];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) {
      acc[r][w] = *reinterpret_cast<const V*>(c + r * ldc + kLanes * w);
    }
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* brow = b + kk * ldb;
    V bw[W];
    for (int64_t w = 0; w < W; ++w) bw[w] = *reinterpret_cast<const V*>(brow + kLanes * w);
    for (int64_t r = 0; r < R; ++r) {
      const float v = a[r * lda + kk];
      for (int64_t w = 0; w < W; ++w) acc[r][w] += v * bw[w];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) {
      *reinterpret_cast<V*>(c + r * ldc + kLanes * w) = acc[r][w];
    }
}

// All m rows of a 16W-column panel (8W with kLanes 8): groups of 8 / W rows (8 accumulators), then
// single rows.
template <int64_t W, int64_t kLanes = kVecWidth>
SCIATTN_CPU_INLINE void gemm_acc_panel(int64_t m, int64_t k, const float* a, int64_t lda,
                                       const float* b, int64_t ldb, float* c, int64_t ldc) {
  constexpr int64_t kRows = W >= 4 ? 2 : W >= 2 ? 4 : 8;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) {
    gemm_acc_rows<W, kRows, kLanes>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
  }
  for (; i < m; ++i) gemm_acc_rows<W, 1, kLanes>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
}

// C[m, t] += A[m, k] * B[k, t] for gemm_acc's last t < 8 columns (gemm_acc.cpp). Out of line,
// so that its seven widths are compiled once rather than inside every caller's clones, and cloned
// per instruction-set level like its callers (the loader picks the same level for both, so a
// process's results stay those of one level).
void gemm_acc_last_columns(int64_t t, int64_t m, int64_t k, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float* c, int64_t ldc);

// C[m, n] += A[m, k] * B[k, n], all row-major fp32 with leading dimensions lda, ldb, ldc. The
// columns up to the last multiple of 16 (every block size, the usual head dims, a whole key tile)
// run in register-blocked panels of up to 64 columns, then 8 more in a panel of 8-float vectors
// where there are 8 left, then the last 1 to 7 by gemm_acc_last_columns.
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
  int64_t done = n16;
  if (n - done >= 8) {
    gemm_acc_panel<1, 8>(m, k, a, lda, b + done, ldb, c + done, ldc);
    done += 8;
  }
  if (done < n) gemm_acc_last_columns(n - done, m, k, a, lda, b + done, ldb, c + done, ldc);
}

}  // namespace sciattn::cpu

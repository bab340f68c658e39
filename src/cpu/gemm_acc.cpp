// gemm_acc's last 1 to 7 columns (gemm_acc.h), compiled once per x86 instruction-set level.
// CPU layer.
#include "cpu/gemm_acc.h"

namespace sciattn::cpu {
namespace {

// C[m, T] += A[m, k] * B[k, T] for the last T < 8 columns: each row's T sums held in the first
// lanes of one 8-float vector across the whole k loop (B's T values put into a zeroed vector
// per k), so that nothing goes through memory between the k steps. The vector form also keeps
// each element's update an FMA (in the wide clones) in k order, as the panels' are: a scalar
// running sum over k is a reduction GCC may vectorise with the products rounded apart.
template <int64_t T>
SCIATTN_CPU_INLINE void gemm_acc_tail(int64_t m, int64_t k, const float* a, int64_t lda,
                                      const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* crow = c + i * ldc;
    const float* arow = a + i * lda;
    Vec8 acc = {};
    for (int64_t j = 0; j < T; ++j) acc[j] = crow[j];
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* brow = b + kk * ldb;
      Vec8 bv = {};
      for (int64_t j = 0; j < T; ++j) bv[j] = brow[j];
      acc += arow[kk] * bv;
    }
    for (int64_t j = 0; j < T; ++j) crow[j] = acc[j];
  }
}

}  // namespace

SCIATTN_CPU_CLONES void gemm_acc_last_columns(int64_t t, int64_t m, int64_t k, const float* a,
                                              int64_t lda, const float* b, int64_t ldb, float* c,
                                              int64_t ldc) {
  switch (t) {
    case 1:
      gemm_acc_tail<1>(m, k, a, lda, b, ldb, c, ldc);
      break;
    case 2:
      gemm_acc_tail<2>(m, k, a, lda, b, ldb, c, ldc);
      break;
    case 3:
      gemm_acc_tail<3>(m, k, a, lda, b, ldb, c, ldc);
      break;
    case 4:
      gemm_acc_tail<4>(m, k, a, lda, b, ldb, c, ldc);
      break;
    case 5:
      gemm_acc_tail<5>(m, k, a, lda, b, ldb, c, ldc);
      break;
    case 6:
      gemm_acc_tail<6>(m, k, a, lda, b, ldb, c, ldc);
      break;
    case 7:
      gemm_acc_tail<7>(m, k, a, lda, b, ldb, c, ldc);
      break;
    default:
      break;
  }
}

}  // namespace sciattn::cpu

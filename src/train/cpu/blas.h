// The one place the trainer calls BLAS: a row-major single-precision GEMM on OpenBLAS's CBLAS,
// and what the linked library says about itself. CPU layer of the trainer.
#pragma once

#include <cstdint>
#include <string>

namespace sciattn::train::cpu {

// C[M, N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X^T when the flag is set.
// lda, ldb, ldc are row strides in elements. Sizes must fit the library's 32-bit integers
// (callers issue products per chunk of tokens, far below that).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// "OpenBLAS 0.3.21 (OpenMP threads)" or "CBLAS" when the library is not OpenBLAS.
std::string blas_description();

// Sets OpenBLAS's thread count (a no-op for other libraries); 0 leaves it as it is.
void set_blas_threads(int threads);

}  // namespace sciattn::train::cpu

// The CBLAS calls of the trainer (OpenBLAS). CPU layer of the trainer; the only file that
// includes cblas.h.
#include "train/cpu/blas.h"

#include <cblas.h>

#include <climits>

// OpenBLAS's own entry points, declared weak so that another CBLAS also links: they are null
// there. (OpenBLAS's cblas.h declares them too; a weak redeclaration is compatible.)
extern "C" {
char* openblas_get_config(void) __attribute__((weak));
int openblas_get_parallel(void) __attribute__((weak));
void openblas_set_num_threads(int num_threads) __attribute__((weak));
}

namespace sciattn::train::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

std::string blas_description() {
  if (openblas_get_config == nullptr) return "CBLAS";
  std::string text = openblas_get_config();
  if (openblas_get_parallel != nullptr) {
    const int parallel = openblas_get_parallel();
    text += parallel == 2   ? " (OpenMP threads)"
            : parallel == 1 ? " (pthreads: its threads and the trainer's OpenMP threads compete)"
                            : " (single-threaded)";
  }
  return text;
}

void set_blas_threads(int threads) {
  if (threads > 0 && openblas_set_num_threads != nullptr) openblas_set_num_threads(threads);
}

}  // namespace sciattn::train::cpu

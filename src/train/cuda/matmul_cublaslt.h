// Matrix products of the trainer's CUDA back end on cuBLASLt: one handle, fp32 accumulation,
// 16-bit or fp32 operands, an optional bias in the epilogue, and an algorithm chosen once per
// product shape and kept. CUDA layer of the trainer (host code).
//
// Determinism: cuBLASLt gives the same bits for the same call with the same algorithm on one
// GPU model. The algorithm is picked by the heuristic once per (shape, dtypes, alignment class)
// and cached, the alignment classes are capped at 16 bytes (so an offset chunk of a buffer and a
// fresh buffer share an algorithm when both are 16-byte aligned), and split-K reductions are
// limited to those that add the parts in fp32 in the workspace (never in the 16-bit output).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "sciattn/dtype.h"
#include "sciattn/status.h"

namespace sciattn::train::cuda {

// D = op(A) op(B) + beta D (+ bias), column-major as cuBLASLt sees it: op(A) is m x k, op(B)
// k x n, D m x n. A is stored k x m when trans_a (else m x k), B n x k when trans_b (else k x n).
struct MatmulShape {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  DType ab_dtype = DType::kBF16;  // A and B
  DType d_dtype = DType::kBF16;   // C = D
  bool bias = false;              // a bias of m elements of d_dtype added to every column of D
};

class Matmul {
 public:
  Matmul() = default;
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  ~Matmul();

  Status init();
  // "cuBLASLt 13.0.2"
  std::string description() const;

  // Whether a bias at `bias` can ride in the epilogue (the plans assume 16-byte alignment).
  static bool bias_in_epilogue(const void* bias) {
    return reinterpret_cast<uintptr_t>(bias) % 16 == 0;
  }

  // Queues D = op(A) op(B) + beta D (+ bias) on `stream`. beta is 0 or 1 (1 accumulates into D).
  Status run(const MatmulShape& shape, const void* a, const void* b, void* d, const void* bias,
             float beta, void* workspace, size_t workspace_bytes, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
  };
  // The shape's fields and the alignment classes of A, B and D.
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                         bool, int, int, int, size_t>;

  Status plan(const MatmulShape& shape, int align_a, int align_b, int align_d,
              size_t workspace_bytes, Plan* out);
  static void destroy(Plan* plan);

  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace sciattn::train::cuda

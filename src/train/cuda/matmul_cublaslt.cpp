// cuBLASLt products of the trainer's CUDA back end (see matmul_cublaslt.h). CUDA layer of the
// trainer (host code).
#include "train/cuda/matmul_cublaslt.h"
#include "common/status_try.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace sciattn::train::cuda {
namespace {

Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok_status();
  return Status(StatusCode::kDeviceError,
                std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusString(s));
}

#define SCIATTN_LT(expr, what)                 \
  do {                                         \
    const cublasStatus_t lt_status_ = (expr);  \
    if (lt_status_ != CUBLAS_STATUS_SUCCESS) { \
      return lt_status(lt_status_, what);      \
    }                                          \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// The alignment class of a pointer: the largest power of two up to 16 that divides it.
int alignment_class(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int bytes = 16; bytes > 1; bytes /= 2) {
    if (a % static_cast<uintptr_t>(bytes) == 0) return bytes;
  }
  return 1;
}

}  // namespace

Matmul::~Matmul() {
  for (auto& [key, plan] : plans_) destroy(&plan);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status Matmul::init() {
  SCIATTN_LT(cublasLtCreate(&handle_), "handle");
  return Status::ok_status();
}

std::string Matmul::description() const {
  const size_t v = cublasLtGetVersion();
  return "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

void Matmul::destroy(Plan* plan) {
  if (plan->a != nullptr) cublasLtMatrixLayoutDestroy(plan->a);
  if (plan->b != nullptr) cublasLtMatrixLayoutDestroy(plan->b);
  if (plan->d != nullptr) cublasLtMatrixLayoutDestroy(plan->d);
  if (plan->desc != nullptr) cublasLtMatmulDescDestroy(plan->desc);
  *plan = Plan{};
}

Status Matmul::plan(const MatmulShape& s, int align_a, int align_b, int align_d,
                    size_t workspace_bytes, Plan* out) {
  Plan p;
  // Destroys what was made so far when a step fails.
  struct Cleanup {
    Plan* plan;
    bool keep = false;
    ~Cleanup() {
      if (!keep) Matmul::destroy(plan);
    }
  } cleanup{&p};

  SCIATTN_LT(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const int32_t trans_a = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SCIATTN_LT(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a),
      "transa");
  SCIATTN_LT(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b),
      "transb");
  if (s.bias) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    SCIATTN_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof epilogue),
               "epilogue");
    const int32_t bias_type = cuda_type(s.d_dtype);
    SCIATTN_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                              &bias_type, sizeof bias_type),
               "bias dtype");
    // The heuristic reads the bias pointer's value for its alignment only: a stand-in aligned to
    // exactly 16 bytes makes it choose an algorithm every 16-byte aligned bias can use.
    const void* stand_in = reinterpret_cast<const void*>(uintptr_t{16});
    SCIATTN_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &stand_in,
                                              sizeof stand_in),
               "bias pointer");
  }
  const cudaDataType_t ab = cuda_type(s.ab_dtype), dt = cuda_type(s.d_dtype);
  SCIATTN_LT(
      cublasLtMatrixLayoutCreate(&p.a, ab, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda),
      "layout of A");
  SCIATTN_LT(
      cublasLtMatrixLayoutCreate(&p.b, ab, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb),
      "layout of B");
  SCIATTN_LT(cublasLtMatrixLayoutCreate(&p.d, dt, s.m, s.n, s.ldd), "layout of D");

  cublasLtMatmulPreference_t pref = nullptr;
  SCIATTN_LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } pref_guard{pref};
  const uint64_t ws = workspace_bytes;
  const uint32_t aa = static_cast<uint32_t>(align_a), ba = static_cast<uint32_t>(align_b),
                 da = static_cast<uint32_t>(align_d);
  // Split-K parts are added in fp32 in the workspace; "in place" and "output type" reductions
  // would add them in D's type (16-bit for activations).
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  SCIATTN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws),
             "workspace preference");
  SCIATTN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &aa, sizeof aa),
             "alignment of A");
  SCIATTN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &ba, sizeof ba),
             "alignment of B");
  SCIATTN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &da, sizeof da),
             "alignment of C");
  SCIATTN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &da, sizeof da),
             "alignment of D");
  SCIATTN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &reductions, sizeof reductions),
             "reduction schemes");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  SCIATTN_LT(
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found),
      "heuristic");
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    return Status(StatusCode::kNotSupported,
                  "cuBLASLt has no algorithm for a product of m " + std::to_string(s.m) + ", n " +
                      std::to_string(s.n) + ", k " + std::to_string(s.k) + " (" +
                      dtype_name(s.ab_dtype) + " operands, " + dtype_name(s.d_dtype) + " output)");
  }
  p.algo = result.algo;
  p.workspace = result.workspaceSize;
  cleanup.keep = true;
  *out = p;
  return Status::ok_status();
}

Status Matmul::run(const MatmulShape& s, const void* a, const void* b, void* d, const void* bias,
                   float beta, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (s.m == 0 || s.n == 0) return Status::ok_status();
  if (s.k == 0) {
    return Status(StatusCode::kInternal,
                  "a product with an empty inner dimension reached cuBLASLt");
  }
  const int align_a = alignment_class(a), align_b = alignment_class(b),
            align_d = alignment_class(d);
  const Key key{s.trans_a,
                s.trans_b,
                s.m,
                s.n,
                s.k,
                s.lda,
                s.ldb,
                s.ldd,
                static_cast<int>(s.ab_dtype),
                static_cast<int>(s.d_dtype),
                s.bias,
                align_a,
                align_b,
                align_d,
                workspace_bytes};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan p;
    SCIATTN_TRY(plan(s, align_a, align_b, align_d, workspace_bytes, &p));
    it = plans_.emplace(key, p).first;
  }
  const Plan& p = it->second;
  if (s.bias) {
    SCIATTN_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias),
               "bias pointer");
  }
  const float alpha = 1.0f;
  SCIATTN_LT(cublasLtMatmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo,
                            workspace, p.workspace, stream),
             "matmul");
  return Status::ok_status();
}

}  // namespace sciattn::train::cuda

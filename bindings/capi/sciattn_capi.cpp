// A small C ABI over the Evoformer API for ctypes users (the peer-comparison script on the GPU
// machine, until the Python package exists). Bindings layer: contiguous [B, N, L, H, D] tensors
// only, errors as a return code plus a message.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "sciattn/evoformer.h"

namespace {

using namespace sciattn;

// dtype codes of the C ABI: 0 = f32, 1 = f16, 2 = bf16, 3 = bool; -1 = tensor absent.
bool to_dtype(int code, DType* out) {
  if (code < 0 || code > 3) return false;
  *out = static_cast<DType>(code);
  return true;
}

TensorView view(const void* data, int dtype_code, Device device,
                std::initializer_list<int64_t> sizes) {
  DType dtype = DType::kF32;
  if (data == nullptr || !to_dtype(dtype_code, &dtype)) return TensorView{};
  return TensorView::contiguous(data, dtype, sizes, device);
}

int fail(const Status& s, char* error, size_t error_bytes) {
  if (error != nullptr && error_bytes > 0)
    std::snprintf(error, error_bytes, "%s", s.to_string().c_str());
  return static_cast<int>(s.code());
}

struct Problem {
  int64_t B, N, L, H, D;
  int dtype;
  Device device;
  float scale;  // NaN means the default 1/sqrt(D)
};

EvoformerOptions options(const Problem& p) {
  EvoformerOptions o;
  if (!std::isnan(p.scale)) o.scale = p.scale;
  return o;
}

}  // namespace

extern "C" {

#define SCIATTN_FORWARD_ARGS                                                                 \
  int64_t B, int64_t N, int64_t L, int64_t H, int64_t D, int dtype, int device, float scale, \
      const void *q, const void *k, const void *v, const void *bias1, int bias1_dtype,       \
      const void *bias2, int bias2_dtype, void *out, float *lse

static EvoformerForwardParams forward_params(SCIATTN_FORWARD_ARGS) {
  const Problem pr{B, N, L, H, D, dtype, device == 1 ? Device::kCuda : Device::kCpu, scale};
  EvoformerForwardParams p;
  p.q = view(q, dtype, pr.device, {B, N, L, H, D});
  p.k = view(k, dtype, pr.device, {B, N, L, H, D});
  p.v = view(v, dtype, pr.device, {B, N, L, H, D});
  p.bias1 = view(bias1, bias1_dtype, pr.device, {B, N, 1, 1, L});
  p.bias2 = view(bias2, bias2_dtype, pr.device, {B, 1, H, L, L});
  p.out = view(out, dtype, pr.device, {B, N, L, H, D});
  p.lse = view(lse, 0, pr.device, {B * N, H, L});
  p.options = options(pr);
  return p;
}

// Workspace bytes the forward needs for exactly these arguments (0 if they are rejected; on the
// GPU, nonzero only for a bias whose rows are not 16-byte aligned, which it copies).
size_t sciattn_evoformer_forward_workspace_size(SCIATTN_FORWARD_ARGS) {
  return workspace_size(forward_params(B, N, L, H, D, dtype, device, scale, q, k, v, bias1,
                                       bias1_dtype, bias2, bias2_dtype, out, lse));
}

// Forward. device: 0 = cpu, 1 = cuda. lse may be null. Returns 0 on success.
int sciattn_evoformer_forward(SCIATTN_FORWARD_ARGS, void* workspace, size_t workspace_bytes,
                              void* stream, char* error, size_t error_bytes) {
  const EvoformerForwardParams p = forward_params(B, N, L, H, D, dtype, device, scale, q, k, v,
                                                  bias1, bias1_dtype, bias2, bias2_dtype, out, lse);
  const Status s = run(p, workspace, workspace_bytes, Stream{stream});
  return s.ok() ? 0 : fail(s, error, error_bytes);
}

#define SCIATTN_BACKWARD_ARGS                                                                  \
  int64_t B, int64_t N, int64_t L, int64_t H, int64_t D, int dtype, int device, float scale,   \
      const void *q, const void *k, const void *v, const void *bias1, int bias1_dtype,         \
      const void *bias2, int bias2_dtype, const void *out, const float *lse, const void *dout, \
      void *dq, void *dk, void *dv, void *dbias1, void *dbias2

static EvoformerBackwardParams backward_params(SCIATTN_BACKWARD_ARGS) {
  const Problem pr{B, N, L, H, D, dtype, device == 1 ? Device::kCuda : Device::kCpu, scale};
  EvoformerBackwardParams p;
  p.q = view(q, dtype, pr.device, {B, N, L, H, D});
  p.k = view(k, dtype, pr.device, {B, N, L, H, D});
  p.v = view(v, dtype, pr.device, {B, N, L, H, D});
  p.bias1 = view(bias1, bias1_dtype, pr.device, {B, N, 1, 1, L});
  p.bias2 = view(bias2, bias2_dtype, pr.device, {B, 1, H, L, L});
  p.out = view(out, dtype, pr.device, {B, N, L, H, D});
  p.lse = view(lse, 0, pr.device, {B * N, H, L});
  p.dout = view(dout, dtype, pr.device, {B, N, L, H, D});
  p.dq = view(dq, dtype, pr.device, {B, N, L, H, D});
  p.dk = view(dk, dtype, pr.device, {B, N, L, H, D});
  p.dv = view(dv, dtype, pr.device, {B, N, L, H, D});
  p.dbias1 = view(dbias1, bias1_dtype, pr.device, {B, N, 1, 1, L});
  p.dbias2 = view(dbias2, bias2_dtype, pr.device, {B, 1, H, L, L});
  p.options = options(pr);
  return p;
}

// Workspace bytes the backward needs for exactly these arguments (0 if they are rejected).
size_t sciattn_evoformer_backward_workspace_size(SCIATTN_BACKWARD_ARGS) {
  return workspace_size(backward_params(B, N, L, H, D, dtype, device, scale, q, k, v, bias1,
                                        bias1_dtype, bias2, bias2_dtype, out, lse, dout, dq, dk, dv,
                                        dbias1, dbias2));
}

int sciattn_evoformer_backward(SCIATTN_BACKWARD_ARGS, void* workspace, size_t workspace_bytes,
                               void* stream, char* error, size_t error_bytes) {
  const EvoformerBackwardParams p =
      backward_params(B, N, L, H, D, dtype, device, scale, q, k, v, bias1, bias1_dtype, bias2,
                      bias2_dtype, out, lse, dout, dq, dk, dv, dbias1, dbias2);
  const Status s = run(p, workspace, workspace_bytes, Stream{stream});
  return s.ok() ? 0 : fail(s, error, error_bytes);
}

}  // extern "C"

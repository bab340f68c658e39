// Validation of Evoformer attention Params (see evoformer_checks.h). Host-only common layer.
#include "common/evoformer_checks.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/status_try.h"
#include "common/tensor_checks.h"

namespace sciattn::detail {
namespace {

constexpr const char* kQkvShape = "[B, N, L, H, D]";
constexpr const char* kBias1Shape = "[B, N, 1, 1, L]";
constexpr const char* kBias2Shape = "[B, 1, H, L, L]";
constexpr const char* kLseShape = "[B*N, H, L]";

// Reads B, N, L, H, D off q and checks q itself.
Status check_q(const TensorView& q, EvoformerShape* s) {
  if (q.data == nullptr) return Status::invalid_argument("q is required but is a null pointer");
  if (q.rank != 5) {
    return Status::invalid_argument(std::string("q must have rank 5 ") + kQkvShape + "; got rank " +
                                    std::to_string(q.rank));
  }
  static const char* kDimNames[5] = {"B", "N", "L", "H", "D"};
  for (int d = 0; d < 5; ++d) {
    if (q.sizes[d] < 1) {
      return Status::invalid_argument("q has size " + std::to_string(q.sizes[d]) + " for " +
                                      kDimNames[d] + " in " + kQkvShape + " (shape " +
                                      q.shape_string() + "); every size must be >= 1");
    }
  }
  *s = {q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3], q.sizes[4]};
  int64_t scores = 0;
  if (!checked_product({s->batch, s->n, s->heads, s->len, s->len}, &scores)) {
    return Status::invalid_argument("q has shape " + q.shape_string() +
                                    ": B*N*H*L*L overflows int64; the problem is too large");
  }
  // The workspaces hold at most a few 4-byte values per score (the reference's scores and their
  // gradients, dbias2's per-chunk partials: chunks <= N) and per element of D rounded up to 16
  // (the CUDA path's staged copies), so that 64 bytes for each keeps every size an int64. Views
  // with zero strides can describe such shapes without the memory; no real problem comes near.
  int64_t bytes = 0;
  if (!checked_product({scores, 64}, &bytes) ||
      !checked_product({s->batch, s->n, s->len, s->heads, s->dim + 15, 64}, &bytes)) {
    return Status::invalid_argument("q has shape " + q.shape_string() +
                                    ": the problem is too large (its workspace would need more "
                                    "than 2^63 bytes; B*N*H*L*L and B*N*L*H*D must stay below "
                                    "2^57)");
  }
  return check_tensor(q, "q", kQkvShape, {s->batch, s->n, s->len, s->heads, s->dim},
                      {DType::kF32, DType::kF16, DType::kBF16}, q.device);
}

// Checks everything the forward and backward share: q, k, v, the biases and the options.
Status check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& bias1, const TensorView& bias2,
                    const EvoformerOptions& options, EvoformerShape* s) {
  SCIATTN_TRY(check_q(q, s));
  const std::vector<int64_t> qkv = {s->batch, s->n, s->len, s->heads, s->dim};
  SCIATTN_TRY(check_tensor(k, "k", kQkvShape, qkv, {q.dtype}, q.device));
  SCIATTN_TRY(check_tensor(v, "v", kQkvShape, qkv, {q.dtype}, q.device));
  if (bias1.present()) {
    SCIATTN_TRY(check_tensor(bias1, "bias1", kBias1Shape, {s->batch, s->n, 1, 1, s->len},
                             {q.dtype, DType::kF32, DType::kBool}, q.device));
  }
  if (bias2.present()) {
    SCIATTN_TRY(check_tensor(bias2, "bias2", kBias2Shape, {s->batch, 1, s->heads, s->len, s->len},
                             {q.dtype, DType::kF32}, q.device));
  }
  if (options.scale.has_value() && !std::isfinite(*options.scale)) {
    return Status::invalid_argument("scale must be a finite number (or unset for 1/sqrt(D)); got " +
                                    std::to_string(*options.scale));
  }
  if (options.num_threads < 0) {
    return Status::invalid_argument("num_threads must be >= 0 (0 = all hardware threads); got " +
                                    std::to_string(options.num_threads));
  }
  if (options.cpu_algorithm != EvoformerCpuAlgorithm::kTiled &&
      options.cpu_algorithm != EvoformerCpuAlgorithm::kReference) {
    return Status::invalid_argument("cpu_algorithm must be kTiled or kReference");
  }
  return Status::ok_status();
}

// An output: the shape/dtype checks plus distinct addresses.
Status check_output(const TensorView& t, const char* name, const char* symbolic,
                    const std::vector<int64_t>& sizes, std::initializer_list<DType> dtypes,
                    Device device) {
  SCIATTN_TRY(check_tensor(t, name, symbolic, sizes, dtypes, device));
  return check_non_overlapping(t, name);
}

struct Named {
  const TensorView* view;
  const char* name;
};

// Every output must be disjoint from every other tensor of the call.
Status check_outputs_disjoint(const std::vector<Named>& outputs, const std::vector<Named>& all) {
  for (const Named& out : outputs) {
    for (const Named& other : all) {
      if (other.view == out.view) continue;
      SCIATTN_TRY(check_disjoint(*out.view, out.name, *other.view, other.name));
    }
  }
  return Status::ok_status();
}

}  // namespace

float evoformer_scale(const EvoformerOptions& options, int64_t dim) {
  return options.scale.has_value() ? *options.scale
                                   : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
}

Status check_evoformer_forward(const EvoformerForwardParams& p, EvoformerShape* shape) {
  EvoformerShape s;
  SCIATTN_TRY(check_inputs(p.q, p.k, p.v, p.bias1, p.bias2, p.options, &s));
  const std::vector<int64_t> qkv = {s.batch, s.n, s.len, s.heads, s.dim};
  SCIATTN_TRY(check_output(p.out, "out", kQkvShape, qkv, {p.q.dtype}, p.q.device));
  if (p.lse.present()) {
    SCIATTN_TRY(check_output(p.lse, "lse", kLseShape, {s.batch * s.n, s.heads, s.len},
                             {DType::kF32}, p.q.device));
  }
  SCIATTN_TRY(check_outputs_disjoint({{&p.out, "out"}, {&p.lse, "lse"}}, {{&p.q, "q"},
                                                                          {&p.k, "k"},
                                                                          {&p.v, "v"},
                                                                          {&p.bias1, "bias1"},
                                                                          {&p.bias2, "bias2"},
                                                                          {&p.out, "out"},
                                                                          {&p.lse, "lse"}}));
  *shape = s;
  return Status::ok_status();
}

Status check_evoformer_backward(const EvoformerBackwardParams& p, EvoformerShape* shape) {
  EvoformerShape s;
  SCIATTN_TRY(check_inputs(p.q, p.k, p.v, p.bias1, p.bias2, p.options, &s));
  const std::vector<int64_t> qkv = {s.batch, s.n, s.len, s.heads, s.dim};
  const DType dt = p.q.dtype;
  const Device dev = p.q.device;
  SCIATTN_TRY(check_tensor(p.out, "out", kQkvShape, qkv, {dt}, dev));
  SCIATTN_TRY(
      check_tensor(p.lse, "lse", kLseShape, {s.batch * s.n, s.heads, s.len}, {DType::kF32}, dev));
  SCIATTN_TRY(check_tensor(p.dout, "dout", kQkvShape, qkv, {dt}, dev));
  SCIATTN_TRY(check_output(p.dq, "dq", kQkvShape, qkv, {dt}, dev));
  SCIATTN_TRY(check_output(p.dk, "dk", kQkvShape, qkv, {dt}, dev));
  SCIATTN_TRY(check_output(p.dv, "dv", kQkvShape, qkv, {dt}, dev));
  if (p.dbias1.present()) {
    if (!p.bias1.present()) {
      return Status::invalid_argument(
          "dbias1 is requested but bias1 is absent; pass bias1 or "
          "leave dbias1 null");
    }
    if (p.bias1.dtype == DType::kBool) {
      return Status::invalid_argument(
          "dbias1 is requested but bias1 is a boolean mask, which has "
          "no gradient; leave dbias1 null or pass a float bias1");
    }
    SCIATTN_TRY(check_output(p.dbias1, "dbias1", kBias1Shape, {s.batch, s.n, 1, 1, s.len},
                             {p.bias1.dtype}, dev));
  }
  if (p.dbias2.present()) {
    if (!p.bias2.present()) {
      return Status::invalid_argument(
          "dbias2 is requested but bias2 is absent; pass bias2 or "
          "leave dbias2 null");
    }
    SCIATTN_TRY(check_output(p.dbias2, "dbias2", kBias2Shape, {s.batch, 1, s.heads, s.len, s.len},
                             {p.bias2.dtype}, dev));
  }
  SCIATTN_TRY(check_outputs_disjoint(
      {{&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}, {&p.dbias1, "dbias1"}, {&p.dbias2, "dbias2"}},
      {{&p.q, "q"},
       {&p.k, "k"},
       {&p.v, "v"},
       {&p.bias1, "bias1"},
       {&p.bias2, "bias2"},
       {&p.out, "out"},
       {&p.lse, "lse"},
       {&p.dout, "dout"},
       {&p.dq, "dq"},
       {&p.dk, "dk"},
       {&p.dv, "dv"},
       {&p.dbias1, "dbias1"},
       {&p.dbias2, "dbias2"}}));
  *shape = s;
  return Status::ok_status();
}

}  // namespace sciattn::detail

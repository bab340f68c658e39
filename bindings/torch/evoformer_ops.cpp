// The Evoformer attention ops of the torch binding: evoformer_fwd and evoformer_bwd, their schemas
// and their CPU and CUDA kernels, which turn tensors into the library's Params (float64 goes to
// the ATen path of fp64.cpp, for gradcheck). Their autograd is in autograd.cpp. Binding layer.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "fp64.h"
#include "kernel_registry.h"
#include "sciattn/evoformer.h"
#include "tensor_args.h"

namespace sciattn::torch_ext {
namespace {

std::tuple<at::Tensor, at::Tensor> evoformer_fwd(at::Tensor q, at::Tensor k, at::Tensor v,
                                                 OptTensor bias1, OptTensor bias2,
                                                 std::optional<double> scale,
                                                 c10::string_view algorithm) {
  check_dim(q, 5, "q", "[B, N, L, H, D]");
  check_same_device(q, "q",
                    {{&k, "k"}, {&v, "v"}, {opt_ptr(bias1), "bias1"}, {opt_ptr(bias2), "bias2"}});
  const EvoformerCpuAlgorithm cpu_algorithm = evoformer_algorithm(algorithm);
  if (q.scalar_type() == at::kDouble) {
    return fp64::evoformer_fwd(q, k, v, bias1, bias2, scale);
  }
  const int64_t B = q.size(0), N = q.size(1), L = q.size(2), H = q.size(3);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({B * N, H, L}, q.options().dtype(at::kFloat));
  EvoformerForwardParams p;
  p.q = view_of(q, "q");
  p.k = view_of(k, "k");
  p.v = view_of(v, "v");
  p.bias1 = optional_view(bias1, "bias1");
  p.bias2 = optional_view(bias2, "bias2");
  p.out = view_of(out, "out");
  p.lse = view_of(lse, "lse");
  p.options.scale = scale_of(scale);
  p.options.num_threads = num_threads();
  p.options.cpu_algorithm = cpu_algorithm;
  run_op(p, q, "evoformer_attention");
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> evoformer_bwd(
    at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, OptTensor bias1, OptTensor bias2,
    at::Tensor out, at::Tensor lse, std::optional<double> scale, bool need_dbias1, bool need_dbias2,
    c10::string_view algorithm) {
  check_dim(q, 5, "q", "[B, N, L, H, D]");
  check_same_device(q, "q",
                    {{&dout, "dout"},
                     {&k, "k"},
                     {&v, "v"},
                     {opt_ptr(bias1), "bias1"},
                     {opt_ptr(bias2), "bias2"},
                     {&out, "out"},
                     {&lse, "lse"}});
  TORCH_CHECK_VALUE(!need_dbias1 || (bias1.has_value() && bias1->is_floating_point()),
                    "need_dbias1 needs a floating-point bias1");
  TORCH_CHECK_VALUE(!need_dbias2 || bias2.has_value(), "need_dbias2 needs bias2");
  const EvoformerCpuAlgorithm cpu_algorithm = evoformer_algorithm(algorithm);
  if (q.scalar_type() == at::kDouble) {
    return fp64::evoformer_bwd(dout, q, k, v, bias1, bias2, out, lse, scale, need_dbias1,
                               need_dbias2);
  }
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(q.sizes(), q.options());
  at::Tensor dv = at::empty(q.sizes(), q.options());
  at::Tensor dbias1 =
      need_dbias1 ? at::empty(bias1->sizes(), bias1->options()) : at::empty({0}, q.options());
  at::Tensor dbias2 =
      need_dbias2 ? at::empty(bias2->sizes(), bias2->options()) : at::empty({0}, q.options());
  EvoformerBackwardParams p;
  p.q = view_of(q, "q");
  p.k = view_of(k, "k");
  p.v = view_of(v, "v");
  p.bias1 = optional_view(bias1, "bias1");
  p.bias2 = optional_view(bias2, "bias2");
  p.out = view_of(out, "out");
  p.lse = view_of(lse, "lse");
  p.dout = view_of(dout, "dout");
  p.dq = view_of(dq, "dq");
  p.dk = view_of(dk, "dk");
  p.dv = view_of(dv, "dv");
  if (need_dbias1) p.dbias1 = view_of(dbias1, "dbias1");
  if (need_dbias2) p.dbias2 = view_of(dbias2, "dbias2");
  p.options.scale = scale_of(scale);
  p.options.num_threads = num_threads();
  p.options.cpu_algorithm = cpu_algorithm;
  run_op(p, q, "evoformer_attention (backward)");
  return {dq, dk, dv, dbias1, dbias2};
}

}  // namespace

void register_evoformer_kernels(torch::Library& m) {
  m.impl("evoformer_fwd", &evoformer_fwd);
  m.impl("evoformer_bwd", &evoformer_bwd);
}

}  // namespace sciattn::torch_ext

// Outputs a call does not need (a bias gradient nobody asked for) are empty tensors of shape [0];
// the Python side turns them into None.
TORCH_LIBRARY_FRAGMENT(sciattn, m) {
  m.def(
      "evoformer_fwd(Tensor q, Tensor k, Tensor v, Tensor? bias1, Tensor? bias2, float? scale, "
      "str algorithm=\"tiled\") -> (Tensor, Tensor)");
  m.def(
      "evoformer_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor? bias1, Tensor? bias2, "
      "Tensor out, Tensor lse, float? scale, bool need_dbias1, bool need_dbias2, "
      "str algorithm=\"tiled\") -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

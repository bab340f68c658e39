// Autograd for the two attention ops, in C++: evoformer_fwd and sparse_attention_fwd get an
// Autograd-key kernel (a torch::autograd::Function) whose backward calls evoformer_bwd /
// sparse_attention_bwd. Binding layer.
//
// Why C++ and not torch.library.register_autograd: the Python formula ran Python on every call
// (setup_context, the backward function, and autograd's zero tensor for the unused lse gradient),
// about 0.3 ms of host time per forward + backward on the H200 machine, more than the kernels of
// a 256-residue triangle attention, so the GPU waited for it.
// The fake (meta) kernels stay in Python (sciattn/_ops.py); the composite block-sparse ops
// (bsmm, bs_softmax) keep their Python formulas.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

namespace sciattn::torch_ext {
namespace {

using OptTensor = std::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The operator handle of `name` (a schema of the sciattn library: evoformer_ops.cpp,
// block_sparse_ops.cpp).
template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Index among the forward's tensor inputs that autograd tracks (present ones only) of each
// argument, -1 for an absent optional: AutogradContext::needs_input_grad counts those.
struct InputEdges {
  int64_t next = 0;
  int64_t of(const at::Tensor&) { return next++; }
  int64_t of(const OptTensor& t) { return t.has_value() && t->defined() ? next++ : -1; }
};

bool needs_grad(const AutogradContext* ctx, const char* key) {
  const int64_t edge = ctx->saved_data.at(key).toInt();
  return edge >= 0 && ctx->needs_input_grad(static_cast<size_t>(edge));
}

at::Tensor grad_if(bool needed, const at::Tensor& g) {
  return needed ? g : at::Tensor();
}

// A backward op's call as an autograd node of its own, used when autograd records the backward
// (torch.autograd.grad or .backward with create_graph=True): the gradients it returns are correct,
// and differentiating them again raises. Without it they would come from an op with no autograd
// kernel, which torch differentiates as a constant with only a warning: a second derivative
// silently missing. `inputs`: the tensors the gradients depend on (for autograd's edges);
// `call` runs the op.
class BackwardOpNode : public torch::autograd::Function<BackwardOpNode> {
 public:
  template <typename Call, typename... Inputs>
  static variable_list forward(AutogradContext* ctx, const char* op, const Call& call,
                               const Inputs&... /* autograd's edges only */) {
    ctx->saved_data["op"] = std::string(op);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call();
  }

  static variable_list backward(AutogradContext* ctx, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "sciattn.", ctx->saved_data["op"].toStringRef(),
                                ": the gradients are not differentiable (no second derivative; "
                                "create_graph=True gives correct first derivatives, but "
                                "backpropagating through them is not supported)");
    return {};
  }
};

// Runs `call` (a backward op) directly, or as a BackwardOpNode when grad mode is on (the backward
// is being recorded).
template <typename Call, typename... Inputs>
variable_list run_backward_op(const char* op, const Call& call, const Inputs&... inputs) {
  if (!at::GradMode::is_enabled()) return call();
  return BackwardOpNode::apply(op, call, inputs...);
}

// ---- Evoformer ------------------------------------------------------------------------------

// The C++ signatures of the CPU and CUDA kernels in evoformer_ops.cpp (the dispatcher wants every
// kernel of an op, and every typed handle, to use the same one).
using EvoformerFwdSig = std::tuple<at::Tensor, at::Tensor>(at::Tensor, at::Tensor, at::Tensor,
                                                           OptTensor, OptTensor,
                                                           std::optional<double>, c10::string_view);
using EvoformerBwdSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    at::Tensor, at::Tensor, at::Tensor, at::Tensor, OptTensor, OptTensor, at::Tensor, at::Tensor,
    std::optional<double>, bool, bool, c10::string_view);

class EvoformerFunction : public torch::autograd::Function<EvoformerFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const OptTensor& bias1, const OptTensor& bias2,
                               std::optional<double> scale, c10::string_view algorithm) {
    static const auto evoformer_fwd_op = op_handle<EvoformerFwdSig>("sciattn::evoformer_fwd");
    at::Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, lse) = evoformer_fwd_op.call(q, k, v, bias1, bias2, scale, algorithm);
    }
    InputEdges edges;
    ctx->saved_data["q"] = edges.of(q);
    ctx->saved_data["k"] = edges.of(k);
    ctx->saved_data["v"] = edges.of(v);
    // A boolean mask has no gradient; a float bias1 does when it requires one.
    const int64_t bias1_edge = edges.of(bias1);
    ctx->saved_data["bias1"] = bias1_edge >= 0 && bias1->is_floating_point() ? bias1_edge : -1;
    ctx->saved_data["bias2"] = edges.of(bias2);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["algorithm"] = std::string(algorithm);
    ctx->save_for_backward(
        {q, k, v, bias1.value_or(at::Tensor()), bias2.value_or(at::Tensor()), out, lse});
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // no zero tensor for lse's (unused) gradient
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto evoformer_bwd_op = op_handle<EvoformerBwdSig>("sciattn::evoformer_bwd");
    const variable_list none(7);
    const at::Tensor& dout = grads[0];
    if (!dout.defined()) return none;
    const variable_list saved = ctx->get_saved_variables();
    const auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; };
    const bool need_b1 = needs_grad(ctx, "bias1");
    const bool need_b2 = needs_grad(ctx, "bias2");
    const auto scale = ctx->saved_data["scale"].toOptional<double>();
    const std::string& algorithm = ctx->saved_data["algorithm"].toStringRef();
    const variable_list g = run_backward_op(
        "evoformer_attention (backward)",
        [&]() -> variable_list {
          auto [dq, dk, dv, db1, db2] = evoformer_bwd_op.call(
              dout, saved[0], saved[1], saved[2], opt(saved[3]), opt(saved[4]), saved[5], saved[6],
              scale, need_b1, need_b2, algorithm);
          return {dq, dk, dv, db1, db2};
        },
        dout, saved[0], saved[1], saved[2], opt(saved[3]), opt(saved[4]));
    return {grad_if(needs_grad(ctx, "q"), g[0]),
            grad_if(needs_grad(ctx, "k"), g[1]),
            grad_if(needs_grad(ctx, "v"), g[2]),
            grad_if(need_b1, g[3]),
            grad_if(need_b2, g[4]),
            at::Tensor(),
            at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> evoformer_fwd_autograd(at::Tensor q, at::Tensor k, at::Tensor v,
                                                          OptTensor bias1, OptTensor bias2,
                                                          std::optional<double> scale,
                                                          c10::string_view algorithm) {
  const variable_list r = EvoformerFunction::apply(q, k, v, bias1, bias2, scale, algorithm);
  return {r[0], r[1]};
}

// ---- Block-sparse fused attention -----------------------------------------------------------

// ... and of the kernels in block_sparse_ops.cpp.
using SparseFwdSig = std::tuple<at::Tensor, at::Tensor>(
    at::Tensor, at::Tensor, at::Tensor, const at::Tensor&, int64_t, int64_t, OptTensor, OptTensor,
    OptTensor, std::optional<double>, bool, c10::string_view, c10::string_view, c10::string_view);
using SparseBwdSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, const at::Tensor&,
    int64_t, int64_t, OptTensor, OptTensor, OptTensor, std::optional<double>, bool,
    c10::string_view, c10::string_view, c10::string_view);

class SparseAttentionFunction : public torch::autograd::Function<SparseAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& layout, int64_t block,
                               int64_t nnz, const OptTensor& rpe, const OptTensor& key_padding_mask,
                               const OptTensor& attn_mask, std::optional<double> scale, bool causal,
                               c10::string_view key_padding_mask_mode,
                               c10::string_view attn_mask_mode, c10::string_view algorithm) {
    static const auto sparse_attention_fwd_op =
        op_handle<SparseFwdSig>("sciattn::sparse_attention_fwd");
    at::Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, lse) = sparse_attention_fwd_op.call(
          q, k, v, layout, block, nnz, rpe, key_padding_mask, attn_mask, scale, causal,
          key_padding_mask_mode, attn_mask_mode, algorithm);
    }
    InputEdges edges;
    ctx->saved_data["q"] = edges.of(q);
    ctx->saved_data["k"] = edges.of(k);
    ctx->saved_data["v"] = edges.of(v);
    ctx->saved_data["block"] = block;
    ctx->saved_data["nnz"] = nnz;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["key_padding_mask_mode"] = std::string(key_padding_mask_mode);
    ctx->saved_data["attn_mask_mode"] = std::string(attn_mask_mode);
    ctx->saved_data["algorithm"] = std::string(algorithm);
    ctx->save_for_backward({q, k, v, out, lse, layout, rpe.value_or(at::Tensor()),
                            key_padding_mask.value_or(at::Tensor()),
                            attn_mask.value_or(at::Tensor())});
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto sparse_attention_bwd_op =
        op_handle<SparseBwdSig>("sciattn::sparse_attention_bwd");
    variable_list result(14);
    const at::Tensor& dout = grads[0];
    if (!dout.defined()) return result;
    const variable_list s = ctx->get_saved_variables();
    const auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; };
    const auto& d = ctx->saved_data;
    const variable_list g = run_backward_op(
        "SparseSelfAttention (backward)",
        [&]() -> variable_list {
          auto [dq, dk, dv] = sparse_attention_bwd_op.call(
              dout, s[0], s[1], s[2], s[3], s[4], s[5], d.at("block").toInt(), d.at("nnz").toInt(),
              opt(s[6]), opt(s[7]), opt(s[8]), d.at("scale").toOptional<double>(),
              d.at("causal").toBool(), d.at("key_padding_mask_mode").toStringRef(),
              d.at("attn_mask_mode").toStringRef(), d.at("algorithm").toStringRef());
          return {dq, dk, dv};
        },
        dout, s[0], s[1], s[2], opt(s[6]));
    result[0] = grad_if(needs_grad(ctx, "q"), g[0]);
    result[1] = grad_if(needs_grad(ctx, "k"), g[1]);
    result[2] = grad_if(needs_grad(ctx, "v"), g[2]);
    return result;
  }
};

std::tuple<at::Tensor, at::Tensor> sparse_attention_fwd_autograd(
    at::Tensor q, at::Tensor k, at::Tensor v, const at::Tensor& layout, int64_t block, int64_t nnz,
    OptTensor rpe, OptTensor key_padding_mask, OptTensor attn_mask, std::optional<double> scale,
    bool causal, c10::string_view key_padding_mask_mode, c10::string_view attn_mask_mode,
    c10::string_view algorithm) {
  const variable_list r = SparseAttentionFunction::apply(
      q, k, v, layout, block, nnz, rpe, key_padding_mask, attn_mask, scale, causal,
      key_padding_mask_mode, attn_mask_mode, algorithm);
  return {r[0], r[1]};
}

}  // namespace
}  // namespace sciattn::torch_ext

TORCH_LIBRARY_IMPL(sciattn, Autograd, m) {
  using namespace sciattn::torch_ext;
  m.impl("evoformer_fwd", &evoformer_fwd_autograd);
  m.impl("sparse_attention_fwd", &sparse_attention_fwd_autograd);
}

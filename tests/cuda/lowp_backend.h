// lowp_ref for the trainer's GPU tests: the CPU back end's layers with their results rounded
// where the CUDA back end stores them in its 16-bit compute dtype (activations and activation
// gradients; weight gradients and statistics stay f32), the attention run by sciattn's CPU op in
// that dtype (it rounds what the GPU kernels round), and the LM head with its logits and their
// gradient rounded (lm_head_lowp). A GptModel on LowpCpuBackend, with weights rounded to the
// dtype, is the lowp_ref of a whole GPU step in the tolerance rule; the plain CPU back end on the
// same rounded weights is its ref64. Test layer (tests/cuda).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/train_cuda_test_util.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/train/backend.h"
#include "train/train_test_util.h"

namespace sciattn::train::testing {

// sciattn's sparse attention op on the CPU in `dtype`, on copies padded to the index's length as
// the back ends pad them: lowp_ref of the attention (the op rounds what the GPU kernels round).
struct AttentionResult {
  std::vector<float> out, lse, dqkv;
};
inline AttentionResult cpu_attention_in(DType dtype, const BlockSparseIndex& index,
                                        const std::vector<float>& qkv,
                                        const std::vector<float>& dout, int64_t B, int64_t L,
                                        int64_t H, int64_t D) {
  const int64_t C = H * D, Lp = index.num_row_blocks * index.block;
  const size_t es = dtype_size(dtype);
  auto buffer = [&](int64_t n) { return std::vector<std::byte>(static_cast<size_t>(n) * es); };
  std::vector<std::byte> qkv_p = buffer(B * Lp * 3 * C), out_p = buffer(B * Lp * C),
                         dout_p = buffer(B * Lp * C), dq = buffer(B * Lp * C),
                         dk = buffer(B * Lp * C), dv = buffer(B * Lp * C);
  std::vector<float> lse(static_cast<size_t>(B * H * Lp));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t c = 0; c < 3 * C; ++c) {
        store_from_float(qkv_p.data(), dtype, (b * Lp + l) * 3 * C + c,
                         qkv[static_cast<size_t>((b * L + l) * 3 * C + c)]);
      }
      for (int64_t c = 0; c < C; ++c) {
        store_from_float(dout_p.data(), dtype, (b * Lp + l) * C + c,
                         dout[static_cast<size_t>((b * L + l) * C + c)]);
      }
    }
  }
  auto bhld = [&](std::vector<std::byte>& v, int64_t offset, int64_t row) {
    return TensorView::strided(v.data() + static_cast<size_t>(offset) * es, dtype, {B, H, Lp, D},
                               {Lp * row, D, row, 1});
  };
  SparseAttentionForwardParams f;
  f.index = &index;
  f.options.causal = true;
  f.q = bhld(qkv_p, 0, 3 * C);
  f.k = bhld(qkv_p, C, 3 * C);
  f.v = bhld(qkv_p, 2 * C, 3 * C);
  f.out = bhld(out_p, 0, C);
  f.lse = TensorView::contiguous(lse.data(), DType::kF32, {B, H, Lp});
  std::vector<std::byte> ws(workspace_size(f));
  Status s = run(f, ws.data(), ws.size());
  EXPECT_TRUE(s.ok()) << s.to_string();
  SparseAttentionBackwardParams g;
  g.index = &index;
  g.options.causal = true;
  g.q = f.q;
  g.k = f.k;
  g.v = f.v;
  g.out = f.out;
  g.lse = f.lse;
  g.dout = bhld(dout_p, 0, C);
  g.dq = bhld(dq, 0, C);
  g.dk = bhld(dk, 0, C);
  g.dv = bhld(dv, 0, C);
  ws.assign(workspace_size(g), std::byte{0});
  s = run(g, ws.data(), ws.size());
  EXPECT_TRUE(s.ok()) << s.to_string();
  AttentionResult r;
  r.out.resize(static_cast<size_t>(B * L * C));
  r.dqkv.resize(static_cast<size_t>(B * L * 3 * C));
  r.lse = lse;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t from = (b * Lp + l) * C + c;
        r.out[static_cast<size_t>((b * L + l) * C + c)] = load_as_float(out_p.data(), dtype, from);
        float* d = r.dqkv.data() + (b * L + l) * 3 * C + c;
        d[0] = load_as_float(dq.data(), dtype, from);
        d[C] = load_as_float(dk.data(), dtype, from);
        d[2 * C] = load_as_float(dv.data(), dtype, from);
      }
    }
  }
  return r;
}

// lowp_ref of the LM head in a 16-bit dtype: the CPU's logits rounded to it (the GPU keeps its
// logits in the compute dtype), the cross-entropy in fp64, the logits' gradient rounded, then the
// CPU's products for din and dweight.
struct LmResult {
  std::vector<float> losses, din, dweight;
};
inline LmResult lm_head_lowp(Backend& cpu, DType dtype, std::vector<float> x, std::vector<float> w,
                             const std::vector<int32_t>& targets, std::vector<float> dweight0,
                             int64_t N, int64_t C, int64_t V, float grad_scale) {
  std::vector<float> logits(static_cast<size_t>(N * V));
  EXPECT_TRUE(
      cpu.linear_forward({view(x, {N, C}), view(w, {V, C}), TensorView{}, view(logits, {N, V})})
          .ok());
  logits = rounded(logits, dtype);
  LmResult r;
  r.losses.resize(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) {
    float* l = logits.data() + t * V;
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    const double lse = mx + std::log(sum);
    r.losses[static_cast<size_t>(t)] = static_cast<float>(lse - l[targets[static_cast<size_t>(t)]]);
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(l[v] - mx) / sum;
      l[v] = round_to(dtype, static_cast<float>(
                                 grad_scale * (v == targets[static_cast<size_t>(t)] ? p - 1 : p)));
    }
  }
  r.din.resize(static_cast<size_t>(N * C));
  r.dweight = std::move(dweight0);
  EXPECT_TRUE(cpu.linear_backward({view(x, {N, C}), view(w, {V, C}), view(logits, {N, V}),
                                   view(r.din, {N, C}), view(r.dweight, {V, C}), TensorView{}})
                  .ok());
  r.din = rounded(r.din, dtype);
  return r;
}

// The CPU back end with the GPU's roundings (see the top of this file). Views are f32 host
// tensors, as on the CPU back end; compute_dtype() says f32 (what the views hold), rounding_dtype()
// what the values are rounded to.
class LowpCpuBackend final : public Backend {
 public:
  LowpCpuBackend(std::unique_ptr<Backend> cpu, DType dtype) : cpu_(std::move(cpu)), t_(dtype) {}

  DType rounding_dtype() const { return t_; }

  Device device() const override { return cpu_->device(); }
  DType compute_dtype() const override { return DType::kF32; }
  std::string description() const override {
    return cpu_->description() + ", rounded to " + dtype_name(t_);
  }
  int64_t token_chunk() const override { return cpu_->token_chunk(); }
  Status allocate(size_t bytes, void** ptr) override { return cpu_->allocate(bytes, ptr); }
  void release(void* ptr) override { cpu_->release(ptr); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    return cpu_->copy_to_device(dst, src, bytes);
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    return cpu_->copy_to_host(dst, src, bytes);
  }
  Status fill_zero(void* dst, size_t bytes) override { return cpu_->fill_zero(dst, bytes); }
  Status synchronize() override { return cpu_->synchronize(); }
  size_t scratch_bytes() const override { return cpu_->scratch_bytes(); }
  uint64_t peak_device_bytes() const override { return 0; }
  Status allocate_host(size_t bytes, void** ptr) override {
    return cpu_->allocate_host(bytes, ptr);
  }
  void release_host(void* ptr) override { cpu_->release_host(ptr); }
  Status copy_async(void* dst, const void* src, size_t bytes, CopyDirection d,
                    CopyTicket* ticket) override {
    return cpu_->copy_async(dst, src, bytes, d, ticket);
  }
  Status wait_for_copy(const CopyTicket& t) override { return cpu_->wait_for_copy(t); }
  Status finish_copy(const CopyTicket& t) override { return cpu_->finish_copy(t); }
  Status adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                    const float* grads, float* m, float* v, int64_t n, void* copy,
                    DType copy_dtype) override {
    return cpu_->adamw_step(h, step, grad_scale, params, grads, m, v, n, copy, copy_dtype);
  }
  Status sum_squares(const float* data, int64_t n, SumSquares* out) override {
    return cpu_->sum_squares(data, n, out);
  }
  Status scale_in_place(float* data, int64_t n, float factor) override {
    return cpu_->scale_in_place(data, n, factor);
  }
  Status cast(const void* src, DType st, void* dst, DType dt, int64_t n) override {
    return cpu_->cast(src, st, dst, dt, n);
  }
  Status prepare_index(BlockSparseIndex* index) override { return cpu_->prepare_index(index); }
  // Moves values without changing them: nothing to round.
  Status strided_copy(const StridedCopyParams& p) override { return cpu_->strided_copy(p); }

  Status embedding_forward(const EmbeddingParams& p) override {
    return round_after(cpu_->embedding_forward(p), p.out);
  }
  Status embedding_backward(const EmbeddingBackwardParams& p) override {
    return cpu_->embedding_backward(p);
  }
  Status layernorm_forward(const LayerNormParams& p) override {
    return round_after(cpu_->layernorm_forward(p), p.out);
  }
  Status layernorm_backward(const LayerNormBackwardParams& p) override {
    return round_after(cpu_->layernorm_backward(p), p.din);
  }
  Status linear_forward(const LinearParams& p) override {
    return round_after(cpu_->linear_forward(p), p.out);
  }
  Status linear_backward(const LinearBackwardParams& p) override {
    return round_after(cpu_->linear_backward(p), p.din);
  }
  Status gelu_forward(const GeluParams& p) override {
    return round_after(cpu_->gelu_forward(p), p.out);
  }
  Status gelu_backward(const GeluBackwardParams& p) override {
    return round_after(cpu_->gelu_backward(p), p.din);
  }
  Status rotary(const RotaryParams& p) override { return round_after(cpu_->rotary(p), p.qkv); }
  Status attention_forward(const AttentionParams& p) override {
    const int64_t B = p.qkv.sizes[0], L = p.qkv.sizes[1], H = p.qkv.sizes[3], D = p.qkv.sizes[4];
    const std::vector<float> qkv = values(p.qkv), dout(static_cast<size_t>(B * L * H * D), 0.0f);
    const AttentionResult r = cpu_attention_in(t_, *p.index, qkv, dout, B, L, H, D);
    std::copy(r.out.begin(), r.out.end(), static_cast<float*>(p.out.data));
    std::copy(r.lse.begin(), r.lse.end(), static_cast<float*>(p.lse.data));
    return Status::ok_status();
  }
  Status attention_backward(const AttentionBackwardParams& p) override {
    const int64_t B = p.qkv.sizes[0], L = p.qkv.sizes[1], H = p.qkv.sizes[3], D = p.qkv.sizes[4];
    const AttentionResult r =
        cpu_attention_in(t_, *p.index, values(p.qkv), values(p.dout), B, L, H, D);
    std::copy(r.dqkv.begin(), r.dqkv.end(), static_cast<float*>(p.dqkv.data));
    return Status::ok_status();
  }
  Status add(const AddParams& p) override { return round_after(cpu_->add(p), p.out); }
  Status lm_head_loss(const LmHeadParams& p) override {
    const int64_t N = p.in.sizes[0], C = p.in.sizes[1], V = p.weight.sizes[0];
    const bool grad = p.din.present();
    std::vector<float> dw0 =
        grad ? values(p.dweight) : std::vector<float>(static_cast<size_t>(V * C), 0.0f);
    const LmResult r = lm_head_lowp(*cpu_, t_, values(p.in), values(p.weight),
                                    targets(p.targets, N), std::move(dw0), N, C, V, p.grad_scale);
    std::copy(r.losses.begin(), r.losses.end(), static_cast<float*>(p.losses.data));
    if (grad) {
      std::copy(r.din.begin(), r.din.end(), static_cast<float*>(p.din.data));
      std::copy(r.dweight.begin(), r.dweight.end(), static_cast<float*>(p.dweight.data));
    }
    return Status::ok_status();
  }
  Status lm_head_forward(const LmHeadForwardParams& p) override {
    const int64_t N = p.in.sizes[0], C = p.in.sizes[1], V = p.weight.sizes[0];
    const LmResult r =
        lm_head_lowp(*cpu_, t_, values(p.in), values(p.weight), targets(p.targets, N),
                     std::vector<float>(static_cast<size_t>(V * C), 0.0f), N, C, V, 1.0f);
    std::copy(r.losses.begin(), r.losses.end(), static_cast<float*>(p.losses.data));
    // The logits as the GPU keeps them (the backward here recomputes its own).
    return round_after(cpu_->linear_forward({p.in, p.weight, TensorView{}, p.logits}), p.logits);
  }
  Status lm_head_backward(const LmHeadBackwardParams& p) override {
    const int64_t N = p.in.sizes[0], C = p.in.sizes[1], V = p.weight.sizes[0];
    const LmResult r =
        lm_head_lowp(*cpu_, t_, values(p.in), values(p.weight), targets(p.targets, N),
                     values(p.dweight), N, C, V, p.grad_scale);
    std::copy(r.din.begin(), r.din.end(), static_cast<float*>(p.din.data));
    std::copy(r.dweight.begin(), r.dweight.end(), static_cast<float*>(p.dweight.data));
    return Status::ok_status();
  }

 private:
  // Rounds a written f32 host view to the dtype, in place.
  Status round_after(Status s, const TensorView& t) const {
    if (!s.ok() || !t.present()) return s;
    float* x = static_cast<float*>(t.data);
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) x[i] = round_to(t_, x[i]);
    return s;
  }
  static std::vector<float> values(const TensorView& t) {
    const float* x = static_cast<const float*>(t.data);
    return std::vector<float>(x, x + t.numel());
  }
  static std::vector<int32_t> targets(const int32_t* p, int64_t n) {
    return std::vector<int32_t>(p, p + n);
  }

  std::unique_ptr<Backend> cpu_;
  DType t_;
};

}  // namespace sciattn::train::testing

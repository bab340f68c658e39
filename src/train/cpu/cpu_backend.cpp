// The CPU back end of the trainer: checks each call's TensorViews (fp32, host memory, packed,
// shapes that agree) and runs the layers of layers_cpu.h; attention goes through sciattn's sparse
// attention op. CPU layer of the trainer.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "common/status_try.h"
#include "sciattn/train/backend.h"
#include "train/backend_checks.h"
#include "train/cpu/blas.h"
#include "train/cpu/layers_cpu.h"

namespace sciattn::train {
namespace {

// A packed fp32 host tensor of exactly these sizes.
Status check(const char* call, const TensorView& t, const char* name,
             std::initializer_list<int64_t> sizes) {
  constexpr TensorRule kRule{Device::kCpu, "host memory for the CPU back end", DType::kF32,
                             " on the CPU back end"};
  return check_packed(call, t, name, kRule, sizes);
}

float* f(const TensorView& t) {
  return static_cast<float*>(t.data);
}

// Rows and columns of a rank-2 view (0 when the rank is not 2).
int64_t rows_of(const TensorView& t) {
  return t.rank == 2 ? t.sizes[0] : 0;
}
int64_t cols_of(const TensorView& t) {
  return t.rank == 2 ? t.sizes[1] : 0;
}

// Memory aligned to 64 bytes and zeroed.
void* aligned_zeroed(size_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return p;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {
    if (options_.threads > 0) {
      omp_set_num_threads(options_.threads);
      cpu::set_blas_threads(options_.threads);
    }
  }
  ~CpuBackend() override { std::free(scratch_); }

  Device device() const override { return Device::kCpu; }
  DType compute_dtype() const override { return DType::kF32; }
  std::string description() const override {
    return "cpu: " + std::to_string(omp_get_max_threads()) + " threads, " + cpu::blas_description();
  }
  int64_t token_chunk() const override { return options_.token_chunk; }

  Status allocate(size_t bytes, void** ptr) override {
    *ptr = aligned_zeroed(bytes);
    if (*ptr == nullptr) {
      return Status(StatusCode::kInvalidArgument,
                    "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    }
    return Status::ok_status();
  }
  void release(void* ptr) override { std::free(ptr); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok_status();
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok_status();
  }
  Status fill_zero(void* dst, size_t bytes) override {
    std::memset(dst, 0, bytes);
    return Status::ok_status();
  }
  Status synchronize() override { return Status::ok_status(); }
  size_t scratch_bytes() const override { return scratch_bytes_; }
  uint64_t peak_device_bytes() const override { return 0; }

  // Host memory is the back end's memory: "host" buffers are ordinary allocations and a copy is
  // a memcpy, done on return, so the offload techniques run here with the GPU's order of calls.
  Status allocate_host(size_t bytes, void** ptr) override { return allocate(bytes, ptr); }
  void release_host(void* ptr) override { release(ptr); }
  Status copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction,
                    CopyTicket* ticket) override {
    if (bytes > 0 && (dst == nullptr || src == nullptr)) {
      return Status::invalid_argument("copy_async: dst and src must not be null");
    }
    if (bytes > 0) std::memcpy(dst, src, bytes);
    if (ticket != nullptr) *ticket = CopyTicket{direction, 0};
    return Status::ok_status();
  }
  Status wait_for_copy(const CopyTicket&) override { return Status::ok_status(); }
  Status finish_copy(const CopyTicket&) override { return Status::ok_status(); }

  Status adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                    const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                    void* param_copy, DType copy_dtype) override {
    if (param_copy == nullptr) {
      return cpu_adamw_step(h, step, grad_scale, params, grads, exp_avg, exp_avg_sq, n);
    }
    return cpu_adamw_step_copy(h, step, grad_scale, params, grads, exp_avg, exp_avg_sq, n,
                               param_copy, copy_dtype);
  }
  Status sum_squares(const float* data, int64_t n, SumSquares* out) override {
    if (n < 0 || (n > 0 && data == nullptr)) {
      return Status::invalid_argument("sum_squares: data must hold n >= 0 floats");
    }
    *out = train::sum_squares(data, n);
    return Status::ok_status();
  }
  Status scale_in_place(float* data, int64_t n, float factor) override {
    if (n < 0 || (n > 0 && data == nullptr)) {
      return Status::invalid_argument("scale_in_place: data must hold n >= 0 floats");
    }
    train::scale_in_place(data, n, factor);
    return Status::ok_status();
  }
  Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) override {
    for (DType t : {src_dtype, dst_dtype}) {
      if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
        return Status::invalid_argument(std::string("cast: dtypes must be f32, f16 or bf16; got ") +
                                        dtype_name(t));
      }
    }
    if (n < 0 || (n > 0 && (src == nullptr || dst == nullptr))) {
      return Status::invalid_argument("cast: src and dst must hold n >= 0 elements");
    }
    if (src_dtype == dst_dtype) {
      std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_dtype));
      return Status::ok_status();
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      store_from_float(dst, dst_dtype, i, load_as_float(src, src_dtype, i));
    }
    return Status::ok_status();
  }

  Status embedding_forward(const EmbeddingParams& p) override {
    const char* call = "embedding_forward";
    const int64_t V = rows_of(p.wte), C = cols_of(p.wte);
    SCIATTN_TRY(check(call, p.wte, "wte", {V, C}));
    SCIATTN_TRY(check(call, p.out, "out", {p.batch * p.seq_len, C}));
    if (p.wpe.present()) SCIATTN_TRY(check(call, p.wpe, "wpe", {rows_of(p.wpe), C}));
    SCIATTN_TRY(check_tokens(call, p.tokens, p.batch, p.seq_len, V));
    if (p.wpe.present() && rows_of(p.wpe) < p.seq_len) {
      return Status::invalid_argument(
          "embedding_forward: wpe has " + std::to_string(rows_of(p.wpe)) +
          " positions, fewer than the sequence length " + std::to_string(p.seq_len));
    }
    cpu::embedding_forward(f(p.out), p.tokens, f(p.wte), p.wpe.present() ? f(p.wpe) : nullptr,
                           p.batch, p.seq_len, C);
    return Status::ok_status();
  }

  Status embedding_backward(const EmbeddingBackwardParams& p) override {
    const char* call = "embedding_backward";
    const int64_t V = rows_of(p.dwte), C = cols_of(p.dwte);
    SCIATTN_TRY(check(call, p.dwte, "dwte", {V, C}));
    SCIATTN_TRY(check(call, p.dout, "dout", {p.batch * p.seq_len, C}));
    if (p.dwpe.present()) SCIATTN_TRY(check(call, p.dwpe, "dwpe", {rows_of(p.dwpe), C}));
    SCIATTN_TRY(check_tokens(call, p.tokens, p.batch, p.seq_len, V));
    cpu::embedding_backward(f(p.dwte), p.dwpe.present() ? f(p.dwpe) : nullptr, f(p.dout), p.tokens,
                            p.batch, p.seq_len, C);
    return Status::ok_status();
  }

  Status layernorm_forward(const LayerNormParams& p) override {
    const char* call = "layernorm_forward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in);
    SCIATTN_TRY(check(call, p.in, "in", {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", {C}));
    SCIATTN_TRY(check(call, p.bias, "bias", {C}));
    SCIATTN_TRY(check(call, p.out, "out", {N, C}));
    SCIATTN_TRY(check(call, p.mean, "mean", {N}));
    SCIATTN_TRY(check(call, p.rstd, "rstd", {N}));
    cpu::layernorm_forward(f(p.out), f(p.mean), f(p.rstd), f(p.in), f(p.weight), f(p.bias), N, C,
                           p.eps);
    return Status::ok_status();
  }

  Status layernorm_backward(const LayerNormBackwardParams& p) override {
    const char* call = "layernorm_backward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in);
    SCIATTN_TRY(check(call, p.in, "in", {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", {C}));
    SCIATTN_TRY(check(call, p.mean, "mean", {N}));
    SCIATTN_TRY(check(call, p.rstd, "rstd", {N}));
    SCIATTN_TRY(check(call, p.dout, "dout", {N, C}));
    SCIATTN_TRY(check(call, p.din, "din", {N, C}));
    SCIATTN_TRY(check(call, p.dweight, "dweight", {C}));
    SCIATTN_TRY(check(call, p.dbias, "dbias", {C}));
    cpu::layernorm_backward(f(p.din), f(p.dweight), f(p.dbias), f(p.dout), f(p.in), f(p.weight),
                            f(p.mean), f(p.rstd), N, C);
    return Status::ok_status();
  }

  Status linear_forward(const LinearParams& p) override {
    const char* call = "linear_forward";
    const int64_t N = rows_of(p.in), IC = cols_of(p.in), OC = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", {N, IC}));
    SCIATTN_TRY(check(call, p.weight, "weight", {OC, IC}));
    if (p.bias.present()) SCIATTN_TRY(check(call, p.bias, "bias", {OC}));
    SCIATTN_TRY(check(call, p.out, "out", {N, OC}));
    cpu::linear_forward(f(p.out), f(p.in), f(p.weight), p.bias.present() ? f(p.bias) : nullptr, N,
                        IC, OC, options_.token_chunk);
    return Status::ok_status();
  }

  Status linear_backward(const LinearBackwardParams& p) override {
    const char* call = "linear_backward";
    const int64_t N = rows_of(p.in), IC = cols_of(p.in), OC = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", {N, IC}));
    SCIATTN_TRY(check(call, p.weight, "weight", {OC, IC}));
    SCIATTN_TRY(check(call, p.dout, "dout", {N, OC}));
    SCIATTN_TRY(check(call, p.dweight, "dweight", {OC, IC}));
    if (p.din.present()) SCIATTN_TRY(check(call, p.din, "din", {N, IC}));
    if (p.dbias.present()) SCIATTN_TRY(check(call, p.dbias, "dbias", {OC}));
    cpu::linear_backward(p.din.present() ? f(p.din) : nullptr, f(p.dweight),
                         p.dbias.present() ? f(p.dbias) : nullptr, f(p.dout), f(p.in), f(p.weight),
                         N, IC, OC, options_.token_chunk);
    return Status::ok_status();
  }

  Status gelu_forward(const GeluParams& p) override {
    const char* call = "gelu_forward";
    SCIATTN_TRY(check(call, p.in, "in", {rows_of(p.in), cols_of(p.in)}));
    SCIATTN_TRY(check(call, p.out, "out", {rows_of(p.in), cols_of(p.in)}));
    cpu::gelu_forward(f(p.out), f(p.in), p.in.numel());
    return Status::ok_status();
  }

  Status gelu_backward(const GeluBackwardParams& p) override {
    const char* call = "gelu_backward";
    const int64_t N = rows_of(p.in), F = cols_of(p.in);
    SCIATTN_TRY(check(call, p.in, "in", {N, F}));
    SCIATTN_TRY(check(call, p.dout, "dout", {N, F}));
    SCIATTN_TRY(check(call, p.din, "din", {N, F}));
    cpu::gelu_backward(f(p.din), f(p.in), f(p.dout), p.in.numel());
    return Status::ok_status();
  }

  Status rotary(const RotaryParams& p) override {
    const char* call = "rotary";
    if (p.qkv.rank != 5 || p.qkv.sizes[2] != 3) {
      return Status::invalid_argument("rotary: qkv must have shape [B, L, 3, H, D]; got " +
                                      p.qkv.shape_string());
    }
    const int64_t B = p.qkv.sizes[0], L = p.qkv.sizes[1], H = p.qkv.sizes[3], D = p.qkv.sizes[4];
    SCIATTN_TRY(check(call, p.qkv, "qkv", {B, L, 3, H, D}));
    if (D % 2 != 0) {
      return Status::invalid_argument("rotary: the head dim must be even; got " +
                                      std::to_string(D));
    }
    cpu::rotary(f(p.qkv), B, L, H, D, p.base, p.inverse);
    return Status::ok_status();
  }

  Status prepare_index(BlockSparseIndex* index) override {
    if (index == nullptr) return Status::invalid_argument("prepare_index: index is null");
    return Status::ok_status();
  }

  Status attention_forward(const AttentionParams& p) override {
    Shape s;
    SCIATTN_TRY(attention_tensors("attention_forward", p.index, p.qkv, p.out, p.lse, &s));
    // Padded: qkv and out copies of Lp rows per sequence at the start of the scratch.
    const size_t padded_floats = s.padded() ? static_cast<size_t>(s.B * s.Lp * 4 * s.C) : 0;
    auto build = [&](float* scratch) {
      SparseAttentionForwardParams op;
      op.index = p.index;
      op.options.causal = true;
      float* qkv = s.padded() ? scratch : f(p.qkv);
      float* out = s.padded() ? scratch + s.B * s.Lp * 3 * s.C : f(p.out);
      set_qkv_views(&op.q, &op.k, &op.v, qkv, s);
      op.out = bhld(out, s, s.C);
      op.lse = TensorView::contiguous(p.lse.data, DType::kF32, {s.B, s.H, s.Lp});
      return op;
    };
    SCIATTN_TRY(ensure_scratch(padded_floats * sizeof(float)));
    if (s.padded()) pad_rows(static_cast<float*>(scratch_), f(p.qkv), s, 3 * s.C);
    SCIATTN_TRY(run_op(build, padded_floats));
    if (s.padded()) {
      unpad_rows(f(p.out), static_cast<float*>(scratch_) + s.B * s.Lp * 3 * s.C, s, s.C);
    }
    return Status::ok_status();
  }

  Status attention_backward(const AttentionBackwardParams& p) override {
    Shape s;
    SCIATTN_TRY(attention_tensors("attention_backward", p.index, p.qkv, p.out, p.lse, &s));
    SCIATTN_TRY(check("attention_backward", p.dout, "dout", {s.B, s.L, s.H, s.D}));
    SCIATTN_TRY(check("attention_backward", p.dqkv, "dqkv", {s.B, s.L, 3, s.H, s.D}));
    // The op's outputs may not share address ranges, so dq, dk and dv are formed in three
    // separate [B, Lp, C] buffers and interleaved into dqkv afterwards. Padded, copies of qkv,
    // out and dout with Lp rows per sequence come first.
    const int64_t n3 = s.B * s.Lp * 3 * s.C, n1 = s.B * s.Lp * s.C;
    const int64_t copies = s.padded() ? n3 + 2 * n1 : 0;
    const size_t scratch_floats = static_cast<size_t>(copies + 3 * n1);
    auto build = [&](float* scratch) {
      SparseAttentionBackwardParams op;
      op.index = p.index;
      op.options.causal = true;
      float* qkv = s.padded() ? scratch : f(p.qkv);
      float* out = s.padded() ? scratch + n3 : f(p.out);
      float* dout = s.padded() ? scratch + n3 + n1 : f(p.dout);
      set_qkv_views(&op.q, &op.k, &op.v, qkv, s);
      op.dq = bhld(scratch + copies, s, s.C);
      op.dk = bhld(scratch + copies + n1, s, s.C);
      op.dv = bhld(scratch + copies + 2 * n1, s, s.C);
      op.out = bhld(out, s, s.C);
      op.dout = bhld(dout, s, s.C);
      op.lse = TensorView::contiguous(p.lse.data, DType::kF32, {s.B, s.H, s.Lp});
      return op;
    };
    SCIATTN_TRY(ensure_scratch(scratch_floats * sizeof(float)));
    if (s.padded()) {
      float* base = static_cast<float*>(scratch_);
      pad_rows(base, f(p.qkv), s, 3 * s.C);
      pad_rows(base + n3, f(p.out), s, s.C);
      pad_rows(base + n3 + n1, f(p.dout), s, s.C);
    }
    SCIATTN_TRY(run_op(build, scratch_floats));
    const float* d = static_cast<const float*>(scratch_) + copies;
    float* dqkv = f(p.dqkv);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.B * s.L; ++i) {
      const int64_t row = (i / s.L) * s.Lp + i % s.L;  // the token's row in the [B, Lp] buffers
      for (int64_t part = 0; part < 3; ++part) {
        std::memcpy(dqkv + (i * 3 + part) * s.C, d + part * n1 + row * s.C,
                    static_cast<size_t>(s.C) * sizeof(float));
      }
    }
    return Status::ok_status();
  }

  Status add(const AddParams& p) override {
    const char* call = "add";
    const int64_t N = rows_of(p.a), C = cols_of(p.a);
    SCIATTN_TRY(check(call, p.a, "a", {N, C}));
    SCIATTN_TRY(check(call, p.b, "b", {N, C}));
    SCIATTN_TRY(check(call, p.out, "out", {N, C}));
    cpu::add(f(p.out), f(p.a), f(p.b), N * C);
    return Status::ok_status();
  }

  Status strided_copy(const StridedCopyParams& p) override {
    SCIATTN_TRY(check_strided_copy(p, Device::kCpu, "host memory"));
    const TensorView &src = p.src, &dst = p.dst;
    // Rows over every dimension but the last, each a run of the last dimension.
    const int last = src.rank - 1;
    const int64_t n = src.sizes[last];
    int64_t rows = 1;
    for (int d = 0; d < last; ++d) rows *= src.sizes[d];
    const size_t es = dtype_size(src.dtype);
    const auto* in = static_cast<const std::byte*>(src.data);
    auto* out = static_cast<std::byte*>(dst.data);
    const bool packed_rows = src.strides[last] == 1 && dst.strides[last] == 1;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      int64_t so = 0, dof = 0, rest = row;
      for (int d = last - 1; d >= 0; --d) {
        const int64_t i = rest % src.sizes[d];
        rest /= src.sizes[d];
        so += i * src.strides[d];
        dof += i * dst.strides[d];
      }
      if (packed_rows) {
        std::memcpy(out + static_cast<size_t>(dof) * es, in + static_cast<size_t>(so) * es,
                    static_cast<size_t>(n) * es);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(out + static_cast<size_t>(dof + i * dst.strides[last]) * es,
                      in + static_cast<size_t>(so + i * src.strides[last]) * es, es);
        }
      }
    }
    return Status::ok_status();
  }

  Status lm_head_loss(const LmHeadParams& p) override {
    const char* call = "lm_head_loss";
    const int64_t N = rows_of(p.in), C = cols_of(p.in), V = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", {V, C}));
    SCIATTN_TRY(check(call, p.losses, "losses", {N}));
    SCIATTN_TRY(check_tile(call, p.tile_rows));
    SCIATTN_TRY(check(call, p.logits, "logits", {p.tile_rows, V}));
    SCIATTN_TRY(check_targets(call, p.targets, N, V));
    const bool grad = p.din.present() || p.dweight.present();
    if (grad) {
      SCIATTN_TRY(check(call, p.din, "din", {N, C}));
      SCIATTN_TRY(check(call, p.dweight, "dweight", {V, C}));
    }
    cpu::lm_head_loss(f(p.losses), grad ? f(p.din) : nullptr, grad ? f(p.dweight) : nullptr,
                      f(p.logits), f(p.in), f(p.weight), p.targets, N, C, V, p.grad_scale,
                      p.tile_rows, options_.token_chunk);
    return Status::ok_status();
  }

  Status lm_head_forward(const LmHeadForwardParams& p) override {
    const char* call = "lm_head_forward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in), V = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", {V, C}));
    SCIATTN_TRY(check(call, p.losses, "losses", {N}));
    SCIATTN_TRY(check(call, p.logits, "logits", {N, V}));
    SCIATTN_TRY(check_targets(call, p.targets, N, V));
    cpu::lm_head_forward(f(p.losses), f(p.logits), f(p.in), f(p.weight), p.targets, N, C, V,
                         options_.token_chunk);
    return Status::ok_status();
  }

  Status lm_head_backward(const LmHeadBackwardParams& p) override {
    const char* call = "lm_head_backward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in), V = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", {V, C}));
    SCIATTN_TRY(check(call, p.logits, "logits", {N, V}));
    SCIATTN_TRY(check(call, p.din, "din", {N, C}));
    SCIATTN_TRY(check(call, p.dweight, "dweight", {V, C}));
    SCIATTN_TRY(check_targets(call, p.targets, N, V));
    cpu::lm_head_backward(f(p.din), f(p.dweight), f(p.logits), f(p.in), f(p.weight), p.targets, N,
                          C, V, p.grad_scale, options_.token_chunk);
    return Status::ok_status();
  }

 private:
  using Shape = AttentionShape;

  static Status check_tokens(const char* call, const int32_t* tokens, int64_t B, int64_t L,
                             int64_t V) {
    if (tokens == nullptr) return Status::invalid_argument(std::string(call) + ": tokens missing");
    for (int64_t i = 0; i < B * L; ++i) {
      if (tokens[i] < 0 || tokens[i] >= V) {
        return Status::invalid_argument(
            std::string(call) + ": token " + std::to_string(tokens[i]) + " at position " +
            std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
    }
    return Status::ok_status();
  }
  static Status check_targets(const char* call, const int32_t* targets, int64_t N, int64_t V) {
    return check_tokens(call, targets, 1, N, V);
  }
  Status check_tile(const char* call, int64_t tile_rows) const {
    if (tile_rows < 1 || tile_rows % options_.token_chunk != 0) {
      return Status::invalid_argument(std::string(call) + ": tile_rows (" +
                                      std::to_string(tile_rows) +
                                      ") must be a positive multiple of the token chunk (" +
                                      std::to_string(options_.token_chunk) + ")");
    }
    return Status::ok_status();
  }

  // The shared geometry checks (backend_checks.h), then qkv, out and lse as fp32 host tensors.
  static Status attention_tensors(const char* call, const BlockSparseIndex* index,
                                  const TensorView& qkv, const TensorView& out,
                                  const TensorView& lse, Shape* s) {
    SCIATTN_TRY(attention_shape(call, index, qkv, s));
    SCIATTN_TRY(check(call, qkv, "qkv", {s->B, s->L, 3, s->H, s->D}));
    SCIATTN_TRY(check(call, out, "out", {s->B, s->L, s->H, s->D}));
    SCIATTN_TRY(check(call, lse, "lse", {s->B, s->H, s->Lp}));
    return Status::ok_status();
  }

  // [B, H, Lp, D] views of q, k, v inside a packed [B, Lp, 3, H, D] buffer.
  static void set_qkv_views(TensorView* q, TensorView* k, TensorView* v, float* qkv,
                            const Shape& s) {
    const int64_t row = 3 * s.C;
    *q = TensorView::strided(qkv, DType::kF32, {s.B, s.H, s.Lp, s.D}, {s.Lp * row, s.D, row, 1});
    *k = TensorView::strided(qkv + s.C, DType::kF32, {s.B, s.H, s.Lp, s.D},
                             {s.Lp * row, s.D, row, 1});
    *v = TensorView::strided(qkv + 2 * s.C, DType::kF32, {s.B, s.H, s.Lp, s.D},
                             {s.Lp * row, s.D, row, 1});
  }
  // A [B, H, Lp, D] view of a [B, Lp, H, D] buffer with `row` floats per token.
  static TensorView bhld(float* data, const Shape& s, int64_t row) {
    return TensorView::strided(data, DType::kF32, {s.B, s.H, s.Lp, s.D}, {s.Lp * row, s.D, row, 1});
  }
  // Copies [B, L, row] into [B, Lp, row] with zero rows appended, and back.
  static void pad_rows(float* dst, const float* src, const Shape& s, int64_t row) {
    for (int64_t b = 0; b < s.B; ++b) {
      std::memcpy(dst + b * s.Lp * row, src + b * s.L * row,
                  static_cast<size_t>(s.L * row) * sizeof(float));
      std::memset(dst + (b * s.Lp + s.L) * row, 0,
                  static_cast<size_t>((s.Lp - s.L) * row) * sizeof(float));
    }
  }
  static void unpad_rows(float* dst, const float* src, const Shape& s, int64_t row) {
    for (int64_t b = 0; b < s.B; ++b) {
      std::memcpy(dst + b * s.L * row, src + b * s.Lp * row,
                  static_cast<size_t>(s.L * row) * sizeof(float));
    }
  }

  // Runs the op built by build(scratch base) with its workspace placed after `reserved_floats`
  // of padded copies. The op's workspace size needs views with addresses, so the op is built,
  // sized, and built again if the scratch had to grow (which moves it, contents kept).
  template <class Build>
  Status run_op(Build build, size_t reserved_floats) {
    constexpr size_t kAlign = 64;
    const size_t offset = (reserved_floats * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    auto op = build(static_cast<float*>(scratch_));
    std::string why;
    if (!can_implement(op, &why).ok()) {
      return Status(StatusCode::kInternal, "the attention op rejected the trainer's call: " + why);
    }
    const size_t ws = workspace_size(op);
    if (offset + ws > scratch_bytes_) {
      SCIATTN_TRY(ensure_scratch(offset + ws));
      op = build(static_cast<float*>(scratch_));
    }
    return run(op, static_cast<std::byte*>(scratch_) + offset, ws);
  }

  // Grows the scratch (keeping its contents: the padded copies are written before the op's
  // workspace is sized).
  Status ensure_scratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return Status::ok_status();
    void* grown = aligned_zeroed(bytes);
    if (grown == nullptr) {
      return Status(StatusCode::kInvalidArgument,
                    "cannot allocate " + std::to_string(bytes) + " bytes of attention scratch");
    }
    if (scratch_ != nullptr) std::memcpy(grown, scratch_, scratch_bytes_);
    std::free(scratch_);
    scratch_ = grown;
    scratch_bytes_ = bytes;
    return Status::ok_status();
  }

  CpuBackendOptions options_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

Status make_cpu_backend(const CpuBackendOptions& options, std::unique_ptr<Backend>* out) {
  if (options.threads < 0) {
    return Status::invalid_argument("threads must be >= 0 (0 = all); got " +
                                    std::to_string(options.threads));
  }
  if (options.token_chunk < 1) {
    return Status::invalid_argument("token_chunk must be >= 1; got " +
                                    std::to_string(options.token_chunk));
  }
  *out = std::make_unique<CpuBackend>(options);
  return Status::ok_status();
}

}  // namespace sciattn::train

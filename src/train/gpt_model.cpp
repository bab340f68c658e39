// The GPT's forward and backward over the Backend's layer calls, with per-layer activation
// checkpointing and the tiled MLP and LM head. Trainer layer: plans buffers and orders calls; it
// never touches tensor memory itself, so any back end runs it.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sciattn/train/gpt.h"

namespace sciattn::train {
namespace {

#define SCIATTN_TRY(expr)              \
  do {                                 \
    Status status_ = (expr);           \
    if (!status_.ok()) return status_; \
  } while (0)

constexpr int64_t kDenseBlocks[] = {64, 32, 16};
constexpr int64_t kPaddedBlock = 16;

TensorView v1(const float* p, int64_t n) {
  return TensorView::contiguous(p, DType::kF32, {n});
}
TensorView v2(const float* p, int64_t rows, int64_t cols) {
  return TensorView::contiguous(p, DType::kF32, {rows, cols});
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

}  // namespace

Status plan_attention(const GptConfig& config, const SparsityConfig* sparse, AttentionPlan* out) {
  const int64_t L = config.sequence_length, H = config.n_heads;
  AttentionPlan plan;
  Layout layout;
  if (sparse == nullptr) {
    plan.block = kPaddedBlock;
    for (int64_t b : kDenseBlocks) {
      if (L % b == 0) {
        plan.block = b;
        break;
      }
    }
    plan.padded_length = round_up(L, plan.block);
    const int64_t n = plan.padded_length / plan.block;
    layout = Layout::zeros(1, n, n);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c <= r; ++c) layout.at(0, r, c) = 1;
    }
  } else {
    SparsityConfig config_for_heads = *sparse;
    sparsity_common(config_for_heads).num_heads = H;
    plan.block = sparsity_common(config_for_heads).block;
    plan.padded_length = round_up(L, plan.block);
    Status s = make_layout(config_for_heads, plan.padded_length, &layout);
    if (!s.ok()) {
      return Status::invalid_argument("sparse_attention: no layout for sequence_length " +
                                      std::to_string(L) + " (padded to " +
                                      std::to_string(plan.padded_length) + "): " + s.message());
    }
    // A GPT is causal: drop every block above the diagonal.
    for (int64_t h = 0; h < layout.num_heads; ++h) {
      for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
        for (int64_t c = r + 1; c < layout.num_col_blocks; ++c) layout.at(h, r, c) = 0;
      }
    }
  }
  // A layout shared by every head is stored once; build_block_sparse_index wants all heads.
  if (layout.num_heads == 1 && H > 1) {
    Layout all = Layout::zeros(H, layout.num_row_blocks, layout.num_col_blocks);
    for (int64_t h = 0; h < H; ++h) {
      std::copy(layout.blocks.begin(), layout.blocks.end(),
                all.blocks.begin() + h * layout.num_row_blocks * layout.num_col_blocks);
    }
    layout = std::move(all);
  }
  Status s = build_block_sparse_index(layout, plan.block, &plan.index);
  if (!s.ok()) return Status::invalid_argument("attention layout: " + s.message());
  const int64_t n = plan.padded_length / plan.block;
  plan.density = static_cast<double>(plan.index.nnz) / static_cast<double>(H * n * (n + 1) / 2);
  *out = std::move(plan);
  return Status::ok_status();
}

// One layer's saved activations (T = B * L tokens).
struct LayerActivations {
  float* ln1 = nullptr;       // [T, C]
  float* ln1_mean = nullptr;  // [T]
  float* ln1_rstd = nullptr;  // [T]
  float* qkv = nullptr;       // [T, 3C] (q and k rotated with rotary positions)
  float* atty = nullptr;      // [T, C]
  float* lse = nullptr;       // [B, H, Lp]
  float* r2 = nullptr;        // [T, C] x + attention
  float* ln2 = nullptr;       // [T, C]
  float* ln2_mean = nullptr;  // [T]
  float* ln2_rstd = nullptr;  // [T]
  float* fch = nullptr;       // [T, F] pre-GELU (untiled MLP only)
  float* fcg = nullptr;       // [T, F] post-GELU (untiled MLP only)
};

struct GptModel::Buffers {
  int32_t* inputs = nullptr;   // [T]
  int32_t* targets = nullptr;  // [T]
  std::vector<float*> resid;   // n_layers + 1 of [T, C]: the embedding, then each layer's output
  std::vector<LayerActivations> acts;  // n_layers, or 1 (recomputed) with checkpointing
  float* lnf = nullptr;                // [T, C]
  float* lnf_mean = nullptr;           // [T]
  float* lnf_rstd = nullptr;           // [T]
  float* losses = nullptr;             // [T]
  float* logits = nullptr;             // [T, V] untiled, [tile, V] tiled
  int64_t lm_tile = 0;                 // rows of logits (T when untiled)
  int64_t mlp_tile = 0;                // rows of an MLP tile (T when untiled)
  // MLP tile scratch (tiled MLP): pre-GELU, post-GELU, and their gradient.
  float* mlp_fch = nullptr;
  float* mlp_fcg = nullptr;
  float* mlp_grad = nullptr;  // [mlp_tile, F]
  // Backward scratch.
  float* dres = nullptr;   // [T, C] gradient of the residual stream
  float* dln = nullptr;    // [T, C] gradient of a LayerNorm's output
  float* datty = nullptr;  // [T, C]
  float* dqkv = nullptr;   // [T, 3C]
  std::vector<void*> allocations;
};

GptModel::~GptModel() {
  if (backend_ != nullptr) {
    if (buffers_ != nullptr) {
      for (void* p : buffers_->allocations) backend_->release(p);
    }
    backend_->release(params_);
    backend_->release(grads_);
  }
}

Status GptModel::create(const GptConfig& config, const SparsityConfig* sparse, int64_t batch,
                        const MemoryOptions& memory, Backend* backend,
                        std::unique_ptr<GptModel>* out) {
  SCIATTN_TRY(validate_gpt_config(config));
  if (batch < 1) {
    return Status::invalid_argument(
        "the micro-batch (train_micro_batch_size_per_gpu) must be "
        ">= 1; got " +
        std::to_string(batch));
  }
  if (memory.mlp_tile_tokens < 0 || memory.lm_head_tile_tokens < 0) {
    return Status::invalid_argument("tile sizes must be >= 0 (0 = untiled)");
  }
  if (backend == nullptr) return Status::invalid_argument("GptModel::create: no back end");
  std::unique_ptr<GptModel> m(new GptModel());
  m->config_ = config;
  m->memory_ = memory;
  m->batch_ = batch;
  m->backend_ = backend;
  m->layout_ = gpt_parameter_layout(config);
  SCIATTN_TRY(plan_attention(config, sparse, &m->attention_));
  SCIATTN_TRY(m->plan_and_allocate());
  *out = std::move(m);
  return Status::ok_status();
}

Status GptModel::plan_and_allocate() {
  buffers_ = std::make_unique<Buffers>();
  Buffers& b = *buffers_;
  Backend& be = *backend_;
  const GptConfig& c = config_;
  const int64_t T = batch_ * c.sequence_length, C = c.d_model, F = c.mlp_width();
  const int64_t V = c.vocab_size, H = c.n_heads, Lp = attention_.padded_length;
  const int64_t chunk = be.token_chunk();
  const Device dev = be.device();
  const size_t f4 = sizeof(float);

  auto alloc = [&](uint64_t bytes, const std::string& name, const std::string& category,
                   unsigned phases, void** ptr) -> Status {
    SCIATTN_TRY(be.allocate(bytes, ptr));
    b.allocations.push_back(*ptr);
    ledger_.add(name, category, dev, bytes, phases);
    return Status::ok_status();
  };
  // Carves consecutive float arrays out of one allocation, each on 64 bytes.
  struct Carver {
    std::vector<std::pair<float**, int64_t>> parts;
    uint64_t bytes() const {
      uint64_t n = 0;
      for (const auto& p : parts) n += static_cast<uint64_t>(round_up(p.second, 16)) * 4;
      return n;
    }
    void place(void* base) const {
      float* at = static_cast<float*>(base);
      for (const auto& p : parts) {
        *p.first = at;
        at += round_up(p.second, 16);
      }
    }
  };
  auto carve = [&](Carver& cv, const std::string& name, const std::string& category,
                   unsigned phases) -> Status {
    void* base = nullptr;
    SCIATTN_TRY(alloc(cv.bytes(), name, category, phases, &base));
    cv.place(base);
    return Status::ok_status();
  };

  // Model states.
  const uint64_t param_bytes = static_cast<uint64_t>(layout_.total) * f4;
  SCIATTN_TRY(be.allocate(param_bytes, reinterpret_cast<void**>(&params_)));
  ledger_.add("parameters (fp32)", "model states", dev, param_bytes, kPhaseAll);
  SCIATTN_TRY(be.allocate(param_bytes, reinterpret_cast<void**>(&grads_)));
  ledger_.add("gradients (fp32)", "model states", dev, param_bytes,
              kPhaseBackward | kPhaseOptimizer);
  {
    std::vector<float> host(static_cast<size_t>(layout_.total));
    init_gpt_parameters(c, layout_, host.data());
    SCIATTN_TRY(be.copy_to_device(params_, host.data(), param_bytes));
  }

  // Tokens.
  void* tok = nullptr;
  SCIATTN_TRY(alloc(static_cast<uint64_t>(2 * T) * sizeof(int32_t), "token ids (inputs, targets)",
                    "activations", kPhaseForward | kPhaseBackward, &tok));
  b.inputs = static_cast<int32_t*>(tok);
  b.targets = b.inputs + T;

  // The residual stream at every layer boundary: the layers' inputs, which checkpointing keeps.
  b.resid.assign(static_cast<size_t>(c.n_layers + 1), nullptr);
  {
    Carver cv;
    for (float*& r : b.resid) cv.parts.push_back({&r, T * C});
    SCIATTN_TRY(carve(cv,
                      memory_.checkpoint_layers ? "layer inputs (the checkpoints), [L+1, T, C]"
                                                : "residual stream, [L+1, T, C]",
                      "activations", kPhaseForward | kPhaseBackward));
  }

  // Per-layer activations: all layers, or one recomputed set.
  b.mlp_tile = memory_.mlp_tile_tokens > 0
                   ? std::min(round_up(memory_.mlp_tile_tokens, chunk), round_up(T, chunk))
                   : 0;
  const bool mlp_tiled = b.mlp_tile > 0;
  const int64_t sets = memory_.checkpoint_layers ? 1 : c.n_layers;
  b.acts.assign(static_cast<size_t>(sets), LayerActivations{});
  for (int64_t l = 0; l < sets; ++l) {
    LayerActivations& a = b.acts[static_cast<size_t>(l)];
    Carver cv;
    cv.parts = {{&a.ln1, T * C},  {&a.ln1_mean, T},          {&a.ln1_rstd, T}, {&a.qkv, 3 * T * C},
                {&a.atty, T * C}, {&a.lse, batch_ * H * Lp}, {&a.r2, T * C},   {&a.ln2, T * C},
                {&a.ln2_mean, T}, {&a.ln2_rstd, T}};
    if (!mlp_tiled) {
      cv.parts.push_back({&a.fch, T * F});
      cv.parts.push_back({&a.fcg, T * F});
    }
    const std::string name = memory_.checkpoint_layers
                                 ? "one layer's activations (recomputed per layer)"
                                 : "layer " + std::to_string(l) + " activations";
    SCIATTN_TRY(carve(cv, name, "activations", kPhaseForward | kPhaseBackward));
  }
  if (mlp_tiled) {
    Carver cv;
    cv.parts = {
        {&b.mlp_fch, b.mlp_tile * F}, {&b.mlp_fcg, b.mlp_tile * F}, {&b.mlp_grad, b.mlp_tile * F}};
    SCIATTN_TRY(carve(cv, "MLP tile (" + std::to_string(b.mlp_tile) + " tokens x 3 x F)", "scratch",
                      kPhaseForward | kPhaseBackward));
  } else {
    Carver cv;
    cv.parts = {{&b.mlp_grad, T * F}};
    SCIATTN_TRY(carve(cv, "MLP gradient [T, F]", "scratch", kPhaseBackward));
  }

  // Final LayerNorm and the LM head.
  {
    Carver cv;
    cv.parts = {{&b.lnf, T * C}, {&b.lnf_mean, T}, {&b.lnf_rstd, T}, {&b.losses, T}};
    SCIATTN_TRY(
        carve(cv, "final LayerNorm and losses", "activations", kPhaseForward | kPhaseBackward));
  }
  b.lm_tile = memory_.lm_head_tile_tokens > 0
                  ? std::min(round_up(memory_.lm_head_tile_tokens, chunk), round_up(T, chunk))
                  : T;
  {
    Carver cv;
    cv.parts = {{&b.logits, b.lm_tile * V}};
    SCIATTN_TRY(carve(cv,
                      memory_.lm_head_tile_tokens > 0
                          ? "LM-head logits tile (" + std::to_string(b.lm_tile) + " tokens x V)"
                          : "LM-head logits [T, V]",
                      memory_.lm_head_tile_tokens > 0 ? "scratch" : "activations",
                      kPhaseForward | kPhaseBackward));
  }

  // Backward scratch.
  {
    Carver cv;
    cv.parts = {{&b.dres, T * C}, {&b.dln, T * C}, {&b.datty, T * C}, {&b.dqkv, 3 * T * C}};
    SCIATTN_TRY(carve(cv, "backward scratch (dresidual, dLN, dattn, dqkv)", "scratch",
                      kPhaseForward | kPhaseBackward));
  }
  return Status::ok_status();
}

Status GptModel::zero_grads() {
  return backend_->fill_zero(grads_, static_cast<size_t>(layout_.total) * sizeof(float));
}

// The views of one layer's parameters or gradients inside a flat buffer.
namespace {
struct LayerTensors {
  TensorView ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
      fcproj_b;
};
LayerTensors layer_tensors(const ParameterLayout& layout, const float* base, int64_t layer) {
  const std::string h = "h" + std::to_string(layer) + ".";
  auto view = [&](const char* name) {
    const TensorSlot* s = layout.find(h + name);
    const float* p = base + s->offset;
    return s->shape.size() == 2 ? v2(p, s->shape[0], s->shape[1]) : v1(p, s->shape[0]);
  };
  return {view("ln1_w"),  view("ln1_b"),  view("qkv_w"),    view("qkv_b"),
          view("proj_w"), view("proj_b"), view("ln2_w"),    view("ln2_b"),
          view("fc_w"),   view("fc_b"),   view("fcproj_w"), view("fcproj_b")};
}
TensorView slot_view(const ParameterLayout& layout, const float* base, const char* name) {
  const TensorSlot* s = layout.find(name);
  if (s == nullptr) return TensorView{};
  const float* p = base + s->offset;
  return s->shape.size() == 2 ? v2(p, s->shape[0], s->shape[1]) : v1(p, s->shape[0]);
}
}  // namespace

Status GptModel::layer_forward(int64_t layer, const float* in, float* out, bool keep,
                               bool recompute) {
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  const int64_t T = batch_ * c.sequence_length, C = c.d_model, F = c.mlp_width();
  const int64_t H = c.n_heads, D = c.head_dim();
  LayerActivations& a = b.acts[keep ? static_cast<size_t>(layer) : 0];
  const LayerTensors w = layer_tensors(layout_, params_, layer);
  const float eps = static_cast<float>(c.layer_norm_eps);

  SCIATTN_TRY(be.layernorm_forward({v2(in, T, C), w.ln1_w, w.ln1_b, v2(a.ln1, T, C),
                                    v1(a.ln1_mean, T), v1(a.ln1_rstd, T), eps}));
  SCIATTN_TRY(be.linear_forward({v2(a.ln1, T, C), w.qkv_w, w.qkv_b, v2(a.qkv, T, 3 * C)}));
  const TensorView qkv5 =
      TensorView::contiguous(a.qkv, DType::kF32, {batch_, c.sequence_length, 3, H, D});
  if (c.positions == PositionEncoding::kRotary) {
    SCIATTN_TRY(be.rotary({qkv5, static_cast<float>(c.rotary_base), false}));
  }
  const TensorView atty4 =
      TensorView::contiguous(a.atty, DType::kF32, {batch_, c.sequence_length, H, D});
  const TensorView lse =
      TensorView::contiguous(a.lse, DType::kF32, {batch_, H, attention_.padded_length});
  SCIATTN_TRY(be.attention_forward({&attention_.index, qkv5, atty4, lse}));
  SCIATTN_TRY(be.linear_forward({v2(a.atty, T, C), w.proj_w, w.proj_b, v2(a.r2, T, C)}));
  SCIATTN_TRY(be.add({v2(a.r2, T, C), v2(in, T, C), v2(a.r2, T, C)}));
  SCIATTN_TRY(be.layernorm_forward({v2(a.r2, T, C), w.ln2_w, w.ln2_b, v2(a.ln2, T, C),
                                    v1(a.ln2_mean, T), v1(a.ln2_rstd, T), eps}));
  // MLP. The backward of a recomputed layer needs only what precedes the MLP's output, and a
  // tiled MLP recomputes its own tiles there.
  if (b.mlp_tile > 0) {
    if (recompute) return Status::ok_status();
    for (int64_t r0 = 0; r0 < T; r0 += b.mlp_tile) {
      const int64_t n = std::min(b.mlp_tile, T - r0);
      SCIATTN_TRY(
          be.linear_forward({v2(a.ln2 + r0 * C, n, C), w.fc_w, w.fc_b, v2(b.mlp_fch, n, F)}));
      SCIATTN_TRY(be.gelu_forward({v2(b.mlp_fch, n, F), v2(b.mlp_fcg, n, F)}));
      SCIATTN_TRY(
          be.linear_forward({v2(b.mlp_fcg, n, F), w.fcproj_w, w.fcproj_b, v2(out + r0 * C, n, C)}));
    }
  } else {
    SCIATTN_TRY(be.linear_forward({v2(a.ln2, T, C), w.fc_w, w.fc_b, v2(a.fch, T, F)}));
    SCIATTN_TRY(be.gelu_forward({v2(a.fch, T, F), v2(a.fcg, T, F)}));
    if (recompute) return Status::ok_status();
    SCIATTN_TRY(be.linear_forward({v2(a.fcg, T, F), w.fcproj_w, w.fcproj_b, v2(out, T, C)}));
  }
  SCIATTN_TRY(be.add({v2(out, T, C), v2(a.r2, T, C), v2(out, T, C)}));
  return Status::ok_status();
}

Status GptModel::layer_backward(int64_t layer) {
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  const int64_t T = batch_ * c.sequence_length, C = c.d_model, F = c.mlp_width();
  const int64_t H = c.n_heads, D = c.head_dim();
  const LayerActivations& a = b.acts[memory_.checkpoint_layers ? 0 : static_cast<size_t>(layer)];
  const LayerTensors w = layer_tensors(layout_, params_, layer);
  const LayerTensors g = layer_tensors(layout_, grads_, layer);
  const float* in = b.resid[static_cast<size_t>(layer)];

  // MLP: dres holds the gradient of the layer's output, which is also that of the MLP's output.
  if (b.mlp_tile > 0) {
    for (int64_t r0 = 0; r0 < T; r0 += b.mlp_tile) {
      const int64_t n = std::min(b.mlp_tile, T - r0);
      const TensorView ln2 = v2(a.ln2 + r0 * C, n, C);
      SCIATTN_TRY(be.linear_forward({ln2, w.fc_w, w.fc_b, v2(b.mlp_fch, n, F)}));
      SCIATTN_TRY(be.gelu_forward({v2(b.mlp_fch, n, F), v2(b.mlp_fcg, n, F)}));
      SCIATTN_TRY(be.linear_backward({v2(b.mlp_fcg, n, F), w.fcproj_w, v2(b.dres + r0 * C, n, C),
                                      v2(b.mlp_grad, n, F), g.fcproj_w, g.fcproj_b}));
      SCIATTN_TRY(
          be.gelu_backward({v2(b.mlp_fch, n, F), v2(b.mlp_grad, n, F), v2(b.mlp_grad, n, F)}));
      SCIATTN_TRY(be.linear_backward(
          {ln2, w.fc_w, v2(b.mlp_grad, n, F), v2(b.dln + r0 * C, n, C), g.fc_w, g.fc_b}));
    }
  } else {
    SCIATTN_TRY(be.linear_backward({v2(a.fcg, T, F), w.fcproj_w, v2(b.dres, T, C),
                                    v2(b.mlp_grad, T, F), g.fcproj_w, g.fcproj_b}));
    SCIATTN_TRY(be.gelu_backward({v2(a.fch, T, F), v2(b.mlp_grad, T, F), v2(b.mlp_grad, T, F)}));
    SCIATTN_TRY(be.linear_backward(
        {v2(a.ln2, T, C), w.fc_w, v2(b.mlp_grad, T, F), v2(b.dln, T, C), g.fc_w, g.fc_b}));
  }
  // dres += LN2's input gradient: now the gradient of r2 = x + attention.
  SCIATTN_TRY(be.layernorm_backward({v2(a.r2, T, C), w.ln2_w, v1(a.ln2_mean, T), v1(a.ln2_rstd, T),
                                     v2(b.dln, T, C), v2(b.dres, T, C), g.ln2_w, g.ln2_b}));
  // Attention.
  SCIATTN_TRY(be.linear_backward(
      {v2(a.atty, T, C), w.proj_w, v2(b.dres, T, C), v2(b.datty, T, C), g.proj_w, g.proj_b}));
  const int64_t L = c.sequence_length;
  const TensorView qkv5 = TensorView::contiguous(a.qkv, DType::kF32, {batch_, L, 3, H, D});
  const TensorView dqkv5 = TensorView::contiguous(b.dqkv, DType::kF32, {batch_, L, 3, H, D});
  SCIATTN_TRY(be.attention_backward(
      {&attention_.index, qkv5, TensorView::contiguous(a.atty, DType::kF32, {batch_, L, H, D}),
       TensorView::contiguous(a.lse, DType::kF32, {batch_, H, attention_.padded_length}),
       TensorView::contiguous(b.datty, DType::kF32, {batch_, L, H, D}), dqkv5}));
  if (c.positions == PositionEncoding::kRotary) {
    SCIATTN_TRY(be.rotary({dqkv5, static_cast<float>(c.rotary_base), true}));
  }
  SCIATTN_TRY(be.linear_backward(
      {v2(a.ln1, T, C), w.qkv_w, v2(b.dqkv, T, 3 * C), v2(b.dln, T, C), g.qkv_w, g.qkv_b}));
  // dres += LN1's input gradient: now the gradient of the layer's input.
  SCIATTN_TRY(be.layernorm_backward({v2(in, T, C), w.ln1_w, v1(a.ln1_mean, T), v1(a.ln1_rstd, T),
                                     v2(b.dln, T, C), v2(b.dres, T, C), g.ln1_w, g.ln1_b}));
  return Status::ok_status();
}

Status GptModel::run_forward(const int32_t* inputs, const int32_t* targets, bool with_grad,
                             float grad_scale, MicroBatchResult* out) {
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  const int64_t L = c.sequence_length, T = batch_ * L, C = c.d_model, V = c.vocab_size;
  const size_t token_bytes = static_cast<size_t>(T) * sizeof(int32_t);
  SCIATTN_TRY(be.copy_to_device(b.inputs, inputs, token_bytes));
  SCIATTN_TRY(be.copy_to_device(b.targets, targets, token_bytes));

  const TensorView wte = slot_view(layout_, params_, "wte");
  const TensorView wpe = slot_view(layout_, params_, "wpe");
  SCIATTN_TRY(be.embedding_forward({b.inputs, batch_, L, wte, wpe, v2(b.resid[0], T, C)}));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    SCIATTN_TRY(layer_forward(l, b.resid[static_cast<size_t>(l)],
                              b.resid[static_cast<size_t>(l + 1)], !memory_.checkpoint_layers,
                              false));
  }
  const float* last = b.resid[static_cast<size_t>(c.n_layers)];
  const float eps = static_cast<float>(c.layer_norm_eps);
  SCIATTN_TRY(be.layernorm_forward({v2(last, T, C), slot_view(layout_, params_, "lnf_w"),
                                    slot_view(layout_, params_, "lnf_b"), v2(b.lnf, T, C),
                                    v1(b.lnf_mean, T), v1(b.lnf_rstd, T), eps}));
  const char* head = c.tie_embeddings ? "wte" : "lm_head";
  const TensorView head_w = slot_view(layout_, params_, head);
  if (memory_.lm_head_tile_tokens > 0) {
    // The loss gradient needs nothing from later layers: with tiles, form it right here.
    LmHeadParams p;
    p.in = v2(b.lnf, T, C);
    p.weight = head_w;
    p.targets = b.targets;
    p.losses = v1(b.losses, T);
    if (with_grad) {
      p.din = v2(b.dln, T, C);
      p.dweight = slot_view(layout_, grads_, head);
    }
    p.logits = v2(b.logits, b.lm_tile, V);
    p.grad_scale = grad_scale;
    p.tile_rows = b.lm_tile;
    SCIATTN_TRY(be.lm_head_loss(p));
  } else {
    // Untiled: all [T, V] logits stay until forward_backward's lm_head_backward.
    SCIATTN_TRY(be.lm_head_forward(
        {v2(b.lnf, T, C), head_w, v1(b.losses, T), b.targets, v2(b.logits, T, V)}));
  }

  std::vector<float> losses(static_cast<size_t>(T));
  SCIATTN_TRY(be.copy_to_host(losses.data(), b.losses, losses.size() * sizeof(float)));
  out->loss_sum = 0.0;
  for (float x : losses) out->loss_sum += static_cast<double>(x);
  out->tokens = T;
  return Status::ok_status();
}

Status GptModel::forward_loss(const int32_t* inputs, const int32_t* targets,
                              MicroBatchResult* out) {
  return run_forward(inputs, targets, false, 0.0f, out);
}

Status GptModel::forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                                  MicroBatchResult* out) {
  SCIATTN_TRY(run_forward(inputs, targets, true, grad_scale, out));
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  const int64_t L = c.sequence_length, T = batch_ * L, C = c.d_model, V = c.vocab_size;
  const char* head = c.tie_embeddings ? "wte" : "lm_head";
  if (memory_.lm_head_tile_tokens == 0) {
    SCIATTN_TRY(be.lm_head_backward({v2(b.lnf, T, C), slot_view(layout_, params_, head), b.targets,
                                     v2(b.logits, T, V), v2(b.dln, T, C),
                                     slot_view(layout_, grads_, head), grad_scale}));
  }
  // Final LayerNorm: dres = its input gradient (dln holds the LM head's input gradient).
  SCIATTN_TRY(be.fill_zero(b.dres, static_cast<size_t>(T * C) * sizeof(float)));
  const float* last = b.resid[static_cast<size_t>(c.n_layers)];
  SCIATTN_TRY(be.layernorm_backward({v2(last, T, C), slot_view(layout_, params_, "lnf_w"),
                                     v1(b.lnf_mean, T), v1(b.lnf_rstd, T), v2(b.dln, T, C),
                                     v2(b.dres, T, C), slot_view(layout_, grads_, "lnf_w"),
                                     slot_view(layout_, grads_, "lnf_b")}));
  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    if (memory_.checkpoint_layers) {
      // Recompute the layer from its saved input; only the activations its backward reads.
      SCIATTN_TRY(layer_forward(l, b.resid[static_cast<size_t>(l)], nullptr, false, true));
    }
    SCIATTN_TRY(layer_backward(l));
  }
  SCIATTN_TRY(be.embedding_backward({b.inputs, batch_, L, v2(b.dres, T, C),
                                     slot_view(layout_, grads_, "wte"),
                                     slot_view(layout_, grads_, "wpe")}));
  return Status::ok_status();
}

double GptModel::flops_per_micro_batch() const {
  const double T = static_cast<double>(batch_ * config_.sequence_length);
  const double b = static_cast<double>(attention_.block);
  // Per layer: forward 4 * B * nnz * b^2 * D, backward 10 * ... (sparse_attention_*_flops).
  const double attention =
      14.0 * static_cast<double>(batch_) * static_cast<double>(attention_.index.nnz) * b * b *
      static_cast<double>(config_.head_dim()) * static_cast<double>(config_.n_layers);
  return 6.0 * static_cast<double>(layout_.matmul_parameter_count()) * T + attention;
}

}  // namespace sciattn::train

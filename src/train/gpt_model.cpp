// The GPT's forward and backward over the Backend's layer calls, with per-layer activation
// checkpointing (its checkpoints optionally offloaded to host memory), the tiled MLP and LM head,
// and the memory plan of those buffers. Trainer layer: plans buffers and orders calls; it
// never touches tensor memory itself, so any back end runs it.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common/status_try.h"
#include "sciattn/train/gpt.h"

namespace sciattn::train {
namespace {

constexpr int64_t kDenseBlocks[] = {64, 32, 16};
constexpr int64_t kPaddedBlock = 16;
// From this length on, dense causal attention takes blocks of 128 when 128 divides the length:
// the kernels work on 64-token tiles either way, and the index holds 4 times fewer blocks (at
// 1,048,576 tokens and 16 heads, blocks of 64 would make 2^31 + 131,072 blocks over all heads,
// past the GPU kernels' 32-bit count).
constexpr int64_t kLongDenseLength = 65536;
constexpr int64_t kLongDenseBlock = 128;

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

Status check_memory_options(const MemoryOptions& memory) {
  if (memory.mlp_tile_tokens < 0 || memory.lm_head_tile_tokens < 0) {
    return Status::invalid_argument("tile sizes must be >= 0 (0 = untiled)");
  }
  if (memory.parameter_multiple < 1) {
    return Status::invalid_argument("MemoryOptions.parameter_multiple must be >= 1; got " +
                                    std::to_string(memory.parameter_multiple));
  }
  if (memory.keep_attention_layers < 0) {
    return Status::invalid_argument("MemoryOptions.keep_attention_layers must be >= 0; got " +
                                    std::to_string(memory.keep_attention_layers));
  }
  if (memory.layer_gradient_buffers < 0) {
    return Status::invalid_argument("MemoryOptions.layer_gradient_buffers must be >= 0; got " +
                                    std::to_string(memory.layer_gradient_buffers));
  }
  return Status::ok_status();
}

}  // namespace

Status attention_padding(const GptConfig& config, const SparsityConfig* sparse, int64_t* block,
                         int64_t* padded_length) {
  const int64_t L = config.sequence_length;
  if (L < 1) return Status::invalid_argument("sequence_length must be >= 1");
  int64_t b = kPaddedBlock;
  if (sparse == nullptr) {
    for (int64_t d : kDenseBlocks) {
      if (L % d == 0) {
        b = d;
        break;
      }
    }
    if (L >= kLongDenseLength && L % kLongDenseBlock == 0) b = kLongDenseBlock;
  } else {
    b = sparsity_common(*sparse).block;
    if (b < 1) return Status::invalid_argument("sparse_attention.block must be >= 1");
  }
  *block = b;
  *padded_length = round_up(L, b);
  return Status::ok_status();
}

Status check_sequence_parallel(const GptConfig& config, int64_t size) {
  if (size < 1) {
    return Status::invalid_argument("sequence_parallel_size must be >= 1; got " +
                                    std::to_string(size));
  }
  if (config.n_heads % size != 0) {
    return Status::invalid_argument(
        "sequence_parallel_size " + std::to_string(size) + " does not divide the model's n_heads " +
        std::to_string(config.n_heads) +
        ": each rank of a sequence-parallel group attends over n_heads / sequence_parallel_size "
        "heads; use a divisor of n_heads");
  }
  if (config.sequence_length % size != 0) {
    return Status::invalid_argument(
        "sequence_parallel_size " + std::to_string(size) +
        " does not divide the model's sequence_length " + std::to_string(config.sequence_length) +
        ": each rank of a sequence-parallel group holds sequence_length / "
        "sequence_parallel_size tokens; use a divisor of sequence_length");
  }
  return Status::ok_status();
}

Status plan_attention(const GptConfig& config, const SparsityConfig* sparse, AttentionPlan* out,
                      int64_t head_begin, int64_t head_count) {
  const int64_t L = config.sequence_length;
  if (head_count == 0) head_count = config.n_heads;
  if (head_begin < 0 || head_count < 1 || head_begin + head_count > config.n_heads) {
    return Status::invalid_argument("plan_attention: heads [" + std::to_string(head_begin) + ", " +
                                    std::to_string(head_begin + head_count) +
                                    ") are not within the model's n_heads " +
                                    std::to_string(config.n_heads));
  }
  const int64_t H = head_count;
  AttentionPlan plan;
  SCIATTN_TRY(attention_padding(config, sparse, &plan.block, &plan.padded_length));
  Layout layout;
  if (sparse == nullptr) {
    const int64_t n = plan.padded_length / plan.block;
    layout = Layout::zeros(1, n, n);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c <= r; ++c) layout.at(0, r, c) = 1;
    }
  } else {
    SparsityConfig config_for_heads = *sparse;
    sparsity_common(config_for_heads).num_heads = config.n_heads;
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
    if (layout.num_heads > 1 && H < layout.num_heads) {
      // Only the planned heads' layouts (a sequence-parallel rank's slice), built on the host.
      Layout slice = Layout::zeros(H, layout.num_row_blocks, layout.num_col_blocks);
      const auto per_head =
          static_cast<std::ptrdiff_t>(layout.num_row_blocks * layout.num_col_blocks);
      std::copy(layout.blocks.begin() + head_begin * per_head,
                layout.blocks.begin() + (head_begin + H) * per_head, slice.blocks.begin());
      layout = std::move(slice);
    }
  }
  Status s = build_block_sparse_index(layout, plan.block, &plan.index);
  if (!s.ok()) return Status::invalid_argument("attention layout: " + s.message());
  if (layout.num_heads == 1 && H > 1) {
    // A layout every head shares, built for one head: the index's shared-head form
    // (block_sparse_ops.h: layout_heads 1, the arrays of head 0, head h reading them with its
    // positions shifted by h * stored_nnz), which build_block_sparse_index itself makes from a
    // layout whose heads are all equal. Expanding the layout to H heads first would cost H times
    // the memory and time (4.3 GB of layout and 2.1G blocks for dense causal at 1M tokens).
    plan.index.num_heads = H;
    plan.index.nnz = plan.index.stored_nnz() * H;
  }
  const int64_t n = plan.padded_length / plan.block;
  plan.density = static_cast<double>(plan.index.nnz) / static_cast<double>(H * n * (n + 1) / 2);
  *out = std::move(plan);
  return Status::ok_status();
}

// One layer's saved activations (T = B * L tokens). Activations are in the compute dtype, the
// statistics (mean, rstd, lse) in f32.
struct LayerActivations {
  void* ln1 = nullptr;       // [T, C]
  void* ln1_mean = nullptr;  // [T] f32
  void* ln1_rstd = nullptr;  // [T] f32
  // Without sequence parallelism qkv is [T, 3C] = [B, L, 3, H, D] (q and k rotated with rotary
  // positions); with it, the head split [B, L, 3, H/P, D] (rotated), of the same size.
  void* qkv = nullptr;
  void* atty = nullptr;        // [T, C] the attention output, token split
  void* atty_heads = nullptr;  // [B, L, H/P, D] the same, head split (sequence parallelism only)
  void* lse = nullptr;         // [B, H/P, Lp] f32
  void* r2 = nullptr;          // [T, C] x + attention
  void* ln2 = nullptr;         // [T, C]
  void* ln2_mean = nullptr;    // [T] f32
  void* ln2_rstd = nullptr;    // [T] f32
  void* fch = nullptr;         // [T, F] pre-GELU (untiled MLP only)
  void* fcg = nullptr;         // [T, F] post-GELU (untiled MLP only)
};

struct GptModel::Buffers {
  int32_t* inputs = nullptr;   // [T]
  int32_t* targets = nullptr;  // [T]
  // The residual stream at the layer boundaries: n_layers + 1 of [T, C] (the embedding, then
  // each layer's output), or, with offloaded checkpoints, two that alternate (boundary l in
  // resid[l % 2]).
  std::vector<void*> resid;
  // Offloaded checkpoints: boundaries 0 .. n_layers - 2 in host memory, [n_layers - 1, T, C]
  // (boundary n_layers - 1, the last layer's input, never leaves the device), and the copies'
  // tickets of the current micro-batch.
  void* host_checkpoints = nullptr;
  std::vector<CopyTicket> offloaded, prefetched;  // [n_layers]
  std::vector<LayerActivations> acts;             // n_layers, or 1 (recomputed) with checkpointing
  // Kept attention outputs (MemoryOptions::keep_attention_layers with checkpointing): for kept
  // layer i (layer n_layers - k + i), the attention's output as it writes it ([T, C], the head
  // split with sequence parallelism) and its log-sum-exp [B, H/P, Lp] f32; offloaded, two slots
  // that alternate (kept layer i in slot i % 2), host memory for kept layers 0 .. k - 3
  // ([k - 2, T, C] and [k - 2, B, H/P, Lp]; the last two never leave the device) and the copies'
  // tickets of the current micro-batch.
  std::vector<void*> kept_output, kept_lse;
  void* host_kept_output = nullptr;
  void* host_kept_lse = nullptr;
  // [2 k]: the output and log-sum-exp copies of kept layer i at 2 i and 2 i + 1.
  std::vector<CopyTicket> kept_offloaded, kept_prefetched;
  void* lnf = nullptr;       // [T, C]
  void* lnf_mean = nullptr;  // [T] f32
  void* lnf_rstd = nullptr;  // [T] f32
  void* losses = nullptr;    // [T] f32
  void* logits = nullptr;    // [T, V] untiled, [tile, V] tiled
  int64_t lm_tile = 0;       // rows of logits (T when untiled)
  int64_t mlp_tile = 0;      // rows of an MLP tile (0 when untiled)
  // MLP tile scratch (tiled MLP): pre-GELU, post-GELU, and their gradient.
  void* mlp_fch = nullptr;
  void* mlp_fcg = nullptr;
  void* mlp_grad = nullptr;  // [mlp_tile, F] (tiled) or [T, F]
  // Backward scratch. The attention output's gradient shares dln's memory: a layer's backward
  // reads dln (LN2's output gradient) before it writes datty, and reads datty (in the attention
  // backward) before it writes dln again (the qkv product's input gradient).
  void* dres = nullptr;   // [T, C] gradient of the residual stream
  void* dln = nullptr;    // [T, C] gradient of a LayerNorm's output
  void* datty = nullptr;  // [T, C] == dln
  void* dqkv = nullptr;   // [T, 3C]
  // Sequence parallelism: the all-to-alls' send and receive buffers, [T, 3C] each (the receive
  // buffer also holds qkv before its all-to-all and the head-split dqkv in the backward).
  void* a2a_send = nullptr;
  void* a2a_recv = nullptr;
  std::vector<void*> allocations, host_allocations;
};

GptModel::~GptModel() {
  if (backend_ != nullptr) {
    // Copies in flight may still read or write the buffers.
    backend_->synchronize();
    if (buffers_ != nullptr) {
      for (const CopyTicket& t : buffers_->offloaded) backend_->finish_copy(t);
      for (const CopyTicket& t : buffers_->prefetched) backend_->finish_copy(t);
      for (const CopyTicket& t : buffers_->kept_offloaded) backend_->finish_copy(t);
      for (const CopyTicket& t : buffers_->kept_prefetched) backend_->finish_copy(t);
      for (void* p : buffers_->allocations) backend_->release(p);
      for (void* p : buffers_->host_allocations) backend_->release_host(p);
    }
    backend_->release(weights_);
    if (grads_ != nullptr) backend_->release(grads_);
    for (float* g : gradient_buffers_) backend_->release(g);
  }
}

Status GptModel::create(const GptConfig& config, const SparsityConfig* sparse, int64_t batch,
                        const MemoryOptions& memory, Backend* backend,
                        std::unique_ptr<GptModel>* out, const float* initial_params,
                        Communicator* sequence_group) {
  SCIATTN_TRY(validate_gpt_config(config));
  if (batch < 1) {
    return Status::invalid_argument(
        "the micro-batch (train_micro_batch_size_per_gpu) must be "
        ">= 1; got " +
        std::to_string(batch));
  }
  SCIATTN_TRY(check_memory_options(memory));
  if (backend == nullptr) return Status::invalid_argument("GptModel::create: no back end");
  const int64_t sp = sequence_group != nullptr ? sequence_group->world_size() : 1;
  SCIATTN_TRY(check_sequence_parallel(config, sp));
  std::unique_ptr<GptModel> m(new GptModel());
  if (sp > 1) {
    m->sp_comm_ = sequence_group;
    m->sp_size_ = sp;
    m->sp_rank_ = sequence_group->rank();
  }
  m->config_ = config;
  m->memory_ = memory;
  m->memory_.checkpoint_layers = memory.checkpoint_layers || memory.offload_checkpoints;
  m->batch_ = batch;
  m->backend_ = backend;
  m->act_ = backend->compute_dtype();
  m->device_ = backend->device();
  m->token_chunk_ = backend->token_chunk();
  m->layout_ = gpt_parameter_layout(config, memory.parameter_multiple);
  const int64_t heads = config.n_heads / sp;
  SCIATTN_TRY(plan_attention(config, sparse, &m->attention_, m->sp_rank_ * heads, heads));
  SCIATTN_TRY(backend->prepare_index(&m->attention_.index));
  SCIATTN_TRY(m->plan_and_allocate(true, initial_params));
  *out = std::move(m);
  return Status::ok_status();
}

Status plan_gpt_memory(const GptConfig& config, const SparsityConfig* sparse, int64_t batch,
                       const MemoryOptions& memory, DType compute_dtype, int64_t token_chunk,
                       Device device, MemoryLedger* out, int64_t sequence_parallel_size) {
  SCIATTN_TRY(validate_gpt_config(config));
  SCIATTN_TRY(check_sequence_parallel(config, sequence_parallel_size));
  if (batch < 1) return Status::invalid_argument("plan_gpt_memory: batch must be >= 1");
  if (token_chunk < 1) return Status::invalid_argument("plan_gpt_memory: token_chunk must be >= 1");
  SCIATTN_TRY(check_memory_options(memory));
  GptModel m;
  m.config_ = config;
  m.memory_ = memory;
  m.memory_.checkpoint_layers = memory.checkpoint_layers || memory.offload_checkpoints;
  m.batch_ = batch;
  m.act_ = compute_dtype;
  m.device_ = device;
  m.token_chunk_ = token_chunk;
  m.sp_size_ = sequence_parallel_size;
  m.layout_ = gpt_parameter_layout(config, memory.parameter_multiple);
  SCIATTN_TRY(attention_padding(config, sparse, &m.attention_.block, &m.attention_.padded_length));
  SCIATTN_TRY(m.plan_and_allocate(false));
  *out = m.ledger_;
  return Status::ok_status();
}

Status GptModel::plan_and_allocate(bool allocate, const float* initial_params) {
  buffers_ = std::make_unique<Buffers>();
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  // T: this rank's tokens; H: the heads it attends over (all without sequence parallelism).
  const int64_t T = local_tokens(), C = c.d_model, F = c.mlp_width();
  const int64_t V = c.vocab_size, H = c.n_heads / sp_size_, Lp = attention_.padded_length;
  const bool sp = sp_size_ > 1;
  const int64_t n = c.n_layers;
  const int64_t chunk = token_chunk_;
  const Device dev = device_;
  const int64_t es = static_cast<int64_t>(dtype_size(act_));
  constexpr int64_t f4 = 4;

  // Carves consecutive arrays out of one allocation, each on 64 bytes.
  struct Carver {
    std::vector<std::pair<void**, int64_t>> parts;  // where the address goes, bytes
    void add(void** at, int64_t count, int64_t elem_bytes) {
      parts.push_back({at, round_up(count * elem_bytes, 64)});
    }
    uint64_t bytes() const {
      uint64_t total = 0;
      for (const auto& p : parts) total += static_cast<uint64_t>(p.second);
      return total;
    }
    void place(void* base) const {
      auto* at = static_cast<std::byte*>(base);
      for (const auto& p : parts) {
        *p.first = at;
        at += p.second;
      }
    }
  };
  // One ledger entry and, when allocating, one allocation on the device or in host memory.
  auto carve = [&](const Carver& cv, const std::string& name, const std::string& category,
                   unsigned phases, bool host = false) -> Status {
    ledger_.add(name, category, host ? Device::kCpu : dev, cv.bytes(), phases);
    if (!allocate) return Status::ok_status();
    void* base = nullptr;
    if (host) {
      SCIATTN_TRY(backend_->allocate_host(cv.bytes(), &base));
      b.host_allocations.push_back(base);
    } else {
      SCIATTN_TRY(backend_->allocate(cv.bytes(), &base));
      b.allocations.push_back(base);
    }
    cv.place(base);
    return Status::ok_status();
  };

  // Model states: the weights in the compute dtype and the fp32 gradients.
  const uint64_t weight_bytes = static_cast<uint64_t>(layout_.total * es);
  ledger_.add(std::string("weights (") + dtype_name(act_) + ")", "model states", dev, weight_bytes,
              kPhaseAll);
  if (allocate) SCIATTN_TRY(backend_->allocate(weight_bytes, &weights_));
  SCIATTN_TRY(plan_gradients(allocate));
  if (allocate) {
    if (initial_params != nullptr) {
      SCIATTN_TRY(set_weights(initial_params));
    } else {
      std::vector<float> host(static_cast<size_t>(layout_.total));
      init_gpt_parameters(c, layout_, host.data());
      SCIATTN_TRY(set_weights(host.data()));
    }
  }

  // Tokens.
  {
    Carver cv;
    void* tok = nullptr;
    cv.add(&tok, 2 * T, sizeof(int32_t));
    SCIATTN_TRY(
        carve(cv, "token ids (inputs, targets)", "activations", kPhaseForward | kPhaseBackward));
    b.inputs = static_cast<int32_t*>(tok);
    b.targets = tok == nullptr ? nullptr : b.inputs + T;
  }

  // The residual stream at the layer boundaries: the layers' inputs, which checkpointing keeps.
  const bool offload = memory_.offload_checkpoints;
  b.resid.assign(static_cast<size_t>(offload ? 2 : n + 1), nullptr);
  {
    Carver cv;
    for (void*& r : b.resid) cv.add(&r, T * C, es);
    const std::string name = offload ? "layer boundaries in use (2 of [T, C])"
                             : memory_.checkpoint_layers
                                 ? "layer inputs (the checkpoints), [L+1, T, C]"
                                 : "residual stream, [L+1, T, C]";
    SCIATTN_TRY(carve(cv, name, "activations", kPhaseForward | kPhaseBackward));
  }
  if (offload) {
    b.offloaded.assign(static_cast<size_t>(n), CopyTicket{});
    b.prefetched.assign(static_cast<size_t>(n), CopyTicket{});
    if (n > 1) {
      Carver cv;
      cv.add(&b.host_checkpoints, (n - 1) * T * C, es);
      SCIATTN_TRY(carve(cv, "offloaded checkpoints (layer inputs 0 .. L-2), [L-1, T, C]",
                        "activations", kPhaseForward | kPhaseBackward, true));
    }
  }

  // Kept attention outputs. When every layer keeps them, the recomputed set holds neither the
  // output (the token split without sequence parallelism, the head split with it) nor the
  // log-sum-exp.
  const int64_t kept_layers = kept_attention_layers();
  const bool kept = kept_layers == n;
  if (kept_layers > 0) {
    const bool offload_kept = offloads_attention_outputs();
    const int64_t slots = offload_kept ? std::min<int64_t>(kept_layers, 2) : kept_layers;
    b.kept_output.assign(static_cast<size_t>(slots), nullptr);
    b.kept_lse.assign(static_cast<size_t>(slots), nullptr);
    Carver cv;
    for (size_t i = 0; i < b.kept_output.size(); ++i) {
      cv.add(&b.kept_output[i], T * C, es);
      cv.add(&b.kept_lse[i], batch_ * H * Lp, f4);
    }
    SCIATTN_TRY(carve(
        cv,
        std::string(offload_kept ? "attention outputs kept, in use " : "attention outputs kept ") +
            "(output and log-sum-exp), " + std::to_string(slots) + " x ([T, C] + [B, H, Lp] f32)",
        "activations", kPhaseForward | kPhaseBackward));
    if (offload_kept) {
      b.kept_offloaded.assign(static_cast<size_t>(2 * kept_layers), CopyTicket{});
      b.kept_prefetched.assign(static_cast<size_t>(2 * kept_layers), CopyTicket{});
      if (kept_layers > 2) {
        Carver host;
        host.add(&b.host_kept_output, (kept_layers - 2) * T * C, es);
        host.add(&b.host_kept_lse, (kept_layers - 2) * batch_ * H * Lp, f4);
        SCIATTN_TRY(carve(host,
                          "offloaded attention outputs (kept layers 0 .. k-3), [k-2] x ([T, C] + "
                          "[B, H, Lp] f32)",
                          "activations", kPhaseForward | kPhaseBackward, true));
      }
    }
  }

  // Per-layer activations: all layers, or one recomputed set.
  b.mlp_tile = memory_.mlp_tile_tokens > 0
                   ? std::min(round_up(memory_.mlp_tile_tokens, chunk), round_up(T, chunk))
                   : 0;
  const bool mlp_tiled = b.mlp_tile > 0;
  const int64_t sets = memory_.checkpoint_layers ? 1 : n;
  b.acts.assign(static_cast<size_t>(sets), LayerActivations{});
  for (int64_t l = 0; l < sets; ++l) {
    LayerActivations& a = b.acts[static_cast<size_t>(l)];
    Carver cv;
    cv.add(&a.ln1, T * C, es);
    cv.add(&a.ln1_mean, T, f4);
    cv.add(&a.ln1_rstd, T, f4);
    cv.add(&a.qkv, 3 * T * C, es);
    if (!kept || sp) cv.add(&a.atty, T * C, es);
    if (sp && !kept) cv.add(&a.atty_heads, T * C, es);
    if (!kept) cv.add(&a.lse, batch_ * H * Lp, f4);
    cv.add(&a.r2, T * C, es);
    cv.add(&a.ln2, T * C, es);
    cv.add(&a.ln2_mean, T, f4);
    cv.add(&a.ln2_rstd, T, f4);
    if (!mlp_tiled) {
      cv.add(&a.fch, T * F, es);
      cv.add(&a.fcg, T * F, es);
    }
    const std::string name = memory_.checkpoint_layers
                                 ? "one layer's activations (recomputed per layer)"
                                 : "layer " + std::to_string(l) + " activations";
    SCIATTN_TRY(carve(cv, name, "activations", kPhaseForward | kPhaseBackward));
  }
  if (mlp_tiled) {
    Carver cv;
    cv.add(&b.mlp_fch, b.mlp_tile * F, es);
    cv.add(&b.mlp_fcg, b.mlp_tile * F, es);
    cv.add(&b.mlp_grad, b.mlp_tile * F, es);
    SCIATTN_TRY(carve(cv, "MLP tile (" + std::to_string(b.mlp_tile) + " tokens x 3 x F)", "scratch",
                      kPhaseForward | kPhaseBackward));
  } else {
    Carver cv;
    cv.add(&b.mlp_grad, T * F, es);
    SCIATTN_TRY(carve(cv, "MLP gradient [T, F]", "scratch", kPhaseBackward));
  }

  // Final LayerNorm and the LM head.
  {
    Carver cv;
    cv.add(&b.lnf, T * C, es);
    cv.add(&b.lnf_mean, T, f4);
    cv.add(&b.lnf_rstd, T, f4);
    cv.add(&b.losses, T, f4);
    SCIATTN_TRY(
        carve(cv, "final LayerNorm and losses", "activations", kPhaseForward | kPhaseBackward));
  }
  b.lm_tile = memory_.lm_head_tile_tokens > 0
                  ? std::min(round_up(memory_.lm_head_tile_tokens, chunk), round_up(T, chunk))
                  : T;
  {
    Carver cv;
    cv.add(&b.logits, b.lm_tile * V, es);
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
    cv.add(&b.dres, T * C, es);
    cv.add(&b.dln, T * C, es);
    cv.add(&b.dqkv, 3 * T * C, es);
    SCIATTN_TRY(carve(cv, "backward scratch (dresidual, dLN = dattn, dqkv)", "scratch",
                      kPhaseForward | kPhaseBackward));
    b.datty = b.dln;
  }
  if (sp) {
    Carver cv;
    cv.add(&b.a2a_send, 3 * T * C, es);
    cv.add(&b.a2a_recv, 3 * T * C, es);
    SCIATTN_TRY(carve(cv, "sequence-parallel all-to-all buffers (send, receive), 2 of [T, 3C]",
                      "scratch", kPhaseForward | kPhaseBackward));
  }
  return Status::ok_status();
}

Status GptModel::plan_gradients(bool allocate) {
  const std::vector<ParameterGroup>& groups = layout_.groups;
  const auto group_count = static_cast<int64_t>(groups.size());
  auto elements = [&](int64_t g) {
    return groups[static_cast<size_t>(g)].end - groups[static_cast<size_t>(g)].begin;
  };
  const Device dev = device_;
  constexpr unsigned phases = kPhaseBackward | kPhaseOptimizer;
  group_grads_.assign(groups.size(), nullptr);
  if (memory_.layer_gradient_buffers == 0) {
    const uint64_t bytes = static_cast<uint64_t>(layout_.total) * sizeof(float);
    ledger_.add("gradients (f32)", "model states", dev, bytes, phases);
    if (!allocate) return Status::ok_status();
    SCIATTN_TRY(backend_->allocate(bytes, reinterpret_cast<void**>(&grads_)));
    for (int64_t g = 0; g < group_count; ++g) {
      group_grads_[static_cast<size_t>(g)] = grads_ + groups[static_cast<size_t>(g)].begin;
    }
    return Status::ok_status();
  }
  // Separate buffers: groups 0 (embeddings) and n + 1 (head) whole, and k buffers of the largest
  // layer group that the layers take in turn from the last layer down.
  const int64_t n = config_.n_layers;
  const int64_t k = std::min(memory_.layer_gradient_buffers, n);
  int64_t layer_elements = 0;
  for (int64_t l = 0; l < n; ++l) layer_elements = std::max(layer_elements, elements(l + 1));
  auto buffer = [&](int64_t count, const std::string& name, float** at) -> Status {
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(float);
    ledger_.add(name, "model states", dev, bytes, phases);
    if (!allocate) return Status::ok_status();
    SCIATTN_TRY(backend_->allocate(bytes, reinterpret_cast<void**>(at)));
    gradient_buffers_.push_back(*at);
    return backend_->fill_zero(*at, bytes);
  };
  SCIATTN_TRY(buffer(elements(0), "gradients (f32): embeddings' group", &group_grads_[0]));
  SCIATTN_TRY(buffer(elements(n + 1), "gradients (f32): head group",
                     &group_grads_[static_cast<size_t>(n + 1)]));
  std::vector<float*> shared(static_cast<size_t>(k), nullptr);
  for (int64_t i = 0; i < k; ++i) {
    // Reused after the buckets of the layer that used it are reduced.
    SCIATTN_TRY(
        buffer(layer_elements,
               "gradients (f32): layer buffer " + std::to_string(i) + " of " + std::to_string(k),
               &shared[static_cast<size_t>(i)]));
  }
  for (int64_t l = 0; l < n; ++l) {
    group_grads_[static_cast<size_t>(l + 1)] = shared[static_cast<size_t>((n - 1 - l) % k)];
  }
  return Status::ok_status();
}

Status GptModel::zero_grads() {
  if (grads_ != nullptr) {
    return backend_->fill_zero(grads_, static_cast<size_t>(layout_.total) * sizeof(float));
  }
  // Each buffer once (a layer buffer's size is that of the largest layer group).
  const int64_t n = config_.n_layers;
  for (int64_t g = 0; g < static_cast<int64_t>(layout_.groups.size()); ++g) {
    if (g >= 1 && g <= n && g + memory_.layer_gradient_buffers <= n) continue;
    const ParameterGroup& pg = layout_.groups[static_cast<size_t>(g)];
    SCIATTN_TRY(backend_->fill_zero(group_grads_[static_cast<size_t>(g)],
                                    static_cast<size_t>(pg.end - pg.begin) * sizeof(float)));
  }
  return Status::ok_status();
}

Status GptModel::set_weights(const float* host_params) {
  const size_t n = static_cast<size_t>(layout_.total);
  if (act_ == DType::kF32) {
    return backend_->copy_to_device(weights_, host_params, n * sizeof(float));
  }
  std::vector<std::byte> host(n * dtype_size(act_));
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    store_from_float(host.data(), act_, i, host_params[i]);
  }
  return backend_->copy_to_device(weights_, host.data(), host.size());
}

Status GptModel::get_weights(std::vector<float>* host_params) {
  const size_t n = static_cast<size_t>(layout_.total);
  std::vector<std::byte> host(n * dtype_size(act_));
  SCIATTN_TRY(backend_->copy_to_host(host.data(), weights_, host.size()));
  host_params->resize(n);
  const auto count = static_cast<int64_t>(n);
  float* dst = host_params->data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = load_as_float(host.data(), act_, i);
  return Status::ok_status();
}

void* GptModel::boundary(int64_t l) const {
  const size_t i = static_cast<size_t>(memory_.offload_checkpoints ? l % 2 : l);
  return buffers_->resid[i];
}

int64_t GptModel::kept_attention_layers() const {
  if (!memory_.checkpoint_layers) return 0;
  return std::clamp<int64_t>(memory_.keep_attention_layers, 0, config_.n_layers);
}

bool GptModel::keeps_attention(int64_t layer) const {
  return layer >= config_.n_layers - kept_attention_layers();
}

bool GptModel::offloads_attention_outputs() const {
  return memory_.offload_checkpoints && memory_.offload_attention_outputs &&
         kept_attention_layers() > 0;
}

LayerActivations GptModel::layer_activations(int64_t layer) const {
  const Buffers& b = *buffers_;
  LayerActivations a = b.acts[memory_.checkpoint_layers ? 0 : static_cast<size_t>(layer)];
  if (keeps_attention(layer)) {
    const int64_t i = layer - (config_.n_layers - kept_attention_layers());
    const auto slot = static_cast<size_t>(offloads_attention_outputs() ? i % 2 : i);
    (sp_size_ > 1 ? a.atty_heads : a.atty) = b.kept_output[slot];
    a.lse = b.kept_lse[slot];
  }
  return a;
}

Status GptModel::hook_forward(int64_t group) {
  return hooks_ != nullptr ? hooks_->before_forward(group) : Status::ok_status();
}
Status GptModel::hook_backward(int64_t group) {
  return hooks_ != nullptr ? hooks_->after_backward(group) : Status::ok_status();
}

// The views of one layer's parameters or gradients inside a flat buffer.
namespace {
struct LayerTensors {
  TensorView ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
      fcproj_b;
};
// `origin` is the flat element at `base` (a group's first, when a group has a buffer of its own).
TensorView slot_view_of(const TensorSlot& s, const void* base, DType dtype, Device device,
                        int64_t origin = 0) {
  const void* p = static_cast<const std::byte*>(base) +
                  (s.offset - origin) * static_cast<int64_t>(dtype_size(dtype));
  return s.shape.size() == 2 ? TensorView::contiguous(p, dtype, {s.shape[0], s.shape[1]}, device)
                             : TensorView::contiguous(p, dtype, {s.shape[0]}, device);
}
LayerTensors layer_tensors(const ParameterLayout& layout, const void* base, DType dtype,
                           Device device, int64_t layer, int64_t origin = 0) {
  const std::string h = "h" + std::to_string(layer) + ".";
  auto view = [&](const char* name) {
    return slot_view_of(*layout.find(h + name), base, dtype, device, origin);
  };
  return {view("ln1_w"),  view("ln1_b"),  view("qkv_w"),    view("qkv_b"),
          view("proj_w"), view("proj_b"), view("ln2_w"),    view("ln2_b"),
          view("fc_w"),   view("fc_b"),   view("fcproj_w"), view("fcproj_b")};
}
TensorView slot_view(const ParameterLayout& layout, const void* base, DType dtype, Device device,
                     const char* name) {
  const TensorSlot* s = layout.find(name);
  if (s == nullptr) return TensorView{};
  return slot_view_of(*s, base, dtype, device);
}
// Element `offset` of an array of `dtype`.
void* at(void* base, int64_t offset, DType dtype) {
  return static_cast<std::byte*>(base) + offset * static_cast<int64_t>(dtype_size(dtype));
}
// The learned position table [P, C] from row `first` on (a sequence-parallel rank's positions
// start there); absent stays absent (rotary positions).
TensorView position_rows(const TensorView& table, int64_t first) {
  if (!table.present() || first == 0) return table;
  return TensorView::contiguous(at(table.data, first * table.sizes[1], table.dtype), table.dtype,
                                {table.sizes[0] - first, table.sizes[1]}, table.device);
}
}  // namespace

TensorView GptModel::grad_view(const char* name) {
  const TensorSlot* s = layout_.find(name);
  if (s == nullptr) return TensorView{};
  size_t g = 0;
  while (g + 1 < layout_.groups.size() && layout_.groups[g + 1].begin <= s->offset) ++g;
  return slot_view_of(*s, group_grads_[g], DType::kF32, device_, layout_.groups[g].begin);
}

Status GptModel::upload_tokens(const int32_t* host, int32_t* dst) {
  const int64_t L = config_.sequence_length, Ls = L / sp_size_;
  if (sp_size_ == 1) {
    return backend_->copy_to_device(dst, host, static_cast<size_t>(batch_ * L) * sizeof(int32_t));
  }
  std::vector<int32_t> slice(static_cast<size_t>(batch_ * Ls));
  for (int64_t s = 0; s < batch_; ++s) {
    std::copy(host + s * L + sp_rank_ * Ls, host + s * L + (sp_rank_ + 1) * Ls,
              slice.begin() + s * Ls);
  }
  return backend_->copy_to_device(dst, slice.data(), slice.size() * sizeof(int32_t));
}

// The two layouts an all-to-all connects, for P ranks, tensors of `parts` x C values per token,
// E = C / P values per part and rank (H/P heads of D):
//   token split: [B, Ls, parts, P, E]   this rank's Ls = L / P tokens, every head
//   head split:  [B, P, Ls, parts, E]   every token (the P slices in order), this rank's heads
//   chunks:      [P, B, Ls, parts, E]   the all-to-all's buffers: chunk q goes to (comes from)
//                                       rank q
// Sending to the head split: chunk q holds this rank's tokens of rank q's heads, and the chunk
// received from rank q is rank q's tokens of this rank's heads, token slice q of the head split.
// The way back is the same with the two layouts' roles exchanged.
Status GptModel::all_to_all_views(const void* src, void* dst, int64_t parts, bool to_heads) {
  const int64_t P = sp_size_, B = batch_, Ls = config_.sequence_length / P;
  const int64_t E = config_.d_model / P;
  const DType t = act_;
  const Device d = device_;
  Buffers& b = *buffers_;
  // The token split and the head split seen in chunk order [P, B, Ls, parts, E].
  auto token_split = [&](const void* p) {
    return TensorView::strided(p, t, {P, B, Ls, parts, E},
                               {E, Ls * parts * P * E, parts * P * E, P * E, 1}, d);
  };
  auto head_split = [&](const void* p) {
    return TensorView::strided(p, t, {P, B, Ls, parts, E},
                               {Ls * parts * E, P * Ls * parts * E, parts * E, E, 1}, d);
  };
  auto chunks = [&](const void* p) {
    return TensorView::contiguous(p, t, {P, B, Ls, parts, E}, d);
  };
  // No host synchronization between the copy and the all-to-all: a communicator over device
  // memory reads its inputs after the work queued so far on the back end's stream (communicator.h).
  SCIATTN_TRY(
      backend_->strided_copy({to_heads ? token_split(src) : head_split(src), chunks(b.a2a_send)}));
  SCIATTN_TRY(sp_comm_->all_to_all(b.a2a_send, b.a2a_recv, B * Ls * parts * E, t));
  return backend_->strided_copy(
      {chunks(b.a2a_recv), to_heads ? head_split(dst) : token_split(dst)});
}

Status GptModel::sequence_to_heads(const void* src, void* dst, int64_t parts) {
  return all_to_all_views(src, dst, parts, true);
}
Status GptModel::heads_to_sequence(const void* src, void* dst, int64_t parts) {
  return all_to_all_views(src, dst, parts, false);
}

Status GptModel::layer_forward(int64_t layer, const void* in, void* out, bool recompute) {
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  // T: this rank's tokens; H: the heads its attention covers (all without sequence parallelism).
  const int64_t T = local_tokens(), C = c.d_model, F = c.mlp_width();
  const int64_t H = c.n_heads / sp_size_, D = c.head_dim(), L = c.sequence_length;
  const DType t = act_;
  const Device d = device_;
  auto act2 = [&](const void* p, int64_t rows, int64_t cols) {
    return TensorView::contiguous(p, t, {rows, cols}, d);
  };
  auto f1 = [&](const void* p, int64_t n) {
    return TensorView::contiguous(p, DType::kF32, {n}, d);
  };
  const LayerActivations a = layer_activations(layer);
  const LayerTensors w = layer_tensors(layout_, weights_, t, d, layer);
  const float eps = static_cast<float>(c.layer_norm_eps);

  SCIATTN_TRY(be.layernorm_forward({act2(in, T, C), w.ln1_w, w.ln1_b, act2(a.ln1, T, C),
                                    f1(a.ln1_mean, T), f1(a.ln1_rstd, T), eps}));
  const bool sp = sp_size_ > 1;
  // With sequence parallelism the product goes to the receive buffer (free until the all-to-all
  // reads it), and the all-to-all brings every token of this rank's heads into a.qkv.
  void* qkv_tokens = sp ? b.a2a_recv : a.qkv;
  SCIATTN_TRY(be.linear_forward({act2(a.ln1, T, C), w.qkv_w, w.qkv_b, act2(qkv_tokens, T, 3 * C)}));
  if (sp) SCIATTN_TRY(sequence_to_heads(qkv_tokens, a.qkv, 3));
  // Rotary positions on the whole sequence: with sequence parallelism, after the all-to-all, so
  // that each token turns by its global position.
  const TensorView qkv5 = TensorView::contiguous(a.qkv, t, {batch_, L, 3, H, D}, d);
  if (c.positions == PositionEncoding::kRotary) {
    SCIATTN_TRY(be.rotary({qkv5, static_cast<float>(c.rotary_base), false}));
  }
  void* atty_heads = sp ? a.atty_heads : a.atty;
  const TensorView atty4 = TensorView::contiguous(atty_heads, t, {batch_, L, H, D}, d);
  const TensorView lse =
      TensorView::contiguous(a.lse, DType::kF32, {batch_, H, attention_.padded_length}, d);
  // Recomputing with the outputs kept: the attention's output and log-sum-exp are already there.
  if (!(recompute && keeps_attention(layer))) {
    SCIATTN_TRY(be.attention_forward({&attention_.index, qkv5, atty4, lse}));
  }
  if (sp) SCIATTN_TRY(heads_to_sequence(atty_heads, a.atty, 1));
  SCIATTN_TRY(be.linear_forward({act2(a.atty, T, C), w.proj_w, w.proj_b, act2(a.r2, T, C)}));
  SCIATTN_TRY(be.add({act2(a.r2, T, C), act2(in, T, C), act2(a.r2, T, C)}));
  SCIATTN_TRY(be.layernorm_forward({act2(a.r2, T, C), w.ln2_w, w.ln2_b, act2(a.ln2, T, C),
                                    f1(a.ln2_mean, T), f1(a.ln2_rstd, T), eps}));
  // MLP. The backward of a recomputed layer needs only what precedes the MLP's output, and a
  // tiled MLP recomputes its own tiles there.
  if (b.mlp_tile > 0) {
    if (recompute) return Status::ok_status();
    for (int64_t r0 = 0; r0 < T; r0 += b.mlp_tile) {
      const int64_t n = std::min(b.mlp_tile, T - r0);
      SCIATTN_TRY(be.linear_forward(
          {act2(at(a.ln2, r0 * C, t), n, C), w.fc_w, w.fc_b, act2(b.mlp_fch, n, F)}));
      SCIATTN_TRY(be.gelu_forward({act2(b.mlp_fch, n, F), act2(b.mlp_fcg, n, F)}));
      SCIATTN_TRY(be.linear_forward(
          {act2(b.mlp_fcg, n, F), w.fcproj_w, w.fcproj_b, act2(at(out, r0 * C, t), n, C)}));
    }
  } else {
    SCIATTN_TRY(be.linear_forward({act2(a.ln2, T, C), w.fc_w, w.fc_b, act2(a.fch, T, F)}));
    SCIATTN_TRY(be.gelu_forward({act2(a.fch, T, F), act2(a.fcg, T, F)}));
    if (recompute) return Status::ok_status();
    SCIATTN_TRY(be.linear_forward({act2(a.fcg, T, F), w.fcproj_w, w.fcproj_b, act2(out, T, C)}));
  }
  SCIATTN_TRY(be.add({act2(out, T, C), act2(a.r2, T, C), act2(out, T, C)}));
  return Status::ok_status();
}

Status GptModel::layer_backward(int64_t layer, const void* in) {
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  const int64_t T = local_tokens(), C = c.d_model, F = c.mlp_width();
  const int64_t H = c.n_heads / sp_size_, D = c.head_dim();
  const DType t = act_;
  const Device d = device_;
  auto act2 = [&](const void* p, int64_t rows, int64_t cols) {
    return TensorView::contiguous(p, t, {rows, cols}, d);
  };
  auto f1 = [&](const void* p, int64_t n) {
    return TensorView::contiguous(p, DType::kF32, {n}, d);
  };
  const LayerActivations a = layer_activations(layer);
  const LayerTensors w = layer_tensors(layout_, weights_, t, d, layer);
  const LayerTensors g = layer_tensors(layout_, group_grads(layer + 1), DType::kF32, d, layer,
                                       layout_.groups[static_cast<size_t>(layer + 1)].begin);

  // MLP: dres holds the gradient of the layer's output, which is also that of the MLP's output.
  if (b.mlp_tile > 0) {
    for (int64_t r0 = 0; r0 < T; r0 += b.mlp_tile) {
      const int64_t n = std::min(b.mlp_tile, T - r0);
      const TensorView ln2 = act2(at(a.ln2, r0 * C, t), n, C);
      SCIATTN_TRY(be.linear_forward({ln2, w.fc_w, w.fc_b, act2(b.mlp_fch, n, F)}));
      SCIATTN_TRY(be.gelu_forward({act2(b.mlp_fch, n, F), act2(b.mlp_fcg, n, F)}));
      SCIATTN_TRY(
          be.linear_backward({act2(b.mlp_fcg, n, F), w.fcproj_w, act2(at(b.dres, r0 * C, t), n, C),
                              act2(b.mlp_grad, n, F), g.fcproj_w, g.fcproj_b}));
      SCIATTN_TRY(be.gelu_backward(
          {act2(b.mlp_fch, n, F), act2(b.mlp_grad, n, F), act2(b.mlp_grad, n, F)}));
      SCIATTN_TRY(be.linear_backward(
          {ln2, w.fc_w, act2(b.mlp_grad, n, F), act2(at(b.dln, r0 * C, t), n, C), g.fc_w, g.fc_b}));
    }
  } else {
    SCIATTN_TRY(be.linear_backward({act2(a.fcg, T, F), w.fcproj_w, act2(b.dres, T, C),
                                    act2(b.mlp_grad, T, F), g.fcproj_w, g.fcproj_b}));
    SCIATTN_TRY(
        be.gelu_backward({act2(a.fch, T, F), act2(b.mlp_grad, T, F), act2(b.mlp_grad, T, F)}));
    SCIATTN_TRY(be.linear_backward(
        {act2(a.ln2, T, C), w.fc_w, act2(b.mlp_grad, T, F), act2(b.dln, T, C), g.fc_w, g.fc_b}));
  }
  // dres += LN2's input gradient: now the gradient of r2 = x + attention.
  SCIATTN_TRY(
      be.layernorm_backward({act2(a.r2, T, C), w.ln2_w, f1(a.ln2_mean, T), f1(a.ln2_rstd, T),
                             act2(b.dln, T, C), act2(b.dres, T, C), g.ln2_w, g.ln2_b}));
  // Attention (datty is dln's memory: LN2's backward has read dln).
  SCIATTN_TRY(be.linear_backward(
      {act2(a.atty, T, C), w.proj_w, act2(b.dres, T, C), act2(b.datty, T, C), g.proj_w, g.proj_b}));
  const int64_t L = c.sequence_length;
  const bool sp = sp_size_ > 1;
  // With sequence parallelism the output's gradient goes to the head split (in dqkv's memory,
  // free until the last all-to-all below), the attention's dqkv to the receive buffer, and the
  // last all-to-all brings this rank's tokens' dqkv (all heads) into dqkv.
  void* datty_heads = sp ? b.dqkv : b.datty;
  void* dqkv_heads = sp ? b.a2a_recv : b.dqkv;
  if (sp) SCIATTN_TRY(sequence_to_heads(b.datty, datty_heads, 1));
  const TensorView qkv5 = TensorView::contiguous(a.qkv, t, {batch_, L, 3, H, D}, d);
  const TensorView dqkv5 = TensorView::contiguous(dqkv_heads, t, {batch_, L, 3, H, D}, d);
  SCIATTN_TRY(be.attention_backward(
      {&attention_.index, qkv5,
       TensorView::contiguous(sp ? a.atty_heads : a.atty, t, {batch_, L, H, D}, d),
       TensorView::contiguous(a.lse, DType::kF32, {batch_, H, attention_.padded_length}, d),
       TensorView::contiguous(datty_heads, t, {batch_, L, H, D}, d), dqkv5}));
  if (c.positions == PositionEncoding::kRotary) {
    SCIATTN_TRY(be.rotary({dqkv5, static_cast<float>(c.rotary_base), true}));
  }
  if (sp) SCIATTN_TRY(heads_to_sequence(dqkv_heads, b.dqkv, 3));
  SCIATTN_TRY(be.linear_backward(
      {act2(a.ln1, T, C), w.qkv_w, act2(b.dqkv, T, 3 * C), act2(b.dln, T, C), g.qkv_w, g.qkv_b}));
  // dres += LN1's input gradient: now the gradient of the layer's input.
  SCIATTN_TRY(be.layernorm_backward({act2(in, T, C), w.ln1_w, f1(a.ln1_mean, T), f1(a.ln1_rstd, T),
                                     act2(b.dln, T, C), act2(b.dres, T, C), g.ln1_w, g.ln1_b}));
  return Status::ok_status();
}

Status GptModel::copy_kept_attention(int64_t i, CopyDirection direction) {
  Buffers& b = *buffers_;
  const int64_t T = local_tokens(), C = config_.d_model;
  const int64_t lse_count = batch_ * (config_.n_heads / sp_size_) * attention_.padded_length;
  const auto slot = static_cast<size_t>(i % 2);
  void* host_out = at(b.host_kept_output, i * T * C, act_);
  void* host_lse = at(b.host_kept_lse, i * lse_count, DType::kF32);
  const size_t out_bytes = static_cast<size_t>(T * C) * dtype_size(act_);
  const size_t lse_bytes = static_cast<size_t>(lse_count) * sizeof(float);
  const bool to_host = direction == CopyDirection::kToHost;
  std::vector<CopyTicket>& tickets = to_host ? b.kept_offloaded : b.kept_prefetched;
  const auto t = static_cast<size_t>(2 * i);
  SCIATTN_TRY(backend_->copy_async(to_host ? host_out : b.kept_output[slot],
                                   to_host ? b.kept_output[slot] : host_out, out_bytes, direction,
                                   &tickets[t]));
  return backend_->copy_async(to_host ? host_lse : b.kept_lse[slot],
                              to_host ? b.kept_lse[slot] : host_lse, lse_bytes, direction,
                              &tickets[t + 1]);
}

Status GptModel::run_forward(const int32_t* inputs, const int32_t* targets, bool with_grad,
                             float grad_scale, MicroBatchResult* out) {
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  // L: the tokens of a sequence this rank holds; T: of the micro-batch.
  const int64_t L = c.sequence_length / sp_size_, T = local_tokens(), C = c.d_model;
  const int64_t V = c.vocab_size, n = c.n_layers;
  const DType t = act_;
  const Device d = device_;
  const size_t boundary_bytes = static_cast<size_t>(T * C) * dtype_size(t);
  const bool offload = memory_.offload_checkpoints && with_grad;
  auto act2 = [&](const void* p, int64_t rows, int64_t cols) {
    return TensorView::contiguous(p, t, {rows, cols}, d);
  };
  auto f1 = [&](const void* p, int64_t k) {
    return TensorView::contiguous(p, DType::kF32, {k}, d);
  };
  SCIATTN_TRY(upload_tokens(inputs, b.inputs));
  SCIATTN_TRY(upload_tokens(targets, b.targets));

  // Boundary l (l <= n - 2) goes to host memory as soon as it is written; the buffer it is in
  // is written again by layer l + 1, which waits for the copy.
  auto offload_boundary = [&](int64_t l) -> Status {
    if (!offload || l > n - 2) return Status::ok_status();
    return be.copy_async(at(b.host_checkpoints, l * T * C, t), boundary(l), boundary_bytes,
                         CopyDirection::kToHost, &b.offloaded[static_cast<size_t>(l)]);
  };
  SCIATTN_TRY(hook_forward(0));
  const TensorView wte = slot_view(layout_, weights_, t, d, "wte");
  const TensorView wpe = position_rows(slot_view(layout_, weights_, t, d, "wpe"), sp_rank_ * L);
  SCIATTN_TRY(be.embedding_forward({b.inputs, batch_, L, wte, wpe, act2(boundary(0), T, C)}));
  SCIATTN_TRY(offload_boundary(0));
  // Offloaded attention outputs: kept layer i's slot held kept layer i - 2, whose copy to the
  // host must have finished before the layer writes it; kept layers 0 .. k - 3 leave as soon as
  // they are written (the last two stay for the backward, which starts with them).
  const bool offload_kept = with_grad && offloads_attention_outputs();
  const int64_t k = kept_attention_layers();
  for (int64_t l = 0; l < n; ++l) {
    SCIATTN_TRY(hook_forward(l + 1));
    if (offload && l >= 1) {
      // boundary(l + 1) still holds boundary l - 1 until its copy to the host has finished.
      SCIATTN_TRY(be.wait_for_copy(b.offloaded[static_cast<size_t>(l - 1)]));
    }
    const int64_t i = l - (n - k);  // kept layer index (negative: not kept)
    if (offload_kept && i >= 2) {
      for (int part = 0; part < 2; ++part) {
        SCIATTN_TRY(be.wait_for_copy(b.kept_offloaded[static_cast<size_t>(2 * (i - 2) + part)]));
      }
    }
    SCIATTN_TRY(layer_forward(l, boundary(l), boundary(l + 1), false));
    SCIATTN_TRY(offload_boundary(l + 1));
    if (offload_kept && i >= 0 && i <= k - 3) {
      SCIATTN_TRY(copy_kept_attention(i, CopyDirection::kToHost));
    }
  }
  SCIATTN_TRY(hook_forward(n + 1));
  const void* last = boundary(n);
  const float eps = static_cast<float>(c.layer_norm_eps);
  SCIATTN_TRY(be.layernorm_forward({act2(last, T, C), slot_view(layout_, weights_, t, d, "lnf_w"),
                                    slot_view(layout_, weights_, t, d, "lnf_b"), act2(b.lnf, T, C),
                                    f1(b.lnf_mean, T), f1(b.lnf_rstd, T), eps}));
  const char* head = c.tie_embeddings ? "wte" : "lm_head";
  const TensorView head_w = slot_view(layout_, weights_, t, d, head);
  if (memory_.lm_head_tile_tokens > 0) {
    // The loss gradient needs nothing from later layers: with tiles, form it right here.
    LmHeadParams p;
    p.in = act2(b.lnf, T, C);
    p.weight = head_w;
    p.targets = b.targets;
    p.losses = f1(b.losses, T);
    if (with_grad) {
      p.din = act2(b.dln, T, C);
      p.dweight = grad_view(head);
    }
    p.logits = act2(b.logits, b.lm_tile, V);
    p.grad_scale = grad_scale;
    p.tile_rows = b.lm_tile;
    SCIATTN_TRY(be.lm_head_loss(p));
  } else {
    // Untiled: all [T, V] logits stay until forward_backward's lm_head_backward.
    SCIATTN_TRY(be.lm_head_forward(
        {act2(b.lnf, T, C), head_w, f1(b.losses, T), b.targets, act2(b.logits, T, V)}));
  }
  (void)out;
  return Status::ok_status();
}

Status GptModel::read_losses(MicroBatchResult* out) {
  const int64_t T = local_tokens();
  std::vector<float> losses(static_cast<size_t>(T));
  SCIATTN_TRY(
      backend_->copy_to_host(losses.data(), buffers_->losses, losses.size() * sizeof(float)));
  out->loss_sum = 0.0;
  for (float x : losses) out->loss_sum += static_cast<double>(x);
  out->tokens = T;
  return Status::ok_status();
}

Status GptModel::forward_loss(const int32_t* inputs, const int32_t* targets,
                              MicroBatchResult* out) {
  SCIATTN_TRY(run_forward(inputs, targets, false, 0.0f, out));
  return read_losses(out);
}

Status GptModel::forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                                  MicroBatchResult* out) {
  SCIATTN_TRY(run_forward(inputs, targets, true, grad_scale, out));
  Backend& be = *backend_;
  Buffers& b = *buffers_;
  const GptConfig& c = config_;
  const int64_t L = c.sequence_length / sp_size_, T = local_tokens(), C = c.d_model;
  const int64_t V = c.vocab_size, n = c.n_layers;
  const DType t = act_;
  const Device d = device_;
  const bool offload = memory_.offload_checkpoints;
  auto act2 = [&](const void* p, int64_t rows, int64_t cols) {
    return TensorView::contiguous(p, t, {rows, cols}, d);
  };
  auto f1 = [&](const void* p, int64_t k) {
    return TensorView::contiguous(p, DType::kF32, {k}, d);
  };
  const char* head = c.tie_embeddings ? "wte" : "lm_head";
  if (memory_.lm_head_tile_tokens == 0) {
    SCIATTN_TRY(be.lm_head_backward({act2(b.lnf, T, C), slot_view(layout_, weights_, t, d, head),
                                     b.targets, act2(b.logits, T, V), act2(b.dln, T, C),
                                     grad_view(head), grad_scale}));
  }
  // Final LayerNorm: dres = its input gradient (dln holds the LM head's input gradient).
  SCIATTN_TRY(be.fill_zero(b.dres, static_cast<size_t>(T * C) * dtype_size(t)));
  SCIATTN_TRY(
      be.layernorm_backward({act2(boundary(n), T, C), slot_view(layout_, weights_, t, d, "lnf_w"),
                             f1(b.lnf_mean, T), f1(b.lnf_rstd, T), act2(b.dln, T, C),
                             act2(b.dres, T, C), grad_view("lnf_w"), grad_view("lnf_b")}));
  SCIATTN_TRY(hook_backward(n + 1));
  const size_t boundary_bytes = static_cast<size_t>(T * C) * dtype_size(t);
  for (int64_t l = n - 1; l >= 0; --l) {
    if (offload) {
      // Boundary l came back during layer l + 1's backward (boundary n - 1 never left); fetch
      // boundary l - 1 into the other buffer, whose boundary l + 1 the work queued so far has
      // finished with, while this layer computes.
      if (l < n - 1) SCIATTN_TRY(be.wait_for_copy(b.prefetched[static_cast<size_t>(l)]));
      if (l >= 1) {
        SCIATTN_TRY(be.copy_async(boundary(l - 1), at(b.host_checkpoints, (l - 1) * T * C, t),
                                  boundary_bytes, CopyDirection::kToDevice,
                                  &b.prefetched[static_cast<size_t>(l - 1)]));
      }
    }
    if (offloads_attention_outputs() && keeps_attention(l)) {
      // Kept layer i is in its slot: the last two never left; the others came back during kept
      // layer i + 1's backward. Fetch kept layer i - 1 (when it left) into the other slot,
      // whose kept layer i + 1 the work queued so far has finished with.
      const int64_t k = kept_attention_layers(), i = l - (n - k);
      if (i <= k - 3) {
        for (int part = 0; part < 2; ++part) {
          SCIATTN_TRY(be.wait_for_copy(b.kept_prefetched[static_cast<size_t>(2 * i + part)]));
        }
      }
      if (i >= 1 && i - 1 <= k - 3) {
        SCIATTN_TRY(copy_kept_attention(i - 1, CopyDirection::kToDevice));
      }
    }
    if (memory_.checkpoint_layers) {
      // Recompute the layer from its saved input; only the activations its backward reads.
      SCIATTN_TRY(layer_forward(l, boundary(l), nullptr, true));
    }
    SCIATTN_TRY(layer_backward(l, boundary(l)));
    SCIATTN_TRY(hook_backward(l + 1));
  }
  SCIATTN_TRY(be.embedding_backward({b.inputs, batch_, L, act2(b.dres, T, C), grad_view("wte"),
                                     position_rows(grad_view("wpe"), sp_rank_ * L)}));
  SCIATTN_TRY(hook_backward(0));
  // The losses are read last, so the backward was queued without waiting for the forward.
  return read_losses(out);
}

double GptModel::flops_per_micro_batch() const {
  const double T = static_cast<double>(local_tokens());
  const double b = static_cast<double>(attention_.block);
  // Per layer: forward 4 * B * nnz * b^2 * D, backward 10 * ... (sparse_attention_*_flops).
  const double attention =
      14.0 * static_cast<double>(batch_) * static_cast<double>(attention_.index.nnz) * b * b *
      static_cast<double>(config_.head_dim()) * static_cast<double>(config_.n_layers);
  return 6.0 * static_cast<double>(layout_.matmul_parameter_count()) * T + attention;
}

}  // namespace sciattn::train

// The GPT model of the trainer: its configuration (the model JSON file), the layout of its
// parameters in one contiguous buffer, and the forward and backward of one micro-batch on a
// Backend, with the memory techniques (per-layer activation checkpointing, MLP tiles, LM-head
// tiles). Public API of the trainer (plain C++17).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/status.h"
#include "sciattn/train/backend.h"
#include "sciattn/train/memory_ledger.h"

namespace sciattn::train {

enum class PositionEncoding { kLearned, kRotary };
const char* position_encoding_name(PositionEncoding p);  // "learned", "rotary"

// The model file (JSON), key for key. Pre-LayerNorm GPT-2 blocks: x + attn(LN(x)), then
// x + mlp(LN(x)); a final LayerNorm; GELU (tanh approximation) in the MLP.
struct GptConfig {
  int64_t vocab_size = 0;       // "vocab_size": tokens are 0 .. vocab_size - 1
  int64_t d_model = 0;          // "d_model"
  int64_t n_layers = 0;         // "n_layers"
  int64_t n_heads = 0;          // "n_heads": d_model / n_heads must be an even integer
  int64_t sequence_length = 0;  // "sequence_length": tokens per training sequence
  // "max_position_embeddings": rows of the learned position table (default sequence_length).
  int64_t max_position_embeddings = 0;
  PositionEncoding positions = PositionEncoding::kLearned;  // "positions": "learned" | "rotary"
  double mlp_ratio = 4.0;        // "mlp_ratio": MLP width = d_model * mlp_ratio (an integer)
  bool tie_embeddings = true;    // "tie_embeddings": the LM head is the token embedding (GPT-2)
  uint64_t seed = 0;             // "seed": initialisation
  double init_std = 0.02;        // "init_std": N(0, init_std^2) weights
  double layer_norm_eps = 1e-5;  // "layer_norm_eps"
  double rotary_base = 10000.0;  // "rotary_base"

  int64_t head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  int64_t mlp_width() const;
};

// Checks every field; the message names the model-file key and what is accepted.
Status validate_gpt_config(const GptConfig& config);
// Reads the model file's JSON (unknown keys and wrong types are errors naming the key), then
// validates. `source` names the file in messages.
Status parse_gpt_config(std::string_view json_text, const std::string& source, GptConfig* out);
Status load_gpt_config(const std::string& path, GptConfig* out);
// The config as the model file's JSON text (every key).
std::string gpt_config_json(const GptConfig& config);

// One named tensor inside a flat buffer of floats.
struct TensorSlot {
  std::string name;            // "wte", "h0.qkv_w", ...
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // in elements from the buffer's start; a multiple of kSlotAlign
  int64_t numel = 0;
  bool weight_decay = false;  // matrices and embeddings decay; biases and LayerNorms do not
  bool matmul = false;        // used as a matrix in a product (counted in the FLOPs)
};

// Every slot starts on 64 bytes.
inline constexpr int64_t kSlotAlign = 16;

// The parameters of a GPT in one buffer, layer by layer (so a layer's parameters, gradients and
// optimizer state are contiguous, for offloading and sharding by layer):
//   wte [V, C], wpe [P, C] (learned positions only),
//   h<l>.ln1_w [C], h<l>.ln1_b [C], h<l>.qkv_w [3C, C], h<l>.qkv_b [3C],
//   h<l>.proj_w [C, C], h<l>.proj_b [C], h<l>.ln2_w [C], h<l>.ln2_b [C],
//   h<l>.fc_w [F, C], h<l>.fc_b [F], h<l>.fcproj_w [C, F], h<l>.fcproj_b [C]  for l < n_layers,
//   lnf_w [C], lnf_b [C], lm_head [V, C] (untied only).
// qkv_w's rows are q (head h at rows h*D ..), then k, then v, as nn.Linear(C, 3C) of GPT-2. The
// gradients and AdamW's m and v use the same layout in buffers of their own.
struct ParameterLayout {
  std::vector<TensorSlot> slots;
  int64_t total = 0;  // elements, padding included

  const TensorSlot* find(std::string_view name) const;
  // Parameters (padding excluded), and those used as matrices in products.
  int64_t parameter_count() const;
  int64_t matmul_parameter_count() const;
};
ParameterLayout gpt_parameter_layout(const GptConfig& config);

// Fills `params` (layout.total floats) with GPT-2's initialisation from config.seed: weights
// N(0, init_std^2), the two residual projections (proj_w, fcproj_w) N(0, (init_std /
// sqrt(2 n_layers))^2), biases 0, LayerNorm weights 1, padding 0. Host memory.
void init_gpt_parameters(const GptConfig& config, const ParameterLayout& layout, float* params);

// The memory techniques; each changes what is kept, never the result (gradients are bitwise equal
// on and off).
struct MemoryOptions {
  // Keep only each layer's input during the forward and recompute the layer in the backward.
  bool checkpoint_layers = false;
  // Run the MLP over tiles of this many tokens, keeping neither its [T, F] activations nor
  // gradients whole; 0 = untiled. Rounded up to a multiple of the back end's token chunk.
  int64_t mlp_tile_tokens = 0;
  // Run the LM head and cross-entropy over tiles of this many tokens, never holding [T, V]
  // logits; 0 = untiled (all logits kept from the forward to the backward). Rounded up as above.
  int64_t lm_head_tile_tokens = 0;
};

// How attention is laid out: the block-sparse index (block-causal) and the padded length.
struct AttentionPlan {
  int64_t block = 0;
  int64_t padded_length = 0;  // sequence_length rounded up to a multiple of block
  BlockSparseIndex index;
  double density = 0.0;  // nonzero blocks / all blocks of the causal layout
};
// Dense causal attention: the largest block of 64, 32, 16 that divides the sequence length (16
// with padding when none does) and a lower-triangular layout. With a sparse config (the
// "sparse_attention" section): its layout for the padded length, with the blocks above the
// diagonal dropped (a GPT is causal; DeepSpeed's JSON builds bigbird and bslongformer
// bidirectional).
Status plan_attention(const GptConfig& config, const SparsityConfig* sparse, AttentionPlan* out);

// What one micro-batch produced.
struct MicroBatchResult {
  double loss_sum = 0.0;  // sum of the per-token losses (in token order, in double)
  int64_t tokens = 0;
};

// A GPT on a back end: parameters and gradients in the back end's memory, the activation buffers
// of one micro-batch, and forward_backward. The optimizer, loss scale and data live in the
// Trainer; this class only computes losses and gradients.
class GptModel {
 public:
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  // Plans and allocates everything for micro-batches of `batch` sequences. `sparse` may be null
  // (dense causal attention). The parameters are initialised from config.seed.
  static Status create(const GptConfig& config, const SparsityConfig* sparse, int64_t batch,
                       const MemoryOptions& memory, Backend* backend,
                       std::unique_ptr<GptModel>* out);

  const GptConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  const AttentionPlan& attention() const { return attention_; }
  const MemoryOptions& memory_options() const { return memory_; }
  int64_t batch() const { return batch_; }
  const MemoryLedger& ledger() const { return ledger_; }
  Backend& backend() { return *backend_; }

  // The flat buffers (layout_.total floats each, back-end memory).
  float* params() { return params_; }
  float* grads() { return grads_; }
  Status zero_grads();

  // Forward and backward of one micro-batch: inputs and targets are [batch, L] host arrays of
  // token ids. Gradients of grad_scale * sum_t loss_t are added to grads() (the trainer passes
  // loss_scale / (tokens per micro-batch * accumulation steps)).
  Status forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                          MicroBatchResult* out);
  // The forward only (evaluation): no gradients.
  Status forward_loss(const int32_t* inputs, const int32_t* targets, MicroBatchResult* out);

  // FLOPs of one micro-batch, forward and backward, as MFU counts them (no recomputation):
  // 6 * matmul parameters * tokens + the attention's (the op's count on the layout's blocks).
  double flops_per_micro_batch() const;

 private:
  GptModel() = default;
  struct Buffers;
  Status plan_and_allocate();
  Status layer_forward(int64_t layer, const float* in, float* out, bool keep, bool recompute);
  Status layer_backward(int64_t layer);
  Status run_forward(const int32_t* inputs, const int32_t* targets, bool with_grad,
                     float grad_scale, MicroBatchResult* out);

  GptConfig config_;
  ParameterLayout layout_;
  AttentionPlan attention_;
  MemoryOptions memory_;
  int64_t batch_ = 0;
  Backend* backend_ = nullptr;
  MemoryLedger ledger_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace sciattn::train

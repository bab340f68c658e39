// The GPT model of the trainer: its configuration (the model JSON file), the layout of its
// parameters in one contiguous buffer, and the forward and backward of one micro-batch on a
// Backend, with the memory techniques (per-layer activation checkpointing, checkpoints offloaded
// to host memory, MLP tiles, LM-head tiles) and the memory plan they give. Public API of the
// trainer (plain C++17).
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
#include "sciattn/train/communicator.h"
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

// One named tensor inside a flat buffer (of floats, or of the compute dtype: offsets count
// elements).
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
// A contiguous range of the layout whose parameters one part of the model uses: "embeddings"
// (wte, wpe), "h<l>" (layer l's twelve slots), "head" (lnf_w, lnf_b, lm_head). Group g + 1 is
// layer g; the forward first reads them in group order and the backward finishes their gradients
// in the reverse order (the embeddings last: the tied LM head also writes wte's gradient).
struct ParameterGroup {
  std::string name;
  int64_t begin = 0, end = 0;  // elements; end is the next group's begin (or total)
};

struct ParameterLayout {
  std::vector<TensorSlot> slots;
  std::vector<ParameterGroup> groups;  // n_layers + 2, covering [0, total) in order
  int64_t total = 0;                   // elements, padding included

  const TensorSlot* find(std::string_view name) const;
  // Parameters (padding excluded), and those used as matrices in products.
  int64_t parameter_count() const;
  int64_t matmul_parameter_count() const;
};
// total_multiple > 1 rounds the total up to a multiple of it, the zeros at the end belonging to
// the last group: ZeRO splits the flat space into equal shards, one per rank.
ParameterLayout gpt_parameter_layout(const GptConfig& config, int64_t total_multiple = 1);

// Fills `params` (layout.total floats) with GPT-2's initialisation from config.seed: weights
// N(0, init_std^2), the two residual projections (proj_w, fcproj_w) N(0, (init_std /
// sqrt(2 n_layers))^2), biases 0, LayerNorm weights 1, padding 0. Host memory. Slot k's element
// i is normal_at(key_k, i) (random.h), key_k the k-th draw of Rng(seed): threaded, and the same
// on every thread count.
void init_gpt_parameters(const GptConfig& config, const ParameterLayout& layout, float* params);

// MemoryOptions::keep_attention_layers for every layer.
inline constexpr int64_t kAllLayers = int64_t{1} << 40;

// The memory techniques; each changes what is kept, never the result (gradients are bitwise equal
// on and off).
struct MemoryOptions {
  // Keep only each layer's input during the forward and recompute the layer in the backward.
  bool checkpoint_layers = false;
  // With checkpointing (this switches it on): copy each layer's input to host memory
  // (Backend::allocate_host) on the back end's copy stream as the forward goes, and back in
  // reverse layer order during the backward, one layer ahead of its use, so the back end holds
  // two layers' inputs instead of n_layers + 1 ("cpu_checkpointing").
  bool offload_checkpoints = false;
  // With checkpointing: the last k layers (k = keep_attention_layers; kAllLayers or any k >=
  // n_layers: every layer) also keep their attention output and log-sum-exp from the forward
  // (on the back end, k x ([T, C] + [B, H, L] f32)), so that their recomputation in the backward
  // stops short of the attention: the attention's forward runs once a step there instead of
  // twice. Without checkpointing every activation is kept anyway (no effect).
  int64_t keep_attention_layers = 0;
  // With offload_checkpoints and kept attention outputs: the kept outputs and log-sum-exps go to
  // host memory too, copied out as the forward writes them and back one kept layer ahead of the
  // backward's use, so the back end holds two layers' of them instead of k and keeping every
  // layer's costs host memory, not device memory. No effect otherwise.
  bool offload_attention_outputs = false;
  // Run the MLP over tiles of this many tokens, keeping neither its [T, F] activations nor
  // gradients whole; 0 = untiled. Rounded up to a multiple of the back end's token chunk.
  int64_t mlp_tile_tokens = 0;
  // Run the LM head and cross-entropy over tiles of this many tokens, never holding [T, V]
  // logits; 0 = untiled (all logits kept from the forward to the backward). Rounded up as above.
  int64_t lm_head_tile_tokens = 0;
  // The flat parameter and gradient buffers' length is rounded up to a multiple of this
  // (gpt_parameter_layout's total_multiple; zeros that no layer reads): ZeRO's equal shards.
  int64_t parameter_multiple = 1;
  // ZeRO stage 2 over several ranks; 0 (every other case): the backward adds every gradient into
  // one fp32 buffer of the layout's total (grads()). k > 0: there is no such buffer. The
  // embeddings' group and the head group (both written from the start of the backward: the tied
  // LM head writes wte's gradient first, the embedding backward last) each keep a buffer of
  // their own, and the layers share k layer-sized buffers in turn, layer l writing buffer
  // (n_layers - 1 - l) % k (at most n_layers are allocated). The hooks (ParameterHooks) must
  // have reduced and zeroed a layer's gradients before layer l - k's backward reuses its buffer;
  // zero_layer_gradient_buffers (zero.h) gives the k a bucket size needs. group_grads()
  // addresses the buffers.
  int64_t layer_gradient_buffers = 0;
};

// The attention block and padded length for a model and an optional sparse config, without
// building the index (plan_attention's rule): what the memory plan needs.
Status attention_padding(const GptConfig& config, const SparsityConfig* sparse, int64_t* block,
                         int64_t* padded_length);

// How attention is laid out: the block-sparse index (block-causal) and the padded length.
struct AttentionPlan {
  int64_t block = 0;
  int64_t padded_length = 0;  // sequence_length rounded up to a multiple of block
  BlockSparseIndex index;
  double density = 0.0;  // nonzero blocks / all blocks of the causal layout
};
// Dense causal attention: the largest block of 64, 32, 16 that divides the sequence length (16
// with padding when none does; from 65,536 tokens on, 128 when it divides the length) and a
// lower-triangular layout. With a sparse config (the
// "sparse_attention" section): its layout for the padded length, with the blocks above the
// diagonal dropped (a GPT is causal; DeepSpeed's JSON builds bigbird and bslongformer
// bidirectional). A layout every head shares is built and stored for one head (the index's
// shared-head form), so the index of a dense causal layout at 1M tokens and block 64 holds
// 134M blocks, not 16 times that. head_count > 0 plans heads [head_begin, head_begin +
// head_count) only (a rank of a sequence-parallel group attends over its slice of the heads);
// 0 plans all n_heads.
Status plan_attention(const GptConfig& config, const SparsityConfig* sparse, AttentionPlan* out,
                      int64_t head_begin = 0, int64_t head_count = 0);

// Whether Ulysses sequence parallelism over `size` ranks fits the model: n_heads and
// sequence_length must be multiples of size (each rank holds sequence_length / size tokens and
// attends over n_heads / size heads). The message names sequence_parallel_size and the sizes.
Status check_sequence_parallel(const GptConfig& config, int64_t size);

// Called by GptModel around its use of the parameter groups (ParameterLayout::groups): the seam
// through which an optimizer whose state lives elsewhere (host memory) overlaps its copies with
// the model's work. Group indexes are those of ParameterLayout::groups.
class ParameterHooks {
 public:
  virtual ~ParameterHooks() = default;
  // Before the forward queues the first call that reads group g's weights (in group order).
  virtual Status before_forward(int64_t group) = 0;
  // After the backward has queued the last call that adds to group g's gradients (in reverse
  // group order: head, layers n - 1 .. 0, embeddings).
  virtual Status after_backward(int64_t group) = 0;
};

// The buffers GptModel::create allocates for these settings, as memory-ledger entries, without
// allocating anything or building the attention index: the model's share of a memory plan.
// compute_dtype, token_chunk and device are those of the back end the model would run on;
// sequence_parallel_size that of its sequence-parallel group (the plan of one rank).
Status plan_gpt_memory(const GptConfig& config, const SparsityConfig* sparse, int64_t batch,
                       const MemoryOptions& memory, DType compute_dtype, int64_t token_chunk,
                       Device device, MemoryLedger* out, int64_t sequence_parallel_size = 1);

// What one micro-batch produced (on this rank: its slice of the sequence with sequence
// parallelism).
struct MicroBatchResult {
  double loss_sum = 0.0;  // sum of the per-token losses (in token order, in double)
  int64_t tokens = 0;
};

// A GPT on a back end: the weights (in the back end's compute dtype: the compute copy of the
// optimizer's fp32 master weights, or the fp32 parameters themselves) and the fp32 gradients in
// the back end's memory, the activation buffers of one micro-batch, and forward_backward. The
// optimizer (master weights, m, v), loss scale and data live in the Trainer; this class only
// computes losses and gradients.
//
// Ulysses sequence parallelism (a sequence_group of P > 1 ranks; rank s of the group): the rank
// holds tokens [s L/P, (s + 1) L/P) of every sequence of the micro-batch. The embeddings (with
// learned positions, rows s L/P .. of the table: only those get gradients here), LayerNorms,
// MLP, LM head and loss run on those T = B L/P tokens. Attention turns the token split into a
// head split with an all-to-all of q, k and v ([B, L/P, 3, H, D] per rank -> [B, L, 3, H/P, D]:
// the whole sequence, heads [s H/P, (s + 1) H/P)), applies rotary positions there (at their
// global positions), runs the causal attention of those heads, and turns the output back with a
// second all-to-all; the backward runs the same all-to-alls on the gradients in reverse. Each
// rank's gradients are those of its tokens' share of the loss: summed over the group they are the
// whole micro-batch's (the trainer's mean over all ranks, with grad_scale counting this rank's
// tokens, gives the global batch's mean loss). Every rank of the group calls forward_backward
// together (the all-to-alls are collectives of the group).
struct LayerActivations;  // one layer's saved activations (gpt_model.cpp)

class GptModel {
 public:
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  // Plans and allocates everything for micro-batches of `batch` sequences. `sparse` may be null
  // (dense causal attention). The weights are initialised from config.seed
  // (init_gpt_parameters), or set from `initial_params` (fp32 host values, layout total) when
  // given: a caller that also needs the fp32 values (the optimizer's master weights) draws them
  // once. `sequence_group` (not owned; null: one rank) is the sequence-parallel group this model
  // is one rank of (check_sequence_parallel must pass; the CPU back end only).
  static Status create(const GptConfig& config, const SparsityConfig* sparse, int64_t batch,
                       const MemoryOptions& memory, Backend* backend,
                       std::unique_ptr<GptModel>* out, const float* initial_params = nullptr,
                       Communicator* sequence_group = nullptr);

  const GptConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  const AttentionPlan& attention() const { return attention_; }
  const MemoryOptions& memory_options() const { return memory_; }
  // The layers whose attention outputs are kept (MemoryOptions::keep_attention_layers with
  // checkpointing: the last kept_attention_layers() of them), and whether `layer` is one.
  int64_t kept_attention_layers() const;
  bool keeps_attention(int64_t layer) const;
  int64_t batch() const { return batch_; }
  // The sequence-parallel group's size and this rank's place in it (1 and 0 without one), and
  // the tokens of a micro-batch this rank holds: batch x sequence_length / size.
  int64_t sequence_parallel_size() const { return sp_size_; }
  int64_t sequence_parallel_rank() const { return sp_rank_; }
  int64_t local_tokens() const { return batch_ * (config_.sequence_length / sp_size_); }
  const MemoryLedger& ledger() const { return ledger_; }
  Backend& backend() { return *backend_; }

  // The flat buffers in the back end's memory: weights(), layout_.total elements of
  // weight_dtype() (the back end's compute dtype); grads(), layout_.total floats, or null when
  // the gradients are in separate buffers (MemoryOptions::layer_gradient_buffers).
  void* weights() { return weights_; }
  DType weight_dtype() const { return act_; }
  float* grads() { return grads_; }
  // Where the backward writes group g's gradients (ParameterLayout::groups[g], contiguous): its
  // first element's address, grads() + groups[g].begin with one buffer.
  float* group_grads(int64_t group) { return group_grads_[static_cast<size_t>(group)]; }
  // Zeroes every gradient buffer.
  Status zero_grads();
  // Sets the weights from fp32 host parameters (layout_.total), rounded to the compute dtype.
  Status set_weights(const float* host_params);
  // The weights as fp32 host values (layout_.total).
  Status get_weights(std::vector<float>* host_params);

  // Hooks called around the parameter groups' use (null: none). Not owned.
  void set_parameter_hooks(ParameterHooks* hooks) { hooks_ = hooks; }

  // Forward and backward of one micro-batch: inputs and targets are [batch, L] host arrays of
  // token ids (the whole sequences on every rank of a sequence-parallel group, which each takes
  // its slice of). Gradients of grad_scale * sum_t loss_t over this rank's tokens are added to
  // grads() (the trainer passes loss_scale / (local_tokens() * accumulation steps)).
  Status forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                          MicroBatchResult* out);
  // The forward only (evaluation): no gradients.
  Status forward_loss(const int32_t* inputs, const int32_t* targets, MicroBatchResult* out);

  // FLOPs of one micro-batch on this rank, forward and backward, as MFU counts them (no
  // recomputation): 6 * matmul parameters * local tokens + the attention's (the op's count on the
  // blocks of this rank's heads).
  double flops_per_micro_batch() const;

 private:
  GptModel() = default;
  friend Status plan_gpt_memory(const GptConfig&, const SparsityConfig*, int64_t,
                                const MemoryOptions&, DType, int64_t, Device, MemoryLedger*,
                                int64_t);
  struct Buffers;
  // Plans every buffer into the ledger; with `allocate`, also allocates them and sets the
  // weights (from `initial_params`, or the initialisation).
  Status plan_and_allocate(bool allocate, const float* initial_params = nullptr);
  // The gradient buffers' share of plan_and_allocate (MemoryOptions::layer_gradient_buffers).
  Status plan_gradients(bool allocate);
  // recompute: the backward's recomputation of a checkpointed layer, which stops where the
  // backward needs nothing more (and, with kept attention outputs, skips the attention).
  Status layer_forward(int64_t layer, const void* in, void* out, bool recompute);
  Status layer_backward(int64_t layer, const void* in);
  Status run_forward(const int32_t* inputs, const int32_t* targets, bool with_grad,
                     float grad_scale, MicroBatchResult* out);
  // Sums the losses of the micro-batch (waits for the back end).
  Status read_losses(MicroBatchResult* out);
  // The device buffer holding layer boundary l (the embedding's output for l = 0, then layer
  // l - 1's output): one of two alternating buffers when checkpoints are offloaded.
  void* boundary(int64_t l) const;
  // Layer `layer`'s activations: its own set, or the one set checkpointing recomputes, with the
  // attention's output and log-sum-exp in the layer's kept buffers when keeps_attention(layer).
  LayerActivations layer_activations(int64_t layer) const;
  // Whether the kept attention outputs go to host memory (MemoryOptions::offload_attention_outputs
  // with offloaded checkpoints and at least one kept layer): kept layer i (of k) is then in
  // device slot i % 2, and kept layers 0 .. k - 3 also in host memory between the passes.
  bool offloads_attention_outputs() const;
  // Starts the copy of kept layer i's output and log-sum-exp between its device slot and host
  // memory (its tickets in the Buffers).
  Status copy_kept_attention(int64_t i, CopyDirection direction);
  Status hook_forward(int64_t group);
  Status hook_backward(int64_t group);
  // A gradient slot's view (absent slots stay absent), wherever its group's buffer is.
  TensorView grad_view(const char* name);
  // Sequence parallelism: copies this rank's slice of [batch, L] host token ids to `dst`.
  Status upload_tokens(const int32_t* host, int32_t* dst);
  // The all-to-alls around attention, for tensors of `parts` x C values per token (qkv: 3,
  // the attention output: 1). to_heads: src [B, L/P, parts, H, D] (this rank's tokens, all
  // heads) -> dst [B, L, parts, H/P, D] (every token, this rank's heads); to_tokens: the
  // inverse. src may be the receive buffer; dst may be neither buffer.
  Status sequence_to_heads(const void* src, void* dst, int64_t parts);
  Status heads_to_sequence(const void* src, void* dst, int64_t parts);
  Status all_to_all_views(const void* src, void* dst, int64_t parts, bool to_heads);

  GptConfig config_;
  ParameterLayout layout_;
  AttentionPlan attention_;
  MemoryOptions memory_;
  int64_t batch_ = 0;
  Backend* backend_ = nullptr;
  DType act_ = DType::kF32;  // the back end's compute dtype
  Device device_ = Device::kCpu;
  int64_t token_chunk_ = 1;
  MemoryLedger ledger_;
  void* weights_ = nullptr;
  float* grads_ = nullptr;                // one buffer of every gradient (null: separate buffers)
  std::vector<float*> gradient_buffers_;  // the separate buffers: embeddings, head, layers'
  std::vector<float*> group_grads_;       // per group: where its gradients are
  ParameterHooks* hooks_ = nullptr;
  Communicator* sp_comm_ = nullptr;  // the sequence-parallel group (null: none)
  int64_t sp_size_ = 1, sp_rank_ = 0;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace sciattn::train

// Memory planning for long sequences: what the trainer allocates for a model, a DeepSpeed config
// and a set of memory techniques, where (the device or host memory) and in which phases, checked
// against a device and a host budget; and the longest sequence that fits. Public API of the
// trainer (plain C++17); `sciattn train --plan` prints it.
//
// The plan is the model's own buffer plan (plan_gpt_memory: exactly what GptModel::create
// allocates) and the optimizer's (add_optimizer_memory: what Trainer::create allocates), plus
// estimates of what the back end holds beside them, category "back end":
//   - its scratch, grown to the largest call's need: the attention backward's dq, dk, dv
//     (3 B Lp C elements of the compute dtype) and, when the length is padded to the block, the
//     padded copies of qkv, out and dout (5 B Lp C); the embedding backward's sort (24 bytes per
//     token); cuBLASLt's workspace (32 MiB) on CUDA;
//   - the attention index: 40 bytes per stored block in host memory (BlockSparseIndex's arrays),
//     and on CUDA its packed upload on the device: 4 (5 + 4 t) bytes per stored block with t the
//     block's 64 x 64 tiles (measured: 9.0 int32 per block of 64, 21.0 per block of 128, dense
//     causal). Dense causal stores n (n + 1) / 2 blocks for n = Lp / block; a sparse layout's
//     blocks are counted by building its index.
// What it leaves out: the CUDA context and cuBLASLt's handle (about 0.5-1 GiB, which the default
// budget reserves), the sparse attention op's workspace for split lines (fp32 partials: none for
// dense causal, whose lines are never split), and the memory allocator's rounding.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sciattn/block_sparse.h"
#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "sciattn/status.h"
#include "sciattn/train/config.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/memory_ledger.h"

namespace sciattn::train {

struct PlanInput {
  GptConfig model;                       // its sequence_length is the length planned
  std::optional<SparsityConfig> sparse;  // the config's sparse_attention section, if any
  int64_t micro_batch = 1;
  MemoryOptions memory;
  bool offload_optimizer = false;
  DType compute_dtype = DType::kBF16;
  int64_t token_chunk = 4096;
  Device device = Device::kCuda;
  // Data-parallel ranks and the config's zero_optimization. With world_size > 1 and stage 1 or
  // 2 the plan is one rank's, as the trainer allocates it: the layout padded for the shards, the
  // optimizer state as ZeRO shards (add_zero_memory), and at stage 2 the gradients in group
  // buffers (MemoryOptions::layer_gradient_buffers from zero_layer_gradient_buffers) beside the
  // reduced shard. Otherwise the replicated optimizer of one rank.
  int world_size = 1;
  ZeroConfig zero;
  // Ranks that share each sequence (Ulysses, the config's sequence_parallel_size S; it divides
  // world_size, n_heads and the sequence length). The plan is then one rank's: its L/S tokens'
  // activations, the attention over the whole sequence for its n_heads/S heads (the head-split
  // output per layer, lse, the back end's dq, dk, dv of C/S channels), the two all-to-all buffers,
  // and the attention index of its heads.
  int64_t sequence_parallel_size = 1;
};

struct MemoryPlan {
  MemoryLedger ledger;        // every buffer, the back end's estimates included
  uint64_t device_bytes = 0;  // on input.device (0 when that is the CPU: all is host memory)
  uint64_t host_bytes = 0;    // host memory (everything, on the CPU)
};

// Plans `input`. Fails, naming the field, when the model or the settings are invalid.
Status plan_training_memory(const PlanInput& input, MemoryPlan* out);

// Whether a plan fits: device_bytes <= device_budget and host_bytes <= host_budget.
bool plan_fits(const MemoryPlan& plan, uint64_t device_budget, uint64_t host_budget);

// The longest sequence_length, a multiple of `granularity` in [granularity, max_length], whose
// plan fits both budgets (learned position tables grow with it); 0 when even `granularity` does
// not. Plans grow with the length, so this is a bisection (about 20 plans). With sequence
// parallelism `granularity` must be a multiple of sequence_parallel_size. With a sparse config
// the search stops at sparse_layout_max_length.
Status longest_sequence(const PlanInput& input, uint64_t device_budget, uint64_t host_budget,
                        int64_t granularity, int64_t max_length, int64_t* out);

// The longest sequence whose sparse layout can be built for the model's heads (the layout
// [n_heads, L / block, L / block] holds at most kMaxLayoutEntries blocks); 0 without a sparse
// config (no limit of this kind).
int64_t sparse_layout_max_length(const PlanInput& input);

// The most layers (0 .. n_layers) that can keep their attention outputs
// (MemoryOptions::keep_attention_layers, input.memory's own value ignored) with the plan still
// fitting both budgets; 0 without checkpointing or when even 0 does not fit.
Status most_kept_attention_layers(const PlanInput& input, uint64_t device_budget,
                                  uint64_t host_budget, int64_t* out);

// The table `sciattn train --plan` prints: for each technique switched on in turn (none;
// per-layer checkpointing; + MLP and LM-head tiles; + checkpoint offload; + optimizer offload;
// and checkpoint offload without optimizer offload's), the longest sequence that fits and the
// device and host bytes there. `input` gives the model, config, dtype and tile sizes (a tile
// size of 0 becomes 16,384 tokens for the tiled rows).
struct PlanRow {
  std::string techniques;
  PlanInput input;
  int64_t longest = 0;
  MemoryPlan plan;  // at `longest` (empty when 0)
};
Status plan_techniques(const PlanInput& input, uint64_t device_budget, uint64_t host_budget,
                       int64_t granularity, int64_t max_length, std::vector<PlanRow>* rows);

}  // namespace sciattn::train

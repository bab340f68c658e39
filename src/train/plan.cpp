// Memory planning for long sequences (plan.h): the model's and the optimizer's buffer plans plus
// the back end's estimated scratch and attention index, and the longest sequence that fits.
// Trainer layer (host code).
#include "sciattn/train/plan.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/status_try.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/train/trainer.h"
#include "sciattn/train/zero.h"

namespace sciattn::train {
namespace {

// Bytes per stored block of the attention index: BlockSparseIndex's five int64 arrays (head,
// row, col, col_rows, col_blocks) on the host, and the packed int32 upload on a GPU (measured for
// dense causal layouts at 65,536 and 262,144 tokens).
constexpr uint64_t kIndexHostBytesPerBlock = 40;
// The upload: five int32 per block and the fused attention's tile lists, about four int32 per
// 64 x 64 tile (measured: 9.0 int32 per block of 64, 21.0 per block of 128).
uint64_t index_device_bytes_per_block(int64_t block) {
  const uint64_t tiles = block > 64 ? static_cast<uint64_t>((block / 64) * (block / 64)) : 1;
  return 4 * (5 + 4 * tiles);
}
// The embedding backward's sort on CUDA: keys and positions in and out (16 bytes per token) and
// CUB's radix-sort temporaries (about as much again, rounded up).
constexpr uint64_t kEmbeddingSortBytesPerToken = 24;
constexpr uint64_t kMatmulWorkspaceBytes = uint64_t{32} << 20;
constexpr int64_t kDefaultTileTokens = 16384;

uint64_t align64(uint64_t x) {
  return (x + 63) / 64 * 64;
}

// Stored blocks of the causal attention index (one head's lists when the heads share a layout).
// With sequence parallelism a rank's index has its heads only: those of rank 0 are counted (a
// layout that differs per head may store a few blocks more or less on other ranks).
Status stored_blocks(const PlanInput& in, int64_t block, int64_t padded, uint64_t* out) {
  const auto n = static_cast<uint64_t>(padded / block);
  if (!in.sparse) {
    *out = n * (n + 1) / 2;
    return Status::ok_status();
  }
  if (in.sequence_parallel_size > 1) {
    AttentionPlan plan;
    Status s = plan_attention(in.model, &*in.sparse, &plan, 0,
                              in.model.n_heads / in.sequence_parallel_size);
    if (!s.ok()) {
      return Status::invalid_argument("sparse_attention: no layout for sequence_length " +
                                      std::to_string(in.model.sequence_length) + ": " +
                                      s.message());
    }
    *out = static_cast<uint64_t>(plan.index.stored_nnz());  // causal blocks only
    return Status::ok_status();
  }
  SparsityConfig config = *in.sparse;
  sparsity_common(config).num_heads = in.model.n_heads;
  BlockSparseIndex index;
  Status s = build_sparse_attention_index(config, padded, padded, &index);
  if (!s.ok()) {
    return Status::invalid_argument("sparse_attention: no layout for sequence_length " +
                                    std::to_string(in.model.sequence_length) + ": " + s.message());
  }
  uint64_t causal = 0;
  for (int64_t p = 0; p < index.stored_nnz(); ++p) {
    causal += index.row[static_cast<size_t>(p)] >= index.col[static_cast<size_t>(p)] ? 1 : 0;
  }
  *out = causal;
  return Status::ok_status();
}

// The largest u in [0, max_units] whose plan, with `vary(u, &input)` applied, fits both budgets
// (0 when none of 1 .. max_units does). Plans grow with u, so this is a bisection.
template <typename Vary>
Status largest_fitting(const PlanInput& input, uint64_t device_budget, uint64_t host_budget,
                       int64_t max_units, const Vary& vary, int64_t* out) {
  // Invariant: lo units fit (or lo = 0), hi units do not (or hi = max_units + 1).
  int64_t lo = 0, hi = max_units + 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    PlanInput in = input;
    vary(mid, &in);
    MemoryPlan plan;
    SCIATTN_TRY(plan_training_memory(in, &plan));
    (plan_fits(plan, device_budget, host_budget) ? lo : hi) = mid;
  }
  *out = lo;
  return Status::ok_status();
}

}  // namespace

Status plan_training_memory(const PlanInput& in, MemoryPlan* out) {
  if (in.compute_dtype != DType::kF32 && in.compute_dtype != DType::kBF16 &&
      in.compute_dtype != DType::kF16) {
    return Status::invalid_argument(std::string("compute_dtype must be f32, bf16 or f16; got ") +
                                    dtype_name(in.compute_dtype));
  }
  if (in.world_size < 1) {
    return Status::invalid_argument("world_size must be >= 1; got " +
                                    std::to_string(in.world_size));
  }
  const int64_t sp = in.sequence_parallel_size;
  if (sp < 1 || in.world_size % sp != 0) {
    return Status::invalid_argument("sequence_parallel_size " + std::to_string(sp) +
                                    " must be >= 1 and divide the ranks planned for (" +
                                    std::to_string(in.world_size) + ")");
  }
  MemoryPlan plan;
  const SparsityConfig* sparse = in.sparse ? &*in.sparse : nullptr;
  const bool zero = in.world_size > 1 && in.zero.stage > 0;
  if (zero && in.offload_optimizer) {
    return Status::not_supported(
        "zero_optimization.offload_optimizer with several data-parallel ranks is not built yet; "
        "set its device to \"none\" or run one rank");
  }
  MemoryOptions memory = in.memory;
  if (zero) {
    // The trainer's settings for ZeRO (trainer.cpp): shards padded, stage 2's group buffers.
    SCIATTN_TRY(validate_gpt_config(in.model));
    memory.parameter_multiple = zero_parameter_multiple(in.world_size);
    memory.layer_gradient_buffers =
        in.zero.stage == 2
            ? zero_layer_gradient_buffers(gpt_parameter_layout(in.model, memory.parameter_multiple),
                                          in.zero.reduce_bucket_size, in.zero.overlap_comm)
            : 0;
  }
  SCIATTN_TRY(plan_gpt_memory(in.model, sparse, in.micro_batch, memory, in.compute_dtype,
                              in.token_chunk, in.device, &plan.ledger, sp));
  if (zero) {
    add_zero_memory(gpt_parameter_layout(in.model, memory.parameter_multiple).total, in.world_size,
                    in.zero.stage, in.compute_dtype == DType::kF32, in.device, &plan.ledger);
  } else {
    const ParameterLayout layout = gpt_parameter_layout(in.model);
    add_optimizer_memory(layout.total, in.offload_optimizer, in.compute_dtype, in.device,
                         &plan.ledger);
  }

  // The back end's scratch: the largest of its calls' needs. With sequence parallelism the
  // attention covers the whole (padded) sequence for the rank's C / S channels (n_heads / S
  // heads), and the embedding backward sorts the rank's L / S tokens.
  int64_t block = 0, padded = 0;
  SCIATTN_TRY(attention_padding(in.model, sparse, &block, &padded));
  const auto es = static_cast<uint64_t>(dtype_size(in.compute_dtype));
  const auto B = static_cast<uint64_t>(in.micro_batch);
  const auto C = static_cast<uint64_t>(in.model.d_model / sp);
  const uint64_t n1 = align64(B * static_cast<uint64_t>(padded) * C * es);
  const bool is_padded = padded != in.model.sequence_length;
  const uint64_t attention = (is_padded ? 5 * n1 : 0) + 3 * n1;
  const uint64_t tokens = B * static_cast<uint64_t>(in.model.sequence_length / sp);
  const uint64_t embedding = in.device == Device::kCuda ? kEmbeddingSortBytesPerToken * tokens : 0;
  plan.ledger.add(std::string("back end: scratch (attention dq, dk, dv") +
                      (is_padded ? " and padded copies" : "") + ")",
                  "back end", in.device, std::max(attention, embedding),
                  kPhaseForward | kPhaseBackward);
  if (in.device == Device::kCuda) {
    plan.ledger.add("back end: cuBLASLt workspace", "back end", in.device, kMatmulWorkspaceBytes,
                    kPhaseAll);
  }
  uint64_t blocks = 0;
  SCIATTN_TRY(stored_blocks(in, block, padded, &blocks));
  plan.ledger.add("attention index (" + std::to_string(blocks) + " stored blocks)", "back end",
                  Device::kCpu, kIndexHostBytesPerBlock * blocks, kPhaseAll);
  if (in.device == Device::kCuda) {
    plan.ledger.add("attention index, device copy", "back end", in.device,
                    index_device_bytes_per_block(block) * blocks, kPhaseForward | kPhaseBackward);
  }
  plan.host_bytes = plan.ledger.total(Device::kCpu);
  plan.device_bytes = in.device == Device::kCpu ? 0 : plan.ledger.total(in.device);
  *out = std::move(plan);
  return Status::ok_status();
}

bool plan_fits(const MemoryPlan& plan, uint64_t device_budget, uint64_t host_budget) {
  return plan.device_bytes <= device_budget && plan.host_bytes <= host_budget;
}

int64_t sparse_layout_max_length(const PlanInput& input) {
  if (!input.sparse) return 0;
  const int64_t heads = std::max<int64_t>(input.model.n_heads, 1);
  const int64_t block = std::max<int64_t>(sparsity_common(*input.sparse).block, 1);
  // The largest n with heads * n^2 <= kMaxLayoutEntries.
  int64_t n = static_cast<int64_t>(std::sqrt(static_cast<double>(kMaxLayoutEntries / heads)));
  while (n > 0 && heads * n * n > kMaxLayoutEntries) --n;
  while (heads * (n + 1) * (n + 1) <= kMaxLayoutEntries) ++n;
  return n * block;
}

Status longest_sequence(const PlanInput& input, uint64_t device_budget, uint64_t host_budget,
                        int64_t granularity, int64_t max_length, int64_t* out) {
  if (granularity < 1 || max_length < granularity) {
    return Status::invalid_argument("longest_sequence: need 1 <= granularity <= max_length; got " +
                                    std::to_string(granularity) + " and " +
                                    std::to_string(max_length));
  }
  if (input.sequence_parallel_size > 1 && granularity % input.sequence_parallel_size != 0) {
    return Status::invalid_argument(
        "longest_sequence: the granularity " + std::to_string(granularity) +
        " must be a multiple of sequence_parallel_size " +
        std::to_string(input.sequence_parallel_size) +
        " (each rank holds sequence_length / sequence_parallel_size tokens)");
  }
  // Lengths past the sparse layout's limit have no layout to plan with.
  if (const int64_t limit = sparse_layout_max_length(input); limit > 0) {
    max_length = std::min(max_length, limit);
  }
  int64_t units = 0;
  SCIATTN_TRY(largest_fitting(
      input, device_budget, host_budget, max_length / granularity,
      [&](int64_t u, PlanInput* in) {
        in->model.sequence_length = u * granularity;
        if (in->model.positions == PositionEncoding::kLearned) {
          in->model.max_position_embeddings = in->model.sequence_length;
        }
      },
      &units));
  *out = units * granularity;
  return Status::ok_status();
}

Status most_kept_attention_layers(const PlanInput& input, uint64_t device_budget,
                                  uint64_t host_budget, int64_t* out) {
  *out = 0;
  if (!input.memory.checkpoint_layers && !input.memory.offload_checkpoints) {
    return Status::ok_status();
  }
  return largest_fitting(
      input, device_budget, host_budget, input.model.n_layers,
      [](int64_t k, PlanInput* in) { in->memory.keep_attention_layers = k; }, out);
}

Status plan_techniques(const PlanInput& input, uint64_t device_budget, uint64_t host_budget,
                       int64_t granularity, int64_t max_length, std::vector<PlanRow>* rows) {
  rows->clear();
  PlanInput base = input;
  base.memory = MemoryOptions{};
  base.offload_optimizer = false;
  const int64_t mlp =
      input.memory.mlp_tile_tokens > 0 ? input.memory.mlp_tile_tokens : kDefaultTileTokens;
  const int64_t lm =
      input.memory.lm_head_tile_tokens > 0 ? input.memory.lm_head_tile_tokens : kDefaultTileTokens;
  auto row = [&](std::string name, bool ckpt, bool tiles, bool offload_ckpt, bool offload_opt) {
    PlanRow r;
    r.techniques = std::move(name);
    r.input = base;
    r.input.memory.checkpoint_layers = ckpt;
    r.input.memory.mlp_tile_tokens = tiles ? mlp : 0;
    r.input.memory.lm_head_tile_tokens = tiles ? lm : 0;
    r.input.memory.offload_checkpoints = offload_ckpt;
    r.input.offload_optimizer = offload_opt;
    rows->push_back(std::move(r));
  };
  // The optimizer offload is not built with ZeRO over several ranks: no rows for it there.
  const bool sharded = input.world_size > 1 && input.zero.stage > 0;
  row("none", false, false, false, false);
  row("per-layer checkpointing", true, false, false, false);
  row("+ MLP and LM-head tiles", true, true, false, false);
  if (!sharded) row("+ optimizer offload", true, true, false, true);
  row("+ checkpoint offload (optimizer on the device)", true, true, true, false);
  if (!sharded) row("+ checkpoint offload + optimizer offload", true, true, true, true);
  for (PlanRow& r : *rows) {
    SCIATTN_TRY(
        longest_sequence(r.input, device_budget, host_budget, granularity, max_length, &r.longest));
    if (r.longest > 0) {
      r.input.model.sequence_length = r.longest;
      if (r.input.model.positions == PositionEncoding::kLearned) {
        r.input.model.max_position_embeddings = r.longest;
      }
      SCIATTN_TRY(plan_training_memory(r.input, &r.plan));
    }
  }
  return Status::ok_status();
}

}  // namespace sciattn::train

// ZeRO stages 1 and 2 (DeepSpeed's ZeRO data parallelism) for the trainer: the flat fp32
// parameter and gradient space split into equal shards, one per data-parallel rank; each rank
// keeps the fp32 master weights and AdamW's m and v of its shard only, runs AdamW on its shard,
// and the updated parameters are all-gathered. Public API of the trainer (plain C++17); it talks
// to the other ranks only through a Communicator and to memory only through the Backend.
//
// One step, on every rank (N ranks, rank r owns elements [r S, (r + 1) S) of the layout, whose
// total the model pads to N S with zeros):
//   stage 1: the backward accumulates the full local gradients over the micro-batches; then the
//            gradients are reduce-scattered (mean over ranks) so that rank r holds its shard of
//            the averaged gradients (in place, in the model's gradient buffer).
//   stage 2: as the backward of each micro-batch finishes parameter groups (ParameterHooks), the
//            finished range is cut into buckets of reduce_bucket_size elements, from the end of
//            the flat space down; each bucket is reduced (mean) piece by piece to the rank that
//            owns the piece, which adds it to its gradient shard, and the bucket's local
//            gradients are zeroed for the next micro-batch. Only the shard outlives the backward.
//            The model then holds no full gradient buffer: the embeddings' and the head's groups
//            have buffers of their own and the layers take turns in a few layer-sized ones
//            (MemoryOptions::layer_gradient_buffers, zero_layer_gradient_buffers), each reused
//            once the buckets of the layer that used it are reduced; a bucket that spans
//            groups is reduced group by group (the same elementwise arithmetic).
//   both:    the overflow flag (fp16) is combined with all_reduce_max and the squared norm of
//            each rank's shard with all_reduce_sum, so every rank takes the same skip and
//            clipping decision; AdamW runs over the shard; the parameters are all-gathered.
// fp16 "ds_enhanced": each rank checks its own scaled local gradients for Inf/NaN and unscales
// them before any reduction (stage 2: bucket by bucket); standard: the reduced shard is checked.
//
// overlap_comm (stage 2): each piece of a bucket is started (Communicator::start_reduce, or
// start_all_reduce_mean without reduce_scatter) instead of called, and finished later, in issue
// order: its wait, the owner's addition to its shard and the zeroing of its local gradients. A
// piece is finished just before the backward writes the buffer that holds it again (a reused
// layer buffer) and at the end of each micro-batch's backward, so the reductions run while the
// next layers' backward computes, and the results are the called path's bits. The trainer gives
// the model one layer buffer more for it (zero_layer_gradient_buffers with overlap_comm), so
// that the buffer the next layer takes was last used at least one layer earlier. Stage 1's
// reduction is one call after the backward: overlap_comm changes nothing there.
//
// Reductions are elementwise and in rank order, so the result does not depend on the bucket size
// or on reduce_scatter / allgather_partitions, and with one micro-batch per rank it equals the
// replicated data-parallel trainer (stage 0) bit for bit; with several micro-batches per rank,
// stage 2 adds each micro-batch's reduced gradients (DeepSpeed's order), which rounds otherwise.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/communicator.h"
#include "sciattn/train/config.h"
#include "sciattn/train/gpt.h"
#include "sciattn/train/gradients.h"
#include "sciattn/train/memory_ledger.h"

namespace sciattn::train {

// The multiple a layout's total is padded to for `world_size` ranks: equal shards that each start
// on 64 bytes (world_size * kSlotAlign elements).
inline int64_t zero_parameter_multiple(int world_size) {
  return static_cast<int64_t>(world_size) * kSlotAlign;
}

// Stage 2's layer gradient buffers (MemoryOptions::layer_gradient_buffers) for buckets of
// `reduce_bucket_size` elements: when a layer's backward starts, what is not reduced yet is
// fewer than a bucket's elements above that layer, so buffers of layer size S are free again
// after 1 + ceil((bucket - 1) / S) layers; never more than the layers. With overlap_comm, one
// more (still at most the layers): a buffer is reused one layer after the last reduction that
// reads it was started, so that the reduction has that layer's backward to run beside.
int64_t zero_layer_gradient_buffers(const ParameterLayout& layout, int64_t reduce_bucket_size,
                                    bool overlap_comm = false);

// The ledger entries of a rank's ZeRO state (what ZeroOptimizer allocates): the master weights'
// shard unless the weights are fp32 (they are their own master), m and v, and at stage 2 the
// reduced gradients' shard; each layout_total / world_size floats.
void add_zero_memory(int64_t layout_total, int world_size, int stage, bool master_is_weights,
                     Device device, MemoryLedger* ledger);

// Calls fn(begin, end, decays) for the runs of [begin, end) that have one weight-decay flag, in
// order: slots are cut at the range's ends, and the padding after a slot belongs to it (zeros,
// which AdamW keeps at zero).
Status for_each_decay_range(const ParameterLayout& layout, int64_t begin, int64_t end,
                            const std::function<Status(int64_t, int64_t, bool)>& fn);

class ZeroOptimizer final : public ParameterHooks {
 public:
  // `model` must have been created with MemoryOptions::parameter_multiple a multiple of
  // zero_parameter_multiple(comm->world_size()), and with layer_gradient_buffers 0 (one whole
  // gradient buffer; stage 1 needs it) or, stage 2 only, at least
  // zero_layer_gradient_buffers(layout, reduce_bucket_size); init holds the layout's fp32 initial
  // parameters (host memory, the same on every rank). config.stage must be 1 or 2. comm and model
  // must outlive the optimizer. Allocates the shard's state in the model's back end.
  static Status create(const ZeroConfig& config, Communicator* comm, GptModel* model,
                       const float* init, std::unique_ptr<ZeroOptimizer>* out);
  ~ZeroOptimizer() override;

  int stage() const { return config_.stage; }
  int64_t shard_size() const { return shard_; }
  int64_t shard_begin() const { return begin_; }  // this rank's first element

  // Before the step's first micro-batch: zeroes the stage-2 gradient shard and the local
  // overflow flag; `scaling` and `loss_scale` are the step's.
  Status begin_step(Fp16Scaling scaling, double loss_scale);
  // Before the backward of micro-batch `micro` (0-based) of the step's `count`.
  void begin_micro_batch(int64_t micro, int64_t count);
  // A test hook for stage 2 (stage 1 sees the trainer's own injection): this step's last
  // micro-batch gets +Inf at flat element `index` of this rank's local gradients just before the
  // bucket holding it is checked and reduced, as an fp16 overflow in the backward would.
  void inject_overflow(int64_t index) { inject_ = index; }

  // ParameterHooks: stage 2's bucket reductions.
  Status before_forward(int64_t) override { return Status::ok_status(); }
  Status after_backward(int64_t group) override;

  // After the last micro-batch: stage 1's reduce-scatter; for both stages the overflow flag
  // across ranks and the global norm of the unscaled gradients from the shards (ReducedGradients
  // as reduce_gradients fills it).
  Status reduce(ReducedGradients* out);
  // AdamW over the shard (h.lr the step's rate, h.weight_decay the configured decay, applied to
  // the slots that decay), then the parameters gathered into the model's weights on every rank.
  Status update(const AdamWHyperparams& h, int64_t step, float grad_scale);

  // The buckets stage 2 reduced in the current or last step (all its micro-batches).
  int64_t buckets_last_step() const { return buckets_; }
  // With overlap_comm, the most bucket pieces whose reductions were in flight at once in the
  // current or last step (0 without overlap_comm: each piece is reduced when it is cut).
  int64_t max_in_flight_last_step() const { return max_in_flight_; }

  // This rank's shard of the state, as host values (shard_size() floats each): the fp32 master
  // weights, AdamW's m and v, and the reduced gradients of the last step.
  enum class State { kMaster, kExpAvg, kExpAvgSq, kGradients };
  Status shard_to_host(State which, std::vector<float>* out) const;
  // Overwrites this rank's shard of the master weights, m or v (not the gradients) with `in`
  // (shard_size() floats): a checkpoint being loaded. The master shard of fp32 weights is the
  // weights' own shard, so writing it writes those weights too.
  Status shard_from_host(State which, const std::vector<float>& in);
  // The full fp32 master weights on every rank (a collective: every rank calls it).
  Status gather_master(std::vector<float>* out);

  // The optimizer's share of the memory ledger on this rank.
  void add_memory(MemoryLedger* ledger) const;

 private:
  // One contiguous piece [lo, hi) of a bucket, whose local gradients start at `grads` in the
  // buffer of parameter group `group` (-1: the whole gradient buffer), and the handles of its
  // started collectives (overlap_comm).
  struct Piece {
    int64_t lo = 0, hi = 0;
    float* grads = nullptr;
    int64_t group = -1;
    std::vector<CollectiveHandle> handles;
  };

  ZeroOptimizer() = default;
  // Stage 2: checks (ds_enhanced), unscales and reduces flat range [lo, hi) of the local
  // gradients into the owners' shards, then zeroes it (with overlap_comm: starts the reduction).
  Status reduce_bucket(int64_t lo, int64_t hi);
  Status reduce_piece(Piece piece);
  // After a piece's reduction: the owner's addition to its shard, the local gradients zeroed.
  Status finish_piece(const Piece& piece);
  // Waits for and finishes the first `count` pieces in flight, in order (all of them are waited
  // for even after a failure; the first failure is returned).
  Status finish_pieces(size_t count);
  // Before the backward writes group `group`'s gradients: finishes the pieces in flight (and
  // those before them) that another group left in the same buffer.
  Status finish_buffer_of(int64_t group);
  const float* gradient_shard() const;

  ZeroConfig config_;
  Communicator* comm_ = nullptr;
  GptModel* model_ = nullptr;
  Backend* backend_ = nullptr;
  int64_t shard_ = 0, begin_ = 0, total_ = 0;
  bool master_is_weights_ = false;
  float* master_ = nullptr;      // [shard] (the weights' own shard when they are fp32)
  float* exp_avg_ = nullptr;     // [shard]
  float* exp_avg_sq_ = nullptr;  // [shard]
  float* grad_shard_ = nullptr;  // [shard] stage 2's reduced gradients

  Fp16Scaling scaling_ = Fp16Scaling::kStandard;
  double loss_scale_ = 1.0;
  bool local_overflow_ = false;
  bool last_micro_ = false;
  bool first_micro_ = true;
  int64_t reduced_lo_ = 0;  // stage 2: [reduced_lo_, total_) is reduced in this micro-batch
  int64_t buckets_ = 0;
  int64_t inject_ = -1;
  bool overlap_ = false;         // stage 2 with overlap_comm
  std::deque<Piece> in_flight_;  // started, not finished, in issue order
  int64_t max_in_flight_ = 0;
};

}  // namespace sciattn::train

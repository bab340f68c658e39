// ZeRO stages 1 and 2 over a Communicator (zero.h). Trainer layer (host code): the shard's state
// lives in the model's back end and is touched only through Backend calls.
#include "sciattn/train/zero.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "common/status_try.h"
#include "sciattn/train/backend.h"

namespace sciattn::train {
namespace {

TensorView flat(const float* p, int64_t n, Device device) {
  return TensorView::contiguous(p, DType::kF32, {1, n}, device);
}

}  // namespace

int64_t zero_layer_gradient_buffers(const ParameterLayout& layout, int64_t reduce_bucket_size,
                                    bool overlap_comm) {
  const auto layers = static_cast<int64_t>(layout.groups.size()) - 2;
  if (layers < 1) return 0;
  int64_t size = 1;
  for (int64_t l = 1; l <= layers; ++l) {
    const ParameterGroup& g = layout.groups[static_cast<size_t>(l)];
    size = std::max(size, g.end - g.begin);
  }
  const int64_t carried = std::max<int64_t>(reduce_bucket_size - 1, 0);
  return std::min(layers, 1 + (carried + size - 1) / size + (overlap_comm ? 1 : 0));
}

Status for_each_decay_range(const ParameterLayout& layout, int64_t begin, int64_t end,
                            const std::function<Status(int64_t, int64_t, bool)>& fn) {
  int64_t run_begin = -1, run_end = -1;
  bool run_decays = false;
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    const int64_t slot_begin = layout.slots[i].offset;
    const int64_t slot_end =
        i + 1 < layout.slots.size() ? layout.slots[i + 1].offset : layout.total;
    const int64_t b = std::max(slot_begin, begin), e = std::min(slot_end, end);
    if (b >= e) continue;
    const bool decays = layout.slots[i].weight_decay;
    if (run_begin >= 0 && decays == run_decays && run_end == b) {
      run_end = e;
      continue;
    }
    if (run_begin >= 0) SCIATTN_TRY(fn(run_begin, run_end, run_decays));
    run_begin = b;
    run_end = e;
    run_decays = decays;
  }
  if (run_begin >= 0) SCIATTN_TRY(fn(run_begin, run_end, run_decays));
  return Status::ok_status();
}

Status ZeroOptimizer::create(const ZeroConfig& config, Communicator* comm, GptModel* model,
                             const float* init, std::unique_ptr<ZeroOptimizer>* out) {
  if (config.stage != 1 && config.stage != 2) {
    return Status::invalid_argument("ZeroOptimizer: zero_optimization.stage must be 1 or 2; got " +
                                    std::to_string(config.stage));
  }
  if (comm == nullptr || model == nullptr || init == nullptr) {
    return Status::invalid_argument("ZeroOptimizer: comm, model and init are required");
  }
  if (config.reduce_bucket_size < 1) {
    return Status::invalid_argument("zero_optimization.reduce_bucket_size must be >= 1; got " +
                                    std::to_string(config.reduce_bucket_size));
  }
  const int world = comm->world_size();
  const int64_t total = model->layout().total;
  if (total % zero_parameter_multiple(world) != 0) {
    return Status::invalid_argument("ZeroOptimizer: the parameter layout's total " +
                                    std::to_string(total) + " is not a multiple of " +
                                    std::to_string(zero_parameter_multiple(world)) +
                                    " (create the model with MemoryOptions::parameter_multiple = "
                                    "zero_parameter_multiple(world_size))");
  }
  const int64_t buffers = model->memory_options().layer_gradient_buffers;
  if (buffers != 0) {
    const int64_t needed = zero_layer_gradient_buffers(model->layout(), config.reduce_bucket_size);
    if (config.stage != 2 || buffers < needed) {
      return Status::invalid_argument(
          "ZeroOptimizer: the model's gradients are in " + std::to_string(buffers) +
          " layer buffers; zero_optimization.stage " + std::to_string(config.stage) +
          " with reduce_bucket_size " + std::to_string(config.reduce_bucket_size) + " needs " +
          (config.stage == 2 ? "at least " + std::to_string(needed)
                             : std::string("one whole gradient buffer (0)")));
    }
  }
  std::unique_ptr<ZeroOptimizer> z(new ZeroOptimizer());
  z->config_ = config;
  z->comm_ = comm;
  z->model_ = model;
  z->backend_ = &model->backend();
  z->total_ = total;
  z->shard_ = total / world;
  z->begin_ = z->shard_ * comm->rank();
  z->overlap_ = config.overlap_comm && config.stage == 2;
  Backend& be = *z->backend_;
  const size_t bytes = static_cast<size_t>(z->shard_) * sizeof(float);
  SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&z->exp_avg_)));
  SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&z->exp_avg_sq_)));
  if (config.stage == 2) SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&z->grad_shard_)));
  if (model->weight_dtype() == DType::kF32) {
    // The fp32 weights' own shard is the master shard: AdamW updates it in place and the gather
    // leaves it where it is.
    z->master_is_weights_ = true;
    z->master_ = static_cast<float*>(model->weights()) + z->begin_;
  } else {
    SCIATTN_TRY(be.allocate(bytes, reinterpret_cast<void**>(&z->master_)));
    SCIATTN_TRY(be.copy_to_device(z->master_, init + z->begin_, bytes));
  }
  *out = std::move(z);
  return Status::ok_status();
}

ZeroOptimizer::~ZeroOptimizer() {
  if (backend_ == nullptr) return;
  // After a failure pieces may be in flight: every started collective is waited for.
  for (const Piece& p : in_flight_) {
    for (const CollectiveHandle& h : p.handles) comm_->wait(h);
  }
  backend_->release(exp_avg_);
  backend_->release(exp_avg_sq_);
  if (grad_shard_ != nullptr) backend_->release(grad_shard_);
  if (!master_is_weights_) backend_->release(master_);
}

Status ZeroOptimizer::begin_step(Fp16Scaling scaling, double loss_scale) {
  if (!(loss_scale > 0.0) || !std::isfinite(loss_scale)) {
    return Status::invalid_argument("ZeroOptimizer: loss_scale must be a finite number > 0");
  }
  scaling_ = scaling;
  loss_scale_ = loss_scale;
  local_overflow_ = false;
  buckets_ = 0;
  max_in_flight_ = 0;
  if (grad_shard_ != nullptr) {
    SCIATTN_TRY(backend_->fill_zero(grad_shard_, static_cast<size_t>(shard_) * sizeof(float)));
  }
  return Status::ok_status();
}

void ZeroOptimizer::begin_micro_batch(int64_t micro, int64_t count) {
  first_micro_ = micro == 0;
  last_micro_ = micro + 1 == count;
  reduced_lo_ = total_;
}

Status ZeroOptimizer::after_backward(int64_t group) {
  if (config_.stage != 2) return Status::ok_status();
  // The backward finishes groups from the last to the first, so [ready, total) is final for this
  // micro-batch; full buckets are cut from the top of what is not reduced yet, and the first
  // group (the embeddings, which the tied LM head also writes) flushes the rest.
  const int64_t ready = model_->layout().groups[static_cast<size_t>(group)].begin;
  const int64_t bucket = config_.reduce_bucket_size;
  while (reduced_lo_ - ready >= bucket) {
    SCIATTN_TRY(reduce_bucket(reduced_lo_ - bucket, reduced_lo_));
    reduced_lo_ -= bucket;
  }
  if (group == 0) {
    if (reduced_lo_ > 0) {
      SCIATTN_TRY(reduce_bucket(0, reduced_lo_));
      reduced_lo_ = 0;
    }
    // Nothing local outlives the micro-batch's backward.
    return finish_pieces(in_flight_.size());
  }
  // The backward writes group - 1's gradients next.
  return finish_buffer_of(group - 1);
}

Status ZeroOptimizer::reduce_bucket(int64_t lo, int64_t hi) {
  ++buckets_;
  if (model_->grads() != nullptr) return reduce_piece({lo, hi, model_->grads() + lo, -1, {}});
  // Separate group buffers: the bucket group by group. Every step below is elementwise (or a
  // finiteness test that is or'ed), so the pieces give the whole bucket's bits.
  const std::vector<ParameterGroup>& groups = model_->layout().groups;
  for (size_t g = groups.size(); g-- > 0;) {
    const int64_t a = std::max(lo, groups[g].begin), b = std::min(hi, groups[g].end);
    if (a >= b) continue;
    const auto group = static_cast<int64_t>(g);
    SCIATTN_TRY(
        reduce_piece({a, b, model_->group_grads(group) + (a - groups[g].begin), group, {}}));
  }
  return Status::ok_status();
}

Status ZeroOptimizer::finish_buffer_of(int64_t group) {
  if (in_flight_.empty() || model_->grads() != nullptr) return Status::ok_status();
  const float* buffer = model_->group_grads(group);
  size_t count = 0;
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    const int64_t g = in_flight_[i].group;
    if (g >= 0 && g != group && model_->group_grads(g) == buffer) count = i + 1;
  }
  return finish_pieces(count);
}

Status ZeroOptimizer::finish_pieces(size_t count) {
  Status first;
  for (size_t i = 0; i < count; ++i) {
    const Piece p = std::move(in_flight_.front());
    in_flight_.pop_front();
    for (const CollectiveHandle& h : p.handles) {
      const Status s = comm_->wait(h);
      if (first.ok() && !s.ok()) first = s;
    }
    if (first.ok()) first = finish_piece(p);
  }
  return first;
}

Status ZeroOptimizer::reduce_piece(Piece piece) {
  Backend& be = *backend_;
  const int64_t lo = piece.lo, hi = piece.hi;
  // Flat element i's local gradient, for i in [lo, hi).
  auto grads = [&](int64_t i) { return piece.grads + (i - lo); };
  if (last_micro_ && inject_ >= lo && inject_ < hi) {
    const float inf = std::numeric_limits<float>::infinity();
    SCIATTN_TRY(be.copy_to_device(grads(inject_), &inf, sizeof inf));
    inject_ = -1;
  }
  if (scaling_ == Fp16Scaling::kDsEnhanced) {
    // This rank's own scaled gradients, before any reduction.
    SumSquares local;
    SCIATTN_TRY(be.sum_squares(grads(lo), hi - lo, &local));
    local_overflow_ = local_overflow_ || !local.finite;
    if (loss_scale_ != 1.0) {
      SCIATTN_TRY(be.scale_in_place(grads(lo), hi - lo, static_cast<float>(1.0 / loss_scale_)));
    }
  }
  if (!overlap_) {
    if (!config_.reduce_scatter) SCIATTN_TRY(comm_->all_reduce_mean(grads(lo), hi - lo));
    for (int r = 0; config_.reduce_scatter && r < comm_->world_size(); ++r) {
      const int64_t a = std::max(lo, shard_ * r), b = std::min(hi, shard_ * (r + 1));
      if (a < b) SCIATTN_TRY(comm_->reduce(grads(a), b - a, r, ReduceOp::kMean));
    }
    return finish_piece(piece);
  }
  // Started: the piece is in flight (and its handles recorded, so that they are waited for)
  // before each start.
  in_flight_.push_back(std::move(piece));
  max_in_flight_ = std::max(max_in_flight_, static_cast<int64_t>(in_flight_.size()));
  std::vector<CollectiveHandle>& handles = in_flight_.back().handles;
  CollectiveHandle h;
  if (!config_.reduce_scatter) {
    SCIATTN_TRY(comm_->start_all_reduce_mean(grads(lo), hi - lo, &h));
    handles.push_back(h);
  }
  for (int r = 0; config_.reduce_scatter && r < comm_->world_size(); ++r) {
    const int64_t a = std::max(lo, shard_ * r), b = std::min(hi, shard_ * (r + 1));
    if (a >= b) continue;
    SCIATTN_TRY(comm_->start_reduce(grads(a), b - a, r, ReduceOp::kMean, &h));
    handles.push_back(h);
  }
  return Status::ok_status();
}

Status ZeroOptimizer::finish_piece(const Piece& piece) {
  Backend& be = *backend_;
  const int64_t lo = piece.lo, hi = piece.hi;
  auto grads = [&](int64_t i) { return piece.grads + (i - lo); };
  const int me = comm_->rank();
  for (int r = 0; r < comm_->world_size(); ++r) {
    const int64_t a = std::max(lo, shard_ * r), b = std::min(hi, shard_ * (r + 1));
    if (a >= b || r != me) continue;
    // The owner keeps its piece. The first micro-batch copies (so that a -0 stays -0, as in
    // stage 1); later ones add, in micro-batch order.
    float* dst = grad_shard_ + (a - begin_);
    if (first_micro_) {
      SCIATTN_TRY(be.cast(grads(a), DType::kF32, dst, DType::kF32, b - a));
    } else {
      const Device d = be.device();
      SCIATTN_TRY(be.add({flat(dst, b - a, d), flat(grads(a), b - a, d), flat(dst, b - a, d)}));
    }
  }
  // The next micro-batch's backward accumulates into zeros again.
  return be.fill_zero(grads(lo), static_cast<size_t>(hi - lo) * sizeof(float));
}

const float* ZeroOptimizer::gradient_shard() const {
  return config_.stage == 2 ? grad_shard_ : model_->grads() + begin_;
}

Status ZeroOptimizer::reduce(ReducedGradients* out) {
  *out = ReducedGradients{};
  Backend& be = *backend_;
  const bool enhanced = scaling_ == Fp16Scaling::kDsEnhanced;
  SCIATTN_TRY(finish_pieces(in_flight_.size()));
  if (config_.stage == 2 && reduced_lo_ != 0) {
    return Status(StatusCode::kInternal,
                  "ZeroOptimizer: the backward did not finish every parameter group (reduced "
                  "down to element " +
                      std::to_string(reduced_lo_) + ")");
  }
  if (config_.stage == 1) {
    float* grads = model_->grads();
    if (enhanced) {
      SumSquares local;
      SCIATTN_TRY(be.sum_squares(grads, total_, &local));
      local_overflow_ = !local.finite;
    }
  }
  if (enhanced) {
    // Every rank learns whether any rank overflowed before anything else crosses ranks.
    double overflow = local_overflow_ ? 1.0 : 0.0;
    SCIATTN_TRY(comm_->all_reduce_max(&overflow));
    out->overflow = overflow != 0.0;
    if (out->overflow) return Status::ok_status();
  }
  if (config_.stage == 1) {
    float* grads = model_->grads();
    if (enhanced && loss_scale_ != 1.0) {
      SCIATTN_TRY(be.scale_in_place(grads, total_, static_cast<float>(1.0 / loss_scale_)));
    }
    if (config_.reduce_scatter) {
      SCIATTN_TRY(comm_->reduce_scatter(grads, grads + begin_, shard_, ReduceOp::kMean));
    } else {
      SCIATTN_TRY(comm_->all_reduce_mean(grads, total_));
    }
  }
  SumSquares shard;
  SCIATTN_TRY(be.sum_squares(gradient_shard(), shard_, &shard));
  if (!enhanced) {
    // Standard order: the reduced (still scaled) shards are checked; one rank's Inf reaches the
    // owner of its element through the reduction, and the max tells everyone.
    double overflow = shard.finite ? 0.0 : 1.0;
    SCIATTN_TRY(comm_->all_reduce_max(&overflow));
    out->overflow = overflow != 0.0;
    if (out->overflow) return Status::ok_status();
  }
  double sum = shard.sum;
  SCIATTN_TRY(comm_->all_reduce_sum(&sum));
  out->norm = enhanced ? std::sqrt(sum) : std::sqrt(sum) / loss_scale_;
  out->pending_scale = enhanced ? 1.0f : static_cast<float>(1.0 / loss_scale_);
  return Status::ok_status();
}

Status ZeroOptimizer::update(const AdamWHyperparams& hyper, int64_t step, float grad_scale) {
  Backend& be = *backend_;
  const ParameterLayout& layout = model_->layout();
  const DType wt = model_->weight_dtype();
  const size_t es = dtype_size(wt);
  auto* weights = static_cast<std::byte*>(model_->weights());
  const float* grads = gradient_shard();
  AdamWHyperparams h = hyper;
  SCIATTN_TRY(
      for_each_decay_range(layout, begin_, begin_ + shard_, [&](int64_t b, int64_t e, bool decays) {
        h.weight_decay = decays ? hyper.weight_decay : 0.0f;
        const int64_t k = b - begin_;
        void* copy = master_is_weights_ ? nullptr : weights + static_cast<size_t>(b) * es;
        return be.adamw_step(h, step, grad_scale, master_ + k, grads + k, exp_avg_ + k,
                             exp_avg_sq_ + k, e - b, copy, wt);
      }));
  // Every rank's weights get every shard.
  if (config_.allgather_partitions) {
    return comm_->all_gather(weights + static_cast<size_t>(begin_) * es, weights, shard_, wt);
  }
  for (int r = 0; r < comm_->world_size(); ++r) {
    SCIATTN_TRY(comm_->broadcast(weights + static_cast<size_t>(shard_ * r) * es, shard_, wt, r));
  }
  return Status::ok_status();
}

Status ZeroOptimizer::shard_to_host(State which, std::vector<float>* out) const {
  const float* src = which == State::kMaster     ? master_
                     : which == State::kExpAvg   ? exp_avg_
                     : which == State::kExpAvgSq ? exp_avg_sq_
                                                 : gradient_shard();
  out->resize(static_cast<size_t>(shard_));
  return backend_->copy_to_host(out->data(), src, out->size() * sizeof(float));
}

Status ZeroOptimizer::shard_from_host(State which, const std::vector<float>& in) {
  if (which == State::kGradients) {
    return Status::invalid_argument("ZeroOptimizer::shard_from_host: the gradients are not state");
  }
  if (static_cast<int64_t>(in.size()) != shard_) {
    return Status::invalid_argument("ZeroOptimizer::shard_from_host: in holds " +
                                    std::to_string(in.size()) + " floats; the shard has " +
                                    std::to_string(shard_));
  }
  float* dst = which == State::kMaster ? master_ : which == State::kExpAvg ? exp_avg_ : exp_avg_sq_;
  return backend_->copy_to_device(dst, in.data(), in.size() * sizeof(float));
}

Status ZeroOptimizer::gather_master(std::vector<float>* out) {
  float* full = nullptr;
  const size_t bytes = static_cast<size_t>(total_) * sizeof(float);
  SCIATTN_TRY(backend_->allocate(bytes, reinterpret_cast<void**>(&full)));
  Status s = comm_->all_gather(master_, full, shard_, DType::kF32);
  if (s.ok()) {
    out->resize(static_cast<size_t>(total_));
    s = backend_->copy_to_host(out->data(), full, bytes);
  }
  backend_->release(full);
  return s;
}

void add_zero_memory(int64_t layout_total, int world_size, int stage, bool master_is_weights,
                     Device device, MemoryLedger* ledger) {
  const uint64_t f32 = static_cast<uint64_t>(layout_total / world_size) * sizeof(float);
  const std::string of = " (f32, 1/" + std::to_string(world_size) + " of the layout)";
  if (!master_is_weights) {
    ledger->add("ZeRO shard: master weights" + of, "model states", device, f32, kPhaseOptimizer);
  }
  ledger->add("ZeRO shard: AdamW exp_avg, exp_avg_sq" + of, "model states", device, 2 * f32,
              kPhaseOptimizer);
  if (stage == 2) {
    ledger->add("ZeRO-2 shard: reduced gradients" + of, "model states", device, f32,
                kPhaseBackward | kPhaseOptimizer);
  }
}

void ZeroOptimizer::add_memory(MemoryLedger* ledger) const {
  add_zero_memory(total_, comm_->world_size(), config_.stage, master_is_weights_,
                  backend_->device(), ledger);
}

}  // namespace sciattn::train

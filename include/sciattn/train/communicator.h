// The collective operations the trainer's gradient path goes through, and the single-rank
// implementation it runs with today. Public API of the trainer (plain C++17).
//
// Every cross-rank step of a training step is a call here, so that a multi-rank trainer (NCCL on
// GPUs, threads in one process for CPU tests) replaces this object and nothing else in the order
// of operations: fp16 "ds_enhanced" scaling happens per rank before all_reduce_mean (see
// reduce_gradients in gradients.h), and the overflow flag is combined with all_reduce_max.
#pragma once

#include <cstdint>

#include "sciattn/status.h"

namespace sciattn::train {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // data[i] <- (sum over ranks of data[i]) / world_size, on every rank. data lives where the
  // gradients live (host memory for the CPU path).
  virtual Status all_reduce_mean(float* data, int64_t n) = 0;
  // *value <- max over ranks of *value, on every rank (overflow flags, norms).
  virtual Status all_reduce_max(double* value) = 0;
  // *value <- sum over ranks of *value (squared norms of gradient shards).
  virtual Status all_reduce_sum(double* value) = 0;
};

// One rank: every collective leaves its data as it is.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status all_reduce_mean(float*, int64_t n) override;
  Status all_reduce_max(double*) override { return Status::ok_status(); }
  Status all_reduce_sum(double*) override { return Status::ok_status(); }
};

}  // namespace sciattn::train

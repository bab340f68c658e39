// A test back end of the Communicator interface: N ranks as N threads of one process. It exists
// to test the trainer's multi-rank logic (ZeRO, sequence parallelism) in CI, on the CPU; it is not
// a back end for users (NCCL is). Public API of the trainer (plain C++17).
//
// The ranks of a group share one rendezvous object. A collective is two barriers: each rank
// publishes its buffer pointers and waits for the others; then each rank reads the other ranks'
// inputs and writes only its own outputs; the second barrier keeps every input alive until all
// ranks have read it. Reductions add in rank order (x_0 + x_1, then + x_2, ...) in the buffer's
// dtype (float; double for the scalar calls), and a mean divides that sum by N once, so every
// rank gets the same bits, and a sum over ranks equals one rank's sequential sum over the
// concatenated data when that sum goes in the same order. Buffers are host memory.
//
// Started collectives (communicator.h) run on a progress thread of the rank, made at its first
// start: it takes them in issue order and runs the same two-barrier protocol as a call, while the
// rank's own thread goes on (computing the backward of the next layers). A called collective
// first waits until every started one of this rank has run, so that one thread at a time speaks
// for the rank and the order stays the issue order. So a start returns before the collective
// has run, even when another rank has not reached it yet.
//
// Errors do not deadlock: a rank that leaves run_thread_ranks' function with an error poisons the
// group, and every rank waiting in (or later entering) a collective gets an error Status naming
// the failed rank; a rank that returns ok while others still wait in a collective also fails
// them, with a message that says so. Groups made by split() share their parent's fate: a failed
// rank poisons every group split from its group (recursively), and a rank that returns ok counts
// as gone in each of those groups it belongs to. A rank that leaves ok first lets its started
// collectives run; a communicator destroyed while started ones have not run fails the group.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/train/communicator.h"

namespace sciattn::train {

class ThreadRendezvous;
class ThreadProgress;

class ThreadCommunicator final : public Communicator {
 public:
  // The communicators of one group of `world_size` ranks (>= 1), rank r at index r. Each is to
  // be used by one thread.
  static Status create_group(int world_size, std::vector<std::unique_ptr<ThreadCommunicator>>* out);
  ~ThreadCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override;

  Status all_reduce_mean(float* data, int64_t n) override;
  Status all_reduce_max(double* value) override;
  Status all_reduce_sum(double* value) override;
  Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) override;
  Status reduce(float* data, int64_t n, int root, ReduceOp op) override;
  Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) override;
  Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) override;
  Status broadcast(void* data, int64_t n, DType dtype, int root) override;
  Status barrier() override;
  Status split(int color, int key, std::unique_ptr<Communicator>* out) override;
  Status start_all_reduce_mean(float* data, int64_t n, CollectiveHandle* out) override;
  Status start_reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op,
                              CollectiveHandle* out) override;
  Status start_reduce(float* data, int64_t n, int root, ReduceOp op,
                      CollectiveHandle* out) override;
  Status wait(CollectiveHandle handle) override;

  // Marks this rank as finished with `status` (run_thread_ranks calls it): an error poisons the
  // group; ok makes the collectives that still wait for this rank fail.
  void leave(const Status& status);

  // How many collectives this rank has entered (tests check that a code path communicates).
  int64_t collectives() const { return collectives_.load(); }

 private:
  ThreadCommunicator(std::shared_ptr<ThreadRendezvous> group, int rank);
  // The two-barrier protocol around `body`, which may read every rank's published pointers.
  Status run(const char* name, const void* a, const void* b, const std::function<void()>& body);
  // Returns when every started collective of this rank has run (before a call runs).
  void drain();
  // The reductions themselves, on whichever thread speaks for the rank.
  Status run_all_reduce_mean(float* data, int64_t n);
  Status run_reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op);
  Status run_reduce(float* data, int64_t n, int root, ReduceOp op);
  // Queues `task` on the progress thread (made on first use) and fills *out.
  void enqueue(std::function<Status()> task, CollectiveHandle* out);

  std::shared_ptr<ThreadRendezvous> group_;
  int rank_ = 0;
  std::atomic<int64_t> collectives_{0};
  std::unique_ptr<ThreadProgress> progress_;
  int64_t splits_ = 0;  // split() calls so far: the same count on every rank of the group
};

// Runs fn(comm) for ranks 0 .. world_size - 1 on one thread each, with a fresh group, and returns
// each rank's Status (index = rank). A rank whose fn fails poisons the group (see above), so the
// others return too; an exception from fn becomes that rank's kInternal status the same way.
// world_size < 1 gives one kInvalidArgument status.
std::vector<Status> run_thread_ranks(int world_size,
                                     const std::function<Status(Communicator& comm)>& fn);

}  // namespace sciattn::train

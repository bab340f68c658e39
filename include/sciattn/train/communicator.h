// The collective operations the trainer's multi-rank paths go through, and the single-rank
// implementation. Public API of the trainer (plain C++17).
//
// Every cross-rank step of a training step is a call here, so that a multi-rank trainer (NCCL on
// GPUs; ThreadCommunicator, threads in one process, for CPU tests) replaces this object and
// nothing else in the order of operations: fp16 "ds_enhanced" scaling happens per rank before the
// reduction (see reduce_gradients in gradients.h and ZeroOptimizer in zero.h), and the overflow
// flag is combined with all_reduce_max.
//
// Rules every implementation keeps:
//   - Collectives are called by every rank of the group, in the same order, with the same counts
//     (and the same root); a rank that skips one leaves the others waiting (the thread back end
//     turns that into an error instead).
//   - Buffers live where the caller's tensors live: the Backend's memory of the rank (host memory
//     for the CPU back end; device memory for a GPU communicator). Pointers are the rank's own.
//   - The call returns when this rank's outputs are written and its inputs may be reused. A
//     communicator over device memory reads its inputs only after the work queued so far on the
//     back end's stream (NCCL: its stream waits for an event recorded there), so callers queue
//     the kernels that produce them and call without synchronizing the host.
//   - Every rank gets the same bits of a reduction; a mean divides the sum by world_size() once.
//     The CPU back ends (threads, TCP) add in rank order (((x_0 + x_1) + x_2) + ...); NCCL adds in
//     an order of its own (equal to rank order for two ranks), so its last bits may differ.
//   - A count of 0 is allowed and moves nothing; negative counts and a root outside
//     [0, world_size()) are refused with kInvalidArgument naming the argument.
//
// Started collectives (start_all_reduce_mean, start_reduce_scatter, start_reduce; DeepSpeed's
// overlap_comm): the gradient path's three reductions can also be started, returning a handle at
// once, and waited for later, so that a rank computes (the backward of the next layers) while
// they run. Their rules:
//   - Issue order is run order. Started and called collectives of one communicator run one at a
//     time in the order this rank issued them, and every rank issues the same sequence (the first
//     rule above counts a start as the call). A called collective issued while started ones are
//     outstanding runs after them. So the results are those of calling the same collectives in
//     the same order, bit for bit, and the reduction order stays fixed.
//   - Between the start and the wait the buffers belong to the communicator: the caller neither
//     reads nor writes them. wait(handle) returns when the collective's outputs are this rank's
//     and its inputs may be reused: written, for host-memory communicators; for a device
//     communicator (NCCL), ordered before all the work queued afterwards on the stream it was
//     made with (the back end's), so that the back end's later calls see them.
//   - Each handle is waited for once, in any order (a handle whose collective has finished
//     returns at once). A collective's failure is returned by its wait, naming the collective.
//     A start that fails started nothing and issued no handle (bad arguments, checked at once by
//     the thread and NCCL communicators; the base class reports them through the wait instead).
//     Every handle must be waited for before the communicator is destroyed.
//   - The base class's start runs the collective to completion and keeps its Status for the
//     wait (no overlap), so every communicator supports the calls; ThreadCommunicator runs them
//     on a progress thread per rank, and the NCCL communicator on a communication stream.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "sciattn/dtype.h"
#include "sciattn/status.h"

namespace sciattn::train {

enum class ReduceOp {
  kSum,
  kMean,  // the sum divided by world_size()
};
const char* reduce_op_name(ReduceOp op);  // "sum", "mean"

// A started collective, for Communicator::wait: its number in this communicator's sequence of
// started collectives (1, 2, ...); 0 is no collective.
struct CollectiveHandle {
  uint64_t id = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // data[i] <- (sum over ranks of data[i]) / world_size, on every rank (n floats, in place).
  virtual Status all_reduce_mean(float* data, int64_t n) = 0;
  // *value <- max over ranks of *value, on every rank (overflow flags, norms).
  virtual Status all_reduce_max(double* value) = 0;
  // *value <- sum over ranks of *value, on every rank (squared norms of gradient shards, losses).
  virtual Status all_reduce_sum(double* value) = 0;

  // Reduce-scatter into equal shards. Each rank passes `send`, world_size() * shard floats, seen
  // as world_size() consecutive chunks of `shard` floats; rank r gets in `recv` (shard floats) the
  // sum (or mean) over ranks of chunk r. recv may be send + rank() * shard (in place); otherwise
  // the two must not overlap. send is not modified (except through an in-place recv).
  virtual Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) = 0;
  // Reduce to one rank: on `root`, data (n floats) <- sum (or mean) over ranks of data; the other
  // ranks' data is left as it is. ZeRO stage 2 sends each piece of a gradient bucket to the rank
  // that owns it this way (NCCL: ncclReduce).
  virtual Status reduce(float* data, int64_t n, int root, ReduceOp op) = 0;
  // All-gather of equal shards: each rank passes `shard` elements of `dtype` in send; every rank
  // gets in recv (world_size() * shard elements) rank r's shard at element r * shard. send may be
  // recv + rank() * shard elements (in place); otherwise the two must not overlap.
  virtual Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) = 0;
  // All-to-all of equal chunks: each rank passes world_size() chunks of `chunk` elements of
  // `dtype` in send, chunk q going to rank q; recv (the same size) gets at chunk q what rank q
  // sent to this rank. send and recv must not overlap. (Ulysses sequence parallelism turns a
  // token split into a head split with it.)
  virtual Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) = 0;
  // Broadcast: every rank's data (n elements of dtype) <- root's data.
  virtual Status broadcast(void* data, int64_t n, DType dtype, int root) = 0;
  // Returns when every rank has called it.
  virtual Status barrier() = 0;

  // The started forms of all_reduce_mean, reduce_scatter and reduce (the rules at the top of
  // this file): the same arguments and results, the handle in *out.
  virtual Status start_all_reduce_mean(float* data, int64_t n, CollectiveHandle* out);
  virtual Status start_reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op,
                                      CollectiveHandle* out);
  virtual Status start_reduce(float* data, int64_t n, int root, ReduceOp op, CollectiveHandle* out);
  // Waits for a started collective and returns its Status. A handle that was not issued by this
  // communicator, or was waited for already, gives kInvalidArgument.
  virtual Status wait(CollectiveHandle handle);

  // Splits the group into subgroups (a collective; NCCL: ncclCommSplit). Every rank passes a
  // color (>= 0) and a key; the ranks with one color form one new group, ranked by key (ties by
  // their rank here), and each gets in *out its communicator of that group. The new group keeps
  // every rule above among its own ranks; its collectives involve no rank outside it, so groups
  // of different colors run theirs independently. It must not outlive this communicator. (The
  // trainer's sequence-parallel groups are color rank / sequence_parallel_size, key rank.)
  virtual Status split(int color, int key, std::unique_ptr<Communicator>* out) = 0;

 private:
  // The base class's started collectives: their Status, kept until they are waited for.
  Status finished(const Status& s, CollectiveHandle* out);
  uint64_t started_ = 0;
  std::map<uint64_t, Status> unwaited_;
};

// The message of a wait on a handle that a communicator did not issue or that was waited for.
Status unknown_handle(CollectiveHandle handle);
// The check of a start's handle pointer (not null); the message names the call.
Status check_handle_out(const char* name, const CollectiveHandle* out);

// One rank: every collective leaves the data as it is, or copies send to recv when they differ
// (with memcpy: out-of-place calls need host memory; in-place calls touch nothing, so the
// single-rank trainer passes device memory too). The trainer runs the same order of operations
// with one rank and with several.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status all_reduce_mean(float*, int64_t n) override;
  Status all_reduce_max(double*) override { return Status::ok_status(); }
  Status all_reduce_sum(double*) override { return Status::ok_status(); }
  Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) override;
  Status reduce(float* data, int64_t n, int root, ReduceOp op) override;
  Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) override;
  Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) override;
  Status broadcast(void* data, int64_t n, DType dtype, int root) override;
  Status barrier() override { return Status::ok_status(); }
  // A new one-rank communicator (color must be >= 0).
  Status split(int color, int key, std::unique_ptr<Communicator>* out) override;
};

// The checks every implementation applies to its arguments (count >= 0, root in range, dtype
// one of f32, f16, bf16); the message names the collective and the argument.
Status check_collective(const char* name, int64_t count, int world_size, DType dtype, int root = 0);
// The check of split's arguments (color >= 0, out not null).
Status check_split(int color, const std::unique_ptr<Communicator>* out);

}  // namespace sciattn::train

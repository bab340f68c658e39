// The multi-process CPU test communicator (make_tcp_communicator in process_group.h): every
// collective gathers the ranks' inputs at rank 0 over the rendezvous connections, rank 0 computes
// each rank's output as ThreadCommunicator does (sums in rank order in the buffer's dtype, a mean
// divided once), and sends it back. Trainer layer (host code).
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "sciattn/train/process_group.h"
#include "train/rendezvous.h"

namespace sciattn::train {
namespace {

enum class Op : int32_t {
  kAllReduceMean,
  kAllReduceMax,
  kAllReduceSum,
  kReduceScatter,
  kReduce,
  kAllGather,
  kAllToAll,
  kBroadcast,
  kBarrier,
};

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduceMean:
      return "all_reduce_mean";
    case Op::kAllReduceMax:
      return "all_reduce_max";
    case Op::kAllReduceSum:
      return "all_reduce_sum";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kReduce:
      return "reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kBarrier:
      return "barrier";
  }
  return "?";
}

// What a rank sends rank 0 before its input, and what rank 0 sends back before the output.
struct Request {
  Op op;
  int32_t root;
  int32_t dtype;
  int32_t reduce_op;
  int64_t count;
  uint64_t bytes;  // the input that follows
};
struct Reply {
  int32_t code;  // a StatusCode; 0 (kOk) when the output follows
  uint32_t message_bytes;
  uint64_t bytes;  // the output that follows the message
};
static_assert(static_cast<int>(StatusCode::kOk) == 0, "Reply::code 0 means ok");

using Bytes = std::vector<std::byte>;
// Rank 0's part of a collective: from every rank's input (rank order), every rank's output.
using Combine =
    std::function<void(const std::vector<const std::byte*>& in, std::vector<Bytes>* out)>;

// The rank-order sum over `inputs` (float elements [offset, offset + n) of each), divided by the
// number of ranks once for a mean: ThreadCommunicator's arithmetic.
Bytes rank_order_sum(const std::vector<const std::byte*>& inputs, int64_t offset, int64_t n,
                     bool mean) {
  Bytes out(static_cast<size_t>(n) * sizeof(float));
  auto* sum = reinterpret_cast<float*>(out.data());
  if (n == 0) return out;
  std::memcpy(sum, reinterpret_cast<const float*>(inputs[0]) + offset,
              static_cast<size_t>(n) * sizeof(float));
  for (size_t q = 1; q < inputs.size(); ++q) {
    const float* x = reinterpret_cast<const float*>(inputs[q]) + offset;
    for (int64_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  if (mean) {
    const float divisor = static_cast<float>(inputs.size());
    for (int64_t i = 0; i < n; ++i) sum[i] /= divisor;
  }
  return out;
}

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(std::unique_ptr<TcpRendezvous> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->world_size(); }

  Status all_reduce_mean(float* data, int64_t n) override {
    Status s = check_collective("all_reduce_mean", n, world_size(), DType::kF32);
    if (!s.ok()) return s;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    return collective(Op::kAllReduceMean, n, 0, DType::kF32, ReduceOp::kMean, data, bytes, data,
                      bytes, [&](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
                        const Bytes sum = rank_order_sum(in, 0, n, true);
                        for (Bytes& o : *out) o = sum;
                      });
  }

  Status all_reduce_max(double* value) override {
    return scalar(Op::kAllReduceMax, value, [](double acc, double x) {
      // A NaN anywhere wins, so that an invalid value is never hidden.
      return x > acc || std::isnan(x) ? x : acc;
    });
  }

  Status all_reduce_sum(double* value) override {
    return scalar(Op::kAllReduceSum, value, [](double acc, double x) { return acc + x; });
  }

  Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) override {
    Status s = check_collective("reduce_scatter", shard, world_size(), DType::kF32);
    if (!s.ok()) return s;
    const size_t shard_bytes = static_cast<size_t>(shard) * sizeof(float);
    return collective(Op::kReduceScatter, shard, 0, DType::kF32, op, send,
                      shard_bytes * static_cast<size_t>(world_size()), recv, shard_bytes,
                      [&](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
                        for (size_t q = 0; q < out->size(); ++q) {
                          (*out)[q] = rank_order_sum(in, static_cast<int64_t>(q) * shard, shard,
                                                     op == ReduceOp::kMean);
                        }
                      });
  }

  Status reduce(float* data, int64_t n, int root, ReduceOp op) override {
    Status s = check_collective("reduce", n, world_size(), DType::kF32, root);
    if (!s.ok()) return s;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    return collective(
        Op::kReduce, n, root, DType::kF32, op, data, bytes, data, rank() == root ? bytes : 0,
        [&](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
          (*out)[static_cast<size_t>(root)] = rank_order_sum(in, 0, n, op == ReduceOp::kMean);
        });
  }

  Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) override {
    Status s = check_collective("all_gather", shard, world_size(), dtype);
    if (!s.ok()) return s;
    const size_t bytes = static_cast<size_t>(shard) * dtype_size(dtype);
    return collective(Op::kAllGather, shard, 0, dtype, ReduceOp::kSum, send, bytes, recv,
                      bytes * static_cast<size_t>(world_size()),
                      [&](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
                        Bytes all;
                        for (const std::byte* x : in) all.insert(all.end(), x, x + bytes);
                        for (Bytes& o : *out) o = all;
                      });
  }

  Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) override {
    Status s = check_collective("all_to_all", chunk, world_size(), dtype);
    if (!s.ok()) return s;
    const size_t bytes = static_cast<size_t>(chunk) * dtype_size(dtype);
    const size_t all = bytes * static_cast<size_t>(world_size());
    return collective(Op::kAllToAll, chunk, 0, dtype, ReduceOp::kSum, send, all, recv, all,
                      [&](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
                        for (size_t r = 0; r < out->size(); ++r) {
                          Bytes& o = (*out)[r];
                          for (const std::byte* x : in) {
                            o.insert(o.end(), x + r * bytes, x + (r + 1) * bytes);
                          }
                        }
                      });
  }

  Status broadcast(void* data, int64_t n, DType dtype, int root) override {
    Status s = check_collective("broadcast", n, world_size(), dtype, root);
    if (!s.ok()) return s;
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
    // Every rank sends its buffer (the same size on all ranks keeps the protocol uniform).
    return collective(Op::kBroadcast, n, root, dtype, ReduceOp::kSum, data, bytes, data, bytes,
                      [&](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
                        const std::byte* x = in[static_cast<size_t>(root)];
                        for (Bytes& o : *out) o.assign(x, x + bytes);
                      });
  }

  // The TCP test back end has one set of connections through rank 0 and no subgroups: sequence
  // parallelism over processes runs on NCCL (its tests run ranks as threads, ThreadCommunicator).
  Status split(int color, int, std::unique_ptr<Communicator>* out) override {
    Status s = check_split(color, out);
    if (!s.ok()) return s;
    return Status::not_supported(
        "the TCP test communicator cannot split its ranks into groups, so "
        "sequence_parallel_size > 1 does not run on CPU ranks as processes; use ranks as threads "
        "(the tests) or GPUs with NCCL");
  }

  Status barrier() override {
    return collective(Op::kBarrier, 0, 0, DType::kF32, ReduceOp::kSum, nullptr, 0, nullptr, 0,
                      [](const std::vector<const std::byte*>&, std::vector<Bytes>*) {});
  }

 private:
  static Bytes as_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    return Bytes(b, b + n);
  }

  // A double combined over the ranks in rank order: acc = x_0, then acc = fold(acc, x_q).
  Status scalar(Op op, double* value, double (*fold)(double, double)) {
    return collective(op, 1, 0, DType::kF32, ReduceOp::kSum, value, sizeof *value, value,
                      sizeof *value,
                      [fold](const std::vector<const std::byte*>& in, std::vector<Bytes>* out) {
                        double acc = 0.0, x = 0.0;
                        std::memcpy(&acc, in[0], sizeof acc);
                        for (size_t q = 1; q < in.size(); ++q) {
                          std::memcpy(&x, in[q], sizeof x);
                          acc = fold(acc, x);
                        }
                        for (Bytes& o : *out) o = as_bytes(&acc, sizeof acc);
                      });
  }

  // One collective: every rank sends `send_bytes` of input to rank 0 with the call's signature;
  // rank 0 checks that the signatures agree, runs `combine` and sends each rank its output,
  // which lands in `recv` (`recv_bytes`, which the reply must match). Inputs are read before any
  // output is written, so recv may alias send.
  Status collective(Op op, int64_t count, int root, DType dtype, ReduceOp reduce_op,
                    const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                    const Combine& combine) {
    const Request mine{
        op, root, static_cast<int32_t>(dtype), static_cast<int32_t>(reduce_op), count, send_bytes};
    if (!broken_.ok()) return broken_;
    if (world_size() == 1) {
      std::vector<Bytes> out(1);
      combine({static_cast<const std::byte*>(send)}, &out);
      return deliver(op, out[0], recv, recv_bytes);
    }
    if (rank() != 0) return as_peer(mine, send, recv, recv_bytes);
    return as_root(mine, send, recv, recv_bytes, combine);
  }

  Status deliver(Op op, const Bytes& out, void* recv, size_t recv_bytes) const {
    if (out.size() != recv_bytes) {
      return Status(StatusCode::kInternal,
                    std::string(op_name(op)) + " on rank " + std::to_string(rank()) + ": got " +
                        std::to_string(out.size()) + " bytes back, expected " +
                        std::to_string(recv_bytes));
    }
    if (recv_bytes > 0) std::memcpy(recv, out.data(), recv_bytes);
    return Status::ok_status();
  }

  // A broken connection leaves the byte streams out of step: every later call fails the same way.
  Status fail(Status s) {
    broken_ = s;
    return s;
  }

  Status as_peer(const Request& mine, const void* send, void* recv, size_t recv_bytes) {
    Status s = group_->send(0, &mine, sizeof mine);
    if (s.ok() && mine.bytes > 0) s = group_->send(0, send, mine.bytes);
    Reply reply{};
    if (s.ok()) s = group_->recv(0, &reply, sizeof reply);
    if (!s.ok()) return fail(Status(s.code(), std::string(op_name(mine.op)) + ": " + s.message()));
    std::string message(reply.message_bytes, '\0');
    if (reply.message_bytes > 0) s = group_->recv(0, message.data(), message.size());
    Bytes out(reply.bytes);
    if (s.ok() && reply.bytes > 0) s = group_->recv(0, out.data(), out.size());
    if (!s.ok()) return fail(Status(s.code(), std::string(op_name(mine.op)) + ": " + s.message()));
    if (reply.code != 0) return Status(static_cast<StatusCode>(reply.code), message);
    return deliver(mine.op, out, recv, recv_bytes);
  }

  Status as_root(const Request& mine, const void* send, void* recv, size_t recv_bytes,
                 const Combine& combine) {
    const int n = world_size();
    const char* name = op_name(mine.op);
    std::vector<Bytes> inputs(static_cast<size_t>(n));
    std::vector<const std::byte*> in(static_cast<size_t>(n));
    in[0] = static_cast<const std::byte*>(send);
    Status problem;  // a call that does not match rank 0's: every rank gets this error
    for (int q = 1; q < n; ++q) {
      Request theirs{};
      Status s = group_->recv(q, &theirs, sizeof theirs);
      Bytes& buf = inputs[static_cast<size_t>(q)];
      if (s.ok()) {
        buf.resize(theirs.bytes);
        if (theirs.bytes > 0) s = group_->recv(q, buf.data(), buf.size());
      }
      if (!s.ok()) {
        // Tell the ranks that still listen, then give up on the group.
        const Status lost(s.code(), std::string(name) + " on rank 0 stopped: " + s.message());
        for (int p = 1; p < n; ++p) {
          if (p != q) send_reply(p, lost, Bytes());
        }
        return fail(lost);
      }
      in[static_cast<size_t>(q)] = buf.data();
      if (problem.ok() && (theirs.op != mine.op || theirs.count != mine.count ||
                           theirs.root != mine.root || theirs.dtype != mine.dtype ||
                           theirs.reduce_op != mine.reduce_op || theirs.bytes != mine.bytes)) {
        problem = Status::invalid_argument(
            std::string(name) + " on rank 0 (count " + std::to_string(mine.count) + ", root " +
            std::to_string(mine.root) + ") met " + op_name(theirs.op) + " on rank " +
            std::to_string(q) + " (count " + std::to_string(theirs.count) + ", root " +
            std::to_string(theirs.root) +
            "): every rank must call the same collectives with the same counts");
      }
    }
    std::vector<Bytes> out(static_cast<size_t>(n));
    if (problem.ok()) combine(in, &out);
    for (int q = 1; q < n; ++q) {
      Status s = send_reply(q, problem, out[static_cast<size_t>(q)]);
      if (!s.ok() && problem.ok()) problem = fail(s);
    }
    if (!problem.ok()) return problem;
    return deliver(mine.op, out[0], recv, recv_bytes);
  }

  Status send_reply(int q, const Status& status, const Bytes& out) {
    const std::string& message = status.message();
    const Reply reply{static_cast<int32_t>(status.code()),
                      static_cast<uint32_t>(status.ok() ? 0 : message.size()),
                      status.ok() ? out.size() : 0};
    Status s = group_->send(q, &reply, sizeof reply);
    if (s.ok() && reply.message_bytes > 0) s = group_->send(q, message.data(), message.size());
    if (s.ok() && reply.bytes > 0) s = group_->send(q, out.data(), out.size());
    return s;
  }

  std::unique_ptr<TcpRendezvous> group_;
  Status broken_;
};

}  // namespace

Status make_tcp_communicator(const ProcessEnv& env, const RendezvousOptions& options,
                             std::unique_ptr<Communicator>* out) {
  std::unique_ptr<TcpRendezvous> group;
  Status s = TcpRendezvous::open(env, options, &group);
  if (!s.ok()) return s;
  *out = std::make_unique<TcpCommunicator>(std::move(group));
  return Status::ok_status();
}

}  // namespace sciattn::train

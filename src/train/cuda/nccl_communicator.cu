// The Communicator over NCCL (make_nccl_communicator in process_group.h): one process per GPU,
// buffers in that GPU's memory, every collective queued on a communication stream of its own
// after the work queued so far on the trainer's CUDA stream. CUDA layer of the trainer; built
// only where NCCL is found (cmake/sciattn_nccl.cmake).
//
// What holds of communicator.h's rules here:
//   - Every collective, called or started, is queued on the communication stream in issue order,
//     behind an event recorded on the trainer's stream at the call (so it reads what the work
//     queued before it wrote). NCCL runs one communicator's collectives in the order they are
//     queued, and one stream keeps that order on the device too.
//   - A called collective returns after synchronizing the communication stream, so outputs are
//     written and inputs may be reused when it returns, as the interface says.
//   - A started collective records an event on the communication stream after its work; wait()
//     makes the trainer's stream wait for that event (cudaStreamWaitEvent) without blocking the
//     host, so the back end's later calls (the next writer of the buffer among them) run after
//     the collective, and the kernels queued between the start and the wait (the backward's)
//     run beside it. A failure while queueing is returned by the wait; an asynchronous NCCL
//     error (ncclCommGetAsyncError) by the wait that sees it, or by the next called collective.
//   - Sums over ranks are NCCL's (ncclSum), and a mean is that sum divided by world_size() once
//     (a kernel here), as the interface defines it. NCCL does not add in rank order: the order
//     depends on its algorithm (ring, tree, NVLS), protocol and topology. Its all-reduce and
//     reduce-scatter form each element's sum once and send that result on, so every rank gets the
//     same bits, but not necessarily ThreadCommunicator's bits. With two ranks a sum is one
//     addition, which is commutative, so it equals the rank-order sum.
//   - all_reduce_max and all_reduce_sum take a host double: it goes through a small device
//     scratch. A NaN on any rank makes the max NaN (NCCL's max alone would not promise that).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "sciattn/train/process_group.h"
#include "train/rendezvous.h"

namespace sciattn::train {
namespace {

__global__ void divide_kernel(float* x, int64_t n, float divisor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] /= divisor;
  }
}

constexpr int kDivideThreads = 256;
constexpr int64_t kDivideMaxBlocks = 4096;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    default:
      return ncclFloat32;  // check_collective admits f32, f16 and bf16 only
  }
}

// In NcclCommunicator's members: returns a failed NCCL call as a Status naming the collective.
#define SCIATTN_NCCL_TRY(collective, call_name, expr)          \
  do {                                                         \
    cudaSetDevice(device_);                                    \
    const ncclResult_t sciattn_nccl_result = (expr);           \
    if (sciattn_nccl_result != ncclSuccess) {                  \
      return nccl(collective, call_name, sciattn_nccl_result); \
    }                                                          \
  } while (0)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, int device, cudaStream_t stream)
      : rank_(rank), world_size_(world_size), device_(device), stream_(stream) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    for (auto& entry : started_) {
      if (entry.second.done != nullptr) cudaEventDestroy(entry.second.done);
    }
    if (comm_ != nullptr) {
      // A communicator whose last call failed may have peers that never answer: abort it rather
      // than wait in the destroy.
      if (failed_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  }

  // Creates the NCCL communicator from the unique id (a collective over the group), the
  // communication stream and the scratch of the scalar calls.
  Status init(const ncclUniqueId& id) {
    Status s = allocate();
    if (!s.ok()) return s;
    SCIATTN_NCCL_TRY("the group's creation", "ncclCommInitRank",
                     ncclCommInitRank(&comm_, world_size_, id, rank_));
    return Status::ok_status();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Status all_reduce_mean(float* data, int64_t n) override {
    Status s = check_collective("all_reduce_mean", n, world_size_, DType::kF32);
    if (!s.ok() || n == 0) return s;
    return call("all_reduce_mean", [&] { return queue_all_reduce_mean(data, n); });
  }

  Status start_all_reduce_mean(float* data, int64_t n, CollectiveHandle* out) override {
    Status s = check_handle_out("start_all_reduce_mean", out);
    if (s.ok()) s = check_collective("all_reduce_mean", n, world_size_, DType::kF32);
    if (!s.ok()) return s;
    return start(
        "all_reduce_mean", n == 0, [&] { return queue_all_reduce_mean(data, n); }, out);
  }

  Status all_reduce_max(double* value) override {
    // [the value with NaN as -inf, 1 where it was NaN]: one max gives both.
    const bool nan = std::isnan(*value);
    const double host[2] = {nan ? -std::numeric_limits<double>::infinity() : *value,
                            nan ? 1.0 : 0.0};
    double result[2] = {0.0, 0.0};
    Status s = scalar("all_reduce_max", host, result, ncclMax);
    if (!s.ok()) return s;
    *value = result[1] > 0 ? std::numeric_limits<double>::quiet_NaN() : result[0];
    return s;
  }

  Status all_reduce_sum(double* value) override {
    const double host[2] = {*value, 0.0};
    double result[2] = {0.0, 0.0};
    Status s = scalar("all_reduce_sum", host, result, ncclSum);
    if (s.ok()) *value = result[0];
    return s;
  }

  Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) override {
    Status s = check_collective("reduce_scatter", shard, world_size_, DType::kF32);
    if (!s.ok() || shard == 0) return s;
    return call("reduce_scatter", [&] { return queue_reduce_scatter(send, recv, shard, op); });
  }

  Status start_reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op,
                              CollectiveHandle* out) override {
    Status s = check_handle_out("start_reduce_scatter", out);
    if (s.ok()) s = check_collective("reduce_scatter", shard, world_size_, DType::kF32);
    if (!s.ok()) return s;
    return start(
        "reduce_scatter", shard == 0, [&] { return queue_reduce_scatter(send, recv, shard, op); },
        out);
  }

  Status reduce(float* data, int64_t n, int root, ReduceOp op) override {
    Status s = check_collective("reduce", n, world_size_, DType::kF32, root);
    if (!s.ok() || n == 0) return s;
    return call("reduce", [&] { return queue_reduce(data, n, root, op); });
  }

  Status start_reduce(float* data, int64_t n, int root, ReduceOp op,
                      CollectiveHandle* out) override {
    Status s = check_handle_out("start_reduce", out);
    if (s.ok()) s = check_collective("reduce", n, world_size_, DType::kF32, root);
    if (!s.ok()) return s;
    return start(
        "reduce", n == 0, [&] { return queue_reduce(data, n, root, op); }, out);
  }

  Status wait(CollectiveHandle handle) override {
    const auto it = started_.find(handle.id);
    if (it == started_.end()) return unknown_handle(handle);
    const Started e = it->second;
    started_.erase(it);
    cudaSetDevice(device_);
    if (e.done == nullptr) return e.status;
    // The trainer's stream (the buffer's next reader or writer) waits for the collective; the
    // event's resources go once it has completed.
    const cudaError_t w = cudaStreamWaitEvent(stream_, e.done, 0);
    cudaEventDestroy(e.done);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess) return nccl(e.name, "the queued work", async);
    return cuda((std::string(e.name) + ": cudaStreamWaitEvent").c_str(), w);
  }

  Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) override {
    Status s = check_collective("all_gather", shard, world_size_, dtype);
    if (!s.ok() || shard == 0) return s;
    return call("all_gather", [&]() -> Status {
      SCIATTN_NCCL_TRY("all_gather", "ncclAllGather",
                       ncclAllGather(send, recv, static_cast<size_t>(shard), nccl_type(dtype),
                                     comm_, comm_stream_));
      return Status::ok_status();
    });
  }

  Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) override {
    Status s = check_collective("all_to_all", chunk, world_size_, dtype);
    if (!s.ok() || chunk == 0) return s;
    const size_t bytes = static_cast<size_t>(chunk) * dtype_size(dtype);
    const auto* src = static_cast<const unsigned char*>(send);
    auto* dst = static_cast<unsigned char*>(recv);
    return call("all_to_all", [&]() -> Status {
      // One send and one receive per peer (itself included), fused into one group so that NCCL
      // progresses them together.
      SCIATTN_NCCL_TRY("all_to_all", "ncclGroupStart", ncclGroupStart());
      for (int q = 0; q < world_size_; ++q) {
        const size_t offset = static_cast<size_t>(q) * bytes;
        ncclResult_t r = ncclSend(src + offset, static_cast<size_t>(chunk), nccl_type(dtype), q,
                                  comm_, comm_stream_);
        if (r == ncclSuccess) {
          r = ncclRecv(dst + offset, static_cast<size_t>(chunk), nccl_type(dtype), q, comm_,
                       comm_stream_);
        }
        if (r != ncclSuccess) {
          ncclGroupEnd();
          return nccl("all_to_all", "ncclSend/ncclRecv", r);
        }
      }
      SCIATTN_NCCL_TRY("all_to_all", "ncclGroupEnd", ncclGroupEnd());
      return Status::ok_status();
    });
  }

  Status broadcast(void* data, int64_t n, DType dtype, int root) override {
    Status s = check_collective("broadcast", n, world_size_, dtype, root);
    if (!s.ok() || n == 0) return s;
    return call("broadcast", [&]() -> Status {
      SCIATTN_NCCL_TRY("broadcast", "ncclBroadcast",
                       ncclBroadcast(data, data, static_cast<size_t>(n), nccl_type(dtype), root,
                                     comm_, comm_stream_));
      return Status::ok_status();
    });
  }

  Status barrier() override {
    // NCCL has no barrier: a one-element all-reduce that every rank must join, then a wait.
    const double host[2] = {0.0, 0.0};
    double result[2];
    return scalar("barrier", host, result, ncclSum);
  }

  // ncclCommSplit: the ranks of one color form a group ranked by key, ties by rank (the
  // interface's rule), on the same device and trainer stream, with a communication stream of
  // its own.
  Status split(int color, int key, std::unique_ptr<Communicator>* out) override {
    Status s = check_split(color, out);
    if (!s.ok()) return s;
    // The split is a collective: it comes after every started collective of this group.
    s = call("split", [] { return Status::ok_status(); });
    if (!s.ok()) return s;
    cudaSetDevice(device_);
    ncclComm_t sub = nullptr;
    SCIATTN_NCCL_TRY("split", "ncclCommSplit", ncclCommSplit(comm_, color, key, &sub, nullptr));
    int sub_rank = 0, sub_size = 1;
    SCIATTN_NCCL_TRY("split", "ncclCommUserRank", ncclCommUserRank(sub, &sub_rank));
    SCIATTN_NCCL_TRY("split", "ncclCommCount", ncclCommCount(sub, &sub_size));
    auto group = std::make_unique<NcclCommunicator>(sub_rank, sub_size, device_, stream_);
    group->comm_ = sub;  // owned (destroyed) by the new communicator from here
    s = group->allocate();
    if (!s.ok()) return s;
    *out = std::move(group);
    return Status::ok_status();
  }

 private:
  // A started collective until its wait: its name, the event after its work (null when nothing
  // was queued) and the outcome of queueing it.
  struct Started {
    const char* name = nullptr;
    cudaEvent_t done = nullptr;
    Status status;
  };

  // The communication stream (non-blocking: it does not wait for the legacy default stream),
  // the event that orders it after the trainer's stream, and the scalar calls' scratch.
  Status allocate() {
    cudaSetDevice(device_);
    Status s = cuda("cudaStreamCreateWithFlags",
                    cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    if (s.ok()) {
      s = cuda("cudaEventCreateWithFlags",
               cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    }
    if (s.ok()) s = cuda("cudaMalloc", cudaMalloc(&scratch_, 2 * sizeof(double)));
    return s;
  }

  Status nccl(const char* collective, const char* call, ncclResult_t r) {
    failed_ = true;
    std::string text = std::string("NCCL ") + collective + " on rank " + std::to_string(rank_) +
                       " of " + std::to_string(world_size_) + " (CUDA device " +
                       std::to_string(device_) + "): " + call + " failed: " + ncclGetErrorString(r);
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    if (last != nullptr && *last != '\0') text += " (" + std::string(last) + ")";
    return Status(StatusCode::kDeviceError, text);
  }

  Status cuda(const char* what, cudaError_t e) {
    if (e == cudaSuccess) return Status::ok_status();
    failed_ = true;
    return Status(StatusCode::kDeviceError, std::string("NCCL communicator on rank ") +
                                                std::to_string(rank_) + ": " + what +
                                                " failed: " + cudaGetErrorString(e));
  }

  // Orders the communication stream after the work queued so far on the trainer's stream.
  Status after_trainer_stream(const char* collective) {
    cudaSetDevice(device_);
    cudaError_t e = cudaEventRecord(ready_, stream_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(comm_stream_, ready_, 0);
    return cuda((std::string(collective) + ": ordering after the trainer's stream").c_str(), e);
  }

  // A called collective: queued by `queue` behind the trainer's stream, then waited for.
  template <class Queue>
  Status call(const char* collective, Queue queue) {
    Status s = after_trainer_stream(collective);
    if (s.ok()) s = queue();
    if (!s.ok()) return s;
    return finish(collective);
  }

  // A started collective: queued the same way (unless `empty`), its completion event recorded,
  // the handle issued; a failure is kept for the wait.
  template <class Queue>
  Status start(const char* collective, bool empty, Queue queue, CollectiveHandle* out) {
    Started e;
    e.name = collective;
    if (!empty) {
      e.status = after_trainer_stream(collective);
      if (e.status.ok()) e.status = queue();
      cudaEvent_t done = nullptr;
      if (e.status.ok()) {
        e.status = cuda((std::string(collective) + ": cudaEventCreateWithFlags").c_str(),
                        cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      }
      if (e.status.ok()) {
        e.status = cuda((std::string(collective) + ": cudaEventRecord").c_str(),
                        cudaEventRecord(done, comm_stream_));
        if (e.status.ok()) {
          e.done = done;
        } else {
          cudaEventDestroy(done);
        }
      }
    }
    out->id = ++issued_;
    started_[out->id] = e;
    return Status::ok_status();
  }

  Status queue_all_reduce_mean(float* data, int64_t n) {
    SCIATTN_NCCL_TRY("all_reduce_mean", "ncclAllReduce",
                     ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_,
                                   comm_stream_));
    return divide("all_reduce_mean", data, n);
  }

  Status queue_reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) {
    SCIATTN_NCCL_TRY("reduce_scatter", "ncclReduceScatter",
                     ncclReduceScatter(send, recv, static_cast<size_t>(shard), ncclFloat32, ncclSum,
                                       comm_, comm_stream_));
    return op == ReduceOp::kMean ? divide("reduce_scatter", recv, shard) : Status::ok_status();
  }

  Status queue_reduce(float* data, int64_t n, int root, ReduceOp op) {
    SCIATTN_NCCL_TRY("reduce", "ncclReduce",
                     ncclReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, root,
                                comm_, comm_stream_));
    return op == ReduceOp::kMean && rank_ == root ? divide("reduce", data, n) : Status::ok_status();
  }

  // Waits for the communication stream (every collective queued so far, started ones
  // included), so that the call's outputs are written when it returns; a failure in the queued
  // work (or an asynchronous NCCL error) names the collective.
  Status finish(const char* collective) {
    const cudaError_t e = cudaStreamSynchronize(comm_stream_);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess) return nccl(collective, "the queued work", async);
    return cuda((std::string(collective) + ": the queued work").c_str(), e);
  }

  // The mean's division by the world size, queued on the communication stream.
  Status divide(const char* collective, float* data, int64_t n) {
    const int64_t blocks =
        std::min<int64_t>(kDivideMaxBlocks, (n + kDivideThreads - 1) / kDivideThreads);
    divide_kernel<<<static_cast<unsigned>(blocks), kDivideThreads, 0, comm_stream_>>>(
        data, n, static_cast<float>(world_size_));
    return cuda((std::string(collective) + ": the division by the world size").c_str(),
                cudaGetLastError());
  }

  // Two host doubles through the device scratch, reduced with `op` on every rank.
  Status scalar(const char* collective, const double host[2], double result[2], ncclRedOp_t op) {
    Status s = after_trainer_stream(collective);
    if (!s.ok()) return s;
    s = cuda(collective, cudaMemcpyAsync(scratch_, host, 2 * sizeof(double), cudaMemcpyHostToDevice,
                                         comm_stream_));
    if (!s.ok()) return s;
    SCIATTN_NCCL_TRY(collective, "ncclAllReduce",
                     ncclAllReduce(scratch_, scratch_, 2, ncclFloat64, op, comm_, comm_stream_));
    s = cuda(collective, cudaMemcpyAsync(result, scratch_, 2 * sizeof(double),
                                         cudaMemcpyDeviceToHost, comm_stream_));
    if (!s.ok()) return s;
    return finish(collective);
  }

#undef SCIATTN_NCCL_TRY

  int rank_ = 0;
  int world_size_ = 1;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;       // the trainer's (the back end's) stream
  cudaStream_t comm_stream_ = nullptr;  // every collective's work
  cudaEvent_t ready_ = nullptr;         // recorded on stream_ before each collective
  ncclComm_t comm_ = nullptr;
  double* scratch_ = nullptr;
  bool failed_ = false;
  uint64_t issued_ = 0;                  // started collectives so far
  std::map<uint64_t, Started> started_;  // not yet waited for, by handle
};

}  // namespace

bool nccl_available() {
  return true;
}

Status make_nccl_communicator(const ProcessEnv& env, int device, Stream stream,
                              const RendezvousOptions& options,
                              std::unique_ptr<Communicator>* out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return Status::not_supported("the NCCL communicator needs a CUDA device; none was found");
  }
  if (device < 0 || device >= devices) {
    return Status::invalid_argument(
        "rank " + std::to_string(env.rank) + " would use CUDA device " + std::to_string(device) +
        " (its local rank), but this node has " + std::to_string(devices) +
        "; start at most that many processes per node (--nproc-per-node, or the launcher's)");
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    return Status(StatusCode::kDeviceError, "cudaSetDevice(" + std::to_string(device) +
                                                ") failed on rank " + std::to_string(env.rank));
  }
  // Rank 0 makes the unique id and sends it to every rank over the rendezvous.
  ncclUniqueId id{};
  std::string blob;
  if (env.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return Status(StatusCode::kDeviceError,
                    std::string("ncclGetUniqueId failed on rank 0: ") + ncclGetErrorString(r));
    }
    blob.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  {
    std::unique_ptr<TcpRendezvous> group;
    Status s = TcpRendezvous::open(env, options, &group);
    if (s.ok()) s = group->broadcast_blob(&blob);
    if (!s.ok()) return s;
  }
  if (blob.size() != sizeof id) {
    return Status(StatusCode::kInternal, "rank " + std::to_string(env.rank) + " received a " +
                                             std::to_string(blob.size()) +
                                             "-byte NCCL id; expected " +
                                             std::to_string(sizeof id));
  }
  std::memcpy(&id, blob.data(), sizeof id);
  auto comm = std::make_unique<NcclCommunicator>(env.rank, env.world_size, device,
                                                 static_cast<cudaStream_t>(stream.handle));
  Status s = comm->init(id);
  if (!s.ok()) return s;
  *out = std::move(comm);
  return Status::ok_status();
}

}  // namespace sciattn::train

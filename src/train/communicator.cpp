// The single-rank communicator and the argument checks every communicator shares. Trainer layer
// (host code).
#include "sciattn/train/communicator.h"

#include <cstring>
#include <string>

#include "common/status_try.h"

namespace sciattn::train {

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "mean";
}

Status check_collective(const char* name, int64_t count, int world_size, DType dtype, int root) {
  if (count < 0) {
    return Status::invalid_argument(std::string(name) + ": the count must be >= 0; got " +
                                    std::to_string(count));
  }
  if (root < 0 || root >= world_size) {
    return Status::invalid_argument(std::string(name) + ": root must be in [0, " +
                                    std::to_string(world_size) + "); got " + std::to_string(root));
  }
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return Status::invalid_argument(std::string(name) + ": dtype must be f32, f16 or bf16; got " +
                                    dtype_name(dtype));
  }
  return Status::ok_status();
}

Status check_split(int color, const std::unique_ptr<Communicator>* out) {
  if (color < 0) {
    return Status::invalid_argument("split: color must be >= 0 (every rank joins a group); got " +
                                    std::to_string(color));
  }
  if (out == nullptr) return Status::invalid_argument("split: out must not be null");
  return Status::ok_status();
}

Status unknown_handle(CollectiveHandle handle) {
  return Status::invalid_argument(
      "wait: handle " + std::to_string(handle.id) +
      " is not an outstanding collective of this communicator (never started here, or waited "
      "for already)");
}

Status check_handle_out(const char* name, const CollectiveHandle* out) {
  if (out != nullptr) return Status::ok_status();
  return Status::invalid_argument(std::string(name) + ": the handle (out) must not be null");
}

Status Communicator::finished(const Status& s, CollectiveHandle* out) {
  out->id = ++started_;
  unwaited_[out->id] = s;
  return Status::ok_status();
}

Status Communicator::start_all_reduce_mean(float* data, int64_t n, CollectiveHandle* out) {
  SCIATTN_TRY(check_handle_out("start_all_reduce_mean", out));
  return finished(all_reduce_mean(data, n), out);
}

Status Communicator::start_reduce_scatter(const float* send, float* recv, int64_t shard,
                                          ReduceOp op, CollectiveHandle* out) {
  SCIATTN_TRY(check_handle_out("start_reduce_scatter", out));
  return finished(reduce_scatter(send, recv, shard, op), out);
}

Status Communicator::start_reduce(float* data, int64_t n, int root, ReduceOp op,
                                  CollectiveHandle* out) {
  SCIATTN_TRY(check_handle_out("start_reduce", out));
  return finished(reduce(data, n, root, op), out);
}

Status Communicator::wait(CollectiveHandle handle) {
  const auto it = unwaited_.find(handle.id);
  if (it == unwaited_.end()) return unknown_handle(handle);
  const Status s = it->second;
  unwaited_.erase(it);
  return s;
}

namespace {

// One rank's out-of-place collective is a copy (host memory); in place it touches nothing, so
// the single-rank trainer may pass device memory.
void copy_if_apart(void* dst, const void* src, int64_t n, DType dtype) {
  if (dst != src && n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dtype));
}

}  // namespace

Status SingleRankCommunicator::all_reduce_mean(float*, int64_t n) {
  return check_collective("all_reduce_mean", n, 1, DType::kF32);
}

Status SingleRankCommunicator::reduce_scatter(const float* send, float* recv, int64_t shard,
                                              ReduceOp) {
  Status s = check_collective("reduce_scatter", shard, 1, DType::kF32);
  if (s.ok()) copy_if_apart(recv, send, shard, DType::kF32);
  return s;
}

Status SingleRankCommunicator::reduce(float*, int64_t n, int root, ReduceOp) {
  return check_collective("reduce", n, 1, DType::kF32, root);
}

Status SingleRankCommunicator::all_gather(const void* send, void* recv, int64_t shard,
                                          DType dtype) {
  Status s = check_collective("all_gather", shard, 1, dtype);
  if (s.ok()) copy_if_apart(recv, send, shard, dtype);
  return s;
}

Status SingleRankCommunicator::all_to_all(const void* send, void* recv, int64_t chunk,
                                          DType dtype) {
  Status s = check_collective("all_to_all", chunk, 1, dtype);
  if (s.ok()) copy_if_apart(recv, send, chunk, dtype);
  return s;
}

Status SingleRankCommunicator::split(int color, int, std::unique_ptr<Communicator>* out) {
  SCIATTN_TRY(check_split(color, out));
  *out = std::make_unique<SingleRankCommunicator>();
  return Status::ok_status();
}

Status SingleRankCommunicator::broadcast(void*, int64_t n, DType dtype, int root) {
  return check_collective("broadcast", n, 1, dtype, root);
}

}  // namespace sciattn::train

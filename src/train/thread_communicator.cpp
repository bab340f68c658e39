// The thread-per-rank test communicator (thread_communicator.h). Trainer layer (host code).
#include "sciattn/train/thread_communicator.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status_try.h"

namespace sciattn::train {

// What the ranks of a group share: a generation-counting barrier that can be poisoned, one slot
// per rank for the pointers and the call a collective publishes, and the groups split from it
// (which inherit its failures).
class ThreadRendezvous {
 public:
  struct Slot {
    const char* name = nullptr;
    int64_t count = 0;
    int root = 0;
    const void* a = nullptr;
    const void* b = nullptr;
    int color = 0, key = 0;  // split's arguments
  };

  explicit ThreadRendezvous(int n) : n_(n), slots_(static_cast<size_t>(n)) {}

  int size() const { return n_; }
  Slot& slot(int rank) { return slots_[static_cast<size_t>(rank)]; }

  // Waits until all n ranks have arrived, or fails when the group is poisoned or a rank has
  // left (it can never arrive). `what` names the collective for the message.
  Status arrive(int rank, const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!poison_.ok()) return failure(rank, what);
    if (left_rank_ >= 0) return failure(rank, what);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::ok_status();
    }
    cv_.wait(lock, [&] { return generation_ != generation || !poison_.ok() || left_rank_ >= 0; });
    if (generation_ != generation) return Status::ok_status();
    return failure(rank, what);
  }

  void leave(int rank, const Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!status.ok()) {
      if (poison_.ok()) {
        poison_ =
            Status(status.code(), "rank " + std::to_string(rank) + " failed: " + status.message());
      }
    } else if (left_rank_ < 0) {
      left_rank_ = rank;
    }
    for (auto& entry : children_) propagate(entry.second, rank);
    cv_.notify_all();
  }

  // The group of color `color` made by the `serial`-th split of this group, whose members are
  // `members` (their ranks here, in the new group's rank order): made by the first of its ranks
  // to ask, found by the others. It starts with what this group has suffered so far.
  std::shared_ptr<ThreadRendezvous> child(int64_t serial, int color,
                                          const std::vector<int>& members) {
    std::lock_guard<std::mutex> lock(mutex_);
    Child& c = children_[{serial, color}];
    if (c.group == nullptr) {
      c.group = std::make_shared<ThreadRendezvous>(static_cast<int>(members.size()));
      c.members = members;
      if (!poison_.ok()) c.group->poison(poison_);
      if (left_rank_ >= 0) propagate(c, left_rank_);
    }
    return c.group;
  }

  // Fails every collective of this group and of its children with `status` (a parent's
  // failure, whose message names the parent's failed rank).
  void poison(const Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (poison_.ok()) poison_ = status;
    for (auto& entry : children_) entry.second.group->poison(status);
    cv_.notify_all();
  }

 private:
  // Called with the mutex held.
  Status failure(int rank, const char* what) const {
    if (!poison_.ok()) {
      return Status(poison_.code(), std::string(what) + " on rank " + std::to_string(rank) +
                                        " stopped: " + poison_.message());
    }
    return Status::invalid_argument(
        std::string(what) + " on rank " + std::to_string(rank) + " stopped: rank " +
        std::to_string(left_rank_) +
        " returned without entering it (every rank must call the same collectives)");
  }

  struct Child {
    std::shared_ptr<ThreadRendezvous> group;
    std::vector<int> members;  // the parent's ranks, at their rank in the child
  };

  // Called with the mutex held: what this group's poison or rank `rank`'s leaving means for a
  // child (the lock order is always parent, then child).
  void propagate(Child& c, int rank) {
    if (!poison_.ok()) {
      c.group->poison(poison_);
      return;
    }
    const auto it = std::find(c.members.begin(), c.members.end(), rank);
    if (it != c.members.end()) {
      c.group->leave(static_cast<int>(it - c.members.begin()), Status::ok_status());
    }
  }

  const int n_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  Status poison_;                                      // the first failed rank's status
  int left_rank_ = -1;                                 // the first rank that returned ok
  std::map<std::pair<int64_t, int>, Child> children_;  // by (split serial, color)
};

// A rank's progress thread: runs the rank's started collectives one at a time in issue order and
// keeps each one's Status until it is waited for.
class ThreadProgress {
 public:
  ~ThreadProgress() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      cv_.notify_all();
    }
    // The loop runs what is queued before it ends.
    if (thread_.joinable()) thread_.join();
  }

  uint64_t enqueue(std::function<Status()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back({++issued_, std::move(task)});
    cv_.notify_all();
    return issued_;
  }

  Status wait(CollectiveHandle handle) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (handle.id == 0 || handle.id > issued_) return unknown_handle(handle);
    cv_.wait(lock, [&] { return completed_ >= handle.id; });
    const auto it = done_.find(handle.id);
    if (it == done_.end()) return unknown_handle(handle);
    const Status s = it->second;
    done_.erase(it);
    return s;
  }

  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return completed_ == issued_; });
  }

  // Started collectives that have not run yet.
  uint64_t pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    return issued_ - completed_;
  }

 private:
  struct Task {
    uint64_t id;
    std::function<Status()> run;
  };

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Status s;
      try {
        s = task.run();
      } catch (const std::exception& e) {
        s = Status(StatusCode::kInternal, std::string("a started collective threw: ") + e.what());
      }
      lock.lock();
      done_[task.id] = s;
      completed_ = task.id;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::map<uint64_t, Status> done_;  // run, not yet waited for
  uint64_t issued_ = 0, completed_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

namespace {

const float* as_floats(const void* p) {
  return static_cast<const float*>(p);
}
const std::byte* as_bytes(const void* p) {
  return static_cast<const std::byte*>(p);
}

}  // namespace

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadRendezvous> group, int rank)
    : group_(std::move(group)), rank_(rank) {}
ThreadCommunicator::~ThreadCommunicator() {
  if (progress_ == nullptr) return;
  // Started collectives that have not run wait for this rank's part: fail them (and the group)
  // rather than wait forever.
  const uint64_t pending = progress_->pending();
  if (pending > 0) {
    group_->leave(rank_, Status(StatusCode::kInternal,
                                "its ThreadCommunicator was destroyed with " +
                                    std::to_string(pending) + " started collective(s) not run"));
  }
  progress_.reset();
}

int ThreadCommunicator::world_size() const {
  return group_->size();
}

Status ThreadCommunicator::create_group(int world_size,
                                        std::vector<std::unique_ptr<ThreadCommunicator>>* out) {
  if (world_size < 1) {
    return Status::invalid_argument("ThreadCommunicator: world_size must be >= 1; got " +
                                    std::to_string(world_size));
  }
  auto group = std::make_shared<ThreadRendezvous>(world_size);
  out->clear();
  for (int r = 0; r < world_size; ++r) {
    out->push_back(std::unique_ptr<ThreadCommunicator>(new ThreadCommunicator(group, r)));
  }
  return Status::ok_status();
}

void ThreadCommunicator::leave(const Status& status) {
  // Leaving ok: the started collectives still run first, as the other ranks expect. With an
  // error the group is poisoned first, so that they fail instead of waiting.
  if (status.ok()) drain();
  group_->leave(rank_, status);
  drain();
}

void ThreadCommunicator::drain() {
  if (progress_ != nullptr) progress_->drain();
}

void ThreadCommunicator::enqueue(std::function<Status()> task, CollectiveHandle* out) {
  if (progress_ == nullptr) progress_ = std::make_unique<ThreadProgress>();
  out->id = progress_->enqueue(std::move(task));
}

Status ThreadCommunicator::start_all_reduce_mean(float* data, int64_t n, CollectiveHandle* out) {
  SCIATTN_TRY(check_handle_out("start_all_reduce_mean", out));
  SCIATTN_TRY(check_collective("all_reduce_mean", n, world_size(), DType::kF32));
  enqueue([this, data, n] { return run_all_reduce_mean(data, n); }, out);
  return Status::ok_status();
}

Status ThreadCommunicator::start_reduce_scatter(const float* send, float* recv, int64_t shard,
                                                ReduceOp op, CollectiveHandle* out) {
  SCIATTN_TRY(check_handle_out("start_reduce_scatter", out));
  SCIATTN_TRY(check_collective("reduce_scatter", shard, world_size(), DType::kF32));
  enqueue([this, send, recv, shard, op] { return run_reduce_scatter(send, recv, shard, op); }, out);
  return Status::ok_status();
}

Status ThreadCommunicator::start_reduce(float* data, int64_t n, int root, ReduceOp op,
                                        CollectiveHandle* out) {
  SCIATTN_TRY(check_handle_out("start_reduce", out));
  SCIATTN_TRY(check_collective("reduce", n, world_size(), DType::kF32, root));
  enqueue([this, data, n, root, op] { return run_reduce(data, n, root, op); }, out);
  return Status::ok_status();
}

Status ThreadCommunicator::wait(CollectiveHandle handle) {
  if (progress_ == nullptr) return unknown_handle(handle);
  return progress_->wait(handle);
}

Status ThreadCommunicator::run(const char* name, const void* a, const void* b,
                               const std::function<void()>& body) {
  ++collectives_;
  // The count and root were published by the caller into the slot; the pointers go here.
  ThreadRendezvous::Slot& mine = group_->slot(rank_);
  mine.name = name;
  mine.a = a;
  mine.b = b;
  Status s = group_->arrive(rank_, name);
  if (!s.ok()) return s;
  // Every rank checks that all called the same collective with the same count and root (all see
  // the same slots, so all agree on the answer), and then still takes the second barrier.
  Status mismatch;
  for (int q = 0; q < group_->size(); ++q) {
    const ThreadRendezvous::Slot& other = group_->slot(q);
    if (std::strcmp(other.name, name) != 0 || other.count != mine.count ||
        other.root != mine.root) {
      mismatch = Status::invalid_argument(
          std::string(name) + " on rank " + std::to_string(rank_) + " (count " +
          std::to_string(mine.count) + ", root " + std::to_string(mine.root) + ") met " +
          other.name + " on rank " + std::to_string(q) + " (count " + std::to_string(other.count) +
          ", root " + std::to_string(other.root) +
          "): every rank must call the same collectives with the same counts");
      break;
    }
  }
  if (mismatch.ok()) body();
  s = group_->arrive(rank_, name);
  if (!s.ok()) return s;
  return mismatch;
}

// The published count and root of this rank's next collective.
#define SCIATTN_PUBLISH(n, root_rank)       \
  do {                                      \
    group_->slot(rank_).count = (n);        \
    group_->slot(rank_).root = (root_rank); \
  } while (0)

Status ThreadCommunicator::all_reduce_mean(float* data, int64_t n) {
  drain();
  return run_all_reduce_mean(data, n);
}

Status ThreadCommunicator::run_all_reduce_mean(float* data, int64_t n) {
  Status s = check_collective("all_reduce_mean", n, world_size(), DType::kF32);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(n, 0);
  std::vector<float> sum;
  s = run("all_reduce_mean", data, nullptr, [&] {
    const int ranks = group_->size();
    sum.assign(as_floats(group_->slot(0).a), as_floats(group_->slot(0).a) + n);
    for (int q = 1; q < ranks; ++q) {
      const float* x = as_floats(group_->slot(q).a);
      for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += x[i];
    }
    const float divisor = static_cast<float>(ranks);
    for (float& v : sum) v /= divisor;
  });
  if (!s.ok()) return s;
  if (n > 0) std::memcpy(data, sum.data(), static_cast<size_t>(n) * sizeof(float));
  return Status::ok_status();
}

Status ThreadCommunicator::all_reduce_max(double* value) {
  drain();
  SCIATTN_PUBLISH(1, 0);
  double result = 0.0;
  Status s = run("all_reduce_max", value, nullptr, [&] {
    result = *static_cast<const double*>(group_->slot(0).a);
    for (int q = 1; q < group_->size(); ++q) {
      const double x = *static_cast<const double*>(group_->slot(q).a);
      // A NaN anywhere wins, so that an invalid value is never hidden by the max.
      if (x > result || std::isnan(x)) result = x;
    }
  });
  if (!s.ok()) return s;
  *value = result;
  return Status::ok_status();
}

Status ThreadCommunicator::all_reduce_sum(double* value) {
  drain();
  SCIATTN_PUBLISH(1, 0);
  double result = 0.0;
  Status s = run("all_reduce_sum", value, nullptr, [&] {
    result = *static_cast<const double*>(group_->slot(0).a);
    for (int q = 1; q < group_->size(); ++q)
      result += *static_cast<const double*>(group_->slot(q).a);
  });
  if (!s.ok()) return s;
  *value = result;
  return Status::ok_status();
}

Status ThreadCommunicator::reduce_scatter(const float* send, float* recv, int64_t shard,
                                          ReduceOp op) {
  drain();
  return run_reduce_scatter(send, recv, shard, op);
}

Status ThreadCommunicator::run_reduce_scatter(const float* send, float* recv, int64_t shard,
                                              ReduceOp op) {
  Status s = check_collective("reduce_scatter", shard, world_size(), DType::kF32);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(shard, 0);
  return run("reduce_scatter", send, recv, [&] {
    const int ranks = group_->size();
    const int64_t offset = static_cast<int64_t>(rank_) * shard;
    // Sum in rank order into a scratch first: with recv in place, this rank's chunk of its own
    // send buffer is among the inputs (no other rank reads that chunk).
    std::vector<float> sum(as_floats(group_->slot(0).a) + offset,
                           as_floats(group_->slot(0).a) + offset + shard);
    for (int q = 1; q < ranks; ++q) {
      const float* x = as_floats(group_->slot(q).a) + offset;
      for (int64_t i = 0; i < shard; ++i) sum[static_cast<size_t>(i)] += x[i];
    }
    if (op == ReduceOp::kMean) {
      const float divisor = static_cast<float>(ranks);
      for (float& v : sum) v /= divisor;
    }
    if (shard > 0) std::memcpy(recv, sum.data(), static_cast<size_t>(shard) * sizeof(float));
  });
}

Status ThreadCommunicator::reduce(float* data, int64_t n, int root, ReduceOp op) {
  drain();
  return run_reduce(data, n, root, op);
}

Status ThreadCommunicator::run_reduce(float* data, int64_t n, int root, ReduceOp op) {
  Status s = check_collective("reduce", n, world_size(), DType::kF32, root);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(n, root);
  std::vector<float> sum;
  s = run("reduce", data, nullptr, [&] {
    if (rank_ != root) return;
    const int ranks = group_->size();
    sum.assign(as_floats(group_->slot(0).a), as_floats(group_->slot(0).a) + n);
    for (int q = 1; q < ranks; ++q) {
      const float* x = as_floats(group_->slot(q).a);
      for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += x[i];
    }
    if (op == ReduceOp::kMean) {
      const float divisor = static_cast<float>(ranks);
      for (float& v : sum) v /= divisor;
    }
  });
  if (!s.ok()) return s;
  // After the second barrier nobody reads this rank's data any more.
  if (rank_ == root && n > 0) std::memcpy(data, sum.data(), static_cast<size_t>(n) * sizeof(float));
  return Status::ok_status();
}

Status ThreadCommunicator::all_gather(const void* send, void* recv, int64_t shard, DType dtype) {
  drain();
  Status s = check_collective("all_gather", shard, world_size(), dtype);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(shard, 0);
  return run("all_gather", send, recv, [&] {
    const size_t bytes = static_cast<size_t>(shard) * dtype_size(dtype);
    for (int q = 0; q < group_->size(); ++q) {
      std::byte* dst = static_cast<std::byte*>(recv) + static_cast<size_t>(q) * bytes;
      const std::byte* src = as_bytes(group_->slot(q).a);
      // In place, this rank's own shard is already where it belongs; other ranks read only
      // their own shards of their recv buffers, which this rank does not write.
      if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
    }
  });
}

Status ThreadCommunicator::all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) {
  drain();
  Status s = check_collective("all_to_all", chunk, world_size(), dtype);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(chunk, 0);
  return run("all_to_all", send, recv, [&] {
    const size_t bytes = static_cast<size_t>(chunk) * dtype_size(dtype);
    for (int q = 0; q < group_->size(); ++q) {
      std::byte* dst = static_cast<std::byte*>(recv) + static_cast<size_t>(q) * bytes;
      const std::byte* src = as_bytes(group_->slot(q).a) + static_cast<size_t>(rank_) * bytes;
      if (bytes > 0) std::memcpy(dst, src, bytes);
    }
  });
}

Status ThreadCommunicator::broadcast(void* data, int64_t n, DType dtype, int root) {
  drain();
  Status s = check_collective("broadcast", n, world_size(), dtype, root);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(n, root);
  return run("broadcast", data, nullptr, [&] {
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
    if (rank_ != root && bytes > 0) std::memcpy(data, group_->slot(root).a, bytes);
  });
}

Status ThreadCommunicator::barrier() {
  drain();
  SCIATTN_PUBLISH(0, 0);
  return run("barrier", nullptr, nullptr, [] {});
}

Status ThreadCommunicator::split(int color, int key, std::unique_ptr<Communicator>* out) {
  drain();
  Status s = check_split(color, out);
  if (!s.ok()) return s;
  SCIATTN_PUBLISH(0, 0);
  group_->slot(rank_).color = color;
  group_->slot(rank_).key = key;
  const int64_t serial = splits_++;
  std::shared_ptr<ThreadRendezvous> child;
  int child_rank = 0;
  s = run("split", nullptr, nullptr, [&] {
    // The ranks of this color, ordered by (key, rank): every rank of the color computes the
    // same list from the same slots.
    std::vector<std::pair<int, int>> order;  // (key, rank)
    for (int q = 0; q < group_->size(); ++q) {
      if (group_->slot(q).color == color) order.push_back({group_->slot(q).key, q});
    }
    std::sort(order.begin(), order.end());
    std::vector<int> members;
    for (const auto& kq : order) {
      if (kq.second == rank_) child_rank = static_cast<int>(members.size());
      members.push_back(kq.second);
    }
    child = group_->child(serial, color, members);
  });
  if (!s.ok()) return s;
  out->reset(new ThreadCommunicator(std::move(child), child_rank));
  return Status::ok_status();
}

#undef SCIATTN_PUBLISH

std::vector<Status> run_thread_ranks(int world_size,
                                     const std::function<Status(Communicator& comm)>& fn) {
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  Status s = ThreadCommunicator::create_group(world_size, &comms);
  if (!s.ok()) return {s};
  std::vector<Status> statuses(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator& comm = *comms[static_cast<size_t>(r)];
      // An exception must not end the process from a thread, nor leave the other ranks waiting.
      Status result;
      try {
        result = fn(comm);
      } catch (const std::exception& e) {
        result = Status(StatusCode::kInternal, std::string("threw: ") + e.what());
      } catch (...) {
        result = Status(StatusCode::kInternal, "threw a non-standard exception");
      }
      comm.leave(result);
      statuses[static_cast<size_t>(r)] = result;
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

}  // namespace sciattn::train

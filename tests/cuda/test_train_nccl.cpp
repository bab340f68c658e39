// The NCCL communicator on GPUs (label gpu; built where NCCL is found): every collective of
// communicator.h through a host adapter against ThreadCommunicator, one rank on one GPU and two
// (four) ranks as threads of this process on two (four) GPUs, each rank on its own device and
// stream, connected through the TCP rendezvous on 127.0.0.1. Two ranks must give the thread
// back end's bytes (a sum of two is one commutative addition); more ranks must give every rank
// the same bytes and the thread back end's values within rounding. Test layer (gpu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sciattn/device.h"
#include "sciattn/train/process_group.h"
#include "sciattn/train/thread_communicator.h"
#include "train/comm_script.h"
#include "train/process_ranks.h"

namespace sciattn::train {
namespace {

using namespace testing;

// Device memory holding a copy of a host range, copied back by release().
class DeviceCopy {
 public:
  DeviceCopy(const void* host, size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMalloc(&device_, bytes_), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(device_, host, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceCopy() {
    if (device_ != nullptr) cudaFree(device_);
  }
  unsigned char* get() const { return static_cast<unsigned char*>(device_); }
  void back(void* host) const {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(host, device_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }

 private:
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

// A host-memory Communicator that runs each call on a device communicator: the buffers go to the
// device (keeping in-place calls in place), the call runs, the outputs come back.
class HostAdapter final : public Communicator {
 public:
  explicit HostAdapter(Communicator* device) : d_(device) {}
  int rank() const override { return d_->rank(); }
  int world_size() const override { return d_->world_size(); }

  Status all_reduce_mean(float* data, int64_t n) override {
    DeviceCopy x(data, bytes(n, DType::kF32));
    Status s = d_->all_reduce_mean(reinterpret_cast<float*>(x.get()), n);
    x.back(data);
    return s;
  }
  Status all_reduce_max(double* value) override { return d_->all_reduce_max(value); }
  Status all_reduce_sum(double* value) override { return d_->all_reduce_sum(value); }
  Status reduce_scatter(const float* send, float* recv, int64_t shard, ReduceOp op) override {
    const size_t all = bytes(shard * world_size(), DType::kF32);
    DeviceCopy x(send, all);
    if (recv == send + static_cast<int64_t>(rank()) * shard) {
      Status s = d_->reduce_scatter(reinterpret_cast<float*>(x.get()),
                                    reinterpret_cast<float*>(x.get()) + rank() * shard, shard, op);
      x.back(const_cast<float*>(send));
      return s;
    }
    DeviceCopy y(recv, bytes(shard, DType::kF32));
    Status s = d_->reduce_scatter(reinterpret_cast<float*>(x.get()),
                                  reinterpret_cast<float*>(y.get()), shard, op);
    y.back(recv);
    return s;
  }
  Status reduce(float* data, int64_t n, int root, ReduceOp op) override {
    DeviceCopy x(data, bytes(n, DType::kF32));
    Status s = d_->reduce(reinterpret_cast<float*>(x.get()), n, root, op);
    x.back(data);
    return s;
  }
  Status all_gather(const void* send, void* recv, int64_t shard, DType dtype) override {
    const size_t one = bytes(shard, dtype);
    DeviceCopy y(recv, one * static_cast<size_t>(world_size()));
    if (send == static_cast<unsigned char*>(recv) + one * static_cast<size_t>(rank())) {
      Status s = d_->all_gather(y.get() + one * static_cast<size_t>(rank()), y.get(), shard, dtype);
      y.back(recv);
      return s;
    }
    DeviceCopy x(send, one);
    Status s = d_->all_gather(x.get(), y.get(), shard, dtype);
    y.back(recv);
    return s;
  }
  Status all_to_all(const void* send, void* recv, int64_t chunk, DType dtype) override {
    const size_t all = bytes(chunk * world_size(), dtype);
    DeviceCopy x(send, all), y(recv, all);
    Status s = d_->all_to_all(x.get(), y.get(), chunk, dtype);
    y.back(recv);
    return s;
  }
  Status broadcast(void* data, int64_t n, DType dtype, int root) override {
    DeviceCopy x(data, bytes(n, dtype));
    Status s = d_->broadcast(x.get(), n, dtype, root);
    x.back(data);
    return s;
  }
  Status barrier() override { return d_->barrier(); }

  // A subgroup: the device communicator's split, adapted the same way (and owned).
  Status split(int color, int key, std::unique_ptr<Communicator>* out) override {
    std::unique_ptr<Communicator> inner;
    Status s = d_->split(color, key, &inner);
    if (!s.ok()) return s;
    auto group = std::make_unique<HostAdapter>(inner.get());
    group->owned_ = std::move(inner);
    *out = std::move(group);
    return s;
  }

 private:
  static size_t bytes(int64_t n, DType dtype) {
    return n > 0 ? static_cast<size_t>(n) * dtype_size(dtype) : 0;
  }
  Communicator* d_;
  std::unique_ptr<Communicator> owned_;  // a split group's device communicator
};

std::string thread_script(int world, int rank) {
  std::vector<std::string> out(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& c) {
    out[static_cast<size_t>(c.rank())] = run_script(c);
    return Status();
  });
  return out[static_cast<size_t>(rank)];
}

// Runs body(comm, stream) on `world` NCCL ranks, threads of this process, rank r on device r
// with a stream of its own (the trainer's stream), and returns each rank's result.
std::vector<std::string> nccl_ranks(
    int world, const std::function<std::string(Communicator&, cudaStream_t)>& body) {
  int port = 0;
  EXPECT_TRUE(pick_free_tcp_port(&port).ok());
  std::vector<std::string> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
      cudaStream_t stream = nullptr;
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      {
        std::unique_ptr<Communicator> comm;
        RendezvousOptions o;
        o.timeout_seconds = 60;
        Status s = make_nccl_communicator(local_env(r, world, port), r, Stream{stream}, o, &comm);
        EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.to_string();
        if (s.ok()) out[static_cast<size_t>(r)] = body(*comm, stream);
      }
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// Runs the script on `world` NCCL ranks through the host adapter.
std::vector<std::string> nccl_script(int world) {
  return nccl_ranks(world, [](Communicator& comm, cudaStream_t) {
    HostAdapter host(&comm);
    try {
      return run_script(host);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << comm.rank() << ": " << e.what();
    }
    return std::string();
  });
}

// The gradient path's collectives on one device buffer, started or called: a reduce-scatter in
// place, then the mean of the whole buffer (which reads it), then a reduce to every root. The
// started ones are waited for in reverse order with work queued on the trainer's stream between
// the starts, and the result is read back through the trainer's stream only (the waits order it
// after the collectives; the host never waits for the communication stream).
std::string gradient_path(Communicator& comm, cudaStream_t stream, bool started) {
  const int n = comm.world_size(), r = comm.rank();
  constexpr int64_t kShard = 129;
  const size_t count = static_cast<size_t>(kShard * n);
  std::vector<float> host = random_floats(count, 77 + static_cast<uint64_t>(r));
  for (size_t i = 0; i < count; ++i) host[i] *= static_cast<float>(1 << ((i + r) % 11));
  float *data = nullptr, *other = nullptr;
  EXPECT_EQ(cudaMalloc(&data, count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&other, count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  std::vector<CollectiveHandle> handles;
  auto step = [&](const std::function<Status(CollectiveHandle*)>& start,
                  const std::function<Status()>& call) {
    if (!started) {
      EXPECT_TRUE(call().ok());
      return;
    }
    CollectiveHandle h;
    const Status s = start(&h);
    EXPECT_TRUE(s.ok()) << s.to_string();
    handles.push_back(h);
    // The trainer's stream goes on with work of its own (the next layers' backward).
    EXPECT_EQ(cudaMemsetAsync(other, r + 1, count * sizeof(float), stream), cudaSuccess);
  };
  float* mine = data + r * kShard;
  step(
      [&](CollectiveHandle* h) {
        return comm.start_reduce_scatter(data, mine, kShard, ReduceOp::kSum, h);
      },
      [&] { return comm.reduce_scatter(data, mine, kShard, ReduceOp::kSum); });
  step([&](CollectiveHandle* h) { return comm.start_all_reduce_mean(data, kShard * n, h); },
       [&] { return comm.all_reduce_mean(data, kShard * n); });
  for (int root = 0; root < n; ++root) {
    float* piece = data + root * kShard;
    step(
        [&](CollectiveHandle* h) {
          return comm.start_reduce(piece, kShard, root, ReduceOp::kMean, h);
        },
        [&] { return comm.reduce(piece, kShard, root, ReduceOp::kMean); });
  }
  for (auto h = handles.rbegin(); h != handles.rend(); ++h) {
    const Status s = comm.wait(*h);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  if (started) {
    EXPECT_NE(comm.wait(handles[0]).message().find("waited for already"), std::string::npos);
  }
  EXPECT_EQ(
      cudaMemcpyAsync(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaFree(data);
  cudaFree(other);
  return std::string(reinterpret_cast<const char*>(host.data()), count * sizeof(float));
}

// Started collectives (overlap_comm) give the called ones' bytes, on every rank.
TEST(NcclComm, StartedCollectivesGiveTheCalledBytes) {
  const int devices = cuda_device_count();
  if (devices < 1) GTEST_SKIP() << "no CUDA device";
  for (int world : {1, 2, 4}) {
    if (world > devices) break;
    const std::vector<std::string> called = nccl_ranks(
        world, [](Communicator& c, cudaStream_t s) { return gradient_path(c, s, false); });
    const std::vector<std::string> started = nccl_ranks(
        world, [](Communicator& c, cudaStream_t s) { return gradient_path(c, s, true); });
    for (int r = 0; r < world; ++r) {
      EXPECT_FALSE(called[static_cast<size_t>(r)].empty());
      EXPECT_TRUE(started[static_cast<size_t>(r)] == called[static_cast<size_t>(r)])
          << world << " ranks, rank " << r;
    }
  }
}

TEST(NcclComm, OneRankOnOneGpu) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::string> got = nccl_script(1);
  EXPECT_FALSE(got[0].empty());
  EXPECT_TRUE(got[0] == thread_script(1, 0));
}

TEST(NcclComm, ArgumentsAreCheckedByName) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<Communicator> comm;
  ASSERT_TRUE(
      make_nccl_communicator(local_env(0, 1, 1), 0, Stream{}, RendezvousOptions{}, &comm).ok());
  Status s = comm->all_reduce_mean(nullptr, -1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("count"), std::string::npos) << s.message();
  s = comm->broadcast(nullptr, 1, DType::kF32, 3);
  EXPECT_NE(s.message().find("root"), std::string::npos) << s.message();
}

TEST(NcclComm, DeviceOutOfRangeNamesTheLocalRank) {
  const int devices = cuda_device_count();
  if (devices < 1) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<Communicator> comm;
  Status s =
      make_nccl_communicator(local_env(0, 1, 1), devices, Stream{}, RendezvousOptions{}, &comm);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("local rank"), std::string::npos) << s.message();
}

class NcclRanks : public ::testing::TestWithParam<int> {};

TEST_P(NcclRanks, CollectivesMatchTheThreadRanks) {
  const int world = GetParam();
  if (cuda_device_count() < world) {
    GTEST_SKIP() << "needs " << world << " GPUs; this machine has " << cuda_device_count();
  }
  const std::vector<std::string> got = nccl_script(world);
  for (int r = 0; r < world; ++r) {
    const std::string want = thread_script(world, r);
    ASSERT_EQ(got[r].size(), want.size()) << "rank " << r;
    if (world == 2) {
      EXPECT_TRUE(got[r] == want) << "rank " << r << " differs from the thread ranks";
    } else {
      // NCCL adds in its own order: the first output (an all-reduce mean of 1001 floats of
      // magnitude below 2^11) agrees within the rounding of a sum of `world` terms.
      std::vector<float> a(1001), b(1001);
      std::memcpy(a.data(), got[r].data(), a.size() * sizeof(float));
      std::memcpy(b.data(), want.data(), b.size() * sizeof(float));
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(a[i], b[i], 4.0 * world * 2048 * 0x1p-24) << "rank " << r << " element " << i;
      }
    }
  }
  // Every rank holds the same bits of the all-reduce (NCCL forms each sum once and sends it on).
  const size_t mean_bytes = 1001 * sizeof(float);
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(got[r].compare(0, mean_bytes, got[0], 0, mean_bytes), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpus, NcclRanks, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

}  // namespace
}  // namespace sciattn::train

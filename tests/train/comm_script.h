// A fixed sequence of every collective of communicator.h, for comparing two communicators byte
// for byte (the TCP communicator against ThreadCommunicator on the CPU; NCCL's through a host
// adapter on GPUs). Test layer (header-only).
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sciattn/train/communicator.h"
#include "train_test_util.h"

namespace sciattn::train::testing {

// The same sequence of collectives on any communicator; returns every output's bytes, in order.
// Inputs spread over several binades, so that the order of a float sum shows in its bits.
inline std::string run_script(Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  std::string out;
  auto keep = [&](const void* p, size_t bytes) { out.append(static_cast<const char*>(p), bytes); };
  auto input = [&](size_t count, uint64_t salt) {
    std::vector<float> v = random_floats(count, 1000 + salt * 31 + static_cast<uint64_t>(r));
    for (size_t i = 0; i < count; ++i)
      v[i] *= static_cast<float>(1 << ((i + static_cast<size_t>(r)) % 11));
    return v;
  };
  auto check = [&](const Status& s) {
    if (!s.ok()) throw std::runtime_error(s.to_string());
  };
  std::vector<float> a = input(1001, 1);
  check(comm.all_reduce_mean(a.data(), 1001));
  keep(a.data(), a.size() * 4);
  check(comm.all_reduce_mean(a.data(), 0));
  const int64_t shard = 37;
  std::vector<float> rs = input(static_cast<size_t>(shard * n), 2);
  std::vector<float> apart(static_cast<size_t>(shard));
  check(comm.reduce_scatter(rs.data(), apart.data(), shard, ReduceOp::kSum));
  keep(apart.data(), apart.size() * 4);
  check(comm.reduce_scatter(rs.data(), rs.data() + r * shard, shard, ReduceOp::kMean));
  keep(rs.data(), rs.size() * 4);
  std::vector<float> red = input(300, 3);
  check(comm.reduce(red.data(), 300, n - 1, ReduceOp::kMean));
  keep(red.data(), red.size() * 4);
  std::vector<float> gathered(static_cast<size_t>(shard * n));
  std::vector<float> mine = input(static_cast<size_t>(shard), 4);
  check(comm.all_gather(mine.data(), gathered.data(), shard, DType::kF32));
  keep(gathered.data(), gathered.size() * 4);
  std::vector<uint16_t> half(static_cast<size_t>(5 * n), static_cast<uint16_t>(r + 1));
  check(comm.all_gather(half.data() + 5 * r, half.data(), 5, DType::kBF16));  // in place
  keep(half.data(), half.size() * 2);
  std::vector<float> send = input(static_cast<size_t>(3 * n), 5), recv(static_cast<size_t>(3 * n));
  check(comm.all_to_all(send.data(), recv.data(), 3, DType::kF32));
  keep(recv.data(), recv.size() * 4);
  std::vector<uint16_t> b(7, static_cast<uint16_t>(100 + r));
  check(comm.broadcast(b.data(), 7, DType::kF16, n - 1));
  keep(b.data(), b.size() * 2);
  double mx = r == 1 ? 5.5 : -1.0 * r, sum = 0.1 * (r + 1), nan = r == 0 ? std::nan("") : 1.0;
  check(comm.all_reduce_max(&mx));
  check(comm.all_reduce_sum(&sum));
  check(comm.all_reduce_max(&nan));
  keep(&mx, 8);
  keep(&sum, 8);
  out += std::isnan(nan) ? "nan" : "number";
  check(comm.barrier());
  return out;
}

}  // namespace sciattn::train::testing

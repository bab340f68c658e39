// The collectives of the thread-per-rank test communicator against sequential references written
// here (bitwise: the communicator adds in rank order), on 2 and 4 ranks and sizes that split
// unevenly; the single-rank communicator; argument checks; and the failure paths (a failed rank,
// mismatched calls, a rank that returns early), which must end in errors, not hangs. Test layer
// (cpu).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "common/status_try.h"
#include "sciattn/train/communicator.h"
#include "sciattn/train/thread_communicator.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

constexpr uint64_t kSeed = 20261204;

// Rank r's input: values spread over several binades, so that the order of a float sum changes
// its bits (checked below, so that the bitwise comparisons cannot pass by accident).
std::vector<float> rank_input(int rank, size_t n) {
  std::vector<float> v = random_floats(n, kSeed + static_cast<uint64_t>(rank) * 7919);
  for (size_t i = 0; i < n; ++i)
    v[i] *= static_cast<float>(1 << ((i + static_cast<size_t>(rank)) % 9));
  return v;
}

// The rank-order sum (and mean) over the ranks' inputs, one element at a time: what one rank
// computes from the concatenated data.
std::vector<float> sequential_sum(int ranks, size_t n, size_t offset, size_t count, bool mean) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < ranks; ++r) in.push_back(rank_input(r, n));
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    float acc = in[0][offset + i];
    for (int r = 1; r < ranks; ++r) acc += in[static_cast<size_t>(r)][offset + i];
    out[i] = mean ? acc / static_cast<float>(ranks) : acc;
  }
  return out;
}

void expect_all_ok(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].to_string();
  }
}

class ThreadComm : public ::testing::TestWithParam<int> {};

TEST_P(ThreadComm, AllReduceMeanIsTheRankOrderSum) {
  const int ranks = GetParam();
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (size_t n : {size_t{1}, size_t{7}, size_t{1001}}) {
    const std::vector<float> ref = sequential_sum(ranks, n, 0, n, true);
    // The order matters for these inputs: the reverse order gives other bits somewhere. (Float
    // addition commutes, so two ranks have one order only.)
    if (n == 1001 && ranks > 2) {
      bool differs = false;
      for (size_t i = 0; i < n && !differs; ++i) {
        float acc = rank_input(ranks - 1, n)[i];
        for (int r = ranks - 2; r >= 0; --r) acc += rank_input(r, n)[i];
        differs = acc / static_cast<float>(ranks) != ref[i];
      }
      EXPECT_TRUE(differs) << "the inputs do not tell summation orders apart";
    }
    std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
    expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
      std::vector<float> data = rank_input(comm.rank(), n);
      Status s = comm.all_reduce_mean(data.data(), static_cast<int64_t>(n));
      out[static_cast<size_t>(comm.rank())] = data;
      return s;
    }));
    for (int r = 0; r < ranks; ++r) {
      EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data(), ref.data(), n))
          << "rank " << r << " n " << n;
    }
  }
}

TEST_P(ThreadComm, ReduceScatterInPlaceAndApart) {
  const int ranks = GetParam();
  for (int64_t shard : {int64_t{1}, int64_t{5}, int64_t{33}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      for (bool in_place : {false, true}) {
        const size_t n = static_cast<size_t>(shard) * static_cast<size_t>(ranks);
        std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
        std::vector<std::vector<float>> sent(static_cast<size_t>(ranks));
        expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
          std::vector<float> send = rank_input(comm.rank(), n);
          std::vector<float> recv(static_cast<size_t>(shard), NAN);
          float* dst = in_place ? send.data() + comm.rank() * shard : recv.data();
          Status s = comm.reduce_scatter(send.data(), dst, shard, op);
          out[static_cast<size_t>(comm.rank())].assign(dst, dst + shard);
          sent[static_cast<size_t>(comm.rank())] = send;
          return s;
        }));
        for (int r = 0; r < ranks; ++r) {
          const std::vector<float> ref =
              sequential_sum(ranks, n, static_cast<size_t>(r * shard), static_cast<size_t>(shard),
                             op == ReduceOp::kMean);
          EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data(), ref.data(), ref.size()))
              << "rank " << r << " shard " << shard << " " << reduce_op_name(op)
              << (in_place ? " in place" : "");
          // The other chunks of the send buffer are untouched.
          const std::vector<float> input = rank_input(r, n);
          for (int q = 0; q < ranks; ++q) {
            if (in_place && q == r) continue;
            EXPECT_TRUE(bitwise_equal(sent[static_cast<size_t>(r)].data() + q * shard,
                                      input.data() + q * shard, static_cast<size_t>(shard)));
          }
        }
      }
    }
  }
}

TEST_P(ThreadComm, ReduceReachesOnlyTheRoot) {
  const int ranks = GetParam();
  const size_t n = 13;
  for (int root = 0; root < ranks; ++root) {
    std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
    expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
      std::vector<float> data = rank_input(comm.rank(), n);
      Status s = comm.reduce(data.data(), static_cast<int64_t>(n), root, ReduceOp::kMean);
      out[static_cast<size_t>(comm.rank())] = data;
      return s;
    }));
    const std::vector<float> ref = sequential_sum(ranks, n, 0, n, true);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> expected = r == root ? ref : rank_input(r, n);
      EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data(), expected.data(), n))
          << "rank " << r << " root " << root;
    }
  }
}

TEST_P(ThreadComm, AllGatherF32AndBf16) {
  const int ranks = GetParam();
  for (int64_t shard : {int64_t{1}, int64_t{9}}) {
    for (bool in_place : {false, true}) {
      const size_t n = static_cast<size_t>(shard * ranks);
      std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
      std::vector<std::vector<uint16_t>> out16(static_cast<size_t>(ranks));
      expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
        const int r = comm.rank();
        std::vector<float> mine = rank_input(r, static_cast<size_t>(shard));
        std::vector<float> recv(n, NAN);
        if (in_place) std::memcpy(recv.data() + r * shard, mine.data(), mine.size() * 4);
        const float* send = in_place ? recv.data() + r * shard : mine.data();
        Status s = comm.all_gather(send, recv.data(), shard, DType::kF32);
        out[static_cast<size_t>(r)] = recv;
        if (!s.ok()) return s;
        std::vector<uint16_t> mine16(static_cast<size_t>(shard));
        for (size_t i = 0; i < mine16.size(); ++i) mine16[i] = float_to_bf16_bits(mine[i]);
        std::vector<uint16_t> recv16(n, 0xFFFF);
        s = comm.all_gather(mine16.data(), recv16.data(), shard, DType::kBF16);
        out16[static_cast<size_t>(r)] = recv16;
        return s;
      }));
      for (int r = 0; r < ranks; ++r) {
        for (int q = 0; q < ranks; ++q) {
          const std::vector<float> expected = rank_input(q, static_cast<size_t>(shard));
          EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data() + q * shard, expected.data(),
                                    expected.size()))
              << "rank " << r << " shard of " << q;
          for (int64_t i = 0; i < shard; ++i) {
            EXPECT_EQ(out16[static_cast<size_t>(r)][static_cast<size_t>(q * shard + i)],
                      float_to_bf16_bits(expected[static_cast<size_t>(i)]));
          }
        }
      }
    }
  }
}

TEST_P(ThreadComm, AllToAllTransposesChunks) {
  const int ranks = GetParam();
  const int64_t chunk = 3;
  const size_t n = static_cast<size_t>(chunk * ranks);
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
  expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
    std::vector<float> send = rank_input(comm.rank(), n);
    std::vector<float> recv(n, NAN);
    Status s = comm.all_to_all(send.data(), recv.data(), chunk, DType::kF32);
    out[static_cast<size_t>(comm.rank())] = recv;
    return s;
  }));
  for (int r = 0; r < ranks; ++r) {
    for (int q = 0; q < ranks; ++q) {
      // Chunk q of rank r's result is chunk r of rank q's input.
      EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data() + q * chunk,
                                rank_input(q, n).data() + r * chunk, static_cast<size_t>(chunk)))
          << "rank " << r << " chunk " << q;
    }
  }
}

TEST_P(ThreadComm, BroadcastScalarsAndBarrier) {
  const int ranks = GetParam();
  const size_t n = 17;
  const int root = ranks - 1;
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
  std::vector<double> maxes(static_cast<size_t>(ranks)), sums(static_cast<size_t>(ranks));
  expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> data = rank_input(r, n);
    Status s = comm.broadcast(data.data(), static_cast<int64_t>(n), DType::kF32, root);
    out[static_cast<size_t>(r)] = data;
    if (!s.ok()) return s;
    double mx = 0.1 * (r == 1 ? 5 : r), sum = 0.1 * (r + 1);
    s = comm.all_reduce_max(&mx);
    if (!s.ok()) return s;
    s = comm.all_reduce_sum(&sum);
    maxes[static_cast<size_t>(r)] = mx;
    sums[static_cast<size_t>(r)] = sum;
    if (!s.ok()) return s;
    return comm.barrier();
  }));
  double ref_sum = 0.1;
  for (int r = 1; r < ranks; ++r) ref_sum += 0.1 * (r + 1);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data(), rank_input(root, n).data(), n));
    EXPECT_EQ(maxes[static_cast<size_t>(r)], 0.5);
    EXPECT_EQ(sums[static_cast<size_t>(r)], ref_sum);  // the same bits on every rank
  }
}

// split: the groups of each color, ranked by key, run their collectives among themselves (the
// sums here hold only the group's ranks), independently of the other groups (which call a
// different number of collectives), and a second split of the same group works alike.
TEST_P(ThreadComm, SplitFormsGroupsByColorRankedByKey) {
  const int ranks = GetParam();
  const int group = 2;  // consecutive pairs, as the trainer's sequence-parallel groups
  std::vector<int> sub_rank(static_cast<size_t>(ranks), -1), sub_size(sub_rank.size(), -1);
  std::vector<double> sums(sub_rank.size(), 0.0);
  std::vector<std::vector<float>> received(sub_rank.size());
  std::vector<int> reversed_rank(sub_rank.size(), -1);
  expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
    const size_t r = static_cast<size_t>(comm.rank());
    std::unique_ptr<Communicator> sub;
    Status s = comm.split(comm.rank() / group, comm.rank(), &sub);
    if (!s.ok()) return s;
    sub_rank[r] = sub->rank();
    sub_size[r] = sub->world_size();
    double x = static_cast<double>(1 << comm.rank());
    s = sub->all_reduce_sum(&x);
    if (!s.ok()) return s;
    sums[r] = x;
    // Two floats to each rank of the group: this rank's number and the destination's.
    std::vector<float> send, recv(2 * group, NAN);
    for (int q = 0; q < group; ++q) {
      send.push_back(static_cast<float>(comm.rank()));
      send.push_back(static_cast<float>(q));
    }
    s = sub->all_to_all(send.data(), recv.data(), 2, DType::kF32);
    if (!s.ok()) return s;
    received[r] = recv;
    // The first group alone takes one more collective: the others do not wait for it.
    if (comm.rank() / group == 0) {
      s = sub->barrier();
      if (!s.ok()) return s;
    }
    // All ranks in one group, ranked by a descending key.
    std::unique_ptr<Communicator> all;
    s = comm.split(7, -comm.rank(), &all);
    if (!s.ok()) return s;
    reversed_rank[r] = all->rank();
    return all->barrier();
  }));
  for (int r = 0; r < ranks; ++r) {
    const size_t i = static_cast<size_t>(r);
    const int first = r / group * group;
    EXPECT_EQ(sub_rank[i], r % group);
    EXPECT_EQ(sub_size[i], group);
    EXPECT_EQ(sums[i], static_cast<double>((1 << first) + (1 << (first + 1)))) << "rank " << r;
    for (int q = 0; q < group; ++q) {
      EXPECT_EQ(received[i][static_cast<size_t>(2 * q)], static_cast<float>(first + q));
      EXPECT_EQ(received[i][static_cast<size_t>(2 * q + 1)], static_cast<float>(r % group));
    }
    EXPECT_EQ(reversed_rank[i], ranks - 1 - r);
  }
}

// One rank's sequence of gradient-path collectives, started (handles waited for at the end, in
// reverse order) or called: a chain on one buffer (each reduction reads the previous one's
// output, so another order gives other bits), reduce-scatters apart and in place, reduces to
// every root, and a called collective in the middle (which runs after the started ones).
struct Sequence {
  std::vector<std::vector<float>> buffers;
  double sum = 0.0;
};

Status run_sequence(Communicator& comm, bool started, int rounds, Sequence* out) {
  const int ranks = comm.world_size(), me = comm.rank();
  constexpr int64_t kShard = 7;
  const size_t n = static_cast<size_t>(kShard) * static_cast<size_t>(ranks);
  std::vector<std::vector<float>>& b = out->buffers;
  b.clear();
  for (int k = 0; k < 4; ++k) b.push_back(rank_input(me + 10 * k, n));
  b.push_back(std::vector<float>(static_cast<size_t>(kShard), NAN));  // reduce_scatter apart
  std::vector<CollectiveHandle> handles;
  auto issue = [&](const std::function<Status(CollectiveHandle*)>& start,
                   const std::function<Status()>& call) -> Status {
    if (!started) return call();
    CollectiveHandle h;
    Status s = start(&h);
    if (s.ok()) handles.push_back(h);
    return s;
  };
  const auto count = static_cast<int64_t>(n);
  for (int round = 0; round < rounds; ++round) {
    // The chain: a sum into this rank's chunk in place, then the mean of the whole buffer.
    float* mine = b[0].data() + me * kShard;
    SCIATTN_TRY(issue(
        [&](CollectiveHandle* h) {
          return comm.start_reduce_scatter(b[0].data(), mine, kShard, ReduceOp::kSum, h);
        },
        [&] { return comm.reduce_scatter(b[0].data(), mine, kShard, ReduceOp::kSum); }));
    SCIATTN_TRY(issue(
        [&](CollectiveHandle* h) { return comm.start_all_reduce_mean(b[0].data(), count, h); },
        [&] { return comm.all_reduce_mean(b[0].data(), count); }));
    SCIATTN_TRY(issue(
        [&](CollectiveHandle* h) {
          return comm.start_reduce_scatter(b[1].data(), b[4].data(), kShard, ReduceOp::kSum, h);
        },
        [&] { return comm.reduce_scatter(b[1].data(), b[4].data(), kShard, ReduceOp::kSum); }));
    SCIATTN_TRY(issue(
        [&](CollectiveHandle* h) {
          return comm.start_reduce_scatter(b[2].data(), b[2].data() + me * kShard, kShard,
                                           ReduceOp::kMean, h);
        },
        [&] {
          return comm.reduce_scatter(b[2].data(), b[2].data() + me * kShard, kShard,
                                     ReduceOp::kMean);
        }));
    for (int root = 0; root < ranks; ++root) {
      float* piece = b[3].data() + root * kShard;
      SCIATTN_TRY(issue(
          [&](CollectiveHandle* h) {
            return comm.start_reduce(piece, kShard, root, ReduceOp::kMean, h);
          },
          [&] { return comm.reduce(piece, kShard, root, ReduceOp::kMean); }));
    }
    if (round == 0) {
      // A called collective among started ones: it runs after them.
      out->sum = me + 0.5;
      SCIATTN_TRY(comm.all_reduce_sum(&out->sum));
    }
  }
  for (auto h = handles.rbegin(); h != handles.rend(); ++h) SCIATTN_TRY(comm.wait(*h));
  return Status::ok_status();
}

// Started collectives give the bits of the same collectives called in the same order, with many
// handles outstanding and waited for in reverse order (most of them long finished by then).
TEST_P(ThreadComm, StartedCollectivesRunInIssueOrder) {
  const int ranks = GetParam();
  constexpr int kRounds = 6;  // 6 x (4 + ranks) handles outstanding at the end
  std::vector<Sequence> called(static_cast<size_t>(ranks)), started(called.size());
  expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
    return run_sequence(comm, false, kRounds, &called[static_cast<size_t>(comm.rank())]);
  }));
  expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) {
    return run_sequence(comm, true, kRounds, &started[static_cast<size_t>(comm.rank())]);
  }));
  for (int r = 0; r < ranks; ++r) {
    const Sequence &a = called[static_cast<size_t>(r)], &b = started[static_cast<size_t>(r)];
    ASSERT_EQ(a.buffers.size(), b.buffers.size());
    for (size_t k = 0; k < a.buffers.size(); ++k) {
      EXPECT_TRUE(bitwise_equal(a.buffers[k].data(), b.buffers[k].data(), a.buffers[k].size()))
          << "rank " << r << " buffer " << k;
    }
    EXPECT_EQ(a.sum, b.sum) << "rank " << r;
  }
  // The chain does something: its result is not the mean of the raw inputs.
  const size_t n = 7 * static_cast<size_t>(ranks);
  const std::vector<float> once = sequential_sum(ranks, n, 0, n, true);
  EXPECT_FALSE(bitwise_equal(once.data(), called[0].buffers[0].data(), n));
}

// A start returns before its collective has run: rank 0 starts an all-reduce and only then lets
// the other ranks reach it. (A start that ran the collective would wait for them forever; the
// others then give up after a minute and the test fails, instead of hanging.)
TEST_P(ThreadComm, StartReturnsBeforeALateRankArrives) {
  const int ranks = GetParam();
  const size_t n = 33;
  std::mutex mutex;
  std::condition_variable cv;
  bool started = false;
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
  expect_all_ok(run_thread_ranks(ranks, [&](Communicator& comm) -> Status {
    std::vector<float> data = rank_input(comm.rank(), n);
    if (comm.rank() == 0) {
      CollectiveHandle h;
      SCIATTN_TRY(comm.start_all_reduce_mean(data.data(), static_cast<int64_t>(n), &h));
      {
        std::lock_guard<std::mutex> lock(mutex);
        started = true;
      }
      cv.notify_all();
      SCIATTN_TRY(comm.wait(h));
    } else {
      std::unique_lock<std::mutex> lock(mutex);
      if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return started; })) {
        return Status::invalid_argument("rank 0's start did not return before the others came");
      }
      lock.unlock();
      SCIATTN_TRY(comm.all_reduce_mean(data.data(), static_cast<int64_t>(n)));
    }
    out[static_cast<size_t>(comm.rank())] = data;
    return Status::ok_status();
  }));
  const std::vector<float> ref = sequential_sum(ranks, n, 0, n, true);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_TRUE(bitwise_equal(out[static_cast<size_t>(r)].data(), ref.data(), n)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadComm, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

TEST(ThreadCommErrors, AFailedRankStopsTheOthers) {
  const std::vector<Status> st = run_thread_ranks(4, [](Communicator& comm) {
    if (comm.rank() == 2) return Status::invalid_argument("the data file is missing");
    float x = 1.0f;
    Status s = comm.all_reduce_mean(&x, 1);
    if (!s.ok()) return s;
    return comm.barrier();
  });
  ASSERT_EQ(st.size(), 4u);
  EXPECT_EQ(st[2].message(), "the data file is missing");
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(st[static_cast<size_t>(r)].ok());
    EXPECT_NE(st[static_cast<size_t>(r)].message().find("rank 2 failed: the data file is missing"),
              std::string::npos)
        << st[static_cast<size_t>(r)].message();
  }
}

TEST(ThreadCommErrors, AnExceptionBecomesAStatus) {
  const std::vector<Status> st = run_thread_ranks(2, [](Communicator& comm) -> Status {
    if (comm.rank() == 1) throw std::runtime_error("out of tokens");
    return comm.barrier();
  });
  EXPECT_EQ(st[1].code(), StatusCode::kInternal);
  EXPECT_EQ(st[1].message(), "threw: out of tokens");
  EXPECT_NE(st[0].message().find("rank 1 failed: threw: out of tokens"), std::string::npos)
      << st[0].message();
}

TEST(ThreadCommErrors, ARankThatReturnsEarlyFailsTheWaitingOnes) {
  const std::vector<Status> st = run_thread_ranks(2, [](Communicator& comm) {
    if (comm.rank() == 0) return Status::ok_status();
    return comm.barrier();
  });
  EXPECT_TRUE(st[0].ok());
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("rank 0 returned without entering it"), std::string::npos)
      << st[1].message();
}

TEST(ThreadCommErrors, MismatchedCallsAreRefusedOnEveryRank) {
  const std::vector<Status> st = run_thread_ranks(2, [](Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    return comm.all_reduce_mean(data.data(), comm.rank() == 0 ? 4 : 3);
  });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("same counts"), std::string::npos) << s.message();
  }
  const std::vector<Status> st2 = run_thread_ranks(2, [](Communicator& comm) {
    float x = 1.0f;
    if (comm.rank() == 0) return comm.broadcast(&x, 1, DType::kF32, 0);
    return comm.reduce(&x, 1, 0, ReduceOp::kSum);
  });
  for (const Status& s : st2) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("met"), std::string::npos) << s.message();
  }
}

TEST(ThreadCommErrors, BadArgumentsNameTheArgument) {
  const std::vector<Status> st = run_thread_ranks(2, [](Communicator& comm) {
    float x = 0.0f;
    Status s = comm.broadcast(&x, 1, DType::kF32, 2);
    EXPECT_NE(s.message().find("broadcast: root must be in [0, 2); got 2"), std::string::npos)
        << s.message();
    s = comm.all_gather(&x, &x, -1, DType::kF32);
    EXPECT_NE(s.message().find("all_gather: the count must be >= 0; got -1"), std::string::npos)
        << s.message();
    s = comm.all_to_all(&x, &x, 1, DType::kBool);
    EXPECT_NE(s.message().find("dtype must be f32, f16 or bf16"), std::string::npos) << s.message();
    return Status::ok_status();
  });
  expect_all_ok(st);
  EXPECT_EQ(run_thread_ranks(0, [](Communicator&) { return Status::ok_status(); }).size(), 1u);
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  EXPECT_NE(ThreadCommunicator::create_group(0, &comms).message().find("world_size must be >= 1"),
            std::string::npos);
}

// A failure anywhere reaches the groups split off: a rank waiting in its group's collective gets
// an error naming the failed rank (in the parent's numbering), and one whose group partner
// returned without entering a collective is told so, instead of waiting forever.
TEST(ThreadCommErrors, SplitGroupsShareTheParentsFailures) {
  std::vector<Status> st = run_thread_ranks(4, [](Communicator& comm) {
    std::unique_ptr<Communicator> sub;
    Status s = comm.split(comm.rank() / 2, comm.rank(), &sub);
    if (!s.ok()) return s;
    if (comm.rank() == 3) return Status::invalid_argument("out of memory");
    return sub->barrier();
  });
  EXPECT_EQ(st[3].message(), "out of memory");
  EXPECT_NE(st[2].message().find("rank 3 failed: out of memory"), std::string::npos)
      << st[2].message();
  st = run_thread_ranks(4, [](Communicator& comm) {
    std::unique_ptr<Communicator> sub;
    Status s = comm.split(comm.rank() / 2, comm.rank(), &sub);
    if (!s.ok()) return s;
    if (comm.rank() == 3) return Status::ok_status();
    return sub->barrier();
  });
  // (Ranks 0 and 1 may fail too: rank 2's failure poisons every group, theirs included.)
  EXPECT_TRUE(st[3].ok());
  ASSERT_FALSE(st[2].ok());
  EXPECT_NE(st[2].message().find("rank 1 returned without entering it"), std::string::npos)
      << st[2].message();
  // A negative color is refused (every rank joins a group).
  st = run_thread_ranks(1, [](Communicator& comm) {
    std::unique_ptr<Communicator> sub;
    return comm.split(-1, 0, &sub);
  });
  EXPECT_NE(st[0].message().find("split: color must be >= 0"), std::string::npos)
      << st[0].message();
}

// A started collective's failure comes from its wait and names the collective: mismatched
// counts, and a rank that fails while the others' reductions are in flight. Bad arguments are
// refused by the start (no handle); unknown and already-waited handles by the wait.
TEST(ThreadCommErrors, StartedCollectivesReportThroughWait) {
  std::vector<Status> waits(2);
  std::vector<Status> st = run_thread_ranks(2, [&](Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    CollectiveHandle h;
    Status s = comm.start_all_reduce_mean(data.data(), comm.rank() == 0 ? 4 : 3, &h);
    if (!s.ok()) return s;
    waits[static_cast<size_t>(comm.rank())] = comm.wait(h);
    return Status::ok_status();
  });
  expect_all_ok(st);
  for (const Status& s : waits) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("all_reduce_mean on rank"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("same counts"), std::string::npos) << s.message();
  }
  st = run_thread_ranks(3, [&](Communicator& comm) {
    if (comm.rank() == 2) return Status::invalid_argument("the backward ran out of memory");
    std::vector<float> data(8, 1.0f);
    CollectiveHandle a, b;
    Status s = comm.start_reduce(data.data(), 4, 0, ReduceOp::kMean, &a);
    if (s.ok()) s = comm.start_reduce(data.data() + 4, 4, 1, ReduceOp::kMean, &b);
    if (!s.ok()) return s;
    const Status first = comm.wait(a), second = comm.wait(b);
    EXPECT_NE(second.message().find("reduce on rank"), std::string::npos) << second.message();
    return first;
  });
  for (int r : {0, 1}) {
    ASSERT_FALSE(st[static_cast<size_t>(r)].ok());
    EXPECT_NE(st[static_cast<size_t>(r)].message().find("reduce on rank"), std::string::npos)
        << st[static_cast<size_t>(r)].message();
    EXPECT_NE(st[static_cast<size_t>(r)].message().find("rank 2 failed: the backward ran out"),
              std::string::npos)
        << st[static_cast<size_t>(r)].message();
  }
  st = run_thread_ranks(2, [](Communicator& comm) {
    float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    CollectiveHandle h;
    Status s = comm.start_reduce(x, 4, 2, ReduceOp::kSum, &h);
    EXPECT_NE(s.message().find("reduce: root must be in [0, 2); got 2"), std::string::npos)
        << s.message();
    EXPECT_EQ(h.id, 0u);
    s = comm.start_reduce_scatter(x, x, -1, ReduceOp::kSum, &h);
    EXPECT_NE(s.message().find("reduce_scatter: the count must be >= 0"), std::string::npos)
        << s.message();
    s = comm.start_all_reduce_mean(x, 4, nullptr);
    EXPECT_NE(s.message().find("start_all_reduce_mean: the handle (out) must not be null"),
              std::string::npos)
        << s.message();
    EXPECT_NE(comm.wait(CollectiveHandle{}).message().find("not an outstanding collective"),
              std::string::npos);
    SCIATTN_TRY(comm.start_all_reduce_mean(x, 4, &h));
    SCIATTN_TRY(comm.barrier());  // the started one has run: the wait returns at once
    SCIATTN_TRY(comm.wait(h));
    EXPECT_EQ(x[3], 4.0f);  // the mean of equal inputs
    EXPECT_NE(comm.wait(h).message().find("waited for already"), std::string::npos);
    EXPECT_NE(comm.wait(CollectiveHandle{h.id + 1}).message().find("not an outstanding"),
              std::string::npos);
    return Status::ok_status();
  });
  expect_all_ok(st);
}

// A rank that returns ok with started collectives not waited for still runs them (the others
// expect them); one that leaves them to a destroyed communicator fails the group instead of
// leaving the others waiting.
TEST(ThreadCommErrors, UnwaitedStartedCollectivesDoNotHang) {
  std::vector<float> result(2, 0.0f);
  std::vector<Status> st = run_thread_ranks(2, [&](Communicator& comm) {
    float x = static_cast<float>(comm.rank()) + 1.0f;
    if (comm.rank() == 0) {
      CollectiveHandle h;
      return comm.start_all_reduce_mean(&result[0], 1, &h);  // never waited for
    }
    Status s = comm.all_reduce_mean(&x, 1);
    result[1] = x;
    return s;
  });
  expect_all_ok(st);
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  ASSERT_TRUE(ThreadCommunicator::create_group(2, &comms).ok());
  float x = 1.0f;
  CollectiveHandle h;
  ASSERT_TRUE(comms[0]->start_all_reduce_mean(&x, 1, &h).ok());
  comms[0].reset();  // rank 1 never came: the started collective fails instead of hanging
  const Status s = comms[1]->barrier();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("destroyed with 1 started collective(s) not run"), std::string::npos)
      << s.message();
}

// The base class's started collectives (SingleRankCommunicator, the TCP communicator) run at the
// start and report at the wait.
TEST(SingleRankComm, StartedCollectivesRunAtTheStart) {
  SingleRankCommunicator comm;
  std::vector<float> a = rank_input(0, 5), b(5, NAN);
  CollectiveHandle h1, h2, h3;
  ASSERT_TRUE(comm.start_reduce_scatter(a.data(), b.data(), 5, ReduceOp::kMean, &h1).ok());
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), 5));  // already run
  ASSERT_TRUE(comm.start_all_reduce_mean(a.data(), 5, &h2).ok());
  ASSERT_TRUE(comm.start_reduce(a.data(), 5, 1, ReduceOp::kSum, &h3).ok());
  EXPECT_EQ(h1.id + 1, h2.id);
  EXPECT_TRUE(comm.wait(h2).ok());
  EXPECT_TRUE(comm.wait(h1).ok());
  const Status bad = comm.wait(h3);
  EXPECT_NE(bad.message().find("reduce: root must be in [0, 1); got 1"), std::string::npos)
      << bad.message();
  EXPECT_NE(comm.wait(h1).message().find("waited for already"), std::string::npos);
  EXPECT_FALSE(comm.start_reduce(a.data(), 5, 0, ReduceOp::kSum, nullptr).ok());
}

TEST(SingleRankComm, CopiesApartAndLeavesInPlace) {
  SingleRankCommunicator comm;
  std::vector<float> a = rank_input(0, 5), b(5, NAN);
  ASSERT_TRUE(comm.reduce_scatter(a.data(), b.data(), 5, ReduceOp::kMean).ok());
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), 5));
  std::fill(b.begin(), b.end(), NAN);
  ASSERT_TRUE(comm.all_gather(a.data(), b.data(), 5, DType::kF32).ok());
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), 5));
  std::fill(b.begin(), b.end(), NAN);
  ASSERT_TRUE(comm.all_to_all(a.data(), b.data(), 5, DType::kF32).ok());
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), 5));
  ASSERT_TRUE(comm.all_reduce_mean(a.data(), 5).ok());
  ASSERT_TRUE(comm.reduce(a.data(), 5, 0, ReduceOp::kSum).ok());
  ASSERT_TRUE(comm.broadcast(a.data(), 5, DType::kF32, 0).ok());
  EXPECT_TRUE(bitwise_equal(a.data(), rank_input(0, 5).data(), 5));
  EXPECT_FALSE(comm.reduce(a.data(), 5, 1, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm.barrier().ok());
  std::unique_ptr<Communicator> sub;
  ASSERT_TRUE(comm.split(3, 1, &sub).ok());
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->world_size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_FALSE(comm.split(-1, 0, &sub).ok());
}

}  // namespace
}  // namespace sciattn::train

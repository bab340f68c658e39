// The collectives of the thread-per-rank test communicator against sequential references written
// here (bitwise: the communicator adds in rank order), on 2 and 4 ranks and sizes that split
// unevenly; the single-rank communicator; argument checks; and the failure paths (a failed rank,
// mismatched calls, a rank that returns early), which must end in errors, not hangs. Test layer
// (cpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

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

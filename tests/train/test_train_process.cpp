// One process per rank on the CPU: the environment variables of the launchers (each error names
// the variable and its value), the TCP rendezvous with 2 and 4 forked processes on 127.0.0.1 and
// its failures (nobody listening, a missing rank, a duplicate rank, a port in use), and the TCP
// communicator's collectives, which must give ThreadCommunicator's bits. Test layer (cpu).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm_script.h"
#include "process_ranks.h"
#include "sciattn/train/process_group.h"
#include "sciattn/train/thread_communicator.h"
#include "train/rendezvous.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;
using Env = std::map<std::string, std::string>;

Status parse(const Env& vars, ProcessEnv* out) {
  return parse_process_env(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      out);
}

// Expects a refusal whose message holds each of `parts`.
void expect_refused(const Env& vars, const std::vector<std::string>& parts) {
  ProcessEnv env;
  Status s = parse(vars, &env);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const std::string& p : parts)
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
}

TEST(ProcessEnv, NothingSetIsOneRank) {
  ProcessEnv env;
  ASSERT_TRUE(parse({}, &env).ok());
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.source, "");
}

TEST(ProcessEnv, TorchrunVariables) {
  ProcessEnv env;
  ASSERT_TRUE(parse({{"RANK", "3"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"MASTER_ADDR", "node7"},
                     {"MASTER_PORT", "29500"}},
                    &env)
                  .ok());
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "node7");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.source, "RANK");
}

TEST(ProcessEnv, OneRankNeedsNoAddress) {
  ProcessEnv env;
  ASSERT_TRUE(parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, &env).ok());
  EXPECT_EQ(env.world_size, 1);
}

TEST(ProcessEnv, SlurmAndOpenMpiWhenRankIsAbsent) {
  ProcessEnv env;
  ASSERT_TRUE(parse({{"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "6"},
                     {"SLURM_LOCALID", "2"},
                     {"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "a"},
                     {"MASTER_PORT", "1"}},
                    &env)
                  .ok());
  EXPECT_EQ(env.source, "SLURM_PROCID");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 2);
  ASSERT_TRUE(parse({{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"MASTER_ADDR", "a"},
                     {"MASTER_PORT", "2"}},
                    &env)
                  .ok());
  EXPECT_EQ(env.source, "OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.local_rank, 1);
  // RANK wins over srun's variables (torchrun inside an srun job).
  ASSERT_TRUE(parse({{"RANK", "0"},
                     {"WORLD_SIZE", "2"},
                     {"SLURM_PROCID", "1"},
                     {"SLURM_NTASKS", "4"},
                     {"MASTER_ADDR", "a"},
                     {"MASTER_PORT", "3"}},
                    &env)
                  .ok());
  EXPECT_EQ(env.source, "RANK");
  EXPECT_EQ(env.world_size, 2);
}

TEST(ProcessEnv, ErrorsNameTheVariableAndValue) {
  const Env addr = {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Env v) {
    v.insert(addr.begin(), addr.end());
    return v;
  };
  expect_refused(with({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), {"RANK=\"x\"", "decimal integer"});
  expect_refused(with({{"RANK", "1 "}, {"WORLD_SIZE", "2"}}), {"RANK=\"1 \""});
  expect_refused(with({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), {"RANK=\"2\"", "[0, 1]"});
  expect_refused(with({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), {"RANK=\"-1\""});
  expect_refused(with({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), {"WORLD_SIZE=\"0\"", "out of range"});
  expect_refused(with({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}),
                 {"WORLD_SIZE=\"99999999999999999999\""});
  expect_refused(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "one"}}),
                 {"LOCAL_RANK=\"one\""});
  expect_refused(with({{"RANK", "0"}}), {"RANK", "WORLD_SIZE is not"});
  expect_refused(with({{"SLURM_PROCID", "0"}}), {"SLURM_NTASKS is not"});
  expect_refused({{"WORLD_SIZE", "2"}}, {"WORLD_SIZE=\"2\"", "RANK is not"});
  expect_refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, {"MASTER_ADDR"});
  expect_refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, {"MASTER_PORT"});
  expect_refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}},
                 {"MASTER_PORT=\"0\"", "[1, 65535]"});
  expect_refused(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
      {"MASTER_PORT=\"70000\""});
}

class Rendezvous : public ::testing::TestWithParam<int> {};

// Rank 0's blob reaches every rank, and after it each rank can talk with rank 0 both ways.
TEST_P(Rendezvous, BlobFromRankZeroReachesEveryRank) {
  const int world = GetParam();
  const std::string blob(1000, 'x');
  const auto results = run_process_ranks(world, [&](const ProcessEnv& env) {
    std::unique_ptr<TcpRendezvous> group;
    RendezvousOptions o;
    o.timeout_seconds = 30;
    Status s = TcpRendezvous::open(env, o, &group);
    if (!s.ok()) return RankResult{s, ""};
    std::string mine = env.rank == 0 ? blob + "!" : "";
    s = group->broadcast_blob(&mine);
    if (!s.ok()) return RankResult{s, ""};
    // An answer to rank 0: the rank, so that rank 0 sees which connection is whose.
    if (env.rank > 0) {
      const int32_t me = env.rank;
      s = group->send(0, &me, sizeof me);
    } else {
      for (int q = 1; q < env.world_size && s.ok(); ++q) {
        int32_t got = -1;
        s = group->recv(q, &got, sizeof got);
        if (s.ok() && got != q) s = Status(StatusCode::kInternal, "wrong rank on a connection");
      }
    }
    return RankResult{s, mine};
  });
  ASSERT_EQ(results.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status.to_string();
    EXPECT_EQ(results[r].bytes, blob + "!") << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Rendezvous, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

TEST(RendezvousErrors, NobodyListeningNamesTheAddress) {
  int port = 0;
  ASSERT_TRUE(pick_free_tcp_port(&port).ok());
  std::unique_ptr<TcpRendezvous> group;
  RendezvousOptions o;
  o.timeout_seconds = 0.5;
  Status s = TcpRendezvous::open(local_env(1, 2, port), o, &group);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port)),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("rank 1 could not reach rank 0"), std::string::npos) << s.message();
}

TEST(RendezvousErrors, UnresolvableAddressIsNamed) {
  ProcessEnv env = local_env(1, 2, 1);
  env.master_addr = "no-such-host.invalid";
  std::unique_ptr<TcpRendezvous> group;
  RendezvousOptions o;
  o.timeout_seconds = 0.2;
  Status s = TcpRendezvous::open(env, o, &group);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("MASTER_ADDR"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no-such-host.invalid"), std::string::npos) << s.message();
}

TEST(RendezvousErrors, RankZeroSaysWhichRanksAreMissing) {
  int port = 0;
  ASSERT_TRUE(pick_free_tcp_port(&port).ok());
  std::unique_ptr<TcpRendezvous> group;
  RendezvousOptions o;
  o.timeout_seconds = 0.5;
  Status s = TcpRendezvous::open(local_env(0, 3, port), o, &group);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("0 of 2 other ranks connected (missing: 1 2)"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("MASTER_PORT=" + std::to_string(port)), std::string::npos);
}

TEST(RendezvousErrors, PortInUseIsNamed) {
  // Hold a port with a listening socket of our own.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  std::unique_ptr<TcpRendezvous> group;
  Status s = TcpRendezvous::open(local_env(0, 2, port), RendezvousOptions{}, &group);
  ::close(fd);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot listen on MASTER_PORT=" + std::to_string(port)),
            std::string::npos)
      << s.message();
}

TEST(RendezvousErrors, DuplicateRankIsRefused) {
  // Ranks 1 and 2 both claim rank 1 of 3.
  const auto results = run_process_ranks(3, [](ProcessEnv env) {
    if (env.rank == 2) env.rank = 1;
    std::unique_ptr<TcpRendezvous> group;
    RendezvousOptions o;
    o.timeout_seconds = 5;
    return RankResult{TcpRendezvous::open(env, o, &group), ""};
  });
  ASSERT_FALSE(results[0].status.ok());
  EXPECT_NE(results[0].status.message().find("as rank 1"), std::string::npos)
      << results[0].status.message();
}

class TcpComm : public ::testing::TestWithParam<int> {};

TEST_P(TcpComm, CollectivesGiveThreadCommunicatorsBits) {
  const int world = GetParam();
  std::printf("inputs: random_floats seeded 1000 + 31 salt + rank\n");
  const auto results = run_process_ranks(world, [](const ProcessEnv& env) {
    std::unique_ptr<Communicator> comm;
    RendezvousOptions o;
    o.timeout_seconds = 30;
    Status s = make_tcp_communicator(env, o, &comm);
    if (!s.ok()) return RankResult{s, ""};
    try {
      return RankResult{Status(), run_script(*comm)};
    } catch (const std::exception& e) {
      return RankResult{Status(StatusCode::kInternal, e.what()), ""};
    }
  });
  std::vector<std::string> want(static_cast<size_t>(world));
  const std::vector<Status> st = run_thread_ranks(world, [&](Communicator& comm) {
    want[static_cast<size_t>(comm.rank())] = run_script(comm);
    return Status();
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].to_string();
    ASSERT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status.to_string();
    EXPECT_FALSE(want[r].empty());
    EXPECT_TRUE(results[r].bytes == want[r]) << "rank " << r << " differs from the thread ranks";
  }
  // Float sums depend on their order, so the byte comparison above checks the order too.
  std::vector<float> x = {1.0f, 1e8f, -1e8f};
  EXPECT_NE((x[0] + x[1]) + x[2], x[0] + (x[1] + x[2]));
}

TEST(TcpCommOneRank, NeedsNoConnection) {
  std::unique_ptr<Communicator> comm;
  ASSERT_TRUE(make_tcp_communicator(local_env(0, 1, 1), RendezvousOptions{}, &comm).ok());
  std::string got = run_script(*comm);
  std::string want;
  run_thread_ranks(1, [&](Communicator& c) {
    want = run_script(c);
    return Status();
  });
  EXPECT_TRUE(got == want);
}

TEST_P(TcpComm, MismatchedCallsAreRefusedOnEveryRank) {
  const int world = GetParam();
  const auto results = run_process_ranks(world, [](const ProcessEnv& env) {
    std::unique_ptr<Communicator> comm;
    RendezvousOptions o;
    o.timeout_seconds = 30;
    Status s = make_tcp_communicator(env, o, &comm);
    if (!s.ok()) return RankResult{s, ""};
    std::vector<float> v(8, 1.0f);
    // The last rank calls another count.
    s = comm->all_reduce_mean(v.data(), env.rank == env.world_size - 1 ? 7 : 8);
    return RankResult{s, ""};
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_FALSE(results[r].status.ok()) << "rank " << r;
    EXPECT_NE(results[r].status.message().find("every rank must call the same collectives"),
              std::string::npos)
        << results[r].status.message();
  }
}

TEST_P(TcpComm, ARankThatExitsFailsTheOthers) {
  const int world = GetParam();
  const auto results = run_process_ranks(world, [](const ProcessEnv& env) {
    std::unique_ptr<Communicator> comm;
    RendezvousOptions o;
    o.timeout_seconds = 30;
    Status s = make_tcp_communicator(env, o, &comm);
    if (!s.ok()) return RankResult{s, ""};
    if (env.rank == 1) return RankResult{Status(), "left"};  // closes its connection
    double x = 1.0;
    return RankResult{comm->all_reduce_sum(&x), ""};
  });
  for (int r = 0; r < world; ++r) {
    if (r == 1) continue;
    ASSERT_FALSE(results[r].status.ok()) << "rank " << r;
    EXPECT_NE(results[r].status.message().find("all_reduce_sum"), std::string::npos)
        << results[r].status.message();
  }
  EXPECT_NE(results[0].status.message().find("rank 1"), std::string::npos)
      << results[0].status.message();
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpComm, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

TEST(NcclCommunicator, WithoutNcclTheErrorSaysHowToGetIt) {
  if (nccl_available()) GTEST_SKIP() << "this build has NCCL (tests/cuda/test_train_nccl.cpp)";
  std::unique_ptr<Communicator> comm;
  Status s = make_nccl_communicator(local_env(0, 2, 1), 0, Stream{}, RendezvousOptions{}, &comm);
  ASSERT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("has none"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("nvidia-nccl-cu13"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace sciattn::train

// Runs a function as the ranks of a process group on this machine: rank 0 in the test's own
// process, ranks 1 .. N-1 in forked children that send their result back through a pipe, every
// rank with a ProcessEnv on 127.0.0.1 and a free port. For the tests of the rendezvous and of
// the multi-process communicators. Test layer (header-only).
//
// Fork without exec: a child must not rely on threads the parent had started (it has none of
// them). OpenMP's thread pool is such a thing, so a test that trains in the children forks them
// before this process has run anything in parallel (ctest runs every case as a process of its
// own). A child that hangs is killed by an alarm after kChildSeconds.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/train/process_group.h"

namespace sciattn::train::testing {

// What one rank returns: its status and the bytes it wants to compare.
struct RankResult {
  Status status;
  std::string bytes;
};

inline constexpr unsigned kChildSeconds = 120;

inline bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

inline std::string read_all(int fd) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    out.append(buf, static_cast<size_t>(k));
  }
  return out;
}

// The environment of `rank` in a local group of `world` ranks on `port`.
inline ProcessEnv local_env(int rank, int world, int port) {
  ProcessEnv env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  env.source = "RANK";
  return env;
}

// Runs fn(env of rank r) on every rank (see the top of this file) and returns the results,
// index = rank. A child that dies without a result gets an error status saying how it ended.
inline std::vector<RankResult> run_process_ranks(
    int world, const std::function<RankResult(const ProcessEnv&)>& fn) {
  int port = 0;
  Status s = pick_free_tcp_port(&port);
  if (!s.ok()) return {RankResult{s, ""}};
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  std::vector<int> pipes(static_cast<size_t>(world), -1);
  for (int r = 1; r < world; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) return {RankResult{Status(StatusCode::kInternal, "pipe() failed"), ""}};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      ::alarm(kChildSeconds);
      RankResult res = fn(local_env(r, world, port));
      const int32_t code = static_cast<int32_t>(res.status.code());
      const uint64_t message = res.status.message().size(), bytes = res.bytes.size();
      const bool ok =
          write_all(fds[1], &code, sizeof code) && write_all(fds[1], &message, sizeof message) &&
          write_all(fds[1], res.status.message().data(), message) &&
          write_all(fds[1], &bytes, sizeof bytes) && write_all(fds[1], res.bytes.data(), bytes);
      ::_exit(ok ? 0 : 3);  // no destructors, no atexit handlers of the parent's test framework
    }
    ::close(fds[1]);
    pids[static_cast<size_t>(r)] = pid;
    pipes[static_cast<size_t>(r)] = fds[0];
  }
  std::vector<RankResult> results(static_cast<size_t>(world));
  results[0] = fn(local_env(0, world, port));
  for (int r = 1; r < world; ++r) {
    const std::string raw = read_all(pipes[static_cast<size_t>(r)]);
    ::close(pipes[static_cast<size_t>(r)]);
    int wstatus = 0;
    ::waitpid(pids[static_cast<size_t>(r)], &wstatus, 0);
    RankResult& res = results[static_cast<size_t>(r)];
    int32_t code = 0;
    uint64_t message = 0, bytes = 0;
    size_t at = 0;
    auto take = [&](void* dst, size_t n) {
      if (at + n > raw.size()) return false;
      raw.copy(static_cast<char*>(dst), n, at);
      at += n;
      return true;
    };
    std::string text;
    bool ok = take(&code, sizeof code) && take(&message, sizeof message);
    if (ok) {
      text.resize(message);
      ok = take(text.data(), message) && take(&bytes, sizeof bytes);
    }
    if (ok) {
      res.bytes.resize(bytes);
      ok = take(res.bytes.data(), bytes);
    }
    if (!ok) {
      res.status = Status(
          StatusCode::kInternal,
          "rank " + std::to_string(r) + " gave no result (" +
              (WIFSIGNALED(wstatus) ? "killed by signal " + std::to_string(WTERMSIG(wstatus))
                                    : "exit status " + std::to_string(WEXITSTATUS(wstatus))) +
              ")");
    } else {
      res.status = Status(static_cast<StatusCode>(code), text);
    }
  }
  return results;
}

}  // namespace sciattn::train::testing

// The local launcher of `sciattn train --nproc-per-node N` (launch_ranks.h). Tools layer.
#include "launch_ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "sciattn/train/process_group.h"

extern char** environ;

namespace sciattn::tools {
namespace {

// How long stopped ranks get to exit after SIGTERM before SIGKILL, and how often the launcher
// looks at its ranks.
constexpr auto kGrace = std::chrono::seconds(10);
constexpr auto kPoll = std::chrono::milliseconds(20);

// This process's arguments, as the kernel recorded them.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  while (start < all.size()) {
    const size_t end = all.find('\0', start);
    args.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return args;
}

int exit_code(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

}  // namespace

int launch_local_ranks(int nproc) {
  const std::vector<std::string> args = own_arguments();
  if (args.empty()) {
    std::cerr << "sciattn train: --nproc-per-node: cannot read this program's arguments "
                 "(/proc/self/cmdline)\n";
    return 1;
  }
  int port = 0;
  const Status ps = train::pick_free_tcp_port(&port);
  if (!ps.ok()) {
    std::cerr << "sciattn train: --nproc-per-node: " << ps.message() << "\n";
    return 1;
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::cout << std::flush;
  std::cerr << std::flush;

  // Each rank's environment, made before any fork: the child only calls async-signal-safe
  // functions (open, dup2, execve, write) before exec, whatever threads this process has.
  const char* const set_here[] = {
      "RANK",        "LOCAL_RANK",  "WORLD_SIZE",        "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", kLocalLaunchVariable};
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    bool ours = false;
    for (const char* name : set_here) {
      const size_t n = std::strlen(name);
      ours = ours || (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=');
    }
    if (!ours) inherited.push_back(*e);
  }
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(nproc), inherited);
  std::vector<std::vector<char*>> envps(static_cast<size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string>& env = envs[static_cast<size_t>(r)];
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back(std::string(kLocalLaunchVariable) + "=1");
    for (std::string& v : env) envps[static_cast<size_t>(r)].push_back(v.data());
    envps[static_cast<size_t>(r)].push_back(nullptr);
  }
  constexpr char kExecFailed[] = "sciattn train: --nproc-per-node: exec of /proc/self/exe failed\n";

  std::vector<pid_t> pids(static_cast<size_t>(nproc), -1);
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "sciattn train: --nproc-per-node: fork() failed: " << std::strerror(errno)
                << "\n";
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGTERM);
      }
      for (pid_t p : pids) {
        if (p > 0) ::waitpid(p, nullptr, 0);
      }
      return 1;
    }
    if (pid == 0) {
      if (r > 0) {
        const int null = ::open("/dev/null", O_WRONLY);
        if (null >= 0) ::dup2(null, STDOUT_FILENO);
      }
      ::execve("/proc/self/exe", argv.data(), envps[static_cast<size_t>(r)].data());
      const ssize_t ignored = ::write(STDERR_FILENO, kExecFailed, sizeof kExecFailed - 1);
      (void)ignored;
      ::_exit(127);
    }
    pids[static_cast<size_t>(r)] = pid;
  }

  // Until a rank fails, block until any rank ends, so that the first to fail is the first seen;
  // then poll while the others are given kGrace to exit.
  int running = nproc, failure = 0;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int wstatus = 0;
    const pid_t got = ::waitpid(-1, &wstatus, failure == 0 ? 0 : WNOHANG);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;  // no children left
    if (got == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGKILL);
        }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(kPoll);
      continue;
    }
    int r = 0;
    while (r < nproc && pids[static_cast<size_t>(r)] != got) ++r;
    if (r == nproc) continue;  // not one of the ranks
    pids[static_cast<size_t>(r)] = -1;
    --running;
    const int code = exit_code(wstatus);
    if (code != 0 && failure == 0) {
      failure = code;
      if (running > 0) {
        std::cerr << "sciattn train: rank " << r << " failed (exit status " << code
                  << "); stopping the other " << running << " rank(s)\n";
      }
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGTERM);
      }
      deadline = std::chrono::steady_clock::now() + kGrace;
    }
  }
  return failure;
}

}  // namespace sciattn::tools

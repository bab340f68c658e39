// Runs the built `sciattn` program (its path is SCIATTN_CLI_PATH, set by CMake) as a user would
// and collects what it prints: shared by the command-line tests. Test layer (cpu).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace sciattn::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `sciattn <args>` through the shell, stdout and stderr together; `prefix` runs first in the
// same shell (e.g. "ulimit -v 4194304; ").
inline CommandResult run_cli(const std::string& args, const std::string& prefix = "") {
  const std::string command = prefix + std::string(SCIATTN_CLI_PATH) + " " + args + " 2>&1";
  CommandResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The same under an address-space limit of `kib` KiB (`ulimit -v`).
inline CommandResult run_cli_limited(const std::string& args, unsigned long kib) {
  return run_cli(args, "ulimit -v " + std::to_string(kib) + "; ");
}

}  // namespace sciattn::testing

// libFuzzer target: the `sciattn` program's argument handling, in-process (tools/cli.h) with
// CommandOptions::check_only, so that a command stops once its flags and the memory its run
// needs are checked, and read_config_files off (the paths are not opened). The input is split at
// NUL bytes into arguments. Every argument list must end in an exit code of 0, 1 or 2 (no crash, no
// uncaught exception, no sanitizer report), and nothing may run. Test layer (tests/fuzz).
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "fuzz_support.h"

namespace {

// Discards everything written to it: the commands' messages and help texts.
struct NullBuffer : std::streambuf {
  int overflow(int c) override { return c; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string current;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  if (!current.empty()) args.push_back(current);
  std::vector<const char*> argv = {"sciattn"};
  for (const std::string& a : args) argv.push_back(a.c_str());

  static NullBuffer null_buffer;
  std::streambuf* out = std::cout.rdbuf(&null_buffer);
  std::streambuf* err = std::cerr.rdbuf(&null_buffer);
  CLI::App app;
  sciattn::tools::CommandOptions options;
  options.check_only = true;
  options.read_config_files = false;
  sciattn::tools::build_cli(app, options);
  const int code = sciattn::tools::run_cli(app, static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(out);
  std::cerr.rdbuf(err);
  sciattn::fuzz::require(code >= 0 && code <= 2, "an exit code other than 0, 1 or 2");
  return 0;
}

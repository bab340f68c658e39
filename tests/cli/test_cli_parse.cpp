// The command-line program's parse and memory checks, in-process (tools/cli.h, tools/run_memory.h):
// what a bad argument list gets, that no exception escapes run_cli, and the byte counts and the
// kernel-file parsers behind "needs X but Y is available". Test layer (tests/cli), label cpu.
#include <gtest/gtest.h>

#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "process_temp_dir.h"
#include "run_memory.h"

namespace sciattn::tools {
namespace {

struct Outcome {
  int code = -1;
  std::string out, err;
};

// Runs the program's parse on `args` (without the program name) with stdout and stderr captured.
Outcome run(const std::vector<std::string>& args, const CommandOptions& options = {true}) {
  CLI::App app;
  build_cli(app, options);
  std::vector<const char*> argv = {"sciattn"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  Outcome r;
  r.code = run_cli(app, static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

void expect_error(const std::vector<std::string>& args, const std::string& named) {
  const Outcome r = run(args);
  std::string joined;
  for (const std::string& a : args) joined += a + " ";
  EXPECT_EQ(r.code, 2) << joined << "\n" << r.err;
  EXPECT_NE(r.err.find(named), std::string::npos) << joined << "\n" << r.err;
}

TEST(CliParse, UnknownCommandIsNamed) {
  expect_error({"frobnicate"}, "unknown command \"frobnicate\"; the commands are demo, evoformer");
  expect_error({}, "a command is required: one of demo, evoformer, layout, sparse");
  expect_error({"--bogus"}, "unknown flag --bogus");
}

TEST(CliParse, HelpCommand) {
  Outcome r = run({"help"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("evoformer"), std::string::npos) << r.out;
  r = run({"help", "sparse"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--masked-keys"), std::string::npos) << r.out;
  expect_error({"help", "nonsense"}, "help: unknown command \"nonsense\"");
}

// CLI11 checks required options before extras; the unknown flag is what the user got wrong.
TEST(CliParse, UnknownFlagIsNamedBeforeAMissingRequiredOne) {
  expect_error({"layout", "--bogus"}, "layout: unknown flag --bogus");
  expect_error({"layout", "--len", "64", "--bogus"}, "layout: unknown flag --bogus");
  expect_error({"evoformer", "extra"}, "evoformer: unexpected argument \"extra\"");
  const Outcome r = run({"layout", "--bogus"});
  EXPECT_EQ(r.err.find("--len is required"), std::string::npos) << r.err;
  expect_error({"layout"}, "--len is required");
}

TEST(CliParse, SeedMustBeAnUnsignedInteger) {
  for (const char* command : {"evoformer", "sparse", "layout"}) {
    std::vector<std::string> args = {command, "--seed", "-1"};
    if (std::string(command) == "layout") args.insert(args.end(), {"--len", "64"});
    expect_error(args, "--seed: must be an integer from 0 to 18446744073709551615; got \"-1\"");
  }
  expect_error({"evoformer", "--seed", "18446744073709551616"}, "got \"18446744073709551616\"");
  EXPECT_EQ(run({"evoformer", "--seed", "18446744073709551615"}).code, 0);
}

TEST(CliParse, MaskedKeysAtMostTheLength) {
  expect_error({"sparse", "--device", "cpu", "--len", "64", "--masked-keys", "100"},
               "--masked-keys 100 is more than --len 64");
  EXPECT_EQ(run({"sparse", "--device", "cpu", "--len", "64", "--masked-keys", "64"}).code, 0);
}

TEST(CliParse, ConfigDirectoryIsNamed) {
  const std::string dir = sciattn::testing::process_temp_dir();
  expect_error({"layout", "--len", "64", "--config", dir}, "\"" + dir + "\" is a directory");
}

// Sizes whose tensors cannot fit are refused before anything is allocated, with what the run
// needs and what the machine has; sizes whose products pass 2^64 as well.
TEST(CliParse, RunsThatCannotFitAreRefusedWithNeedsAndHas) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"evoformer", "-b", "1", "-n", "1", "--len", "10000000000",
                                 "--heads", "1", "--dim", "8"},
        std::vector<std::string>{"evoformer", "--len", "100000000", "--no-check"},
        std::vector<std::string>{"sparse", "--device", "cpu", "--len", "1073741824", "--dim",
                                 "1048576"}}) {
    const Outcome r = run(args);
    EXPECT_EQ(r.code, 2) << args[2] << "\n" << r.err;
    EXPECT_NE(r.err.find("of host memory but"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("is available ("), std::string::npos) << r.err;
  }
  const std::string big = std::to_string(int64_t{1} << 40);
  const Outcome r =
      run({"evoformer", "-b", big, "-n", big, "--len", big, "--heads", big, "--dim", big});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("needs more than 16 EiB of host memory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("null pointer"), std::string::npos) << r.err;
}

TEST(CliParse, NoExceptionEscapes) {
  for (auto thrower :
       {+[] { throw std::bad_alloc(); }, +[] { throw std::runtime_error("boom"); }}) {
    CLI::App app;
    app.add_subcommand("oom", "")->callback(thrower);
    const char* argv[] = {"sciattn", "oom"};
    std::ostringstream err;
    std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
    const int code = run_cli(app, 2, argv);
    std::cerr.rdbuf(old_err);
    EXPECT_EQ(code, 1) << err.str();
    EXPECT_TRUE(err.str().find("error: out of memory: an allocation failed while running `oom`") !=
                    std::string::npos ||
                err.str().find("error: boom") != std::string::npos)
        << err.str();
  }
}

TEST(ByteCount, SaturatesInsteadOfWrapping) {
  EXPECT_EQ(ByteCount::of_tensor({2, 3}, 4).bytes(), 24u);
  const ByteCount huge = ByteCount::of_tensor({int64_t{1} << 40, int64_t{1} << 40}, 4);
  EXPECT_TRUE(huge.saturated());
  EXPECT_EQ(huge.to_string(), "more than 16 EiB");
  EXPECT_TRUE((huge + ByteCount(1)).saturated());
  EXPECT_EQ(huge.times(0).bytes(), 0u);
  EXPECT_EQ(ByteCount::of_tensor({int64_t{1} << 40, 0}, 4).bytes(), 0u);
  EXPECT_TRUE((ByteCount(UINT64_MAX) + ByteCount(1)).saturated());
  EXPECT_EQ(ByteCount(uint64_t{5} << 40).to_string(), "5.00 TiB");
}

TEST(RunMemory, ParsesTheKernelFiles) {
  EXPECT_EQ(parse_meminfo_available("MemTotal: 100 kB\nMemFree: 5 kB\nMemAvailable:   21 kB\n"),
            21u * 1024);
  EXPECT_FALSE(parse_meminfo_available("MemTotal: 100 kB\n").has_value());
  const auto v1 = parse_memory_cgroup("9:name=systemd:/\n5:cpu,memory:/job/7\n0::/other\n");
  ASSERT_TRUE(v1.has_value());
  EXPECT_FALSE(v1->v2);
  EXPECT_EQ(v1->path, "/job/7");
  const auto v2 = parse_memory_cgroup("0::/user.slice/x.scope\n");
  ASSERT_TRUE(v2.has_value());
  EXPECT_TRUE(v2->v2);
  EXPECT_EQ(v2->path, "/user.slice/x.scope");
  EXPECT_FALSE(parse_memory_cgroup("1:cpu:/\n").has_value());
  EXPECT_EQ(parse_cgroup_limit("4294967296\n"), 4294967296u);
  EXPECT_FALSE(parse_cgroup_limit("max\n").has_value());
  EXPECT_FALSE(parse_cgroup_limit("9223372036854771712\n").has_value());
  EXPECT_EQ(parse_memory_stat("cache 5\ninactive_file 4096\nactive_file 7\n", "inactive_file"),
            4096u);
  EXPECT_EQ(parse_memory_stat("total_inactive_file 9\n", "inactive_file"), 0u);
}

TEST(RunMemory, CheckFitsSaysWhatItNeedsAndHas) {
  const MemoryAvailable some{uint64_t{1} << 30, "a test limit"};
  EXPECT_TRUE(check_fits("x", ByteCount(1000), some, "host", "advice").ok());
  const Status s = check_fits("this run", ByteCount(uint64_t{3} << 30), some, "host", "go small");
  EXPECT_EQ(s.message(),
            "this run needs about 3.00 GiB of host memory but 1.00 GiB is available (a test "
            "limit); go small");
  EXPECT_TRUE(check_fits("x", ByteCount(UINT64_MAX), MemoryAvailable{}, "host", "").ok());
}

}  // namespace
}  // namespace sciattn::tools

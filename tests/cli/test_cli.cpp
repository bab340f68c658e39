// Tests of the `sciattn` command-line program: it runs, reports errors below tolerance, and
// answers bad flags with usage and a non-zero exit. Runs the built binary as a user would.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_runner.h"

namespace {

using sciattn::testing::CommandResult;
using sciattn::testing::run_cli;
using sciattn::testing::run_cli_limited;

// Output of a --json command may be preceded by notes on stderr; the JSON starts at '['.
nlohmann::json parse_json_output(const std::string& output) {
  const size_t start = output.find('[');
  EXPECT_NE(start, std::string::npos) << output;
  return nlohmann::json::parse(output.substr(start == std::string::npos ? 0 : start));
}

void expect_all_passed(const nlohmann::json& runs, size_t expected_runs) {
  ASSERT_TRUE(runs.is_array());
  EXPECT_EQ(runs.size(), expected_runs);
  for (const auto& run : runs) {
    SCOPED_TRACE(run.dump());
    ASSERT_TRUE(run.contains("max_relative_error"));
    EXPECT_TRUE(run["passed"].get<bool>());
    EXPECT_LE(run["max_relative_error"].get<double>(), run["tolerance"].get<double>());
    EXPECT_GT(run["forward_ms"].get<double>(), 0.0);
    // The CPU's tiled forward takes per-thread scratch; the GPU's forward kernel takes none.
    // (Runs without a "device" field, the block-sparse ones, run on the CPU.)
    if (run.value("device", std::string("cpu")) == "cpu") {
      EXPECT_GT(run["forward_extra_bytes"].get<double>(), 0.0);
    }
  }
}

TEST(Cli, DemoRunsEveryFormBelowTolerance) {
  const CommandResult r = run_cli("demo --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json runs = parse_json_output(r.output);
  expect_all_passed(runs, 4);
  for (const auto& run : runs) EXPECT_TRUE(run.contains("backward_ms")) << run.dump();
}

TEST(Cli, DemoPrintsATable) {
  const CommandResult r = run_cli("demo --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* form : {"MSA row", "MSA column", "triangle start", "triangle end"}) {
    EXPECT_NE(r.output.find(form), std::string::npos) << form << "\n" << r.output;
  }
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  // The block-sparse section follows the Evoformer table.
  for (const char* part : {"Block-sparse", "bigbird", "composite", "bslongformer"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
}

TEST(Cli, EvoformerOneConfigurationEveryDtype) {
  for (const char* dtype : {"f32", "f16", "bf16"}) {
    const CommandResult r = run_cli(std::string("evoformer --batch 2 --n 3 --len 17 --heads 2 "
                                                "--dim 24 --backward --repeat 1 --json --dtype ") +
                                    dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_all_passed(parse_json_output(r.output), 1);
  }
}

// --device cuda either runs the kernels and matches the reference (a CUDA build on a GPU) or
// says plainly why it cannot (no CUDA build, or no device).
TEST(Cli, EvoformerOnCudaRunsOrExplains) {
  for (const char* dtype : {"f32", "bf16"}) {
    const CommandResult r =
        run_cli(std::string("evoformer --device cuda --n 3 --len 70 --heads 2 --dim 32 --backward "
                            "--repeat 1 --json --dtype ") +
                dtype);
    if (r.exit_code == 0) {
      expect_all_passed(parse_json_output(r.output), 1);
    } else {
      EXPECT_TRUE(r.output.find("no CUDA support") != std::string::npos ||
                  r.output.find("no CUDA device") != std::string::npos)
          << r.output;
    }
  }
}

TEST(Cli, EvoformerBoolMaskTransposedNoBias2) {
  const CommandResult r = run_cli(
      "evoformer --n 5 --len 5 --heads 3 --dim 8 --bool-mask --no-bias2 --transposed --backward "
      "--repeat 1 --threads 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_all_passed(parse_json_output(r.output), 1);
}

TEST(Cli, BadFlagExitsNonZeroWithUsage) {
  for (const char* args : {"evoformer --bogus", "evoformer --len 0", "evoformer --dtype f64",
                           "demo --device tpu", "nonsense", ""}) {
    SCOPED_TRACE(args);
    const CommandResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << r.output;
  }
}

TEST(Cli, HelpOnEveryCommand) {
  for (const char* args :
       {"--help", "demo --help", "evoformer --help", "layout --help", "sparse --help"}) {
    SCOPED_TRACE(args);
    const CommandResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << r.output;
  }
}

TEST(Cli, ConflictingFlagsAreExplained) {
  const CommandResult r = run_cli("evoformer --no-bias1 --bool-mask");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--bool-mask"), std::string::npos) << r.output;
}

TEST(Cli, SparseBothPathsEveryDtype) {
  for (const char* path : {"fused", "composite"}) {
    for (const char* dtype : {"f32", "f16", "bf16"}) {
      const std::string args = std::string(
                                   "sparse --device cpu --mode bigbird --heads 2 --len 200 "
                                   "--dim 16 --backward --repeat 1 --json --algorithm ") +
                               path + " --dtype " + dtype;
      SCOPED_TRACE(args);
      const CommandResult r = run_cli(args);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const nlohmann::json runs = parse_json_output(r.output);
      expect_all_passed(runs, 1);
      EXPECT_EQ(runs[0]["padded_len"].get<int>(), 208) << "200 is padded to the block (16)";
    }
  }
}

TEST(Cli, SparseLayoutFlagsAndTable) {
  const CommandResult r = run_cli(
      "sparse --device cpu --mode fixed --attention unidirectional --num-local-blocks 2 --causal "
      "--heads 2 --block 32 --len 256 --dim 8 --masked-keys 5 --backward --repeat 1 --threads 3 "
      "--path composite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fixed causal"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("composite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ok"), std::string::npos) << r.output;
}

TEST(Cli, SparseBadLayoutFlagsAreExplained) {
  for (const auto& [args, named] :
       {std::pair<const char*, const char*>{"sparse --mode nonsense", "--mode"},
        {"sparse --mode fixed --num-random-blocks 2", "--num-random-blocks"},
        {"sparse --mode bigbird --attention sideways", "--attention"},
        {"sparse --block 24", "block"},
        {"sparse --mode bigbird --len 64 --max-seq-length 32", "max_seq_length"}}) {
    SCOPED_TRACE(args);
    const CommandResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(named), std::string::npos) << r.output;
  }
  const CommandResult r = run_cli("sparse --dtype f64");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("Usage"), std::string::npos) << r.output;
}

// --device cuda runs the GPU kernels and matches the CPU reference (a CUDA build on a GPU), or
// says plainly why it cannot: no CUDA build or no device, or (while the block-sparse kernels are
// being written) the library's not-supported message naming the op.
TEST(Cli, SparseOnCudaRunsOrExplains) {
  for (const char* algorithm : {"fused", "composite"}) {
    const std::string args = std::string(
                                 "sparse --device cuda --mode bigbird --heads 2 --len 200 "
                                 "--dim 64 --backward --repeat 1 --json --dtype bf16 "
                                 "--algorithm ") +
                             algorithm;
    SCOPED_TRACE(args);
    const CommandResult r = run_cli(args);
    if (r.exit_code == 0) {
      const nlohmann::json runs = parse_json_output(r.output);
      expect_all_passed(runs, 1);
      EXPECT_EQ(runs[0]["device"].get<std::string>(), "cuda");
    } else {
      EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
      EXPECT_TRUE(r.output.find("no CUDA support") != std::string::npos ||
                  r.output.find("no CUDA device") != std::string::npos ||
                  r.output.find("not supported") != std::string::npos ||
                  r.output.find("not yet") != std::string::npos)
          << r.output;
    }
  }
}

#ifndef SCIATTN_CLI_HAS_CUDA
// In a build without CUDA, --device cuda fails at once with one message that says so and how to
// get CUDA (rebuild here, or run on a machine with a GPU), for every command that takes it: no
// table, no repeated errors.
TEST(Cli, DeviceCudaWithoutCudaBuildIsExplained) {
  for (const char* args : {"sparse --device cuda --len 64 --heads 1",
                           "evoformer --device cuda --n 2 --len 8", "demo --device cuda"}) {
    SCOPED_TRACE(args);
    const CommandResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output.find("--device cuda: this build of sciattn has no CUDA support"), 7u)
        << r.output;  // after "error: ", the first and only line
    EXPECT_EQ(r.output.find("error:", 1), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("--device cpu"), std::string::npos) << r.output;
  }
}
#endif

// `--help` shows every option's default: `sciattn evoformer` with no flags runs the shape its help
// names.
TEST(Cli, HelpShowsTheDefaults) {
  const CommandResult evo = run_cli("evoformer --help");
  ASSERT_EQ(evo.exit_code, 0) << evo.output;
  for (const char* shown :
       {"alone runs [1, 32, 64, 4, 32]", "-b,--batch INT:INT in [1 - 1099511627776]=1",
        "-l,--len INT:INT in [1 - 1099511627776]=64", "{f32,f16,bf16}=f32",
        "--repeat INT:INT in [1 - 100000]=3", "--seed UINT:UINT=0"}) {
    EXPECT_NE(evo.output.find(shown), std::string::npos) << shown << "\n" << evo.output;
  }
  const CommandResult demo = run_cli("demo --help");
  EXPECT_NE(demo.output.find("=auto"), std::string::npos) << demo.output;
  const CommandResult sparse = run_cli("sparse --help");
  for (const char* shown : {"(default 512)", "(default 64)", "(default 0)", "(default 3)"}) {
    EXPECT_NE(sparse.output.find(shown), std::string::npos) << shown << "\n" << sparse.output;
  }
  const CommandResult layout = run_cli("layout --help");
  for (const char* shown : {"fixed (default)", "(default 1)", "16 (default)", "(default: none)"}) {
    EXPECT_NE(layout.output.find(shown), std::string::npos) << shown << "\n" << layout.output;
  }
}

// Under an address-space limit (`ulimit -v`, which the memory check reads like a cgroup limit)
// runs that do not fit are refused at once, saying what they need and what the limit leaves, and
// never abort. Not under the sanitizers, whose shadow memory cannot live under such a limit.
TEST(Cli, RunsBeyondAMemoryLimitAreRefused) {
  for (const char* args : {"evoformer --len 50000", "evoformer --len 50000 --backward --no-check",
                           "layout --len 1048576 --block 16", "layout --len 1048576 --json",
                           "sparse --device cpu --len 65536 --dim 4096"}) {
    SCOPED_TRACE(args);
    const CommandResult r = run_cli_limited(args, 4u << 20);  // 4 GiB, in KiB
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("of host memory but"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the address-space limit (ulimit -v) of 4.00 GiB"), std::string::npos)
        << r.output;
  }
}

// `sciattn layout` and `sciattn sparse` share their layout flags (tools/layout_flags.h): the same
// flags work, and the same mistakes get the same message, in both.
TEST(Cli, LayoutAndSparseShareLayoutFlags) {
  const CommandResult ok = run_cli(
      "layout --mode bslongformer --heads 2 --block 32 --len 256 --num-sliding-window-blocks 5 "
      "--global-block-indices 0,3 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const nlohmann::json j = nlohmann::json::parse(ok.output);
  EXPECT_EQ(j["config"]["num_sliding_window_blocks"].get<int>(), 5);
  EXPECT_EQ(j["config"]["global_block_indices"], nlohmann::json({0, 3}));
  EXPECT_EQ(j["num_heads"].get<int>(), 2);
  for (const char* command : {"layout --len 64", "sparse --device cpu --len 64"}) {
    const CommandResult r = run_cli(std::string(command) + " --mode fixed --num-random-blocks 2");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--num-random-blocks does not apply to --mode fixed; it is a "
                            "parameter of: variable, bigbird"),
              std::string::npos)
        << command << "\n"
        << r.output;
  }
}

}  // namespace

// The subcommands of the `sciattn` program. Tools layer: thin users of the public API only.
// Each add_*_command registers a subcommand with its flags and a callback on `app`. A callback
// that fails throws CLI::RuntimeError(exit_code) after printing its message to stderr. Each
// subcommand shows its options' defaults in --help.
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>

#include "sciattn/device.h"

namespace sciattn::tools {

// How the commands run.
struct CommandOptions {
  // Stop once the flags and the memory the run needs are checked, running nothing (the argument
  // fuzz target).
  bool check_only = false;
  // Read the files that --config names. The argument fuzz target turns it off: a generated path
  // such as /dev/stdin would block, and the JSON parser has a fuzz target of its own.
  bool read_config_files = true;
};

void add_demo_command(CLI::App& app, const CommandOptions& options = {});
void add_evoformer_command(CLI::App& app, const CommandOptions& options = {});
void add_layout_command(CLI::App& app, const CommandOptions& options = {});
void add_sparse_command(CLI::App& app, const CommandOptions& options = {});
// The GPT trainer (cmd_train.cpp, cmd_data.cpp; cmd_train_unavailable.cpp in a build without it).
void add_train_command(CLI::App& app);
void add_data_command(CLI::App& app);

// Accepts an integer from 0 to 2^64 - 1 (CLI11 itself would wrap "-1" into an unsigned option),
// for the seeds.
CLI::Validator unsigned_integer();

// Ends a command at once, with one message saying what is missing and how to get it, when
// `device` is kCuda and this build or machine cannot run CUDA (device_mirror.h's check).
void require_usable_device(Device device);

// The block-sparse section of `sciattn demo` (in cmd_sparse.cpp): a few sparse self-attention
// runs on `device` (CPU threads: `threads`, 0 = all), printed as a table (or a JSON array) on
// `out`; errors go to `err`. Returns 0, or 1 when a run failed or exceeded its tolerance.
int run_sparse_demo(bool json, Device device, int threads, std::ostream& out, std::ostream& err);

}  // namespace sciattn::tools

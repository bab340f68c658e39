// The layout flags that `sciattn layout` and `sciattn sparse` share: DeepSpeed's sparsity-config
// parameters under their own names, a DeepSpeed JSON config, and the config they make. Tools
// layer (public API only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sciattn/block_sparse.h"

namespace sciattn::tools {

// The exit code of a command given bad flags.
constexpr int kExitBadInput = 2;

// Prints "error: <message>" on stderr and ends the command with kExitBadInput.
[[noreturn]] void fail_bad_input(const std::string& message);

// The flags, as parsed. Parameter flags have no CLI default: the config's own default (which
// differs between modes, e.g. num_random_blocks) applies unless the flag is given.
struct LayoutFlags {
  std::string mode;
  int64_t heads = 1;
  int64_t block = kDefaultBlock;
  std::string config_path;
  // CommandOptions::read_config_files: false in the argument fuzz target, whose --config paths
  // are not read.
  bool read_config_file = true;

  bool different_layout_per_head = false;
  int64_t num_local_blocks = 0;
  int64_t num_global_blocks = 0;
  std::string attention;
  bool horizontal_global_attention = false;
  int64_t num_different_global_patterns = 0;
  int64_t num_random_blocks = 0;
  std::vector<int64_t> local_window_blocks;
  std::vector<int64_t> global_block_indices;
  std::vector<int64_t> global_block_end_indices;
  int64_t num_sliding_window_blocks = 0;

  CLI::Option* mode_opt = nullptr;
  CLI::Option* block_opt = nullptr;
  CLI::Option* config_opt = nullptr;
  // One per parameter flag, in the order config_from_flags applies them.
  std::vector<CLI::Option*> param_opts;
};

// Registers --mode, --heads (default `default_heads`), --block, --config and DeepSpeed's
// parameter flags on `cmd`, writing into `flags` (which must outlive the command's callback).
void add_layout_flags(CLI::App* cmd, LayoutFlags* flags, int64_t default_heads);

// The config to build: from --config (then flags given override it) or from --mode's defaults
// (fixed when no --mode), with `seed` for the random blocks. A flag that does not apply to the
// mode, an unknown mode or direction, or an invalid config ends the command (fail_bad_input),
// naming the flag or the parameter.
SparsityConfig config_from_flags(const LayoutFlags& flags, uint64_t seed);

}  // namespace sciattn::tools

// `sciattn layout`: builds a block-sparse layout from flags named after DeepSpeed's parameters or
// from a DeepSpeed JSON config, and prints it as 0/1 grids (or JSON). Tools layer: public API only.
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "layout_flags.h"
#include "run_memory.h"
#include "sciattn/block_sparse.h"

namespace sciattn::tools {
namespace {

template <class... Ts>
struct Overload : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overload(Ts...) -> Overload<Ts...>;

// The flags, as parsed: the shared layout flags (layout_flags.h) and this command's own.
struct LayoutArgs {
  LayoutFlags layout;
  int64_t len = 0;
  uint64_t seed = 0;
  int64_t max_seq_length = 0;
  bool json = false;
  CLI::Option* max_seq_length_opt = nullptr;
};

// The config's parameters under DeepSpeed's names.
nlohmann::json config_json(const SparsityConfig& config) {
  nlohmann::json j;
  j["mode"] = sparsity_mode_name(sparsity_mode(config));
  j["block"] = sparsity_common(config).block;
  auto ends = [](const std::optional<std::vector<int64_t>>& e) {
    return e ? nlohmann::json(*e) : nlohmann::json(nullptr);
  };
  std::visit(Overload{
                 [&](const DenseSparsityConfig& c) {
                   j["different_layout_per_head"] = c.different_layout_per_head;
                 },
                 [&](const FixedSparsityConfig& c) {
                   j["different_layout_per_head"] = c.different_layout_per_head;
                   j["num_local_blocks"] = c.num_local_blocks;
                   j["num_global_blocks"] = c.num_global_blocks;
                   j["attention"] = attention_direction_name(c.attention);
                   j["horizontal_global_attention"] = c.horizontal_global_attention;
                   j["num_different_global_patterns"] = c.num_different_global_patterns;
                 },
                 [&](const VariableSparsityConfig& c) {
                   j["different_layout_per_head"] = c.different_layout_per_head;
                   j["num_random_blocks"] = c.num_random_blocks;
                   j["local_window_blocks"] = c.local_window_blocks;
                   j["global_block_indices"] = c.global_block_indices;
                   j["global_block_end_indices"] = ends(c.global_block_end_indices);
                   j["attention"] = attention_direction_name(c.attention);
                   j["horizontal_global_attention"] = c.horizontal_global_attention;
                 },
                 [&](const BigBirdSparsityConfig& c) {
                   j["different_layout_per_head"] = c.different_layout_per_head;
                   j["num_random_blocks"] = c.num_random_blocks;
                   j["num_sliding_window_blocks"] = c.num_sliding_window_blocks;
                   j["num_global_blocks"] = c.num_global_blocks;
                   j["attention"] = attention_direction_name(c.attention);
                 },
                 [&](const BSLongformerSparsityConfig& c) {
                   j["different_layout_per_head"] = c.different_layout_per_head;
                   j["num_sliding_window_blocks"] = c.num_sliding_window_blocks;
                   j["global_block_indices"] = c.global_block_indices;
                   j["global_block_end_indices"] = ends(c.global_block_end_indices);
                   j["attention"] = attention_direction_name(c.attention);
                 },
                 [&](const LocalSlidingWindowSparsityConfig& c) {
                   j["num_sliding_window_blocks"] = c.num_sliding_window_blocks;
                   j["attention"] = attention_direction_name(c.attention);
                 },
                 [&](const UserSparsityConfig&) {},
             },
             config);
  return j;
}

void print_json(const LayoutArgs& a, const SparsityConfig& config, const Layout& layout) {
  nlohmann::json j;
  j["config"] = config_json(config);
  j["num_heads"] = layout.num_heads;
  j["seed"] = a.seed;
  j["seq_len"] = a.len;
  if (a.max_seq_length_opt->count() > 0) j["max_seq_length"] = a.max_seq_length;
  j["num_blocks"] = layout.num_row_blocks;
  std::vector<int64_t> per_head;
  for (int64_t h = 0; h < layout.num_heads; ++h) per_head.push_back(layout_head_nnz(layout, h));
  j["nnz"] = layout_nnz(layout);
  j["nnz_per_head"] = per_head;
  j["density"] = layout_density(layout);
  j["max_row_nnz"] = layout_max_row_nnz(layout);
  // "layout": [num_heads][rows][cols] of 0/1, loadable as a tensor as is. Written row by row: a
  // JSON tree of it would take 16 bytes per block, which at 2^32 blocks is 64 GiB.
  std::string head = j.dump();
  head.pop_back();  // the closing brace
  std::cout << head << ",\"layout\":[";
  std::string row;
  for (int64_t h = 0; h < layout.num_heads; ++h) {
    std::cout << (h ? ",[" : "[");
    for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
      row.assign(r ? ",[" : "[");
      for (int64_t c = 0; c < layout.num_col_blocks; ++c) {
        if (c) row += ',';
        row += layout.at(h, r, c) ? '1' : '0';
      }
      row += ']';
      std::cout << row;
    }
    std::cout << "]";
  }
  std::cout << "]}\n";
}

void print_text(const LayoutArgs& a, const SparsityConfig& config, const Layout& layout) {
  std::cout << to_string(config) << "\n";
  std::cout << "seq_len " << a.len;
  if (a.max_seq_length_opt->count() > 0) {
    std::cout << " (crop of the layout for max_seq_length " << a.max_seq_length << ")";
  }
  std::cout << ": " << layout.num_row_blocks << " x " << layout.num_col_blocks << " blocks of "
            << sparsity_common(config).block << " x " << sparsity_common(config).block
            << " tokens per head\n";
  std::cout << layout_to_string(layout);
  std::cout << "nnz: " << layout_nnz(layout) << " (per head:";
  for (int64_t h = 0; h < layout.num_heads; ++h) std::cout << " " << layout_head_nnz(layout, h);
  std::cout << ")\n";
  std::cout << "density: " << layout_density(layout) << " (" << 100.0 * layout_density(layout)
            << "%)\n";
}

// Ends the command, saying what it needs and has, when the layout (one byte per block, and the
// layout it is cropped from) and its printed grids would not fit in the memory available. A
// layout past kMaxLayoutEntries, or a length that is not a multiple of the block, is left to
// make_layout, whose message names the parameter.
void check_layout_memory(const LayoutArgs& a, const SparsityConfig& config) {
  const SparsityCommon& common = sparsity_common(config);
  const bool crop = a.max_seq_length_opt->count() > 0;
  const int64_t n = a.len / common.block, full = crop ? a.max_seq_length / common.block : n;
  const ByteCount full_blocks = ByteCount::of_tensor({common.num_heads, full, full}, 1);
  if (a.len % common.block != 0 || full_blocks > static_cast<uint64_t>(kMaxLayoutEntries)) return;
  ByteCount needed = full_blocks;
  if (crop) needed += ByteCount::of_tensor({common.num_heads, n, n}, 1);
  // The text grids are built whole: a character per block and a newline per row.
  if (!a.json) needed += ByteCount::of_tensor({common.num_heads, n, n + 1}, 1);
  const Status s = check_fits("this layout ([num_heads, seq_len / block, seq_len / block] = [" +
                                  std::to_string(common.num_heads) + ", " + std::to_string(n) +
                                  ", " + std::to_string(n) + "])",
                              needed, host_memory_available(), "host",
                              "use a larger --block or a shorter --len");
  if (!s.ok()) fail_bad_input(s.message());
}

void run_layout(LayoutArgs& a, const CommandOptions& options) {
  a.layout.read_config_file = options.read_config_files;
  const SparsityConfig config = config_from_flags(a.layout, a.seed);
  check_layout_memory(a, config);
  if (options.check_only) return;
  Layout layout;
  Status s = a.max_seq_length_opt->count() > 0
                 ? make_layout_for_length(config, a.max_seq_length, a.len, &layout)
                 : make_layout(config, a.len, &layout);
  if (!s.ok()) fail_bad_input(s.message());
  if (a.json) {
    print_json(a, config, layout);
  } else {
    print_text(a, config, layout);
  }
}

}  // namespace

void add_layout_command(CLI::App& app, const CommandOptions& options) {
  auto args = std::make_shared<LayoutArgs>();
  LayoutArgs& a = *args;
  CLI::App* cmd = app.add_subcommand(
      "layout",
      "Print a block-sparse attention layout (DeepSpeed's sparsity configs) as 0/1 grids, one "
      "per head, with its nnz and density. Parameters not given take DeepSpeed's class "
      "defaults for the mode.");
  add_layout_flags(cmd, &a.layout, /*default_heads=*/1);
  cmd->add_option("--len,--seq-len", a.len, "sequence length in tokens, a multiple of --block")
      ->required();
  cmd->add_option("--seed", a.seed,
                  "seed of the random blocks (variable, bigbird): the layout equals "
                  "DeepSpeed's after random.seed(seed) (default 0)")
      ->check(unsigned_integer());
  a.max_seq_length_opt = cmd->add_option(
      "--max-seq-length", a.max_seq_length,
      "print what SparseSelfAttention(max_seq_length) uses for --len: the top-left crop of the "
      "layout built for this length (default: none, the layout built for --len itself)");
  cmd->add_flag("--json", a.json, "print JSON instead of grids");

  cmd->callback([args, options]() { run_layout(*args, options); });
}

}  // namespace sciattn::tools

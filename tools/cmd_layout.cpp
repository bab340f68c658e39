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
#include "sciattn/block_sparse.h"

namespace sciattn::tools {
namespace {

constexpr int kExitBadInput = 2;

// The modes a user can ask for here: DeepSpeed's JSON modes plus local_sliding_window.
constexpr SparsityMode kCliModes[] = {
    SparsityMode::kDense,   SparsityMode::kFixed,        SparsityMode::kVariable,
    SparsityMode::kBigBird, SparsityMode::kBSLongformer, SparsityMode::kLocalSlidingWindow};

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

template <class... Ts>
struct Overload : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overload(Ts...) -> Overload<Ts...>;

// The flags, as parsed. Parameter flags have no CLI default: the config's own default (which
// differs between modes, e.g. num_random_blocks) applies unless the flag is given.
struct LayoutArgs {
  std::string mode;
  int64_t heads = 1;
  int64_t block = kDefaultBlock;
  int64_t len = 0;
  uint64_t seed = 0;
  int64_t max_seq_length = 0;
  std::string config_path;
  bool json = false;

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
  CLI::Option* seed_opt = nullptr;
  CLI::Option* max_seq_length_opt = nullptr;
  CLI::Option* config_opt = nullptr;
  // One per parameter flag, in the order of `params` below.
  std::vector<CLI::Option*> param_opts;
};

// Calls `setter` on the config when one of its overloads takes the config's type; otherwise the
// flag does not apply to the mode, which is an error that lists the modes it applies to.
template <typename Setter>
void set_param(SparsityConfig& config, const CLI::Option* opt, Setter setter) {
  if (opt->count() == 0) return;
  auto takes = [&](SparsityConfig& c) {
    bool applied = false;
    std::visit(
        [&](auto& alternative) {
          if constexpr (std::is_invocable_v<Setter&, decltype(alternative)>) {
            setter(alternative);
            applied = true;
          }
        },
        c);
    return applied;
  };
  if (takes(config)) return;
  std::string modes;
  for (SparsityMode m : kCliModes) {
    SparsityConfig probe = default_sparsity_config(m, 1);
    if (takes(probe)) modes += (modes.empty() ? "" : ", ") + std::string(sparsity_mode_name(m));
  }
  fail(opt->get_name() + " does not apply to --mode " + sparsity_mode_name(sparsity_mode(config)) +
       "; it is a parameter of: " + modes);
}

AttentionDirection attention_from(const std::string& text) {
  auto d = parse_attention_direction(text);
  if (!d) fail("--attention must be bidirectional or unidirectional; got \"" + text + "\"");
  return *d;
}

void apply_params(const LayoutArgs& a, SparsityConfig& config) {
  const auto& o = a.param_opts;
  size_t i = 0;
  set_param(config, o[i++],
            Overload{[&](DenseSparsityConfig& c) {
                       c.different_layout_per_head = a.different_layout_per_head;
                     },
                     [&](FixedSparsityConfig& c) {
                       c.different_layout_per_head = a.different_layout_per_head;
                     },
                     [&](VariableSparsityConfig& c) {
                       c.different_layout_per_head = a.different_layout_per_head;
                     },
                     [&](BigBirdSparsityConfig& c) {
                       c.different_layout_per_head = a.different_layout_per_head;
                     },
                     [&](BSLongformerSparsityConfig& c) {
                       c.different_layout_per_head = a.different_layout_per_head;
                     }});
  set_param(config, o[i++],
            Overload{[&](FixedSparsityConfig& c) { c.num_local_blocks = a.num_local_blocks; }});
  set_param(config, o[i++],
            Overload{[&](FixedSparsityConfig& c) { c.num_global_blocks = a.num_global_blocks; },
                     [&](BigBirdSparsityConfig& c) { c.num_global_blocks = a.num_global_blocks; }});
  set_param(
      config, o[i++],
      Overload{
          [&](FixedSparsityConfig& c) { c.attention = attention_from(a.attention); },
          [&](VariableSparsityConfig& c) { c.attention = attention_from(a.attention); },
          [&](BigBirdSparsityConfig& c) { c.attention = attention_from(a.attention); },
          [&](BSLongformerSparsityConfig& c) { c.attention = attention_from(a.attention); },
          [&](LocalSlidingWindowSparsityConfig& c) { c.attention = attention_from(a.attention); }});
  set_param(config, o[i++],
            Overload{[&](FixedSparsityConfig& c) {
                       c.horizontal_global_attention = a.horizontal_global_attention;
                     },
                     [&](VariableSparsityConfig& c) {
                       c.horizontal_global_attention = a.horizontal_global_attention;
                     }});
  set_param(config, o[i++], Overload{[&](FixedSparsityConfig& c) {
              c.num_different_global_patterns = a.num_different_global_patterns;
            }});
  set_param(config, o[i++],
            Overload{[&](VariableSparsityConfig& c) { c.num_random_blocks = a.num_random_blocks; },
                     [&](BigBirdSparsityConfig& c) { c.num_random_blocks = a.num_random_blocks; }});
  set_param(config, o[i++], Overload{[&](VariableSparsityConfig& c) {
              c.local_window_blocks = a.local_window_blocks;
            }});
  set_param(
      config, o[i++],
      Overload{
          [&](VariableSparsityConfig& c) { c.global_block_indices = a.global_block_indices; },
          [&](BSLongformerSparsityConfig& c) { c.global_block_indices = a.global_block_indices; }});
  set_param(config, o[i++],
            Overload{[&](VariableSparsityConfig& c) {
                       c.global_block_end_indices = a.global_block_end_indices;
                     },
                     [&](BSLongformerSparsityConfig& c) {
                       c.global_block_end_indices = a.global_block_end_indices;
                     }});
  set_param(config, o[i++],
            Overload{[&](BigBirdSparsityConfig& c) {
                       c.num_sliding_window_blocks = a.num_sliding_window_blocks;
                     },
                     [&](BSLongformerSparsityConfig& c) {
                       c.num_sliding_window_blocks = a.num_sliding_window_blocks;
                     },
                     [&](LocalSlidingWindowSparsityConfig& c) {
                       c.num_sliding_window_blocks = a.num_sliding_window_blocks;
                     }});
}

// The config to build: from --config (then flags given override it) or from --mode's defaults.
SparsityConfig config_from_args(const LayoutArgs& a) {
  SparsityConfig config;
  std::optional<SparsityMode> mode;
  if (a.mode_opt->count() > 0) {
    mode = parse_sparsity_mode(a.mode);
    if (!mode || *mode == SparsityMode::kUser) {
      fail(
          "--mode must be one of dense, fixed, variable, bigbird, bslongformer, "
          "local_sliding_window; got \"" +
          a.mode + "\"");
    }
  }
  if (a.config_opt->count() > 0) {
    Status s = load_deepspeed_sparsity_config(a.config_path, a.heads, &config, a.seed);
    if (!s.ok()) fail(s.message());
    if (mode && *mode != sparsity_mode(config)) {
      fail(std::string("--mode ") + sparsity_mode_name(*mode) + " contradicts mode \"" +
           sparsity_mode_name(sparsity_mode(config)) + "\" of " + a.config_path +
           "; leave --mode out to use the file's");
    }
  } else {
    config = default_sparsity_config(mode.value_or(SparsityMode::kFixed), a.heads);
  }
  SparsityCommon& common = sparsity_common(config);
  common.num_heads = a.heads;
  common.seed = a.seed;
  if (a.block_opt->count() > 0) common.block = a.block;
  apply_params(a, config);
  return config;
}

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
  // [num_heads][rows][cols] of 0/1, loadable as a tensor as is.
  nlohmann::json heads = nlohmann::json::array();
  std::vector<int64_t> per_head;
  for (int64_t h = 0; h < layout.num_heads; ++h) {
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t c = 0; c < layout.num_col_blocks; ++c) row.push_back(layout.at(h, r, c));
      rows.push_back(std::move(row));
    }
    heads.push_back(std::move(rows));
    per_head.push_back(layout_head_nnz(layout, h));
  }
  j["layout"] = std::move(heads);
  j["nnz"] = layout_nnz(layout);
  j["nnz_per_head"] = per_head;
  j["density"] = layout_density(layout);
  j["max_row_nnz"] = layout_max_row_nnz(layout);
  std::cout << j.dump() << "\n";
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

void run_layout(const LayoutArgs& a) {
  const SparsityConfig config = config_from_args(a);
  Layout layout;
  Status s = a.max_seq_length_opt->count() > 0
                 ? make_layout_for_length(config, a.max_seq_length, a.len, &layout)
                 : make_layout(config, a.len, &layout);
  if (!s.ok()) fail(s.message());
  if (a.json) {
    print_json(a, config, layout);
  } else {
    print_text(a, config, layout);
  }
}

}  // namespace

void add_layout_command(CLI::App& app) {
  auto args = std::make_shared<LayoutArgs>();
  LayoutArgs& a = *args;
  CLI::App* cmd = app.add_subcommand(
      "layout",
      "Print a block-sparse attention layout (DeepSpeed's sparsity configs) as 0/1 grids, one "
      "per head, with its nnz and density. Parameters not given take DeepSpeed's class "
      "defaults for the mode.");
  a.mode_opt = cmd->add_option("--mode", a.mode,
                               "dense, fixed (default), variable, bigbird, bslongformer or "
                               "local_sliding_window");
  cmd->add_option("--heads,--num-heads", a.heads, "number of attention heads (default 1)");
  a.block_opt = cmd->add_option("--block", a.block, "block size: 16 (default), 32, 64 or 128");
  cmd->add_option("--len,--seq-len", a.len, "sequence length in tokens, a multiple of --block")
      ->required();
  a.seed_opt = cmd->add_option("--seed", a.seed,
                               "seed of the random blocks (variable, bigbird): the layout equals "
                               "DeepSpeed's after random.seed(seed) (default 0)");
  a.max_seq_length_opt = cmd->add_option(
      "--max-seq-length", a.max_seq_length,
      "print what SparseSelfAttention(max_seq_length) uses for --len: the top-left crop of the "
      "layout built for this length");
  a.config_opt = cmd->add_option("--config", a.config_path,
                                 "a DeepSpeed JSON config (its sparse_attention section); flags "
                                 "given as well override its values");
  cmd->add_flag("--json", a.json, "print JSON instead of grids");

  // DeepSpeed's parameters, named after them. The order matches apply_params.
  a.param_opts.push_back(cmd->add_flag("--different-layout-per-head", a.different_layout_per_head,
                                       "a different layout for each head (default false)"));
  a.param_opts.push_back(cmd->add_option("--num-local-blocks", a.num_local_blocks,
                                         "fixed: local window size in blocks (default 4)"));
  a.param_opts.push_back(cmd->add_option("--num-global-blocks", a.num_global_blocks,
                                         "fixed, bigbird: global blocks (default 1)"));
  a.param_opts.push_back(cmd->add_option("--attention", a.attention,
                                         "bidirectional or unidirectional (default bidirectional; "
                                         "local_sliding_window: unidirectional)"));
  a.param_opts.push_back(cmd->add_flag("--horizontal-global-attention",
                                       a.horizontal_global_attention,
                                       "fixed, variable: global blocks also attend to every "
                                       "block (bidirectional only; default false)"));
  a.param_opts.push_back(cmd->add_option("--num-different-global-patterns",
                                         a.num_different_global_patterns,
                                         "fixed: global patterns cycled over the heads (needs "
                                         "--different-layout-per-head; default 1)"));
  a.param_opts.push_back(cmd->add_option("--num-random-blocks", a.num_random_blocks,
                                         "variable, bigbird: random blocks per block row "
                                         "(default variable 0, bigbird 1)"));
  a.param_opts.push_back(cmd->add_option("--local-window-blocks", a.local_window_blocks,
                                         "variable: local window sizes, e.g. 1,2,3; the last "
                                         "repeats (default 4)")
                             ->delimiter(','));
  a.param_opts.push_back(cmd->add_option("--global-block-indices", a.global_block_indices,
                                         "variable, bslongformer: global blocks, e.g. 0,4 "
                                         "(default 0)")
                             ->delimiter(','));
  a.param_opts.push_back(cmd->add_option("--global-block-end-indices", a.global_block_end_indices,
                                         "variable, bslongformer: ends of global ranges "
                                         "[index, end), one per global index (default none)")
                             ->delimiter(','));
  a.param_opts.push_back(cmd->add_option("--num-sliding-window-blocks", a.num_sliding_window_blocks,
                                         "bigbird, bslongformer, local_sliding_window: sliding "
                                         "window size in blocks (default 3)"));

  cmd->callback([args]() { run_layout(*args); });
}

}  // namespace sciattn::tools

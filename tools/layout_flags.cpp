// The layout flags shared by `sciattn layout` and `sciattn sparse` (see layout_flags.h). Tools
// layer.
#include "layout_flags.h"

#include <iostream>
#include <optional>
#include <type_traits>
#include <variant>

namespace sciattn::tools {
namespace {

// The modes a user can ask for: DeepSpeed's JSON modes plus local_sliding_window.
constexpr SparsityMode kCliModes[] = {
    SparsityMode::kDense,   SparsityMode::kFixed,        SparsityMode::kVariable,
    SparsityMode::kBigBird, SparsityMode::kBSLongformer, SparsityMode::kLocalSlidingWindow};

template <class... Ts>
struct Overload : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overload(Ts...) -> Overload<Ts...>;

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
  fail_bad_input(opt->get_name() + " does not apply to --mode " +
                 sparsity_mode_name(sparsity_mode(config)) + "; it is a parameter of: " + modes);
}

AttentionDirection attention_from(const std::string& text) {
  auto d = parse_attention_direction(text);
  if (!d)
    fail_bad_input("--attention must be bidirectional or unidirectional; got \"" + text + "\"");
  return *d;
}

void apply_params(const LayoutFlags& a, SparsityConfig& config) {
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

}  // namespace

void fail_bad_input(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

void add_layout_flags(CLI::App* cmd, LayoutFlags* flags, int64_t default_heads) {
  LayoutFlags& a = *flags;
  a.heads = default_heads;
  a.mode_opt = cmd->add_option("--mode", a.mode,
                               "dense, fixed (default), variable, bigbird, bslongformer or "
                               "local_sliding_window");
  cmd->add_option("--heads,--num-heads", a.heads,
                  "number of attention heads (default " + std::to_string(default_heads) + ")")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  a.block_opt = cmd->add_option("--block", a.block, "block size: 16 (default), 32, 64 or 128");
  a.config_opt = cmd->add_option("--config", a.config_path,
                                 "a DeepSpeed JSON config file (its sparse_attention section); "
                                 "flags given as well override its values (default: none)");
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
}

SparsityConfig config_from_flags(const LayoutFlags& a, uint64_t seed) {
  SparsityConfig config;
  std::optional<SparsityMode> mode;
  if (a.mode_opt->count() > 0) {
    mode = parse_sparsity_mode(a.mode);
    if (!mode || *mode == SparsityMode::kUser) {
      fail_bad_input(
          "--mode must be one of dense, fixed, variable, bigbird, bslongformer, "
          "local_sliding_window; got \"" +
          a.mode + "\"");
    }
  }
  if (a.config_opt->count() > 0 && a.read_config_file) {
    Status s = load_deepspeed_sparsity_config(a.config_path, a.heads, &config, seed);
    if (!s.ok()) fail_bad_input(s.message());
    if (mode && *mode != sparsity_mode(config)) {
      fail_bad_input(std::string("--mode ") + sparsity_mode_name(*mode) + " contradicts mode \"" +
                     sparsity_mode_name(sparsity_mode(config)) + "\" of " + a.config_path +
                     "; leave --mode out to use the file's");
    }
  } else {
    config = default_sparsity_config(mode.value_or(SparsityMode::kFixed), a.heads);
  }
  SparsityCommon& common = sparsity_common(config);
  common.num_heads = a.heads;
  common.seed = seed;
  if (a.block_opt->count() > 0) common.block = a.block;
  apply_params(a, config);
  const Status s = validate_sparsity_config(config);
  if (!s.ok()) fail_bad_input(s.message());
  return config;
}

}  // namespace sciattn::tools

// The layout functions of the torch binding, which take no tensors: sparsity_layout (a built-in
// config's layout, as a tensor, with keyword arguments) and parse_deepspeed_sparsity_config (a
// DeepSpeed JSON section read by the library's parser, returned as JSON for the Python side).
// Binding layer.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "sciattn/block_sparse.h"
#include "tensor_args.h"

namespace sciattn::torch_ext {
namespace {

AttentionDirection direction(const std::string& s) {
  auto d = parse_attention_direction(s);
  TORCH_CHECK_VALUE(d.has_value(), "attention must be 'bidirectional' or 'unidirectional'; got '",
                    s, "'");
  return *d;
}

std::vector<int64_t> to_vec(c10::ArrayRef<int64_t> a) {
  return std::vector<int64_t>(a.begin(), a.end());
}

// One entry point for every built-in config: each mode reads the fields it has (the others are
// ignored). seq_len 0 validates only; max_seq_length > 0 applies SparseSelfAttention's crop rule.
// The arguments after `block` are keyword-only in the schema, in this order.
at::Tensor sparsity_layout(const std::string& mode, int64_t num_heads, int64_t block,
                           int64_t seq_len, int64_t max_seq_length, int64_t seed,
                           bool different_layout_per_head, int64_t num_local_blocks,
                           int64_t num_global_blocks, const std::string& attention,
                           bool horizontal_global_attention, int64_t num_different_global_patterns,
                           int64_t num_random_blocks, c10::ArrayRef<int64_t> local_window_blocks,
                           c10::ArrayRef<int64_t> global_block_indices,
                           std::optional<c10::ArrayRef<int64_t>> global_block_end_indices,
                           int64_t num_sliding_window_blocks) {
  auto m = parse_sparsity_mode(mode);
  TORCH_CHECK_VALUE(m.has_value() && *m != SparsityMode::kUser, "unknown sparsity mode '", mode,
                    "'");
  TORCH_CHECK_VALUE(seed >= 0, "seed must be >= 0; got ", seed);
  SparsityConfig config = default_sparsity_config(*m, num_heads);
  SparsityCommon& common = sparsity_common(config);
  common.block = block;
  common.seed = static_cast<uint64_t>(seed);
  std::optional<std::vector<int64_t>> ends;
  if (global_block_end_indices.has_value()) ends = to_vec(*global_block_end_indices);
  std::visit(
      [&](auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, DenseSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
        } else if constexpr (std::is_same_v<T, FixedSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_local_blocks = num_local_blocks;
          c.num_global_blocks = num_global_blocks;
          c.attention = direction(attention);
          c.horizontal_global_attention = horizontal_global_attention;
          c.num_different_global_patterns = num_different_global_patterns;
        } else if constexpr (std::is_same_v<T, VariableSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_random_blocks = num_random_blocks;
          c.local_window_blocks = to_vec(local_window_blocks);
          c.global_block_indices = to_vec(global_block_indices);
          c.global_block_end_indices = ends;
          c.attention = direction(attention);
          c.horizontal_global_attention = horizontal_global_attention;
        } else if constexpr (std::is_same_v<T, BigBirdSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_random_blocks = num_random_blocks;
          c.num_sliding_window_blocks = num_sliding_window_blocks;
          c.num_global_blocks = num_global_blocks;
          c.attention = direction(attention);
        } else if constexpr (std::is_same_v<T, BSLongformerSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_sliding_window_blocks = num_sliding_window_blocks;
          c.global_block_indices = to_vec(global_block_indices);
          c.global_block_end_indices = ends;
          c.attention = direction(attention);
        } else if constexpr (std::is_same_v<T, LocalSlidingWindowSparsityConfig>) {
          c.num_sliding_window_blocks = num_sliding_window_blocks;
          c.attention = direction(attention);
        }
      },
      config);
  if (seq_len == 0) {
    check_status(validate_sparsity_config(config), "SparsityConfig");
    return at::empty({0}, at::kLong);
  }
  Layout layout;
  if (max_seq_length > 0) {
    check_status(make_layout_for_length(config, max_seq_length, seq_len, &layout), "make_layout");
  } else {
    check_status(make_layout(config, seq_len, &layout), "make_layout");
  }
  at::Tensor t =
      at::empty({layout.num_heads, layout.num_row_blocks, layout.num_col_blocks}, at::kLong);
  int64_t* dst = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < layout.size(); ++i) dst[i] = layout.blocks[static_cast<size_t>(i)];
  return t;
}

// ---- DeepSpeed JSON ---------------------------------------------------------------------------

void json_list(std::ostringstream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}

// Parses the "sparse_attention" section with the library's parser (DeepSpeed's JSON defaults,
// strict key and type checks) and returns the resulting config as JSON for the Python side.
std::string parse_deepspeed_sparsity_config_json(const std::string& text, int64_t num_heads,
                                                 int64_t seed) {
  TORCH_CHECK_VALUE(seed >= 0, "seed must be >= 0; got ", seed);
  SparsityConfig config;
  check_status(
      parse_deepspeed_sparsity_config(text, num_heads, &config, static_cast<uint64_t>(seed)),
      "sparse_attention config");
  std::ostringstream os;
  const SparsityCommon& common = sparsity_common(config);
  os << "{\"mode\": \"" << sparsity_mode_name(sparsity_mode(config))
     << "\", \"num_heads\": " << common.num_heads << ", \"block\": " << common.block;
  auto b = [](bool x) { return x ? "true" : "false"; };
  std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (!std::is_same_v<T, UserSparsityConfig> &&
                      !std::is_same_v<T, LocalSlidingWindowSparsityConfig>) {
          os << ", \"different_layout_per_head\": " << b(c.different_layout_per_head);
        }
        if constexpr (std::is_same_v<T, FixedSparsityConfig>) {
          os << ", \"num_local_blocks\": " << c.num_local_blocks
             << ", \"num_global_blocks\": " << c.num_global_blocks << ", \"attention\": \""
             << attention_direction_name(c.attention)
             << "\", \"horizontal_global_attention\": " << b(c.horizontal_global_attention)
             << ", \"num_different_global_patterns\": " << c.num_different_global_patterns;
        } else if constexpr (std::is_same_v<T, VariableSparsityConfig>) {
          os << ", \"num_random_blocks\": " << c.num_random_blocks << ", \"local_window_blocks\": ";
          json_list(os, c.local_window_blocks);
          os << ", \"global_block_indices\": ";
          json_list(os, c.global_block_indices);
          os << ", \"global_block_end_indices\": ";
          if (c.global_block_end_indices)
            json_list(os, *c.global_block_end_indices);
          else
            os << "null";
          os << ", \"attention\": \"" << attention_direction_name(c.attention)
             << "\", \"horizontal_global_attention\": " << b(c.horizontal_global_attention);
        } else if constexpr (std::is_same_v<T, BigBirdSparsityConfig>) {
          os << ", \"num_random_blocks\": " << c.num_random_blocks
             << ", \"num_sliding_window_blocks\": " << c.num_sliding_window_blocks
             << ", \"num_global_blocks\": " << c.num_global_blocks << ", \"attention\": \""
             << attention_direction_name(c.attention) << "\"";
        } else if constexpr (std::is_same_v<T, BSLongformerSparsityConfig>) {
          os << ", \"num_sliding_window_blocks\": " << c.num_sliding_window_blocks
             << ", \"global_block_indices\": ";
          json_list(os, c.global_block_indices);
          os << ", \"global_block_end_indices\": ";
          if (c.global_block_end_indices)
            json_list(os, *c.global_block_end_indices);
          else
            os << "null";
          os << ", \"attention\": \"" << attention_direction_name(c.attention) << "\"";
        }
      },
      config);
  os << "}";
  return os.str();
}

}  // namespace
}  // namespace sciattn::torch_ext

// sparsity_layout's config fields are keyword-only, with the defaults of DeepSpeed's classes;
// each mode reads its own and ignores the rest.
TORCH_LIBRARY_FRAGMENT(sciattn, m) {
  m.def(
      "sparsity_layout(str mode, int num_heads, int block, *, int seq_len=0, "
      "int max_seq_length=0, int seed=0, bool different_layout_per_head=False, "
      "int num_local_blocks=4, int num_global_blocks=1, str attention=\"bidirectional\", "
      "bool horizontal_global_attention=False, int num_different_global_patterns=1, "
      "int num_random_blocks=0, int[] local_window_blocks=[4], int[] global_block_indices=[0], "
      "int[]? global_block_end_indices=None, int num_sliding_window_blocks=3) -> Tensor",
      &sciattn::torch_ext::sparsity_layout);
  m.def("parse_deepspeed_sparsity_config(str text, int num_heads, int seed) -> str",
        &sciattn::torch_ext::parse_deepspeed_sparsity_config_json);
}

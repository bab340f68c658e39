// Sparsity configs: names, DeepSpeed's defaults, descriptions and the checks that do not depend
// on the sequence length. Host-only common layer; the public declarations are in block_sparse.h.
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>

#include "common/sparsity_layouts.h"
#include "common/status_try.h"
#include "sciattn/block_sparse.h"

namespace sciattn {
namespace {

// Every message starts with the class name, so that an error from a JSON file or a command line
// says which config it is about.
Status reject(const char* class_name, const std::string& message) {
  return Status::invalid_argument(std::string(class_name) + ": " + message);
}

std::string int_str(int64_t v) {
  return std::to_string(v);
}

bool valid_direction(AttentionDirection d) {
  return d == AttentionDirection::kBidirectional || d == AttentionDirection::kUnidirectional;
}

Status check_common(const char* cls, const SparsityCommon& c) {
  if (c.num_heads < 1) {
    return reject(cls, "num_heads (" + int_str(c.num_heads) +
                           ") must be >= 1: the number of attention heads of the layer");
  }
  if (!is_supported_block_size(c.block)) {
    return reject(cls, "block (" + int_str(c.block) + ") must be one of 16, 32, 64, 128");
  }
  return Status::ok_status();
}

Status check_direction(const char* cls, AttentionDirection d) {
  if (!valid_direction(d)) {
    return reject(cls, "attention (" + int_str(static_cast<int64_t>(d)) +
                           ") must be bidirectional or unidirectional");
  }
  return Status::ok_status();
}

Status check_horizontal(const char* cls, bool horizontal, AttentionDirection d) {
  if (horizontal && d != AttentionDirection::kBidirectional) {
    return reject(cls,
                  "horizontal_global_attention = true requires attention = bidirectional (got "
                  "unidirectional)");
  }
  return Status::ok_status();
}

Status check_non_negative(const char* cls, const char* name, int64_t v) {
  if (v < 0) return reject(cls, std::string(name) + " (" + int_str(v) + ") must be >= 0");
  return Status::ok_status();
}

// global_block_indices / global_block_end_indices, shared by Variable and BSLongformer.
Status check_global_indices(const char* cls, const std::vector<int64_t>& starts,
                            const std::optional<std::vector<int64_t>>& ends) {
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i] < 0) {
      return reject(cls, "global_block_indices[" + std::to_string(i) + "] (" + int_str(starts[i]) +
                             ") must be >= 0");
    }
  }
  if (!ends) return Status::ok_status();
  if (ends->size() != starts.size()) {
    return reject(cls, "global_block_end_indices has " + std::to_string(ends->size()) +
                           " entries but global_block_indices has " +
                           std::to_string(starts.size()) + "; they must have the same length");
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    if ((*ends)[i] <= starts[i]) {
      return reject(cls, "global_block_end_indices[" + std::to_string(i) + "] (" +
                             int_str((*ends)[i]) + ") must be > global_block_indices[" +
                             std::to_string(i) + "] (" + int_str(starts[i]) + ")");
    }
  }
  return Status::ok_status();
}

Status check(const DenseSparsityConfig& c) {
  return check_common("DenseSparsityConfig", c);
}

Status check(const FixedSparsityConfig& c) {
  const char* cls = "FixedSparsityConfig";
  SCIATTN_TRY(check_common(cls, c));
  if (c.num_local_blocks < 1) {
    return reject(cls, "num_local_blocks (" + int_str(c.num_local_blocks) + ") must be >= 1");
  }
  if (c.num_global_blocks < 1) {
    return reject(cls, "num_global_blocks (" + int_str(c.num_global_blocks) + ") must be >= 1");
  }
  // DeepSpeed's constructor order from here on (spec 1.2).
  if (c.num_local_blocks % c.num_global_blocks != 0) {
    return reject(cls, "num_local_blocks (" + int_str(c.num_local_blocks) +
                           ") must be divisible by num_global_blocks (" +
                           int_str(c.num_global_blocks) + ")");
  }
  SCIATTN_TRY(check_direction(cls, c.attention));
  SCIATTN_TRY(check_horizontal(cls, c.horizontal_global_attention, c.attention));
  if (c.num_different_global_patterns < 1) {
    return reject(cls, "num_different_global_patterns (" +
                           int_str(c.num_different_global_patterns) + ") must be >= 1");
  }
  if (c.num_different_global_patterns > 1 && !c.different_layout_per_head) {
    return reject(cls, "num_different_global_patterns (" +
                           int_str(c.num_different_global_patterns) +
                           ") > 1 requires different_layout_per_head = true");
  }
  const int64_t max_patterns = c.num_local_blocks / c.num_global_blocks;
  if (c.num_different_global_patterns > max_patterns) {
    return reject(
        cls,
        "num_different_global_patterns (" + int_str(c.num_different_global_patterns) +
            ") must be <= num_local_blocks / num_global_blocks = " + int_str(c.num_local_blocks) +
            " / " + int_str(c.num_global_blocks) + " = " + int_str(max_patterns));
  }
  return Status::ok_status();
}

Status check(const VariableSparsityConfig& c) {
  const char* cls = "VariableSparsityConfig";
  SCIATTN_TRY(check_common(cls, c));
  SCIATTN_TRY(check_non_negative(cls, "num_random_blocks", c.num_random_blocks));
  if (c.local_window_blocks.empty()) {
    return reject(cls,
                  "local_window_blocks must not be empty: it lists the local window sizes, and "
                  "its last size repeats to the end of the sequence");
  }
  for (size_t i = 0; i < c.local_window_blocks.size(); ++i) {
    if (c.local_window_blocks[i] < 0) {
      return reject(cls, "local_window_blocks[" + std::to_string(i) + "] (" +
                             int_str(c.local_window_blocks[i]) + ") must be >= 0");
    }
  }
  if (c.local_window_blocks.back() == 0) {
    return reject(cls, "local_window_blocks[" + std::to_string(c.local_window_blocks.size() - 1) +
                           "] (0), the last size, must be >= 1: it repeats to the end of the "
                           "sequence");
  }
  SCIATTN_TRY(check_global_indices(cls, c.global_block_indices, c.global_block_end_indices));
  SCIATTN_TRY(check_direction(cls, c.attention));
  SCIATTN_TRY(check_horizontal(cls, c.horizontal_global_attention, c.attention));
  return Status::ok_status();
}

Status check(const BigBirdSparsityConfig& c) {
  const char* cls = "BigBirdSparsityConfig";
  SCIATTN_TRY(check_common(cls, c));
  SCIATTN_TRY(check_non_negative(cls, "num_random_blocks", c.num_random_blocks));
  SCIATTN_TRY(check_non_negative(cls, "num_sliding_window_blocks", c.num_sliding_window_blocks));
  SCIATTN_TRY(check_non_negative(cls, "num_global_blocks", c.num_global_blocks));
  return check_direction(cls, c.attention);
}

Status check(const BSLongformerSparsityConfig& c) {
  const char* cls = "BSLongformerSparsityConfig";
  SCIATTN_TRY(check_common(cls, c));
  SCIATTN_TRY(check_non_negative(cls, "num_sliding_window_blocks", c.num_sliding_window_blocks));
  SCIATTN_TRY(check_global_indices(cls, c.global_block_indices, c.global_block_end_indices));
  return check_direction(cls, c.attention);
}

Status check(const LocalSlidingWindowSparsityConfig& c) {
  const char* cls = "LocalSlidingWindowSparsityConfig";
  SCIATTN_TRY(check_common(cls, c));
  SCIATTN_TRY(check_non_negative(cls, "num_sliding_window_blocks", c.num_sliding_window_blocks));
  return check_direction(cls, c.attention);
}

Status check(const UserSparsityConfig& c) {
  const char* cls = "UserSparsityConfig";
  SCIATTN_TRY(check_common(cls, c));
  const Layout& l = c.layout;
  if (l.num_heads != c.num_heads && l.num_heads != 1) {
    return reject(cls, "layout.num_heads (" + int_str(l.num_heads) + ") must be num_heads (" +
                           int_str(c.num_heads) + ") or 1 (one layout shared by all heads)");
  }
  if (l.num_row_blocks < 1 || l.num_row_blocks != l.num_col_blocks) {
    return reject(cls, "layout must be square with at least one block: num_row_blocks (" +
                           int_str(l.num_row_blocks) + ") and num_col_blocks (" +
                           int_str(l.num_col_blocks) + ") must be equal and >= 1");
  }
  int64_t entries = 0;
  if (!detail::checked_layout_entries(l.num_heads, l.num_row_blocks, l.num_col_blocks, &entries) ||
      static_cast<int64_t>(l.blocks.size()) != entries) {
    return reject(cls, "layout.blocks has " + std::to_string(l.blocks.size()) +
                           " entries; a layout of shape [" + int_str(l.num_heads) + ", " +
                           int_str(l.num_row_blocks) + ", " + int_str(l.num_col_blocks) +
                           "] needs their product");
  }
  for (size_t i = 0; i < l.blocks.size(); ++i) {
    if (l.blocks[i] > 1) {
      return reject(cls, "layout.blocks[" + std::to_string(i) + "] (" +
                             std::to_string(l.blocks[i]) + ") must be 0 or 1");
    }
  }
  return Status::ok_status();
}

// ---- descriptions ----

const char* bool_str(bool b) {
  return b ? "true" : "false";
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string optional_list_str(const std::optional<std::vector<int64_t>>& v) {
  return v ? list_str(*v) : std::string("None");
}

void describe_common(std::ostringstream& os, const SparsityCommon& c) {
  os << "num_heads=" << c.num_heads << ", block=" << c.block;
}

void describe(std::ostringstream& os, const DenseSparsityConfig& c) {
  describe_common(os, c);
  os << ", different_layout_per_head=" << bool_str(c.different_layout_per_head);
}

void describe(std::ostringstream& os, const FixedSparsityConfig& c) {
  describe_common(os, c);
  os << ", different_layout_per_head=" << bool_str(c.different_layout_per_head)
     << ", num_local_blocks=" << c.num_local_blocks << ", num_global_blocks=" << c.num_global_blocks
     << ", attention=" << attention_direction_name(c.attention)
     << ", horizontal_global_attention=" << bool_str(c.horizontal_global_attention)
     << ", num_different_global_patterns=" << c.num_different_global_patterns;
}

void describe(std::ostringstream& os, const VariableSparsityConfig& c) {
  describe_common(os, c);
  os << ", seed=" << c.seed
     << ", different_layout_per_head=" << bool_str(c.different_layout_per_head)
     << ", num_random_blocks=" << c.num_random_blocks
     << ", local_window_blocks=" << list_str(c.local_window_blocks)
     << ", global_block_indices=" << list_str(c.global_block_indices)
     << ", global_block_end_indices=" << optional_list_str(c.global_block_end_indices)
     << ", attention=" << attention_direction_name(c.attention)
     << ", horizontal_global_attention=" << bool_str(c.horizontal_global_attention);
}

void describe(std::ostringstream& os, const BigBirdSparsityConfig& c) {
  describe_common(os, c);
  os << ", seed=" << c.seed
     << ", different_layout_per_head=" << bool_str(c.different_layout_per_head)
     << ", num_random_blocks=" << c.num_random_blocks
     << ", num_sliding_window_blocks=" << c.num_sliding_window_blocks
     << ", num_global_blocks=" << c.num_global_blocks
     << ", attention=" << attention_direction_name(c.attention);
}

void describe(std::ostringstream& os, const BSLongformerSparsityConfig& c) {
  describe_common(os, c);
  os << ", different_layout_per_head=" << bool_str(c.different_layout_per_head)
     << ", num_sliding_window_blocks=" << c.num_sliding_window_blocks
     << ", global_block_indices=" << list_str(c.global_block_indices)
     << ", global_block_end_indices=" << optional_list_str(c.global_block_end_indices)
     << ", attention=" << attention_direction_name(c.attention);
}

void describe(std::ostringstream& os, const LocalSlidingWindowSparsityConfig& c) {
  describe_common(os, c);
  os << ", num_sliding_window_blocks=" << c.num_sliding_window_blocks
     << ", attention=" << attention_direction_name(c.attention);
}

void describe(std::ostringstream& os, const UserSparsityConfig& c) {
  describe_common(os, c);
  os << ", layout=[" << c.layout.num_heads << ", " << c.layout.num_row_blocks << ", "
     << c.layout.num_col_blocks << "]";
}

}  // namespace

bool is_supported_block_size(int64_t block) {
  for (int64_t b : kSupportedBlockSizes) {
    if (b == block) return true;
  }
  return false;
}

const char* attention_direction_name(AttentionDirection direction) {
  switch (direction) {
    case AttentionDirection::kBidirectional:
      return "bidirectional";
    case AttentionDirection::kUnidirectional:
      return "unidirectional";
  }
  return "unknown";
}

std::optional<AttentionDirection> parse_attention_direction(std::string_view name) {
  if (name == "bidirectional") return AttentionDirection::kBidirectional;
  if (name == "unidirectional") return AttentionDirection::kUnidirectional;
  return std::nullopt;
}

static_assert(
    std::is_same_v<
        std::variant_alternative_t<static_cast<size_t>(SparsityMode::kBigBird), SparsityConfig>,
        BigBirdSparsityConfig> &&
        std::is_same_v<
            std::variant_alternative_t<static_cast<size_t>(SparsityMode::kUser), SparsityConfig>,
            UserSparsityConfig>,
    "SparsityConfig's alternatives must follow SparsityMode's order");

SparsityMode sparsity_mode(const SparsityConfig& config) {
  // The variant's alternatives are declared in SparsityMode's order.
  return static_cast<SparsityMode>(config.index());
}

const char* sparsity_mode_name(SparsityMode mode) {
  switch (mode) {
    case SparsityMode::kDense:
      return "dense";
    case SparsityMode::kFixed:
      return "fixed";
    case SparsityMode::kVariable:
      return "variable";
    case SparsityMode::kBigBird:
      return "bigbird";
    case SparsityMode::kBSLongformer:
      return "bslongformer";
    case SparsityMode::kLocalSlidingWindow:
      return "local_sliding_window";
    case SparsityMode::kUser:
      return "user";
  }
  return "unknown";
}

std::optional<SparsityMode> parse_sparsity_mode(std::string_view name) {
  for (auto mode :
       {SparsityMode::kDense, SparsityMode::kFixed, SparsityMode::kVariable, SparsityMode::kBigBird,
        SparsityMode::kBSLongformer, SparsityMode::kLocalSlidingWindow, SparsityMode::kUser}) {
    if (name == sparsity_mode_name(mode)) return mode;
  }
  return std::nullopt;
}

SparsityConfig default_sparsity_config(SparsityMode mode, int64_t num_heads) {
  SparsityConfig config;
  switch (mode) {
    case SparsityMode::kDense:
      config = DenseSparsityConfig{};
      break;
    case SparsityMode::kFixed:
      config = FixedSparsityConfig{};
      break;
    case SparsityMode::kVariable:
      config = VariableSparsityConfig{};
      break;
    case SparsityMode::kBigBird:
      config = BigBirdSparsityConfig{};
      break;
    case SparsityMode::kBSLongformer:
      config = BSLongformerSparsityConfig{};
      break;
    case SparsityMode::kLocalSlidingWindow:
      config = LocalSlidingWindowSparsityConfig{};
      break;
    case SparsityMode::kUser:
      config = UserSparsityConfig{};
      break;
  }
  sparsity_common(config).num_heads = num_heads;
  return config;
}

const SparsityCommon& sparsity_common(const SparsityConfig& config) {
  return std::visit([](const auto& c) -> const SparsityCommon& { return c; }, config);
}

SparsityCommon& sparsity_common(SparsityConfig& config) {
  return std::visit([](auto& c) -> SparsityCommon& { return c; }, config);
}

std::string to_string(const SparsityConfig& config) {
  std::ostringstream os;
  os << detail::sparsity_class_name(sparsity_mode(config)) << "(";
  std::visit([&os](const auto& c) { describe(os, c); }, config);
  os << ")";
  return os.str();
}

Status validate_sparsity_config(const SparsityConfig& config) {
  return std::visit([](const auto& c) { return check(c); }, config);
}

namespace detail {

const char* sparsity_class_name(SparsityMode mode) {
  switch (mode) {
    case SparsityMode::kDense:
      return "DenseSparsityConfig";
    case SparsityMode::kFixed:
      return "FixedSparsityConfig";
    case SparsityMode::kVariable:
      return "VariableSparsityConfig";
    case SparsityMode::kBigBird:
      return "BigBirdSparsityConfig";
    case SparsityMode::kBSLongformer:
      return "BSLongformerSparsityConfig";
    case SparsityMode::kLocalSlidingWindow:
      return "LocalSlidingWindowSparsityConfig";
    case SparsityMode::kUser:
      return "UserSparsityConfig";
  }
  return "SparsityConfig";
}

}  // namespace detail
}  // namespace sciattn

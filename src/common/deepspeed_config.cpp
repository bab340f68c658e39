// Parser of DeepSpeed's "sparse_attention" JSON section (spec 1.7) with nlohmann-json, which stays
// private to this file. Host-only common layer; no exception leaves it.
#include "common/deepspeed_config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sciattn/block_sparse.h"

namespace sciattn {
namespace {

using Json = nlohmann::json;

Status reject(const std::string& message) {
  return Status::invalid_argument("DeepSpeed sparse_attention config: " + message);
}

// "string \"four\"", "number 4.5", "array [1,2]": what was found, for type errors.
std::string describe_value(const Json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + text;
}

// The keys each mode reads, as DeepSpeed's get_sparse_<mode>_config functions do. Everything else
// in the section is ignored for that mode (after its type check).
bool mode_reads(SparsityMode mode, std::string_view key) {
  auto in = [key](std::initializer_list<std::string_view> keys) {
    for (std::string_view k : keys) {
      if (k == key) return true;
    }
    return false;
  };
  switch (mode) {
    case SparsityMode::kDense:
      return in({"block"});
    case SparsityMode::kFixed:
      return in({"block", "different_layout_per_head", "num_local_blocks", "num_global_blocks",
                 "attention", "horizontal_global_attention", "num_different_global_patterns"});
    case SparsityMode::kVariable:
      return in({"block", "different_layout_per_head", "num_random_blocks", "local_window_blocks",
                 "global_block_indices", "global_block_end_indices", "attention",
                 "horizontal_global_attention"});
    case SparsityMode::kBigBird:
      return in({"block", "different_layout_per_head", "num_random_blocks",
                 "num_sliding_window_blocks", "num_global_blocks"});
    case SparsityMode::kBSLongformer:
      return in({"block", "different_layout_per_head", "num_sliding_window_blocks",
                 "global_block_indices", "global_block_end_indices"});
    default:
      return false;
  }
}

// Typed readers. Each returns an error naming the key when the value has the wrong type.
Status read_int(const Json& v, const std::string& name, int64_t* out) {
  if (!v.is_number_integer()) {
    return reject(name + " must be an integer; got " + describe_value(v));
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return reject(name + " (" + v.dump() +
                  ") is out of range: it must fit in a signed 64-bit "
                  "integer");
  }
  *out = v.get<int64_t>();
  return Status::ok_status();
}

Status read_bool(const Json& v, const std::string& name, bool* out) {
  if (!v.is_boolean()) return reject(name + " must be true or false; got " + describe_value(v));
  *out = v.get<bool>();
  return Status::ok_status();
}

Status read_int_list(const Json& v, const std::string& name, std::vector<int64_t>* out) {
  if (!v.is_array()) {
    return reject(name + " must be a list of integers; got " + describe_value(v));
  }
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = 0;
    Status s = read_int(v[i], name + "[" + std::to_string(i) + "]", &x);
    if (!s.ok()) return s;
    out->push_back(x);
  }
  return Status::ok_status();
}

Status read_direction(const Json& v, const std::string& name, AttentionDirection* out) {
  if (!v.is_string()) {
    return reject(name + " must be \"bidirectional\" or \"unidirectional\"; got " +
                  describe_value(v));
  }
  auto d = parse_attention_direction(v.get<std::string>());
  if (!d) {
    return reject(name + " must be \"bidirectional\" or \"unidirectional\"; got \"" +
                  v.get<std::string>() + "\"");
  }
  *out = *d;
  return Status::ok_status();
}

// Checks the type of one known key (DeepSpeed ignores the keys a mode does not read, but a
// wrongly typed value is a mistake in the file whatever the mode).
Status type_check(const std::string& key, const Json& v) {
  int64_t i = 0;
  bool b = false;
  std::vector<int64_t> list;
  AttentionDirection d = AttentionDirection::kBidirectional;
  if (key == "mode") {
    if (!v.is_string()) return reject("mode must be a string; got " + describe_value(v));
    return Status::ok_status();
  }
  if (key == "different_layout_per_head" || key == "horizontal_global_attention") {
    return read_bool(v, key, &b);
  }
  if (key == "attention") return read_direction(v, key, &d);
  if (key == "local_window_blocks" || key == "global_block_indices") {
    return read_int_list(v, key, &list);
  }
  if (key == "global_block_end_indices") {
    if (v.is_null()) return Status::ok_status();
    return read_int_list(v, key, &list);
  }
  return read_int(v, key, &i);
}

// Stores a key the mode reads (its type is already checked).
Status apply(const std::string& key, const Json& v, SparsityConfig* config) {
  Status s;
  std::visit(
      [&](auto& c) {
        using T = std::decay_t<decltype(c)>;
        if (key == "block") s = read_int(v, key, &c.block);
        if constexpr (std::is_same_v<T, FixedSparsityConfig> ||
                      std::is_same_v<T, VariableSparsityConfig> ||
                      std::is_same_v<T, BigBirdSparsityConfig> ||
                      std::is_same_v<T, BSLongformerSparsityConfig>) {
          if (key == "different_layout_per_head")
            s = read_bool(v, key, &c.different_layout_per_head);
        }
        if constexpr (std::is_same_v<T, FixedSparsityConfig>) {
          if (key == "num_local_blocks") s = read_int(v, key, &c.num_local_blocks);
          if (key == "num_global_blocks") s = read_int(v, key, &c.num_global_blocks);
          if (key == "attention") s = read_direction(v, key, &c.attention);
          if (key == "horizontal_global_attention") {
            s = read_bool(v, key, &c.horizontal_global_attention);
          }
          if (key == "num_different_global_patterns") {
            s = read_int(v, key, &c.num_different_global_patterns);
          }
        }
        if constexpr (std::is_same_v<T, VariableSparsityConfig>) {
          if (key == "num_random_blocks") s = read_int(v, key, &c.num_random_blocks);
          if (key == "local_window_blocks") s = read_int_list(v, key, &c.local_window_blocks);
          if (key == "attention") s = read_direction(v, key, &c.attention);
          if (key == "horizontal_global_attention") {
            s = read_bool(v, key, &c.horizontal_global_attention);
          }
        }
        if constexpr (std::is_same_v<T, BigBirdSparsityConfig>) {
          if (key == "num_random_blocks") s = read_int(v, key, &c.num_random_blocks);
          if (key == "num_sliding_window_blocks")
            s = read_int(v, key, &c.num_sliding_window_blocks);
          if (key == "num_global_blocks") s = read_int(v, key, &c.num_global_blocks);
        }
        if constexpr (std::is_same_v<T, BSLongformerSparsityConfig>) {
          if (key == "num_sliding_window_blocks")
            s = read_int(v, key, &c.num_sliding_window_blocks);
        }
        if constexpr (std::is_same_v<T, VariableSparsityConfig> ||
                      std::is_same_v<T, BSLongformerSparsityConfig>) {
          if (key == "global_block_indices") s = read_int_list(v, key, &c.global_block_indices);
          if (key == "global_block_end_indices") {
            if (v.is_null()) {
              c.global_block_end_indices.reset();
            } else {
              std::vector<int64_t> ends;
              s = read_int_list(v, key, &ends);
              c.global_block_end_indices = std::move(ends);
            }
          }
        }
      },
      *config);
  return s;
}

// Records the first key that appears twice in one object: DeepSpeed loads its config with
// dict_raise_error_on_duplicate_keys, so a repeated key is an error there too.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string()) {
          const auto& key = parsed.get_ref<const std::string&>();
          if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
        }
        break;
      default:
        break;
    }
    return true;
  }
};

Status parse_section(const Json& section, int64_t num_heads, uint64_t seed, SparsityConfig* out,
                     bool whole_document) {
  std::string mode_name = "fixed";  // DeepSpeed's SPARSE_MODE_DEFAULT
  auto mode_it = section.find("mode");
  if (mode_it != section.end()) {
    if (!mode_it->is_string()) {
      return reject("mode must be a string; got " + describe_value(*mode_it));
    }
    mode_name = mode_it->get<std::string>();
  }
  const std::string valid_modes =
      "\"dense\", \"fixed\", \"variable\", \"bigbird\", \"bslongformer\"";
  auto mode = parse_sparsity_mode(mode_name);
  if (mode == SparsityMode::kLocalSlidingWindow) {
    return reject(
        "mode \"local_sliding_window\" cannot be set in a DeepSpeed config (DeepSpeed's "
        "JSON path has no such mode; use LocalSlidingWindowSparsityConfig); expected "
        "one of " +
        valid_modes);
  }
  if (!mode || mode == SparsityMode::kUser) {
    return reject("unknown mode \"" + mode_name + "\"; expected one of " + valid_modes);
  }

  // Keys: known ones are type-checked; unknown ones are errors.
  for (auto it = section.begin(); it != section.end(); ++it) {
    const std::string& key = it.key();
    bool known = false;
    for (std::string_view k : detail::kDeepSpeedSparseKeys) known = known || k == key;
    if (!known) {
      std::string expected;
      for (std::string_view k : detail::kDeepSpeedSparseKeys) {
        expected += (expected.empty() ? "" : ", ") + std::string(k);
      }
      std::string message = "unknown key \"" + key + "\"; expected one of " + expected;
      if (!whole_document) {
        message += " (a DeepSpeed config keeps these in a \"sparse_attention\" object)";
      }
      return reject(message);
    }
    Status s = type_check(key, *it);
    if (!s.ok()) return s;
  }

  // DeepSpeed's JSON path does not pass `attention` to BigBird and BSLongformer, which are then
  // always bidirectional. Rather than silently drop a request for a causal layout, refuse it.
  auto attention_it = section.find("attention");
  if ((mode == SparsityMode::kBigBird || mode == SparsityMode::kBSLongformer) &&
      attention_it != section.end() && attention_it->get<std::string>() != "bidirectional") {
    return reject("attention \"" + attention_it->get<std::string>() + "\" is not read for mode \"" +
                  mode_name +
                  "\": DeepSpeed's JSON path always builds it bidirectional; remove "
                  "the key or set it to \"bidirectional\" (the C++ config and the CLI take "
                  "unidirectional)");
  }

  SparsityConfig config = default_sparsity_config(*mode, num_heads);
  // DeepSpeed's JSON defaults equal the class defaults except bigbird's num_random_blocks.
  if (auto* bigbird = std::get_if<BigBirdSparsityConfig>(&config)) bigbird->num_random_blocks = 0;
  sparsity_common(config).seed = seed;
  for (auto it = section.begin(); it != section.end(); ++it) {
    if (it.key() == "mode" || !mode_reads(*mode, it.key())) continue;
    Status s = apply(it.key(), *it, &config);
    if (!s.ok()) return s;
  }
  Status valid = validate_sparsity_config(config);
  if (!valid.ok()) return reject(valid.message());
  *out = std::move(config);
  return Status::ok_status();
}

Status parse_text(std::string_view text, const std::string& source, int64_t num_heads,
                  uint64_t seed, SparsityConfig* out) {
  DuplicateKeyFinder duplicates;
  Json document;
  try {
    document = Json::parse(text.begin(), text.end(), std::ref(duplicates));
  } catch (const Json::exception& e) {
    return reject("malformed JSON in " + source + ": " + e.what());
  }
  if (!duplicates.duplicate.empty()) {
    return reject("duplicate key \"" + duplicates.duplicate + "\" in " + source +
                  " (DeepSpeed rejects duplicate keys too)");
  }
  if (!document.is_object()) {
    return reject(source + " must hold a JSON object; got " + describe_value(document));
  }
  try {
    auto section = document.find("sparse_attention");
    if (section == document.end()) return parse_section(document, num_heads, seed, out, false);
    if (!section->is_object()) {
      return reject("sparse_attention must be an object; got " + describe_value(*section));
    }
    return parse_section(*section, num_heads, seed, out, true);
  } catch (const Json::exception& e) {
    // Every value is type-checked before use, so this is a bug; still, nothing may escape.
    return Status(StatusCode::kInternal,
                  std::string("DeepSpeed sparse_attention config: ") + e.what());
  }
}

}  // namespace

namespace detail {

Status parse_deepspeed_sparsity_text(std::string_view json_text, int64_t num_heads, uint64_t seed,
                                     SparsityConfig* out) {
  return parse_text(json_text, "the JSON text", num_heads, seed, out);
}

Status load_deepspeed_sparsity_file(const std::string& path, int64_t num_heads, uint64_t seed,
                                    SparsityConfig* out) {
  // An ifstream opens a directory and then reads nothing, which would come out as malformed JSON.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return reject("\"" + path + "\" is a directory; give the path of a DeepSpeed JSON config file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return reject("cannot read \"" + path + "\": " + std::strerror(errno));
  }
  // A config is a few KiB. The read stops past a cap, so that a path such as /dev/zero (or a
  // huge file given by mistake) is refused instead of read until memory runs out; pipes
  // (`--config <(...)`) still work.
  constexpr std::streamsize kMaxConfigBytes = std::streamsize{16} << 20;
  std::string text(static_cast<size_t>(kMaxConfigBytes) + 1, '\0');
  file.read(text.data(), kMaxConfigBytes + 1);
  if (file.bad()) return reject("cannot read \"" + path + "\": " + std::strerror(errno));
  if (file.gcount() > kMaxConfigBytes) {
    return reject("\"" + path +
                  "\" holds more than 16 MiB; a DeepSpeed config is a small JSON file");
  }
  text.resize(static_cast<size_t>(file.gcount()));
  return parse_text(text, "\"" + path + "\"", num_heads, seed, out);
}

}  // namespace detail
}  // namespace sciattn

// Reading the trainer's JSON files (the model file, the DeepSpeed config, checkpoint headers) with
// messages that name the key by its dotted path. Trainer layer (host code); nlohmann-json stays
// private to src/train.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sciattn/status.h"

namespace sciattn::train::detail {

using Json = nlohmann::json;

// Parses text, rejecting malformed JSON and any key repeated within one object (DeepSpeed loads
// its configs with dict_raise_error_on_duplicate_keys). `what` prefixes messages
// ("model file \"gpt.json\"").
Status parse_json(std::string_view text, const std::string& what, Json* out);
// Reads a whole file; the message names the path and the system's reason.
Status read_file(const std::string& path, std::string* out);

// "string \"four\"", "number 4.5": what was found, for type errors.
std::string describe(const Json& v);

// A JSON object being read, with its dotted path for messages ("fp16", "optimizer.params").
// Each get_* reads one key when present, type-checks it and records it as read.
class ObjectReader {
 public:
  ObjectReader() = default;
  ObjectReader(const Json& object, std::string path, std::string prefix);

  bool has(const std::string& key) const;
  // True when the key is present with the string value "auto".
  bool is_auto(const std::string& key) const;
  // The key's dotted path ("fp16.hysteresis").
  std::string path(const std::string& key) const;
  Status error(const std::string& key, const std::string& message) const;

  Status get_int(const std::string& key, int64_t* out, int64_t min_value);
  Status get_number(const std::string& key, double* out);
  Status get_bool(const std::string& key, bool* out);
  Status get_string(const std::string& key, std::string* out);
  // An object member: its reader, or an error when the value is not an object.
  Status get_object(const std::string& key, ObjectReader* out);
  const Json& raw(const std::string& key) const { return object_->at(key); }
  void mark_read(const std::string& key);

  // Keys present but never read.
  std::vector<std::string> unread() const;
  const std::string& object_path() const { return path_; }

 private:
  const Json* object_ = nullptr;
  std::string path_;    // "" for the top level
  std::string prefix_;  // message prefix: "DeepSpeed config \"ds.json\": "
  std::vector<std::string> read_;
};

}  // namespace sciattn::train::detail

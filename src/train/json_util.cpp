// JSON reading helpers of the trainer (json_util.h). Trainer layer (host code).
#include "train/json_util.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace sciattn::train::detail {
namespace {

// Records the first key that appears twice in one object.
struct DuplicateKeys {
  std::vector<std::set<std::string>> open;
  std::string first;

  bool operator()(int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == Json::parse_event_t::key && !open.empty() && parsed.is_string()) {
      if (!open.back().insert(parsed.get<std::string>()).second && first.empty()) {
        first = parsed.get<std::string>();
      }
    }
    return true;
  }
};

}  // namespace

Status parse_json(std::string_view text, const std::string& what, Json* out) {
  DuplicateKeys duplicates;
  try {
    *out = Json::parse(text.begin(), text.end(), std::ref(duplicates));
  } catch (const Json::exception& e) {
    return Status::invalid_argument(what + ": malformed JSON: " + e.what());
  }
  if (!duplicates.first.empty()) {
    return Status::invalid_argument(what + ": key \"" + duplicates.first +
                                    "\" appears twice in one object");
  }
  if (!out->is_object()) {
    return Status::invalid_argument(what + " must hold a JSON object; got " + describe(*out));
  }
  return Status::ok_status();
}

Status read_file(const std::string& path, std::string* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return Status::invalid_argument("cannot read \"" + path + "\": " + std::strerror(errno));
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    return Status::invalid_argument("cannot read \"" + path + "\": " + std::strerror(errno));
  }
  *out = text.str();
  return Status::ok_status();
}

std::string describe(const Json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + text;
}

ObjectReader::ObjectReader(const Json& object, std::string path, std::string prefix)
    : object_(&object), path_(std::move(path)), prefix_(std::move(prefix)) {}

bool ObjectReader::has(const std::string& key) const {
  return object_->contains(key);
}

bool ObjectReader::is_auto(const std::string& key) const {
  auto it = object_->find(key);
  return it != object_->end() && it->is_string() && it->get<std::string>() == "auto";
}

std::string ObjectReader::path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

Status ObjectReader::error(const std::string& key, const std::string& message) const {
  return Status::invalid_argument(prefix_ + path(key) + " " + message);
}

void ObjectReader::mark_read(const std::string& key) {
  if (std::find(read_.begin(), read_.end(), key) == read_.end()) read_.push_back(key);
}

Status ObjectReader::get_int(const std::string& key, int64_t* out, int64_t min_value) {
  if (!has(key)) return Status::ok_status();
  mark_read(key);
  const Json& v = object_->at(key);
  int64_t value = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return error(key, "is too large; got " + v.dump());
    }
    value = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e15) {
    // DeepSpeed configs often write sizes as 5e8: a float with an integral value is accepted.
    value = static_cast<int64_t>(v.get<double>());
  } else {
    return error(key, "must be an integer; got " + describe(v));
  }
  if (value < min_value) {
    return error(key, "must be >= " + std::to_string(min_value) + "; got " + std::to_string(value));
  }
  *out = value;
  return Status::ok_status();
}

Status ObjectReader::get_number(const std::string& key, double* out) {
  if (!has(key)) return Status::ok_status();
  mark_read(key);
  const Json& v = object_->at(key);
  if (!v.is_number()) return error(key, "must be a number; got " + describe(v));
  const double value = v.get<double>();
  if (!std::isfinite(value)) return error(key, "must be finite; got " + v.dump());
  *out = value;
  return Status::ok_status();
}

Status ObjectReader::get_bool(const std::string& key, bool* out) {
  if (!has(key)) return Status::ok_status();
  mark_read(key);
  const Json& v = object_->at(key);
  if (!v.is_boolean()) return error(key, "must be true or false; got " + describe(v));
  *out = v.get<bool>();
  return Status::ok_status();
}

Status ObjectReader::get_string(const std::string& key, std::string* out) {
  if (!has(key)) return Status::ok_status();
  mark_read(key);
  const Json& v = object_->at(key);
  if (!v.is_string()) return error(key, "must be a string; got " + describe(v));
  *out = v.get<std::string>();
  return Status::ok_status();
}

Status ObjectReader::get_object(const std::string& key, ObjectReader* out) {
  mark_read(key);
  const Json& v = object_->at(key);
  if (!v.is_object()) return error(key, "must be an object; got " + describe(v));
  *out = ObjectReader(v, path(key), prefix_);
  return Status::ok_status();
}

std::vector<std::string> ObjectReader::unread() const {
  std::vector<std::string> keys;
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    if (std::find(read_.begin(), read_.end(), it.key()) == read_.end()) keys.push_back(it.key());
  }
  return keys;
}

}  // namespace sciattn::train::detail

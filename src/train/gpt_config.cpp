// The GPT model file (JSON), the parameter layout and the initialisation. Trainer layer (host
// code).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "sciattn/train/gpt.h"
#include "sciattn/train/random.h"
#include "train/json_util.h"

namespace sciattn::train {
namespace {

using detail::Json;
using detail::ObjectReader;

// The largest sizes accepted, so that a typo fails with a message rather than an allocation.
constexpr int64_t kMaxVocab = int64_t{1} << 31;
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxLength = int64_t{1} << 31;

Status bad(const char* key, const std::string& message) {
  return Status::invalid_argument(std::string("model ") + key + " " + message);
}

}  // namespace

const char* position_encoding_name(PositionEncoding p) {
  return p == PositionEncoding::kLearned ? "learned" : "rotary";
}

int64_t GptConfig::mlp_width() const {
  return static_cast<int64_t>(std::llround(static_cast<double>(d_model) * mlp_ratio));
}

Status validate_gpt_config(const GptConfig& c) {
  if (c.vocab_size < 2 || c.vocab_size > kMaxVocab) {
    return bad("vocab_size", "must be in [2, 2^31]; got " + std::to_string(c.vocab_size));
  }
  if (c.d_model < 2 || c.d_model > kMaxDim) {
    return bad("d_model", "must be in [2, 2^20]; got " + std::to_string(c.d_model));
  }
  if (c.n_layers < 1 || c.n_layers > kMaxLayers) {
    return bad("n_layers", "must be in [1, 4096]; got " + std::to_string(c.n_layers));
  }
  if (c.n_heads < 1 || c.d_model % c.n_heads != 0) {
    return bad("n_heads", "must divide d_model (" + std::to_string(c.d_model) + "); got " +
                              std::to_string(c.n_heads));
  }
  if (c.head_dim() % 2 != 0) {
    return bad("n_heads", "must leave an even head dim (d_model / n_heads); " +
                              std::to_string(c.d_model) + " / " + std::to_string(c.n_heads) +
                              " = " + std::to_string(c.head_dim()));
  }
  if (c.sequence_length < 1 || c.sequence_length > kMaxLength) {
    return bad("sequence_length", "must be in [1, 2^31]; got " + std::to_string(c.sequence_length));
  }
  if (c.positions == PositionEncoding::kLearned && c.max_position_embeddings < c.sequence_length) {
    return bad("max_position_embeddings", "(" + std::to_string(c.max_position_embeddings) +
                                              ") must be at least sequence_length (" +
                                              std::to_string(c.sequence_length) +
                                              ") with learned positions");
  }
  const double width = static_cast<double>(c.d_model) * c.mlp_ratio;
  if (!(c.mlp_ratio > 0.0) || std::fabs(width - std::round(width)) > 1e-9 || width > 1e9) {
    return bad("mlp_ratio", "must be > 0 with d_model * mlp_ratio an integer; got " +
                                std::to_string(c.mlp_ratio) + " (d_model " +
                                std::to_string(c.d_model) + ")");
  }
  if (!(c.init_std > 0.0) || !std::isfinite(c.init_std)) {
    return bad("init_std", "must be a finite number > 0; got " + std::to_string(c.init_std));
  }
  if (!(c.layer_norm_eps > 0.0) || !std::isfinite(c.layer_norm_eps)) {
    return bad("layer_norm_eps",
               "must be a finite number > 0; got " + std::to_string(c.layer_norm_eps));
  }
  if (!(c.rotary_base > 1.0) || !std::isfinite(c.rotary_base)) {
    return bad("rotary_base", "must be a finite number > 1; got " + std::to_string(c.rotary_base));
  }
  return Status::ok_status();
}

Status parse_gpt_config(std::string_view text, const std::string& source, GptConfig* out) {
  Json doc;
  const std::string what = "model file " + source;
  Status s = detail::parse_json(text, what, &doc);
  if (!s.ok()) return s;
  ObjectReader r(doc, "", what + ": ");
  GptConfig c;
  // Unknown keys first: a misspelt key is also a missing one, and its name is the better hint.
  const char* known[] = {"vocab_size", "d_model",         "n_layers",
                         "n_heads",    "sequence_length", "max_position_embeddings",
                         "positions",  "mlp_ratio",       "tie_embeddings",
                         "seed",       "init_std",        "layer_norm_eps",
                         "rotary_base"};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    bool found = false;
    for (const char* k : known) found = found || it.key() == k;
    if (!found) {
      return Status::invalid_argument(
          what + ": unknown key \"" + it.key() +
          "\"; the model file takes vocab_size, d_model, n_layers, n_heads, sequence_length, "
          "max_position_embeddings, positions, mlp_ratio, tie_embeddings, seed, init_std, "
          "layer_norm_eps, rotary_base");
    }
  }
  const char* required[] = {"vocab_size", "d_model", "n_layers", "n_heads", "sequence_length"};
  for (const char* key : required) {
    if (!r.has(key)) {
      return Status::invalid_argument(what + " lacks \"" + key +
                                      "\" (required: vocab_size, d_model, n_layers, n_heads, "
                                      "sequence_length)");
    }
  }
#define SCIATTN_READ(expr)     \
  do {                         \
    Status st_ = (expr);       \
    if (!st_.ok()) return st_; \
  } while (0)
  SCIATTN_READ(r.get_int("vocab_size", &c.vocab_size, 2));
  SCIATTN_READ(r.get_int("d_model", &c.d_model, 2));
  SCIATTN_READ(r.get_int("n_layers", &c.n_layers, 1));
  SCIATTN_READ(r.get_int("n_heads", &c.n_heads, 1));
  SCIATTN_READ(r.get_int("sequence_length", &c.sequence_length, 1));
  c.max_position_embeddings = c.sequence_length;
  SCIATTN_READ(r.get_int("max_position_embeddings", &c.max_position_embeddings, 1));
  std::string positions = "learned";
  SCIATTN_READ(r.get_string("positions", &positions));
  if (positions == "learned") {
    c.positions = PositionEncoding::kLearned;
  } else if (positions == "rotary") {
    c.positions = PositionEncoding::kRotary;
  } else {
    return r.error("positions", "must be \"learned\" or \"rotary\"; got \"" + positions + "\"");
  }
  SCIATTN_READ(r.get_number("mlp_ratio", &c.mlp_ratio));
  SCIATTN_READ(r.get_bool("tie_embeddings", &c.tie_embeddings));
  int64_t seed = 0;
  SCIATTN_READ(r.get_int("seed", &seed, 0));
  c.seed = static_cast<uint64_t>(seed);
  SCIATTN_READ(r.get_number("init_std", &c.init_std));
  SCIATTN_READ(r.get_number("layer_norm_eps", &c.layer_norm_eps));
  SCIATTN_READ(r.get_number("rotary_base", &c.rotary_base));
#undef SCIATTN_READ
  s = validate_gpt_config(c);
  if (!s.ok()) return Status::invalid_argument(what + ": " + s.message());
  *out = c;
  return Status::ok_status();
}

Status load_gpt_config(const std::string& path, GptConfig* out) {
  std::string text;
  Status s = detail::read_file(path, &text);
  if (!s.ok()) return Status::invalid_argument("model file: " + s.message());
  return parse_gpt_config(text, "\"" + path + "\"", out);
}

std::string gpt_config_json(const GptConfig& c) {
  Json j;
  j["vocab_size"] = c.vocab_size;
  j["d_model"] = c.d_model;
  j["n_layers"] = c.n_layers;
  j["n_heads"] = c.n_heads;
  j["sequence_length"] = c.sequence_length;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["positions"] = position_encoding_name(c.positions);
  j["mlp_ratio"] = c.mlp_ratio;
  j["tie_embeddings"] = c.tie_embeddings;
  j["seed"] = c.seed;
  j["init_std"] = c.init_std;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["rotary_base"] = c.rotary_base;
  return j.dump();
}

const TensorSlot* ParameterLayout::find(std::string_view name) const {
  for (const TensorSlot& s : slots) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

int64_t ParameterLayout::parameter_count() const {
  int64_t n = 0;
  for (const TensorSlot& s : slots) n += s.numel;
  return n;
}

int64_t ParameterLayout::matmul_parameter_count() const {
  int64_t n = 0;
  for (const TensorSlot& s : slots) n += s.matmul ? s.numel : 0;
  return n;
}

ParameterLayout gpt_parameter_layout(const GptConfig& c, int64_t total_multiple) {
  ParameterLayout layout;
  const int64_t C = c.d_model, F = c.mlp_width(), V = c.vocab_size;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, bool matmul) {
    TensorSlot s;
    s.name = std::move(name);
    s.numel = 1;
    for (int64_t d : shape) s.numel *= d;
    s.shape = std::move(shape);
    s.offset = layout.total;
    s.weight_decay = decay;
    s.matmul = matmul;
    layout.total += (s.numel + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    layout.slots.push_back(std::move(s));
  };
  // The tied token embedding is also the LM head's matrix.
  add("wte", {V, C}, true, c.tie_embeddings);
  if (c.positions == PositionEncoding::kLearned) {
    add("wpe", {c.max_position_embeddings, C}, true, false);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    add(h + "ln1_w", {C}, false, false);
    add(h + "ln1_b", {C}, false, false);
    add(h + "qkv_w", {3 * C, C}, true, true);
    add(h + "qkv_b", {3 * C}, false, false);
    add(h + "proj_w", {C, C}, true, true);
    add(h + "proj_b", {C}, false, false);
    add(h + "ln2_w", {C}, false, false);
    add(h + "ln2_b", {C}, false, false);
    add(h + "fc_w", {F, C}, true, true);
    add(h + "fc_b", {F}, false, false);
    add(h + "fcproj_w", {C, F}, true, true);
    add(h + "fcproj_b", {C}, false, false);
  }
  add("lnf_w", {C}, false, false);
  add("lnf_b", {C}, false, false);
  if (!c.tie_embeddings) add("lm_head", {V, C}, true, true);
  if (total_multiple > 1) {
    layout.total = (layout.total + total_multiple - 1) / total_multiple * total_multiple;
  }
  // The groups: each starts at its first slot and ends where the next begins (padding included).
  std::vector<std::pair<std::string, std::string>> firsts = {{"embeddings", "wte"}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string h = "h" + std::to_string(l);
    firsts.push_back({h, h + ".ln1_w"});
  }
  firsts.push_back({"head", "lnf_w"});
  for (size_t g = 0; g < firsts.size(); ++g) {
    ParameterGroup group;
    group.name = firsts[g].first;
    group.begin = layout.find(firsts[g].second)->offset;
    group.end = g + 1 < firsts.size() ? layout.find(firsts[g + 1].second)->offset : layout.total;
    layout.groups.push_back(std::move(group));
  }
  return layout;
}

void init_gpt_parameters(const GptConfig& c, const ParameterLayout& layout, float* params) {
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  const int64_t total = layout.total;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total; ++i) params[i] = 0.0f;
  // Slot k draws element i as normal_at(key_k, i): the values depend on the seed, the slot's
  // position in the layout and the element only, so the slots fill in parallel.
  Rng keys(c.seed);
  for (const TensorSlot& s : layout.slots) {
    float* p = params + s.offset;
    const std::string& n = s.name;
    const uint64_t key = keys.next_u64();
    auto ends_with = [&n](const char* suffix) {
      const std::string x(suffix);
      return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
    };
    if (ends_with("ln1_w") || ends_with("ln2_w") || n == "lnf_w") {
      for (int64_t i = 0; i < s.numel; ++i) p[i] = 1.0f;
    } else if (s.shape.size() == 2) {
      const double std = ends_with("proj_w") ? residual_std : c.init_std;
      const int64_t numel = s.numel;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < numel; ++i) {
        p[i] = static_cast<float>(std * normal_at(key, static_cast<uint64_t>(i)));
      }
    }
    // Biases stay 0.
  }
}

}  // namespace sciattn::train

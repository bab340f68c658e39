// The DeepSpeed JSON "sparse_attention" parser (spec 1.7): modes, defaults, and every error
// (malformed JSON, duplicate/unknown keys, wrong types, out-of-range values). Test layer (cpu).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "process_temp_dir.h"
#include "sciattn/block_sparse.h"

namespace sciattn {
namespace {

SparsityConfig parse_ok(const std::string& json, int64_t heads = 4, uint64_t seed = 0) {
  SparsityConfig c;
  Status s = parse_deepspeed_sparsity_config(json, heads, &c, seed);
  EXPECT_TRUE(s.ok()) << s.to_string() << "\n" << json;
  return c;
}

void expect_error(const std::string& json, const std::vector<std::string>& fragments,
                  int64_t heads = 4) {
  SparsityConfig c = DenseSparsityConfig{};  // a failed parse must not write
  Status s = parse_deepspeed_sparsity_config(json, heads, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << json << "\n" << s.to_string();
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), std::string::npos)
        << "message \"" << s.message() << "\" lacks \"" << f << "\"";
  }
  EXPECT_EQ(sparsity_mode(c), SparsityMode::kDense);
}

// DeepSpeed's documented example section: every key, whatever the mode.
const char* kDocsExample = R"({
  "mode": "fixed",
  "block": 16,
  "different_layout_per_head": true,
  "num_local_blocks": 4,
  "num_global_blocks": 1,
  "attention": "bidirectional",
  "horizontal_global_attention": false,
  "num_different_global_patterns": 4,
  "num_random_blocks": 0,
  "local_window_blocks": [4],
  "global_block_indices": [0],
  "global_block_end_indices": null,
  "num_sliding_window_blocks": 3
})";

TEST(DeepSpeedConfig, DocsExampleInAWholeConfig) {
  const std::string whole = std::string(R"({"train_batch_size": 8, "fp16": {"enabled": true},
    "sparse_attention": )") +
                            kDocsExample + "}";
  const SparsityConfig c = parse_ok(whole, 4, 17);
  ASSERT_EQ(sparsity_mode(c), SparsityMode::kFixed);
  const auto& f = std::get<FixedSparsityConfig>(c);
  EXPECT_EQ(f.num_heads, 4);
  EXPECT_EQ(f.seed, 17u);
  EXPECT_EQ(f.block, 16);
  EXPECT_TRUE(f.different_layout_per_head);
  EXPECT_EQ(f.num_local_blocks, 4);
  EXPECT_EQ(f.num_global_blocks, 1);
  EXPECT_EQ(f.attention, AttentionDirection::kBidirectional);
  EXPECT_FALSE(f.horizontal_global_attention);
  EXPECT_EQ(f.num_different_global_patterns, 4);
  // The bare section reads the same.
  EXPECT_EQ(to_string(parse_ok(kDocsExample, 4, 17)), to_string(c));
}

TEST(DeepSpeedConfig, ModeDefaultsToFixedWithJsonDefaults) {
  const SparsityConfig c = parse_ok(R"({"sparse_attention": {}})", 2);
  ASSERT_EQ(sparsity_mode(c), SparsityMode::kFixed);
  EXPECT_EQ(to_string(c), to_string(default_sparsity_config(SparsityMode::kFixed, 2)));
}

TEST(DeepSpeedConfig, EveryMode) {
  SparsityConfig c = parse_ok(R"({"mode": "dense", "block": 64})");
  ASSERT_EQ(sparsity_mode(c), SparsityMode::kDense);
  EXPECT_EQ(std::get<DenseSparsityConfig>(c).block, 64);

  c = parse_ok(R"({"mode": "variable", "block": 32, "different_layout_per_head": true,
                   "num_random_blocks": 2, "local_window_blocks": [1, 2, 3],
                   "global_block_indices": [0, 5], "global_block_end_indices": [2, 7],
                   "attention": "unidirectional"})");
  ASSERT_EQ(sparsity_mode(c), SparsityMode::kVariable);
  const auto& v = std::get<VariableSparsityConfig>(c);
  EXPECT_EQ(v.block, 32);
  EXPECT_TRUE(v.different_layout_per_head);
  EXPECT_EQ(v.num_random_blocks, 2);
  EXPECT_EQ(v.local_window_blocks, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(v.global_block_indices, (std::vector<int64_t>{0, 5}));
  ASSERT_TRUE(v.global_block_end_indices.has_value());
  EXPECT_EQ(*v.global_block_end_indices, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(v.attention, AttentionDirection::kUnidirectional);

  c = parse_ok(R"({"mode": "variable", "horizontal_global_attention": true,
                   "global_block_end_indices": null})");
  EXPECT_TRUE(std::get<VariableSparsityConfig>(c).horizontal_global_attention);
  EXPECT_FALSE(std::get<VariableSparsityConfig>(c).global_block_end_indices.has_value());

  // BigBird's JSON default num_random_blocks is 0, not the class default 1 (spec 1.7).
  c = parse_ok(R"({"mode": "bigbird"})");
  EXPECT_EQ(std::get<BigBirdSparsityConfig>(c).num_random_blocks, 0);
  c = parse_ok(R"({"mode": "bigbird", "num_random_blocks": 2, "num_sliding_window_blocks": 5,
                   "num_global_blocks": 2, "attention": "bidirectional"})");
  const auto& b = std::get<BigBirdSparsityConfig>(c);
  EXPECT_EQ(b.num_random_blocks, 2);
  EXPECT_EQ(b.num_sliding_window_blocks, 5);
  EXPECT_EQ(b.num_global_blocks, 2);

  c = parse_ok(R"({"mode": "bslongformer", "num_sliding_window_blocks": 5,
                   "global_block_indices": [1], "global_block_end_indices": [3]})");
  const auto& l = std::get<BSLongformerSparsityConfig>(c);
  EXPECT_EQ(l.num_sliding_window_blocks, 5);
  EXPECT_EQ(l.global_block_indices, std::vector<int64_t>{1});
  EXPECT_EQ(*l.global_block_end_indices, std::vector<int64_t>{3});
}

// DeepSpeed ignores the keys a mode does not read, including invalid values of them.
TEST(DeepSpeedConfig, KeysOfOtherModesAreIgnored) {
  const SparsityConfig c = parse_ok(R"({"mode": "bigbird", "num_local_blocks": 3,
      "num_global_blocks": 1, "num_different_global_patterns": 9, "horizontal_global_attention": true,
      "local_window_blocks": [], "global_block_indices": [-4]})");
  const auto& b = std::get<BigBirdSparsityConfig>(c);
  EXPECT_EQ(b.num_global_blocks, 1);
  EXPECT_EQ(b.num_random_blocks, 0);
  const SparsityConfig d = parse_ok(R"({"mode": "dense", "different_layout_per_head": true,
                                        "attention": "unidirectional"})");
  EXPECT_FALSE(std::get<DenseSparsityConfig>(d).different_layout_per_head);
}

// The layout from JSON equals the layout from the C++ config.
TEST(DeepSpeedConfig, LayoutFromJsonEqualsLayoutFromStruct) {
  SparsityConfig c =
      parse_ok(R"({"mode": "bigbird", "num_random_blocks": 1})", /*heads=*/1, /*seed=*/0);
  Layout from_json;
  ASSERT_TRUE(make_layout(c, 128, &from_json).ok());
  BigBirdSparsityConfig direct;
  direct.num_heads = 1;
  Layout from_struct;
  ASSERT_TRUE(make_layout(direct, 128, &from_struct).ok());
  EXPECT_EQ(from_json, from_struct);
  EXPECT_EQ(layout_nnz(from_json), 37);  // the seed-0 grid of spec 1.9
}

TEST(DeepSpeedConfig, LoadsFromFile) {
  const std::string path = sciattn::testing::process_temp_dir() + "ds_config_test.json";
  {
    std::ofstream f(path);
    f << R"({"sparse_attention": {"mode": "bslongformer", "block": 128}})";
  }
  SparsityConfig c;
  Status s = load_deepspeed_sparsity_config(path, 3, &c, 5);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(std::get<BSLongformerSparsityConfig>(c).block, 128);
  EXPECT_EQ(sparsity_common(c).num_heads, 3);
  {
    std::ofstream f(path);
    f << R"({"sparse_attention": {"mode": "bigbird",)";
  }
  s = load_deepspeed_sparsity_config(path, 3, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("malformed JSON in \"" + path + "\""), std::string::npos)
      << s.message();
  std::remove(path.c_str());
  s = load_deepspeed_sparsity_config(path, 3, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cannot read \"" + path + "\": No such file"), std::string::npos)
      << s.message();
}

// A directory opens as a stream that reads nothing; the message says what it is instead of
// calling it malformed JSON.
TEST(DeepSpeedConfig, DirectoryIsNamed) {
  const std::string dir = sciattn::testing::process_temp_dir();
  SparsityConfig c;
  const Status s = load_deepspeed_sparsity_config(dir, 3, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"" + dir + "\" is a directory"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("malformed"), std::string::npos) << s.message();
}

// A path that never ends (/dev/zero) or a huge file is refused after 16 MiB, not read until
// memory runs out.
TEST(DeepSpeedConfig, EndlessFileIsRefused) {
  SparsityConfig c;
  const Status s = load_deepspeed_sparsity_config("/dev/zero", 3, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"/dev/zero\" holds more than 16 MiB"), std::string::npos)
      << s.message();
}

// ---- errors ----

TEST(DeepSpeedConfig, MalformedJson) {
  for (const char* bad : {"", "{", R"({"mode": "fixed",})", R"({"mode": fixed})",
                          R"({"block": 16} trailing)", "{'mode': 'fixed'}"}) {
    expect_error(bad, {"malformed JSON in the JSON text", "parse error"});
  }
}

TEST(DeepSpeedConfig, DuplicateKeys) {
  expect_error(R"({"sparse_attention": {"block": 16, "block": 32}})", {"duplicate key \"block\""});
  expect_error(R"({"sparse_attention": {}, "sparse_attention": {}})",
               {"duplicate key \"sparse_attention\""});
}

TEST(DeepSpeedConfig, DocumentShape) {
  expect_error("[1, 2]", {"must hold a JSON object; got array [1,2]"});
  expect_error(R"({"sparse_attention": "fixed"})",
               {"sparse_attention must be an object; got string \"fixed\""});
}

TEST(DeepSpeedConfig, Modes) {
  expect_error(R"({"mode": "longformer"})",
               {"unknown mode \"longformer\"",
                "expected one of \"dense\", \"fixed\", \"variable\", \"bigbird\", "
                "\"bslongformer\""});
  expect_error(R"({"mode": "Fixed"})", {"unknown mode \"Fixed\""});
  expect_error(R"({"mode": "user"})", {"unknown mode \"user\""});
  expect_error(R"({"mode": "local_sliding_window"})",
               {"mode \"local_sliding_window\" cannot be set in a DeepSpeed config"});
  expect_error(R"({"mode": 3})", {"mode must be a string; got number 3"});
}

TEST(DeepSpeedConfig, UnknownKeys) {
  expect_error(R"({"sparse_attention": {"mode": "fixed", "num_local_block": 4}})",
               {"unknown key \"num_local_block\"", "expected one of mode, block,"});
  // A whole DeepSpeed config without a sparse_attention section reads as a bare section.
  expect_error(R"({"train_batch_size": 8})", {"unknown key \"train_batch_size\"",
                                              "keeps these in a \"sparse_attention\" object"});
}

TEST(DeepSpeedConfig, WrongTypes) {
  struct Case {
    const char* json;
    const char* fragment;
  };
  const Case cases[] = {
      {R"({"block": "16"})", "block must be an integer; got string \"16\""},
      {R"({"block": 16.0})", "block must be an integer; got number 16.0"},
      {R"({"num_local_blocks": true})", "num_local_blocks must be an integer; got boolean true"},
      {R"({"num_global_blocks": null})", "num_global_blocks must be an integer; got null"},
      {R"({"num_different_global_patterns": [1]})",
       "num_different_global_patterns must be an integer"},
      {R"({"num_random_blocks": {}})", "num_random_blocks must be an integer; got object"},
      {R"({"num_sliding_window_blocks": 2.5})", "num_sliding_window_blocks must be an integer"},
      {R"({"different_layout_per_head": 1})",
       "different_layout_per_head must be true or false; got number 1"},
      {R"({"horizontal_global_attention": "false"})",
       "horizontal_global_attention must be true or false; got string"},
      {R"({"attention": "causal"})",
       "attention must be \"bidirectional\" or \"unidirectional\"; got \"causal\""},
      {R"({"attention": 1})",
       "attention must be \"bidirectional\" or \"unidirectional\"; got number"},
      {R"({"local_window_blocks": 4})",
       "local_window_blocks must be a list of integers; got number 4"},
      {R"({"global_block_indices": [0, "4"]})",
       "global_block_indices[1] must be an integer; got string \"4\""},
      {R"({"global_block_end_indices": 3})",
       "global_block_end_indices must be a list of integers; got number 3"},
      {R"({"global_block_end_indices": [1.5]})", "global_block_end_indices[0] must be an integer"},
      {R"({"block": 9223372036854775808})", "block (9223372036854775808) is out of range"},
  };
  for (const Case& c : cases) expect_error(c.json, {c.fragment});
}

// Values the config does not accept: the config's own message, naming the parameter.
TEST(DeepSpeedConfig, OutOfRangeValues) {
  expect_error(R"({"block": 24})",
               {"FixedSparsityConfig: block (24) must be one of 16, 32, 64, 128"});
  expect_error(R"({"mode": "fixed", "num_local_blocks": 4, "num_global_blocks": 3})",
               {"num_local_blocks (4) must be divisible by num_global_blocks (3)"});
  expect_error(R"({"num_different_global_patterns": 2})",
               {"num_different_global_patterns (2) > 1 requires different_layout_per_head"});
  expect_error(R"({"attention": "unidirectional", "horizontal_global_attention": true})",
               {"horizontal_global_attention = true requires attention = bidirectional"});
  expect_error(R"({"mode": "variable", "local_window_blocks": []})",
               {"VariableSparsityConfig: local_window_blocks must not be empty"});
  expect_error(R"({"mode": "variable", "global_block_indices": [0, 1],
                   "global_block_end_indices": [2]})",
               {"global_block_end_indices has 1 entries"});
  expect_error(R"({"mode": "bigbird", "num_random_blocks": -1})",
               {"BigBirdSparsityConfig: num_random_blocks (-1) must be >= 0"});
  expect_error(R"({"mode": "bslongformer", "global_block_indices": [-1]})",
               {"global_block_indices[0] (-1) must be >= 0"});
  expect_error(R"({"mode": "dense"})", {"num_heads (0) must be >= 1"}, /*heads=*/0);
}

// DeepSpeed's JSON path drops `attention` for BigBird and BSLongformer (always bidirectional);
// we refuse a unidirectional request instead of silently ignoring it.
TEST(DeepSpeedConfig, AttentionThatDeepSpeedWouldDrop) {
  expect_error(R"({"mode": "bigbird", "attention": "unidirectional"})",
               {"attention \"unidirectional\" is not read for mode \"bigbird\"",
                "always builds it bidirectional"});
  expect_error(R"({"mode": "bslongformer", "attention": "unidirectional"})",
               {"not read for mode \"bslongformer\""});
  const SparsityConfig c = parse_ok(R"({"mode": "bslongformer", "attention": "bidirectional"})");
  EXPECT_EQ(std::get<BSLongformerSparsityConfig>(c).attention, AttentionDirection::kBidirectional);
}

}  // namespace
}  // namespace sciattn

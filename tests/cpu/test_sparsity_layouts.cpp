// Layout algorithms against DeepSpeed's worked examples (spec 1.9) bit for bit, the fixed
// DeepSpeed defects (Decision 3), the crop rule and the density table (spec 1.10). Test layer
// (label cpu).
//
// Grids marked "CPython 3.11.7" have no DeepSpeed original (DeepSpeed fails or the spec gives no
// grid): they were produced once by real CPython `random` driving a direct Python transcription of
// the spec's pseudo-code (sections 1.3 and 1.4, with the Decision 3 rule "unidirectional rows draw
// min(R, r+1) columns from range(r+1)", then a block-level tril). For example:
//
//   random.seed(0)   # Variable, R=2, local [4], global [0], unidirectional, N=8
//   for r in range(8): cols = random.sample(range(r + 1), min(2, r + 1)) ...
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/sparsity_layouts.h"
#include "test_sparsity_util.h"

namespace sciattn {
namespace {

using testing::layout_from_grid;
using testing::layout_from_grids;
using testing::make_ok;

constexpr auto kUni = AttentionDirection::kUnidirectional;
constexpr auto kBi = AttentionDirection::kBidirectional;

// DeepSpeed's grid, defects included.
Layout make_deepspeed(const SparsityConfig& config, int64_t seq_len) {
  detail::LayoutBuildOptions options;
  options.reproduce_deepspeed_defects = true;
  Layout layout;
  Status s = detail::build_layout(config, seq_len, options, &layout);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return layout;
}

FixedSparsityConfig fixed(int64_t heads = 1) {
  FixedSparsityConfig c;
  c.num_heads = heads;
  return c;
}

// ---- spec 1.9: Fixed ----

TEST(SparsityLayoutSpec, FixedBidirectional) {
  const Layout expected = layout_from_grid({"11110001", "11110001", "11110001", "11110001",
                                            "00011111", "00011111", "00011111", "00011111"});
  const Layout got = make_ok(fixed(), 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, expected);
  EXPECT_EQ(layout_nnz(got), 40);
}

TEST(SparsityLayoutSpec, FixedUnidirectional) {
  auto c = fixed();
  c.attention = kUni;
  const Layout expected = layout_from_grid({"10000000", "11000000", "11100000", "11110000",
                                            "00011000", "00011100", "00011110", "00011111"});
  const Layout got = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, expected);
  EXPECT_EQ(layout_nnz(got), 24);
}

TEST(SparsityLayoutSpec, FixedShortTrailingWindow) {
  auto c = fixed();
  const Layout plain =
      layout_from_grid({"1111000101", "1111000101", "1111000101", "1111000101", "0001111101",
                        "0001111101", "0001111101", "0001111101", "0001000111", "0001000111"});
  Layout got = make_ok(c, 160);
  SCIATTN_EXPECT_LAYOUT_EQ(got, plain);
  EXPECT_EQ(layout_nnz(got), 56);

  c.horizontal_global_attention = true;
  const Layout horizontal =
      layout_from_grid({"1111000101", "1111000101", "1111000101", "1111111111", "0001111101",
                        "0001111101", "0001111101", "1111111111", "0001000111", "1111111111"});
  got = make_ok(c, 160);
  SCIATTN_EXPECT_LAYOUT_EQ(got, horizontal);
  EXPECT_EQ(layout_nnz(got), 70);
}

TEST(SparsityLayoutSpec, FixedPerHeadGlobalPatterns) {
  auto c = fixed(4);
  c.different_layout_per_head = true;
  c.num_different_global_patterns = 4;
  auto head = [](const std::string& top, const std::string& bottom) {
    return std::vector<std::string>{top, top, top, top, bottom, bottom, bottom, bottom};
  };
  const Layout expected =
      layout_from_grids({head("11110001", "00011111"), head("11110010", "00101111"),
                         head("11110100", "01001111"), head("11111000", "10001111")});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 128), expected);
}

// Decision 3: DeepSpeed's unidirectional Fixed with G > 1 puts (2,3) and (6,7) above the
// diagonal; ours is causal and otherwise equal.
TEST(SparsityLayoutSpec, FixedTwoGlobalBlocksUnidirectionalIsCausal) {
  auto c = fixed();
  c.num_global_blocks = 2;
  c.attention = kUni;
  const Layout deepspeed = layout_from_grid({"10000000", "11000000", "11110000", "11110000",
                                             "00111000", "00111100", "00111111", "00111111"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_deepspeed(c, 128), deepspeed);
  EXPECT_FALSE(layout_is_block_causal(deepspeed));

  Layout expected = deepspeed;
  expected.at(0, 2, 3) = 0;
  expected.at(0, 6, 7) = 0;
  const Layout ours = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(ours, expected);
  EXPECT_TRUE(layout_is_block_causal(ours));
}

// ---- spec 1.9: BSLongformer ----

TEST(SparsityLayoutSpec, BSLongformerBothDirections) {
  BSLongformerSparsityConfig c;
  c.num_heads = 1;
  const Layout bi = layout_from_grid({"11111111", "11100000", "11110000", "10111000", "10011100",
                                      "10001110", "10000111", "10000011"});
  Layout got = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, bi);
  EXPECT_EQ(layout_nnz(got), 34);

  c.attention = kUni;
  const Layout uni = layout_from_grid({"10000000", "11000000", "11100000", "10110000", "10011000",
                                       "10001100", "10000110", "10000011"});
  got = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, uni);
  EXPECT_EQ(layout_nnz(got), 21);
}

TEST(SparsityLayoutSpec, BSLongformerGlobalRange) {
  BSLongformerSparsityConfig c;
  c.num_heads = 1;
  c.global_block_indices = {1};
  c.global_block_end_indices = std::vector<int64_t>{3};
  const Layout expected = layout_from_grid({"11100000", "11111111", "11111111", "01111000",
                                            "01111100", "01101110", "01100111", "01100011"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 128), expected);
}

// ---- spec 1.9: LocalSlidingWindow ----

TEST(SparsityLayoutSpec, LocalSlidingWindow) {
  LocalSlidingWindowSparsityConfig c;
  c.num_heads = 1;
  const Layout uni3 = layout_from_grid({"10000000", "11000000", "01100000", "00110000", "00011000",
                                        "00001100", "00000110", "00000011"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 128), uni3);

  c.attention = kBi;
  const Layout bi3 = layout_from_grid({"11000000", "11100000", "01110000", "00111000", "00011100",
                                       "00001110", "00000111", "00000011"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 128), bi3);

  c.attention = kUni;
  c.num_sliding_window_blocks = 4;
  const Layout uni4 = layout_from_grid({"10000000", "11000000", "11100000", "01110000", "00111000",
                                        "00011100", "00001110", "00000111"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 128), uni4);
}

// ---- spec 1.9: Variable ----

TEST(SparsityLayoutSpec, VariableWindowsRepeatLastSize) {
  VariableSparsityConfig c;
  c.num_heads = 1;
  c.local_window_blocks = {1, 2, 3};
  c.attention = kUni;
  const Layout expected =
      layout_from_grid({"1000000000", "1100000000", "1110000000", "1001000000", "1001100000",
                        "1001110000", "1000001000", "1000001100", "1000001110", "1000000001"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 160), expected);
}

// DeepSpeed's unidirectional Variable draws random blocks from every column (spec grid, seed 0);
// ours draws min(R, r+1) from [0, r] and is causal.
TEST(SparsityLayoutSpec, VariableRandomUnidirectionalIsCausal) {
  VariableSparsityConfig c;
  c.num_heads = 1;
  c.num_random_blocks = 2;
  c.attention = kUni;
  const Layout deepspeed = layout_from_grid({"10000011", "11000010", "11101001", "11110001",
                                             "10011000", "10001100", "10011110", "10101111"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_deepspeed(c, 128), deepspeed);
  EXPECT_FALSE(layout_is_block_causal(deepspeed));

  // CPython 3.11.7 (see the file comment).
  const Layout expected = layout_from_grid({"10000000", "11000000", "11100000", "11110000",
                                            "10111000", "11001100", "11001110", "11001111"});
  const Layout ours = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(ours, expected);
  EXPECT_TRUE(layout_is_block_causal(ours));
}

// Not in the spec's list: unidirectional Variable global ranges [s, e) start at row s, so DeepSpeed
// sets (s, s+1) .. (s, e-1) above the diagonal. Ours is causal and otherwise equal.
TEST(SparsityLayoutSpec, VariableGlobalRangeUnidirectionalIsCausal) {
  VariableSparsityConfig c;
  c.num_heads = 1;
  c.local_window_blocks = {1};
  c.global_block_indices = {1};
  c.global_block_end_indices = std::vector<int64_t>{3};
  c.attention = kUni;
  const Layout deepspeed = layout_from_grid(
      {"1000000", "0110000", "0110000", "0111000", "0110100", "0110010", "0110001"});
  SCIATTN_EXPECT_LAYOUT_EQ(make_deepspeed(c, 7 * 16), deepspeed);
  Layout expected = deepspeed;
  expected.at(0, 1, 2) = 0;
  const Layout ours = make_ok(c, 7 * 16);
  SCIATTN_EXPECT_LAYOUT_EQ(ours, expected);
  EXPECT_TRUE(layout_is_block_causal(ours));
}

// Bidirectional Variable has no defect: DeepSpeed draws the same random columns as in the
// unidirectional spec grid above, so the spec grid is contained in this one.
TEST(SparsityLayoutSpec, VariableRandomBidirectional) {
  VariableSparsityConfig c;
  c.num_heads = 1;
  c.num_random_blocks = 2;
  // CPython 3.11.7.
  const Layout expected = layout_from_grid({"11110011", "11110010", "11111001", "11110001",
                                            "10011111", "10001111", "10011111", "10101111"});
  const Layout got = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, expected);
  const Layout deepspeed_uni = layout_from_grid({"10000011", "11000010", "11101001", "11110001",
                                                 "10011000", "10001100", "10011110", "10101111"});
  for (size_t i = 0; i < got.blocks.size(); ++i) {
    EXPECT_GE(got.blocks[i], deepspeed_uni.blocks[i]) << "block " << i;
  }
}

TEST(SparsityLayoutSpec, VariablePerHeadDrawsHeadsInOrder) {
  VariableSparsityConfig c;
  c.num_heads = 2;
  c.seed = 3;
  c.different_layout_per_head = true;
  c.num_random_blocks = 1;
  c.local_window_blocks = {2, 3};
  c.global_block_indices = {1};
  // CPython 3.11.7.
  const Layout expected =
      layout_from_grids({{"110100000000", "110000000100", "011110001000", "011110000000",
                          "011111000000", "010001110100", "010001110000", "010001110010",
                          "010000001110", "010000001110", "010000001110", "110000000001"},
                         {"110000010000", "110010000000", "011110001000", "011110000000",
                          "011110000000", "010001110001", "010001110000", "010001111000",
                          "010000001110", "010000011110", "010000101110", "010000000011"}});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 12 * 16), expected);
}

// ---- spec 1.9: BigBird ----

TEST(SparsityLayoutSpec, BigBirdDefaultsSeed0) {
  BigBirdSparsityConfig c;
  c.num_heads = 1;
  c.seed = 0;
  const Layout expected = layout_from_grid({"11111111", "11100010", "11110000", "10111000",
                                            "10011101", "10001110", "10001111", "10000011"});
  const Layout got = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, expected);
  EXPECT_EQ(layout_nnz(got), 37);
}

// DeepSpeed fails for unidirectional BigBird with R >= 2 (row 0 samples 2 of 1); ours samples
// min(R, r+1) of [0, r].
TEST(SparsityLayoutSpec, BigBirdUnidirectionalTwoRandomBlocks) {
  BigBirdSparsityConfig c;
  c.num_heads = 1;
  c.num_random_blocks = 2;
  c.attention = kUni;
  detail::LayoutBuildOptions deepspeed;
  deepspeed.reproduce_deepspeed_defects = true;
  Layout unused;
  Status s = detail::build_layout(c, 128, deepspeed, &unused);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Sample larger than population"), std::string::npos) << s.message();

  // CPython 3.11.7.
  const Layout expected = layout_from_grid({"10000000", "11000000", "11100000", "11110000",
                                            "10111000", "11001100", "11001110", "11001011"});
  const Layout got = make_ok(c, 128);
  SCIATTN_EXPECT_LAYOUT_EQ(got, expected);
  EXPECT_TRUE(layout_is_block_causal(got));
}

TEST(SparsityLayoutSpec, BigBirdPerHeadSeed7) {
  BigBirdSparsityConfig c;
  c.num_heads = 2;
  c.seed = 7;
  c.different_layout_per_head = true;
  c.num_random_blocks = 3;  // sample(range(16), 3) takes CPython's pool path
  // CPython 3.11.7.
  const Layout expected = layout_from_grids(
      {{"1111111111111111", "1110000000000101", "1111010001000000", "1111100010000010",
        "1101111000000000", "1100111000000100", "1100011110000000", "1000001110000101",
        "1001000111100001", "1100000011100010", "1001000001111000", "1100000010111100",
        "1000101000011101", "1100100010001110", "1000000011000111", "1100010001000011"},
       {"1111111111111111", "1110000001000000", "1111001100100000", "1011110000001100",
        "1001110101000010", "1001111000010000", "1000011100011000", "1100001111000000",
        "1000000111000000", "1000000111110000", "1100000001110001", "1001001010111000",
        "1000010000011101", "1000100100001110", "1000000000100111", "1010000010001011"}});
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 256), expected);

  // Head 0 draws first, so it equals the shared layout with the same seed.
  c.different_layout_per_head = false;
  const Layout shared = make_ok(c, 256);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t r = 0; r < 16; ++r) {
      for (int64_t col = 0; col < 16; ++col) {
        EXPECT_EQ(shared.at(h, r, col), expected.at(0, r, col));
      }
    }
  }
}

// ---- spec 1.9: crop vs fresh ----

TEST(SparsityLayoutSpec, CropOfMaxLengthDiffersFromFresh) {
  const auto c = fixed();
  Layout crop;
  ASSERT_TRUE(make_layout_for_length(c, kDefaultMaxSeqLength, 160, &crop).ok());
  const Layout fresh = make_ok(c, 160);
  // The crop has no global column 9 (its windows continue past block 10).
  Layout expected = fresh;
  for (int64_t r = 0; r < 8; ++r) expected.at(0, r, 9) = 0;
  SCIATTN_EXPECT_LAYOUT_EQ(crop, expected);
  EXPECT_EQ(layout_to_string(crop).substr(0, 19), "head 0:\n1111000100\n");
  EXPECT_NE(crop, fresh);
}

TEST(SparsityCrop, CropIsTopLeftCornerOfEveryHead) {
  BigBirdSparsityConfig c;
  c.num_heads = 3;
  c.different_layout_per_head = true;
  c.num_random_blocks = 2;
  c.seed = 11;
  const Layout full = make_ok(c, 1024);
  Layout crop;
  ASSERT_TRUE(crop_layout(full, 16, 320, &crop).ok());
  ASSERT_EQ(crop.num_heads, 3);
  ASSERT_EQ(crop.num_row_blocks, 20);
  ASSERT_EQ(crop.num_col_blocks, 20);
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t r = 0; r < 20; ++r) {
      for (int64_t col = 0; col < 20; ++col) EXPECT_EQ(crop.at(h, r, col), full.at(h, r, col));
    }
  }
  Layout same;
  ASSERT_TRUE(crop_layout(full, 16, 1024, &same).ok());
  EXPECT_EQ(same, full);
}

// Patterns that do not depend on the end of the sequence crop to their fresh layout.
TEST(SparsityCrop, PositionInvariantPatternsCropToFresh) {
  LocalSlidingWindowSparsityConfig window;
  window.num_heads = 2;
  BSLongformerSparsityConfig longformer;
  longformer.num_heads = 2;
  BigBirdSparsityConfig bigbird;
  bigbird.num_heads = 2;
  bigbird.num_random_blocks = 0;
  DenseSparsityConfig dense;
  dense.num_heads = 2;
  for (const SparsityConfig& c : std::vector<SparsityConfig>{window, longformer, bigbird, dense}) {
    // (A fresh layout needs seq_len / block >= the window; the crop of a longer one does not.)
    for (int64_t len : {48, 160, 512}) {
      Layout crop;
      ASSERT_TRUE(make_layout_for_length(c, 512, len, &crop).ok());
      SCIATTN_EXPECT_LAYOUT_EQ(crop, make_ok(c, len));
    }
  }
}

// ---- other configs ----

TEST(SparsityLayouts, DenseIsAllOnes) {
  DenseSparsityConfig c;
  c.num_heads = 3;
  c.different_layout_per_head = true;  // ignored
  const Layout got = make_ok(c, 64);
  EXPECT_EQ(got.num_heads, 3);
  EXPECT_EQ(got.num_row_blocks, 4);
  EXPECT_EQ(layout_nnz(got), 3 * 16);
  EXPECT_DOUBLE_EQ(layout_density(got), 1.0);
}

TEST(SparsityLayouts, UserLayoutIsCopiedOrBroadcast) {
  const Layout one = layout_from_grid({"1000", "1100", "0110", "0011"});
  UserSparsityConfig c;
  c.num_heads = 3;
  c.block = 32;
  c.layout = one;
  const Layout got = make_ok(c, 128);
  ASSERT_EQ(got.num_heads, 3);
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t col = 0; col < 4; ++col) EXPECT_EQ(got.at(h, r, col), one.at(0, r, col));
    }
  }
  const Layout two = layout_from_grids({{"10", "11"}, {"11", "01"}});
  c.num_heads = 2;
  c.layout = two;
  SCIATTN_EXPECT_LAYOUT_EQ(make_ok(c, 64), two);
}

TEST(SparsityLayouts, EveryBlockSizeAndLengthOneBlock) {
  for (int64_t block : kSupportedBlockSizes) {
    for (SparsityMode mode :
         {SparsityMode::kDense, SparsityMode::kFixed, SparsityMode::kVariable,
          SparsityMode::kBigBird, SparsityMode::kBSLongformer, SparsityMode::kLocalSlidingWindow}) {
      SparsityConfig c = default_sparsity_config(mode, 2);
      sparsity_common(c).block = block;
      if (auto* b = std::get_if<BigBirdSparsityConfig>(&c)) b->num_sliding_window_blocks = 1;
      if (auto* l = std::get_if<LocalSlidingWindowSparsityConfig>(&c)) {
        l->num_sliding_window_blocks = 1;
      }
      if (auto* l = std::get_if<BSLongformerSparsityConfig>(&c)) l->num_sliding_window_blocks = 1;
      // One block: every pattern attends to it.
      Layout one = make_ok(c, block);
      EXPECT_EQ(layout_nnz(one), 2) << to_string(c);
      Layout more = make_ok(c, 8 * block);
      EXPECT_EQ(more.num_row_blocks, 8) << to_string(c);
    }
  }
}

TEST(SparsityLayouts, SeedSelectsTheRandomBlocksDeterministically) {
  BigBirdSparsityConfig c;
  c.num_heads = 1;
  c.num_random_blocks = 2;
  c.seed = 123;
  const Layout a = make_ok(c, 1024);
  const Layout b = make_ok(c, 1024);
  EXPECT_EQ(a.blocks, b.blocks);  // bitwise
  c.seed = 124;
  EXPECT_NE(make_ok(c, 1024), a);
}

// The density table of spec 1.10 (DeepSpeed at commit 38327e07; BigBird after random.seed(0)),
// which the spec rounds to 0.1% (0.01% below 1%; 18.75% is printed as 18.8%).
TEST(SparsityLayouts, DensityTableOfTheSpec) {
  struct Row {
    SparsityConfig config;
    int64_t seq_len;
    double percent;
    double tolerance;
    int64_t max_row;  // -1: not in the table
  };
  auto fixed_config = [](AttentionDirection d) {
    FixedSparsityConfig c;
    c.num_heads = 1;
    c.attention = d;
    return c;
  };
  BigBirdSparsityConfig bigbird;
  bigbird.num_heads = 1;
  BSLongformerSparsityConfig longformer;
  longformer.num_heads = 1;
  BigBirdSparsityConfig bigbird64;
  bigbird64.num_heads = 1;
  bigbird64.block = 64;
  bigbird64.num_random_blocks = 3;
  bigbird64.num_global_blocks = 2;
  const std::vector<Row> rows = {
      {fixed_config(kBi), 512, 34.4, 0.05, -1},
      {fixed_config(kBi), 4096, 26.2, 0.05, -1},
      {fixed_config(kBi), 16384, 25.3, 0.05, 259},
      {fixed_config(kUni), 512, 18.8, 0.05, -1},
      {fixed_config(kUni), 4096, 13.3, 0.05, -1},
      {fixed_config(kUni), 16384, 12.7, 0.05, 259},
      {bigbird, 512, 17.7, 0.05, -1},
      {bigbird, 4096, 2.3, 0.05, -1},
      {bigbird, 16384, 0.58, 0.005, 1024},
      {longformer, 512, 15.0, 0.05, -1},
      {longformer, 4096, 1.9, 0.05, -1},
      {longformer, 16384, 0.49, 0.005, 1024},
      // The spec does not say this row was drawn after random.seed(0): seed 0 gives 3.845%,
      // seeds 0..199 give 3.842%..3.870% (mean 3.856%), so allow one more rounding step.
      {bigbird64, 4096, 15.0, 0.05, -1},
      {bigbird64, 16384, 3.9, 0.06, 256},
  };
  for (const Row& row : rows) {
    const Layout l = make_ok(row.config, row.seq_len);
    EXPECT_NEAR(100.0 * layout_density(l), row.percent, row.tolerance + 1e-9)
        << to_string(row.config) << " at L=" << row.seq_len;
    if (row.max_row >= 0) {
      EXPECT_EQ(layout_max_row_nnz(l), row.max_row) << to_string(row.config);
    }
  }
}

}  // namespace
}  // namespace sciattn

// Tests that build_sparse_attention_index (the index built from a config without the dense
// layout) equals build_block_sparse_index(make_layout_for_length(...)) array by array, and fails
// with the same Status and message, for every config type over many parameters, seeds, blocks,
// lengths and crops. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn {
namespace {

void expect_same_split(const BlockSparseWorkSplit& a, const BlockSparseWorkSplit& b,
                       const std::string& what) {
  EXPECT_EQ(a.max_blocks, b.max_blocks) << what;
  EXPECT_EQ(a.line_items, b.line_items) << what;
  EXPECT_EQ(a.item_line, b.item_line) << what;
  EXPECT_EQ(a.item_begin, b.item_begin) << what;
  EXPECT_EQ(a.item_end, b.item_end) << what;
  EXPECT_EQ(a.split_lines, b.split_lines) << what;
  EXPECT_EQ(a.max_pieces_per_line, b.max_pieces_per_line) << what;
}

// The dense route (the definition) against build_sparse_attention_index. Returns whether the
// routes succeeded, so that sweeps can count the cases that built an index.
bool expect_same_index(const SparsityConfig& config, int64_t max_seq_length, int64_t seq_len) {
  const std::string what = to_string(config) + " max_seq_length=" + std::to_string(max_seq_length) +
                           " seq_len=" + std::to_string(seq_len);
  BlockSparseIndex want;
  Layout layout;
  Status want_status = make_layout_for_length(config, max_seq_length, seq_len, &layout);
  if (want_status.ok()) {
    want_status = build_block_sparse_index(layout, sparsity_common(config).block, &want);
  }
  BlockSparseIndex got;
  const Status got_status = build_sparse_attention_index(config, max_seq_length, seq_len, &got);
  EXPECT_EQ(got_status.code(), want_status.code()) << what;
  EXPECT_EQ(got_status.message(), want_status.message()) << what;
  if (!want_status.ok() || !got_status.ok()) return false;
  EXPECT_EQ(got.block, want.block) << what;
  EXPECT_EQ(got.num_heads, want.num_heads) << what;
  EXPECT_EQ(got.num_row_blocks, want.num_row_blocks) << what;
  EXPECT_EQ(got.num_col_blocks, want.num_col_blocks) << what;
  EXPECT_EQ(got.nnz, want.nnz) << what;
  EXPECT_EQ(got.layout_heads, want.layout_heads) << what;
  EXPECT_EQ(got.head, want.head) << what;
  EXPECT_EQ(got.row, want.row) << what;
  EXPECT_EQ(got.col, want.col) << what;
  EXPECT_EQ(got.row_offsets, want.row_offsets) << what;
  EXPECT_EQ(got.col_offsets, want.col_offsets) << what;
  EXPECT_EQ(got.col_rows, want.col_rows) << what;
  EXPECT_EQ(got.col_blocks, want.col_blocks) << what;
  EXPECT_EQ(got.max_row_nnz, want.max_row_nnz) << what;
  EXPECT_EQ(got.max_col_nnz, want.max_col_nnz) << what;
  expect_same_split(got.row_split, want.row_split, what + " row_split");
  expect_same_split(got.col_split, want.col_split, what + " col_split");
  EXPECT_EQ(got.device, nullptr) << what;
  return true;
}

// Lengths for a config of block b: the layout's own length and crops of it (one block, a few
// blocks, all but one), plus invalid crops (not a multiple, zero, longer than max).
void expect_same_over_lengths(const SparsityConfig& config, int64_t max_blocks, int* built) {
  const int64_t b = sparsity_common(config).block;
  const int64_t max_len = max_blocks * b;
  for (int64_t len : {max_len, b, 3 * b, (max_blocks - 1) * b}) {
    if (len < 1 || len > max_len) continue;
    *built += expect_same_index(config, max_len, len) ? 1 : 0;
  }
}

AttentionDirection direction(bool uni) {
  return uni ? AttentionDirection::kUnidirectional : AttentionDirection::kBidirectional;
}

TEST(SparseIndexFromConfig, BigBirdSweep) {
  int built = 0;
  for (int64_t heads : {1, 3})
    for (int64_t block : {16, 32})
      for (uint64_t seed : {0u, 1u, 7u})
        for (int64_t random : {0, 1, 2, 3})
          for (int64_t window : {1, 2, 3, 5})
            for (int64_t global : {1, 2})
              for (bool uni : {false, true})
                for (bool per_head : {false, true}) {
                  BigBirdSparsityConfig c;
                  c.num_heads = heads;
                  c.block = block;
                  c.seed = seed;
                  c.num_random_blocks = random;
                  c.num_sliding_window_blocks = window;
                  c.num_global_blocks = global;
                  c.attention = direction(uni);
                  c.different_layout_per_head = per_head;
                  expect_same_over_lengths(c, 11, &built);
                }
  EXPECT_GT(built, 1000);
}

TEST(SparseIndexFromConfig, BSLongformerSweep) {
  using Ends = std::optional<std::vector<int64_t>>;
  const std::vector<std::pair<std::vector<int64_t>, Ends>> globals = {
      {{0}, std::nullopt},
      {{0, 5}, std::nullopt},
      {{3, 100}, std::nullopt},
      {{1, 6}, Ends(std::vector<int64_t>{3, 8})},
      {{2}, Ends(std::vector<int64_t>{100})},
      {{}, std::nullopt},
      {{4, 9}, Ends(std::vector<int64_t>{5, 12})}};
  int built = 0;
  for (int64_t heads : {1, 4})
    for (int64_t window : {1, 3, 4, 7})
      for (const auto& [starts, ends] : globals)
        for (bool uni : {false, true})
          for (bool per_head : {false, true}) {
            BSLongformerSparsityConfig c;
            c.num_heads = heads;
            c.block = 16;
            c.num_sliding_window_blocks = window;
            c.global_block_indices = starts;
            c.global_block_end_indices = ends;
            c.attention = direction(uni);
            c.different_layout_per_head = per_head;
            expect_same_over_lengths(c, 10, &built);
            expect_same_over_lengths(c, 4, &built);
          }
  EXPECT_GT(built, 300);
}

TEST(SparseIndexFromConfig, FixedSweep) {
  int built = 0;
  for (int64_t heads : {1, 4})
    for (int64_t local : {1, 2, 4, 6})
      for (int64_t global : {1, 2, 3})
        for (int64_t patterns : {1, 2, 3})
          for (bool uni : {false, true})
            for (bool horizontal : {false, true})
              for (bool per_head : {false, true}) {
                FixedSparsityConfig c;
                c.num_heads = heads;
                c.block = 32;
                c.num_local_blocks = local;
                c.num_global_blocks = global;
                c.num_different_global_patterns = patterns;
                c.attention = direction(uni);
                c.horizontal_global_attention = horizontal;
                c.different_layout_per_head = per_head;
                // Invalid combinations (local not a multiple of global, horizontal with
                // unidirectional, patterns without per-head layouts) must fail alike.
                expect_same_over_lengths(c, 13, &built);
                expect_same_over_lengths(c, 2, &built);
              }
  EXPECT_GT(built, 100);
}

TEST(SparseIndexFromConfig, VariableSweep) {
  using Ends = std::optional<std::vector<int64_t>>;
  const std::vector<std::vector<int64_t>> windows = {{4}, {1, 2, 3}, {2, 5}, {20}};
  const std::vector<std::pair<std::vector<int64_t>, Ends>> globals = {
      {{0}, std::nullopt},
      {{1, 6}, std::nullopt},
      {{0, 3, 9}, std::nullopt},
      {{2, 7}, Ends(std::vector<int64_t>{4, 30})},
      {{5}, Ends(std::vector<int64_t>{6})},
      {{}, std::nullopt}};
  int built = 0;
  for (int64_t heads : {1, 3})
    for (uint64_t seed : {0u, 5u})
      for (int64_t random : {0, 1, 2})
        for (const auto& w : windows)
          for (const auto& [starts, ends] : globals)
            for (bool uni : {false, true})
              for (bool horizontal : {false, true})
                for (bool per_head : {false, true}) {
                  VariableSparsityConfig c;
                  c.num_heads = heads;
                  c.block = 16;
                  c.seed = seed;
                  c.num_random_blocks = random;
                  c.local_window_blocks = w;
                  c.global_block_indices = starts;
                  c.global_block_end_indices = ends;
                  c.attention = direction(uni);
                  c.horizontal_global_attention = horizontal;
                  c.different_layout_per_head = per_head;
                  expect_same_over_lengths(c, 12, &built);
                }
  EXPECT_GT(built, 1000);
}

TEST(SparseIndexFromConfig, LocalSlidingWindowDenseAndUser) {
  int built = 0;
  for (int64_t window : {1, 2, 3, 6})
    for (bool uni : {false, true}) {
      LocalSlidingWindowSparsityConfig c;
      c.num_heads = 2;
      c.block = 64;
      c.num_sliding_window_blocks = window;
      c.attention = direction(uni);
      expect_same_over_lengths(c, 9, &built);
    }
  DenseSparsityConfig dense;
  dense.num_heads = 3;
  dense.block = 128;
  expect_same_over_lengths(dense, 5, &built);
  // A user layout is given for exactly its length (shared by the heads, or one per head).
  std::mt19937 rng(3);
  for (int64_t layout_heads : {1, 2}) {
    UserSparsityConfig u;
    u.num_heads = 2;
    u.block = 16;
    u.layout = Layout::zeros(layout_heads, 6, 6);
    for (uint8_t& e : u.layout.blocks) e = static_cast<uint8_t>(rng() % 3 == 0);
    built += expect_same_index(u, 96, 96) ? 1 : 0;
    expect_same_index(u, 96, 48);  // fails: the user layout is for 96 tokens only
  }
  EXPECT_GE(built, 8 * 4 + 4 + 2);
}

// Random configs of every kind, valid or not, at random lengths and crops: whatever the dense
// route does (an index or a Status), the sparse route does the same.
TEST(SparseIndexFromConfig, RandomConfigsAndLengths) {
  std::mt19937_64 rng(2026);
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  auto indices = [&](int64_t count, int64_t hi) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < count; ++i) v.push_back(pick(0, hi));
    std::sort(v.begin(), v.end());
    return v;
  };
  const int64_t blocks[] = {16, 32, 64, 128};
  int built = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const int64_t block = blocks[pick(0, 3)];
    const int64_t heads = pick(1, 4);
    const bool uni = pick(0, 1) == 1;
    const bool per_head = pick(0, 1) == 1;
    const auto seed = static_cast<uint64_t>(pick(0, 1000));
    SparsityConfig config;
    switch (pick(0, 3)) {
      case 0: {
        BigBirdSparsityConfig c;
        c.num_random_blocks = pick(0, 4);
        c.num_sliding_window_blocks = pick(1, 9);
        c.num_global_blocks = pick(1, 4);
        c.attention = direction(uni);
        c.different_layout_per_head = per_head;
        config = c;
        break;
      }
      case 1: {
        BSLongformerSparsityConfig c;
        c.num_sliding_window_blocks = pick(1, 9);
        c.global_block_indices = indices(pick(0, 3), 20);
        if (pick(0, 1) == 1) {
          std::vector<int64_t> ends;
          for (int64_t s : c.global_block_indices) ends.push_back(s + pick(0, 4));
          c.global_block_end_indices = ends;
        }
        c.attention = direction(uni);
        c.different_layout_per_head = per_head;
        config = c;
        break;
      }
      case 2: {
        FixedSparsityConfig c;
        c.num_global_blocks = pick(1, 3);
        c.num_local_blocks = c.num_global_blocks * pick(1, 4) + (pick(0, 9) == 0 ? 1 : 0);
        c.num_different_global_patterns = pick(1, 3);
        c.attention = direction(uni);
        c.horizontal_global_attention = pick(0, 2) == 0;
        c.different_layout_per_head = per_head;
        config = c;
        break;
      }
      default: {
        VariableSparsityConfig c;
        c.num_random_blocks = pick(0, 3);
        c.local_window_blocks = indices(pick(1, 3), 6);
        for (int64_t& w : c.local_window_blocks) w += 1;
        c.global_block_indices = indices(pick(0, 3), 20);
        if (pick(0, 1) == 1) {
          std::vector<int64_t> ends;
          for (int64_t s : c.global_block_indices) ends.push_back(s + pick(0, 5));
          c.global_block_end_indices = ends;
        }
        c.attention = direction(uni);
        c.horizontal_global_attention = pick(0, 2) == 0;
        c.different_layout_per_head = per_head;
        config = c;
        break;
      }
    }
    sparsity_common(config).num_heads = heads;
    sparsity_common(config).block = block;
    sparsity_common(config).seed = seed;
    const int64_t max_blocks = pick(1, 40);
    int64_t max_len = max_blocks * block;
    int64_t len = pick(1, max_blocks) * block;
    if (pick(0, 19) == 0) len += pick(1, block - 1);      // not a multiple of block
    if (pick(0, 29) == 0) max_len += pick(1, block - 1);  // nor the layout's length
    if (pick(0, 29) == 0) len = max_len + block;          // longer than the layout
    if (pick(0, 49) == 0) len = 0;
    built += expect_same_index(config, max_len, len) ? 1 : 0;
  }
  EXPECT_GT(built, 2000);
}

// Errors that do not depend on the painting: invalid configs and lengths.
TEST(SparseIndexFromConfig, ErrorsMatch) {
  BigBirdSparsityConfig bad_block;
  bad_block.num_heads = 2;
  bad_block.block = 24;
  expect_same_index(bad_block, 240, 240);
  BigBirdSparsityConfig no_heads;
  expect_same_index(no_heads, 160, 160);
  BigBirdSparsityConfig too_random;  // num_random_blocks > blocks of max_seq_length
  too_random.num_heads = 1;
  too_random.num_random_blocks = 5;
  expect_same_index(too_random, 64, 64);
  FixedSparsityConfig fixed;
  fixed.num_heads = 1;
  fixed.num_global_blocks = 2;
  fixed.num_local_blocks = 4;
  expect_same_index(fixed, 16, 16);    // num_global_blocks > 1 block
  expect_same_index(fixed, 160, 161);  // seq_len > max_seq_length
  expect_same_index(fixed, 160, 40);   // not a multiple of block
  expect_same_index(fixed, 160, 0);    // not positive
  expect_same_index(fixed, 170, 160);  // max_seq_length not a multiple
  expect_same_index(fixed, -16, -32);  // negative lengths
  // Too many layout entries: the sparse route keeps make_layout's limit.
  BSLongformerSparsityConfig huge;
  huge.num_heads = 16;
  huge.block = 16;
  expect_same_index(huge, int64_t{1} << 20, 1024);
  EXPECT_FALSE(build_sparse_attention_index(huge, 1024, 1024, nullptr).ok());
}

// Rows painted with more one-row ranges than the sparse build sorts by insertion (16): many
// random blocks per row (BigBird, Variable), so that a row's ranges arrive out of order and take
// the other sort. A build that left them unsorted would list columns twice or skip them.
TEST(SparseIndexFromConfig, RowsWithManyRandomBlocks) {
  int built = 0;
  auto expect_same = [&](auto config, int64_t block, uint64_t seed, bool per_head) {
    config.num_heads = 2;
    config.block = block;
    config.seed = seed;
    config.different_layout_per_head = per_head;
    expect_same_over_lengths(config, 40, &built);
  };
  for (int64_t block : {16, 32})
    for (uint64_t seed : {0u, 3u})
      for (bool per_head : {false, true}) {
        BigBirdSparsityConfig bigbird;
        bigbird.num_random_blocks = 24;
        expect_same(bigbird, block, seed, per_head);
        VariableSparsityConfig variable;
        variable.num_random_blocks = 20;
        expect_same(variable, block, seed, per_head);
      }
  EXPECT_EQ(built, 64);
}

// The length: 65,536 tokens, 16 heads, each config's class defaults, block 64, and a
// crop from it; block 16 at 16,384 tokens.
TEST(SparseIndexFromConfig, LongSequencesWithClassDefaults) {
  for (SparsityMode mode : {SparsityMode::kBigBird, SparsityMode::kBSLongformer,
                            SparsityMode::kFixed, SparsityMode::kVariable}) {
    SparsityConfig c = default_sparsity_config(mode, 16);
    sparsity_common(c).block = 64;
    EXPECT_TRUE(expect_same_index(c, 65536, 65536));
    EXPECT_TRUE(expect_same_index(c, 65536, 40960));
    sparsity_common(c).block = 16;
    EXPECT_TRUE(expect_same_index(c, 16384, 16384));
  }
  BigBirdSparsityConfig per_head;
  per_head.num_heads = 16;
  per_head.block = 64;
  per_head.different_layout_per_head = true;
  per_head.num_random_blocks = 3;
  per_head.seed = 9;
  EXPECT_TRUE(expect_same_index(per_head, 65536, 65536));
}

}  // namespace
}  // namespace sciattn

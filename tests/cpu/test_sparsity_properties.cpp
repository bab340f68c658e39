// Properties of the sparsity layouts for random parameters: causality of unidirectional layouts,
// shared heads, the diagonal, and exact nnz formulas. Test layer (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_sparsity_util.h"

namespace sciattn {
namespace {

using testing::make_ok;

// Parameters are drawn from a seeded engine; the seed is printed with every failure.
constexpr uint64_t kParamSeed = 20240611;
constexpr int kCases = 300;

class Draw {
 public:
  explicit Draw(uint64_t seed) : engine_(seed) {}
  int64_t in(int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  bool coin() { return in(0, 1) == 1; }
  AttentionDirection direction() {
    return coin() ? AttentionDirection::kUnidirectional : AttentionDirection::kBidirectional;
  }

 private:
  std::mt19937_64 engine_;
};

bool heads_equal(const Layout& l) {
  const int64_t per_head = l.num_row_blocks * l.num_col_blocks;
  for (int64_t h = 1; h < l.num_heads; ++h) {
    if (!std::equal(l.blocks.begin(), l.blocks.begin() + per_head,
                    l.blocks.begin() + h * per_head)) {
      return false;
    }
  }
  return true;
}

int64_t row_nnz(const Layout& l, int64_t h, int64_t r) {
  int64_t n = 0;
  for (int64_t c = 0; c < l.num_col_blocks; ++c) n += l.at(h, r, c);
  return n;
}

// A random valid config of any mode that has N = seq_len / block blocks, with the flags the
// properties need.
struct Drawn {
  SparsityConfig config;
  int64_t seq_len = 0;
  bool uni = false;
  bool shared = true;  // different_layout_per_head == false (or no such parameter)
};

Drawn draw_config(Draw& d) {
  Drawn out;
  const int64_t heads = d.in(1, 4);
  const int64_t block = kSupportedBlockSizes[d.in(0, 3)];
  const int64_t n = d.in(1, 40);
  out.seq_len = n * block;
  const bool per_head = d.coin();
  const AttentionDirection dir = d.direction();
  out.uni = dir == AttentionDirection::kUnidirectional;
  out.shared = !per_head;
  switch (d.in(0, 4)) {
    case 0: {
      FixedSparsityConfig c;
      c.num_global_blocks = d.in(1, 3);
      c.num_local_blocks = c.num_global_blocks * d.in(1, 4);
      c.num_global_blocks = std::min(c.num_global_blocks, n);
      if (c.num_local_blocks % c.num_global_blocks != 0) c.num_local_blocks = c.num_global_blocks;
      c.attention = dir;
      c.horizontal_global_attention = !out.uni && d.coin();
      c.different_layout_per_head = per_head;
      if (per_head) {
        c.num_different_global_patterns = d.in(1, c.num_local_blocks / c.num_global_blocks);
      }
      out.config = c;
      break;
    }
    case 1: {
      VariableSparsityConfig c;
      c.num_random_blocks = d.in(0, std::min<int64_t>(n, 3));
      c.local_window_blocks.clear();
      for (int64_t i = 0, count = d.in(1, 3); i < count; ++i) {
        c.local_window_blocks.push_back(d.in(1, 5));
      }
      c.global_block_indices = {d.in(0, n + 2)};
      if (d.coin()) {
        c.global_block_end_indices = std::vector<int64_t>{c.global_block_indices[0] + d.in(1, 3)};
      }
      c.attention = dir;
      c.horizontal_global_attention = !out.uni && d.coin();
      c.different_layout_per_head = per_head;
      c.seed = static_cast<uint64_t>(d.in(0, 1000));
      out.config = c;
      break;
    }
    case 2: {
      BigBirdSparsityConfig c;
      c.num_random_blocks = d.in(0, std::min<int64_t>(n, 4));
      c.num_sliding_window_blocks = d.in(0, std::min<int64_t>(n, 5));
      c.num_global_blocks = d.in(0, std::min<int64_t>(n, 2));
      c.attention = dir;
      c.different_layout_per_head = per_head;
      c.seed = static_cast<uint64_t>(d.in(0, 1000));
      out.config = c;
      break;
    }
    case 3: {
      BSLongformerSparsityConfig c;
      c.num_sliding_window_blocks = d.in(0, std::min<int64_t>(n, 5));
      c.global_block_indices = {d.in(0, n), d.in(0, n)};
      if (d.coin()) {
        c.global_block_end_indices = std::vector<int64_t>{c.global_block_indices[0] + d.in(1, 2),
                                                          c.global_block_indices[1] + 1};
      }
      c.attention = dir;
      c.different_layout_per_head = per_head;
      out.config = c;
      break;
    }
    default: {
      LocalSlidingWindowSparsityConfig c;
      c.num_sliding_window_blocks = d.in(0, std::min<int64_t>(n, 5));
      c.attention = dir;
      out.shared = true;
      out.config = c;
      break;
    }
  }
  sparsity_common(out.config).num_heads = heads;
  sparsity_common(out.config).block = block;
  return out;
}

TEST(SparsityProperties, RandomConfigs) {
  Draw d(kParamSeed);
  for (int i = 0; i < kCases; ++i) {
    const Drawn drawn = draw_config(d);
    SCOPED_TRACE("parameter seed " + std::to_string(kParamSeed) + ", case " + std::to_string(i) +
                 ": " + to_string(drawn.config) + ", seq_len " + std::to_string(drawn.seq_len));
    const Layout l = make_ok(drawn.config, drawn.seq_len);
    const int64_t n = drawn.seq_len / sparsity_common(drawn.config).block;
    ASSERT_EQ(l.num_heads, sparsity_common(drawn.config).num_heads);
    ASSERT_EQ(l.num_row_blocks, n);
    ASSERT_EQ(l.num_col_blocks, n);
    for (uint8_t b : l.blocks) ASSERT_LE(b, 1);
    // A unidirectional layout has no block above the diagonal (Decision 3).
    if (drawn.uni) {
      EXPECT_TRUE(layout_is_block_causal(l));
    }
    // A shared layout is head 0 everywhere.
    if (drawn.shared) {
      EXPECT_TRUE(heads_equal(l));
    }
    // Every pattern keeps the diagonal, so no query block row is empty.
    for (int64_t h = 0; h < l.num_heads; ++h) {
      for (int64_t r = 0; r < n; ++r) EXPECT_EQ(l.at(h, r, r), 1) << "h " << h << " r " << r;
    }
    // Random blocks: every row has at least its R distinct random columns (min(R, r+1) when
    // unidirectional).
    int64_t random_blocks = 0;
    if (auto* v = std::get_if<VariableSparsityConfig>(&drawn.config)) {
      random_blocks = v->num_random_blocks;
    }
    if (auto* b = std::get_if<BigBirdSparsityConfig>(&drawn.config)) {
      random_blocks = b->num_random_blocks;
    }
    for (int64_t h = 0; h < l.num_heads; ++h) {
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_GE(row_nnz(l, h, r), drawn.uni ? std::min(random_blocks, r + 1) : random_blocks);
      }
    }
    // Deterministic: the same config gives the same bytes.
    EXPECT_EQ(make_ok(drawn.config, drawn.seq_len).blocks, l.blocks);
  }
}

// Spec 1.2: bidirectional Fixed density is G/Lw + (Lw - G)/N, exactly when N is a multiple of Lw
// (each row: its window, plus G global columns in each of the other N/Lw - 1 windows).
TEST(SparsityProperties, FixedBidirectionalDensityFormula) {
  for (int64_t g : {1, 2, 4}) {
    for (int64_t lw : {g, 2 * g, 4 * g, int64_t{8}}) {
      if (lw % g != 0) continue;
      for (int64_t windows : {1, 2, 5, 16}) {
        FixedSparsityConfig c;
        c.num_heads = 2;
        c.num_local_blocks = lw;
        c.num_global_blocks = g;
        const int64_t n = windows * lw;
        const Layout l = make_ok(c, n * 16);
        const double expected = static_cast<double>(g) / static_cast<double>(lw) +
                                static_cast<double>(lw - g) / static_cast<double>(n);
        EXPECT_NEAR(layout_density(l), expected, 1e-12) << to_string(c) << " N " << n;
        EXPECT_EQ(layout_head_nnz(l, 0), n * (lw + g * (n / lw) - g));
      }
    }
  }
}

// Unidirectional Fixed with one global block: lower-triangular windows plus global column
// w0 + Lw - 1 of each window from its own row down.
TEST(SparsityProperties, FixedUnidirectionalNnzFormula) {
  for (int64_t lw : {1, 2, 4, 7}) {
    for (int64_t windows : {1, 3, 8}) {
      FixedSparsityConfig c;
      c.num_heads = 1;
      c.block = 32;
      c.num_local_blocks = lw;
      c.attention = AttentionDirection::kUnidirectional;
      const int64_t n = windows * lw;
      int64_t expected = windows * lw * (lw + 1) / 2;
      for (int64_t k = 0; k < windows; ++k) expected += (n - (k * lw + lw - 1)) - 1;
      EXPECT_EQ(layout_nnz(make_ok(c, n * 32)), expected) << "Lw " << lw << " N " << n;
    }
  }
}

// Sliding windows: w = W div 2 blocks on each side (bidirectional) or behind (unidirectional).
TEST(SparsityProperties, SlidingWindowNnzFormulas) {
  for (int64_t window : {0, 1, 2, 3, 4, 7}) {
    for (int64_t n : {window == 0 ? int64_t{1} : window, int64_t{9}, int64_t{33}}) {
      const int64_t w = window / 2;
      int64_t uni = 0;
      int64_t bi = 0;
      for (int64_t r = 0; r < n; ++r) {
        uni += std::min(r, w) + 1;
        bi += std::min(r, w) + std::min(n - 1 - r, w) + 1;
      }
      LocalSlidingWindowSparsityConfig local;
      local.num_heads = 1;
      local.num_sliding_window_blocks = window;
      EXPECT_EQ(layout_nnz(make_ok(local, n * 16)), uni) << "W " << window << " N " << n;
      local.attention = AttentionDirection::kBidirectional;
      EXPECT_EQ(layout_nnz(make_ok(local, n * 16)), bi) << "W " << window << " N " << n;

      // BSLongformer with global block 0: the band, plus row 0 and column 0.
      BSLongformerSparsityConfig longformer;
      longformer.num_heads = 1;
      longformer.num_sliding_window_blocks = window;
      const int64_t row0_band = std::min(n - 1, w) + 1;
      EXPECT_EQ(layout_nnz(make_ok(longformer, n * 16)),
                bi + (n - row0_band) + std::max<int64_t>(0, n - 1 - w));

      // BigBird without random blocks: the band or the first G rows or columns.
      for (int64_t g : {0, 1, 2}) {
        if (g > n) continue;
        BigBirdSparsityConfig bigbird;
        bigbird.num_heads = 1;
        bigbird.num_random_blocks = 0;
        bigbird.num_sliding_window_blocks = window;
        bigbird.num_global_blocks = g;
        int64_t expected = 0;
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = 0; c < n; ++c) {
            expected += (std::abs(r - c) <= w || r < g || c < g) ? 1 : 0;
          }
        }
        EXPECT_EQ(layout_nnz(make_ok(bigbird, n * 16)), expected);
      }
    }
  }
}

// Per-head Fixed with one pattern is the same on every head; with P patterns, heads h and h + P
// are equal and the P patterns differ.
TEST(SparsityProperties, FixedGlobalPatternsCycleOverHeads) {
  FixedSparsityConfig c;
  c.num_heads = 6;
  c.different_layout_per_head = true;
  c.num_local_blocks = 6;
  c.num_global_blocks = 2;
  Layout l = make_ok(c, 24 * 16);
  EXPECT_TRUE(heads_equal(l));
  c.num_different_global_patterns = 3;
  l = make_ok(c, 24 * 16);
  const int64_t per_head = 24 * 24;
  auto head = [&](int64_t h) {
    return std::vector<uint8_t>(l.blocks.begin() + h * per_head,
                                l.blocks.begin() + (h + 1) * per_head);
  };
  for (int64_t h = 0; h < 3; ++h) EXPECT_EQ(head(h), head(h + 3));
  EXPECT_NE(head(0), head(1));
  EXPECT_NE(head(1), head(2));
  EXPECT_NE(head(0), head(2));
}

TEST(SparsityProperties, HelpersOnSmallLayouts) {
  Layout l = Layout::zeros(2, 3, 4);
  EXPECT_EQ(l.size(), 24);
  EXPECT_EQ(layout_density(l), 0.0);
  EXPECT_TRUE(layout_is_block_causal(l));
  l.at(1, 0, 3) = 1;
  l.at(1, 2, 0) = 1;
  l.at(0, 2, 2) = 1;
  EXPECT_EQ(layout_nnz(l), 3);
  EXPECT_EQ(layout_head_nnz(l, 0), 1);
  EXPECT_EQ(layout_head_nnz(l, 1), 2);
  EXPECT_EQ(layout_head_nnz(l, 2), 0);  // no such head
  EXPECT_DOUBLE_EQ(layout_density(l), 3.0 / 24.0);
  EXPECT_EQ(layout_max_row_nnz(l), 1);
  EXPECT_FALSE(layout_is_block_causal(l));
  EXPECT_EQ(layout_to_string(l), "head 0:\n0000\n0000\n0010\nhead 1:\n0001\n0000\n1000\n");
  EXPECT_EQ(layout_density(Layout{}), 0.0);
}

TEST(SparsityProperties, NamesAndDefaults) {
  for (SparsityMode mode :
       {SparsityMode::kDense, SparsityMode::kFixed, SparsityMode::kVariable, SparsityMode::kBigBird,
        SparsityMode::kBSLongformer, SparsityMode::kLocalSlidingWindow, SparsityMode::kUser}) {
    const SparsityConfig c = default_sparsity_config(mode, 5);
    EXPECT_EQ(sparsity_mode(c), mode);
    EXPECT_EQ(parse_sparsity_mode(sparsity_mode_name(mode)), mode);
    EXPECT_EQ(sparsity_common(c).num_heads, 5);
    EXPECT_EQ(sparsity_common(c).block, 16);
    EXPECT_EQ(sparsity_common(c).seed, 0u);
  }
  EXPECT_FALSE(parse_sparsity_mode("Fixed").has_value());
  EXPECT_EQ(parse_attention_direction("unidirectional"), AttentionDirection::kUnidirectional);
  EXPECT_FALSE(parse_attention_direction("causal").has_value());
  // DeepSpeed's class defaults (spec tables 1.2-1.6).
  const FixedSparsityConfig fixed;
  EXPECT_EQ(fixed.num_local_blocks, 4);
  EXPECT_EQ(fixed.num_global_blocks, 1);
  EXPECT_EQ(fixed.attention, AttentionDirection::kBidirectional);
  EXPECT_FALSE(fixed.horizontal_global_attention);
  EXPECT_EQ(fixed.num_different_global_patterns, 1);
  EXPECT_FALSE(fixed.different_layout_per_head);
  const VariableSparsityConfig variable;
  EXPECT_EQ(variable.num_random_blocks, 0);
  EXPECT_EQ(variable.local_window_blocks, std::vector<int64_t>{4});
  EXPECT_EQ(variable.global_block_indices, std::vector<int64_t>{0});
  EXPECT_FALSE(variable.global_block_end_indices.has_value());
  const BigBirdSparsityConfig bigbird;
  EXPECT_EQ(bigbird.num_random_blocks, 1);
  EXPECT_EQ(bigbird.num_sliding_window_blocks, 3);
  EXPECT_EQ(bigbird.num_global_blocks, 1);
  const BSLongformerSparsityConfig longformer;
  EXPECT_EQ(longformer.num_sliding_window_blocks, 3);
  EXPECT_EQ(longformer.global_block_indices, std::vector<int64_t>{0});
  const LocalSlidingWindowSparsityConfig local;
  EXPECT_EQ(local.num_sliding_window_blocks, 3);
  EXPECT_EQ(local.attention, AttentionDirection::kUnidirectional);
  EXPECT_EQ(to_string(SparsityConfig{BigBirdSparsityConfig{}}),
            "BigBirdSparsityConfig(num_heads=0, block=16, seed=0, different_layout_per_head=false, "
            "num_random_blocks=1, num_sliding_window_blocks=3, num_global_blocks=1, "
            "attention=bidirectional)");
}

}  // namespace
}  // namespace sciattn

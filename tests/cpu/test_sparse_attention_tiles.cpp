// Tests of the fused GPU sparse attention's tile index (src/common/sparse_attention_tiles.h): the
// 64 x 64 tiles of each head with their sub-block masks, row and column lists, and the split of
// long tile lines into pieces with their partial slots, against a brute-force derivation from
// the layout element by element, for every block size. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "block_sparse_test_util.h"
#include "common/sparse_attention_tiles.h"

namespace sciattn {
namespace {

using namespace sciattn::bstest;
using detail::SparseAttentionTiles;
using detail::SparseAttentionTileWork;

// The masks of every nonempty tile (h, tile row, tile column), derived element by element.
std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> brute_force_tiles(
    const Layout& layout, int64_t block, const SparseAttentionTiles& t) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> tiles;
  const int64_t L = layout.num_row_blocks * block;
  for (int64_t h = 0; h < layout.num_heads; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) {
        if (!layout.at(h, i / block, j / block)) continue;
        const int64_t r = i % 64, c = j % 64;
        tiles[{h, i / 64, j / 64}] |= int64_t{1} << ((r >> t.shift) * t.sub + (c >> t.shift));
      }
  return tiles;
}

void expect_work_covers(const SparseAttentionTileWork& w, const std::vector<int64_t>& offsets,
                        int64_t max_tiles, const char* what) {
  SCOPED_TRACE(what);
  const int64_t lines = static_cast<int64_t>(offsets.size()) - 1;
  ASSERT_EQ(static_cast<int64_t>(w.split.line_items.size()), lines + 1);
  EXPECT_EQ(w.split.max_blocks, max_tiles);
  int64_t slot = 0;
  std::vector<int64_t> split_lines;
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t p0 = w.split.line_items[static_cast<size_t>(l)];
    const int64_t p1 = w.split.line_items[static_cast<size_t>(l + 1)];
    ASSERT_GE(p1 - p0, 1) << "line " << l << " has no piece";
    int64_t at = offsets[static_cast<size_t>(l)];
    for (int64_t p = p0; p < p1; ++p) {
      EXPECT_EQ(w.split.item_line[static_cast<size_t>(p)], l);
      EXPECT_EQ(w.split.item_begin[static_cast<size_t>(p)], at);
      at = w.split.item_end[static_cast<size_t>(p)];
      EXPECT_LE(at - w.split.item_begin[static_cast<size_t>(p)], max_tiles);
      if (p1 - p0 > 1) {
        EXPECT_GE(at - w.split.item_begin[static_cast<size_t>(p)], 1) << "an empty piece";
        EXPECT_EQ(w.item_slot[static_cast<size_t>(p)], slot++);
      } else {
        EXPECT_EQ(w.item_slot[static_cast<size_t>(p)], -1);
      }
    }
    EXPECT_EQ(at, offsets[static_cast<size_t>(l + 1)]) << "line " << l << " not covered";
    if (p1 - p0 > 1) split_lines.push_back(l);
  }
  EXPECT_EQ(w.slots, slot);
  EXPECT_EQ(w.split_lines, split_lines);
}

void expect_tiles_of(const Layout& layout, int64_t block, const BlockSparseIndex& ix) {
  SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  const int64_t L = layout.num_row_blocks * block;
  EXPECT_EQ(t.len, L);
  EXPECT_EQ(t.num_tiles, (L + 63) / 64);
  EXPECT_EQ(t.sub, block < 64 ? 64 / block : 1);
  const auto want = brute_force_tiles(layout, block, t);
  EXPECT_EQ(t.nnz, static_cast<int64_t>(want.size()));
  // Row lists in (h, row, column) order are exactly the brute-force map's order.
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> got_rows;
  for (int64_t h = 0; h < t.num_heads; ++h)
    for (int64_t r = 0; r < t.num_tiles; ++r)
      for (int64_t e = t.row_offsets[static_cast<size_t>(h * t.num_tiles + r)];
           e < t.row_offsets[static_cast<size_t>(h * t.num_tiles + r + 1)]; ++e) {
        got_rows.emplace_back(h, r, t.row_cols[static_cast<size_t>(e)],
                              t.row_masks[static_cast<size_t>(e)]);
      }
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> want_rows;
  for (const auto& [key, mask] : want) {
    want_rows.emplace_back(std::get<0>(key), std::get<1>(key), std::get<2>(key), mask);
  }
  EXPECT_EQ(got_rows, want_rows);
  // Column lists: the same tiles, by (h, column, row).
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> got_cols, want_cols;
  for (int64_t h = 0; h < t.num_heads; ++h)
    for (int64_t c = 0; c < t.num_tiles; ++c)
      for (int64_t e = t.col_offsets[static_cast<size_t>(h * t.num_tiles + c)];
           e < t.col_offsets[static_cast<size_t>(h * t.num_tiles + c + 1)]; ++e) {
        got_cols.emplace_back(h, c, t.col_rows[static_cast<size_t>(e)],
                              t.col_masks[static_cast<size_t>(e)]);
      }
  for (const auto& [key, mask] : want) {
    want_cols.emplace_back(std::get<0>(key), std::get<2>(key), std::get<1>(key), mask);
  }
  std::sort(want_cols.begin(), want_cols.end());
  EXPECT_EQ(got_cols, want_cols);
  for (int64_t m : t.row_masks) {
    EXPECT_NE(m, 0);
    EXPECT_EQ(m & ~t.full_mask, 0);
  }
  const int64_t lines = t.num_heads * t.num_tiles;
  expect_work_covers(
      t.rows, t.row_offsets,
      detail::sparse_attention_tiles_per_piece(ix, ix.row_split.max_blocks, t.nnz, lines), "rows");
  expect_work_covers(
      t.cols, t.col_offsets,
      detail::sparse_attention_tiles_per_piece(ix, ix.col_split.max_blocks, t.nnz, lines), "cols");
}

TEST(SparseAttentionTiles, MatchBruteForceForEveryBlock) {
  for (uint64_t s = 0; s < 24; ++s) {
    const uint64_t seed = kBaseSeed + 900 + s;
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const int64_t block = int64_t{16} << (s % 4);
    // Lengths that are and are not multiples of the 64-token tile.
    const int64_t N = 1 + static_cast<int64_t>(rng() % (block < 64 ? 11 : 4));
    const int64_t H = 1 + static_cast<int64_t>(rng() % 3);
    const Layout layout =
        random_layout(H, N, N, 0.1 + 0.1 * static_cast<double>(s % 8), rng, s % 2 == 0, s % 3 == 0);
    BlockSparseIndex ix = make_index(layout, block);
    SCOPED_TRACE("block " + std::to_string(block) + " N " + std::to_string(N));
    expect_tiles_of(layout, block, ix);
    // Forced splits: pieces of one layout block.
    ASSERT_TRUE(split_block_sparse_work(1, &ix).ok());
    expect_tiles_of(layout, block, ix);
  }
}

TEST(SparseAttentionTiles, GlobalRowIsSplitAndEmptyRowsKeepOnePiece) {
  // Block 16, 640 tokens (10 tiles): head 0 block row 0 attends to everything (a global row),
  // block rows 4..7 (tile row 1) are empty.
  const int64_t N = 40;
  Layout layout = Layout::zeros(1, N, N);
  for (int64_t c = 0; c < N; ++c) layout.at(0, 0, c) = 1;
  for (int64_t r = 0; r < N; ++r)
    if (r / 4 != 1) layout.at(0, r, r) = 1;
  BlockSparseIndex ix = make_index(layout, 16);
  ASSERT_TRUE(split_block_sparse_work(8, &ix).ok());  // 8 blocks = 128 tokens = 2 tiles
  SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  EXPECT_EQ(t.num_tiles, 10);
  EXPECT_EQ(t.rows.split.max_blocks, 2);
  EXPECT_EQ(t.rows.split.line_items[1] - t.rows.split.line_items[0], 5);  // 10 tiles / 2
  EXPECT_EQ(t.rows.split.line_items[2] - t.rows.split.line_items[1], 1);  // empty tile row
  EXPECT_EQ(t.row_offsets[2] - t.row_offsets[1], 0);
  EXPECT_EQ(t.rows.split_lines, std::vector<int64_t>{0});
  EXPECT_EQ(t.rows.slots, 5);
  // Tile (0, 0): sub-block row 0 full (bits 0..3) plus the diagonal blocks 1..3.
  EXPECT_EQ(t.row_masks[0], 0xF | (1 << 5) | (1 << 10) | (1 << 15));
  // Tile (0, 5): only the global row's four blocks.
  EXPECT_EQ(t.row_cols[5], 5);
  EXPECT_EQ(t.row_masks[5], 0xF);
  expect_tiles_of(layout, 16, ix);
}

TEST(SparseAttentionTiles, DefaultSplitFollowsTheTileLines) {
  // Block 16, 2,048 tokens (128 block rows, 32 tile rows): a window of 3 blocks plus block row 0
  // global. A tile row gathers four block rows, so its lines are about 3 tiles long; with the
  // index's default split (16 blocks = 4 tiles in tokens) most of them would be cut. The tile
  // default (at least 16 tiles) keeps every ordinary line whole and cuts the global row only.
  const int64_t N = 128;
  Layout layout = Layout::zeros(2, N, N);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t c = 0; c < N; ++c) layout.at(h, 0, c) = 1;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = std::max<int64_t>(0, r - 1); c <= std::min(N - 1, r + 1); ++c)
        layout.at(h, r, c) = 1;
  }
  const BlockSparseIndex ix = make_index(layout, 16);
  ASSERT_EQ(ix.row_split.max_blocks, default_split_blocks(ix));
  SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  EXPECT_EQ(t.num_tiles, 32);
  EXPECT_EQ(t.rows.split.max_blocks, 16);
  // Tile row 0 of each head holds all 32 tiles (the global row): two pieces; nothing else splits.
  EXPECT_EQ(t.rows.split_lines, (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(t.rows.slots, 4);
  // A caller's own split is still kept in tokens: 4 blocks of 16 = one tile per piece.
  BlockSparseIndex forced = ix;
  ASSERT_TRUE(split_block_sparse_work(4, &forced).ok());
  ASSERT_TRUE(detail::build_sparse_attention_tiles(forced, &t).ok());
  EXPECT_EQ(t.rows.split.max_blocks, 1);
  expect_tiles_of(layout, 16, ix);
}

TEST(SparseAttentionTiles, Block128SpansFourTiles) {
  Layout layout = Layout::zeros(2, 3, 3);
  layout.at(0, 0, 2) = 1;
  layout.at(1, 1, 1) = 1;
  layout.at(1, 2, 0) = 1;
  const BlockSparseIndex ix = make_index(layout, 128);
  SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  EXPECT_EQ(t.num_tiles, 6);
  EXPECT_EQ(t.nnz, 12);
  EXPECT_EQ(t.full_mask, 1);
  expect_tiles_of(layout, 128, ix);
}

TEST(SparseAttentionTiles, RejectsUnbuiltIndex) {
  BlockSparseIndex ix;
  SparseAttentionTiles t;
  const Status s = detail::build_sparse_attention_tiles(ix, &t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(s.message(), "index")) << s.message();
}

}  // namespace
}  // namespace sciattn

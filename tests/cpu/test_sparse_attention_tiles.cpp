// Tests of the fused GPU sparse attention's tile index (src/common/sparse_attention_tiles.h): the
// row and column lists of each head (entries of packed slots with their masks) and the split of
// long lines into pieces with their partial slots, checked element by element against the layout
// (every kept element kept once by each direction), for every block size. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
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

// The elements (h, query i, key j) an index's entries keep for the H heads: every entry of
// every line of head h's stored head (h % t.num_heads) expanded through its slots and mask bits,
// counted (a correct index keeps each layout element once). rows: the row lists (the line is
// the query tile), else the column lists (the key tile).
std::map<std::tuple<int64_t, int64_t, int64_t>, int> kept_elements(const SparseAttentionTiles& t,
                                                                   bool rows, int64_t H) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> kept;
  const std::vector<int64_t>& offsets = rows ? t.row_offsets : t.col_offsets;
  const std::vector<int64_t>& slots = rows ? t.row_slots : t.col_slots;
  const std::vector<int64_t>& masks = rows ? t.row_masks : t.col_masks;
  const int64_t unit = int64_t{1} << t.shift;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t line = 0; line < t.num_tiles; ++line)
      for (int64_t e = offsets[static_cast<size_t>((h % t.num_heads) * t.num_tiles + line)];
           e < offsets[static_cast<size_t>((h % t.num_heads) * t.num_tiles + line + 1)]; ++e)
        for (int64_t a = 0; a < 64; ++a)      // the line's own token (query, or key)
          for (int64_t c = 0; c < 64; ++c) {  // the slot side's token
            const int64_t k = c >> t.shift, x = a >> t.shift;
            const int64_t bit = rows ? x * t.sub + k : k * t.sub + x;
            if (((masks[static_cast<size_t>(e)] >> bit) & 1) == 0) continue;
            const int64_t own = t.line_token(rows, (h % t.num_heads) * t.num_tiles + line, a);
            EXPECT_GE(own, 0) << "a mask bit of an empty unit of the line's own side";
            if (own < 0) continue;
            const int64_t slot = slots[static_cast<size_t>(e * t.sub + k)];
            EXPECT_GE(slot, 0) << "a mask bit of an empty slot";
            if (slot < 0) continue;
            const int64_t other = slot * unit + (c & (unit - 1));
            EXPECT_LT(own, t.len);
            EXPECT_LT(other, t.len);
            ++kept[rows ? std::make_tuple(h, own, other) : std::make_tuple(h, other, own)];
          }
  return kept;
}

// The shape of one direction's lists: slots ascending along each line, -1 only at the end of a
// line's last entry, every used slot holding a kept block, masks inside full_mask.
void expect_packed_lists(const SparseAttentionTiles& t, bool rows) {
  SCOPED_TRACE(rows ? "row lists" : "column lists");
  const std::vector<int64_t>& offsets = rows ? t.row_offsets : t.col_offsets;
  const std::vector<int64_t>& slots = rows ? t.row_slots : t.col_slots;
  const std::vector<int64_t>& masks = rows ? t.row_masks : t.col_masks;
  const int64_t entries = rows ? t.row_entries : t.col_entries;
  ASSERT_EQ(static_cast<int64_t>(offsets.size()), t.num_heads * t.num_tiles + 1);
  ASSERT_EQ(offsets.back(), entries);
  ASSERT_EQ(static_cast<int64_t>(masks.size()), entries);
  ASSERT_EQ(static_cast<int64_t>(slots.size()), entries * t.sub);
  for (size_t line = 0; line + 1 < offsets.size(); ++line) {
    int64_t previous = -1;
    bool ended = false;
    for (int64_t e = offsets[line]; e < offsets[line + 1]; ++e) {
      const int64_t mask = masks[static_cast<size_t>(e)];
      EXPECT_NE(mask, 0);
      EXPECT_EQ(mask & ~t.full_mask, 0);
      for (int64_t k = 0; k < t.sub; ++k) {
        const int64_t slot = slots[static_cast<size_t>(e * t.sub + k)];
        if (slot < 0) {
          ended = true;
          continue;
        }
        EXPECT_FALSE(ended) << "a slot after an empty one, line " << line;
        EXPECT_GT(slot, previous) << "slots not ascending, line " << line;
        previous = slot;
        int64_t slot_bits = 0;
        for (int64_t x = 0; x < t.sub; ++x)
          slot_bits |= (mask >> (rows ? x * t.sub + k : k * t.sub + x)) & 1;
        EXPECT_EQ(slot_bits, 1) << "a slot holding no kept block, line " << line;
      }
    }
  }
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

// A packed index's tile lines (rows, or columns): each stored head's block lines each in exactly
// one slot of one tile line, ascending inside it, -1 only in trailing slots, and the place array
// the inverse of the units.
void expect_line_groups(const SparseAttentionTiles& t, int64_t R, bool rows) {
  SCOPED_TRACE(rows ? "tile rows" : "tile columns");
  const std::vector<int64_t>& units = rows ? t.row_units : t.col_units;
  const std::vector<int64_t>& place = rows ? t.row_unit_place : t.col_unit_place;
  ASSERT_EQ(static_cast<int64_t>(units.size()), t.num_heads * t.num_tiles * t.sub);
  ASSERT_EQ(static_cast<int64_t>(place.size()), t.num_heads * R);
  for (int64_t g = 0; g < t.num_heads; ++g) {
    std::vector<int> seen(static_cast<size_t>(R), 0);
    for (int64_t line = g * t.num_tiles; line < (g + 1) * t.num_tiles; ++line) {
      int64_t previous = -1;
      bool ended = false;
      for (int64_t k = 0; k < t.sub; ++k) {
        const int64_t at = line * t.sub + k, unit = units[static_cast<size_t>(at)];
        if (unit < 0) {
          ended = true;
          continue;
        }
        EXPECT_FALSE(ended) << "a used slot after an empty one, tile line " << line;
        EXPECT_GT(unit, previous) << "tile line " << line << " not ascending";
        ASSERT_LT(unit, R);
        previous = unit;
        ++seen[static_cast<size_t>(unit)];
        EXPECT_EQ(place[static_cast<size_t>(g * R + unit)], at);
      }
    }
    for (int64_t c = 0; c < R; ++c) EXPECT_EQ(seen[static_cast<size_t>(c)], 1) << "line " << c;
  }
}

void expect_tiles_of(const Layout& layout, int64_t block, const BlockSparseIndex& ix) {
  SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  const int64_t L = layout.num_row_blocks * block;
  EXPECT_EQ(t.len, L);
  EXPECT_EQ(t.num_tiles, (L + 63) / 64);
  EXPECT_EQ(t.sub, block < 64 ? 64 / block : 1);
  expect_packed_lists(t, true);
  expect_packed_lists(t, false);
  // Both directions keep exactly the layout's elements, each once.
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> want;
  for (int64_t h = 0; h < layout.num_heads; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j)
        if (layout.at(h, i / block, j / block)) want[{h, i, j}] = 1;
  EXPECT_EQ(t.num_heads, ix.layout_heads);  // the stored heads' lists only
  EXPECT_TRUE(kept_elements(t, true, layout.num_heads) == want) << "row lists";
  EXPECT_TRUE(kept_elements(t, false, layout.num_heads) == want) << "column lists";
  // Below the tile size a line's units are packed: ceil(units / sub) entries, the units being
  // the blocks its own blocks use (a tile row's own blocks are consecutive, a tile column's
  // those of its group), and the tile columns hold every block column once.
  if (block < 64) {
    expect_line_groups(t, layout.num_row_blocks, true);
    expect_line_groups(t, layout.num_row_blocks, false);
    for (int64_t h = 0; h < layout.num_heads; ++h)
      for (int64_t line = 0; line < t.num_tiles; ++line) {
        std::set<int64_t> cols, rows;
        const size_t l = static_cast<size_t>((h % t.num_heads) * t.num_tiles + line);
        for (int64_t k = 0; k < t.sub; ++k) {
          const int64_t x = t.row_units[l * static_cast<size_t>(t.sub) + static_cast<size_t>(k)];
          if (x < 0) continue;
          for (int64_t y = 0; y < layout.num_row_blocks; ++y)
            if (layout.at(h, x, y)) cols.insert(y);
        }
        for (int64_t k = 0; k < t.sub; ++k) {
          const int64_t x = t.col_units[l * static_cast<size_t>(t.sub) + static_cast<size_t>(k)];
          if (x < 0) continue;
          for (int64_t y = 0; y < layout.num_row_blocks; ++y)
            if (layout.at(h, y, x)) rows.insert(y);
        }
        EXPECT_EQ(t.row_offsets[l + 1] - t.row_offsets[l],
                  (static_cast<int64_t>(cols.size()) + t.sub - 1) / t.sub);
        EXPECT_EQ(t.col_offsets[l + 1] - t.col_offsets[l],
                  (static_cast<int64_t>(rows.size()) + t.sub - 1) / t.sub);
      }
  }
  const int64_t lines = t.num_heads * t.num_tiles;
  expect_work_covers(
      t.rows, t.row_offsets,
      detail::sparse_attention_tiles_per_piece(ix, ix.row_split.max_blocks, t.row_entries, lines),
      "rows");
  expect_work_covers(
      t.cols, t.col_offsets,
      detail::sparse_attention_tiles_per_piece(ix, ix.col_split.max_blocks, t.col_entries, lines),
      "cols");
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

// Heads that share a layout have one stored head's lists, which serve every head; heads that
// differ only slightly must have their own. Checked element by element as above.
TEST(SparseAttentionTiles, SharedHeadsAndNearlySharedHeads) {
  for (uint64_t s = 0; s < 8; ++s) {
    const uint64_t seed = kBaseSeed + 950 + s;
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const int64_t block = int64_t{16} << (s % 4);
    const int64_t N = 2 + static_cast<int64_t>(rng() % (block < 64 ? 10 : 4));
    const int64_t H = 2 + static_cast<int64_t>(rng() % 3);
    const Layout one = random_layout(1, N, N, 0.3, rng);
    Layout shared = Layout::zeros(H, N, N);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < N; ++c) shared.at(h, r, c) = one.at(0, r, c);
    SCOPED_TRACE("block " + std::to_string(block) + " N " + std::to_string(N));
    expect_tiles_of(shared, block, make_index(shared, block));
    // The last head differs in one block of its last row.
    Layout differs = shared;
    differs.at(H - 1, N - 1, s % N) ^= 1;
    if (layout_nnz(differs) > 0) expect_tiles_of(differs, block, make_index(differs, block));
  }
  // Same columns in the same order, but in different rows: head 0 has block (0, 1), head 1 block
  // (1, 1); and same row lengths with different columns.
  Layout moved = Layout::zeros(2, 4, 4);
  moved.at(0, 0, 1) = 1;
  moved.at(1, 1, 1) = 1;
  expect_tiles_of(moved, 16, make_index(moved, 16));
  expect_tiles_of(moved, 64, make_index(moved, 64));
  Layout other_columns = Layout::zeros(2, 4, 4);
  other_columns.at(0, 2, 0) = 1;
  other_columns.at(1, 2, 3) = 1;
  expect_tiles_of(other_columns, 32, make_index(other_columns, 32));
}

// The (h, query block, key block) pairs a packed index's entries keep (block < 64: a mask bit is
// one layout block), counted: the block-level form of kept_elements, cheap enough for large
// layouts.
std::map<std::tuple<int64_t, int64_t, int64_t>, int> kept_blocks(const SparseAttentionTiles& t,
                                                                 bool rows, int64_t H) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> kept;
  const std::vector<int64_t>& offsets = rows ? t.row_offsets : t.col_offsets;
  const std::vector<int64_t>& slots = rows ? t.row_slots : t.col_slots;
  const std::vector<int64_t>& masks = rows ? t.row_masks : t.col_masks;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t line = 0; line < t.num_tiles; ++line)
      for (int64_t e = offsets[static_cast<size_t>((h % t.num_heads) * t.num_tiles + line)];
           e < offsets[static_cast<size_t>((h % t.num_heads) * t.num_tiles + line + 1)]; ++e)
        for (int64_t x = 0; x < t.sub; ++x)      // the line's own block
          for (int64_t k = 0; k < t.sub; ++k) {  // the slot
            const int64_t bit = rows ? x * t.sub + k : k * t.sub + x;
            if (((masks[static_cast<size_t>(e)] >> bit) & 1) == 0) continue;
            const std::vector<int64_t>& units = rows ? t.row_units : t.col_units;
            const int64_t own = units.empty()
                                    ? line * t.sub + x
                                    : units[static_cast<size_t>(
                                          ((h % t.num_heads) * t.num_tiles + line) * t.sub + x)];
            EXPECT_GE(own, 0) << "a mask bit of an empty unit of the line's own side";
            const int64_t other = slots[static_cast<size_t>(e * t.sub + k)];
            ++kept[rows ? std::make_tuple(h, own, other) : std::make_tuple(h, other, own)];
          }
  return kept;
}

// The consecutive grouping's column entries: tile column T holding block columns T * sub ..,
// each packing the union of their block rows sub at a time.
int64_t consecutive_column_entries(const Layout& layout, int64_t sub) {
  const int64_t R = layout.num_row_blocks;
  int64_t entries = 0;
  for (int64_t first = 0; first < R; first += sub) {
    std::set<int64_t> rows;
    for (int64_t x = first; x < std::min(R, first + sub); ++x)
      for (int64_t y = 0; y < R; ++y)
        if (layout.at(0, y, x)) rows.insert(y);
    entries += (static_cast<int64_t>(rows.size()) + sub - 1) / sub;
  }
  return entries;
}

// Fixed's global columns (the last block of each local window, attended by every row) have equal
// lists: below the tile size they share tile columns instead of each joining three local columns,
// whose entries then keep a quarter (blocks of 16) or half (32) of their elements. Every element
// is still kept once (expect_tiles_of), with several times fewer column entries.
TEST(SparseAttentionTiles, EqualLongColumnsShareTileColumns) {
  for (int64_t block : {16, 32}) {
    for (int64_t blocks : {64, 66}) {  // 66: a last tile column with empty slots
      SCOPED_TRACE("block " + std::to_string(block) + ", " + std::to_string(blocks) + " blocks");
      FixedSparsityConfig cfg;
      cfg.num_heads = 2;
      cfg.block = block;
      Layout layout;
      ASSERT_TRUE(make_layout(cfg, blocks * block, &layout).ok());
      const BlockSparseIndex ix = make_index(layout, block);
      SparseAttentionTiles t;
      ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
      expect_tiles_of(layout, block, ix);
      // Every tile column holding a global column holds global columns only.
      const int64_t local = cfg.num_local_blocks;
      for (int64_t line = 0; line < t.num_tiles; ++line) {
        int global = 0, used = 0;
        for (int64_t k = 0; k < t.sub; ++k) {
          const int64_t c = t.col_units[static_cast<size_t>(line * t.sub + k)];
          if (c < 0) continue;
          ++used;
          global += c % local == local - 1 && c / local * local + local <= blocks ? 1 : 0;
        }
        if (global > 0) {
          EXPECT_EQ(global, used) << "tile column " << line;
        }
      }
      const int64_t consecutive = consecutive_column_entries(layout, t.sub);
      // 88 against 256 entries at block 16 and 64 blocks, 320 against 544 at block 32 (the local
      // columns' share shrinks with the length: ~4x and ~2x fewer at 65,536 tokens).
      EXPECT_LT(static_cast<double>(t.col_entries) * (block == 16 ? 2.5 : 1.5),
                static_cast<double>(consecutive))
          << t.col_entries << " column entries against " << consecutive << " without grouping";
    }
  }
}

// Rows alike: Fixed with horizontal global attention (each window's global block row attends
// every column) groups its global rows into tile rows of their own.
TEST(SparseAttentionTiles, EqualLongRowsShareTileRows) {
  for (int64_t block : {16, 32}) {
    SCOPED_TRACE("block " + std::to_string(block));
    FixedSparsityConfig cfg;
    cfg.num_heads = 2;
    cfg.block = block;
    cfg.horizontal_global_attention = true;
    Layout layout;
    ASSERT_TRUE(make_layout(cfg, 64 * block, &layout).ok());
    const BlockSparseIndex ix = make_index(layout, block);
    SparseAttentionTiles t;
    ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
    expect_tiles_of(layout, block, ix);
    // The consecutive tile rows' entries: each tile row holds a global row, so all its columns.
    int64_t consecutive = 0;
    for (int64_t first = 0; first < layout.num_row_blocks; first += t.sub) {
      std::set<int64_t> cols;
      for (int64_t x = first; x < std::min(layout.num_row_blocks, first + t.sub); ++x)
        for (int64_t y = 0; y < layout.num_col_blocks; ++y)
          if (layout.at(0, x, y)) cols.insert(y);
      consecutive += (static_cast<int64_t>(cols.size()) + t.sub - 1) / t.sub;
    }
    // 136 against 256 entries at block 16, 504 against 672 at 32 (the local rows, which see the
    // global columns too, are long as well and pair across windows).
    EXPECT_LT(static_cast<double>(t.row_entries) * (block == 16 ? 1.7 : 1.2),
              static_cast<double>(consecutive))
        << t.row_entries << " row entries against " << consecutive << " without grouping";
  }
}

// A unidirectional Fixed layout's global columns have different lists (column c is held by the
// rows from c on) but all long ones: they still share tile columns, `sub` at a time in order.
TEST(SparseAttentionTiles, LongColumnsWithDifferentListsShareTileColumns) {
  for (int64_t block : {16, 32}) {
    SCOPED_TRACE("block " + std::to_string(block));
    FixedSparsityConfig cfg;
    cfg.num_heads = 1;
    cfg.block = block;
    cfg.attention = AttentionDirection::kUnidirectional;
    Layout layout;
    ASSERT_TRUE(make_layout(cfg, 128 * block, &layout).ok());
    const BlockSparseIndex ix = make_index(layout, block);
    SparseAttentionTiles t;
    ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
    expect_tiles_of(layout, block, ix);
    const int64_t consecutive = consecutive_column_entries(layout, t.sub);
    EXPECT_LT(static_cast<double>(t.col_entries) * (block == 16 ? 2.0 : 1.4),
              static_cast<double>(consecutive))
        << t.col_entries << " column entries against " << consecutive << " without grouping";
  }
}

// Without sub long columns of one list (BigBird, with its one global column) the tile columns
// are the consecutive ones, and so are they for random layouts' short columns.
TEST(SparseAttentionTiles, OtherColumnsKeepConsecutiveTileColumns) {
  BigBirdSparsityConfig cfg;
  cfg.num_heads = 2;
  cfg.block = 16;
  Layout layout;
  ASSERT_TRUE(make_layout(cfg, 256 * 16, &layout).ok());
  const BlockSparseIndex ix = make_index(layout, 16);
  SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  for (int64_t u = 0; u < static_cast<int64_t>(t.col_units.size()); ++u) {
    EXPECT_EQ(t.col_units[static_cast<size_t>(u)], u % (t.num_tiles * t.sub)) << u;
    EXPECT_EQ(t.row_units[static_cast<size_t>(u)], u % (t.num_tiles * t.sub)) << u;
  }
  EXPECT_EQ(t.col_entries, consecutive_column_entries(layout, t.sub) * t.num_heads);
}

// Large layouts (BigBird with 2,048 block rows, ~6 K stored blocks, shared and per head): both
// directions keep exactly the layout's blocks, each once.
TEST(SparseAttentionTiles, LargeLayoutListsMatchTheLayoutBlockByBlock) {
  for (int64_t block : {16, 32}) {
    for (bool per_head : {false, true}) {
      BigBirdSparsityConfig cfg;
      cfg.num_heads = 2;
      cfg.block = block;
      cfg.different_layout_per_head = per_head;
      Layout layout;
      ASSERT_TRUE(make_layout(cfg, 2048 * block, &layout).ok());  // 2,048 block rows
      const BlockSparseIndex ix = make_index(layout, block);
      SparseAttentionTiles t;
      ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
      expect_packed_lists(t, true);
      expect_packed_lists(t, false);
      std::map<std::tuple<int64_t, int64_t, int64_t>, int> want;
      for (int64_t h = 0; h < layout.num_heads; ++h)
        for (int64_t r = 0; r < layout.num_row_blocks; ++r)
          for (int64_t c = 0; c < layout.num_col_blocks; ++c)
            if (layout.at(h, r, c)) want[{h, r, c}] = 1;
      EXPECT_TRUE(kept_blocks(t, true, layout.num_heads) == want)
          << "row lists, block " << block << (per_head ? " per head" : " shared");
      EXPECT_TRUE(kept_blocks(t, false, layout.num_heads) == want)
          << "column lists, block " << block << (per_head ? " per head" : " shared");
    }
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
  // Entry 0 of tile row 0 (blocks 0..3): block row 0 full (bits 0..3) plus the diagonal blocks
  // 1..3.
  EXPECT_EQ(t.row_masks[0], 0xF | (1 << 5) | (1 << 10) | (1 << 15));
  // Entry 5: blocks 20..23, only the global row's.
  EXPECT_EQ((std::vector<int64_t>(t.row_slots.begin() + 20, t.row_slots.begin() + 24)),
            (std::vector<int64_t>{20, 21, 22, 23}));
  EXPECT_EQ(t.row_masks[5], 0xF);
  expect_tiles_of(layout, 16, ix);
}

TEST(SparseAttentionTiles, DefaultSplitFollowsTheTileLines) {
  // Block 16, 2,048 tokens (128 block rows, 32 tile rows): a window of 3 blocks plus block row 0
  // global. A tile row gathers four block rows: its line packs their 6 window blocks into 2
  // entries, and the global row's 128 blocks take 32. The tile default (at least 16 entries a
  // piece) keeps every ordinary line whole and cuts the global row only.
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
  // The heads share the layout: one stored head, whose tile row 0 holds all 128 blocks in 32
  // entries (the global row): two pieces; nothing else splits.
  EXPECT_EQ(t.num_heads, 1);
  EXPECT_EQ(t.rows.split_lines, (std::vector<int64_t>{0}));
  EXPECT_EQ(t.rows.slots, 2);
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
  EXPECT_EQ(t.row_entries, 12);
  EXPECT_EQ(t.col_entries, 12);
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

// Tests of the BlockSparseIndex: the nonzero enumeration in DeepSpeed's layout.nonzero() order,
// the row-wise (CSR) and column-wise (CSC) indexes, the longest row and column, and every
// rejection of build_block_sparse_index. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block_sparse_test_util.h"

namespace sciattn {
namespace {

using namespace sciattn::bstest;

// Whether every head of `layout` has head 0's blocks.
bool heads_share(const Layout& layout) {
  for (int64_t h = 1; h < layout.num_heads; ++h)
    for (int64_t r = 0; r < layout.num_row_blocks; ++r)
      for (int64_t c = 0; c < layout.num_col_blocks; ++c)
        if (layout.at(h, r, c) != layout.at(0, r, c)) return false;
  return true;
}

// Checks every array of `ix` against `layout` from first principles, through the accessors that
// map heads to stored heads and stored positions to the sparse tensors' blocks.
void expect_index_of(const BlockSparseIndex& ix, const Layout& layout, int64_t block) {
  const std::vector<Block> blocks = nonzero_blocks(layout);
  ASSERT_EQ(ix.nnz, static_cast<int64_t>(blocks.size()));
  EXPECT_EQ(ix.block, block);
  EXPECT_EQ(ix.num_heads, layout.num_heads);
  EXPECT_EQ(ix.num_row_blocks, layout.num_row_blocks);
  EXPECT_EQ(ix.num_col_blocks, layout.num_col_blocks);
  // A layout the heads share is stored once.
  const int64_t G = heads_share(layout) ? 1 : layout.num_heads;
  ASSERT_EQ(ix.layout_heads, G);
  ASSERT_EQ(ix.stored_nnz() * (layout.num_heads / G), ix.nnz);
  EXPECT_EQ(static_cast<int64_t>(ix.col.size()), ix.stored_nnz());
  EXPECT_EQ(static_cast<int64_t>(ix.row_offsets.size()), G * layout.num_row_blocks + 1);
  EXPECT_EQ(static_cast<int64_t>(ix.col_offsets.size()), G * layout.num_col_blocks + 1);
  for (size_t p = 0; p < blocks.size(); ++p) {
    const auto q = static_cast<int64_t>(p);
    EXPECT_EQ(ix.block_head(q), blocks[p].h);
    EXPECT_EQ(ix.block_row(q), blocks[p].r);
    EXPECT_EQ(ix.block_col(q), blocks[p].c);
  }
  int64_t max_row = 0, max_col = 0;
  for (int64_t h = 0; h < layout.num_heads; ++h) {
    const int64_t shift = ix.position_shift(h);
    for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
      // The CSR range of (h, r) holds exactly the blocks of that row, in column order.
      std::vector<int64_t> want;
      for (size_t p = 0; p < blocks.size(); ++p) {
        if (blocks[p].h == h && blocks[p].r == r) want.push_back(static_cast<int64_t>(p));
      }
      std::vector<int64_t> got;
      for (int64_t s = ix.row_begin(h, r); s < ix.row_end(h, r); ++s) {
        got.push_back(s + shift);
        EXPECT_EQ(ix.row[static_cast<size_t>(s)], r);
        EXPECT_EQ(ix.head[static_cast<size_t>(s)], ix.stored_head(h));
      }
      EXPECT_EQ(got, want) << "row (" << h << ", " << r << ")";
      max_row = std::max<int64_t>(max_row, static_cast<int64_t>(want.size()));
    }
    for (int64_t c = 0; c < layout.num_col_blocks; ++c) {
      // The CSC range of (h, c) holds the blocks of that column, in row order.
      std::vector<int64_t> want_p, want_r;
      for (size_t p = 0; p < blocks.size(); ++p) {
        if (blocks[p].h == h && blocks[p].c == c) {
          want_p.push_back(static_cast<int64_t>(p));
          want_r.push_back(blocks[p].r);
        }
      }
      std::vector<int64_t> got_p, got_r;
      for (int64_t e = ix.col_begin(h, c); e < ix.col_end(h, c); ++e) {
        got_p.push_back(ix.col_blocks[static_cast<size_t>(e)] + shift);
        got_r.push_back(ix.col_rows[static_cast<size_t>(e)]);
      }
      EXPECT_EQ(got_p, want_p) << "col (" << h << ", " << c << ")";
      EXPECT_EQ(got_r, want_r) << "col (" << h << ", " << c << ")";
      max_col = std::max<int64_t>(max_col, static_cast<int64_t>(want_p.size()));
    }
  }
  EXPECT_EQ(ix.max_row_nnz, max_row);
  EXPECT_EQ(ix.max_col_nnz, max_col);
}

TEST(BlockSparseIndex, MatchesTheLayoutForRandomLayouts) {
  for (uint64_t s = 0; s < 20; ++s) {
    const uint64_t seed = kBaseSeed + 10 + s;
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const int64_t H = 1 + static_cast<int64_t>(rng() % 3), R = 1 + static_cast<int64_t>(rng() % 6),
                  C = 1 + static_cast<int64_t>(rng() % 6);
    const Layout layout =
        random_layout(H, R, C, 0.1 + 0.1 * static_cast<double>(s % 9), rng, s % 2 == 0, s % 3 == 0);
    const int64_t block = int64_t{16} << (s % 4);
    expect_index_of(make_index(layout, block), layout, block);
  }
}

// The BigBird seed-0 grid of spec 1.9: block p = 0 is (0, 0, 0) and the global first row comes
// first, in column order, as layout.nonzero() numbers it.
// A layout the heads share is stored once (layout_heads 1); one that differs in a single block
// of one head is not, and neither is a layout whose heads have the same columns in other rows.
TEST(BlockSparseIndex, SharedLayoutIsStoredOnce) {
  for (uint64_t s = 0; s < 12; ++s) {
    const uint64_t seed = kBaseSeed + 40 + s;
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const int64_t H = 2 + static_cast<int64_t>(rng() % 3), R = 1 + static_cast<int64_t>(rng() % 6),
                  C = 1 + static_cast<int64_t>(rng() % 6);
    const Layout one = random_layout(1, R, C, 0.2 + 0.1 * static_cast<double>(s % 6), rng);
    Layout shared = Layout::zeros(H, R, C);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) shared.at(h, r, c) = one.at(0, r, c);
    const int64_t block = int64_t{16} << (s % 4);
    const BlockSparseIndex ix = make_index(shared, block);
    EXPECT_EQ(ix.layout_heads, 1);
    expect_index_of(ix, shared, block);
    Layout differs = shared;
    differs.at(static_cast<int64_t>(s) % H, R - 1, static_cast<int64_t>(s) % C) ^= 1;
    if (layout_nnz(differs) > 0) {
      const BlockSparseIndex d = make_index(differs, block);
      EXPECT_EQ(d.layout_heads, H);
      expect_index_of(d, differs, block);
    }
  }
  // Same column lists in different rows: head 0 holds (0, 1), head 1 holds (1, 1).
  Layout moved = Layout::zeros(2, 2, 2);
  moved.at(0, 0, 1) = 1;
  moved.at(1, 1, 1) = 1;
  const BlockSparseIndex m = make_index(moved, 16);
  EXPECT_EQ(m.layout_heads, 2);
  expect_index_of(m, moved, 16);
}

TEST(BlockSparseIndex, BigBirdSeed0Enumeration) {
  BigBirdSparsityConfig cfg;
  cfg.num_heads = 1;
  Layout layout;
  ASSERT_TRUE(make_layout(cfg, 128, &layout).ok());
  const BlockSparseIndex ix = make_index(layout, 16);
  EXPECT_EQ(ix.nnz, 37);
  expect_index_of(ix, layout, 16);
  EXPECT_EQ(ix.row_end(0, 0), 8);  // row 0 is global: 8 blocks
  EXPECT_EQ(ix.max_row_nnz, 8);
  EXPECT_EQ(ix.max_col_nnz, 8);
}

TEST(BlockSparseIndex, EmptyLayoutHasNoBlocks) {
  const BlockSparseIndex ix = make_index(Layout::zeros(2, 3, 4), 32);
  EXPECT_EQ(ix.nnz, 0);
  EXPECT_EQ(ix.layout_heads, 1);  // the two (empty) heads share their layout
  EXPECT_EQ(ix.row_offsets, std::vector<int64_t>(3 + 1, 0));
  EXPECT_EQ(ix.col_offsets, std::vector<int64_t>(4 + 1, 0));
  EXPECT_EQ(ix.max_row_nnz, 0);
}

// Checks a work split against the line ranges `offsets` from first principles: every line's
// range is covered by its pieces exactly once, in order, each piece holds at most max_blocks
// blocks, a line's pieces differ in size by at most one, and an empty line is one empty piece.
void expect_split_of(const BlockSparseWorkSplit& w, const std::vector<int64_t>& offsets,
                     int64_t max_blocks, const char* what) {
  SCOPED_TRACE(what);
  const int64_t lines = static_cast<int64_t>(offsets.size()) - 1;
  EXPECT_EQ(w.max_blocks, max_blocks);
  ASSERT_EQ(static_cast<int64_t>(w.line_items.size()), lines + 1);
  EXPECT_EQ(w.line_items[0], 0);
  EXPECT_EQ(w.line_items.back(), w.pieces());
  ASSERT_EQ(w.item_begin.size(), w.item_line.size());
  ASSERT_EQ(w.item_end.size(), w.item_line.size());
  int64_t split = 0, most = 0, split_pieces = 0;
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t first = w.line_items[static_cast<size_t>(l)];
    const int64_t last = w.line_items[static_cast<size_t>(l + 1)];
    ASSERT_GE(last - first, 1) << "line " << l << " has no piece";
    int64_t at = offsets[static_cast<size_t>(l)], smallest = INT64_MAX, largest = 0;
    for (int64_t i = first; i < last; ++i) {
      EXPECT_EQ(w.item_line[static_cast<size_t>(i)], l);
      EXPECT_EQ(w.item_begin[static_cast<size_t>(i)], at) << "piece " << i << " leaves a gap";
      const int64_t size =
          w.item_end[static_cast<size_t>(i)] - w.item_begin[static_cast<size_t>(i)];
      EXPECT_LE(size, max_blocks);
      EXPECT_GE(size, last - first > 1 ? 1 : 0);
      smallest = std::min(smallest, size);
      largest = std::max(largest, size);
      at = w.item_end[static_cast<size_t>(i)];
    }
    EXPECT_EQ(at, offsets[static_cast<size_t>(l + 1)]) << "line " << l << " not fully covered";
    EXPECT_LE(largest - smallest, 1) << "line " << l << " is cut unevenly";
    if (last - first > 1) {
      ++split;
      split_pieces += last - first;
    }
    most = std::max(most, last - first);
  }
  EXPECT_EQ(w.split_lines, split);
  EXPECT_EQ(w.split_pieces(), split_pieces);
  EXPECT_EQ(w.max_pieces_per_line, most);
}

TEST(BlockSparseIndex, WorkSplitCoversEveryBlockOnceInOrder) {
  for (uint64_t s = 0; s < 12; ++s) {
    const uint64_t seed = kBaseSeed + 200 + s;
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const int64_t H = 1 + static_cast<int64_t>(rng() % 3), R = 1 + static_cast<int64_t>(rng() % 40),
                  C = 1 + static_cast<int64_t>(rng() % 40);
    const Layout layout =
        random_layout(H, R, C, 0.05 + 0.1 * static_cast<double>(s % 9), rng, s % 2 == 0, false);
    BlockSparseIndex ix = make_index(layout, 32);
    expect_split_of(ix.row_split, ix.row_offsets, default_split_blocks(ix), "rows, default");
    expect_split_of(ix.col_split, ix.col_offsets, default_split_blocks(ix), "columns, default");
    for (int64_t max_blocks : {1, 2, 3, 7}) {
      ASSERT_TRUE(split_block_sparse_work(max_blocks, &ix).ok());
      expect_split_of(ix.row_split, ix.row_offsets, max_blocks, "rows");
      expect_split_of(ix.col_split, ix.col_offsets, max_blocks, "columns");
    }
  }
}

// A global block row attends to every column: with the default piece size it is the line that
// gets cut, while the window rows stay whole.
TEST(BlockSparseIndex, WorkSplitCutsGlobalRowsOnly) {
  BSLongformerSparsityConfig cfg;
  cfg.num_heads = 2;
  cfg.block = 16;
  Layout layout;
  ASSERT_TRUE(make_layout(cfg, 16 * 256, &layout).ok());  // 256 block rows, global row 0
  const BlockSparseIndex ix = make_index(layout, 16);
  ASSERT_EQ(ix.layout_heads, 1);  // the two heads share the layout: one stored head's lines
  const int64_t max_blocks = default_split_blocks(ix);
  EXPECT_LT(max_blocks, 256);
  for (int64_t h = 0; h < 1; ++h) {
    const int64_t global = h * 256;  // row 0 of stored head h
    const int64_t pieces = ix.row_split.line_items[static_cast<size_t>(global + 1)] -
                           ix.row_split.line_items[static_cast<size_t>(global)];
    EXPECT_EQ(pieces, (256 + max_blocks - 1) / max_blocks);
    const int64_t window_row = global + 100;
    EXPECT_EQ(ix.row_split.line_items[static_cast<size_t>(window_row + 1)] -
                  ix.row_split.line_items[static_cast<size_t>(window_row)],
              1);
  }
  EXPECT_EQ(ix.row_split.split_lines, 1);  // the global row of the stored head
  EXPECT_EQ(ix.col_split.split_lines, 1);  // ... and its global column
}

TEST(BlockSparseIndex, WorkSplitOfAnEmptyLayoutAndRejections) {
  BlockSparseIndex ix = make_index(Layout::zeros(2, 3, 4), 32);
  EXPECT_EQ(ix.row_split.pieces(), 3);  // one empty piece per line of the stored head
  EXPECT_EQ(ix.col_split.pieces(), 4);
  expect_split_of(ix.row_split, ix.row_offsets, default_split_blocks(ix), "rows");
  const Status s = split_block_sparse_work(0, &ix);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(s.message(), "max_blocks")) << s.message();
  EXPECT_EQ(split_block_sparse_work(4, nullptr).code(), StatusCode::kInvalidArgument);
}

// Layouts of 2^20 entries or more are scanned by several threads: the index must be the same
// as a plain scan's, including a bad entry found in the middle of a line.
TEST(BlockSparseIndex, LargeLayoutScannedInParallelMatchesAPlainScan) {
  const uint64_t seed = kBaseSeed + 300;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  Layout layout = random_layout(2, 1024, 600, 0.004, rng, true, false);  // 1.2 M entries
  const BlockSparseIndex ix = make_index(layout, 16);
  std::vector<int64_t> head, row, col, offsets = {0};
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t r = 0; r < 1024; ++r) {
      for (int64_t c = 0; c < 600; ++c) {
        if (layout.at(h, r, c) == 0) continue;
        head.push_back(h);
        row.push_back(r);
        col.push_back(c);
      }
      offsets.push_back(static_cast<int64_t>(head.size()));
    }
  ASSERT_GT(head.size(), 1000u);
  EXPECT_EQ(ix.head, head);
  EXPECT_EQ(ix.row, row);
  EXPECT_EQ(ix.col, col);
  EXPECT_EQ(ix.row_offsets, offsets);
  for (int64_t k = 0; k < 2 * 600; ++k) {
    for (int64_t e = ix.col_offsets[static_cast<size_t>(k)];
         e < ix.col_offsets[static_cast<size_t>(k + 1)]; ++e) {
      const int64_t p = ix.col_blocks[static_cast<size_t>(e)];
      EXPECT_EQ(ix.head[static_cast<size_t>(p)] * 600 + ix.col[static_cast<size_t>(p)], k);
    }
  }
  expect_split_of(ix.row_split, ix.row_offsets, default_split_blocks(ix), "rows");
  layout.at(1, 700, 333) = 7;
  BlockSparseIndex bad;
  const Status s = build_block_sparse_index(layout, 16, &bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(s.message(), "(head 1, row 700, col 333) is 7")) << s.message();
}

void expect_rejected(const Layout& layout, int64_t block, const std::string& name,
                     BlockSparseIndex* out_ptr = nullptr, bool use_null = false) {
  BlockSparseIndex out;
  const Status s = build_block_sparse_index(layout, block, use_null ? out_ptr : &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(mentions(s.message(), name)) << "'" << name << "' not in: " << s.message();
}

TEST(BlockSparseIndex, Rejections) {
  const Layout ok = Layout::zeros(1, 2, 2);
  expect_rejected(ok, 16, "out", nullptr, /*use_null=*/true);
  for (int64_t block : {0, 8, 24, 256, -16}) expect_rejected(ok, block, "block");
  expect_rejected(Layout::zeros(0, 2, 2), 16, "layout");
  Layout no_rows;
  no_rows.num_heads = 1;
  no_rows.num_col_blocks = 2;
  expect_rejected(no_rows, 16, "layout");
  Layout short_blocks = ok;
  short_blocks.blocks.pop_back();
  expect_rejected(short_blocks, 16, "layout.blocks");
  Layout bad_entry = ok;
  bad_entry.blocks[3] = 2;
  expect_rejected(bad_entry, 16, "layout.blocks");
  Layout huge;
  huge.num_heads = 1;
  huge.num_row_blocks = huge.num_col_blocks = int64_t{1} << 31;
  expect_rejected(huge, 128, "layout");
  BlockSparseIndex out;
  EXPECT_EQ(build_sparse_attention_index(FixedSparsityConfig{}, 2048, 128, nullptr).code(),
            StatusCode::kInvalidArgument);
  // A config error comes through unchanged (num_heads is required).
  const Status s = build_sparse_attention_index(FixedSparsityConfig{}, 2048, 128, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(s.message(), "num_heads")) << s.message();
}

TEST(BlockSparseIndex, NamesAndParsers) {
  EXPECT_STREQ(mask_mode_name(MaskMode::kAdd), "add");
  EXPECT_STREQ(mask_mode_name(MaskMode::kMul), "mul");
  EXPECT_EQ(parse_mask_mode("mul"), MaskMode::kMul);
  EXPECT_FALSE(parse_mask_mode("multiply").has_value());
  for (auto m :
       {BlockSparseMatMulMode::kSdd, BlockSparseMatMulMode::kDsd, BlockSparseMatMulMode::kDds}) {
    EXPECT_EQ(parse_matmul_mode(matmul_mode_name(m)), m);
  }
  EXPECT_FALSE(parse_matmul_mode("ddd").has_value());
  EXPECT_STREQ(sparse_attention_algorithm_name(SparseAttentionAlgorithm::kComposite), "composite");
}

}  // namespace
}  // namespace sciattn

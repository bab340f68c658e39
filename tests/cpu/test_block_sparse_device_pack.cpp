// Tests of the host step of the block-sparse index upload (src/common/block_sparse_device_pack.h):
// every array of the index and of its tile index lands in the int32 buffer unchanged, on 16-byte
// boundaries, and `at` moves every pointer to another copy of the buffer. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "block_sparse_test_util.h"
#include "common/block_sparse_device_pack.h"
#include "common/sparse_attention_tiles.h"

namespace sciattn {
namespace {

using namespace sciattn::bstest;

void expect_array(const int32_t* got, const std::vector<int64_t>& want, const int32_t* base,
                  size_t size, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_GE(got, base);
  EXPECT_EQ((got - base) % 4, 0) << "not on a 16-byte boundary";
  ASSERT_LE(static_cast<size_t>(got - base) + want.size(), size) << "past the buffer";
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "element " << i;
  }
}

void expect_split(const BlockSparseDeviceArrays::Split& d, const BlockSparseWorkSplit& s,
                  const int32_t* base, size_t size, const std::string& what) {
  EXPECT_EQ(d.pieces, s.pieces()) << what;
  EXPECT_EQ(d.max_blocks, s.max_blocks) << what;
  expect_array(d.line_items, s.line_items, base, size, what + " line_items");
  expect_array(d.item_line, s.item_line, base, size, what + " item_line");
  expect_array(d.item_begin, s.item_begin, base, size, what + " item_begin");
  expect_array(d.item_end, s.item_end, base, size, what + " item_end");
  // The partial slots, as the MatMul kernels read them: the pieces of each line with more than
  // one piece numbered 0.. in piece order, -1 for the piece of a whole line.
  std::vector<int64_t> slot(static_cast<size_t>(s.pieces()), -1), lines;
  int64_t next = 0;
  for (size_t l = 0; l + 1 < s.line_items.size(); ++l) {
    if (s.line_items[l + 1] - s.line_items[l] == 1) continue;
    lines.push_back(static_cast<int64_t>(l));
    for (int64_t i = s.line_items[l]; i < s.line_items[l + 1]; ++i) slot[i] = next++;
  }
  EXPECT_EQ(d.slots, next) << what;
  EXPECT_EQ(d.slots, s.split_pieces()) << what;
  EXPECT_EQ(d.num_split_lines, static_cast<int64_t>(lines.size())) << what;
  expect_array(d.item_slot, slot, base, size, what + " item_slot");
  expect_array(d.split_lines, lines, base, size, what + " split_lines");
}

void expect_work(const BlockSparseDeviceArrays::TileWork& d,
                 const detail::SparseAttentionTileWork& w, const int32_t* base, size_t size,
                 const std::string& what) {
  EXPECT_EQ(d.pieces, w.split.pieces()) << what;
  EXPECT_EQ(d.max_tiles, w.split.max_blocks) << what;
  EXPECT_EQ(d.slots, w.slots) << what;
  EXPECT_EQ(d.num_split_lines, static_cast<int64_t>(w.split_lines.size())) << what;
  expect_array(d.line_items, w.split.line_items, base, size, what + " line_items");
  expect_array(d.item_line, w.split.item_line, base, size, what + " item_line");
  expect_array(d.item_begin, w.split.item_begin, base, size, what + " item_begin");
  expect_array(d.item_end, w.split.item_end, base, size, what + " item_end");
  expect_array(d.item_slot, w.item_slot, base, size, what + " item_slot");
  expect_array(d.split_lines, w.split_lines, base, size, what + " split_lines");
}

// The arrays of `a` (pointing into base[0, size)) hold the index's and its tile index's values.
void expect_packed(const BlockSparseDeviceArrays& a, const BlockSparseIndex& ix,
                   const int32_t* base, size_t size) {
  EXPECT_EQ(a.block, ix.block);
  EXPECT_EQ(a.num_heads, ix.num_heads);
  EXPECT_EQ(a.num_row_blocks, ix.num_row_blocks);
  EXPECT_EQ(a.num_col_blocks, ix.num_col_blocks);
  EXPECT_EQ(a.nnz, ix.nnz);
  EXPECT_EQ(a.max_row_nnz, ix.max_row_nnz);
  EXPECT_EQ(a.max_col_nnz, ix.max_col_nnz);
  EXPECT_EQ(a.layout_heads, ix.layout_heads);
  EXPECT_EQ(a.stored_nnz, ix.stored_nnz());
  expect_array(a.head, ix.head, base, size, "head");
  expect_array(a.row, ix.row, base, size, "row");
  expect_array(a.col, ix.col, base, size, "col");
  expect_array(a.row_offsets, ix.row_offsets, base, size, "row_offsets");
  expect_array(a.col_offsets, ix.col_offsets, base, size, "col_offsets");
  expect_array(a.col_rows, ix.col_rows, base, size, "col_rows");
  expect_array(a.col_blocks, ix.col_blocks, base, size, "col_blocks");
  expect_split(a.row_split, ix.row_split, base, size, "row_split");
  expect_split(a.col_split, ix.col_split, base, size, "col_split");
  if (ix.num_row_blocks != ix.num_col_blocks) {
    EXPECT_EQ(a.tiles.num_tiles, 0) << "a rectangular layout has no tile index";
    return;
  }
  detail::SparseAttentionTiles t;
  ASSERT_TRUE(detail::build_sparse_attention_tiles(ix, &t).ok());
  const BlockSparseDeviceArrays::Tiles& d = a.tiles;
  EXPECT_EQ(d.sub, t.sub);
  EXPECT_EQ(d.shift, t.shift);
  EXPECT_EQ(d.full_mask, t.full_mask);
  EXPECT_EQ(d.num_tiles, t.num_tiles);
  EXPECT_EQ(d.layout_heads, ix.layout_heads);
  EXPECT_EQ(d.head_repeat, ix.num_heads / ix.layout_heads);
  EXPECT_EQ(d.row_entries, t.row_entries);
  EXPECT_EQ(d.col_entries, t.col_entries);
  expect_array(d.row_offsets, t.row_offsets, base, size, "tile row_offsets");
  expect_array(d.row_slots, t.row_slots, base, size, "tile row_slots");
  expect_array(d.row_masks, t.row_masks, base, size, "tile row_masks");
  expect_array(d.col_offsets, t.col_offsets, base, size, "tile col_offsets");
  expect_array(d.col_slots, t.col_slots, base, size, "tile col_slots");
  expect_array(d.col_masks, t.col_masks, base, size, "tile col_masks");
  expect_array(d.row_units, t.row_units, base, size, "tile row_units");
  expect_array(d.col_units, t.col_units, base, size, "tile col_units");
  expect_array(d.row_unit_place, t.row_unit_place, base, size, "tile row_unit_place");
  expect_array(d.col_unit_place, t.col_unit_place, base, size, "tile col_unit_place");
  expect_work(d.rows, t.rows, base, size, "tile rows");
  expect_work(d.cols, t.cols, base, size, "tile cols");
  // The tile lines' own tokens: through their units when packed, contiguous otherwise.
  EXPECT_EQ(d.rows.line_units, t.row_units.empty() ? nullptr : d.row_units);
  EXPECT_EQ(d.cols.line_units, t.col_units.empty() ? nullptr : d.col_units);
}

TEST(BlockSparseDevicePack, EveryArrayLandsInTheBufferAndMovesWithIt) {
  for (uint64_t s = 0; s < 8; ++s) {
    const uint64_t seed = kBaseSeed + 1100 + s;
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const int64_t block = int64_t{16} << (s % 4);
    const int64_t R = 2 + static_cast<int64_t>(rng() % 9);
    const int64_t C = s % 3 == 2 ? R + 1 : R;  // some rectangular (no tiles)
    // Every third seed: heads sharing one layout (one stored head, head_repeat = H).
    const Layout layout = maybe_shared_heads(
        random_layout(1 + static_cast<int64_t>(rng() % 3), R, C, 0.3, rng), seed);
    BlockSparseIndex ix = make_index(layout, block);
    if (s % 2 == 1) {
      ASSERT_TRUE(split_block_sparse_work(1, &ix).ok());  // split lines too
    }
    detail::PackedBlockSparseIndex packed;
    ASSERT_TRUE(detail::pack_block_sparse_index(ix, &packed).ok());
    expect_packed(packed.at(packed.data()), ix, packed.data(), packed.size());
    // Another copy of the buffer (the device's, on the GPU): every pointer follows.
    const std::vector<int32_t> copy(packed.data(), packed.data() + packed.size());
    expect_packed(packed.at(copy.data()), ix, copy.data(), copy.size());
  }
}

// lower_complete (the forward's dense causal kernel) holds exactly when every stored head has
// every block at or below the diagonal, whatever it has above it.
TEST(BlockSparseDevicePack, MarksLayoutsHoldingTheLowerTriangle) {
  const int64_t H = 2, R = 5;
  auto lower = [&]() {
    Layout layout = Layout::zeros(H, R, R);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c <= r; ++c) layout.at(h, r, c) = 1;
    return layout;
  };
  auto lower_complete = [](const Layout& layout, int64_t block) {
    detail::PackedBlockSparseIndex packed;
    const Status s = detail::pack_block_sparse_index(make_index(layout, block), &packed);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return packed.at(packed.data()).tiles.lower_complete;
  };
  Layout layout = lower();
  EXPECT_EQ(lower_complete(layout, 64), 1);
  EXPECT_EQ(lower_complete(layout, 16), 1);
  layout.at(1, 3, 4) = 1;  // a block above the diagonal too
  EXPECT_EQ(lower_complete(layout, 32), 1);
  layout = lower();
  layout.at(1, 3, 1) = 0;  // one block below the diagonal missing in the second head
  EXPECT_EQ(lower_complete(layout, 64), 0);
  layout = lower();
  layout.at(0, 4, 4) = 0;  // a diagonal block missing
  EXPECT_EQ(lower_complete(layout, 64), 0);
  layout = Layout::zeros(1, R, R);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < R; ++c) layout.at(0, r, c) = 1;  // dense
  EXPECT_EQ(lower_complete(layout, 128), 1);
  // A rectangular layout has no tile index, so no dense causal form.
  layout = Layout::zeros(1, R, R + 1);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c <= R; ++c) layout.at(0, r, c) = 1;
  EXPECT_EQ(lower_complete(layout, 64), 0);
}

TEST(BlockSparseDevicePack, RefusesAnUnbuiltIndex) {
  detail::PackedBlockSparseIndex packed;
  const Status s = detail::pack_block_sparse_index(BlockSparseIndex{}, &packed);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("index has not been built"), std::string::npos) << s.message();
  EXPECT_FALSE(detail::pack_block_sparse_index(BlockSparseIndex{}, nullptr).ok());
}

}  // namespace
}  // namespace sciattn

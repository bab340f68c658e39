// Packs a BlockSparseIndex and its tile index into the int32 buffer of a device index (see
// block_sparse_device_pack.h). Host-only common layer.
#include "common/block_sparse_device_pack.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "common/int32_packer.h"
#include "common/sparse_attention_tiles.h"

namespace sciattn::detail {
namespace {

// Calls fn(pointer) for every array pointer of `a`: the one list that `at` rebases.
template <typename Fn>
void for_each_array(BlockSparseDeviceArrays& a, const Fn& fn) {
  for (const int32_t** p :
       {&a.head, &a.row, &a.col, &a.row_offsets, &a.col_offsets, &a.col_rows, &a.col_blocks}) {
    fn(p);
  }
  for (BlockSparseDeviceArrays::Split* s : {&a.row_split, &a.col_split}) {
    for (const int32_t** p : {&s->line_items, &s->item_line, &s->item_begin, &s->item_end,
                              &s->item_slot, &s->split_lines}) {
      fn(p);
    }
  }
  BlockSparseDeviceArrays::Tiles& t = a.tiles;
  for (const int32_t** p :
       {&t.row_offsets, &t.row_slots, &t.row_masks, &t.col_offsets, &t.col_slots, &t.col_masks,
        &t.row_units, &t.col_units, &t.row_unit_place, &t.col_unit_place}) {
    fn(p);
  }
  for (BlockSparseDeviceArrays::TileWork* w : {&t.rows, &t.cols}) {
    for (const int32_t** p : {&w->line_items, &w->item_line, &w->item_begin, &w->item_end,
                              &w->item_slot, &w->split_lines}) {
      fn(p);
    }
    if (w->line_units != nullptr) fn(&w->line_units);  // null: the line's tokens are contiguous
  }
}

// The partial slots of a split's pieces (see BlockSparseDeviceArrays::Split): derived here, for
// the device only.
struct SplitSlots {
  std::vector<int64_t> item_slot;    // [pieces]
  std::vector<int64_t> split_lines;  // [split lines]
};
SplitSlots slots_of(const BlockSparseWorkSplit& s) {
  SplitSlots r;
  r.item_slot.assign(static_cast<size_t>(s.pieces()), -1);
  r.split_lines.reserve(static_cast<size_t>(s.split_lines));
  int64_t slot = 0;
  for (size_t l = 0; l + 1 < s.line_items.size(); ++l) {
    const int64_t first = s.line_items[l], end = s.line_items[l + 1];
    if (end - first < 2) continue;
    r.split_lines.push_back(static_cast<int64_t>(l));
    for (int64_t i = first; i < end; ++i) r.item_slot[static_cast<size_t>(i)] = slot++;
  }
  return r;
}

// The element offsets of a split's arrays in the packer, as the pointers they will become.
struct SplitOffsets {
  size_t line_items, item_line, item_begin, item_end, item_slot, split_lines;
};
SplitOffsets add_split(Int32Packer& packer, const BlockSparseWorkSplit& s, const SplitSlots& t) {
  return {packer.add(s.line_items), packer.add(s.item_line), packer.add(s.item_begin),
          packer.add(s.item_end),   packer.add(t.item_slot), packer.add(t.split_lines)};
}
BlockSparseDeviceArrays::Split split_at(const int32_t* base, const SplitOffsets& o,
                                        const BlockSparseWorkSplit& s) {
  BlockSparseDeviceArrays::Split d;
  d.pieces = static_cast<int32_t>(s.pieces());
  d.max_blocks = static_cast<int32_t>(s.max_blocks);
  d.slots = static_cast<int32_t>(s.split_pieces());
  d.num_split_lines = static_cast<int32_t>(s.split_lines);
  d.line_items = base + o.line_items;
  d.item_line = base + o.item_line;
  d.item_begin = base + o.item_begin;
  d.item_end = base + o.item_end;
  d.item_slot = base + o.item_slot;
  d.split_lines = base + o.split_lines;
  return d;
}

struct TileWorkOffsets {
  size_t line_items, item_line, item_begin, item_end, item_slot, split_lines;
};
TileWorkOffsets add_tile_work(Int32Packer& packer, const SparseAttentionTileWork& w) {
  return {packer.add(w.split.line_items), packer.add(w.split.item_line),
          packer.add(w.split.item_begin), packer.add(w.split.item_end),
          packer.add(w.item_slot),        packer.add(w.split_lines)};
}
BlockSparseDeviceArrays::TileWork tile_work_at(const int32_t* base, const TileWorkOffsets& o,
                                               const SparseAttentionTileWork& w) {
  BlockSparseDeviceArrays::TileWork d;
  d.pieces = static_cast<int32_t>(w.split.pieces());
  d.max_tiles = static_cast<int32_t>(w.split.max_blocks);
  d.slots = static_cast<int32_t>(w.slots);
  d.num_split_lines = static_cast<int32_t>(w.split_lines.size());
  d.line_items = base + o.line_items;
  d.item_line = base + o.item_line;
  d.item_begin = base + o.item_begin;
  d.item_end = base + o.item_end;
  d.item_slot = base + o.item_slot;
  d.split_lines = base + o.split_lines;
  return d;
}

// Whether every stored head of a square index holds each block (r, c) with c <= r. A row's
// columns are distinct, so it holds them all when it has r + 1 columns at or below r.
bool holds_lower_triangle(const BlockSparseIndex& ix) {
  const int64_t R = ix.num_row_blocks;
  for (int64_t g = 0; g < ix.layout_heads; ++g) {
    for (int64_t r = 0; r < R; ++r) {
      const auto begin = static_cast<size_t>(ix.row_offsets[static_cast<size_t>(g * R + r)]);
      const auto end = static_cast<size_t>(ix.row_offsets[static_cast<size_t>(g * R + r + 1)]);
      int64_t below = 0;
      for (size_t s = begin; s < end; ++s) below += ix.col[s] <= r ? 1 : 0;
      if (below != r + 1) return false;
    }
  }
  return true;
}

}  // namespace

BlockSparseDeviceArrays PackedBlockSparseIndex::at(const int32_t* base) const {
  BlockSparseDeviceArrays a = arrays_;
  const int32_t* own = data_.get();
  for_each_array(a, [&](const int32_t** p) { *p = base + (*p - own); });
  return a;
}

Status pack_block_sparse_index(const BlockSparseIndex& ix, PackedBlockSparseIndex* out) {
  if (out == nullptr) return Status::invalid_argument("out is a null pointer");
  if (ix.block < 1 || ix.layout_heads < 1 || ix.num_heads % ix.layout_heads != 0 ||
      static_cast<int64_t>(ix.row_offsets.size()) != ix.layout_heads * ix.num_row_blocks + 1) {
    return Status::invalid_argument(
        "index has not been built; build it with build_block_sparse_index first");
  }
  // The stored arrays hold positions below stored_nnz only: the counts over all heads are
  // checked here (the packer checks every value it converts).
  if (ix.nnz > std::numeric_limits<int32_t>::max() ||
      ix.num_heads * std::max(ix.num_row_blocks, ix.num_col_blocks) >
          std::numeric_limits<int32_t>::max()) {
    return Status::invalid_argument(
        "index has a count that does not fit the GPU kernels' 32-bit indexes (at most 2^31 - 1 "
        "blocks over all heads, and heads times block rows)");
  }
  // The arrays are registered (offsets fixed), then converted into one buffer in one pass.
  Int32Packer packer;
  const size_t head = packer.add(ix.head), row = packer.add(ix.row), col = packer.add(ix.col);
  const size_t row_offsets = packer.add(ix.row_offsets);
  const size_t col_offsets = packer.add(ix.col_offsets);
  const size_t col_rows = packer.add(ix.col_rows), col_blocks = packer.add(ix.col_blocks);
  const SplitSlots row_slots = slots_of(ix.row_split), col_slots = slots_of(ix.col_split);
  const SplitOffsets row_split = add_split(packer, ix.row_split, row_slots);
  const SplitOffsets col_split = add_split(packer, ix.col_split, col_slots);
  // The fused attention's tiles, for square layouts (sparse self-attention); the MatMul and
  // Softmax ops also take rectangular ones, which get none.
  SparseAttentionTiles tiles;
  const bool with_tiles = ix.num_row_blocks == ix.num_col_blocks;
  if (with_tiles) {
    const Status built = build_sparse_attention_tiles(ix, &tiles);
    if (!built.ok()) return built;
  }
  const size_t tile_row_offsets = packer.add(tiles.row_offsets);
  const size_t tile_row_slots = packer.add(tiles.row_slots);
  const size_t tile_row_masks = packer.add(tiles.row_masks);
  const size_t tile_col_offsets = packer.add(tiles.col_offsets);
  const size_t tile_col_slots = packer.add(tiles.col_slots);
  const size_t tile_col_masks = packer.add(tiles.col_masks);
  const size_t tile_row_units = packer.add(tiles.row_units);
  const size_t tile_col_units = packer.add(tiles.col_units);
  const size_t tile_row_unit_place = packer.add(tiles.row_unit_place);
  const size_t tile_col_unit_place = packer.add(tiles.col_unit_place);
  const TileWorkOffsets tile_rows = add_tile_work(packer, tiles.rows);
  const TileWorkOffsets tile_cols = add_tile_work(packer, tiles.cols);

  PackedBlockSparseIndex p;
  p.size_ = packer.size();
  p.data_.reset(new int32_t[p.size_ > 0 ? p.size_ : 1]);
  if (!packer.pack(p.data_.get())) {
    return Status::invalid_argument(
        "index has a count that does not fit the GPU kernels' 32-bit "
        "indexes (at most 2^31 - 1 blocks per dimension and in all)");
  }
  const int32_t* base = p.data_.get();
  BlockSparseDeviceArrays& a = p.arrays_;
  a.block = static_cast<int32_t>(ix.block);
  a.num_heads = static_cast<int32_t>(ix.num_heads);
  a.num_row_blocks = static_cast<int32_t>(ix.num_row_blocks);
  a.num_col_blocks = static_cast<int32_t>(ix.num_col_blocks);
  a.nnz = static_cast<int32_t>(ix.nnz);
  a.max_row_nnz = static_cast<int32_t>(ix.max_row_nnz);
  a.max_col_nnz = static_cast<int32_t>(ix.max_col_nnz);
  a.layout_heads = static_cast<int32_t>(ix.layout_heads);
  a.stored_nnz = static_cast<int32_t>(ix.stored_nnz());
  a.head = base + head;
  a.row = base + row;
  a.col = base + col;
  a.row_offsets = base + row_offsets;
  a.col_offsets = base + col_offsets;
  a.col_rows = base + col_rows;
  a.col_blocks = base + col_blocks;
  a.row_split = split_at(base, row_split, ix.row_split);
  a.col_split = split_at(base, col_split, ix.col_split);
  // Without tiles the tile arrays stay empty (num_tiles 0); their pointers still point into the
  // buffer, at the end of the index's arrays, so that `at` rebases every pointer alike.
  BlockSparseDeviceArrays::Tiles& t = a.tiles;
  if (with_tiles) {
    t.sub = static_cast<int32_t>(tiles.sub);
    t.shift = static_cast<int32_t>(tiles.shift);
    t.full_mask = static_cast<int32_t>(tiles.full_mask);
    t.num_tiles = static_cast<int32_t>(tiles.num_tiles);
    t.lower_complete = holds_lower_triangle(ix) ? 1 : 0;
    t.layout_heads = static_cast<int32_t>(ix.layout_heads);
    t.head_repeat = static_cast<int32_t>(ix.num_heads / ix.layout_heads);
    t.row_entries = static_cast<int32_t>(tiles.row_entries);
    t.col_entries = static_cast<int32_t>(tiles.col_entries);
  }
  t.row_offsets = base + tile_row_offsets;
  t.row_slots = base + tile_row_slots;
  t.row_masks = base + tile_row_masks;
  t.col_offsets = base + tile_col_offsets;
  t.col_slots = base + tile_col_slots;
  t.col_masks = base + tile_col_masks;
  t.row_units = base + tile_row_units;
  t.col_units = base + tile_col_units;
  t.row_unit_place = base + tile_row_unit_place;
  t.col_unit_place = base + tile_col_unit_place;
  t.rows = tile_work_at(base, tile_rows, tiles.rows);
  t.cols = tile_work_at(base, tile_cols, tiles.cols);
  if (!tiles.col_units.empty()) {  // a packed layout: its tile lines' units
    t.rows.line_units = t.row_units;
    t.cols.line_units = t.col_units;
  }
  *out = std::move(p);
  return Status::ok_status();
}

}  // namespace sciattn::detail

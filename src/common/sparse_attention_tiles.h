// The tile-level index of the fused block-sparse attention kernels on the GPU: for each 64-row
// (or 64-column) kernel tile of each stored head (one for a layout the heads share), the list of
// entries the kernels walk, each a 64 x 64 block of scores with a bitmask of the layout blocks
// present, and the split of long lists into pieces. Host-only common layer (plain C++): built once
// per layout by upload_block_sparse_index.
//
// The kernels work on entries of kTile x kTile scores whatever the layout block b is. An entry of
// tile row T holds the tile's kTile query rows and `sub` slots of kTile / sub keys each; slot k
// holds the keys of one column unit (1 << shift tokens):
//   b < kTile   units are layout blocks: sub = kTile / b, and a row's entries pack the column
//               blocks that any of its sub block rows holds, in ascending order, sub at a time (a
//               BigBird row of blocks 16 takes 3 entries where the 64 x 64 tiles it touches were
//               8); the mask has bit r * sub + k set when block row r of the tile holds slot k's
//               block, and the kernels remove the elements whose bit is clear;
//   b >= kTile  units are tiles (sub = 1, mask = 1): a layout block spans b / kTile tiles per
//               side, each an entry.
// Column lists are the same over keys: an entry of tile column T holds its kTile keys and `sub`
// slots of query units, mask bit k * sub + c for slot k and key block c of the tile (bits always
// (query, key)). Every slot is a whole unit inside L = R * b; only the last tile row or column
// can be partial (b < kTile and L not a multiple of kTile).
#pragma once

#include <cstdint>
#include <vector>

#include "sciattn/block_sparse_ops.h"

namespace sciattn::detail {

// The pieces of the tile lines (tile rows for the forward and dQ, tile columns for dK/dV) and
// the fp32 partial slot of each piece of a split line.
struct SparseAttentionTileWork {
  // Pieces of at most split.max_blocks entries; item_begin / item_end are positions in the row
  // list or the column list. An empty line is one empty piece, so that its outputs (zero) are
  // still written.
  BlockSparseWorkSplit split;
  // [pieces] the partial slot of a piece of a split line (numbered 0.. in piece order, so the
  // pieces of one line have consecutive slots), -1 for the piece of an unsplit line, which
  // writes its outputs directly.
  std::vector<int64_t> item_slot;
  std::vector<int64_t> split_lines;  // the lines cut into pieces, ascending
  int64_t slots = 0;                 // pieces of split lines
};

struct SparseAttentionTiles {
  static constexpr int64_t kTile = 64;  // the kernels' tile side, in tokens

  int64_t block = 0;      // b, the layout block
  int64_t sub = 1;        // slots per entry (kTile / b), 1 when b >= kTile
  int64_t shift = 0;      // log2(min(b, kTile)): a unit's tokens; element (r, c) of a row entry
                          // is in its block row r >> shift and slot c >> shift
  int64_t full_mask = 1;  // (1 << sub * sub) - 1: every block of an entry present
  int64_t num_heads = 0;  // G: the index's stored heads (layout_heads); head h reads h % G
  int64_t len = 0;        // L = R * b tokens per side
  int64_t num_tiles = 0;  // ceil(L / kTile) tiles per side
  int64_t row_entries = 0, col_entries = 0;  // entries of the row and column lists, G heads

  // Row-wise lists: the entries of tile row T of stored head g are positions
  // row_offsets[g * num_tiles + T] .. row_offsets[g * num_tiles + T + 1] - 1, their slots in
  // ascending unit order; row_slots[e * sub + k] is the column unit of slot k of entry e (-1:
  // empty, only at the end of a row's last entry), row_masks[e] the entry's mask.
  std::vector<int64_t> row_offsets;  // [G * num_tiles + 1]
  std::vector<int64_t> row_slots;    // [row_entries * sub]
  std::vector<int64_t> row_masks;    // [row_entries]
  // Column-wise lists: the same for tile column T, its slots holding query units.
  std::vector<int64_t> col_offsets;  // [G * num_tiles + 1]
  std::vector<int64_t> col_slots;    // [col_entries * sub]
  std::vector<int64_t> col_masks;    // [col_entries]

  // Packed layouts (b < kTile) only, empty otherwise: which block rows each tile row holds and
  // which block columns each tile column holds. They are grouped (group_tile_lines): block lines
  // whose lists are equal and long share tile lines (so their entries keep every element: Fixed's
  // global columns at block 16 would otherwise each bring all block rows into a tile column with
  // three local columns, 25% of whose elements are kept), then the other long lines, and the rest
  // take consecutive tile lines in ascending order. Tile column l (stored head g's lines are
  // g * num_tiles ..) holds keys col_units[l * sub + k] * b + (0 .. b - 1) at its positions
  // k * b .., ascending, -1 in empty trailing slots; col_unit_place[g * R + c] = l * sub + k for
  // block column c of stored head g; rows alike. At b >= kTile tile line T holds tokens
  // T * kTile ...
  std::vector<int64_t> row_units, col_units;            // [G * num_tiles * sub]
  std::vector<int64_t> row_unit_place, col_unit_place;  // [G * R]

  SparseAttentionTileWork rows, cols;

  // The token at position a (0 .. kTile - 1) of stored line `line` (g * num_tiles + T) along its
  // own side (a tile row's query, a tile column's key): through the line's units when packed,
  // T * kTile + a otherwise. -1 for an empty slot.
  int64_t line_token(bool row_line, int64_t line, int64_t a) const {
    const std::vector<int64_t>& units = row_line ? row_units : col_units;
    if (units.empty()) return (line % num_tiles) * kTile + a;
    const int64_t unit = units[static_cast<size_t>(line * sub + (a >> shift))];
    return unit < 0 ? -1 : (unit << shift) + (a & ((int64_t{1} << shift) - 1));
  }
};

// The most entries one piece of a tile line holds, for an index whose lines are split at
// `max_blocks` layout blocks, when the lists of one direction hold tile_nnz entries in tile_lines
// lines. A size the caller chose (split_block_sparse_work) is kept in tokens:
// ceil(max_blocks * b / kTile). The index's default (default_split_blocks) becomes the same rule
// applied to the tile lines, twice their mean length and at least 16 tiles: below block 64 a tile
// line gathers the blocks of several block rows, and the default converted to tokens (4 tiles at
// block 16) would cut nearly every line, each cut costing a partial slot in the workspace and a
// combine pass (measured: a 0.6 GB forward workspace for BigBird at 65,536 tokens).
int64_t sparse_attention_tiles_per_piece(const BlockSparseIndex& index, int64_t max_blocks,
                                         int64_t tile_nnz, int64_t tile_lines);

// Builds the tile index of `index` (block 16, 32, 64 or 128), splitting its lines with the
// index's own row_split / col_split piece sizes converted to tiles
// (sparse_attention_tiles_per_piece). Fails (naming index) when the index is not built or its block
// is not one of those.
Status build_sparse_attention_tiles(const BlockSparseIndex& index, SparseAttentionTiles* out);

}  // namespace sciattn::detail

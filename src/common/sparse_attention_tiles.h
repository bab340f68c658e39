// The tile-level index of the fused block-sparse attention kernels on the GPU: which 64 x 64
// kernel tiles of each head hold layout blocks, with a bitmask of the layout sub-blocks present in
// each tile, the row-wise and column-wise lists the kernels walk, and their split into pieces.
// Host-only common layer (plain C++): built once per layout by upload_block_sparse_index.
//
// The kernels work on square tiles of kTile tokens whatever the layout block b is:
//   b < kTile   a tile spans sub = kTile / b layout blocks per side; its mask has bit
//               (r / b) * sub + (c / b) set when the sub-block holding tile element (r, c) is in
//               the layout, and the kernels remove the elements whose bit is clear;
//   b >= kTile  a layout block spans b / kTile tiles per side, each fully present (sub = 1,
//               mask = 1).
// The last tile of a side is partial when L = R * b is not a multiple of kTile (b < kTile only).
#pragma once

#include <cstdint>
#include <vector>

#include "sciattn/block_sparse_ops.h"

namespace sciattn::detail {

// The pieces of the tile lines (tile rows for the forward and dQ, tile columns for dK/dV) and
// the fp32 partial slot of each piece of a split line.
struct SparseAttentionTileWork {
  // Pieces of at most split.max_blocks tiles; item_begin / item_end are positions in the tile
  // row list (row_cols) or column list (col_rows). An empty line is one empty piece, so that its
  // outputs (zero) are still written.
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
  int64_t sub = 1;        // layout blocks per tile side (kTile / b), 1 when b >= kTile
  int64_t shift = 0;      // log2(min(b, kTile)): tile element (r, c) is in sub-block
                          // (r >> shift, c >> shift)
  int64_t full_mask = 1;  // (1 << sub * sub) - 1: every sub-block present
  int64_t num_heads = 0;  // H
  int64_t len = 0;        // L = R * b tokens per side
  int64_t num_tiles = 0;  // ceil(L / kTile) tiles per side
  int64_t nnz = 0;        // nonzero tiles over all heads

  // Row-wise list: the tiles of tile row T of head h are positions
  // row_offsets[h * num_tiles + T] .. row_offsets[h * num_tiles + T + 1] - 1, in ascending
  // column order; row_cols holds the tile column, row_masks the sub-block mask.
  std::vector<int64_t> row_offsets;  // [H * num_tiles + 1]
  std::vector<int64_t> row_cols;     // [nnz]
  std::vector<int64_t> row_masks;    // [nnz]
  // Column-wise list: the tiles of tile column T, in ascending row order (same masks).
  std::vector<int64_t> col_offsets;  // [H * num_tiles + 1]
  std::vector<int64_t> col_rows;     // [nnz]
  std::vector<int64_t> col_masks;    // [nnz]

  SparseAttentionTileWork rows, cols;
};

// The most tiles one piece of a tile line holds, for an index whose lines are split at
// `max_blocks` layout blocks, when the tile lists hold tile_nnz tiles in tile_lines lines (per
// direction). A size the caller chose (split_block_sparse_work) is kept in tokens:
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

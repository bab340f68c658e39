// The tile-level index of the fused GPU sparse attention (see sparse_attention_tiles.h).
// Host-only common layer.
#include "common/sparse_attention_tiles.h"

#include <algorithm>
#include <string>

namespace sciattn::detail {
namespace {

// Pieces of at most max_tiles tiles for the lines whose ranges are offsets[l] .. offsets[l+1]-1:
// equal pieces (sizes differ by at most one), as the index's own split makes them, so that the
// pieces of a line take about the same time.
SparseAttentionTileWork split_tile_lines(const std::vector<int64_t>& offsets, int64_t max_tiles) {
  SparseAttentionTileWork work;
  BlockSparseWorkSplit& w = work.split;
  w.max_blocks = max_tiles;
  const int64_t lines = static_cast<int64_t>(offsets.size()) - 1;
  w.line_items.assign(static_cast<size_t>(lines + 1), 0);
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t begin = offsets[static_cast<size_t>(l)];
    const int64_t n = offsets[static_cast<size_t>(l + 1)] - begin;
    const int64_t pieces = std::max<int64_t>(1, (n + max_tiles - 1) / max_tiles);
    for (int64_t k = 0; k < pieces; ++k) {
      w.item_line.push_back(l);
      w.item_begin.push_back(begin + n * k / pieces);
      w.item_end.push_back(begin + n * (k + 1) / pieces);
      work.item_slot.push_back(pieces > 1 ? work.slots++ : -1);
    }
    w.line_items[static_cast<size_t>(l + 1)] = w.line_items[static_cast<size_t>(l)] + pieces;
    if (pieces > 1) {
      ++w.split_lines;
      work.split_lines.push_back(l);
    }
    w.max_pieces_per_line = std::max(w.max_pieces_per_line, pieces);
  }
  return work;
}

// The row and column tile lists of `t` (whose geometry is set) for a layout block other than the
// tile: each tile row ORs the sub-block bits of the layout blocks it covers into a dense
// per-column mask, remembering the columns it touched, and emits them in column order; the
// column lists are the transpose, filled in ascending tile row order.
void build_tile_lists(const BlockSparseIndex& ix, int64_t span, SparseAttentionTiles* out) {
  constexpr int64_t kTile = SparseAttentionTiles::kTile;
  SparseAttentionTiles& t = *out;
  const int64_t H = ix.num_heads, R = ix.num_row_blocks, nt = t.num_tiles;
  // At most one tile per layout block below the tile size, span^2 above it, and at most every
  // tile.
  const auto most = static_cast<size_t>(std::min(ix.nnz * span * span, H * nt * nt));
  t.row_cols.reserve(most);
  t.row_masks.reserve(most);
  t.row_offsets.assign(static_cast<size_t>(H * nt + 1), 0);
  std::vector<int64_t> mask(static_cast<size_t>(nt), 0);
  std::vector<int64_t> touched;
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t tr = 0; tr < nt; ++tr) {
      touched.clear();
      // The block rows covering tile row tr and the sub-block row of each inside the tile.
      const int64_t first = ix.block < kTile ? tr * t.sub : tr / span;
      const int64_t last = ix.block < kTile ? std::min(R, (tr + 1) * t.sub) : first + 1;
      for (int64_t I = first; I < last; ++I) {
        const int64_t sub_row = ix.block < kTile ? I - tr * t.sub : 0;
        for (int64_t p = ix.row_begin(h, I); p < ix.row_end(h, I); ++p) {
          const int64_t J = ix.col[static_cast<size_t>(p)];
          const int64_t tc0 = ix.block < kTile ? J / t.sub : J * span;
          const int64_t tc1 = ix.block < kTile ? tc0 + 1 : tc0 + span;
          const int64_t sub_col = ix.block < kTile ? J - tc0 * t.sub : 0;
          for (int64_t tc = tc0; tc < tc1; ++tc) {
            int64_t& m = mask[static_cast<size_t>(tc)];
            if (m == 0) touched.push_back(tc);
            m |= int64_t{1} << (sub_row * t.sub + sub_col);
          }
        }
      }
      std::sort(touched.begin(), touched.end());
      for (int64_t tc : touched) {
        t.row_cols.push_back(tc);
        t.row_masks.push_back(mask[static_cast<size_t>(tc)]);
        mask[static_cast<size_t>(tc)] = 0;
      }
      t.row_offsets[static_cast<size_t>(h * nt + tr + 1)] = static_cast<int64_t>(t.row_cols.size());
    }
  }
  t.nnz = static_cast<int64_t>(t.row_cols.size());

  t.col_offsets.assign(static_cast<size_t>(H * nt + 1), 0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t e = t.row_offsets[static_cast<size_t>(h * nt)];
         e < t.row_offsets[static_cast<size_t>((h + 1) * nt)]; ++e) {
      ++t.col_offsets[static_cast<size_t>(h * nt + t.row_cols[static_cast<size_t>(e)] + 1)];
    }
  }
  for (size_t l = 1; l < t.col_offsets.size(); ++l) t.col_offsets[l] += t.col_offsets[l - 1];
  t.col_rows.assign(static_cast<size_t>(t.nnz), 0);
  t.col_masks.assign(static_cast<size_t>(t.nnz), 0);
  std::vector<int64_t> fill(t.col_offsets.begin(), t.col_offsets.end() - 1);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t tr = 0; tr < nt; ++tr) {
      for (int64_t e = t.row_offsets[static_cast<size_t>(h * nt + tr)];
           e < t.row_offsets[static_cast<size_t>(h * nt + tr + 1)]; ++e) {
        const size_t at = static_cast<size_t>(
            fill[static_cast<size_t>(h * nt + t.row_cols[static_cast<size_t>(e)])]++);
        t.col_rows[at] = tr;
        t.col_masks[at] = t.row_masks[static_cast<size_t>(e)];
      }
    }
  }
}

}  // namespace

int64_t sparse_attention_tiles_per_piece(const BlockSparseIndex& index, int64_t max_blocks,
                                         int64_t tile_nnz, int64_t tile_lines) {
  if (max_blocks == default_split_blocks(index)) {
    const int64_t mean = tile_lines > 0 ? (tile_nnz + tile_lines - 1) / tile_lines : 0;
    return std::max<int64_t>(16, 2 * mean);
  }
  const int64_t tokens = std::max<int64_t>(1, max_blocks) * index.block;
  return std::max<int64_t>(
      1, (tokens + SparseAttentionTiles::kTile - 1) / SparseAttentionTiles::kTile);
}

Status build_sparse_attention_tiles(const BlockSparseIndex& ix, SparseAttentionTiles* out) {
  if (out == nullptr) return Status::invalid_argument("out is a null pointer");
  constexpr int64_t kTile = SparseAttentionTiles::kTile;
  if (ix.block != 16 && ix.block != 32 && ix.block != 64 && ix.block != 128) {
    return Status::invalid_argument("index has block " + std::to_string(ix.block) +
                                    "; the fused kernels take blocks of 16, 32, 64 or 128");
  }
  const int64_t H = ix.num_heads, R = ix.num_row_blocks, C = ix.num_col_blocks;
  if (H < 1 || R < 1 || C < 1 || static_cast<int64_t>(ix.row_offsets.size()) != H * R + 1 ||
      static_cast<int64_t>(ix.col.size()) != ix.nnz) {
    return Status::invalid_argument(
        "index has not been built; build it with build_block_sparse_index first");
  }
  if (R != C) {
    return Status::invalid_argument(
        "index must be square (num_row_blocks == num_col_blocks) for "
        "sparse self-attention; got " +
        std::to_string(R) + " x " + std::to_string(C) + " blocks");
  }
  SparseAttentionTiles t;
  t.block = ix.block;
  t.sub = ix.block < kTile ? kTile / ix.block : 1;
  t.shift = ix.block == 16 ? 4 : ix.block == 32 ? 5 : 6;
  t.full_mask = (int64_t{1} << (t.sub * t.sub)) - 1;
  t.num_heads = H;
  t.len = R * ix.block;
  t.num_tiles = (t.len + kTile - 1) / kTile;
  const int64_t nt = t.num_tiles;
  // Tiles per layout block side (b >= kTile), 1 otherwise.
  const int64_t span = ix.block > kTile ? ix.block / kTile : 1;

  if (ix.block == kTile) {
    // Tiles are the layout blocks: the index's own row and column lists, every mask full.
    t.row_offsets = ix.row_offsets;
    t.row_cols = ix.col;
    t.row_masks.assign(ix.col.size(), t.full_mask);
    t.col_offsets = ix.col_offsets;
    t.col_rows = ix.col_rows;
    t.col_masks = t.row_masks;
    t.nnz = ix.nnz;
  } else {
    build_tile_lists(ix, span, &t);
  }

  const int64_t lines = H * nt;  // tile rows, and tile columns, over all heads
  t.rows = split_tile_lines(
      t.row_offsets, sparse_attention_tiles_per_piece(ix, ix.row_split.max_blocks, t.nnz, lines));
  t.cols = split_tile_lines(
      t.col_offsets, sparse_attention_tiles_per_piece(ix, ix.col_split.max_blocks, t.nnz, lines));
  *out = std::move(t);
  return Status::ok_status();
}

}  // namespace sciattn::detail

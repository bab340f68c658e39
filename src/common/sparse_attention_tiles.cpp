// The tile-level index of the fused GPU sparse attention (see sparse_attention_tiles.h).
// Host-only common layer.
#include "common/sparse_attention_tiles.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "common/block_sparse_index.h"

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
  // One piece per line is the common case; split lines append more.
  w.item_line.reserve(static_cast<size_t>(lines));
  w.item_begin.reserve(static_cast<size_t>(lines));
  w.item_end.reserve(static_cast<size_t>(lines));
  work.item_slot.reserve(static_cast<size_t>(lines));
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t begin = offsets[static_cast<size_t>(l)];
    const int64_t n = offsets[static_cast<size_t>(l + 1)] - begin;
    if (n <= max_tiles) {  // one piece (most lines): no divisions
      w.item_line.push_back(l);
      w.item_begin.push_back(begin);
      w.item_end.push_back(begin + n);
      work.item_slot.push_back(-1);
      w.line_items[static_cast<size_t>(l + 1)] = w.line_items[static_cast<size_t>(l)] + 1;
      w.max_pieces_per_line = std::max<int64_t>(w.max_pieces_per_line, 1);
      continue;
    }
    const int64_t pieces = (n + max_tiles - 1) / max_tiles;
    for (int64_t k = 0; k < pieces; ++k) {
      w.item_line.push_back(l);
      w.item_begin.push_back(begin + n * k / pieces);
      w.item_end.push_back(begin + n * (k + 1) / pieces);
      work.item_slot.push_back(work.slots++);
    }
    w.line_items[static_cast<size_t>(l + 1)] = w.line_items[static_cast<size_t>(l)] + pieces;
    ++w.split_lines;
    work.split_lines.push_back(l);
    w.max_pieces_per_line = std::max(w.max_pieces_per_line, pieces);
  }
  return work;
}

// Appends the entries of one line (a tile row or column) to `slots` / `masks`: `units` (the
// units the line's blocks touch, ascending) taken `sub` at a time, the last entry padded with -1;
// unit_bits[u] holds, for unit u, the bits of the line's own blocks that touch it, and
// slot_bits(k, bits) places them in the mask for slot k. Clears unit_bits of the units used.
template <typename SlotBits>
void append_line_entries(const std::vector<int64_t>& units, std::vector<int64_t>* unit_bits,
                         int64_t sub, const SlotBits& slot_bits, std::vector<int64_t>* slots,
                         std::vector<int64_t>* masks) {
  for (size_t first = 0; first < units.size(); first += static_cast<size_t>(sub)) {
    int64_t mask = 0;
    for (int64_t k = 0; k < sub; ++k) {
      const size_t at = first + static_cast<size_t>(k);
      if (at >= units.size()) {
        slots->push_back(-1);
        continue;
      }
      const int64_t u = units[at];
      slots->push_back(u);
      int64_t& bits = (*unit_bits)[static_cast<size_t>(u)];
      mask |= slot_bits(k, bits);
      bits = 0;
    }
    masks->push_back(mask);
  }
}

// The most block rows (or columns) one packed line gathers: sub = kTile / b <= 4 for blocks of 16
// and 32.
constexpr int kMaxMergedLists = 4;

// The entries of one packed line (blocks below the tile size): the line's n <= 4 block rows (or
// columns) list their blocks ascending in list[begin[i] .. end[i]); a merge of the n lists gives
// the units (layout blocks) in ascending order, each with the bits of the lines' own blocks that
// use it, taken `sub` at a time into entries as append_line_entries does (the last padded with
// -1). One pass, no per-unit table and no sort. Each step treats all four lists alike (an
// exhausted list, and the lists past n, show kDone, above every unit) rather than asking of each
// list whether it is exhausted and whether it holds the unit: those answers follow the data (a
// layout's random blocks make them unpredictable). BigBird, 65,536 tokens, block 16: 74 K -> 29 K
// mispredicted branches per build in cachegrind's model, and the tile index built 1.2-2x faster
// than with those questions asked.
template <typename SlotBits>
void append_merged_line_entries(const int64_t* list, const int64_t* begin, const int64_t* end,
                                int64_t n, int64_t sub, const SlotBits& slot_bits,
                                std::vector<int64_t>* slots, std::vector<int64_t>* masks) {
  constexpr int64_t kDone = INT64_MAX;
  int64_t at[kMaxMergedLists], stop[kMaxMergedLists], next[kMaxMergedLists];
  for (int i = 0; i < kMaxMergedLists; ++i) {
    at[i] = i < n ? begin[i] : 0;
    stop[i] = i < n ? end[i] : 0;
    next[i] = at[i] < stop[i] ? list[at[i]] : kDone;
  }
  int64_t k = 0, mask = 0;
  for (;;) {
    const int64_t unit = std::min(std::min(next[0], next[1]), std::min(next[2], next[3]));
    if (unit == kDone) break;
    int64_t bits = 0;
    for (int i = 0; i < kMaxMergedLists; ++i) {
      const bool used = next[i] == unit;
      bits |= int64_t{used} << i;
      at[i] += used;
      // Read at a valid position whatever `at` is (list[0] exists: a unit was found), then keep
      // the value only where the list goes on.
      const int64_t value = list[at[i] < stop[i] ? at[i] : 0];
      next[i] = at[i] < stop[i] ? value : kDone;
    }
    slots->push_back(unit);
    mask |= slot_bits(k, bits);
    if (++k == sub) {
      masks->push_back(mask);
      k = mask = 0;
    }
  }
  if (k > 0) {
    for (; k < sub; ++k) slots->push_back(-1);
    masks->push_back(mask);
  }
}

// Block columns whose list holds at least this many block rows are grouped by equal lists; the
// others are too short for the grouping to matter (their entries are few whichever tile they
// share) and are not hashed, which keeps the build's cost for the usual layouts (BigBird at
// 65,536 tokens and block 16: one long column, the global one).
constexpr int64_t kLongColumn = 16;

// The C block lines (columns, or rows) of one stored head, whose lists are list[offsets[c] ..
// offsets[c + 1]), grouped into its nt tile lines of `sub` units, written to units[T * sub + k]
// (ascending within a tile line, -1 in empty trailing slots). Said for columns; rows are grouped
// alike. Long columns with equal lists (equal hashes of their block rows: a collision only costs
// speed, never correctness, since every entry's mask is built from the columns it holds) fill
// whole tile columns, `sub` at a time in ascending order; long columns that fill a consecutive
// tile column keep it; then the long columns left, `sub` at a time in ascending order; the others,
// and the last few long ones, take consecutive tile columns in ascending order, as they would
// without grouping. The tile columns are ordered by their first block column. With fewer than
// `sub` long columns (BigBird, BSLongformer, Variable: one global column each) this is the
// consecutive grouping itself.
void group_tile_lines(const int64_t* offsets, const int64_t* list, int64_t C, int64_t sub,
                      int64_t nt, int64_t* units) {
  auto consecutive = [&] {
    for (int64_t u = 0; u < nt * sub; ++u) units[u] = u < C ? u : -1;
  };
  std::vector<std::pair<uint64_t, int64_t>> keyed;  // (hash of the list, column)
  for (int64_t c = 0; c < C; ++c) {
    const int64_t begin = offsets[c], end = offsets[c + 1];
    if (end - begin < kLongColumn) continue;
    uint64_t hash = 1469598103934665603ull ^ static_cast<uint64_t>(end - begin);  // FNV-1a
    for (int64_t q = begin; q < end; ++q) {
      hash = (hash ^ static_cast<uint64_t>(list[q])) * 1099511628211ull;
    }
    keyed.emplace_back(hash, c);
  }
  if (static_cast<int64_t>(keyed.size()) < sub) return consecutive();
  std::sort(keyed.begin(), keyed.end());
  std::vector<char> grouped(static_cast<size_t>(C), 0);
  std::vector<std::array<int64_t, 4>> tiles;  // each tile column's units (first sub used)
  for (size_t first = 0; first < keyed.size();) {
    size_t last = first;
    while (last < keyed.size() && keyed[last].first == keyed[first].first) ++last;
    for (size_t at = first; at + static_cast<size_t>(sub) <= last; at += static_cast<size_t>(sub)) {
      std::array<int64_t, 4> tile{-1, -1, -1, -1};
      for (int64_t k = 0; k < sub; ++k) {
        tile[static_cast<size_t>(k)] = keyed[at + static_cast<size_t>(k)].second;
        grouped[static_cast<size_t>(tile[static_cast<size_t>(k)])] = 1;
      }
      tiles.push_back(tile);
    }
    first = last;
  }
  // Long columns that already fill a consecutive tile column (T * sub ..) keep it: neighbours
  // tend to share rows (a window), and so the rows of a unidirectional Fixed layout, every one long
  // past the first few windows, keep their consecutive tiles.
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& x, const auto& y) { return x.second < y.second; });
  std::vector<char> is_long(static_cast<size_t>(C), 0);
  for (const auto& entry : keyed) is_long[static_cast<size_t>(entry.second)] = 1;
  for (int64_t first = 0; first + sub <= C; first += sub) {
    bool whole = true;
    for (int64_t c = first; c < first + sub; ++c) {
      whole = whole && is_long[static_cast<size_t>(c)] && !grouped[static_cast<size_t>(c)];
    }
    if (!whole) continue;
    std::array<int64_t, 4> tile{-1, -1, -1, -1};
    for (int64_t c = first; c < first + sub; ++c) {
      tile[static_cast<size_t>(c - first)] = c;
      grouped[static_cast<size_t>(c)] = 1;
    }
    tiles.push_back(tile);
  }
  // Then the long columns left, in ascending order, `sub` at a time (whole tile columns only):
  // lists that differ but are all long, such as a unidirectional Fixed layout's global columns
  // (column c held by every row from c on), still share most of their rows, where each would
  // otherwise join short columns whose rows they do not share.
  std::array<int64_t, 4> tile{-1, -1, -1, -1};
  int64_t k = 0, long_left = 0;
  for (const auto& entry : keyed) long_left += grouped[static_cast<size_t>(entry.second)] ? 0 : 1;
  for (const auto& entry : keyed) {
    const int64_t c = entry.second;
    if (grouped[static_cast<size_t>(c)] || long_left < sub) continue;
    tile[static_cast<size_t>(k)] = c;
    if (++k == sub) {
      for (int64_t x = 0; x < sub; ++x)
        grouped[static_cast<size_t>(tile[static_cast<size_t>(x)])] = 1;
      tiles.push_back(tile);
      tile = {-1, -1, -1, -1};
      k = 0;
      long_left -= sub;
    }
  }
  if (tiles.empty()) return consecutive();
  // The rest, consecutively in ascending order.
  tile = {-1, -1, -1, -1};
  k = 0;
  for (int64_t c = 0; c < C; ++c) {
    if (grouped[static_cast<size_t>(c)]) continue;
    tile[static_cast<size_t>(k)] = c;
    if (++k == sub) {
      tiles.push_back(tile);
      tile = {-1, -1, -1, -1};
      k = 0;
    }
  }
  if (k > 0) tiles.push_back(tile);
  std::sort(tiles.begin(), tiles.end(), [](const auto& x, const auto& y) { return x[0] < y[0]; });
  // As many tile columns as the consecutive grouping: the full groups take sub columns each.
  for (int64_t T = 0; T < nt; ++T) {
    for (int64_t k2 = 0; k2 < sub; ++k2) {
      units[T * sub + k2] = T < static_cast<int64_t>(tiles.size())
                                ? tiles[static_cast<size_t>(T)][static_cast<size_t>(k2)]
                                : -1;
    }
  }
}

// The row and column lists of `t` (whose geometry is set) for a layout block other than the
// tile. Below the tile size the units are layout blocks and each line packs the units its blocks
// use (append_merged_line_entries); above it the units are tiles, each block spanning span x span
// of them, one entry per tile (append_line_entries).
void build_tile_lists(const BlockSparseIndex& ix, int64_t span, SparseAttentionTiles* out) {
  constexpr int64_t kTile = SparseAttentionTiles::kTile;
  SparseAttentionTiles& t = *out;
  // The lists of the index's stored heads: a layout shared by the heads is packed once.
  const int64_t G = ix.layout_heads, R = ix.num_row_blocks, nt = t.num_tiles, sub = t.sub;
  const bool packed = ix.block < kTile;
  const int64_t units = packed ? R : nt;  // per side
  // One direction's lists: for each line (tile row, or tile column) of each stored head, the units
  // its blocks use, each with the bits of the line's own blocks that use it (below the tile size; 0
  // above it), packed into entries. slot_bits(k, bits) places a unit's own bits in the mask.
  auto build = [&](bool rows, auto slot_bits, std::vector<int64_t>* offsets,
                   std::vector<int64_t>* slots, std::vector<int64_t>* masks) {
    std::vector<int64_t> unit_bits(packed ? 0 : static_cast<size_t>(units), 0);
    std::vector<int64_t> touched;
    offsets->assign(static_cast<size_t>(G * nt + 1), 0);
    // The most entries: above the tile size one per tile of each block (span^2); below it a
    // line of B blocks packs at most B units into ceil(B / sub) entries. Reserved once, and no
    // more than that: a reservation several times the need (sub times the blocks) left the heap
    // more to return and fault in again on every build.
    const int64_t lines = G * nt;
    const auto most = static_cast<size_t>(packed ? (ix.stored_nnz() + lines * (sub - 1)) / sub
                                                 : ix.stored_nnz() * span * span);
    masks->reserve(most);
    slots->reserve(most * static_cast<size_t>(sub));
    const std::vector<int64_t>& list = rows ? ix.col : ix.col_rows;
    // [G * R + 1]: the stored heads' line offsets, read directly (the index's accessors map a
    // head to its stored head with a division, here always the identity).
    const int64_t* line_offsets = rows ? ix.row_offsets.data() : ix.col_offsets.data();
    for (int64_t h = 0; h < G; ++h) {
      std::vector<int64_t>& line_units = rows ? t.row_units : t.col_units;
      std::vector<int64_t>& unit_place = rows ? t.row_unit_place : t.col_unit_place;
      if (packed) {
        group_tile_lines(line_offsets + h * R, list.data(), R, sub, nt,
                         line_units.data() + h * nt * sub);
      }
      for (int64_t line = 0; line < nt; ++line) {
        if (packed) {  // the block rows (or columns) of the line's group, merged
          const int64_t* units_of_line = line_units.data() + (h * nt + line) * sub;
          int64_t begin[kMaxMergedLists], end[kMaxMergedLists], n = 0;
          for (; n < sub && units_of_line[n] >= 0; ++n) {
            begin[n] = line_offsets[h * R + units_of_line[n]];
            end[n] = line_offsets[h * R + units_of_line[n] + 1];
            unit_place[static_cast<size_t>(h * R + units_of_line[n])] = (h * nt + line) * sub + n;
          }
          bool any = false;
          for (int64_t i = 0; i < n; ++i) any = any || begin[i] < end[i];
          if (any)
            append_merged_line_entries(list.data(), begin, end, n, sub, slot_bits, slots, masks);
          (*offsets)[static_cast<size_t>(h * nt + line + 1)] = static_cast<int64_t>(masks->size());
          continue;
        }
        // Above the tile size: the one block row (or column) covering the line, whose blocks
        // come out ascending, each spanning `span` tiles.
        touched.clear();
        const int64_t x = line / span;
        const int64_t begin = rows ? ix.row_begin(h, x) : ix.col_begin(h, x);
        const int64_t end = rows ? ix.row_end(h, x) : ix.col_end(h, x);
        for (int64_t q = begin; q < end; ++q) {
          const int64_t y = list[static_cast<size_t>(q)];
          for (int64_t u = y * span; u < (y + 1) * span; ++u) {
            unit_bits[static_cast<size_t>(u)] = 1;
            touched.push_back(u);
          }
        }
        append_line_entries(touched, &unit_bits, sub, slot_bits, slots, masks);
        (*offsets)[static_cast<size_t>(h * nt + line + 1)] = static_cast<int64_t>(masks->size());
      }
    }
  };
  // Mask bits are (query block, key block), bit x * sub + k: a row entry's slot k is its key
  // block and its own bit x the query block, so a unit's bits spread to every sub-th bit from k
  // (spread[] precomputed for the at most 2^sub values); a column entry's slot is its query block
  // and its own bits the key blocks, already contiguous: bits << k * sub.
  std::vector<int64_t> spread(static_cast<size_t>(int64_t{1} << sub), 0);
  for (int64_t bits = 0; bits < (int64_t{1} << sub); ++bits)
    for (int64_t x = 0; x < sub; ++x)
      if ((bits >> x) & 1) spread[static_cast<size_t>(bits)] |= int64_t{1} << (x * sub);
  if (packed) {
    for (std::vector<int64_t>* line_units : {&t.row_units, &t.col_units}) {
      line_units->assign(static_cast<size_t>(G * nt * sub), -1);
    }
    for (std::vector<int64_t>* place : {&t.row_unit_place, &t.col_unit_place}) {
      place->assign(static_cast<size_t>(G * R), -1);
    }
  }
  build(
      true, [&](int64_t k, int64_t bits) { return spread[static_cast<size_t>(bits)] << k; },
      &t.row_offsets, &t.row_slots, &t.row_masks);
  build(
      false, [&](int64_t k, int64_t bits) { return bits << (k * sub); }, &t.col_offsets,
      &t.col_slots, &t.col_masks);
  t.row_entries = static_cast<int64_t>(t.row_masks.size());
  t.col_entries = static_cast<int64_t>(t.col_masks.size());
}

}  // namespace

int64_t sparse_attention_tiles_per_piece(const BlockSparseIndex& index, int64_t max_blocks,
                                         int64_t tile_nnz, int64_t tile_lines) {
  if (max_blocks == detail::default_split_blocks(index)) {
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
  const int64_t G = ix.layout_heads, R = ix.num_row_blocks, C = ix.num_col_blocks;
  if (G < 1 || R < 1 || C < 1 || static_cast<int64_t>(ix.row_offsets.size()) != G * R + 1 ||
      static_cast<int64_t>(ix.col.size()) != ix.stored_nnz()) {
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
  t.num_heads = G;
  t.len = R * ix.block;
  t.num_tiles = (t.len + kTile - 1) / kTile;
  const int64_t nt = t.num_tiles;
  // Tiles per layout block side (b >= kTile), 1 otherwise.
  const int64_t span = ix.block > kTile ? ix.block / kTile : 1;

  if (ix.block == kTile) {
    // Entries are the layout blocks: the index's own row and column lists, every mask full.
    t.row_offsets = ix.row_offsets;
    t.row_slots = ix.col;
    t.row_masks.assign(ix.col.size(), t.full_mask);
    t.col_offsets = ix.col_offsets;
    t.col_slots = ix.col_rows;
    t.col_masks = t.row_masks;
    t.row_entries = t.col_entries = ix.stored_nnz();
  } else {
    build_tile_lists(ix, span, &t);
  }

  const int64_t lines = G * nt;  // tile rows, and tile columns, over the stored heads
  t.rows = split_tile_lines(t.row_offsets, sparse_attention_tiles_per_piece(
                                               ix, ix.row_split.max_blocks, t.row_entries, lines));
  t.cols = split_tile_lines(t.col_offsets, sparse_attention_tiles_per_piece(
                                               ix, ix.col_split.max_blocks, t.col_entries, lines));
  *out = std::move(t);
  return Status::ok_status();
}

}  // namespace sciattn::detail

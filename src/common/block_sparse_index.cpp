// Builds the BlockSparseIndex of a layout, or of a config's per-row column lists without the dense
// layout: the nonzero enumeration in DeepSpeed's order and the row-wise (CSR) and column-wise
// (CSC) indexes the kernels walk (see block_sparse_index.h). Host-only common layer.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "common/block_sparse_index.h"

#include "common/sparsity_layouts.h"

namespace sciattn {
namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

// Keeps one head's lists when every head of `ix` (enumeration and row_offsets built for all
// num_heads heads, layout_heads == num_heads) has head 0's blocks: equal row lengths and equal
// columns (the column lists then agree too, being the same blocks). A shared layout is the
// configs' default; BigBird at 65,536 tokens and block 16 has 16 such heads.
void keep_one_head_if_shared(BlockSparseIndex* index) {
  BlockSparseIndex& ix = *index;
  const int64_t H = ix.num_heads, R = ix.num_row_blocks;
  if (H < 2 || ix.layout_heads != H) return;  // one head, or stored once already
  const int64_t head_nnz = ix.row_offsets[static_cast<size_t>(R)];
  if (head_nnz * H != ix.row_offsets.back()) return;
  for (int64_t h = 1; h < H; ++h) {
    const int64_t* offsets = ix.row_offsets.data() + h * R;
    if (offsets[0] != h * head_nnz) return;
    for (int64_t r = 1; r <= R; ++r) {
      if (offsets[r] - offsets[0] != ix.row_offsets[static_cast<size_t>(r)]) return;
    }
    if (!std::equal(ix.col.begin(), ix.col.begin() + head_nnz, ix.col.begin() + h * head_nnz)) {
      return;
    }
  }
  ix.layout_heads = 1;
  ix.row_offsets.resize(static_cast<size_t>(R + 1));
  for (std::vector<int64_t>* v : {&ix.head, &ix.row, &ix.col}) {
    v->resize(static_cast<size_t>(head_nnz));
    v->shrink_to_fit();
  }
  ix.row_offsets.shrink_to_fit();
}

// The column-wise index (CSC), the longest column, nnz and the default work splits of an index
// whose stored enumeration, row_offsets, layout_heads and max_row_nnz are built. Shared by both
// builds, so they agree.
void finish_index(BlockSparseIndex* index) {
  BlockSparseIndex& ix = *index;
  const int64_t G = ix.layout_heads, R = ix.num_row_blocks, C = ix.num_col_blocks;
  const int64_t stored = ix.stored_nnz();
  ix.nnz = stored * (ix.num_heads / G);
  ix.col_offsets.assign(static_cast<size_t>(G * C + 1), 0);
  ix.col_rows.resize(static_cast<size_t>(stored));
  ix.col_blocks.resize(static_cast<size_t>(stored));
  // The CSC: a counting sort of the enumeration by (g, J), one stored head at a time. The blocks
  // of stored head g are s = row_offsets[g * R] .. row_offsets[(g + 1) * R] - 1, so its columns
  // start at that same position and its C counters stay in L1. (Serial: on a shared 2-core
  // machine OpenMP's barriers cost ten times the work, 21 ms against 1.6 ms for BigBird at 65,536
  // tokens and 16 heads.) Walking s in increasing order keeps each column's blocks in increasing
  // row order.
  int64_t max_col = 0;
  std::vector<int64_t> next(static_cast<size_t>(C));
  const int64_t* col = ix.col.data();
  int64_t* col_rows = ix.col_rows.data();
  int64_t* col_blocks = ix.col_blocks.data();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t* row_offsets = ix.row_offsets.data() + g * R;  // [R + 1] of stored head g
    const int64_t begin = row_offsets[0], end = row_offsets[R];
    int64_t* offsets = ix.col_offsets.data() + g * C;  // offsets[J + 1] of stored head g
    for (int64_t s = begin; s < end; ++s) ++offsets[col[s] + 1];
    int64_t at = begin;
    for (int64_t j = 0; j < C; ++j) {
      const int64_t count = offsets[j + 1];
      max_col = std::max(max_col, count);
      next[static_cast<size_t>(j)] = at;
      at += count;
    }
    // Row by row, so that each block's row is the loop's (no read of ix.row).
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t s = row_offsets[r]; s < row_offsets[r + 1]; ++s) {
        const int64_t slot = next[static_cast<size_t>(col[s])]++;
        col_rows[slot] = r;
        col_blocks[slot] = s;
      }
    }
  }
  ix.max_col_nnz = max_col;
  // The counts become offsets: stored head g's last offset is the next one's first.
  for (int64_t k = 0; k < G * C; ++k) {
    ix.col_offsets[static_cast<size_t>(k + 1)] += ix.col_offsets[static_cast<size_t>(k)];
  }
  // default_split_blocks is >= 16, a valid piece size.
  detail::split_work(detail::default_split_blocks(ix), &ix);
}

}  // namespace

namespace detail {

Status index_from_layout(const Layout& layout, int64_t block, BlockSparseIndex* out) {
  const int64_t entries = layout.size();
  BlockSparseIndex ix;
  ix.block = block;
  ix.num_heads = layout.num_heads;
  ix.num_row_blocks = layout.num_row_blocks;
  ix.num_col_blocks = layout.num_col_blocks;
  const int64_t H = ix.num_heads, R = ix.num_row_blocks, C = ix.num_col_blocks;

  // The enumeration and the CSR, in (h, I, J) order, layout.nonzero()'s order (spec 2.1). The
  // scan of the dense layout is the whole cost (16.7 M entries at 65,536 tokens and block 64, well
  // under 1% of them set), so it runs in parallel over lines, eight entries at a time skipping
  // all-zero words: a first pass counts each line's blocks (and finds a bad entry), a prefix sum
  // places the lines, a second pass fills them. The result does not depend on the thread count.
  const int64_t lines = H * R;
  const uint8_t* entries_data = layout.blocks.data();
  // Calls fn(c) for each nonzero entry of line l, in column order; returns the first column
  // holding a value other than 0 or 1, or -1.
  auto for_each_set = [&](int64_t l, auto&& fn) -> int64_t {
    const uint8_t* row = entries_data + l * C;
    int64_t c = 0;
    auto visit = [&](int64_t x) {
      if (row[x] > 1) return false;
      if (row[x] == 1) fn(x);
      return true;
    };
    for (; c + 8 <= C; c += 8) {
      uint64_t word;
      std::memcpy(&word, row + c, sizeof(word));
      if (word == 0) continue;
      for (int64_t x = c; x < c + 8; ++x) {
        if (!visit(x)) return x;
      }
    }
    for (; c < C; ++c) {
      if (!visit(c)) return c;
    }
    return -1;
  };
  // Threads only pay off for large layouts (a small one is scanned in microseconds).
  const bool parallel = entries >= (int64_t{1} << 20);
  ix.row_offsets.assign(static_cast<size_t>(lines + 1), 0);
  std::vector<int64_t> bad(static_cast<size_t>(lines), -1);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t l = 0; l < lines; ++l) {
    int64_t count = 0;
    bad[static_cast<size_t>(l)] = for_each_set(l, [&](int64_t) { ++count; });
    ix.row_offsets[static_cast<size_t>(l + 1)] = count;
  }
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t c = bad[static_cast<size_t>(l)];
    if (c >= 0) {
      return Status::invalid_argument("layout.blocks entry (head " + str(l / R) + ", row " +
                                      str(l % R) + ", col " + str(c) + ") is " +
                                      str(entries_data[l * C + c]) + "; entries must be 0 or 1");
    }
    ix.max_row_nnz = std::max(ix.max_row_nnz, ix.row_offsets[static_cast<size_t>(l + 1)]);
    ix.row_offsets[static_cast<size_t>(l + 1)] += ix.row_offsets[static_cast<size_t>(l)];
  }
  const auto nnz = static_cast<size_t>(ix.row_offsets.back());
  ix.head.assign(nnz, 0);
  ix.row.assign(nnz, 0);
  ix.col.assign(nnz, 0);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t l = 0; l < lines; ++l) {
    auto p = static_cast<size_t>(ix.row_offsets[static_cast<size_t>(l)]);
    for_each_set(l, [&](int64_t c) {
      ix.head[p] = l / R;
      ix.row[p] = l % R;
      ix.col[p] = c;
      ++p;
    });
  }
  ix.layout_heads = H;
  keep_one_head_if_shared(&ix);
  finish_index(&ix);
  *out = std::move(ix);
  return Status::ok_status();
}

}  // namespace detail

namespace {

// The split of `lines` lines whose ranges are offsets[l] .. offsets[l + 1] - 1, in one pass: the
// piece arrays are sized once for the most pieces there can be (a line of n blocks makes
// ceil(n / max_blocks) <= 1 + n / max_blocks), written through pointers and cut to the pieces
// made at the end.
BlockSparseWorkSplit split_lines(const std::vector<int64_t>& offsets, int64_t max_blocks) {
  BlockSparseWorkSplit w;
  w.max_blocks = max_blocks;
  if (offsets.empty()) return w;  // an index not built: no lines
  const int64_t lines = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t* off = offsets.data();
  const auto most = static_cast<size_t>(lines + (off[lines] - off[0]) / max_blocks);
  w.line_items.resize(static_cast<size_t>(lines + 1));
  w.item_line.resize(most);
  w.item_begin.resize(most);
  w.item_end.resize(most);
  int64_t* line_items = w.line_items.data();
  int64_t* item_line = w.item_line.data();
  int64_t* item_begin = w.item_begin.data();
  int64_t* item_end = w.item_end.data();
  int64_t item = 0;
  line_items[0] = 0;
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t begin = off[l], n = off[l + 1] - begin;
    if (n <= max_blocks) {  // one piece (most lines): no divisions
      item_line[item] = l;
      item_begin[item] = begin;
      item_end[item] = begin + n;
      ++item;
    } else {
      // Equal pieces (sizes differ by at most one) rather than max_blocks-sized ones and a short
      // remainder, so that the pieces of a line take about the same time.
      const int64_t pieces = (n + max_blocks - 1) / max_blocks;
      for (int64_t k = 0; k < pieces; ++k, ++item) {
        item_line[item] = l;
        item_begin[item] = begin + n * k / pieces;
        item_end[item] = begin + n * (k + 1) / pieces;
      }
      ++w.split_lines;
      w.max_pieces_per_line = std::max(w.max_pieces_per_line, pieces);
    }
    line_items[l + 1] = item;
  }
  if (lines > 0) w.max_pieces_per_line = std::max<int64_t>(w.max_pieces_per_line, 1);
  for (std::vector<int64_t>* v : {&w.item_line, &w.item_begin, &w.item_end}) {
    v->resize(static_cast<size_t>(item));
  }
  return w;
}

}  // namespace

namespace detail {

int64_t default_split_blocks(const BlockSparseIndex& index) {
  // The mean line of the stored heads (every head's, as they repeat).
  const int64_t rows = index.layout_heads * index.num_row_blocks;
  const int64_t cols = index.layout_heads * index.num_col_blocks;
  const int64_t n = index.stored_nnz();
  const int64_t mean =
      std::max(rows > 0 ? (n + rows - 1) / rows : 0, cols > 0 ? (n + cols - 1) / cols : 0);
  return std::max<int64_t>(16, 2 * mean);
}

void split_work(int64_t max_blocks, BlockSparseIndex* index) {
  index->row_split = split_lines(index->row_offsets, max_blocks);
  index->col_split = split_lines(index->col_offsets, max_blocks);
  index->device.reset();  // the device copy holds the old splits
}

Status index_from_rows(SparseLayoutRows rows, int64_t block, BlockSparseIndex* out) {
  BlockSparseIndex ix;
  ix.block = block;
  ix.num_heads = rows.num_heads;
  ix.layout_heads = rows.stored_heads;
  ix.num_row_blocks = rows.num_blocks;
  ix.num_col_blocks = rows.num_blocks;
  const int64_t G = rows.stored_heads, n = rows.num_blocks;
  // The painters' rows are already in (stored head, row, column) order: the CSR is their offsets.
  ix.row_offsets = std::move(rows.row_offsets);
  ix.row = std::move(rows.rows);
  ix.col = std::move(rows.cols);
  for (int64_t l = 0; l < G * n; ++l) {
    ix.max_row_nnz = std::max(ix.max_row_nnz, ix.row_offsets[static_cast<size_t>(l + 1)] -
                                                  ix.row_offsets[static_cast<size_t>(l)]);
  }
  ix.head.assign(ix.col.size(), 0);  // stored head 0's; the others' are written below
  for (int64_t g = 1; g < G; ++g) {
    std::fill(ix.head.begin() + ix.row_offsets[static_cast<size_t>(g * n)],
              ix.head.begin() + ix.row_offsets[static_cast<size_t>((g + 1) * n)], g);
  }
  // Per-head layouts may still coincide (a config whose heads draw the same pattern).
  keep_one_head_if_shared(&ix);
  finish_index(&ix);
  *out = std::move(ix);
  return Status::ok_status();
}

}  // namespace detail
}  // namespace sciattn
